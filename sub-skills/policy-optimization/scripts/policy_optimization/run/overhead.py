"""What the run kit costs beside the library's own loop (``bench --train-overhead``): a round with
its metrics and watchdog against the same trainer's plain ``train()`` call, and a checkpoint
against a plain round, as ratios measured in one process (interleaved pairs, the median of the
paired ratios), at a given config's size. Budgets: metrics and watchdog at most 5% of a round, a
checkpoint at most 20% (the issue that asked for the run kit)."""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from policy_optimization.run import loop
from run_kit import checkpoint
from skill_runtime import streams

BUDGETS = {"metrics_ratio": 0.05, "checkpoint_ratio": 0.20}
PLANS = Path(__file__).resolve().parents[3] / "assets" / "plans"
# (config, --set overrides that make a plan config a run, pairs): the learning check's size and the
# accuracy configs' (bench --plan-accuracy), GRPO and PPO; a plan config runs [run] rounds of one learn().
CONFIGS = (("learning-check-size.toml", [], 10),
           ("accuracy-grpo.toml", ["train.num_episodes=null", "train.max_timesteps=null"], 3),
           ("accuracy-ppo.toml", ["train.num_episodes=null", "train.max_timesteps=null"], 3))


def measure(config: str, overrides: list[str], pairs: int = 5) -> dict[str, Any]:
    """``pairs`` interleaved (plain round, observed round, checkpoint) triples on one trainer built
    from ``config`` with ``overrides`` (``--set`` syntax; [run] rounds is set to cover them), after one
    warm-up round of each. A plain round is ``trainer.train(**one round)`` with the library's output
    captured; an observed round is ``Run.one_round`` plus writing its row (hooks, the policy probe,
    change norms, the watchdog, metrics.jsonl). Returns seconds per kind and the median ratios
    (observed - plain) / plain and checkpoint / plain. The run directory is temporary."""
    with tempfile.TemporaryDirectory(prefix="train-overhead-") as tmp:
        options = loop.Options(progress=False, say=lambda line: None)
        prepared = loop.prepare(config, Path(tmp) / "run", False, False,
                                [*overrides, f"run.rounds={2 * pairs + 2}", f"run.checkpoint_every={10**6}"], options)
        run = loop.Run.build(prepared, "cpu")
        plain, observed, saved = [], [], []
        round_ = 0

        def plain_round() -> float:
            t0 = time.perf_counter()
            with streams.capture_library_output():
                run.trainer.train(**run.train_kwargs())
            return time.perf_counter() - t0

        def observed_round() -> float:
            nonlocal round_
            round_ += 1
            t0 = time.perf_counter()
            run.write_row(run.one_round(round_))
            return time.perf_counter() - t0

        for i in range(pairs + 1):  # the order alternates, so a drift of the machine hits both alike
            first, second = (plain_round, observed_round) if i % 2 else (observed_round, plain_round)
            a, b = first(), second()
            p, o = (a, b) if i % 2 else (b, a)
            t0 = time.perf_counter()
            checkpoint.save(run.trainer, run.run, round_, {"trainer": run.name})
            s = time.perf_counter() - t0
            if i:  # the first triple warms up (allocations, caches, the first checkpoint folder)
                plain.append(p)
                observed.append(o)
                saved.append(s)
    metrics_ratio = statistics.median((o - p) / p for o, p in zip(observed, plain))
    checkpoint_ratio = statistics.median(s / p for s, p in zip(saved, plain))
    return {"config": config, "overrides": overrides, "pairs": pairs, "plain_s": plain, "observed_s": observed,
            "checkpoint_s": saved, "metrics_ratio": metrics_ratio, "checkpoint_ratio": checkpoint_ratio,
            "within": {key: value <= BUDGETS[key] for key, value in
                       (("metrics_ratio", metrics_ratio), ("checkpoint_ratio", checkpoint_ratio))}}


def bench(progress: streams.Progress, pairs: int | None = None) -> dict[str, Any]:
    """``bench --train-overhead``: ``measure`` on each of CONFIGS (``pairs`` overrides each one's
    count) in one process, and the verdict: ok when every ratio is within BUDGETS. The 1-minute
    load average before and after each is recorded (a busy machine makes weak evidence)."""
    rows = []
    for name, overrides, default_pairs in CONFIGS:
        n = pairs or default_pairs
        with progress.stage(f"{name}: {n} pairs of a plain and an observed round, and a checkpoint", total=None):
            load = [os.getloadavg()[0]]
            result = measure(str(PLANS / name), overrides, n)
            load.append(os.getloadavg()[0])
        rows.append({**result, "config": name, "load_average": [round(x, 2) for x in load]})
    ok = all(all(r["within"].values()) for r in rows)
    return {"kind": "train-overhead", "status": "ok" if ok else "failed", "budgets": BUDGETS, "rows": rows,
            "cpus": os.cpu_count()}


def summary(report: dict[str, Any]) -> str:
    """The plain report: per config the median ratios against their budgets, the verdict last."""
    lines = []
    for r in report["rows"]:
        marks = {k: "PASS" if ok else "FAIL" for k, ok in r["within"].items()}
        busy = max(r["load_average"]) >= report["cpus"]
        weak = " (weak: load average up to {:.1f} on {} CPUs)".format(max(r["load_average"]), report["cpus"]) if busy else ""
        lines.append(f"{r['config']}: metrics and watchdog {r['metrics_ratio']:+.1%} of a round "
                     f"(budget {BUDGETS['metrics_ratio']:.0%}) {marks['metrics_ratio']}{weak}; checkpoint "
                     f"{r['checkpoint_ratio']:.1%} of a round (budget {BUDGETS['checkpoint_ratio']:.0%}) "
                     f"{marks['checkpoint_ratio']}{weak}; a plain round {statistics.median(r['plain_s']):.2f} s")
    word = "OK (exit 0): every ratio within its budget" if report["status"] == "ok" else \
        "FAILED (exit 1): a ratio over its budget; next: profile Run.one_round (policy_optimization/run/metrics.py)"
    lines.append(f"bench --train-overhead: {word}")
    return "\n".join(lines)
