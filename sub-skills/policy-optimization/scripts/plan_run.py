#!/usr/bin/env python3
"""Plan a palm-rlhf-pytorch training run before starting it: counts, memory, time, dead settings.

Reads the run's configuration (TOML or JSON with the tables [palm], [reward_model], [trainer],
[prompts], [train]) and checks every key against the installed constructors' signatures. Then:

1. build the trainer on torch's meta device: exact parameter counts and weight bytes at any size;
2. build it for real on the device (skipped when the weights alone do not fit), then probe it,
   bounded by --probe-seconds: three tiny rollouts reveal what the installed trainer stores per
   experience; one sampling step is timed at three sequence lengths; then either a few real
   rollouts and learn() on a reduced number of experiences (measured), or, when one rollout
   would not fit the budget, the last step of a rollout and learn() on its experience
   (extrapolated);
3. predict the full run: rollouts, learn() calls, optimizer steps, dropped leftovers, the memory
   held before each learn() and the peak against what the device has, and the wall time. The
   report marks each figure computed (exact arithmetic), measured (in the probe) or derived
   (extrapolated from measurements), warns about settings that learn nothing or are ignored, and
   ends with a one-line verdict.

Usage:
    plan_run.py --config run.toml                        # report on stdout, verdict last
    plan_run.py --config run.toml --json                 # one JSON object on stdout
    plan_run.py --config run.toml --set train.update_timesteps=64 --probe-seconds 20
    plan_run.py --config run.toml --execute --json       # run it for real (what bench --plan-accuracy times)

Runs inside a private temporary directory and leaves nothing in the caller's directory.
The configuration keys, JSON schema and exit codes are in references/workflows.md#plan-a-run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from skill_runtime import byte_tokenizer, exits, options, placement, reporting, runner, streams, version_gate, workspace  # noqa: E402

HERE = Path(__file__).resolve().parent
PLANS = HERE.parent / "assets" / "plans"
UPSTREAM_EXAMPLE = PLANS / "upstream-readme.toml"
from policy_optimization import trainers  # noqa: E402

TRAINERS, REQUIRED_STEPS = trainers.TRAINERS, trainers.REQUIRED_STEPS

SECTIONS = ("palm", "reward_model", "trainer", "prompts", "train")
REQUIRED_SECTIONS = ("palm", "trainer", "prompts")
PROMPT_KEYS = {"count": int, "length": int, "path": str}
# constructor arguments the planner supplies itself, with where the config sets them instead
SUPPLIED = {"palm": "[palm]", "reward_model": "[reward_model]", "prompts": "[prompts]",
            "prompts_path": "[prompts] path", "prompt_token_ids": "[prompts]",
            "tokenizer": "[prompts] path (byte tokenizer)", "accelerate_kwargs": "--device",
            "critic": "nothing (a PaLM object)", "actor_critic": "nothing (a module object)"}
# lowest accepted value of a key; below it the library divides by zero or builds nothing
MIN_VALUE = {("palm", "dim"): 1, ("palm", "num_tokens"): 2, ("palm", "depth"): 1,
             ("palm", "heads"): 1, ("palm", "dim_head"): 1, ("trainer", "minibatch_size"): 1,
             ("trainer", "epochs"): 0, ("train", "num_episodes"): 0, ("train", "max_timesteps"): 0,
             ("train", "update_timesteps"): 1, ("train", "max_seq_len"): 1,
             ("train", "max_episodes"): 1, ("prompts", "count"): 1, ("prompts", "length"): 1}

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
DOCS = "references/troubleshooting.md"
LEARN_MINIBATCHES = 4  # the probe's learn() runs on at most this many minibatches of experiences
MIB = 2**20
MAX_DAYS = 30.0  # --max-days: a longer predicted wall time is the verdict too_slow (exit 1)


class ProbeTimeout(Exception):
    """Raised from a forward pre-hook on the policy's token embedding once the probe's deadline has
    passed: every forward of the policy (sampling steps, scoring, learn()) can be stopped there."""


class ProbeRaised(Exception):
    """A probe stage ended because the installed library raised there (recorded in the probe's
    report as ``raised``): the full run would raise at the same place, so the probe stops."""


# --- configuration (no torch) ------------------------------------------------------------------

MAX_CONFIG_BYTES = 2**20  # 1 MiB: a config is a few KiB; /dev/zero or a stray dump is refused


def read_config(path: str) -> dict[str, Any]:
    """Parse ``path``: JSON when it ends in .json, else TOML. At most ``MAX_CONFIG_BYTES`` + 1 bytes
    are read, from a regular file or anything else (a pipe, /dev/stdin, a device such as /dev/zero).
    Raises SkillError(2) when it cannot be read, is larger than the cap, cannot be parsed, or is
    not a table of tables."""
    file = Path(path)
    try:
        with file.open("rb") as stream:
            data = stream.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise exits.SkillError(f"config {path}: larger than {MAX_CONFIG_BYTES // MIB} MiB, the most a config may "
                                "be (a config is a few KiB): pass the TOML or JSON config file")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        shipped = f" (the shipped configs are in {PLANS})" if isinstance(exc, FileNotFoundError) else ""
        raise exits.SkillError(f"config {path}: cannot read it: {exits.one_line(exc)}{shipped}") from None
    if file.suffix.lower() == ".json":
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise exits.SkillError(f"config {path}: not valid JSON: {exc}") from None
    else:
        import tomllib as toml
        try:
            config = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            raise exits.SkillError(f"config {path}: not valid TOML: {exc}") from None
    if not isinstance(config, dict):
        raise exits.SkillError(f"config {path}: the top level must be a table of [palm], [trainer], ... tables")
    return config


def apply_override(config: dict[str, Any], text: str) -> None:
    """Apply ``--set SECTION.KEY=VALUE``; VALUE is read as JSON (numbers, true/false, "text", [1, 2]),
    else kept as a string; ``null`` removes the key (the library's default applies again).
    Raises SkillError(2) for a malformed override."""
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key or section not in SECTIONS:
        raise exits.SkillError(f"--set {text!r}: expected SECTION.KEY=VALUE with SECTION one of {', '.join(SECTIONS)}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw.strip()
    table = config.setdefault(section, {})
    if not isinstance(table, dict):
        raise exits.SkillError(f"config [{section}]: must be a table")
    if value is None:  # null: unset it, so the library default applies (or [prompts] path replaces count)
        table.pop(key.strip(), None)
    else:
        table[key.strip()] = value


def type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "table", type(None): "null"}.get(type(value), type(value).__name__)


def check_structure(config: dict[str, Any]) -> None:
    """Sections, the trainer name and the prompt keys, before torch is imported.
    Raises SkillError(2) naming the first bad section or key."""
    for name in config:
        if name not in SECTIONS:
            raise exits.SkillError(f"config: unknown section [{name}]; the sections are {', '.join(SECTIONS)}")
        if not isinstance(config[name], dict):
            raise exits.SkillError(f"config [{name}]: must be a table, got {type_name(config[name])}")
    for name in REQUIRED_SECTIONS:
        if name not in config:
            raise exits.SkillError(f"config: missing section [{name}]")
    trainer = config["trainer"].get("name")
    if trainer not in TRAINERS:
        got = "missing" if trainer is None else repr(trainer)
        raise exits.SkillError(f"config [trainer] name: {got}; choose one of {', '.join(TRAINERS)}")
    prompts = config["prompts"]
    for key, value in prompts.items():
        if key not in PROMPT_KEYS:
            raise exits.SkillError(f"config [prompts] {key}: unknown key; give count and length, or path")
        want = PROMPT_KEYS[key]
        if type(value) is not want:
            raise exits.SkillError(f"config [prompts] {key}: expected {type_name(want())}, got {type_name(value)}")
        check_minimum("prompts", key, value)
    if ("path" in prompts) == ("count" in prompts or "length" in prompts):
        raise exits.SkillError("config [prompts]: give either path, or both count and length")
    if "path" not in prompts and not {"count", "length"} <= set(prompts):
        missing = "count" if "count" not in prompts else "length"
        raise exits.SkillError(f"config [prompts] {missing}: missing (count and length go together)")


def check_minimum(section: str, key: str, value: Any) -> None:
    low = MIN_VALUE.get((section, key))
    if low is not None and isinstance(value, int) and value < low:
        raise exits.SkillError(f"config [{section}] {key}: must be at least {low}, got {value}")


def check_value(section: str, key: str, value: Any, default: Any, required: bool) -> Any:
    """Check one value against the installed parameter's default (its type is the contract:
    palm-rlhf-pytorch annotates almost nothing). Returns the value to pass (lists become tuples
    where the default is a tuple). Raises SkillError(2) naming the key."""
    where = f"config [{section}] {key}"
    if required:
        expected = (int,)
    elif callable(default) and not isinstance(default, type):
        raise exits.SkillError(f"{where}: a Python callable; it cannot be set from a config file")
    elif isinstance(default, bool):
        expected = (bool,)
    elif isinstance(default, int):
        expected = (int,)
    elif isinstance(default, float):
        expected = (int, float)
    elif isinstance(default, str):
        expected = (str,)
    elif isinstance(default, tuple):
        expected = (list,)
    elif isinstance(default, dict):
        expected = (dict,)
    elif default is None:  # max_norm, dr_grpo_constant, eos_token, ...: any plain value
        expected = (bool, int, float, str)
    else:
        expected = (type(default),)
    if type(value) not in expected or (isinstance(value, bool) and bool not in expected):
        want = " or ".join(type_name(t()) for t in expected)
        raise exits.SkillError(f"{where}: expected {want}, got {type_name(value)}"
                            + ("" if value is None else f" {value!r}"))
    check_minimum(section, key, value)
    return tuple(value) if isinstance(default, tuple) else value


def check_against_library(config: dict[str, Any]) -> dict[str, Any]:
    """Every [palm], [reward_model], [trainer] and [train] key against ``inspect.signature`` of the
    installed ``PaLM``, ``RewardModel``, trainer class and its ``train()``, so the planner cannot
    drift from the library. Returns the resolved config: each section's user values plus
    ``effective`` (the trainer's and train()'s values with the library defaults filled in).
    Raises SkillError(2) naming the first unknown key or wrong type."""
    import importlib
    import inspect
    from palm_rlhf_pytorch import PaLM, RewardModel

    spec = TRAINERS[config["trainer"]["name"]]
    trainer_cls = getattr(importlib.import_module(spec.module), spec.class_name)
    targets = {"palm": PaLM.__init__, "reward_model": RewardModel.__init__,
               "trainer": trainer_cls.__init__, "train": trainer_cls.train}
    resolved: dict[str, Any] = {"prompts": dict(config["prompts"]), "trainer_class": trainer_cls}
    effective: dict[str, dict[str, Any]] = {}
    for section, target in targets.items():
        params = {n: p for n, p in inspect.signature(target).parameters.items()
                  if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        given = {k: v for k, v in config.get(section, {}).items() if not (section == "trainer" and k == "name")}
        values = {}
        for key, value in given.items():
            if key in SUPPLIED and section in ("trainer", "reward_model"):
                raise exits.SkillError(f"config [{section}] {key}: set by the planner from {SUPPLIED[key]}")
            if key not in params:
                known = ", ".join(n for n in params if n not in SUPPLIED)
                raise exits.SkillError(f"config [{section}] {key}: not an argument of the installed "
                                    f"{getattr(target, '__qualname__', section)}; known: {known}")
            param = params[key]
            values[key] = check_value(section, key, value, param.default, param.default is param.empty)
        missing = [n for n, p in params.items() if p.default is p.empty and n not in values and n not in SUPPLIED]
        if missing:
            raise exits.SkillError(f"config [{section}] {missing[0]}: missing (required by the installed library)")
        resolved[section] = values
        effective[section] = {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **values}
    resolved["name"] = config["trainer"]["name"]
    resolved["effective"] = effective
    return resolved


# --- arithmetic (no torch) ---------------------------------------------------------------------

def run_counts(rollouts: int, update_timesteps: int, items_per_rollout: int, minibatch_size: int,
               epochs: int) -> dict[str, int]:
    """What ``train()`` does with ``rollouts`` rollouts (``num_episodes * max_timesteps``).

    learn() runs when the rollout counter is a multiple of ``update_timesteps`` (ppo.py train(),
    same loop in grpo.py, tpo.py, flowrl.py); the rollouts after the last multiple are dropped when
    train() returns. One learn() makes ``epochs * ceil(items / minibatch_size)`` optimizer steps
    (DataLoader, last partial batch kept). Returns integer counts.
    """
    learn_calls = rollouts // update_timesteps
    items_per_learn = update_timesteps * items_per_rollout
    steps_per_learn = epochs * math.ceil(items_per_learn / minibatch_size)
    leftover = rollouts - learn_calls * update_timesteps
    last_minibatch = items_per_learn % minibatch_size or min(minibatch_size, items_per_learn)
    return {"rollouts": rollouts, "learn_calls": learn_calls, "items_per_rollout": items_per_rollout,
            "items_per_learn": items_per_learn, "minibatches_per_epoch": math.ceil(items_per_learn / minibatch_size),
            "last_minibatch_items": last_minibatch, "optimizer_steps_per_learn": steps_per_learn,
            "optimizer_steps": learn_calls * steps_per_learn, "leftover_rollouts_dropped": leftover,
            "leftover_items_dropped": leftover * items_per_rollout,
            "max_items_held": items_per_learn if learn_calls else rollouts * items_per_rollout}


def steps_time(points: list[tuple[int, float]], first: int, last: int) -> float:
    """Seconds of the sampling steps at lengths ``first .. last`` (inclusive): ``t(n)`` piecewise
    linear through the measured ``(n, seconds)`` points, continued with the last slope beyond them
    (a lower bound there: attention grows with n**2). One rollout calls ``PaLM.generate``'s loop
    once per length (palm.py ``generate``: ``max(1, seq_len - prompt_len)`` steps)."""
    points = sorted(points)

    def at(n: int) -> float:
        if len(points) == 1 or n <= points[0][0]:
            return points[0][1]
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        return max(points[-1][1], t0 + (t1 - t0) * (n - n0) / (n1 - n0))

    return sum(at(n) for n in range(first, last + 1))


# --- building (torch) --------------------------------------------------------------------------

def prompt_token_ids(resolved: dict[str, Any], seed: int, meta: bool = False):
    """``(count, length)`` int64 ids in [1, num_tokens) from [prompts] count/length (seeded; with
    ``meta`` a meta tensor of that shape, no memory), or the lines of [prompts] path through the
    skill's byte tokenizer (id = byte + 1, 0 = pad), dropping empty lines. Raises SkillError(2)
    for an unreadable or empty file, or ids beyond num_tokens."""
    import torch
    prompts, num_tokens = resolved["prompts"], resolved["palm"]["num_tokens"]
    if "path" not in prompts and meta:
        return torch.empty((prompts["count"], prompts["length"]), dtype=torch.long, device="meta")
    if "path" not in prompts:
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(1, num_tokens, (prompts["count"], prompts["length"]), generator=generator)
    try:
        lines = Path(prompts["path"]).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise exits.SkillError(f"config [prompts] path: cannot read it: {exits.one_line(exc)}") from None
    if not any(line.strip() for line in lines):
        raise exits.SkillError(f"config [prompts] path: no non-empty line in {prompts['path']}")
    tokenizer = byte_tokenizer.ByteTokenizer()
    if num_tokens < tokenizer.vocab_size:
        raise exits.SkillError(f"config [palm] num_tokens: byte-tokenized prompts ([prompts] path) use ids up "
                            f"to {tokenizer.vocab_size - 1}: must be at least {tokenizer.vocab_size}")
    return tokenizer(lines)


META_ABOVE_ELEMENTS = 4096  # while counting, tensors larger than this are made on the meta device


@contextlib.contextmanager
def large_tensors_on_meta() -> Iterator[None]:
    """While counting: every tensor factory (the ones ``with torch.device(...)`` redirects: empty,
    zeros, randn, linspace, tensor, ...) whose result holds more than META_ABOVE_ELEMENTS elements
    makes it on torch's meta device (shape and dtype, no memory); smaller ones are made as usual.
    A whole ``torch.device("meta")`` cannot build PPO: its HLGaussLoss asserts that its bins
    increase (``.all()`` on a linspace, hl_gauss_pytorch), which a meta tensor cannot answer. The
    large tensors (PaLM weights, every LoRA scope the trainer adds, value head, partition
    function) are what would take the memory: at any size the count allocates about nothing."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors  # the list torch.device(...) redirects

    factories = _device_constructors()

    class LargeOnMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories and kwargs.get("device") is None:
                try:
                    shaped = func(*args, **{**kwargs, "device": "meta"})
                except (RuntimeError, TypeError, ValueError):  # e.g. a CPU generator for a meta tensor
                    shaped = None
                if shaped is not None and shaped.numel() > META_ABOVE_ELEMENTS:
                    return shaped
            return func(*args, **kwargs)

    with LargeOnMeta():
        yield


