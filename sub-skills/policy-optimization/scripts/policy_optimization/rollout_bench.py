"""``bench --rollouts``: tokens per second of the library's ``PaLM.generate`` and of the cached
sampler (scripts/cached_sampler.py), measured side by side in one process, interleaved, over
batches (PPO's 1, a group of 8, 64) and prompt + new lengths (128 + 128, 512 + 256), as ratios;
then one round of ``train`` with each sampler on the same config (interleaved pairs).

Each row also sets the cached sampler's time per step against what the hardware allows
(``floors``): the bytes a step reads (every weight once, the LoRA products, the keys and values
cached) at the copy bandwidth measured here, the arithmetic at the matmul rate measured here, and
the operations it launches (counted in one step) at the per-operation cost measured here.
``--profile`` adds the operations that took the cached sampler's time.

The library's generate is timed in full when its predicted time fits ``--max-library-s``; beyond
it (long sequences at batch 64 on a CPU take hours) its steps are timed at four lengths and summed
over every length through the planner's fit (``unit_costs.steps_time``: t(n) = a + b n + c n**2),
and the row says so (``library_basis``). Torch-free at import.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from policy_optimization import measuring
from policy_optimization.plan import unit_costs

BATCHES = (1, 8, 64)                 # PPO's one completion, a group of 8, a large batch
LENGTHS = ((128, 128), (512, 256))   # prompt + new tokens
DIMS = ((256, 4),)                   # (dim, depth) on a CPU; a GPU takes the (512, 12), (1024, 24)
QUICK = {"batches": (1, 8), "lengths": ((128, 128),), "dims": ((128, 2),)}
NUM_TOKENS = 257                     # the byte tokenizer's vocabulary (probe_kit.TINY_PALM)
GOAL_RATIO, GOAL_MIN_LENGTH = 5.0, 256   # issue 32: at prompt + new >= 256, at least 5x on this CPU
MAX_LIBRARY_S = 60.0                 # --max-library-s: a longer library generate is timed by its steps
STEP_LENGTHS = 4                     # lengths the library's steps are timed at when not run in full
PLANS = Path(__file__).resolve().parents[2] / "assets" / "plans"
TRAIN_CONFIGS = ("accuracy-grpo-256.toml", "accuracy-ppo-256.toml")  # a round with each sampler
QUICK_TRAIN_CONFIGS = ("learning-check-size.toml",)
TRAIN_PAIRS = 3
MIB = 2**20


def parse_dims(text: str) -> tuple[tuple[int, int], ...]:
    """``--dims 256x4,512x12`` -> ((256, 4), (512, 12)). Raises ValueError for another form."""
    out = []
    for part in text.split(","):
        dim, sep, depth = part.strip().lower().partition("x")
        if not sep or not dim.isdigit() or not depth.isdigit() or int(dim) < 2 or int(depth) < 1:
            raise ValueError(f"{part.strip()!r}: expected DIMxDEPTH, e.g. 256x4 (dim >= 2, depth >= 1)")
        out.append((int(dim), int(depth)))
    return tuple(out)


def build_palm(dim: int, depth: int, num_tokens: int, device, seed: int = 0):
    """A PaLM of the library's defaults (heads 8, dim_head 64) at ``dim``/``depth`` with the LoRA
    scope 'actor' every trainer adds (its B drawn small and nonzero, as after training), in eval
    mode on ``device``."""
    import torch
    from palm_rlhf_pytorch import PaLM
    torch.manual_seed(seed)
    palm = PaLM(num_tokens=num_tokens, dim=dim, depth=depth, finetune_scopes=("actor",))
    with torch.no_grad():
        for name, p in palm.finetune_modules.named_parameters():
            if name.endswith("B"):
                p.normal_(0, 0.02)
    return palm.to(device).eval()


def timed(fn, device) -> float:
    t0 = measuring.now(device)
    fn()
    return measuring.now(device) - t0


def library_step(palm, prompt, device) -> float:
    """Seconds of one step of the library's generate on ``prompt`` (b, n): one full forward."""
    from palm_rlhf_pytorch import PaLM
    return timed(lambda: PaLM.generate(palm, prompt.shape[-1] + 1, prompt, finetune_scope="actor"), device)


