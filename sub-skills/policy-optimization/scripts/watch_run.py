#!/usr/bin/env python3
"""Show a live or finished training run (``palm-rlhf-skill train``'s run directory): the last rows
as a table, sparklines of reward, held-out reward, KL and length, the rules fired, the verdict last.

Usage:
    watch_run.py runs/first                    # plain report on stdout
    watch_run.py runs/first --json             # one JSON object
    watch_run.py runs/first --plot curves.png  # the curves with matplotlib (pip install 'palm-rlhf-skill[plot]')

Reads JSON only (no torch): it answers while the run trains. Keys: references/run-reports.md#watch-report.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
import functools  # noqa: E402

from skill_runtime import exits, options, runner  # noqa: E402
from run_kit import watch  # noqa: E402
from policy_optimization.run import summary as run_summary  # noqa: E402
from reward_modeling import reward_report  # noqa: E402

# how watch shows each kind of run (run_kit.watch.Layout), from the sub-skill of that kind
LAYOUTS = {"policy": run_summary.LAYOUT, "reward": reward_report.LAYOUT}


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        prog="palm-rlhf-skill watch",
        description="Show a training run of `palm-rlhf-skill train`, live or finished: the last rows, a "
                    "sparkline per curve, the watchdog rules fired, and the verdict with the next step.",
        epilog="examples:\n"
               "  palm-rlhf-skill watch runs/first\n"
               "  palm-rlhf-skill watch runs/first --last 20\n"
               "  palm-rlhf-skill watch runs/first --plot curves.png\n"
               "  palm-rlhf-skill watch runs/first --json\n\n"
               "exit codes: 0 shown; 2 usage error, no run in DIR, or a plot it cannot write; 3 --plot without matplotlib")
    parser.add_argument("run_dir", metavar="DIR", help="the run directory (train's --run-dir)")
    parser.add_argument("--last", type=options.bounded_int(1), default=10, metavar="N",
                        help="rows in the table (default: 10)")
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the curves into FILE.png (matplotlib)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    data = watch.view(args.run_dir, LAYOUTS, last=args.last)
    if args.plot:
        data["plot"] = str(watch.plot(data, Path(args.plot).resolve()))
    return runner.emit(data, args.json, functools.partial(watch.text, layouts=LAYOUTS), exits.EXIT_OK)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
