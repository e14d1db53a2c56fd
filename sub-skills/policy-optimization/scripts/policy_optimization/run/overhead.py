"""What the run kit costs beside the library's own loop (``bench --train-overhead``): a round with
its metrics and watchdog against the same trainer's plain ``train()`` call, and a checkpoint
against a plain round, as ratios measured in one process (interleaved pairs, the median of the
paired ratios), at a given config's size. Budgets: metrics and watchdog at most 5% of a round, a
checkpoint at most 20% (the issue that asked for the run kit).

A ratio over its budget is judged as the main bench judges a wall-time ratio
(``measuring.busy_reason``): INCONCLUSIVE rather than FAIL when the load average reached the CPU
count, the paired ratios fall on both sides of the limit, or the same ratio in CPU time is within
it. Where the observed round's extra time goes is measured part by part (``PARTS``: the hooks
inside ``train()``, the snapshot and change norms of the trainable weights, the policy probe's
entropy and kl_base forwards, the reward model's coverage probe, the held-out evaluation, the row,
the watchdog, writing the row)."""
from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from policy_optimization import measuring
from policy_optimization.run import loop, metrics
from run_kit import alarms, checkpoint
from skill_runtime import placement, streams

BUDGETS = {"metrics_ratio": 0.05, "checkpoint_ratio": 0.20}
PLANS = Path(__file__).resolve().parents[3] / "assets" / "plans"
# (config, --set overrides that make a plan config a run, pairs): the learning check's size and the
# accuracy configs' (bench --plan-accuracy), GRPO and PPO; a plan config runs [run] rounds of one learn().
CONFIGS = (("learning-check-size.toml", [], 15),
           ("accuracy-grpo.toml", ["train.num_episodes=null", "train.max_timesteps=null"], 7),
           ("accuracy-ppo.toml", ["train.num_episodes=null", "train.max_timesteps=null"], 7))
# the parts of an observed round beside train(): (label, module, function); timed by wrapping them
PARTS = (("snapshot of the trainable weights", metrics, "snapshot_trainable"),
         ("change norms", metrics, "change_norms"),
         ("entropy and kl_base forwards", metrics, "policy_probe"),
         ("reward-model coverage probe", metrics, "unseen_gain"),
         ("row (token figures)", metrics, "build_row"),
         ("watchdog", alarms, "evaluate"))


@contextlib.contextmanager
def timed_parts(run: loop.Run) -> Iterator[dict[str, float]]:
    """Seconds spent in each of PARTS, the held-out evaluation (``Run.held_out``) and writing the
    row (``Run.write_row``) while the block runs, summed per label; the wrapped functions are
    restored on exit."""
    spent: dict[str, float] = {}

    def wrap(owner, name: str, label: str):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
        return original, timed

    with contextlib.ExitStack() as stack:
        for label, owner, name in (*PARTS, ("held-out evaluation", run, "held_out"), ("write the row", run, "write_row")):
            original, timed = wrap(owner, name, label)
            setattr(owner, name, timed)
            stack.callback(delattr, run, name) if owner is run else stack.callback(setattr, owner, name, original)
        yield spent