def meta_module(module):
    """``module`` with its small tensors on the meta device too, so ``palm.device`` (its first
    parameter's, where PPO moves its ActorCritic: ppo.py:387) is meta at any vocabulary size. Swapping
    the tensors in place (``torch.__future__.set_swap_module_params_on_conversion``) keeps shared
    parameters shared (the tied embedding); a plain ``.to("meta")`` would untie and count it twice."""
    import torch
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        return module.to("meta")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


def build_trainer(resolved: dict[str, Any], device_kwargs: dict[str, Any], device, ids, meta: bool = False):
    """PaLM(**[palm]), RewardModel(palm, **[reward_model]) (it deep-copies the PaLM) and the trainer
    with [trainer]'s arguments, on ``device``; with ``meta`` every large tensor of the three lives on
    torch's meta device (``large_tensors_on_meta``: no memory, no data, for counting) and
    Accelerate places nothing.
    Raises SkillError(2) when the installed library refuses the configuration, and SkillError(1)
    when building at the real size runs out of memory (the run does not fit this process)."""
    from palm_rlhf_pytorch import PaLM, RewardModel

    cls = resolved["trainer_class"]
    try:
        with large_tensors_on_meta() if meta else contextlib.nullcontext():
            palm = PaLM(**resolved["palm"])
            palm = meta_module(palm) if meta else palm.to(device)
            reward_model = RewardModel(palm, **resolved["reward_model"])
            reward_model = reward_model if meta else reward_model.to(device)
            # the smoke's constructor call: output captured, the prompt ids (a buffer Accelerate
            # does not prepare) moved to the device afterwards (meta ids stay on meta)
            trainer = trainers.construct_trainer(TRAINERS[resolved["name"]], palm, reward_model,
                                              {"prompt_token_ids": ids},
                                              {**device_kwargs, "device_placement": False} if meta else device_kwargs,
                                              "meta" if meta else device, **resolved["trainer"])
    except Exception as exc:  # noqa: BLE001 - sorted below: the process's memory, or the library's refusal
        if exits.out_of_memory(exc):
            raise exits.SkillError(f"building at the real size ran out of memory: {exits.one_line(exc)}: the run "
                                "does not fit the memory this process may use", exits.EXIT_CHECK_FAILED) from None
        if not isinstance(exc, (AssertionError, TypeError, ValueError, RuntimeError)):
            raise
        raise exits.SkillError(f"config: the installed {cls.__module__}.{cls.__name__} refused it: "
                            f"{exits.one_line(exc)}") from None
    return trainer


