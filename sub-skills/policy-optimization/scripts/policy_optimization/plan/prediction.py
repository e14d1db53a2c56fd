"""The prediction of a run from its counts and the probe's measurements: memory per pool
(``predict_memory``), wall time (``predict_time``), the warnings of settings that fail, learn
nothing or are ignored (``build_warnings``), the defaults behind a fix (``defaults_note``), and
the one-line verdict (``verdict``).

Torch-free (pure arithmetic on the figures).
"""
from __future__ import annotations

import math
from typing import Any

from skill_runtime import reporting
from policy_optimization import trainers

MIB = 2**20
# the symptom index and the silent-failure table; the traps, one file per topic
DOCS = "references/troubleshooting.md"
SETUP_TRAPS = "references/traps-setup.md"
WEIGHT_TRAPS = "references/traps-weights.md"
MAX_DAYS = 30.0  # --max-days: a longer predicted wall time is the verdict too_slow (exit 1)
# Settings the installed library accepts and never uses (tests/test_plan.py checks each against
# the source): (trainers, section, key, only when this other key is falsy or None, why).
IGNORED = (
    (("ppo", "grpo", "flowrl"), "train", "max_batch_size", None,
     "train() accepts it and never reads it: each rollout samples one prompt"),
    (("flowrl",), "trainer", "kl_div_loss_weight", None,
     "FlowRLTrainer stores it and learn() never reads it"),
    (("flowrl",), "trainer", "beta_s", None, "FlowRLTrainer accepts it and never stores it"),
    (("grpo",), "trainer", "score_centering_topk", "use_score_centering",
     "read only by the score-centering loss"),
    (("grpo",), "trainer", "entropy_to_advantage_kappa", "add_entropy_to_advantage",
     "read only when the entropy is added to the advantage"),
    (("grpo",), "trainer", "entropy_to_advantage_scale", "add_entropy_to_advantage",
     "read only when the entropy is added to the advantage"),
)


def figure(value: Any, basis: str) -> dict[str, Any]:
    """A reported figure and how it was obtained: computed (exact arithmetic from the installed
    library), measured (in the probe) or derived (extrapolated from measurements)."""
    return {"value": value, "basis": basis}


def predict_memory(counts: dict[str, int], per_rollout: int, buffer: bool, base: dict[str, int],
                   params: dict[str, Any], probe: dict[str, Any], minibatch_size: int) -> dict[str, Any]:
    """Peak memory of the full run, in bytes, per pool (``host``: RAM; ``device``: CUDA memory).

    ``per_rollout``: bytes one rollout stores (its experiences, or its TPO buffer timestep, whose
    memmap pages count in RSS once written). Held before a learn(): every rollout since the last one;
    learn() stacks them once more (pad_sequence; TPO reads minibatches from the buffer instead).
    ``probe`` gives the measured transients above the RSS before the stage: ``rollout_bytes`` (one
    rollout) and ``learn_bytes`` over ``learn_items`` experiences (their stacked copy, the optimizer
    state created on the first step, gradients and the activations of its minibatches); activations
    are scaled to the full minibatch. The heap a rollout's transients grew is not handed back to
    the system (glibc keeps it), so it stays under learn() too. On CPU everything is in ``host``;
    on CUDA the experiences stay on the host (the trainers store ``.cpu()`` copies) and weights,
    optimizer and activations on the device. Returns ``{pools: {pool: bytes}, parts: {name:
    figure}, complete}``; ``complete`` is False when a transient was not measured (a lower bound).
    """
    items = counts["items_per_rollout"]
    learned = counts["learn_calls"] > 0
    held = counts["max_items_held"] // items * per_rollout
    stacked = counts["items_per_learn"] // items * per_rollout if learned and not buffer else 0
    optimizer = params["optimizer_state_bytes"] + params["gradient_bytes"]
    learn_items = probe.get("learn_items") or 0
    activations = None
    if probe.get("learn_bytes") is not None and learn_items:
        probe_copy = 0 if buffer else learn_items * per_rollout // items
        measured = max(0, probe["learn_bytes"] - probe_copy - optimizer)
        scale = min(minibatch_size, counts["items_per_learn"]) / min(minibatch_size, learn_items)
        activations = int(measured * scale)
    rollout = probe.get("rollout_bytes")
    parts = {"held_before_learn": figure(held, "computed"), "learn_copy": figure(stacked, "computed"),
             "optimizer_and_gradients": figure(optimizer if learned else 0, "computed"),
             "rollout_transient": figure(rollout, "measured" if rollout is not None else None),
             "learn_activations": figure(activations if learned else 0,
                                         "computed" if not learned else "derived" if activations is not None else None)}
    cuda = "device" in base
    on_device = optimizer if learned else 0
    rollout_phase = (0 if cuda else on_device) + max(0, held - per_rollout) + (rollout or 0)
    learn_phase = ((0 if cuda else on_device) + held + (rollout or 0) + stacked + (activations or 0)) if learned else 0
    pools = {"host": base["host"] + max(rollout_phase, learn_phase)}
    if cuda:
        pools["host"] = base["host"] + held + stacked
        pools["device"] = base["device"] + on_device + max(probe.get("rollout_device_bytes") or 0,
                                                           probe.get("learn_device_bytes") or 0)
    complete = rollout is not None and (activations is not None or not learned)
    return {"pools": pools, "parts": parts, "complete": complete}