def paired(values: list[float]) -> dict[str, float]:
    """``{median, min, max}`` of paired ratios."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(config: str, overrides: list[str], pairs: int = 5) -> dict[str, Any]:
    """``pairs`` interleaved (plain round, observed round, checkpoint) triples on one trainer built
    from ``config`` with ``overrides`` (``--set`` syntax; [run] rounds is set to cover them), after one
    warm-up round of each. A plain round is ``trainer.train(**one round)`` with the library's output
    captured; an observed round is ``Run.one_round`` plus writing its row (hooks, the policy probe,
    change norms, the watchdog, metrics.jsonl). Returns wall and CPU seconds (``time.process_time``,
    every thread of this process) per kind, the paired ratios ((observed - plain) / plain and
    checkpoint / plain, ``paired``) in both, and the median seconds per round of each part of the
    observed round (``parts_s``; ``hooks in train()``: its ``train()`` call minus the plain one's).
    The run directory is temporary."""
    with tempfile.TemporaryDirectory(prefix="train-overhead-") as tmp:
        options = loop.Options(progress=False, say=lambda line: None)
        prepared = loop.prepare(config, Path(tmp) / "run", False, False,
                                [*overrides, f"run.rounds={2 * pairs + 2}", f"run.checkpoint_every={10**6}"], options)
        run = loop.Run.build(prepared, "cpu")
        wall: dict[str, list[float]] = {"plain": [], "observed": [], "checkpoint": []}
        cpu: dict[str, list[float]] = {"plain": [], "observed": [], "checkpoint": []}
        parts: list[dict[str, float]] = []
        round_ = 0

        def clocked(work) -> tuple[float, float, Any]:
            c0, t0 = time.process_time(), time.perf_counter()
            out = work()
            return time.perf_counter() - t0, time.process_time() - c0, out

        def plain_round():
            with streams.capture_library_output():
                run.trainer.train(**run.train_kwargs())

        def observed_round() -> dict[str, float]:
            nonlocal round_
            round_ += 1
            with timed_parts(run) as spent:
                row = run.one_round(round_)
                run.write_row(row)
            return {**spent, "train() with its hooks": row["wall_s"]}

        for i in range(pairs + 1):  # the order alternates, so a drift of the machine hits both alike
            order = (("plain", plain_round), ("observed", observed_round))
            results = {kind: clocked(work) for kind, work in (order if i % 2 else order[::-1])}
            saved = clocked(lambda: checkpoint.save(run.trainer, run.run, round_, {"run_id": run.run_id, "trainer": run.name}))
            if i:  # the first triple warms up (allocations, caches, the first checkpoint folder)
                for kind, (w, c, _) in (*results.items(), ("checkpoint", saved)):
                    wall[kind].append(w)
                    cpu[kind].append(c)
                spent = results["observed"][2]
                spent["hooks in train()"] = spent.pop("train() with its hooks") - results["plain"][0]
                parts.append(spent)
    ratios = {"metrics_ratio": [(o - p) / p for o, p in zip(wall["observed"], wall["plain"])],
              "checkpoint_ratio": [s / p for s, p in zip(wall["checkpoint"], wall["plain"])]}
    cpu_ratios = {"metrics_ratio": [(o - p) / p for o, p in zip(cpu["observed"], cpu["plain"]) if p > 0],
                  "checkpoint_ratio": [s / p for s, p in zip(cpu["checkpoint"], cpu["plain"]) if p > 0]}
    labels = sorted({label for spent in parts for label in spent})
    return {"config": config, "overrides": overrides, "pairs": pairs, "plain_s": wall["plain"],
            "observed_s": wall["observed"], "checkpoint_s": wall["checkpoint"], "cpu_s": cpu,
            **{key: statistics.median(values) for key, values in ratios.items()},
            "paired": {key: paired(values) for key, values in ratios.items()},
            "cpu_ratio": {key: paired(values) if values else None for key, values in cpu_ratios.items()},
            "parts_s": {label: statistics.median(spent.get(label, 0.0) for spent in parts) for label in labels}}


def judge(row: dict[str, Any], load: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each budget of a measured row: ``verdict`` pass, fail or inconclusive (over the limit, but
    ``measuring.busy_reason`` says this run cannot judge it), with its ``detail``; a pass is
    ``weak`` at a load average at or above the CPU count or with one pair (``measuring.weak_reason``).
    The ratios are judged as the main bench's, as multiples of a plain round (1 + the overhead for
    metrics and watchdog)."""
    out = {}
    for key, limit in BUDGETS.items():
        shift = 1.0 if key == "metrics_ratio" else 0.0
        as_x = {k: v + shift for k, v in row["paired"][key].items()}
        cpu = row["cpu_ratio"][key]
        verdict = "pass" if as_x["median"] <= limit + shift else "fail"
        reason = measuring.busy_reason(load, as_x, None if cpu is None else {k: v + shift for k, v in cpu.items()},
                                       limit + shift) if verdict == "fail" else None
        weak = measuring.weak_reason(load, row["pairs"] if row["pairs"] == 1 else None) if verdict == "pass" else None
        out[key] = {"verdict": "inconclusive" if reason else verdict, "reason": reason or weak, "weak": weak is not None}
    return out


def bench(progress: streams.Progress, pairs: int | None = None) -> dict[str, Any]:
    """``bench --train-overhead``: ``measure`` on each of CONFIGS (``pairs`` overrides each one's
    count) in one process, each judged (``judge``) against the 1-minute load average before and
    after it; the status: failed when a ratio fails, inconclusive when one cannot be judged, else
    ok."""
    rows = []
    for name, overrides, default_pairs in CONFIGS:
        n = pairs or default_pairs
        with progress.stage(f"{name}: {n} pairs of a plain and an observed round, and a checkpoint", total=None):
            load = [measuring.load_average()]
            result = measure(str(PLANS / name), overrides, n)
            load.append(measuring.load_average())
        known = [x for x in load if x is not None]
        judged = judge(result, {"max": max(known) if known else None, "cpus": placement.usable_cpus()})
        rows.append({**result, "config": name, "load_average": load, "verdicts": judged,
                     "within": {key: v["verdict"] == "pass" for key, v in judged.items()}})
    verdicts = {v["verdict"] for r in rows for v in r["verdicts"].values()}
    status = "failed" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "ok"
    return {"kind": "train-overhead", "status": status, "budgets": BUDGETS, "rows": rows, "cpus": os.cpu_count()}


def summary(report: dict[str, Any]) -> str:
    """The plain report: per config the median ratios against their budgets with their verdicts and
    where the observed round's extra time went, the verdict last."""
    lines = []
    for r in report["rows"]:
        marks = {k: v["verdict"].upper() + (f" ({'weak: ' if v['weak'] else 'too busy to judge: '}{v['reason']})"
                                             if v["reason"] else "") for k, v in r["verdicts"].items()}
        spread = r["paired"]["metrics_ratio"]
        lines.append(f"{r['config']}: metrics and watchdog {r['metrics_ratio']:+.1%} of a round (paired "
                     f"{spread['min']:+.1%} to {spread['max']:+.1%}, budget {BUDGETS['metrics_ratio']:.0%}) "
                     f"{marks['metrics_ratio']}; checkpoint {r['checkpoint_ratio']:.1%} of a round (budget "
                     f"{BUDGETS['checkpoint_ratio']:.0%}) {marks['checkpoint_ratio']}; a plain round "
                     f"{statistics.median(r['plain_s']):.2f} s, {r['pairs']} pairs, load average "
                     f"{', '.join(str(x) for x in r['load_average'])}")
        plain = statistics.median(r["plain_s"])
        lines.append("  where it goes (median per round): " + "; ".join(
            f"{label} {seconds * 1000:.1f} ms ({seconds / plain:+.1%})" for label, seconds in
            sorted(r["parts_s"].items(), key=lambda kv: -kv[1])))
    word = {"ok": "OK (exit 0): every ratio within its budget",
            "failed": "FAILED (exit 1): a ratio over its budget; next: the parts above say where the time goes "
                      "(policy_optimization/run/metrics.py)",
            "inconclusive": "INCONCLUSIVE (exit 75): a ratio over its budget on a machine too busy to judge it; "
                            "next: rerun when the load average is below the CPU count"}[report["status"]]
    lines.append(f"bench --train-overhead: {word}")
    return "\n".join(lines)