def optimizers(trainer) -> list:
    """The trainer's optimizers (Accelerate's wrappers unwrapped), found among its attributes."""
    import torch
    found = [getattr(v, "optimizer", v) for v in vars(trainer).values()]
    return [opt for opt in found if isinstance(opt, torch.optim.Optimizer)]


def optimizer_state_tensors(optimizer_class) -> int:
    """How many parameter-sized state tensors ``optimizer_class`` keeps per parameter after a step,
    read from the installed optimizer (AdoptAtan2 and AdamAtan2 of adam_atan2_pytorch: 2)."""
    import torch
    param = torch.nn.Parameter(torch.zeros(3))
    opt = optimizer_class([param])
    param.grad = torch.ones(3)
    opt.step()
    return sum(torch.is_tensor(v) and v.shape == param.shape for v in opt.state[param].values())


def parameter_report(trainer) -> dict[str, Any]:
    """Parameter counts and bytes of a (meta-built) trainer, per component.

    Components are the trainer's top-level modules (``palm`` is the policy with its LoRA scopes;
    ``reward_model`` holds its own deep copy of the PaLM; PPO's ``actor_critic.critic`` is a deep copy
    of the PaLM and ``actor_critic.value_head`` the value head; FlowRL's ``partition_function``).
    Shared tensors are counted once (the tied embedding and the policy PaLM reached twice).
    Trainable: the parameters the trainer's optimizers step. Bytes: numel * element size.
    """
    components: dict[str, dict[str, int]] = {}
    trainable = {id(p) for opt in optimizers(trainer) for group in opt.param_groups for p in group["params"]}
    for is_param, named in ((True, trainer.named_parameters()), (False, trainer.named_buffers())):
        for name, tensor in named:
            if name == "prompt_token_ids":
                continue
            parts = name.split(".")
            key = ".".join(parts[:2]) if parts[0] == "actor_critic" else parts[0]
            entry = components.setdefault(key, {"numel": 0, "bytes": 0, "trainable_numel": 0, "trainable_bytes": 0})
            size = tensor.numel() * tensor.element_size()
            entry["bytes"] += size
            if is_param:
                entry["numel"] += tensor.numel()
            if id(tensor) in trainable:
                entry["trainable_numel"] += tensor.numel()
                entry["trainable_bytes"] += size
    opts = optimizers(trainer)
    state_tensors = {type(o).__name__: optimizer_state_tensors(type(o)) for o in opts}
    trainable_bytes = sum(c["trainable_bytes"] for c in components.values())
    per_param = max(state_tensors.values(), default=0)
    return {"components": components,
            "total_numel": sum(c["numel"] for c in components.values()),
            "trainable_numel": sum(c["trainable_numel"] for c in components.values()),
            "weights_bytes": sum(c["bytes"] for c in components.values()),
            "trainable_bytes": trainable_bytes,
            "optimizers": [type(o).__name__ for o in opts],
            "optimizer_state_tensors_per_parameter": state_tensors,
            "optimizer_state_bytes": per_param * trainable_bytes,
            "gradient_bytes": trainable_bytes}


# --- measuring (torch) -------------------------------------------------------------------------