def predict_time(counts: dict[str, int], measured: dict[str, Any], epochs: int, evaluations: int = 0) -> dict[str, Any]:
    """Wall time of the full run, seconds: process start and imports, construction, every rollout
    (the first one's one-time cost once), every learn() (per experience and epoch, the first
    call's one-time cost once) and ``evaluations`` scorings of the [eval] prompts (``eval_s``
    each). ``measured`` holds those unit figures (None when not measured, then the total is a
    lower bound)."""
    rollout_s, learn_item_s = measured.get("rollout_s"), measured.get("learn_item_s")
    rollouts = learns = 0.0
    if counts["rollouts"]:
        rollouts = None if rollout_s is None else \
            counts["rollouts"] * rollout_s + measured.get("first_rollout_extra_s", 0.0)
    if counts["learn_calls"]:
        learns = None if learn_item_s is None else \
            counts["learn_calls"] * counts["items_per_learn"] * epochs * learn_item_s \
            + measured.get("first_learn_extra_s", 0.0)
    held_out = 0.0 if not evaluations else (
        None if measured.get("eval_s") is None else evaluations * measured["eval_s"])
    parts = {"startup": measured["startup_s"], "construct": measured.get("construct_s"),
             "rollouts": rollouts, "learn": learns, "eval": held_out}
    total = sum(v for v in parts.values() if v is not None)
    lower = any(v is None for v in parts.values()) or bool(measured.get("lower_bound"))
    return {"total_s": total, "lower_bound": lower, "parts_s": parts}


POOL_WORDS = {"device": " on the GPU", "host": " of host RAM"}  # where a pool's memory is, on a CUDA run


def failing_pool(pools: dict[str, int], available: dict[str, int], pool: str) -> str | None:
    """The memory pool whose predicted peak exceeds what it has: the run's device's (``pool``)
    first, then the host's (on CUDA the stored experiences live there); None when both fit."""
    return next((p for p in dict.fromkeys((pool, "host")) if p in pools and pools[p] > available[p]), None)


def defaults_note(defaults_applied: list[dict[str, Any]], keys: tuple[str, ...]) -> str:
    """`` (num_episodes 50,000 and max_timesteps 500: train()'s defaults, not set in the config)``
    for the ``keys`` of [train] the config left to the library; empty when it set them all."""
    applied = {d["key"]: d["value"] for d in defaults_applied
               if d["section"] == "train" and d["source"] == "library"}
    named = [f"{k} {applied[k]:,}" for k in keys if k in applied]
    return f" ({' and '.join(named)}: train()'s defaults, not set in the config)" if named else ""


def memory_words(memory: dict[str, Any] | None, pools: dict[str, int], shown: str, pool: str,
                 available: dict[str, int], params: dict[str, Any], device, defaults_applied: list[dict[str, Any]],
                 learns: bool) -> tuple[str, str]:
    """(message, fix) of the memory_exceeds_device warning for the pool ``shown`` (the one that does
    not fit) with that pool's own figures: on CUDA the experiences live in host RAM and the
    weights, optimizer and activations on the GPU (``predict_memory``), so a host pool that fails
    is named as host RAM, beside the GPU's peak. ``memory`` None: not built at the real size, the
    weights (and, when learn() runs, the optimizer state and gradients) alone exceed the pool:
    the fix is smaller sizes, not fewer experiences."""
    gib = lambda n: f"{n / 2**30:,.1f} GiB"  # noqa: E731
    where = POOL_WORDS[shown] if pool == "device" else f" on {device}"
    head = f"predicted peak {gib(pools[shown])} exceeds the {gib(available[shown])} available{where}"
    if memory is None:
        optimizer = params["optimizer_state_bytes"] + params["gradient_bytes"]
        copies = ", ".join(name for name, part in params["components"].items() if part["bytes"] >= 2**20) or "the PaLM"
        return (f"{head}: the weights ({gib(params['weights_bytes'])}: {copies}) and prompt ids alone do not fit"
                + (f", and learn() adds {gib(optimizer)} of optimizer state and gradients" if learns else ""),
                "smaller [palm] sizes (dim, depth, num_tokens; each model the trainer holds copies them), "
                "or a device with more memory")
    held = memory["parts"]["held_before_learn"]["value"]
    text = head + (f"; the experiences held before each learn() alone take {gib(held)}" if held else "") \
        + defaults_note(defaults_applied, ("update_timesteps", "max_seq_len"))
    if shown == "host" and pool == "device":
        text += f" (the trainers keep them in host RAM; the GPU's peak, {gib(pools['device'])} of " \
                f"{gib(available['device'])}, fits)" if pools["device"] <= available["device"] else " (in host RAM)"
        return text, ("lower update_timesteps (the experiences held before each learn() grow with it), max_seq_len "
                      "or the group size; or a machine with more RAM")
    return text, ("lower update_timesteps (the experiences held before each learn() grow with it), max_seq_len, "
                  "the group size or minibatch_size; or use a device with more memory")


