"""What the run kit costs beside the library's own loop (``bench --train-overhead``): a round with
its metrics and watchdog against the same trainer's plain ``train()`` call, and a checkpoint
against a plain round, as ratios measured in one process (interleaved pairs, the median of the
paired ratios), at a given config's size. Budgets: metrics and watchdog at most 5% of a round, a
checkpoint at most 20% (the issue that asked for the run kit)."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from policy_optimization.run import checkpoint, loop
from skill_runtime import streams

BUDGETS = {"metrics_ratio": 0.05, "checkpoint_ratio": 0.20}
TRAIN_OVERRIDES = ["train.num_episodes=null"]  # a plan config as a run: [run] rounds instead


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