def peak_rss_bytes() -> int:
    """This process's peak resident set size, bytes: VmHWM of /proc/self/status (Linux; reset by
    ``MemoryMeter.start``), else ru_maxrss (KiB on Linux, bytes on macOS: getrusage(2))."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class MemoryMeter:
    """Process memory: resident set size now and its peak since ``start()``.

    Linux: the peak is VmHWM of /proc/self/status, reset by writing 5 to /proc/self/clear_refs;
    elsewhere ru_maxrss, which never resets (stage peaks are then upper bounds: ``resettable``
    False). On CUDA also the caching allocator's current and peak bytes on the device. Bytes.
    """

    def __init__(self, device) -> None:
        import psutil
        self.process, self.device = psutil.Process(), device
        self.cuda = device.type == "cuda"
        self.resettable = self._reset_hwm()

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def rss(self) -> int:
        return self.process.memory_info().rss

    def start(self) -> int:
        """Reset the peaks; return the RSS now."""
        self._reset_hwm()
        if self.cuda:
            import torch
            torch.cuda.reset_peak_memory_stats(self.device)
        return self.rss()

    def peak(self) -> int:
        return peak_rss_bytes()

    def device_now(self) -> int:
        import torch
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def device_peak(self) -> int:
        import torch
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else 0


def available_memory(device, meter: MemoryMeter) -> dict[str, int]:
    """Bytes the run may use: on CPU the RAM available now (``placement.available_memory_mib``) plus this
    process's RSS (a fresh run starts from the same imports); on CUDA the device's free memory
    (torch.cuda.mem_get_info) plus what this process holds there, and the host RAM as on CPU
    (experiences live on the host)."""
    host = placement.available_memory_mib() * 2**20 + meter.rss()
    if device.type != "cuda":
        return {"host": host}
    import torch
    free, _total = torch.cuda.mem_get_info(device)
    return {"host": host, "device": free + torch.cuda.memory_reserved(device)}


def stored_sizes(stored) -> dict[str, Any]:
    """What one rollout left for learn(): a list of namedtuple experiences (PPO, GRPO, FlowRL) or
    the TPO memmap ReplayBuffer. Returns ``{items, fields: {field: bytes per rollout}, buffer}``;
    for a buffer, ``items`` counts stored timesteps and ``fields`` the bytes of one timestep."""
    data = getattr(stored, "data", None)
    if isinstance(data, dict):  # memmap_replay_buffer.ReplayBuffer: (episodes, timesteps, *shape)
        fields = {name: int(arr.dtype.itemsize * math.prod(arr.shape[2:])) for name, arr in data.items()}
        return {"items": int(stored.timestep_index), "fields": fields, "buffer": True}
    items = list(stored)
    fields = {f: sum(int(getattr(item, f).nbytes) for item in items) for f in items[0]._fields}
    return {"items": len(items), "fields": fields, "buffer": False}


def now(device) -> float:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class Probe:
    """The bounded probe of one real-size trainer: each method is one stage of the checklist, and
    every stage stops at the next forward of the policy once ``deadline`` (perf_counter seconds)
    has passed (ProbeTimeout)."""
    trainer: Any
    resolved: dict[str, Any]
    device: Any
    meter: MemoryMeter
    deadline: float

    def __post_init__(self) -> None:
        unwrap = self.trainer.accelerate.unwrap_model
        actor = unwrap(getattr(self.trainer, "actor_critic", None) or self.trainer.actor)
        self.palm, self.scope = actor.actor_palm, actor.actor_lora_scope  # the policy PaLM, its LoRA scope
        self.reward = unwrap(self.trainer.reward_model)
        self.pad = self.trainer.pad_value
        self.train_kwargs = {k: v for k, v in self.resolved["train"].items()
                             if k not in ("num_episodes", "max_timesteps", "update_timesteps", "max_seq_len")}
        self.max_seq_len = self.resolved["effective"]["train"]["max_seq_len"]
        lengths, counts = (self.trainer.prompt_token_ids != self.pad).sum(-1).unique(return_counts=True)
        self.prompt_lens = Counter(dict(zip(lengths.tolist(), counts.tolist())))  # {prompt length: prompts}
        # on the embedding: PaLM.generate calls PaLM.forward directly, which skips the PaLM's own
        # hooks, while every forward calls token_emb through its __call__
        self._hook = self.palm.token_emb.register_forward_pre_hook(self._check_deadline)

    def _check_deadline(self, *_):
        if time.perf_counter() > self.deadline:
            raise ProbeTimeout()

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def close(self) -> None:
        self._hook.remove()

    def train_once(self, rollouts: int, max_seq_len: int, on_learn: Callable[[Any], None], prompt=None):
        """The library's own ``train()`` for ``rollouts`` rollouts and one learn(), whose argument goes
        to ``on_learn`` instead of the real learn(); ``prompt`` (1, n) replaces the prompt set."""
        trainer, saved = self.trainer, (self.trainer.prompt_token_ids, self.trainer.num_prompts)
        if prompt is not None:
            trainer.prompt_token_ids, trainer.num_prompts = prompt, 1
        trainer.learn = on_learn  # an instance attribute shadows the method train() calls
        try:
            with streams.capture_library_output():
                trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts,
                              max_seq_len=max_seq_len, **self.train_kwargs)
        finally:
            del trainer.learn
            trainer.prompt_token_ids, trainer.num_prompts = saved

    # stages 3a and 3b share: rollouts measured from a memory mark, then the real learn() timed ------
    def rollouts_start(self, out: dict[str, Any]) -> None:
        """Reset the memory peaks before the rollouts; ``out`` keeps the RSS and device bytes now."""
        out["rss_before"], out["device_before"] = self.meter.start(), self.meter.device_now()

    def rollouts_done(self, out: dict[str, Any], stored) -> None:
        """In the learn() hook: ``out`` gets the rollouts' peak bytes above ``rollouts_start``'s mark
        and what they stored (``stored_sizes``)."""
        out["rollout_peak_bytes"] = self.meter.peak() - out["rss_before"]
        out["rollout_device_peak_bytes"] = self.meter.device_peak() - out["device_before"]
        out["stored"] = stored_sizes(stored)

    def timed_learn(self, stored, sizes: dict[str, Any], count: int) -> dict[str, Any] | None:
        """The installed ``learn()`` on the first ``count`` experiences of ``stored`` (a TPO buffer:
        on all of it; ``sizes`` is its ``stored_sizes``): ``{items, seconds, peak_bytes,
        device_peak_bytes}``, bytes above the memory before it; None when the deadline stopped it."""
        items = stored if sizes["buffer"] else deque(list(stored)[:count])
        rss0, dev0 = self.meter.start(), self.meter.device_now()
        t0 = now(self.device)
        try:
            with streams.capture_library_output():
                type(self.trainer).learn(self.trainer, items)  # the method, not train_once's stand-in
        except ProbeTimeout:
            return None
        return {"items": sizes["items"] if sizes["buffer"] else len(items), "seconds": now(self.device) - t0,
                "peak_bytes": self.meter.peak() - rss0, "device_peak_bytes": self.meter.device_peak() - dev0}

    # stage 1: what one rollout stores, at tiny lengths ---------------------------------------
    def stored_fields(self) -> dict[str, Any]:
        """Three rollouts of one prompt of the real padded width: 1 token with max_seq_len 2 and 3,
        then 2 tokens with max_seq_len 3. Every field the installed trainer stores has bytes affine in
        max_seq_len and in the prompt length, so these three fix them at any size. Also returns the
        sequences scored per rollout (the reward model's batch) and the first call's one-time cost
        (first minus second rollout, seconds)."""
        import torch
        ids = self.trainer.prompt_token_ids
        width, token = ids.shape[-1], next(t for t in (1, 2, 3) if t != self.pad)
        batches: list[int] = []
        hook = self.reward.register_forward_hook(lambda _m, inputs, _o: batches.append(int(inputs[0].shape[0])))
        runs = []
        try:
            for prompt_len, length in [(1, 2), (1, 3)] + ([(2, 3)] if width >= 2 else []):
                prompt = torch.full((1, width), int(self.pad), dtype=ids.dtype, device=ids.device)
                prompt[0, :prompt_len] = token
                got: dict[str, Any] = {}
                t0 = now(self.device)
                self.train_once(1, length, lambda stored: got.update(stored_sizes(stored)), prompt)
                runs.append({"prompt_len": prompt_len, "max_seq_len": length, "seconds": now(self.device) - t0, **got})
        finally:
            hook.remove()
        return {"runs": runs, "sequences_per_rollout": batches[0], "items": runs[1]["items"],
                "buffer": runs[1]["buffer"], "first_call_s": max(0.0, runs[0]["seconds"] - runs[1]["seconds"])}

    # stage 2: one sampling step at three lengths -------------------------------------------------
    def sampling_steps(self, batch: int) -> list[tuple[int, float]]:
        """Seconds of one ``PaLM.generate`` step (the rollout's inner loop) of ``batch`` sequences at
        lengths mean prompt, midway and max_seq_len - 1. A step cannot be stopped once started, so a
        length is skipped when its cost, scaled from the last one by (n / n_prev)**1.5 (between the
        linear layers' n and attention's n**2), would overrun the budget."""
        import torch
        first = round(sum(n * k for n, k in self.prompt_lens.items()) / self.prompt_lens.total())
        last = max(first, self.max_seq_len - 1)
        lengths = sorted({first, (first + last) // 2, last})
        kwargs = {k: self.train_kwargs[k] for k in ("temperature", "eos_token") if k in self.train_kwargs}
        points: list[tuple[int, float]] = []
        for n in lengths:
            if points and points[-1][1] * (n / points[-1][0]) ** 1.5 > self.remaining():
                break
            prompt = torch.randint(1, self.palm.num_tokens, (batch, n), device=self.device)
            samples = []
            try:
                while len(samples) < 3 and (not samples or sum(samples) < 0.3):
                    t0 = now(self.device)
                    self.palm.generate(n + 1, prompt=prompt, finetune_scope=self.scope, **kwargs)
                    samples.append(now(self.device) - t0)
            except ProbeTimeout:
                pass
            if not samples:
                break
            points.append((n, sorted(samples)[len(samples) // 2]))
        return points

    # stage 3a: real rollouts and one learn() on a reduced number of experiences -------------------
    def real_rollouts(self, rollouts: int, learn_items: int, learn: bool = True) -> dict[str, Any]:
        """``rollouts`` real rollouts at the configured max_seq_len, then (when ``learn``) the real
        learn() on the first ``learn_items`` experiences (TPO: on the buffer of ``rollouts`` groups),
        twice when the budget allows (the first includes one-time costs). Seconds and bytes; rollout
        intervals are the times between the reward model's calls (one per rollout)."""
        stamps: list[float] = []
        hook = self.reward.register_forward_hook(lambda *_: stamps.append(now(self.device)))
        out: dict[str, Any] = {"rollouts": rollouts, "learn": []}

        def on_learn(stored):
            self.rollouts_done(out, stored)
            for _ in range(2 if learn else 0):
                if out["learn"] and out["learn"][0]["seconds"] * 1.5 > self.remaining():
                    break
                timed = self.timed_learn(stored, out["stored"], learn_items)
                if timed is None:
                    break
                out["learn"].append(timed)

        self.rollouts_start(out)
        t0 = now(self.device)
        try:
            self.train_once(rollouts, self.max_seq_len, on_learn)
        except ProbeTimeout:
            out["stopped"] = "budget"
        finally:
            hook.remove()
        intervals = [b - a for a, b in zip([t0, *stamps], stamps)]
        out["rollout_seconds"] = intervals
        return out

    # stage 3b: the last step of one rollout and learn() on its experience -------------------------
    def last_step(self, learn_ok: bool) -> dict[str, Any]:
        """One rollout whose prompt has max_seq_len - 1 tokens: one sampling step and the scoring of
        full-length sequences (memory and seconds at the real size), then the real learn() on one of
        its experiences (TPO: its group) when ``learn_ok``."""
        import torch
        length = self.max_seq_len
        prompt = torch.randint(1, self.palm.num_tokens, (1, max(1, length - 1)), device=self.device)
        out: dict[str, Any] = {"learn": []}

        def on_learn(stored):
            out["seconds"] = now(self.device) - t0
            self.rollouts_done(out, stored)
            # learn() on one experience costs about 3x this step (forward and backward of the actor,
            # for PPO the critic too, over full-length sequences); the deadline hook cannot stop it
            # between the critic's forward and the optimizer steps, so it runs only when it fits
            if not learn_ok or self.remaining() < 3 * out["seconds"]:
                out["learn_skipped"] = "memory" if not learn_ok else "budget"
                return
            timed = self.timed_learn(stored, out["stored"], 1)
            if timed is not None:
                out["learn"].append(timed)

        self.rollouts_start(out)
        t0 = now(self.device)
        try:
            self.train_once(1, length, on_learn, prompt)
        except ProbeTimeout:
            out["stopped"] = "budget"
        return out


# --- predicting (no torch) ---------------------------------------------------------------------

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
             "rollout_transient": figure(rollout, "measured"),
             "learn_activations": figure(activations if learned else 0,
                                         "derived" if learned and activations is not None else "computed")}
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


def predict_time(counts: dict[str, int], measured: dict[str, Any], epochs: int) -> dict[str, Any]:
    """Wall time of the full run, seconds: process start and imports, construction, every rollout
    (the first one's one-time cost once) and every learn() (per experience and epoch, the first
    call's one-time cost once). ``measured`` holds those unit figures (None when not measured, then
    the total is a lower bound)."""
    rollout_s, learn_item_s = measured.get("rollout_s"), measured.get("learn_item_s")
    rollouts = learns = 0.0
    if counts["rollouts"]:
        rollouts = None if rollout_s is None else \
            counts["rollouts"] * rollout_s + measured.get("first_rollout_extra_s", 0.0)
    if counts["learn_calls"]:
        learns = None if learn_item_s is None else \
            counts["learn_calls"] * counts["items_per_learn"] * epochs * learn_item_s \
            + measured.get("first_learn_extra_s", 0.0)
    parts = {"startup": measured["startup_s"], "construct": measured.get("construct_s"),
             "rollouts": rollouts, "learn": learns}
    total = sum(v for v in parts.values() if v is not None)
    lower = any(v is None for v in parts.values()) or bool(measured.get("lower_bound"))
    return {"total_s": total, "lower_bound": lower, "parts_s": parts}


def group_warning(name: str, effective: dict[str, Any], group_size: int) -> dict[str, Any] | None:
    """A group of one sequence per prompt: what each trainer then does (reproduced on 0.8.0)."""
    if name == "ppo" or group_size != 1:
        return None
    kwarg = TRAINERS[name].group_kwarg
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
            "doc": f"{DOCS}#group-size-per-rollout"}


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
                    "doc": f"{DOCS}#flowrl-partition-dim"})
    if name == "ppo" and eff.get("max_norm") is not None:
        out.append({"code": "ppo_max_norm", "blocks_learning": True,
                    "message": "max_norm is set: PPO's learn() calls self.accelerator.clip_grad_norm_ and "
                               "raises AttributeError at its first minibatch",
                    "fix": "max_norm = None for PPO", "doc": f"{DOCS}#ppo-max-norm"})
    return out