def group_warning(name: str, effective: dict[str, Any], group_size: int) -> dict[str, Any] | None:
    """A group of one sequence per prompt: what each trainer then does (reproduced on 0.8.0)."""
    if name == "ppo" or group_size != 1:
        return None
    kwarg = trainers.TRAINERS[name].group_kwarg
    if name == "grpo" and (effective.get("use_dr_grpo") or effective.get("dr_grpo_constant") is not None
                           or effective.get("use_max_rl")):
        effect = "every advantage is 0 (reward minus the group mean of one), nothing is learned"
    elif name == "grpo":
        effect = ("the first rollout raises a bare AssertionError: the std of one reward is NaN and "
                  "safe_div asserts a non-negative divisor")
    elif name == "flowrl":
        effect = "the normalised reward is NaN, so the loss and then every weight become NaN"
    else:
        effect = "the target is the one sample itself: the policy loss carries no reward signal"
    return {"code": "group_of_one", "blocks_learning": True,
            "message": f"{kwarg}=0 samples one sequence per prompt: {effect}",
            "fix": f"set {kwarg} to at least 1 (group size = {kwarg} + 1)",
            "doc": f"{WEIGHT_TRAPS}#group-size-per-rollout"}


def learn_raises(name: str, resolved: dict[str, Any]) -> list[dict[str, Any]]:
    """The warnings of known traps after which the installed learn() raises (reproduced on 0.8.0,
    canaries in tests/test_canaries.py): the probe never calls that learn()."""
    eff = resolved["effective"]["trainer"]
    out = []
    if name == "flowrl" and eff["partition_function_hidden_dim"] != resolved["palm"]["dim"]:
        out.append({"code": "flowrl_partition_dim", "blocks_learning": True,
                    "message": f"partition_function_hidden_dim {eff['partition_function_hidden_dim']} != PaLM dim "
                               f"{resolved['palm']['dim']}: the first learn() raises 'mat1 and mat2 shapes cannot "
                               "be multiplied', after every rollout before it",
                    "fix": f"partition_function_hidden_dim = {resolved['palm']['dim']}",
                    "doc": f"{SETUP_TRAPS}#flowrl-partition-dim"})
    if name == "ppo" and eff.get("max_norm") is not None:
        out.append({"code": "ppo_max_norm", "blocks_learning": True,
                    "message": "max_norm is set: PPO's learn() calls self.accelerator.clip_grad_norm_ and "
                               "raises AttributeError at its first minibatch",
                    "fix": "max_norm = None for PPO", "doc": f"{SETUP_TRAPS}#ppo-max-norm"})
    return out


