#!/usr/bin/env python3
"""Measure the run kit's watchdog: the healthy toy run over several seeds must fire no rule (false
alarms), and each deliberately broken config must fire its own rule within 3 rounds (misses).
Prints the table of references/training-run.md#watchdog-rules (``--markdown``).

Usage:
    calibrate_watchdog.py                      # every case, 10 seeds of the healthy run, 1 of each broken one
    calibrate_watchdog.py --markdown           # the doc's table
    calibrate_watchdog.py --case "lr 1.0" --seeds 3 --json

Each run trains in-process into a temporary run directory (nothing is left behind); one torch thread.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, options, runner, streams, version_gate, workspace  # noqa: E402

HEALTHY_SEEDS = 10  # seeds of the healthy run (false alarms)


def build_parser() -> options.OneLineParser:
    from policy_optimization.run import cases
    parser = options.OneLineParser(
        description="Measure the run kit's watchdog: false alarms of the healthy toy run over seeds, and the "
                    "round at which each deliberately broken config fires its own rule.",
        epilog="cases: " + "; ".join(c.name for c in cases.CASES) + "\n\n"
               "exit codes: 0 no false alarm and no miss; 1 a false alarm or a miss; 2 usage error")
    parser.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
    parser.add_argument("--seeds", type=options.bounded_int(1, 100), metavar="N",
                        help=f"seeds per case (default: {HEALTHY_SEEDS} for the healthy run, 1 for broken ones)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--markdown", action="store_true", help="print the doc's table")
    options.add_progress_option(parser)
    return parser


def measure(case, seed: int) -> dict:
    """One run of ``case`` with ``seed``: the rules fired per round, the held-out reward before and
    after, and its wall time (s)."""
    from policy_optimization.run import cases, loop
    with tempfile.TemporaryDirectory(prefix="watchdog-") as tmp:
        config = cases.write(case, Path(tmp) / "config", seed=seed)
        t0 = time.perf_counter()
        try:
            run, _, _ = loop.train_to_end(str(config), Path(tmp) / "run")
            error = None
        except exits.SkillError as err:  # the library raised: not a silent failure, the case is wrong
            run, error = None, str(err)
        rows = run.rows if run is not None else []
    fired = {}
    for row in rows:
        for rule in row["rules"]:
            fired.setdefault(rule, row["round"])
    held = [r["held_out_reward"] for r in rows if r["held_out_reward"] is not None]
    return {"case": case.name, "trainer": case.trainer, "seed": seed, "expect": case.expect, "first_fired": fired,
            "error": error,
            "held_out": [held[0], held[-1]] if held else None, "wall_s": round(time.perf_counter() - t0, 2)}


def verdict(case, runs: list[dict]) -> dict:
    """A case's row: for the healthy run, the seeds with any rule (false alarms); for a broken
    one, the seeds whose own rule fired by round ``case.within`` (caught) and the rounds it fired at."""
    if case.expect is None:
        alarms = [r for r in runs if r["first_fired"] or r["error"]]
        return {"case": case.name, "trainer": case.trainer, "expect": None, "seeds": len(runs),
                "false_alarms": len(alarms), "rules": sorted({k for r in alarms for k in r["first_fired"]}),
                "ok": not alarms, "why": case.why}
    rounds = [r["first_fired"].get(case.expect) for r in runs]
    caught = [x for r, x in zip(runs, rounds) if x is not None and x <= case.within and r["error"] is None]
    others = sorted({k for r in runs for k in r["first_fired"] if k != case.expect})
    return {"case": case.name, "trainer": case.trainer, "expect": case.expect, "seeds": len(runs),
            "within": case.within, "caught": len(caught), "rounds": rounds, "also": others,
            "ok": len(caught) == len(runs), "why": case.why}


def markdown(rows: list[dict]) -> str:
    lines = ["| case | trainer | rule | seeds | result | fired at round | also fired |",
             "| --- | --- | --- | ---: | --- | --- | --- |"]
    for r in rows:
        if r["expect"] is None:
            result = f"{r['false_alarms']} false alarm{'' if r['false_alarms'] == 1 else 's'}"
            lines.append(f"| {r['case']} | {r['trainer']} | (none) | {r['seeds']} | {result} | - | "
                         f"{', '.join(r['rules']) or '-'} |")
        else:
            fired = ", ".join("-" if x is None else str(x) for x in r["rounds"])
            lines.append(f"| {r['case']} | {r['trainer']} | `{r['expect']}` | {r['seeds']} | {r['caught']}/{r['seeds']} "
                         f"caught by round {r['within']} | {fired} | {', '.join(r['also']) or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from policy_optimization.run import cases
    chosen = [c for c in cases.CASES if not args.case or c.name in args.case]
    unknown = set(args.case or []) - {c.name for c in cases.CASES}
    if unknown:
        raise exits.SkillError(f"unknown --case {', '.join(sorted(unknown))}; the cases are: "
                               + "; ".join(c.name for c in cases.CASES))
    env = version_gate.check_versions()
    progress = streams.Progress("calibrate-watchdog", not args.json or args.progress)
    import torch
    torch.set_num_threads(1)
    rows = []
    with workspace.private_workdir():
        for case in chosen:
            seeds = args.seeds or (HEALTHY_SEEDS if case.expect is None else 1)
            with progress.stage(f"{case.name} ({case.trainer}, {seeds} seed{'s' if seeds > 1 else ''})", total=seeds,
                                unit="seeds") as bar:
                runs = []
                for seed in range(seeds):
                    runs.append(measure(case, seed))
                    if bar is not None:
                        bar.update(1)
            rows.append({**verdict(case, runs), "runs": runs})
    report = {"status": "ok" if all(r["ok"] for r in rows) else "failed",
              "versions": env["versions"], "rows": rows}
    text = markdown(rows) if args.markdown else None
    return runner.emit(report, args.json, lambda r: text or markdown(r["rows"]) + f"calibrate-watchdog: {r['status'].upper()}",
                       exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
