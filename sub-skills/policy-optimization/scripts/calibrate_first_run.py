#!/usr/bin/env python3
"""Measure why the first-run example (assets/first-run/run.toml) is set as it is: the example and
one change at a time (LoRA or all weights, the learning rate, the group size, the rollout
temperature), each over seeds, held-out reward before -> after. Prints the table of
references/training-run.md#first-run (``--markdown``). ``--longer``: the example's learning rate
and 1e-3 over 60 rounds, on its rule reward and on a learned reward model (the preferences worked
example's policy.toml against a reward model train-reward fits per seed), with the best held-out
evaluation beside the last and the gold metric: the table of training-run.md#longer-runs.

Usage:
    calibrate_first_run.py                 # every variant, 3 seeds
    calibrate_first_run.py --markdown      # the doc's table
    calibrate_first_run.py --variant "LoRA, lr 3e-3" --seeds 5 --json
    calibrate_first_run.py --longer --markdown

Each run trains in-process into a temporary run directory (nothing is left behind); one torch thread.
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
PREFERENCES = Path(__file__).resolve().parents[2] / "reward-modeling" / "assets" / "preferences"
LONGER_ROUNDS = 60
# name -> [the config ("first-run" or "preferences"), --set overrides...]: the same two learning
# rates on a longer run, on the example's rule reward and on a learned reward model
LONGER = {
    "rule reward (the example), lr 3e-3": ["first-run"],
    "rule reward, lr 1e-3": ["first-run", "trainer.actor_lr=1e-3"],
    "learned reward model, lr 3e-3": ["preferences", "trainer.actor_lr=3e-3"],
    "learned reward model, lr 1e-3 (its policy.toml)": ["preferences"],
}


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Measure the first-run example against one change at a time: held-out reward before and "
                    "after, per seed.",
        epilog="variants: " + "; ".join(VARIANTS) + "\n--longer variants: " + "; ".join(LONGER) +
               "\n\nexit codes: 0 the example (--longer: its first variant) rose on every seed; 1 it did not; "
               "2 usage error")
    calibrate.add_options(parser, SEEDS, 50)
    parser.add_argument("--longer", action="store_true",
                        help=f"the longer-run table: {LONGER_ROUNDS} rounds, rule reward and learned reward model")
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


def measure_longer(variant: list[str], seed: int, reward_models: dict[int, str], tmp: Path) -> dict:
    """One run of a LONGER variant at ``seed``: held-out reward before, at its best evaluation and
    last, the gold metric (``held_out_gold``: the preferences example's ``[eval] text_metric``)
    before and last, the rules fired, wall seconds of the policy run. The learned reward model of
    ``seed`` is trained once (``train-reward`` on the example's rm.toml) into ``tmp`` and kept in
    ``reward_models`` for the other variants."""
    from policy_optimization.run import loop
    from reward_modeling import reward_run
    config, *overrides = variant
    overrides = [*overrides, f"run.rounds={LONGER_ROUNDS}", "eval.every=5", f"run.seed={seed}"]
    if config == "preferences":
        if seed not in reward_models:
            _, summary = reward_run.train_to_end(str(PREFERENCES / "rm.toml"), tmp / f"rm-{seed}", "cpu", [f"run.seed={seed}"])
            reward_models[seed] = summary["files"]["rm"]
        overrides.append(f"reward.checkpoint={reward_models[seed]}")
    path = EXAMPLE if config == "first-run" else PREFERENCES / "policy.toml"
    t0 = time.perf_counter()
    run, _, _ = loop.train_to_end(str(path), tmp / f"run-{seed}", overrides=overrides, force=True)
    held = [r for r in run.rows if r["held_out_reward"] is not None]
    best = max(held, key=lambda r: r["held_out_reward"])
    return {"seed": seed, "before": held[0]["held_out_reward"], "best": best["held_out_reward"], "best_round": best["round"],
            "after": held[-1]["held_out_reward"], "gold_before": held[0]["held_out_gold"],
            "gold_after": held[-1]["held_out_gold"], "rules": sorted({rule for r in run.rows for rule in r["rules"]}),
            "wall_s": round(time.perf_counter() - t0, 1)}


def markdown_longer(rows: list[dict]) -> str:
    """The table of training-run.md#longer-runs: medians over seeds, and each seed's last evaluation."""
    med = statistics.median
    lines = [f"| {LONGER_ROUNDS} rounds | held-out before -> best (round) -> last (median) | last per seed | "
             "gold metric before -> last (median) | rules fired | s per seed |",
             "| --- | --- | --- | --- | --- | ---: |"]
    for r in rows:
        runs = r["runs"]
        gold = "-" if runs[0]["gold_before"] is None else \
            f"{med(x['gold_before'] for x in runs):.2f} -> {med(x['gold_after'] for x in runs):.2f}"
        rules = ", ".join(sorted({k for x in runs for k in x["rules"]})) or "-"
        lines.append(f"| {r['variant']} | {med(x['before'] for x in runs):.2f} -> {med(x['best'] for x in runs):.2f} "
                     f"({med(x['best_round'] for x in runs):.0f}) -> {med(x['after'] for x in runs):.2f} | "
                     f"{', '.join(format(x['after'], '.2f') for x in runs)} | {gold} | {rules} | "
                     f"{med(x['wall_s'] for x in runs):.0f} |")
    return "\n".join(lines) + "\n"


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
    variants, table = (LONGER, markdown_longer) if args.longer else (VARIANTS, markdown)
    names = calibrate.chosen(variants, args.variant)
    env = version_gate.check_versions()
    with tempfile.TemporaryDirectory(prefix="first-run-longer-") as tmp:
        reward_models: dict[int, str] = {}
        chosen_measure = (lambda v, seed: measure_longer(v, seed, reward_models, Path(tmp))) if args.longer else measure
        rows = calibrate.over_seeds(variants, names, args.seeds, chosen_measure,
                                    streams.Progress("calibrate-first-run", not args.json or args.progress))
    return calibrate.emit("calibrate-first-run", variants, names, rows, lambda x: x["after"] > x["before"], table, args,
                          example=str(EXAMPLE), versions=env["versions"])

if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