def library_by_steps(palm, prompt, new: int, device) -> float:
    """Seconds of the library's generate of ``new`` tokens after ``prompt``, from one step timed at
    STEP_LENGTHS lengths (prompt to prompt + new - 1) summed over every length by the planner's fit."""
    import torch
    p = prompt.shape[-1]
    lengths = sorted({round(p + (new - 1) * i / (STEP_LENGTHS - 1)) for i in range(STEP_LENGTHS)})
    tokens = torch.randint(1, palm.num_tokens, (prompt.shape[0], p + new), device=device)
    tokens[:, :p] = prompt
    points = [(n, library_step(palm, tokens[:, :n], device)) for n in lengths]
    return unit_costs.steps_time(points, p, p + new - 1)


def measure_row(palm, batch: int, prompt_len: int, new: int, repeat: int, max_library_s: float, device) -> dict[str, Any]:
    """``repeat`` interleaved pairs (the order alternates) of the library's generate and the cached
    sampler's on the same prompt, after a warm-up of each. Returns the row: tokens per second
    (batch x new / seconds, medians), the median of the paired ratios cached / library, and how the
    library was timed."""
    import torch
    import cached_sampler
    from palm_rlhf_pytorch import PaLM
    prompt = torch.randint(1, palm.num_tokens, (batch, prompt_len), device=device)
    seq_len = prompt_len + new
    cached = lambda: timed(lambda: cached_sampler.generate(palm, seq_len, prompt, finetune_scope="actor"), device)
    cached()  # warm-up: the allocator, the rotary tables
    first, last = library_step(palm, prompt, device), library_step(palm, prompt[:, :1].repeat(1, seq_len - 1), device)
    full = new * (first + last) / 2 <= max_library_s
    library = (lambda: timed(lambda: PaLM.generate(palm, seq_len, prompt, finetune_scope="actor"), device)) if full \
        else (lambda: library_by_steps(palm, prompt, new, device))
    pairs = []
    for i in range(repeat):
        a, b = (library(), cached()) if i % 2 == 0 else reversed((cached(), library()))
        pairs.append((a, b))
    lib_s, cache_s = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
    ratios = [a / b for a, b in pairs]
    tokens = batch * new
    return {"batch": batch, "prompt": prompt_len, "new": new, "dim": palm.dim, "depth": len(palm.layers),
            "library_tokens_per_s": round(tokens / lib_s, 2), "cached_tokens_per_s": round(tokens / cache_s, 2),
            "ratio": round(statistics.median(ratios), 2), "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
            "library_s": round(lib_s, 4), "cached_s": round(cache_s, 4), "cached_ms_per_token_step": round(cache_s / new * 1e3, 3),
            "library_basis": "full" if full else f"steps at {STEP_LENGTHS} lengths, summed by the planner's fit",
            "pairs": repeat}


def machine_rates(device) -> dict[str, float]:
    """What this machine does per second, measured here: ``copy_gb_s`` (a 256 MiB tensor copied:
    bytes read + written), ``matmul_gflop_s`` (a 1024 x 1024 float32 matmul), ``op_us`` (one tiny
    elementwise operation: the fixed cost of launching any operation)."""
    import torch
    big = torch.empty(64 * MIB, device=device)
    dst = torch.empty_like(big)
    dst.copy_(big)
    copy_s = min(timed(lambda: dst.copy_(big), device) for _ in range(5))
    a = torch.randn(1024, 1024, device=device)
    a @ a
    mm_s = min(timed(lambda: a @ a, device) for _ in range(5))
    tiny = torch.ones(1, device=device)
    n = 20000
    op_s = min(timed(lambda: [tiny.add(tiny) for _ in range(n)], device) for _ in range(3)) / n
    return {"copy_gb_s": round(2 * big.numel() * 4 / copy_s / 1e9, 2), "matmul_gflop_s": round(2 * 1024**3 / mm_s / 1e9, 2),
            "op_us": round(op_s * 1e6, 3)}