def build_warnings(name: str, resolved: dict[str, Any], counts: dict[str, int], group_size: int,
                   optimizer: str | None, memory_fits: bool | None, memory_text: str) -> list[dict[str, Any]]:
    """Every setting that makes the run fail, learn nothing, or that the library ignores, with its
    fix. ``blocks_learning`` marks those after which nothing useful is learned."""
    eff, train = resolved["effective"]["trainer"], resolved["effective"]["train"]
    out: list[dict[str, Any]] = []
    rollouts, update = counts["rollouts"], train["update_timesteps"]
    if counts["learn_calls"] == 0:
        out.append({"code": "never_learns", "blocks_learning": True,
                    "message": f"no learn() at all: {rollouts} rollouts (num_episodes {train['num_episodes']} x "
                               f"max_timesteps {train['max_timesteps']}) never reach update_timesteps {update}; "
                               "train() still prints that training completed",
                    "fix": f"set update_timesteps to a divisor of {rollouts}" if rollouts else
                           "run at least one rollout (num_episodes and max_timesteps above 0)",
                    "doc": f"{DOCS}#update-timesteps-default"})
    elif counts["leftover_rollouts_dropped"]:
        out.append({"code": "leftovers_dropped", "blocks_learning": False,
                    "message": f"the last {counts['leftover_rollouts_dropped']} rollouts "
                               f"({counts['leftover_items_dropped']} experiences) are sampled and then dropped "
                               "when train() returns",
                    "fix": f"make update_timesteps divide num_episodes * max_timesteps = {rollouts}",
                    "doc": f"{DOCS}#update-timesteps-default"})
    if memory_fits is False:
        out.append({"code": "memory_exceeds_device", "blocks_learning": False, "message": memory_text,
                    "fix": "lower update_timesteps (the experiences held before each learn() grow with it), "
                           "max_seq_len, the group size or minibatch_size; or use a device with more memory",
                    "doc": f"{DOCS}#group-size-per-rollout"})
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
    required = REQUIRED_STEPS.get(optimizer or "")
    if counts["learn_calls"] and required and counts["optimizer_steps"] < required:
        out.append({"code": "too_few_optimizer_steps", "blocks_learning": False,
                    "message": f"{counts['optimizer_steps']} optimizer steps in the whole run: {optimizer} needs "
                               f"{required} before every LoRA tensor has moved",
                    "fix": "more rollouts per learn(), more epochs or a smaller minibatch_size",
                    "doc": f"{DOCS}#optimizer-first-steps"})
    for trainers, section, key, unless, why in IGNORED:
        if name in trainers and key in resolved[section] and (unless is None or not eff.get(unless)):
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
            peak_bytes: int, peak_complete: bool, available_bytes: int, max_days: float = math.inf) -> tuple[str, str]:
    """(status, one line): does_not_fit, never_learns, too_slow (the predicted wall time, or its
    lower bound, exceeds ``max_days`` days: --max-days), or fits; the line names the first reason
    and the predicted wall time and peak ("at least" where a part was not measured)."""
    blocking = [w for w in warnings if w["blocks_learning"]]
    time_text = ("at least " if wall["lower_bound"] else "") + reporting.seconds_text(wall["total_s"])
    peak_text = ("" if peak_complete else "at least ") + human_bytes(peak_bytes)
    tail = f"predicted {time_text} wall, {peak_text} peak ({human_bytes(available_bytes)} available)"
    if fits is False:
        status, head = "does_not_fit", "does not fit"
    elif blocking:
        code = blocking[0]["code"]
        status, head = "never_learns", "never learns" + ("" if code == "never_learns" else f" ({code.replace('_', ' ')})")
    elif wall["total_s"] > max_days * 86400:
        status, head = "too_slow", f"too slow (over --max-days {max_days:g})"
    else:
        status, head = "fits", f"fits and learns ({counts['learn_calls']:,} learn() calls)"
    return status, f"{head}: {tail}"


