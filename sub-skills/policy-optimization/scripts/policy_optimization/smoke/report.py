"""The smoke's report: the JSON object (``trainers_report``), and the plain text a person reads
(``summary``): per trainer a headline and its failing checks, timings, warnings, and last the
verdict with the next command (``next_step``). Torch-free at import."""
from __future__ import annotations

from typing import Any

from skill_runtime import reporting
from policy_optimization.smoke import learning_check, options, settings


# Single trainer: these keys of its result also appear at the top level of the report (stable keys).
SINGLE_TRAINER_KEYS = ("checks", "parameters", "generated", "optimizer_steps", "losses", "prompts",
                       "grpo_variants", "class_name", "replay_buffer", "rank_sync", "settings", "learning")


def trainers_report(args, results: dict[str, dict[str, Any]], device, cpu_threads: int) -> dict[str, Any]:
    """The report's part common to single- and multi-process runs (ranks.py's rank 0).

    ``results`` maps trainer name to its result (``run_trainer``); status is ok when every result
    is. ``timings_s`` holds construct, update and generate in seconds (--learn: learn), summed over
    trainers, each None when a trainer never reached that stage (a constructor raised; --construct-only).
    """
    def stage_sum(key: str) -> float | None:
        values = [r["timings_s"].get(key) for r in results.values()]
        return None if any(v is None for v in values) else round(sum(values), 4)

    report: dict[str, Any] = {
        "status": "ok" if results and all(r["status"] == "ok" for r in results.values()) else "failed",
        "mode": settings.mode_name(args), "trainer": args.trainer, "device": str(device), "seed": args.seed,
        "config": (learning_check.learn_config(args, cpu_threads) if args.learn
                   else options.train_config(args, cpu_threads)),
        "timings_s": {key: stage_sum(key) for key in (("learn",) if args.learn else ("construct", "update", "generate"))},
    }
    if args.trainer != "all":
        single = results[args.trainer]
        report.update({key: single[key] for key in SINGLE_TRAINER_KEYS if key in single})
    report["results"] = results
    return report


def trainer_headline(result: dict[str, Any]) -> str:
    """One trainer's line: its checks counted, then what it did, in plain words."""
    head = f"{result['trainer']} ({result.get('class_name') or 'not built'}): {reporting.passed_count(result['checks'])}"
    learning, params, steps = result.get("learning"), result.get("parameters"), result.get("optimizer_steps")
    if learning:
        curve = learning["curve"]
        return (head + f"; held-out reward {learning['reward_before']:.2f} -> {learning['reward_after']:.2f} "
                f"(mean of {len(learning['per_seed'])} seeds), training reward per episode "
                f"{reporting.sparkline(curve, 0.0, 1.0)} {curve[0]:.2f} -> {curve[-1]:.2f}")
    if steps:
        generated = result.get("generated")
        n = steps["observed"]["actor"]
        head += (f"; {n} optimizer step{'s' if n != 1 else ''} changed {params['trainable_changed']} of "
                 f"{params['trainable_total']} trainable tensors and {params['frozen_changed']} frozen ones")
        if generated:
            sampled = generated["shape"][0] - generated["prompt_len"]
            head += (f"; generated {generated['shape'][0]} token ids ({generated['prompt_len']} of the prompt "
                     f"+ {sampled} sampled)")
    elif params and result.get("mode") == "construct-only":
        head += "; built, not trained (--construct-only)"
    return head


def next_step(report: dict[str, Any]) -> str:
    """The natural next command after a passing run, written the way this run was started."""
    mode, trainer = report["mode"], report["trainer"]
    if mode == "construct-only":
        return reporting.command("tiny-rlhf-smoke", f"--trainer {trainer}")
    if mode == "train-smoke" and trainer != "all":
        return reporting.command("tiny-rlhf-smoke", "--trainer all")
    if mode == "train-smoke" and "launcher" not in report:
        return reporting.command("tiny-rlhf-smoke", "--learn --trainer all")
    if mode == "learn" and (trainer != "all" or report["config"]["control"]):
        return reporting.command("tiny-rlhf-smoke", "--learn --trainer all")
    return (reporting.command("palm-rlhf-skill plan", "--config YOUR_RUN.toml")
            + " (your run's time, memory and learn() calls before it starts: workflows.md#plan-a-run)")


def summary(report: dict[str, Any]) -> str:
    """The plain report: per trainer a headline and its failing checks in full (each with the doc
    section that explains it), timings, warnings, and last the verdict with the next step."""
    lines = []
    for result in report.get("results", {}).values():
        lines.append(trainer_headline(result))
        lines += reporting.check_lines(result["checks"])
    if not report.get("results"):  # --nproc: no rank reported
        lines += reporting.check_lines(report.get("checks", []))
    t = report["timings_s"]
    lines.append(reporting.timings_line(t))
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    what = {"learn": "learning check", "train-smoke": "train smoke", "construct-only": "construct-only smoke"}[report["mode"]]
    trainers = "every trainer" if report["trainer"] == "all" else report["trainer"]
    nproc = report.get("nproc") or (report.get("launcher") or {}).get("nproc")  # launcher's: no rank reported
    where = reporting.device_words(report["device"]) + (f", {nproc} processes" if nproc else "")
    control = report.get("config", {}).get("control") if report["mode"] == "learn" else None
    if report["status"] == "ok":
        lines.append(f"tiny-rlhf-smoke: OK: the {what} passed for {trainers} on {where} (exit 0)"
                     + (f", control {control}" if control else "") + f"; next: {next_step(report)}")
        return "\n".join(lines)
    failed = [c for r in report.get("results", {}).values() for c in r["checks"] if not c["passed"]]
    failed = failed or [c for c in report.get("checks", []) if not c["passed"]]
    bad = [r["trainer"] for r in report.get("results", {}).values() if r["status"] != "ok"]
    first = reporting.CHECK_DOCS.get(failed[0]["name"], reporting.REPORTS) if failed else reporting.REPORTS
    head = f"tiny-rlhf-smoke: FAILED: the {what} failed for {', '.join(bad) or 'the run'} on {where} (exit 1)"
    if control == "frozen" and failed and all(c["name"] == "reward_rose" for c in failed):
        # the control's one expected failure (workflows.md#learning-check): nothing to read or fix
        lines.append(f"{head}, the expected result of the frozen control (every learning rate 0, so no reward "
                     f"can rise: this shows the check can fail); next: run the check itself, "
                     + reporting.command("tiny-rlhf-smoke", f"--learn --trainer {report['trainer']}"))
    else:
        lines.append(f"{head}; next: read {first}")
    return "\n".join(lines)