def step_ops(palm, batch: int, length: int, device) -> int:
    """Operations (aten calls, each a kernel launch) of one cached step at ``length`` positions."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    import cached_sampler

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    cache = cached_sampler.KVCacheForward(palm, length + 1)
    ids = torch.randint(1, palm.num_tokens, (batch, length + 1), device=device)
    with torch.no_grad():
        cache(ids[:, :length], finetune_scope="actor")
        with Count():
            cache(ids, finetune_scope="actor")
    return Count.calls


def floors(palm, row: dict[str, Any], rates: dict[str, float], device) -> dict[str, Any]:
    """The cached sampler's time per step (``cached_ms_per_token_step``) against what the machine
    allows at the mean length: ``traffic_ms`` (every weight read once, the LoRA products
    (dim x (q + k + v) and (q x dim) per layer) and the cached keys and values, at ``copy_gb_s``),
    ``compute_ms`` (2 x weights x batch multiply-adds, plus attention over the cache, at
    ``matmul_gflop_s``), ``launch_ms`` (the step's operations at ``op_us``); ``floor_ms`` =
    launches + the larger of traffic and compute (eager execution: each operation is launched,
    then runs), and ``measured_x_floor``."""
    dim, depth, batch = palm.dim, len(palm.layers), row["batch"]
    block = palm.layers[0].fn
    q_inner, dim_head = block.heads * block.fused_dims[1], block.fused_dims[1]
    weights = sum(p.numel() for n, p in palm.named_parameters() if "finetune_modules" not in n)
    lora = depth * (dim * (q_inner + 2 * dim_head) + q_inner * dim)
    length = row["prompt"] + row["new"] // 2
    kv = depth * 2 * batch * length * dim_head
    traffic_ms = (weights + lora + kv) * 4 / (rates["copy_gb_s"] * 1e9 / 2) * 1e3  # copy_gb_s counts read + write
    compute_ms = (2 * (weights + lora) * batch + depth * 4 * batch * block.heads * length * dim_head) \
        / (rates["matmul_gflop_s"] * 1e9) * 1e3
    ops = step_ops(palm, batch, length, device)
    launch_ms = ops * rates["op_us"] / 1e3
    floor = launch_ms + max(traffic_ms, compute_ms)
    return {"weights_mib": round((weights + lora) * 4 / MIB, 2), "ops_per_step": ops, "traffic_ms": round(traffic_ms, 3),
            "compute_ms": round(compute_ms, 3), "launch_ms": round(launch_ms, 3), "floor_ms": round(floor, 3),
            "measured_x_floor": round(row["cached_ms_per_token_step"] / floor, 2)}


def profile_cached(palm, batch: int, prompt_len: int, new: int, device, top: int = 8) -> list[dict[str, Any]]:
    """The operations that took the cached sampler's time in one generate (torch.profiler, self CPU
    time): ``[{op, calls, self_ms, share}]``, the ``top`` largest."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    import cached_sampler
    prompt = torch.randint(1, palm.num_tokens, (batch, prompt_len), device=device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cached_sampler.generate(palm, prompt_len + new, prompt, finetune_scope="actor")
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "calls": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 2),
             "share": round(e.self_cpu_time_total / total, 3)} for e in events[:top]]