def build_warnings(name: str, resolved: dict[str, Any], counts: dict[str, int], group_size: int,
                   optimizer: str | None, memory_fits: bool | None, memory_text: str,
                   memory_fix: str = "") -> list[dict[str, Any]]:
    """Every setting that makes the run fail, learn nothing, or that the library ignores, with its
    fix. ``blocks_learning`` marks those after which nothing useful is learned. ``memory_text`` and
    ``memory_fix``: the memory_exceeds_device warning's (``memory_words``)."""
    eff, train = resolved["effective"]["trainer"], resolved["effective"]["train"]
    out: list[dict[str, Any]] = []
    rollouts, update, rnd = counts["rollouts"], train["update_timesteps"], resolved.get("round")
    per_call = rollouts // counts.get("rounds", 1)  # the rollouts of one train() call
    made_of = (f"[run] rounds {rnd['rounds']} x max_timesteps {rnd['max_timesteps']}" if rnd else
               f"num_episodes {train['num_episodes']} x max_timesteps {train['max_timesteps']}")
    if counts["learn_calls"] == 0:
        out.append({"code": "never_learns", "blocks_learning": True,
                    "message": f"no learn() at all: {rollouts} rollouts ({made_of}) never reach update_timesteps "
                               f"{update}" + (" within a round" if rnd else "")
                               + "; train() still prints that training completed",
                    "fix": f"set update_timesteps to a divisor of {per_call}" if rollouts else
                           "run at least one rollout (num_episodes and max_timesteps above 0)",
                    "doc": f"{SETUP_TRAPS}#update-timesteps-default"})
    elif counts["leftover_rollouts_dropped"]:
        out.append({"code": "leftovers_dropped", "blocks_learning": False,
                    "message": f"the last {counts['leftover_rollouts_dropped']} rollouts "
                               f"({counts['leftover_items_dropped']} experiences) are sampled and then dropped "
                               "when train() returns" + (" (each round)" if rnd else ""),
                    "fix": f"make update_timesteps divide max_timesteps = {per_call}" if rnd else
                           f"make update_timesteps divide num_episodes * max_timesteps = {rollouts}",
                    "doc": f"{SETUP_TRAPS}#update-timesteps-default"})
    if memory_fits is False:
        out.append({"code": "memory_exceeds_device", "blocks_learning": False, "message": memory_text,
                    "fix": memory_fix, "doc": f"{WEIGHT_TRAPS}#group-size-per-rollout"})
    if name == "ppo" and counts["learn_calls"] and eff.get("critic_pooled_values", True):
        one = "every minibatch" if eff["minibatch_size"] == 1 else (
            "the last minibatch of each epoch" if counts["last_minibatch_items"] == 1 else None)
        if one:
            out.append({"code": "minibatch_of_one", "blocks_learning": eff["minibatch_size"] == 1,
                        "message": f"{one} holds one experience: PPO normalises the advantage over the "
                                   "minibatch (masked_normalize), so its advantage is exactly 0 and it teaches "
                                   "the actor nothing",
                        "fix": "minibatch_size >= 2, and update_timesteps % minibatch_size != 1",
                        "doc": None})
    warning = group_warning(name, eff, group_size)
    if warning:
        out.append(warning)
    out += learn_raises(name, resolved)
    required = trainers.REQUIRED_STEPS.get(optimizer or "")
    if counts["learn_calls"] and required and counts["optimizer_steps"] < required:
        out.append({"code": "too_few_optimizer_steps", "blocks_learning": False,
                    "message": f"{counts['optimizer_steps']} optimizer steps in the whole run: {optimizer} needs "
                               f"{required} before every LoRA tensor has moved",
                    "fix": "more rollouts per learn(), more epochs or a smaller minibatch_size",
                    "doc": f"{SETUP_TRAPS}#optimizer-first-steps"})
    for names, section, key, unless, why in IGNORED:
        if name in names and key in resolved[section] and (unless is None or not eff.get(unless)):
            out.append({"code": "ignored_setting", "blocks_learning": False,
                        "message": f"[{section}] {key} has no effect: {why}"
                                   + (f" (and {unless} is off)" if unless else ""),
                        "fix": f"remove {key}" + (f", or turn on {unless}" if unless else ""), "doc": None})
    if train.get("eos_token") is not None:
        out.append({"code": "eos_token", "blocks_learning": False,
                    "message": "eos_token is set: a rollout stops sampling once every sequence has sampled it, "
                               "so the predicted time is an upper bound for a policy that samples it early",
                    "fix": "none needed", "doc": None})
    return out


def verdict(fits: bool, counts: dict[str, int], warnings: list[dict[str, Any]], wall: dict[str, Any],
            peak_bytes: int, peak_complete: bool, available_bytes: int, max_days: float = math.inf,
            cpu_day: bool = False, where: str = "") -> tuple[str, str]:
    """(status, one line): does_not_fit, never_learns, too_slow (the predicted wall time, or its
    lower bound, exceeds ``max_days`` days: --max-days), or fits (``cpu_day``: "but over a day on
    a CPU", the warning long_on_cpu); the line names the first reason and the predicted wall time
    and peak ("at least" where a part was not measured)."""
    blocking = [w for w in warnings if w["blocks_learning"]]
    time_text = ("at least " if wall["lower_bound"] else "") + reporting.seconds_text(wall["total_s"])
    peak_text = ("" if peak_complete else "at least ") + human_bytes(peak_bytes)
    tail = f"predicted {time_text} wall, {peak_text} peak ({human_bytes(available_bytes)} available{where})"
    if fits is False:
        status, head = "does_not_fit", "does not fit"
    elif blocking:
        code = blocking[0]["code"]
        status, head = "never_learns", "never learns" + ("" if code == "never_learns" else f" ({code.replace('_', ' ')})")
    elif wall["total_s"] > max_days * 86400:
        status, head = "too_slow", f"too slow (over --max-days {max_days:g})"
    else:
        status, head = "fits", f"fits and learns ({counts['learn_calls']:,} learn() calls)" + (
            ", but over a day on a CPU" if cpu_day else "")
    return status, f"{head}: {tail}"


def human_bytes(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 10 * 2**30 else f"{n / MIB:,.0f} MiB"

