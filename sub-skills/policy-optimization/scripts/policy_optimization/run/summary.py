"""The words of a run: its progress line per round, ``summary.json`` and the verdict with the next
step (what ``train`` prints last and ``watch`` of a finished run reads), and ``LAYOUT``, how
``watch`` shows a policy run (``run_kit.watch.Layout``). Torch-free."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from policy_optimization import trainers
from policy_optimization.run import metrics, watchdog
from run_kit import command, rundir, watch
from skill_runtime import reporting, streams

STATUSES = ("finished", "paused", "stopped", "interrupted", "failed")
_NUMBER = (int, float)
# what a stored summary.json must hold for watch and a resume to read it (references/run-reports.md#train-summary)
SHAPE = {"status": str, "reason": (str, type(None)), "trainer": str, "class_name": str, "device": str,
         "rounds_done": int, "rounds_planned": int, "rollouts": int, "learn_calls": int, "held_out": dict,
         "reward": dict, "rules_fired": dict, "files": dict, "wall_s": _NUMBER, "verdict": str, "next": str}


def report_round(progress: streams.Progress, bar, row: dict[str, Any], last: int, started_s: float, start: int) -> None:
    """The round on stderr: at a terminal the bar's counter and postfix, elsewhere one line."""
    parts = [f"reward {row['reward_mean']:.3f}" if row["reward_mean"] is not None else "reward -"]
    if row["held_out_reward"] is not None:
        parts.append(f"held-out {row['held_out_reward']:.3f}")
    if row["rules"]:
        parts.append("rules " + ",".join(row["rules"]))
    command.report_round(progress, bar, row["round"], ", ".join(parts), row["wall_s"], last, started_s, start)


def summarize(run, status: str, reason: str | None, files: dict[str, Any]) -> dict[str, Any]:
    """summary.json: what ran, held-out before -> after, the rules fired, the files, the verdict,
    and (``run.options.env`` given: the command's) the versions and warnings."""
    trained = [r for r in run.rows if r["round"] > 0]
    evaluated = [r for r in run.rows if r["held_out_reward"] is not None]
    held = [(r["round"], r["held_out_reward"]) for r in evaluated]
    ends = (evaluated[0], evaluated[-1]) if len(evaluated) > 1 else (evaluated[0], None) if evaluated else (None, None)
    fired: dict[str, list[int]] = {}
    for r in trained:
        for rule in r["rules"]:
            fired.setdefault(rule, []).append(r["round"])
    done = max((r["round"] for r in trained), default=run.start)
    summary = {"status": status, "reason": reason, "trainer": run.name, "class_name": trainers.TRAINERS[run.name].path,
               "device": str(run.device), "rounds_done": done, "rounds_planned": run.rounds_planned,
               "rollouts": sum(r["rollouts"] or 0 for r in trained), "learn_calls": sum(r["learn_calls"] or 0 for r in trained),
               "held_out": {"before": held[0][1] if held else None, "after": held[-1][1] if len(held) > 1 else None,
                            "rounds": [h[0] for h in held],
                            **{f"{name}_{end}": None if row is None else row.get(key)
                               for name, key in (("per_prompt", "held_out_per_prompt"), ("gold", "held_out_gold"))
                               for end, row in zip(("before", "after"), ends)}},
               "reward": {"first": trained[0]["reward_mean"] if trained else None,
                          "last": trained[-1]["reward_mean"] if trained else None},
               "rules_fired": fired, "files": files,
               "cpu_threads": {k: v for k, v in run.threads.items() if k != "trial"} or None,
               "wall_s": round(time.perf_counter() - run.started_s, 2)}
    summary["verdict"], summary["next"] = verdict(summary, run.options.resume_flags)
    summary["run_id"] = run.run_id
    if run.options.env is not None:  # the versions the run trained with, kept beside its policy
        summary["versions"], summary["warnings"] = run.options.env["versions"], run.options.env["warnings"]
    if run.notes:  # an inexact resume (--allow-inexact-resume) is said where the run's result is
        summary["warnings"] = [*summary.get("warnings", []), *run.notes]
    return summary