def train_rounds(config: str, pairs: int, progress) -> dict[str, Any]:
    """One ``train`` round (the trainer's own ``train()`` call of ``Run.train_kwargs``) with each
    sampler on ``config``, ``pairs`` interleaved pairs after a warm-up round each: seconds per round
    (medians) and the median paired ratio library / cached. The run directories are temporary."""
    import tempfile
    from policy_optimization.run import loop
    from skill_runtime import streams
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp:
        for sampler in ("library", "cached"):
            options = loop.Options(progress=False, say=lambda line: None)
            prepared = loop.prepare(str(PLANS / config), Path(tmp) / sampler, False, False,
                                    ["train.num_episodes=null", "train.max_timesteps=null", f"run.rounds={pairs + 1}",
                                     f"run.sampler={sampler}"], options)
            runs[sampler] = loop.Run.build(prepared, "cpu")

        def one(sampler: str) -> float:
            run = runs[sampler]
            t0 = time.perf_counter()
            with streams.capture_library_output():
                run.trainer.train(**run.train_kwargs())
            return time.perf_counter() - t0

        seconds: dict[str, list[float]] = {"library": [], "cached": []}
        for i in range(pairs + 1):
            order = ("library", "cached") if i % 2 == 0 else ("cached", "library")
            for sampler in order:
                s = one(sampler)
                if i:  # the first pair warms up
                    seconds[sampler].append(s)
        for run in runs.values():
            run.finish("paused", None)
    ratios = [a / b for a, b in zip(seconds["library"], seconds["cached"])]
    return {"config": config, "pairs": pairs, "library_round_s": round(statistics.median(seconds["library"]), 3),
            "cached_round_s": round(statistics.median(seconds["cached"]), 3), "ratio": round(statistics.median(ratios), 2),
            "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)]}


def goal_check(rows: list[dict[str, Any]], load: dict[str, Any]) -> dict[str, Any]:
    """Issue 32's goal on this CPU: at prompt + new >= GOAL_MIN_LENGTH, the cached sampler at least
    GOAL_RATIO x the library's tokens per second, on every such row. ``verdict``: pass; fail; or
    inconclusive when a row misses it with some paired ratio reaching it, or the load average
    reached the CPU count (the two samplers then waited unequally)."""
    judged = [r for r in rows if r["prompt"] + r["new"] >= GOAL_MIN_LENGTH]
    missed = [r for r in judged if r["ratio"] < GOAL_RATIO]
    busy = load.get("max") is not None and load["max"] >= load["cpus"]
    verdict = "pass" if judged and not missed else "skip" if not judged else \
        "inconclusive" if busy or any(r["ratio_range"][1] >= GOAL_RATIO for r in missed) else "fail"
    return {"ratio": GOAL_RATIO, "min_length": GOAL_MIN_LENGTH, "verdict": verdict, "rows": len(judged),
            "missed": [{k: r[k] for k in ("batch", "prompt", "new", "dim", "depth", "ratio")} for r in missed],
            "least_ratio": min((r["ratio"] for r in judged), default=None)}


def bench(args, progress) -> dict[str, Any]:
    """``bench --rollouts``: every (dims, lengths, batch) row (``measure_row``) with its ``floors``
    (and ``--profile``'s), then ``train_rounds`` on each train config, and the goal."""
    import torch
    from skill_runtime import placement
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    quick = QUICK if args.quick else {}
    dims = args.dims or quick.get("dims", DIMS)
    batches, lengths = quick.get("batches", BATCHES), quick.get("lengths", LENGTHS)
    repeat = args.repeat
    report: dict[str, Any] = {"kind": "rollouts", "device": str(device), "num_tokens": args.num_tokens,
                              "cpu_threads": torch.get_num_threads(), "repeat": repeat,
                              "load_average": {"start": measuring.load_average(), "max": None, "cpus": placement.usable_cpus()}}
    with progress.stage("machine rates: copy bandwidth, matmul rate, one operation's cost"):
        report["machine_rates"] = rates = machine_rates(device)
    rows, loads = [], [report["load_average"]["start"] or 0.0]
    for dim, depth in dims:
        palm = build_palm(dim, depth, args.num_tokens, device)
        for prompt_len, new in lengths:
            for batch in batches:
                with progress.stage(f"dim {dim} depth {depth}, batch {batch}, {prompt_len} + {new}: {repeat} pair(s)"):
                    row = measure_row(palm, batch, prompt_len, new, repeat, args.max_library_s, device)
                    row["floors"] = floors(palm, row, rates, device)
                    if args.profile:
                        row["profile"] = profile_cached(palm, batch, prompt_len, new, device)
                rows.append(row)
                loads.append(measuring.load_average() or 0.0)
    report["rows"] = rows
    report["train_rounds"] = []
    for config in (QUICK_TRAIN_CONFIGS if args.quick else TRAIN_CONFIGS):
        pairs = 1 if args.quick else TRAIN_PAIRS
        with progress.stage(f"train rounds of {config} with each sampler: {pairs} pair(s)"):
            report["train_rounds"].append(train_rounds(config, pairs, progress))
        loads.append(measuring.load_average() or 0.0)
    report["load_average"]["max"] = max(loads)
    report["goal"] = goal_check(rows, report["load_average"])
    report["status"] = {"pass": "ok", "skip": "ok", "fail": "failed", "inconclusive": "inconclusive"}[report["goal"]["verdict"]]
    return report


def summary(report: dict[str, Any]) -> str:
    """The plain report: one line per row (tokens per second of each sampler, the ratio, the cached
    step against its floor), the train rounds, the goal, and the verdict last."""
    rates, load = report["machine_rates"], report["load_average"]
    lines = [f"bench --rollouts: {report['device']}, {report['cpu_threads']} torch thread(s), vocabulary "
             f"{report['num_tokens']}, {report['repeat']} interleaved pair(s) per row; load average "
             f"{load['start']} at the start, up to {load['max']} on {load['cpus']} CPUs; copy {rates['copy_gb_s']} GB/s, "
             f"matmul {rates['matmul_gflop_s']} GFLOP/s, {rates['op_us']} us per operation",
             f"{'dim x depth':>11} {'batch':>5} {'prompt+new':>10} {'library tok/s':>13} {'cached tok/s':>12} "
             f"{'ratio':>14} {'cached ms/step':>14} {'floor ms':>8}"]
    for r in report["rows"]:
        f = r["floors"]
        ratio = f"{r['ratio']:.1f}x ({r['ratio_range'][0]:.1f}-{r['ratio_range'][1]:.1f})"
        lines.append(f"{r['dim']:>6} x {r['depth']:<2} {r['batch']:>5} {r['prompt']:>5}+{r['new']:<4} "
                     f"{r['library_tokens_per_s']:>13,.1f} {r['cached_tokens_per_s']:>12,.1f} {ratio:>14} "
                     f"{r['cached_ms_per_token_step']:>14.2f} {f['floor_ms']:>8.2f}"
                     + ("" if r["library_basis"] == "full" else "  (library: timed steps)"))
    for t in report["train_rounds"]:
        lines.append(f"train round of {t['config']}: library {t['library_round_s']:.2f} s, cached "
                     f"{t['cached_round_s']:.2f} s: {t['ratio']:.2f}x ({t['ratio_range'][0]:.2f}-{t['ratio_range'][1]:.2f})")
    g = report["goal"]
    word = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "skip": "SKIP"}[g["verdict"]]
    lines.append(f"goal: cached >= {g['ratio']:g}x the library's tokens/s at prompt + new >= {g['min_length']}: {word} "
                 f"(least {g['least_ratio']}x over {g['rows']} rows)")
    verdict = {"ok": "OK (exit 0)", "failed": "FAILED (exit 1): a row under the goal",
               "inconclusive": "INCONCLUSIVE (exit 75): a row under the goal on a machine too busy to judge it; rerun "
                               "when the load average is below the CPU count"}[report["status"]]
    lines.append(f"bench --rollouts: {verdict}; use the cached sampler: [run] sampler = \"cached\" "
                 "(sizing.md#rollouts-with-the-cached-sampler)")
    return "\n".join(lines)
