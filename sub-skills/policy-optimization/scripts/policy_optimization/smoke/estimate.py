"""What a smoke run will cost before it starts: its wall seconds (``estimate_s``, the line
``announce_estimate`` prints before a long run, scaled by the machine's load) and the peak memory
of one process (``predicted_rank_mib``, for the refusals of ``--nproc`` and of a size beyond the
available memory). Both from the PaLM's weight count (``palm_weights``), without importing torch."""
from __future__ import annotations

import os

import probe_kit
from skill_runtime import placement, reporting, streams
from policy_optimization import tiny_trainers, trainers
from policy_optimization.smoke import learning_check, settings

# Train smoke, per trainer: ESTIMATE_ROLLOUT_S per rollout, ESTIMATE_LAYER_STEP_S per layer and
# sampling step, ESTIMATE_MULTIPLY_S per multiply-add of the forwards train() and generate() run
# (palm.py generate keeps no cache: each step runs the whole sequence). Fitted (least squares on
# the relative error) to the 26 rows of sizing.md's measured table (one torch thread,
# load average 2.6): every row within 1.8x (tests/test_output.py holds them within 2x).
ESTIMATE_ROLLOUT_S = 0.095
ESTIMATE_LAYER_STEP_S = 4.5e-4
ESTIMATE_MULTIPLY_S = 5.5e-11
ESTIMATE_FULL_FORWARDS = 3  # full-length forwards per stored sequence: scoring, reference, learn()
ESTIMATE_NOTE_S = 30.0      # the estimate line is printed before a run predicted to take longer
# --learn: seconds per seed, the "s per seed" of workflows.md's measured pass rates (control none;
# tests/test_output.py ties them to that table): a quiet machine's figure. Issue 22 saw a run take
# 3.3 times it at load average 4 to 6 on 2 CPUs; the estimate line says so (``load_factor``).
LEARN_SECONDS_PER_SEED = {"ppo": 5.42, "grpo": 0.66, "tpo": 1.96, "flowrl": 0.58}

# Predicted peak resident memory of one process: measured peak RSS of the smoke
# (`/usr/bin/time -f %M`, torch 2.13 CPU): 340 MiB at the tiny default size (imports alone: 310 MiB),
# +118 MiB at --dim 256 --depth 4 (12.6 MiB of float32 PaLM weights), +407 MiB at --dim 512
# --depth 4 --new-tokens 64 (49 MiB): about 10 times the PaLM's float32 bytes above the floor. Against
# sizing.md's table: PPO, the heaviest trainer, within 10 % up to --dim 2048; GRPO over by
# up to 1.5x (tests/test_distributed.py checks both).
RANK_FLOOR_MIB = 350
RANK_MIB_PER_WEIGHT_MIB = 10


def palm_weights(config: dict[str, int]) -> int:
    """Number of weights of ``PaLM(**config)`` for the smoke's config keys (num_tokens, dim, depth,
    heads, dim_head; palm.py defaults ff_mult=4, qk_rmsnorm=False): the token embedding (tied with
    to_logits), per layer a layer norm, the fused attention/feed-forward projection and the two
    output projections, and the final norm. Counted without importing the library, which would cost
    the launching process ~300 MiB for the whole run; tests compare it with ``PaLM(...).parameters()``."""
    n, d, dh = config["num_tokens"], config["dim"], config["dim_head"]
    attn, ff = config["heads"] * dh, 4 * d
    layer = d + d * (attn + 2 * dh + 2 * ff) + attn * d + ff * d
    return n * d + d + config["depth"] * layer


def predicted_rank_mib(config: dict[str, int]) -> int:
    """Predicted peak resident memory of one smoke process in MiB: RANK_FLOOR_MIB plus
    RANK_MIB_PER_WEIGHT_MIB times the PaLM's float32 weights (``palm_weights``)."""
    return RANK_FLOOR_MIB + round(RANK_MIB_PER_WEIGHT_MIB * palm_weights(config) * 4 / 2**20)


def estimate_s(args) -> float:
    """Predicted wall seconds of the run after the imports on a quiet machine (see ESTIMATE_* and
    LEARN_SECONDS_PER_SEED): --learn, seeds x seconds per seed; the train smoke, per trainer the
    rollouts' sampling steps and the forwards' multiply-adds (``palm_weights``; attention
    4 * depth * heads * dim_head per squared position); --construct-only, 0."""
    names = settings.trainer_names(args)
    if args.learn:
        return len(learning_check.learn_seeds(args)) * sum(LEARN_SECONDS_PER_SEED[n] for n in names)
    if args.construct_only:
        return 0.0
    config = settings.palm_config(args)
    weights = palm_weights(config)
    attention = 4 * config["depth"] * config["heads"] * config["dim_head"]
    prompt = args.prompt_len or sum(probe_kit.PROMPT_LENGTHS) // 2
    length = (args.prompt_len or probe_kit.PROMPT_LENGTHS[1]) + args.new_tokens  # max_seq_len
    sampled = sum(weights * n + attention * n * n for n in range(prompt, length))
    full = weights * length + attention * length * length
    total = 0.0
    for name in names:
        spec = trainers.TRAINERS[name]
        group = settings.smoke_group(spec)
        rollouts = args.rollouts or settings.smoke_rollouts(spec)
        stored = rollouts * group + settings.smoke_steps(spec, rollouts) * tiny_trainers.SMOKE_MINIBATCH[name]
        total += (ESTIMATE_ROLLOUT_S * rollouts + ESTIMATE_LAYER_STEP_S * rollouts * (length - prompt) * config["depth"]
                  + ESTIMATE_MULTIPLY_S * (rollouts * group * sampled + ESTIMATE_FULL_FORWARDS * stored * full))
    return total


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, averaged), or None where the OS has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def load_factor(load: float | None, cpus: int) -> float:
    """How many times longer than on a quiet machine a one-thread run may take: ``load / cpus`` (each
    runnable process gets a CPU for about ``cpus / load`` of the time), at least 1; 1 when the load
    is unknown (None). An upper figure: the load average also counts processes waiting on I/O, and
    a run at load 7.8 on 2 CPUs took 1.4 times the quiet estimate, not 3.9."""
    return 1.0 if load is None else max(1.0, load / max(1, cpus))


def announce_estimate(args, progress: streams.Progress, extra: str = "") -> None:
    """The estimate line, before a run predicted to take more than ESTIMATE_NOTE_S on this machine
    now: ``estimate_s`` (a quiet machine's), and when the load average exceeds the usable CPUs, up
    to ``load_factor`` times that, naming the load it read."""
    quiet = estimate_s(args)
    load, cpus = load_average(), placement.usable_cpus()
    factor = load_factor(load, cpus)
    if quiet * factor <= ESTIMATE_NOTE_S:
        return
    basis = ("calibrate_learning.py's seconds per seed" if args.learn else
             "fitted to the measured table of references/sizing.md")
    busy = (f"; the load average is {load:.1f} on {cpus} usable CPUs, so it may take up to {factor:.1f} times "
            f"that, {reporting.seconds_text(quiet * factor)}" if factor > 1 else "")
    progress.note(f"this run should take about {reporting.seconds_text(quiet)} after the imports{extra} on a "
                  f"quiet machine ({basis}){busy}")