def human_bytes(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 10 * 2**30 else f"{n / MIB:,.0f} MiB"


# --- the plan ------------------------------------------------------------------------------------

def probe_at_real_size(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device,
                       meter: MemoryMeter, available: dict[str, int], progress: streams.Progress) -> dict[str, Any]:
    """Build the run for real (its prompt ids too) and probe it until ``--probe-seconds`` after the start of the build:
    construct (timed), the three tiny rollouts (always), one sampling step at three lengths, then
    real rollouts and learn() when a rollout fits the budget, else the last step of a rollout.

    Returns ``stored`` (what a rollout stores), ``per_rollout`` and ``fields_bytes`` (bytes at the
    configured size), ``base`` (bytes held before the rollouts, per pool), ``measured`` (unit
    seconds), ``transients`` (bytes above the memory before a stage) and ``report`` (the probe's
    own account: regime, stage seconds, notes, and ``raised`` {stage, error} when the library
    raised in a stage: the probe stops there, and what it had not measured stays None).
    learn() is never called when a known trap makes it raise (``learn_raises``).
    Raises SkillError(1) when the build or a stage runs out of memory."""
    from accelerate.utils import set_seed

    train, eff = resolved["effective"]["train"], resolved["effective"]["trainer"]
    max_seq_len, minibatch, epochs = train["max_seq_len"], eff["minibatch_size"], eff["epochs"]
    pool = "device" if device.type == "cuda" else "host"
    report: dict[str, Any] = {"budget_s": args.probe_seconds, "regime": None, "stages_s": {},
                              "peaks_resettable": meter.resettable, "notes": []}
    measured: dict[str, Any] = {}
    transients: dict[str, Any] = {}
    started = time.perf_counter()

    @contextlib.contextmanager
    def stage(key: str, label: str) -> Iterator[None]:
        """Time the probe step as ``stages_s[key]`` and show it as a progress line; the library
        raising inside it ends the probe (ProbeRaised), running out of memory ends the plan."""
        t0 = time.perf_counter()
        try:
            with progress.stage(f"probe: {label}"):
                yield
        except exits.SkillError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's failure is the plan's finding
            if exits.out_of_memory(exc):
                raise exits.SkillError(f"the probe at the real size ran out of memory ({key}): {exits.one_line(exc)}: "
                                    "the run does not fit the memory this process may use",
                                    exits.EXIT_CHECK_FAILED) from None
            report["raised"] = {"stage": key, "error": exits.one_line(exc)}
            report["notes"].append(f"the probe stopped: {key} raised {exits.one_line(exc)}")
            raise ProbeRaised() from None
        finally:
            report["stages_s"][key] = round(time.perf_counter() - t0, 3)

    progress.note(f"probing the run at its real size, at most {args.probe_seconds:g} s (--probe-seconds)")
    set_seed(args.seed)
    with stage("construct", "build the trainer"):
        trainer = build_trainer(resolved, device_kwargs, device, prompt_token_ids(resolved, args.seed))
    measured["construct_s"] = report["stages_s"]["construct"]
    probe = Probe(trainer, resolved, device, meter, math.inf)
    stored = per_rollout = fields_bytes = base = None
    raises = learn_raises(resolved["name"], resolved)
    if raises:
        report["notes"].append(f"learn() not probed: it raises on this configuration (warning {raises[0]['code']})")
    try:
        # always: the smallest probe that shows what is stored. One thread: these tiny forwards gain
        # nothing from more, and a busy CPU makes many threads wait on each other for seconds
        with stage("stored_fields", "three tiny rollouts (what one rollout stores)"), placement.torch_threads(1):
            stored = probe.stored_fields()
        # the run's memory before its rollouts: the trainer, plus what the first rollout loads for
        # good (einx and sympy tracing state); the tiny rollouts' experiences are freed
        base = {"host": meter.rss(), **({"device": meter.device_now()} if pool == "device" else {})}
        probe.deadline = started + args.probe_seconds
        group_size, items = stored["sequences_per_rollout"], stored["items"]
        fields_bytes = stored_at(stored, probe.prompt_lens, max_seq_len)
        per_rollout = sum(fields_bytes.values())
        items_per_learn = train["update_timesteps"] * items
        measured["first_rollout_extra_s"] = stored["first_call_s"]
        with stage("sampling_steps", "one sampling step at three lengths"):
            points = probe.sampling_steps(group_size)
        report["sampling_step_s"] = [[n, round(s, 5)] for n, s in points]
        sampling_s = mean_rollout_sampling(points, probe.prompt_lens, max_seq_len)
        # learn() on a few minibatches: memory grows over the first ones (the allocator's heap)
        learn_target = min(LEARN_MINIBATCHES * minibatch, items_per_learn) or 1
        wanted = max(3, math.ceil(learn_target / items))
        estimate = (sampling_s or 0.0) * 1.25
        affordable = int(probe.remaining() * 0.5 // estimate) if estimate > 0 else wanted
        if sampling_s is not None and affordable >= 1:
            report["regime"] = "measured"
            r = min(wanted, affordable)
            with stage(f"{r} real rollouts and learn()", f"{r} real rollouts" + ("" if raises else " and one learn()")):
                out = probe.real_rollouts(r, min(learn_target, r * items), learn=not raises)
            take_real(out, per_rollout, epochs, measured, transients, report)
        elif sampling_s is not None:
            report["regime"] = "extrapolated"
            seqs_per_item = group_size if stored["buffer"] else 1
            guess = 12 * seqs_per_item * max_seq_len * resolved["palm"]["num_tokens"] * 4
            learn_ok = guess < 0.5 * (available[pool] - meter.rss())
            if not learn_ok and not raises:
                report["notes"].append(f"learn() not probed: about {guess / MIB:,.0f} MiB of activations "
                                       "for one experience would not fit half the free memory")
            # the last step: one sampling step and about three full-length forwards (scoring)
            n_last, t_last = points[-1]
            step = t_last * (max_seq_len / n_last) ** 2  # a full-length forward, at most
            with stage("last rollout step and learn()", "the last step of one rollout, and learn()"):
                out = probe.last_step(learn_ok and not raises) if 4 * step < probe.remaining() else {}
            if out.get("learn_skipped") == "budget" or not out and not raises:
                report["notes"].append("learn() not probed: it would overrun --probe-seconds"
                                       + ("" if out else ", as would the last rollout step"))
            take_last_step(out, points, probe.prompt_lens, max_seq_len, epochs, measured, transients, report)
        else:
            report["notes"].append("no sampling step timed within --probe-seconds: time not predicted")
    except ProbeRaised:
        pass
    finally:
        probe.close()
    report["elapsed_s"] = round(time.perf_counter() - started, 3)
    return {"stored": stored, "per_rollout": per_rollout, "fields_bytes": fields_bytes, "base": base,
            "measured": measured, "transients": transients, "report": report}


def plan(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device, startup_s: float,
         progress: streams.Progress) -> dict[str, Any]:
    """Meta build (counts, no memory), bounded probe at the real size when the weights and the
    prompt ids fit, prediction, warnings and verdict."""
    name, spec = resolved["name"], TRAINERS[resolved["name"]]
    eff, train = resolved["effective"]["trainer"], resolved["effective"]["train"]
    meta_ids = prompt_token_ids(resolved, args.seed, meta=True)
    params = parameter_report(build_trainer(resolved, device_kwargs, device, meta_ids, meta=True))
    prompt_bytes = meta_ids.numel() * meta_ids.element_size()  # the trainer holds every prompt id
    meter = MemoryMeter(device)
    available = available_memory(device, meter)
    pool = "device" if device.type == "cuda" else "host"
    minibatch, epochs = eff["minibatch_size"], eff["epochs"]
    weights_need = params["weights_bytes"] + prompt_bytes + (meter.device_now() if pool == "device" else meter.rss())
    if weights_need <= available[pool]:
        probed = probe_at_real_size(args, resolved, device_kwargs, device, meter, available, progress)
    else:
        probed = {"stored": None, "per_rollout": None, "measured": {}, "transients": {}, "report": {
            "budget_s": args.probe_seconds, "regime": "skipped", "elapsed_s": 0.0, "stages_s": {},
            "notes": ["not built at the real size: the weights and prompt ids alone exceed the memory available"]}}
    stored, per_rollout = probed["stored"], probed["per_rollout"]
    base = probed.get("base") or {"host": meter.rss()}
    if stored is not None:
        group_size, items = stored["sequences_per_rollout"], stored["items"]
    else:  # not built, or its first rollout raised: the smoke's trainer table says which trainers
        group_size = eff[spec.group_kwarg] + 1 if spec.group_kwarg else 1  # store a group as separate items
        items = spec.items_per_rollout(group_size)
    probed["measured"]["startup_s"] = startup_s
    counts = run_counts(train["num_episodes"] * train["max_timesteps"], train["update_timesteps"], items,
                        minibatch, epochs)
    probe_report = probed["report"]
    memory = None if per_rollout is None else predict_memory(
        counts, per_rollout, stored["buffer"], base, params, probed["transients"], minibatch)
    peak = memory["pools"][pool] if memory else weights_need
    fits = peak <= available[pool] and (memory is None or memory["pools"]["host"] <= available["host"])
    wall = predict_time(counts, probed["measured"], epochs)
    held = memory["parts"]["held_before_learn"]["value"] if memory else None
    memory_text = (f"predicted peak {peak / 2**30:,.1f} GiB exceeds the {available[pool] / 2**30:,.1f} GiB "
                   f"available on {device}" + (f"; the experiences held before each learn() alone take "
                                               f"{held / 2**30:,.1f} GiB" if held else
                                               "; the weights and prompt ids alone do not fit"))
    optimizer = params["optimizers"][0] if params["optimizers"] else None
    warnings = build_warnings(name, resolved, counts, group_size, optimizer, fits, memory_text)
    raised = probed["report"].get("raised")
    if raised and not any(w["blocks_learning"] for w in warnings):  # a failure no known trap explains
        warnings.append({"code": "probe_raised", "blocks_learning": True,
                         "message": f"the installed library raised in the probe's {raised['stage']}: {raised['error']}; "
                                    "the full run raises there too",
                         "fix": "change the setting the error names (tiny-rlhf-smoke on this trainer shows a "
                                "working configuration)", "doc": f"{DOCS}#symptom-index"})
    status, line = verdict(fits, counts, warnings, wall, peak, bool(memory and memory["complete"]), available[pool],
                           args.max_days)
    reasons = ([memory_text] if not fits else []) + [w["message"] for w in warnings if w["blocks_learning"]]
    if status == "too_slow":
        reasons.append(f"predicted {reporting.seconds_text(wall['total_s'])} wall, over --max-days {args.max_days:g}: "
                       f"{counts['rollouts']:,} rollouts and {counts['learn_calls']:,} learn() calls")
    if status == "fits":
        reasons.append(f"{counts['learn_calls']} learn() calls of {counts['items_per_learn']} experiences, "
                       f"{counts['optimizer_steps']} optimizer steps; peak {peak / MIB:,.0f} of "
                       f"{available[pool] / MIB:,.0f} MiB available")
    return {
        "status": status, "verdict": line, "reasons": reasons,
        "predicted": {"wall_s": round(wall["total_s"], 2), "wall": reporting.seconds_text(wall["total_s"]),
                      "wall_lower_bound": wall["lower_bound"], "peak_mib": round(peak / MIB, 1),
                      "available_mib": round(available[pool] / MIB, 1), "memory_pool": pool, "fits": fits,
                      "basis": probe_report["regime"]},
        "trainer": name, "class_name": f"{spec.module}.{spec.class_name}", "device": str(device),
        "counts": {**counts, "group_size": group_size, "basis": "computed"},
        "parameters": params,
        "stored_per_rollout": None if stored is None else {
            "bytes": per_rollout, "fields_bytes": probed["fields_bytes"], "replay_buffer": stored["buffer"],
            "replay_buffer_file_bytes": per_rollout * train.get("max_episodes", 1) * train["update_timesteps"]
            if stored["buffer"] else None,
            "basis": "computed from the fields the installed trainer stored in three tiny rollouts"},
        "memory": None if memory is None else {
            "base_bytes": figure(base, "measured"), "pools_bytes": memory["pools"], "complete": memory["complete"],
            **{k: v for k, v in memory["parts"].items()}},
        "time": {**{k: None if v is None else round(v, 3) for k, v in wall["parts_s"].items()},
                 "unit_s": {k: round(v, 5) for k, v in probed["measured"].items() if not isinstance(v, bool)}},
        "warnings": warnings, "probe": probe_report,
    }


def stored_field(stored: dict[str, Any], name: str, prompt_len: int, max_seq_len: int) -> int:
    """Bytes of one stored field per rollout for a prompt of ``prompt_len`` tokens, from the three
    tiny rollouts (prompt, max_seq_len) = (1, 2), (1, 3), (2, 3). An experience is
    max(max_seq_len, prompt + 1) long (palm.py generate samples at least one token); a TPO buffer row
    is the padded prompt width + max_seq_len whatever the prompt."""
    a, b, *c = stored["runs"]
    per_position = b["fields"][name] - a["fields"][name]
    per_prompt_token = c[0]["fields"][name] - b["fields"][name] if c else 0
    length = max_seq_len if stored["buffer"] else max(max_seq_len, prompt_len + 1)
    return a["fields"][name] + (length - 2) * per_position + (prompt_len - 1) * per_prompt_token


def stored_at(stored: dict[str, Any], prompt_lens: Counter, max_seq_len: int) -> dict[str, int]:
    """Mean bytes per rollout of each stored field over the prompts (train() draws them uniformly);
    ``prompt_lens`` counts the prompts of each length."""
    return {f: sum(n * stored_field(stored, f, p, max_seq_len) for p, n in prompt_lens.items()) // prompt_lens.total()
            for f in stored["runs"][1]["fields"]}


def mean_rollout_sampling(points: list[tuple[int, float]], prompt_lens: Counter, max_seq_len: int,
                          upto: int | None = None) -> float | None:
    """Mean seconds of one rollout's sampling loop over the prompts (each equally likely: train()
    draws with randrange), from lengths p to max_seq_len - 1 (``upto`` instead of that when given)."""
    if not points:
        return None
    last = max_seq_len - 1 if upto is None else upto
    total = sum(n * steps_time(points, p, max(p, last)) for p, n in prompt_lens.items())
    return total / prompt_lens.total()


def take_real(out: dict[str, Any], per_rollout: int, epochs: int, measured: dict[str, Any],
              transients: dict[str, Any], probe_report: dict[str, Any]) -> None:
    """Unit figures from real rollouts and learn(): steady rollout seconds (median after the first),
    the first one's extra, per-experience learn seconds (second call), the first call's extra,
    transients. Anything the budget cut is left out (the prediction then says lower bound)."""
    import statistics
    intervals, learns = out.get("rollout_seconds", []), out.get("learn", [])
    probe_report["rollouts"] = {"count": len(intervals), "seconds": [round(s, 4) for s in intervals],
                                "learn": learns, "stopped": out.get("stopped")}
    if intervals:
        steady = statistics.median(intervals[1:]) if len(intervals) > 1 else intervals[0]
        measured["rollout_s"] = steady
        measured["first_rollout_extra_s"] += max(0.0, intervals[0] - steady)
    if "rollout_peak_bytes" in out:
        transients["rollout_bytes"] = max(0, out["rollout_peak_bytes"] - (len(intervals) - 1) * per_rollout)
        transients["rollout_device_bytes"] = out["rollout_device_peak_bytes"]
    if len(learns) == 1:
        probe_report["notes"].append("learn() timed once: its one-time cost is spread over every experience "
                                     "(the learn() time is an upper bound)")
    if learns:
        last = learns[-1]
        measured["learn_item_s"] = last["seconds"] / (last["items"] * max(1, epochs))
        measured["first_learn_extra_s"] = max(0.0, learns[0]["seconds"] - last["seconds"]) if len(learns) > 1 else 0.0
        transients.update(learn_bytes=learns[0]["peak_bytes"], learn_items=learns[0]["items"],
                          learn_device_bytes=learns[0]["device_peak_bytes"])


def take_last_step(out: dict[str, Any], points, prompt_lens, max_seq_len, epochs, measured, transients,
                   probe_report) -> None:
    """Unit figures when no rollout fits the budget: sampling steps up to max_seq_len - 2 from the
    timed steps, plus the measured last step (one sampling step and the full-length scoring);
    learn() per experience from one experience (its first call: an upper bound)."""
    probe_report["last_step"] = {k: out.get(k) for k in ("seconds", "learn", "stopped")}
    if "seconds" in out:
        measured["rollout_s"] = mean_rollout_sampling(points, prompt_lens, max_seq_len, upto=max_seq_len - 2) \
            + out["seconds"]
        transients["rollout_bytes"] = out["rollout_peak_bytes"]
        transients["rollout_device_bytes"] = out["rollout_device_peak_bytes"]
    else:  # the sampling loop alone: without the scoring of the full sequences
        measured["rollout_s"] = mean_rollout_sampling(points, prompt_lens, max_seq_len)
        measured["lower_bound"] = True
    if points[-1][0] < max_seq_len - 1:  # the longest steps not timed: continued linearly
        measured["lower_bound"] = True
    if out.get("learn"):
        learn = out["learn"][0]
        measured["learn_item_s"] = learn["seconds"] / max(1, epochs)
        transients.update(learn_bytes=learn["peak_bytes"], learn_items=1,
                              learn_device_bytes=learn["device_peak_bytes"])


# --- running it for real (what the accuracy bench compares with) -----------------------------------

def execute(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device, startup_s: float,
            progress: streams.Progress) -> dict[str, Any]:
    """Build exactly as the probe does and run ``train(**[train])`` in full (library defaults where
    [train] is silent). Reports the learn() calls seen, seconds, and the process's peak RSS (MiB)."""
    from accelerate.utils import set_seed

    set_seed(args.seed)
    ids = prompt_token_ids(resolved, args.seed)
    t0 = time.perf_counter()
    trainer = build_trainer(resolved, device_kwargs, device, ids)
    construct_s = time.perf_counter() - t0
    calls: list[int] = []
    real_learn = trainer.learn
    trainer.learn = lambda stored: (calls.append(stored_sizes(stored)["items"]), real_learn(stored))[1]
    t0 = time.perf_counter()
    error = None
    try:
        with progress.stage("train() in full"), streams.capture_library_output():
            trainer.train(**resolved["train"])
    except Exception as exc:  # the library's failure is this run's finding, not a crash
        error = exits.one_line(exc)
    train_s = time.perf_counter() - t0
    report = {"status": "ok" if error is None else "failed", "error": error, "trainer": resolved["name"],
              "device": str(device), "learn_calls": len(calls), "items_per_learn": calls,
              "seconds": {"startup": round(startup_s, 3), "construct": round(construct_s, 3),
                          "train": round(train_s, 3), "total": round(process_seconds(), 3)},
              "peak_rss_mib": round(peak_rss_bytes() / MIB, 1)}
    if device.type == "cuda":
        import torch
        report["device_peak_mib"] = round(torch.cuda.max_memory_allocated(device) / MIB, 1)
    return report


def process_seconds() -> float:
    """Seconds since this process started (psutil: the kernel's start time, 10 ms resolution)."""
    import psutil
    return time.time() - psutil.Process().create_time()


# --- accuracy: prediction against the real run (bench --plan-accuracy) -----------------------------

ACCURACY_CONFIGS = ("accuracy-ppo.toml", "accuracy-grpo.toml", "accuracy-tpo.toml", "accuracy-flowrl.toml")
TARGETS = {"wall_error": 0.35, "peak_error": 0.25}  # |predicted / measured - 1| for every row
ACCURACY_TITLE = "### Accuracy of the plan (measured)"
ACCURACY_HEADER = ("config", "trainer", "rollouts", "learn() calls", "predicted wall (s)", "measured wall (s)",
                   "wall error", "predicted peak (MiB)", "measured peak (MiB)", "peak error",
                   "each pair (wall/peak)", "load")


def accuracy_pair(bench, name: str, device: str) -> dict[str, Any]:
    """One plan (a fresh process, ``--json``) then the real run (a fresh process, ``--execute``) of a
    shipped config, both with one torch thread; the run timed by the bench's ``run_child``
    (os.wait4: wall seconds, peak RSS). Relative errors are predicted / measured - 1.
    Raises SkillError when either child fails to report (usage or dependency error)."""
    common = [sys.executable, str(Path(__file__).resolve()), "--config", str(PLANS / name), "--json",
              "--device", device, "--cpu-threads", "1"]
    load = [bench.load_average()]
    planned, real = bench.run_child(common), bench.run_child([*common, "--execute"])
    load.append(bench.load_average())
    for run in (planned, real):
        if run["exit_code"] in (exits.EXIT_USAGE, exits.EXIT_DEPENDENCY) or run["report"] is None:
            raise exits.SkillError(f"{name}: {run['stderr_tail'][0]}", run["exit_code"] or exits.EXIT_USAGE)
    plan_report, run_report = planned["report"], real["report"]
    predicted = plan_report["predicted"]
    return {"trainer": plan_report["trainer"], "rollouts": plan_report["counts"]["rollouts"],
            "learn_calls": plan_report["counts"]["learn_calls"], "observed_learn_calls": run_report["learn_calls"],
            "predicted_wall_s": predicted["wall_s"], "measured_wall_s": real["wall_s"],
            "wall_error": round(predicted["wall_s"] / real["wall_s"] - 1, 4),
            "predicted_peak_mib": predicted["peak_mib"], "measured_peak_mib": real["peak_rss_mib"],
            "peak_error": round(predicted["peak_mib"] / real["peak_rss_mib"] - 1, 4),
            "predicted_parts_s": {k: v for k, v in plan_report["time"].items() if k != "unit_s"},
            "measured_parts_s": run_report["seconds"], "plan_wall_s": planned["wall_s"],
            "run_status": run_report["status"], "load_average": load}


def accuracy(bench, args, env: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``args.repeat`` plan-and-run pairs of every shipped accuracy config (``args.plan_config``
    selects some), interleaved; per config the median of each figure and error over its pairs,
    each pair a progress line (``args.progress_bars``). A row passes when every run completed
    with the predicted number of learn() calls and both median errors are within TARGETS. The
    1-minute load average is read around each pair: the machine is shared, and a pair whose load
    changed measures the machine as much as the plan. A row whose only miss is the wall error is
    inconclusive, not failed, when the bench's ``busy_reason`` (the rule its wall-time budgets use)
    says the run cannot judge it: its load reached the CPU count or some of its pairs were within
    the target (``verdict``, ``inconclusive_reason``); the report's status is then inconclusive."""
    import statistics
    machine = bench.machine()
    names = args.plan_config or list(ACCURACY_CONFIGS)
    pairs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    progress = getattr(args, "progress_bars", None) or streams.Progress("bench-smoke", False)
    total = args.repeat * len(names)
    for r in range(args.repeat):
        for i, name in enumerate(names, 1):
            with progress.stage(f"[{r * len(names) + i}/{total}] {name}: plan it, then run it") as bar:
                pair = accuracy_pair(bench, name, args.device)
                bar.set_postfix_str(f"wall error {pair['wall_error']:+.0%}, peak error {pair['peak_error']:+.0%}")
            pairs[name].append(pair)
    rows = []
    for name, runs in pairs.items():
        first = runs[0]
        row = {"config": name, "trainer": first["trainer"], "rollouts": first["rollouts"],
               "learn_calls": first["learn_calls"], "repeat": len(runs),
               **{key: round(statistics.median(run[key] for run in runs), 4) for key in (
                   "predicted_wall_s", "measured_wall_s", "wall_error", "predicted_peak_mib",
                   "measured_peak_mib", "peak_error")},
               "wall_errors": [run["wall_error"] for run in runs], "peak_errors": [run["peak_error"] for run in runs],
               "load_average": [x for run in runs for x in run["load_average"]], "pairs": runs}
        complete = all(run["run_status"] == "ok" and run["observed_learn_calls"] == run["learn_calls"] for run in runs)
        row["ok"] = complete and all(abs(row[key]) <= limit for key, limit in TARGETS.items())
        only_wall = complete and abs(row["peak_error"]) <= TARGETS["peak_error"]
        sizes = [abs(e) for e in row["wall_errors"]]
        busy = bench.busy_reason({"max": max(row["load_average"]), "cpus": machine["cpu_count"]},
                                 {"min": min(sizes), "max": max(sizes)}, None, TARGETS["wall_error"])
        row["verdict"] = "pass" if row["ok"] else "inconclusive" if only_wall and busy else "fail"
        if row["verdict"] == "inconclusive":
            row["inconclusive_reason"] = busy
        rows.append(row)
    ok = all(row["ok"] for row in rows)
    verdicts = {row["verdict"] for row in rows}
    status = "failed" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "ok"
    report = {"kind": "plan-accuracy", "status": status, "device": args.device,
              "repeat": args.repeat, "targets": TARGETS, "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "machine": machine, "versions": env["versions"], "warnings": env["warnings"], "rows": rows}
    return report, ok


def accuracy_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(ACCURACY_HEADER) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(ACCURACY_HEADER))) + "|"]
    for r in rows:
        cells = [r["config"], r["trainer"], r["rollouts"], r["learn_calls"], f"{r['predicted_wall_s']:.1f}",
                 f"{r['measured_wall_s']:.1f}", f"{r['wall_error']:+.0%}", f"{r['predicted_peak_mib']:.0f}",
                 f"{r['measured_peak_mib']:.0f}", f"{r['peak_error']:+.0%}",
                 " ".join(f"{w:+.0%}/{p:+.0%}" for w, p in zip(r["wall_errors"], r["peak_errors"])),
                 f"{min(r['load_average'])}-{max(r['load_average'])}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def accuracy_markdown(report: dict[str, Any]) -> str:
    """The accuracy subsection of references/workflows.md, regenerated by
    ``bench_smoke.py --plan-accuracy --markdown``."""
    m, v = report["machine"], report["versions"]
    text = [ACCURACY_TITLE, "",
            f"Measured {report['date']} on {m['system']}, {m['cpu']} ({m['cpu_count']} CPUs), Python {v['python']}, "
            f"torch {v['torch']}, palm-rlhf-pytorch {v['palm-rlhf-pytorch']}; device {report['device']}, one torch "
            f"thread. Each row: {report['repeat']} interleaved pairs of `palm-rlhf-skill plan --json` on a shipped "
            "config (`assets/plans/`), then the same run for real (`--execute`), each a fresh process; measured "
            "wall time and peak RSS come from the operating system (`os.wait4`). Errors are predicted / measured "
            f"- 1, the median over the pairs; targets: wall within +/-{TARGETS['wall_error']:.0%}, peak within "
            f"+/-{TARGETS['peak_error']:.0%}. Load: the range of the 1-minute load average around the pairs (the "
            "machine is shared: a pair whose load moved measures the machine as much as the plan).", "",
            "Regenerate (then replace this subsection with the output):", "",
            "```bash", "palm-rlhf-skill bench --plan-accuracy --markdown", "```", "",
            *accuracy_table(report["rows"])]
    return "\n".join(text) + "\n"


def accuracy_summary(report: dict[str, Any]) -> str:
    """The accuracy subsection (markdown), then the verdict with the next step."""
    status = report["status"]
    rows = ", ".join(r["config"] for r in report["rows"] if r["verdict"] != "pass")
    last = {"ok": "OK (exit 0): every prediction within its target; next: replace the subsection of "
                  "sub-skills/policy-optimization/references/workflows.md with --markdown's output",
            "inconclusive": f"INCONCLUSIVE (exit {exits.EXIT_INCONCLUSIVE}): {rows}: only the wall error missed, on a "
                            "machine too busy to judge it; next: rerun when the load average is below the "
                            "CPU count: " + reporting.command("palm-rlhf-skill bench", " ".join(report.get("argv", []))),
            "failed": f"FAILED (exit 1): {rows}; next: palm-rlhf-skill plan --config assets/plans/<config> "
                      "shows what the planner predicted"}[status]
    return accuracy_markdown(report) + f"bench-smoke --plan-accuracy: {last}"


# --- command line --------------------------------------------------------------------------------

def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def summary(report: dict[str, Any]) -> str:
    """Human report: counts, parameters, memory, time, warnings, then the verdict and a next step."""
    if "learn_calls" in report and "counts" not in report:  # --execute
        s = report["seconds"]
        return (f"plan-run --execute: {report['trainer']} on {report['device']}: {report['status'].upper()}"
                + (f" ({report['error']})" if report["error"] else "")
                + f"; {report['learn_calls']} learn() calls; {s['total']} s wall (train {s['train']} s); "
                  f"peak RSS {report['peak_rss_mib']} MiB")
    c, p, probe = report["counts"], report["parameters"], report["probe"]
    lines = [f"plan-run: {report['trainer']} ({report['class_name']}) on {report['device']}; probe "
             f"{probe['elapsed_s']} s of {probe['budget_s']:g} s ({probe['regime'] or 'not run'})",
             f"counts [computed]: {c['rollouts']:,} rollouts; {c['learn_calls']:,} learn() calls of "
             f"{c['items_per_learn']:,} experiences ({c['items_per_rollout']} per rollout, group size "
             f"{c['group_size']}); {c['optimizer_steps_per_learn']:,} optimizer steps per learn(), "
             f"{c['optimizer_steps']:,} in all; {c['leftover_rollouts_dropped']:,} leftover rollouts dropped",
             f"parameters [computed]: {p['total_numel']:,} total, {p['trainable_numel']:,} trainable; weights "
             f"{mib(p['weights_bytes'])} MiB (" + ", ".join(f"{k} {mib(v['bytes'])}" for k, v in p["components"].items())
             + f"); optimizer state {mib(p['optimizer_state_bytes'])} MiB "
               f"({', '.join(f'{k}: {v} per parameter' for k, v in p['optimizer_state_tensors_per_parameter'].items())})"
               f", gradients {mib(p['gradient_bytes'])} MiB"]
    stored = report["stored_per_rollout"]
    if stored:
        largest = max(stored["fields_bytes"], key=stored["fields_bytes"].get)
        lines.append(f"stored per rollout [computed from the trainer's stored fields]: {mib(stored['bytes'])} MiB, "
                     f"of which {largest} {mib(stored['fields_bytes'][largest])} MiB"
                     + (f"; TPO replay buffer file {mib(stored['replay_buffer_file_bytes'])} MiB"
                        if stored["replay_buffer"] else ""))
    memory = report["memory"]
    if memory:
        parts = ", ".join(f"{k.replace('_', ' ')} {mib(v['value'])} [{v['basis']}]" for k, v in memory.items()
                          if isinstance(v, dict) and "basis" in v and k != "base_bytes")
        lines.append(f"memory (MiB): process before the rollouts {mib(memory['base_bytes']['value']['host'])} "
                     f"[measured], {parts}")
    t = report["time"]
    unit = t["unit_s"]
    lines.append("time: " + ", ".join(f"{k} {'-' if v is None else reporting.seconds_text(v)}" for k, v in t.items()
                                      if k != "unit_s")
                 + " (startup and construct measured; the rest " + ("derived" if probe["regime"] else "not measured")
                 + "); one rollout " + (reporting.seconds_text(unit["rollout_s"]) if "rollout_s" in unit else "-")
                 + ", learn() per experience " + (f"{unit['learn_item_s']:.4f} s" if "learn_item_s" in unit else "-")
                 + f" [{probe['regime'] or 'not measured'}]")
    lines += [f"note: {n}" for n in probe["notes"]]
    for w in report["warnings"]:
        lines.append(f"warning: {w['message']}; fix: {w['fix']}" + (f" (see {w['doc']})" if w["doc"] else ""))
    blocking = [w for w in report["warnings"] if w["blocks_learning"] or w["code"] == "memory_exceeds_device"]
    nxt = (blocking[0]["fix"] + ", then plan again" if blocking else
           "fewer rollouts (num_episodes, max_timesteps), smaller sizes or a faster device, then plan again "
           "(or raise --max-days)" if report["status"] == "too_slow" else
           "start the run; plan again after changing any size")
    lines.append(f"verdict: {report['verdict']}; next: {nxt}")
    return "\n".join(lines)


def positive_float(text: str) -> float:
    """argparse ``type=`` for --max-days: a finite number above 0."""
    value = options.finite_nonnegative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Plan a palm-rlhf-pytorch run before starting it: parameter and rollout counts, "
                    "learn() calls and dropped leftovers, memory held before each learn() and the "
                    "predicted peak against the device, wall time from a bounded probe at the real "
                    "size, warnings with their fix, and a one-line verdict.",
        epilog="config (TOML or JSON; [palm], [trainer] and [prompts] required):\n"
               "  [palm]          PaLM keyword arguments (num_tokens, dim, depth, ...)\n"
               "  [reward_model]  RewardModel keyword arguments (it deep-copies the PaLM)\n"
               "  [trainer]       name = \"ppo\" | \"grpo\" | \"tpo\" | \"flowrl\", plus that trainer's arguments\n"
               "  [prompts]       count and length (random ids), or path (one prompt a line, byte-tokenized)\n"
               "  [train]         train() keyword arguments; library defaults where absent\n\n"
               "examples:\n"
               "  palm-rlhf-skill plan --config run.toml\n"
               "  palm-rlhf-skill plan --config run.toml --json\n"
               "  palm-rlhf-skill plan --config run.toml --set train.update_timesteps=64 --probe-seconds 20\n"
               f"  palm-rlhf-skill plan --config {UPSTREAM_EXAMPLE}   # the upstream README's run\n\n"
               "exit codes: 0 the run fits and learns (--execute: it completed); 1 it does not fit, never "
               "learns, is too slow (--max-days) or fails; 2 usage or config error; 3 palm-rlhf-pytorch, torch or a TOML reader "
               "missing or outside the tested range")
    parser.add_argument("--config", required=True, metavar="FILE", help="the run's TOML (or .json) configuration, at most 1 MiB")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one value, e.g. train.update_timesteps=64 (VALUE read as JSON; null unsets "
                             "the key, so the library default applies); repeatable")
    parser.add_argument("--device", default="auto", type=options.device_spec,
                        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--probe-seconds", type=options.finite_nonnegative_float, default=60.0, metavar="S",
                        help="wall-clock budget of the probe after the model is built and its three tiny "
                             "rollouts have run (default: 60)")
    parser.add_argument("--seed", type=options.bounded_int(0, options.MAX_SEED), default=0,
                        help="seed for prompts, weights and sampling (default: 0)")
    parser.add_argument("--max-days", type=positive_float, default=MAX_DAYS, metavar="D",
                        help=f"a run predicted to take longer is too slow: verdict too_slow, exit 1 (default: "
                             f"{MAX_DAYS:g} days, longer than a run anyone plans on one device)")
    parser.add_argument("--cpu-threads", type=options.bounded_int(1, os.cpu_count() or 1), metavar="N",
                        help="torch intra-op threads for the probe (and --execute); give the run's own "
                             "count (default: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    options.add_progress_option(parser)
    parser.add_argument("--execute", action="store_true",
                        help="skip the plan: build the run and train it in full, report seconds and peak RSS")
    options.add_allow_untested_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = read_config(args.config)
    for text in args.set or []:
        apply_override(config, text)
    check_structure(config)
    if "path" in config["prompts"]:  # relative to the config file, read before leaving the caller's directory
        config["prompts"]["path"] = str((Path(args.config).parent / config["prompts"]["path"]).resolve())
    env = version_gate.check_versions(args.allow_untested)
    import torch  # the run's imports, timed as part of its startup
    import palm_rlhf_pytorch  # noqa: F401
    import accelerate  # noqa: F401
    startup_s = process_seconds()
    resolved = check_against_library(config)
    device_kwargs, device = placement.resolve_device(args.device)
    progress = streams.Progress("plan-run", args.progress or not args.json)
    threads = placement.torch_threads(args.cpu_threads) if args.cpu_threads else contextlib.nullcontext(torch.get_num_threads())
    with workspace.private_workdir(), threads as count:
        report = (execute if args.execute else plan)(args, resolved, device_kwargs, device, startup_s, progress)
    report.update(seed=args.seed, cpu_threads=count, versions=env["versions"], version_warnings=env["warnings"],
                  config={k: resolved[k] for k in SECTIONS if k in resolved},
                  effective=resolved["effective"])
    return runner.emit(report, args.json, summary, exits.EXIT_OK if report["status"] in ("fits", "ok") else exits.EXIT_CHECK_FAILED)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