def problem(summary: Any) -> str | None:
    """What makes ``summary`` (summary.json as read) not a summary ``verdict`` and the reports can
    use, or None: a key of SHAPE missing or of another type, an unknown status, held-out figures,
    rules or files of other shapes."""
    if (wrong := rundir.shape_problem(summary, SHAPE)) is not None:
        return wrong
    held = summary["held_out"]
    if summary["status"] not in STATUSES:
        return f"status {summary['status']!r:.40} is none of {', '.join(STATUSES)}"
    if not all(held.get(k) is None or type(held.get(k)) in _NUMBER for k in ("before", "after")) or \
            not isinstance(held.get("rounds"), list) or not all(type(r) is int for r in held["rounds"]):
        return "held_out is not {before, after, rounds}"
    if not all(isinstance(k, str) and isinstance(v, list) and all(type(r) is int for r in v)
               for k, v in summary["rules_fired"].items()):
        return "rules_fired is not rule ids to rounds"
    if not all(isinstance(v, (str, type(None))) for v in summary["files"].values()) or "metrics" not in summary["files"]:
        return "files is not names to paths"
    if not isinstance(summary.get("warnings", []), list) or not isinstance(summary.get("run_id", ""), (str, type(None))):
        return "warnings or run_id of another type"
    return None


def read(run: rundir.RunDir, run_id: str | None = None) -> dict[str, Any] | None:
    """The run's summary.json, checked (``problem``), or None while there is none (a running run).
    ``run_id``: this run's (the stored config's); a summary of another id is another run's.
    Raises SkillError(2) naming the file when it is a link, damaged, edited or another run's
    (``rundir.checked_summary``: its paths re-based to where ``run`` is)."""
    return rundir.checked_summary(run, run_id, problem, "train")


def verdict(summary: dict[str, Any], resume_flags: str = "", curves: bool = True) -> tuple[str, str]:
    """The verdict line and the next step of a summary; ``resume_flags`` (`` --cpu-threads 1``) go
    into the resume command it suggests, as the run was started with them; ``curves`` False: the
    curves are drawn already (``watch --plot``), so a finished run's next step does not offer them."""
    status, held = summary["status"], summary["held_out"]
    if held["after"] is not None:
        change = f"held-out reward {held['before']:.4g} -> {held['after']:.4g}"
        if held.get("gold_after") is not None:
            change += f", gold metric {held['gold_before']:.4g} -> {held['gold_after']:.4g}"
    elif held["before"] is not None:  # --until before the first evaluation after round 0
        change = f"held-out reward {held['before']:.4g} before training, not evaluated since ([eval] every)"
    else:
        change = "no held-out evaluation ([eval] prompts_file)"
    rules = f"rules fired: {', '.join(summary['rules_fired'])}" if summary["rules_fired"] else "no rule fired"
    run_dir = str(Path(summary["files"]["metrics"]).parent)
    if status == "finished":
        rose = held["after"] is not None and held["after"] > held["before"]
        word = "FINISHED" if rose or held["after"] is None else "FINISHED, NOT LEARNING"
        nxt = f"load {summary['files'].get('policy')} with PaLM(**[palm]).load(path)" + (
            f"; curves: {reporting.command('palm-rlhf-skill watch', run_dir + ' --plot curves.png')}" if curves else "")
        if not rose and held["after"] is not None:
            nxt = "read sub-skills/policy-optimization/references/training-run.md#held-out-flat"
        return f"{word}: {summary['rounds_done']} rounds, {change}; {rules}", nxt
    resume = reporting.command("palm-rlhf-skill train", f"--resume {run_dir}{resume_flags}")
    word = {"paused": "PAUSED", "stopped": "STOPPED", "interrupted": "INTERRUPTED", "failed": "FAILED"}[status]
    return f"{word} after round {summary['rounds_done']} ({summary['reason']}): {change}; {rules}", resume


# watch's columns (column, row key, format) and curves (label, row key) of a policy run
TABLE = (("round", "round", "{:d}"), ("rollouts", "rollouts", "{:d}"), ("reward", "reward_mean", "{:.3f}"),
         ("held-out", "held_out_reward", "{:.3f}"), ("gold", "held_out_gold", "{:.3f}"),
         ("kl_rollout", "kl_rollout", "{:.3g}"),
         ("kl_base", "kl_base", "{:.3g}"), ("entropy", "entropy", "{:.2f}"),
         ("length", "response_length_mean", "{:.1f}"), ("s", "wall_s", "{:.1f}"), ("rules", "rules", "{}"))
CURVES = (("reward", "reward_mean"), ("held-out", "held_out_reward"), ("gold", "held_out_gold"),
          ("kl_base", "kl_base"), ("kl_rollout", "kl_rollout"), ("entropy", "entropy"),
          ("length", "response_length_mean"))
LAYOUT = watch.Layout(TABLE, CURVES, "held-out", "palm-rlhf-skill train", metrics.parse_row, read, verdict,
                      {rule.id: rule.section for rule in watchdog.RULES})
