#!/usr/bin/env python3
"""Calibrate the learning check of tiny_rlhf_learning_check.py (``--learn``): per-seed distributions and
pass rates, to regenerate the figures in references/workflows.md#learning-check.

For each trainer and control, runs the smoke's own ``learn_seed`` (the same code ``--learn``
runs) on seeds ``--seed`` .. ``--seed + --seeds - 1`` and reports the distribution of the
held-out reward gain per seed, how many seeds improved, and how many of the ``--seeds / 5``
independent 5-seed checks passed: block j is exactly what ``tiny-rlhf-smoke --learn --seed
<--seed + 5j>`` computes. Controls: ``none`` (the real check), ``inverted`` and ``frozen`` (the
smoke's ``--learn-control``), and ``noise``, a null only measured here: the trainer is rewarded
with a random k/8 per completion, independent of its tokens, so the gain shows how far the policy
drifts without a signal; the threshold must sit above that drift.

Usage:
    calibrate_learning.py                                    # 100 seeds x 4 trainers x 4 controls
    calibrate_learning.py --markdown                         # the docs' tables (settings, rates)
    calibrate_learning.py --trainer ppo --control none --seeds 20 --set ppo.lr=3e-3 --json

Long: about (seconds per seed, in the table) x seeds x controls per trainer. Runs in one process,
one torch thread by default, inside a private temporary directory.
"""
from __future__ import annotations

import dataclasses
import datetime
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, options, placement, runner, streams, version_gate, workspace  # noqa: E402
from policy_optimization.smoke import learning_check  # noqa: E402  (torch-free at import)

HERE = Path(__file__).resolve().parent
CONTROLS = ("none", "inverted", "frozen", "noise")   # the default set
EXTRA_CONTROLS = ("negated",)  # plain negation, [-1, 0]: why inverted is 1 - fraction (PPO's critic)
SETTINGS_HEADER = ("trainer", "episodes", "rollouts", "lr", "group size", "minibatch", "threshold",
                   "why (measured)")
RATES_HEADER = ("trainer", "control", "seeds", "reward before -> after (mean)",
                "gain min / median / max", "seeds improved", "5-seed checks passed", "s per seed")


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Measure the learning check of tiny-rlhf-smoke --learn over many seeds: per-seed "
                    "gain distributions and the pass rate of independent 5-seed checks, per trainer "
                    "and control.",
        epilog="examples:\n"
               "  calibrate_learning.py --markdown\n"
               "  calibrate_learning.py --trainer grpo --seeds 20 --json\n"
               "  calibrate_learning.py --trainer ppo --control none --set ppo.lr=3e-3 --seeds 20\n\n"
               + exits.EXIT_CODES_EPILOG.replace("1 a check failed", "1 a measured rate misses its target "
                                              "(real and inverted checks below 90%, frozen above 0)"))
    parser.add_argument("--trainer", action="append", choices=["ppo", "grpo", "tpo", "flowrl"], metavar="NAME",
                        help="ppo, grpo, tpo or flowrl; repeat for several (default: all four)")
    parser.add_argument("--control", action="append", choices=CONTROLS + EXTRA_CONTROLS, metavar="NAME",
                        help="none (the real check), inverted, frozen, noise, negated (reward minus the "
                             "fraction); repeat for several (default: all but negated)")
    parser.add_argument("--seeds", type=options.bounded_int(1, 10_000), default=100, metavar="N",
                        help="seeds per trainer and control, from --seed (default: 100 = 20 checks of 5)")
    parser.add_argument("--set", action="append", default=[], metavar="TRAINER.FIELD=VALUE",
                        help="override one field of the smoke's LEARN_SETTINGS row, e.g. ppo.lr=3e-3")
    options.add_common_options(parser)
    parser.add_argument("--markdown", action="store_true", help="print the docs' two tables on stdout")
    return parser


def overrides(items: list[str]) -> dict[str, Any]:
    """LEARN_SETTINGS with ``--set trainer.field=value`` applied; SkillError (exit 2) on a bad one."""
    settings = dict(learning_check.LEARN_SETTINGS)
    fields = {f.name: f.type for f in dataclasses.fields(learning_check.LearnSetting) if f.name != "why"}
    for item in items:
        key, _, value = item.partition("=")
        name, _, field = key.partition(".")
        if name not in settings or field not in fields or not value:
            raise exits.SkillError(f"--set {item!r}: expected TRAINER.FIELD=VALUE with TRAINER in "
                                f"{', '.join(settings)} and FIELD in {', '.join(fields)}")
        cast = float if fields[field] in (float, "float") else int
        try:
            settings[name] = dataclasses.replace(settings[name], **{field: cast(value)}, why="overridden")
        except ValueError:
            raise exits.SkillError(f"--set {item!r}: {value!r} is not a number") from None
    return settings


def noise_score(x, response):
    """The null reward: a random k/8 per completion (k in 0..8), whatever its tokens."""
    import torch
    return torch.randint(0, learning_check.LEARN_NEW_TOKENS + 1, (x.shape[0],), device=x.device) / learning_check.LEARN_NEW_TOKENS


