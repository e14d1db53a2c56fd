#!/usr/bin/env python3
"""Measure why the first-run example (assets/first-run/run.toml) is set as it is: the example and
one change at a time (LoRA or all weights, the learning rate, the group size, the rollout
temperature), each over seeds, held-out reward before -> after. Prints the table of
references/training-run.md#first-run (``--markdown``).

Usage:
    calibrate_first_run.py                 # every variant, 3 seeds
    calibrate_first_run.py --markdown      # the doc's table
    calibrate_first_run.py --variant "LoRA, lr 3e-3" --seeds 5 --json

Each run trains in-process into a temporary run directory (nothing is left behind); one torch thread.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
try:  # the runtime first: from here on a damaged file of the tree is one line and exit 2
    from skill_runtime import SKILL_ROOT  # noqa: E402,F401
except (ImportError, SyntaxError) as damage:  # the runtime's own __init__.py is missing or broken
    sys.stderr.write(f"{Path(sys.argv[0]).name}: error: {Path(sys.path[0], 'skill_runtime', '__init__.py')}: "
                     f"{damage} (reinstall the skill tree)\n")
    sys.exit(2)
from skill_runtime import exits, options, runner, streams, version_gate  # noqa: E402
from run_kit import calibrate  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "assets" / "first-run" / "run.toml"
# name -> --set overrides of the example; the example itself first
VARIANTS = {
    "the example (all weights, lr 3e-3, groups of 8, temperature 1)": [],
    "LoRA, lr 1e-4 (the trainers' default)": ["trainer.actor_lora=true", "trainer.actor_lr=1e-4"],
    "LoRA, lr 3e-3": ["trainer.actor_lora=true"],
    "all weights, lr 1e-3": ["trainer.actor_lr=1e-3"],
    "all weights, lr 1e-2": ["trainer.actor_lr=1e-2"],
    "groups of 4": ["trainer.grpo_num_times_sample_rewards=3", "trainer.minibatch_size=4"],
    "rollout temperature 1.5": ["train.temperature=1.5"],
}
SEEDS = 3


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Measure the first-run example against one change at a time: held-out reward before and "
                    "after, per seed.",
        epilog="variants: " + "; ".join(VARIANTS) + "\n\nexit codes: 0 the example rose on every seed; "
               "1 it did not; 2 usage error")
    calibrate.add_options(parser, SEEDS, 50)
    return parser


def measure(overrides: list[str], seed: int) -> dict:
    """One run of the example with ``overrides`` and ``[run] seed``: held-out before and after, the
    rules fired, wall seconds."""
    from policy_optimization.run import loop
    with tempfile.TemporaryDirectory(prefix="first-run-") as tmp:
        t0 = time.perf_counter()
        run, _, _ = loop.train_to_end(str(EXAMPLE), Path(tmp) / "run", overrides=[*overrides, f"run.seed={seed}"])
        held = [r["held_out_reward"] for r in run.rows if r["held_out_reward"] is not None]
        rules = sorted({rule for r in run.rows for rule in r["rules"]})
    return {"seed": seed, "before": held[0], "after": held[-1], "rules": rules, "wall_s": round(time.perf_counter() - t0, 1)}


def markdown(rows: list[dict]) -> str:
    lines = ["| setting | held-out before -> after (median) | per seed | seeds risen | rules fired | s per seed |",
             "| --- | --- | --- | ---: | --- | ---: |"]
    for r in rows:
        runs = r["runs"]
        before, after = statistics.median(x["before"] for x in runs), statistics.median(x["after"] for x in runs)
        per_seed = ", ".join(f"{x['before']:.2f}->{x['after']:.2f}" for x in runs)
        risen = sum(x["after"] > x["before"] for x in runs)
        rules = ", ".join(sorted({k for x in runs for k in x["rules"]})) or "-"
        lines.append(f"| {r['variant']} | {before:.2f} -> {after:.2f} | {per_seed} | {risen}/{len(runs)} | {rules} | "
                     f"{statistics.median(x['wall_s'] for x in runs):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = calibrate.chosen(VARIANTS, args.variant)
    env = version_gate.check_versions()
    rows = calibrate.over_seeds(VARIANTS, names, args.seeds, measure,
                                streams.Progress("calibrate-first-run", not args.json or args.progress))
    example = rows[0]["runs"] if names and names[0] == next(iter(VARIANTS)) else None
    ok = example is None or all(x["after"] > x["before"] for x in example)
    report = {"status": "ok" if ok else "failed", "example": str(EXAMPLE), "versions": env["versions"], "rows": rows}
    return runner.emit(report, args.json, lambda r: markdown(r["rows"]) + ("" if args.markdown else
                       f"calibrate-first-run: {r['status'].upper()}"), exits.EXIT_OK if ok else exits.EXIT_CHECK_FAILED)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
