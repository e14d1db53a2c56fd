#!/usr/bin/env python3
"""Measure the worked example of reward-modeling/references/preferences.md end to end, with the token-coverage
remedy on (the example's rm.toml) and off: train-reward on the shipped pairs (held-out accuracy,
the coverage probe, seconds), then the example's policy run against that reward model (held-out
reward before -> after) and the raters' own rule on the same held-out samples (the gold metric,
policy.toml's ``[eval] text_metric``, ``rater.digit_share``: the rows' ``held_out_gold``), each over seeds. Prints the table of preferences.md#token-coverage
(``--markdown``).

Usage:
    calibrate_preferences.py                  # both variants, 3 seeds
    calibrate_preferences.py --markdown       # the doc's table
    calibrate_preferences.py --variant "remedy off" --seeds 1 --json

Each run trains in-process into a temporary directory (nothing is left behind); one torch thread.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import options, runner, streams, version_gate  # noqa: E402
from run_kit import calibrate  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "reward-modeling" / "assets" / "preferences"
VARIANTS = {"remedy on (the example)": [], "remedy off": ["train.tie_unseen_embeddings=false"]}
SEEDS = 3


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Measure the preferences worked example with the token-coverage remedy on and off: reward-model "
                    "accuracy and probe, then the policy's held-out reward and gold metric before and after.",
        epilog="variants: " + "; ".join(VARIANTS) + "\n\nexit codes: 0 the example's policy rose on the gold metric "
               "on every seed; 1 it did not; 2 usage error")
    calibrate.add_options(parser, SEEDS, 20)
    return parser


def measure(overrides: list[str], seed: int) -> dict:
    """One seed of a variant: train-reward with ``overrides``, then the policy run against it."""
    from policy_optimization.run import loop
    from reward_modeling import reward_run
    with tempfile.TemporaryDirectory(prefix="preferences-") as tmp:
        t0 = time.perf_counter()
        _, summary = reward_run.train_to_end(str(EXAMPLE / "rm.toml"), Path(tmp) / "rm", "cpu",
                                             [*overrides, f"run.seed={seed}"])
        rm_s = time.perf_counter() - t0
        run = loop.Run.open(str(EXAMPLE / "policy.toml"), Path(tmp) / "policy", "cpu",
                            overrides=[f"reward.checkpoint={summary['files']['rm']}", f"run.seed={seed}"],
                            options=loop.Options(progress=False, say=lambda line: None))
        status, reason = run.rounds(streams.Progress("calibrate", False))
        run.finish(status, reason)
        held = [r for r in run.rows if r["held_out_reward"] is not None]  # row 0: before training
        probe = summary["coverage"]
        return {"seed": seed, "accuracy": summary["held_out_accuracy"], "rm_s": round(rm_s, 1),
                "pairs_per_s": summary["examples_per_s"], "repeated_above_median": probe["repeated_above_median"],
                "mixed_above_own": probe["mixed_above_own"], "unseen": probe["unseen"], "before": held[0]["held_out_reward"],
                "after": held[-1]["held_out_reward"], "gold_before": held[0]["held_out_gold"],
                "gold_after": held[-1]["held_out_gold"]}


def markdown(rows: list[dict]) -> str:
    lines = ["| reward model | held-out accuracy | unseen ids scoring like preferred (repeated / mixed in) | "
             "policy held-out reward | gold metric (digit share) | train-reward s |",
             "| --- | --- | --- | --- | --- | ---: |"]
    med = statistics.median
    for r in rows:
        runs = r["runs"]
        probe = ", ".join(f"{x['repeated_above_median']} / {x['mixed_above_own']}" for x in runs)
        lines.append(f"| {r['variant']} | {med(x['accuracy'] for x in runs):.3f} | {probe} of {runs[0]['unseen']} | "
                     f"{med(x['before'] for x in runs):.2f} -> {med(x['after'] for x in runs):.2f} | "
                     f"{med(x['gold_before'] for x in runs):.2f} -> {med(x['gold_after'] for x in runs):.2f} "
                     f"({', '.join(format(x['gold_after'], '.2f') for x in runs)}) | {med(x['rm_s'] for x in runs):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = calibrate.chosen(VARIANTS, args.variant)
    env = version_gate.check_versions()
    rows = calibrate.over_seeds(VARIANTS, names, args.seeds, measure,
                                streams.Progress("calibrate-preferences", not args.json or args.progress))
    return calibrate.emit("calibrate-preferences", VARIANTS, names, rows, lambda x: x["gold_after"] > x["gold_before"],
                          markdown, args, versions=env["versions"])

if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
