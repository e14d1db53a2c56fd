"""Accuracy of the plan: predictions against real runs of the shipped configs
(``palm-rlhf-skill bench --plan-accuracy``), each a fresh process timed by the bench.

Torch-free at import.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from skill_runtime import exits, reporting, streams
from policy_optimization import run_config

PLAN_SCRIPT = Path(__file__).resolve().parents[2] / "plan_run.py"
PLANS = run_config.PLANS

ACCURACY_CONFIGS = ("accuracy-ppo.toml", "accuracy-grpo.toml", "accuracy-tpo.toml", "accuracy-flowrl.toml",
                    "accuracy-ppo-256.toml", "accuracy-grpo-256.toml")  # the last two: dim 256, two rounds
TARGETS = {"wall_error": 0.35, "peak_error": 0.25}  # |predicted / measured - 1| for every row
ACCURACY_TITLE = "### Accuracy of the plan (measured)"
ACCURACY_HEADER = ("config", "trainer", "rollouts", "learn() calls", "predicted wall (s)", "measured wall (s)",
                   "wall error", "predicted peak (MiB)", "measured peak (MiB)", "peak error",
                   "each pair (wall/peak)", "load", "probe load", "verdict")


def accuracy_pair(bench, name: str, device: str) -> dict[str, Any]:
    """One plan (a fresh process, ``--json``) then the real run (a fresh process, ``--execute``) of a
    shipped config, both with one torch thread; the run timed by the bench's ``run_child``
    (os.wait4: wall seconds, peak RSS). Relative errors are predicted / measured - 1.
    Raises SkillError when either child fails to report (usage or dependency error)."""
    common = [sys.executable, str(PLAN_SCRIPT), "--config", str(PLANS / name), "--json",
              "--device", device, "--cpu-threads", "1"]
    load = [bench.load_average()]
    planned, real = bench.run_child(common), bench.run_child([*common, "--execute"])
    load.append(bench.load_average())
    for run in (planned, real):
        if run["exit_code"] in (exits.EXIT_USAGE, exits.EXIT_DEPENDENCY) or run["report"] is None:
            raise exits.SkillError(f"{name}: {run['stderr_tail'][0]}", run["exit_code"] or exits.EXIT_USAGE)
    plan_report, run_report = planned["report"], real["report"]
    predicted = plan_report["predicted"]
    return {"trainer": plan_report["trainer"], "rollouts": plan_report["counts"]["rollouts"],
            "learn_calls": plan_report["counts"]["learn_calls"], "observed_learn_calls": run_report["learn_calls"],
            "predicted_wall_s": predicted["wall_s"], "measured_wall_s": real["wall_s"],
            "wall_error": round(predicted["wall_s"] / real["wall_s"] - 1, 4),
            "predicted_peak_mib": predicted["peak_mib"], "measured_peak_mib": real["peak_rss_mib"],
            "peak_error": round(predicted["peak_mib"] / real["peak_rss_mib"] - 1, 4),
            "predicted_parts_s": {k: v for k, v in plan_report["time"].items() if k != "unit_s"},
            "measured_parts_s": run_report["seconds"], "plan_wall_s": planned["wall_s"],
            "run_status": run_report["status"], "load_average": load,
            "probe_load_average": [(plan_report.get("probe") or {}).get("load_average", {}).get(k) for k in ("start", "end")]}


def accuracy(bench, args, env: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``args.repeat`` plan-and-run pairs of every shipped accuracy config (``args.plan_config``
    selects some), interleaved; per config the median of each figure and error over its pairs,
    each pair a progress line (``args.progress_bars``). A row passes when every run completed
    with the predicted number of learn() calls and both median errors are within TARGETS. The
    1-minute load average is read around each pair: the machine is shared, and a pair whose load
    changed measures the machine as much as the plan. A row whose only miss is the wall error is
    inconclusive, not failed, when the bench's ``busy_reason`` (the rule its wall-time budgets use)
    says the run cannot judge it: its load reached the CPU count or some of its pairs were within
    the target (``verdict``, ``inconclusive_reason``); the report's status is then inconclusive."""
    import statistics
    machine = bench.machine()
    names = args.plan_config or list(ACCURACY_CONFIGS)
    pairs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    progress = getattr(args, "progress_bars", None) or streams.Progress("bench-smoke", False)
    total = args.repeat * len(names)
    for r in range(args.repeat):
        for i, name in enumerate(names, 1):
            with progress.stage(f"[{r * len(names) + i}/{total}] {name}: plan it, then run it") as bar:
                pair = accuracy_pair(bench, name, args.device)
                bar.set_postfix_str(f"wall error {pair['wall_error']:+.0%}, peak error {pair['peak_error']:+.0%}")
            pairs[name].append(pair)
    rows = []
    for name, runs in pairs.items():
        first = runs[0]
        row = {"config": name, "trainer": first["trainer"], "rollouts": first["rollouts"],
               "learn_calls": first["learn_calls"], "repeat": len(runs),
               **{key: round(statistics.median(run[key] for run in runs), 4) for key in (
                   "predicted_wall_s", "measured_wall_s", "wall_error", "predicted_peak_mib",
                   "measured_peak_mib", "peak_error")},
               "wall_errors": [run["wall_error"] for run in runs], "peak_errors": [run["peak_error"] for run in runs],
               "load_average": [x for run in runs for x in run["load_average"]], "pairs": runs}
        complete = all(run["run_status"] == "ok" and run["observed_learn_calls"] == run["learn_calls"] for run in runs)
        row["ok"] = complete and all(abs(row[key]) <= limit for key, limit in TARGETS.items())
        only_wall = complete and abs(row["peak_error"]) <= TARGETS["peak_error"]
        sizes = [abs(e) for e in row["wall_errors"]]
        busy = bench.busy_reason({"max": max(row["load_average"]), "cpus": machine["cpu_count"]},
                                 {"min": min(sizes), "max": max(sizes)}, None, TARGETS["wall_error"])
        row["verdict"] = "pass" if row["ok"] else "inconclusive" if only_wall and busy else "fail"
        if row["verdict"] == "inconclusive":
            row["inconclusive_reason"] = busy
        row["probe_load_average"] = [x for run in runs for x in run["probe_load_average"] if x is not None]
        weak = bench.weak_reason({"max": max(row["load_average"]), "cpus": machine["cpu_count"]}, len(runs))
        row["weak"] = row["verdict"] == "pass" and weak is not None
        if row["weak"]:
            row["weak_reason"] = weak
        rows.append(row)
    ok = all(row["ok"] for row in rows)
    verdicts = {row["verdict"] for row in rows}
    status = "failed" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "ok"
    report = {"kind": "plan-accuracy", "status": status, "device": args.device,
              "repeat": args.repeat, "targets": TARGETS, "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "machine": machine, "versions": env["versions"], "warnings": env["warnings"], "rows": rows}
    return report, ok


def accuracy_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(ACCURACY_HEADER) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(ACCURACY_HEADER))) + "|"]
    for r in rows:
        cells = [r["config"], r["trainer"], r["rollouts"], r["learn_calls"], f"{r['predicted_wall_s']:.1f}",
                 f"{r['measured_wall_s']:.1f}", f"{r['wall_error']:+.0%}", f"{r['predicted_peak_mib']:.0f}",
                 f"{r['measured_peak_mib']:.0f}", f"{r['peak_error']:+.0%}",
                 " ".join(f"{w:+.0%}/{p:+.0%}" for w, p in zip(r["wall_errors"], r["peak_errors"])),
                 f"{min(r['load_average'])}-{max(r['load_average'])}",
                 f"{min(r['probe_load_average'])}-{max(r['probe_load_average'])}" if r["probe_load_average"] else "-",
                 "PASS (weak)" if r["weak"] else r["verdict"].upper()]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def accuracy_markdown(report: dict[str, Any]) -> str:
    """The accuracy subsection of references/workflows.md, regenerated by
    ``bench_smoke.py --plan-accuracy --markdown``."""
    m, v = report["machine"], report["versions"]
    text = [ACCURACY_TITLE, "",
            f"Measured {report['date']} on {m['system']}, {m['cpu']} ({m['cpu_count']} CPUs), Python {v['python']}, "
            f"torch {v['torch']}, palm-rlhf-pytorch {v['palm-rlhf-pytorch']}; device {report['device']}, one torch "
            f"thread. Each row: {report['repeat']} interleaved pairs of `palm-rlhf-skill plan --json` on a shipped "
            "config (`assets/plans/`), then the same run (`--execute`), fresh processes; measured wall and peak "
            "RSS from `os.wait4`. Errors: predicted / measured - 1, the median over the pairs; targets: wall "
            f"+/-{TARGETS['wall_error']:.0%}, peak +/-{TARGETS['peak_error']:.0%}. Load: the 1-minute load average "
            "around the pairs; probe load: at the start and end of each probe. A pass is weak at a load average "
            "at or above the CPU count or from one pair.", "",
            "Regenerate (then replace this subsection with the output):", "",
            "```bash", "palm-rlhf-skill bench --plan-accuracy --markdown", "```", "",
            *accuracy_table(report["rows"])]
    return "\n".join(text) + "\n"


def accuracy_summary(report: dict[str, Any]) -> str:
    """The accuracy subsection (markdown), then the verdict with the next step."""
    status = report["status"]
    rows = ", ".join(r["config"] for r in report["rows"] if r["verdict"] != "pass")
    last = {"ok": "OK (exit 0): every prediction within its target; next: replace the subsection of "
                  "sub-skills/policy-optimization/references/workflows.md with --markdown's output",
            "inconclusive": f"INCONCLUSIVE (exit {exits.EXIT_INCONCLUSIVE}): {rows}: only the wall error missed, on a "
                            "machine too busy to judge it; next: rerun when the load average is below the "
                            "CPU count: " + reporting.command("palm-rlhf-skill bench", " ".join(report.get("argv", []))),
            "failed": f"FAILED (exit 1): {rows}; next: palm-rlhf-skill plan --config assets/plans/<config> "
                      "shows what the planner predicted"}[status]
    return accuracy_markdown(report) + f"bench-smoke --plan-accuracy: {last}"