def measure(name: str, control: str, seeds: list[int], setting, device_kwargs, device,
            progress: streams.Progress) -> dict[str, Any]:
    """Every seed of one trainer and control (one progress line counting the seeds); the per-seed
    results and the block verdicts."""
    rows = []
    with progress.stage(f"{name} {control}", total=len(seeds), unit="seeds") as bar:
        for seed in seeds:
            start = time.perf_counter()
            row = learning_check.learn_seed(name, seed, None if control in ("none", "noise") else control, device_kwargs,
                                   device, setting, train_score=noise_score if control == "noise" else None)
            row["seconds"] = time.perf_counter() - start
            rows.append(row)
            bar.set_postfix_str(f"seed {seed}: {row['reward_before']:.3f} -> {row['reward_after']:.3f}", refresh=False)
            bar.update(1)
    size = learning_check.LEARN_SEEDS
    blocks = [rows[i:i + size] for i in range(0, len(rows) - size + 1, size)]
    gains = [r["gain"] for r in rows]
    return {
        "trainer": name, "control": control, "seeds": len(rows),
        "reward_before": round(statistics.mean(r["reward_before"] for r in rows), 4),
        "reward_after": round(statistics.mean(r["reward_after"] for r in rows), 4),
        "gain": {"min": round(min(gains), 4), "median": round(statistics.median(gains), 4),
                 "max": round(max(gains), 4)},
        "improved": sum(g > 0 for g in gains),
        "checks": len(blocks),
        "checks_passed": sum(learning_check.learning_verdict(b, setting.threshold)[0] for b in blocks),
        "seconds_per_seed": round(statistics.median(r["seconds"] for r in rows), 3),
        "per_seed": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "curve"}
                     for r in rows],
    }


def target_met(entry: dict[str, Any]) -> bool | None:
    """Real and inverted checks pass in at least 90% of the runs, frozen in none; noise and
    negated: no target."""
    if entry["control"] in ("noise", "negated") or not entry["checks"]:
        return None
    if entry["control"] == "frozen":
        return entry["checks_passed"] == 0
    return entry["checks_passed"] >= 0.9 * entry["checks"]


def settings_table(settings: dict[str, Any]) -> list[str]:
    """Markdown lines of the settings table (the docs' copy of LEARN_SETTINGS)."""
    lines = ["| " + " | ".join(SETTINGS_HEADER) + " |", "|" + "---|" * len(SETTINGS_HEADER)]
    for name, s in settings.items():
        cells = [name, s.episodes, s.rollouts, f"{s.lr:g}", s.group_size, s.minibatch_size, f"{s.threshold:g}", s.why]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def rates_table(entries: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of the measured table, one row per trainer and control."""
    lines = ["| " + " | ".join(RATES_HEADER) + " |", "|" + "---|" * len(RATES_HEADER)]
    for e in entries:
        g = e["gain"]
        cells = [e["trainer"], e["control"], e["seeds"], f"{e['reward_before']:.2f} -> {e['reward_after']:.2f}",
                 f"{g['min']:+.2f} / {g['median']:+.2f} / {g['max']:+.2f}", f"{e['improved']}/{e['seeds']}",
                 f"{e['checks_passed']}/{e['checks']}", f"{e['seconds_per_seed']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The docs' two tables and the line between them (references/workflows.md#learning-check)."""
    v, m = report["versions"], report["machine"]
    return "\n".join([
        *settings_table(report["settings"]), "",
        f"Measured {report['date']} on {m['cpus']} CPUs (load average {m['load_average_1min']} at start), "
        f"torch {v['torch']}, palm-rlhf-pytorch {v['palm-rlhf-pytorch']}, device {report['device']}, "
        f"{report['cpu_threads']} torch thread; seeds {report['first_seed']} to "
        f"{report['first_seed'] + report['seeds'] - 1} per row, 5-seed checks on consecutive blocks:", "",
        *rates_table(report["results"]), ""])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.markdown and args.json:
        raise exits.SkillError("--markdown and --json are exclusive")
    if args.seeds < learning_check.LEARN_SEEDS:
        raise exits.SkillError(f"--seeds must be at least {learning_check.LEARN_SEEDS} (one check)")
    if args.seed + args.seeds - 1 > options.MAX_SEED:
        raise exits.SkillError(f"--seed {args.seed} + --seeds {args.seeds} passes the largest seed {options.MAX_SEED}")
    settings = overrides(args.set)
    env = version_gate.check_versions(args.allow_untested)
    import os
    device_kwargs, device = placement.resolve_device(args.device)
    names = list(dict.fromkeys(args.trainer or settings))
    controls = list(dict.fromkeys(args.control or CONTROLS))
    seeds = list(range(args.seed, args.seed + args.seeds))
    load_at_start = round(os.getloadavg()[0], 2)
    results = []
    progress = streams.Progress("calibrate-learning", not args.json or args.progress)
    with workspace.private_workdir(), placement.torch_threads(args.cpu_threads) as threads:
        for name in names:
            for control in controls:
                results.append(measure(name, control, seeds, settings[name], device_kwargs, device,
                                       progress))
    for entry in results:
        entry["target_met"] = target_met(entry)
    ok = all(e["target_met"] is not False for e in results)
    report = {"status": "ok" if ok else "failed", "date": datetime.date.today().isoformat(),
              "device": str(device), "cpu_threads": threads, "first_seed": args.seed, "seeds": args.seeds,
              "versions": env["versions"],
              "machine": {"cpus": os.cpu_count(), "load_average_1min": load_at_start},
              "settings": settings, "results": results}
    if args.markdown:
        sys.stdout.write(markdown(report))
    else:
        report["settings"] = {k: dataclasses.asdict(v) for k, v in settings.items()}
        runner.emit(report, args.json, lambda r: "\n".join(rates_table(r["results"])) + "\ncalibrate-learning: "
                + ("OK (exit 0): every rate met its target; next: --markdown, then replace the tables in "
                   "workflows.md#learning-check" if r["status"] == "ok" else
                   "FAILED (exit 1): a rate missed its target (real or inverted below 90%, frozen above 0)"),
                exits.EXIT_OK if ok else exits.EXIT_CHECK_FAILED)
    return exits.EXIT_OK if ok else exits.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
