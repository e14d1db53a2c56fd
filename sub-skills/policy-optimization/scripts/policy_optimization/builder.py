"""The builder shared by ``plan``'s probe and ``train``: from a resolved run config
(``run_config.check_against_library``) the PaLM (with [palm] checkpoint), the reward model
([reward] program, text_program or checkpoint, else an untrained RewardModel of [reward_model]),
the training prompts (tokenized), the held-out prompts of [eval], and the trainer
(``trainers.construct_trainer``), on a device; or, for counting, every large tensor on torch's meta
device (no memory at any size).

Torch-free at import.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

from config_kit import programs
from data_kit import layouts, tables
from run_kit import models
from skill_runtime import exits
from policy_optimization import reward_programs, run_config, trainers


@dataclass
class Built:
    """What ``build`` returns. ``palm``: the policy's PaLM (the trainer adds its LoRA scopes);
    ``reward_model``: a RewardModel or RuleReward; ``prompt_ids``: (p, n) int64, 0-padded, on the
    trainer's device; ``eval_prompt_ids``: (q, m) int64 on the host, or None without [eval];
    ``tokenizer``: the prompt tokenizer ([prompts] tokenizer's callable, else the ByteTokenizer; its
    ``decode`` where it has one);
    ``trainer``: the trainer; ``eval_groups``: the held-out prompts' groups (``prompt_texts``), or None
    without [eval]."""
    palm: Any
    reward_model: Any
    prompt_ids: Any
    eval_prompt_ids: Any
    tokenizer: Any
    trainer: Any
    eval_groups: list[str | None] | None = None


def read_lines(path: str, key: str) -> list[str]:
    """The non-empty lines of ``path`` (UTF-8; a byte-order mark at its start, as some editors
    write, is not part of the first line; ``data_kit.tables.read_lines``). Raises SkillError(2)
    naming ``key``."""
    return tables.read_lines(path, f"config {key}")


def prompt_texts(resolved: dict[str, Any], section: str) -> tuple[list[str], list[str | None], list[str]]:
    """The prompts of [prompts] file (``section`` "prompts") or [eval] prompts_file ("eval"), read
    as ``data_kit.layouts.read_prompts`` reads them (a text file one per line, a table's prompt
    column, or the prompts of preference pairs in any layout), with [prompts]' reading keys
    (format, implicit_prompt, template, columns) and the section's split (default: a datasets
    folder's only split, else ``train`` for [prompts], ``test`` for [eval]). Returns (texts,
    groups, places): ``groups[i]`` the row's ``group`` column or None. Raises SkillError(2)
    naming the key, the file and the row."""
    prompts = resolved["prompts"]
    key, table = ("[prompts] file", prompts) if section == "prompts" else ("[eval] prompts_file", resolved["eval"])
    path = table["file"] if section == "prompts" else table["prompts_file"]
    return layouts.prompt_rows(path, f"config {key}", layouts.options_from(prompts, "config [prompts]"),
                               table.get("split"), f"[{section}] split", "train" if section == "prompts" else "test")


def tokenize_file(resolved: dict[str, Any], section: str):
    """The prompts of ``section`` (``prompt_texts``) through the run's tokenizer
    (``run_config.tokenizer``): ((n, len) int64, checked by ``programs.checked_ids``; the rows'
    groups, ``prompt_texts``'). Raises SkillError(2) naming the key."""
    key = "[prompts] file" if section == "prompts" else "[eval] prompts_file"
    texts, groups, _ = prompt_texts(resolved, section)
    return programs.tokenize(run_config.tokenizer(resolved), texts, f"config {key}", resolved["palm"]["num_tokens"]), groups


def prompt_token_ids(resolved: dict[str, Any], seed: int, meta: bool = False):
    """``(count, length)`` int64 ids in [1, num_tokens) from [prompts] count/length (seeded; with
    ``meta`` a meta tensor of that shape, no memory), or the lines of [prompts] file through the
    run's tokenizer (the skill's byte tokenizer, id = byte + 1, 0 = pad, unless [prompts]
    tokenizer names one), empty lines dropped. Raises SkillError(2) for an unreadable or empty
    file, or ids beyond num_tokens."""
    import torch
    prompts, num_tokens = resolved["prompts"], resolved["palm"]["num_tokens"]
    if "file" not in prompts and meta:
        return torch.empty((prompts["count"], prompts["length"]), dtype=torch.long, device="meta")
    if "file" not in prompts:
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(1, num_tokens, (prompts["count"], prompts["length"]), generator=generator)
    return tokenize_file(resolved, "prompts")[0]


def eval_prompt_ids(resolved: dict[str, Any]):
    """[eval] prompts_file through the run's tokenizer: ((q, m) int64, the q prompts' groups), or
    (None, None) without [eval]."""
    if resolved["eval"] is None:
        return None, None
    return tokenize_file(resolved, "eval")


def check_prompt_files(resolved: dict[str, Any]) -> None:
    """Read [prompts] file and [eval] prompts_file as ``tokenize_file`` will (``prompt_texts``),
    tokenize them and check their lengths, so that an unreadable, non-UTF-8, blank or malformed
    file, or a prompt too long for [train] max_seq_len, is refused before a model is built: a
    prompt of ``max_seq_len - 1`` ids or more leaves its rollouts one token
    (``advice.prompts_fill_max_seq_len``, palm.py:429). Raises SkillError(2) naming the key, the
    longest prompt's file and line, its length in tokens and the limit."""
    from data_kit import sizes
    max_seq_len = resolved["effective"]["train"]["max_seq_len"]
    for section in ("prompts", "eval"):
        if (section == "prompts" and "file" not in resolved["prompts"]) or (section == "eval" and resolved["eval"] is None):
            continue
        texts, _, places = prompt_texts(resolved, section)
        key = "[prompts] file" if section == "prompts" else "[eval] prompts_file"
        ids = programs.tokenize(run_config.tokenizer(resolved), texts, f"config {key}", resolved["palm"]["num_tokens"])
        lengths = (ids != 0).sum(-1).tolist()
        sizes.check_length(lengths, places, max_seq_len - 2, "",
                           f"[train] max_seq_len (now {max_seq_len:,}) must exceed the longest prompt by the response "
                           "length you want (a prompt of max_seq_len - 1 ids or more gets one-token responses), or "
                           "shorter prompts")


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


def multi_process_cpu(device) -> bool:
    """True when Accelerate will run this process as one of several on CPUs (``MULTI_CPU``): its
    state already says so, or, before any state exists, the device is the CPU and WORLD_SIZE > 1."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType
    if PartialState._shared_state:
        return PartialState().distributed_type == DistributedType.MULTI_CPU
    return device.type == "cpu" and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def build_reward_model(resolved: dict[str, Any], palm, device, meta: bool):
    """The run's reward model on ``device``: a RuleReward of [reward] program or text_program
    (``reward_programs.rule_reward``, with its DDP anchor parameter only under multi-process CPU), else
    ``RewardModel(palm, **[reward_model])`` (it deep-copies the PaLM), loaded from [reward]
    checkpoint when given (not with ``meta``: ``run_kit.models.reward_model``); a checkpoint of ``train-reward`` (its
    rm_config.json beside it: ``resolved["reward_palm"]``) builds on a PaLM of its own sizes instead."""
    rule = reward_programs.rule_reward(resolved, anchor=not meta and multi_process_cpu(device))
    if rule is not None:
        return rule if meta else rule.to(device)
    if resolved.get("reward_palm") is not None:
        palm = models.palm(resolved["reward_palm"], None)
        palm = meta_module(palm) if meta else palm
    reward_model = models.reward_model(palm, resolved["reward_model"],
                                       None if meta else resolved["reward"].get("checkpoint"))
    return reward_model if meta else reward_model.to(device)


def build(resolved: dict[str, Any], device_kwargs: dict[str, Any], device, seed: int = 0, meta: bool = False,
          prompt_ids=None) -> Built:
    """The run of ``resolved`` on ``device``: PaLM(**[palm]) with [palm] checkpoint loaded, the
    reward model (``build_reward_model``), the prompts (``prompt_token_ids``, seeded by ``seed``;
    ``prompt_ids`` replaces them when given), the held-out prompts (``eval_prompt_ids``) and the
    trainer with [trainer]'s arguments and ``accelerate_kwargs=device_kwargs``. With ``meta``
    every large tensor lives on torch's meta device (``large_tensors_on_meta``: no memory, no
    data, for counting), no checkpoint is read and Accelerate places nothing. Rollouts sample with
    ``resolved["sampler"]`` (``cached_sampler.apply``; not on the meta device, which never samples).
    Raises SkillError(2) when a file is unusable or the installed library refuses the
    configuration, and SkillError(1) when building at the real size runs out of memory (the run
    does not fit this process)."""
    cls = resolved["trainer_class"]
    ids = prompt_token_ids(resolved, seed, meta) if prompt_ids is None else prompt_ids
    held_out, eval_groups = eval_prompt_ids(resolved)
    try:
        with large_tensors_on_meta() if meta else contextlib.nullcontext():
            palm = models.palm(resolved["palm"], None if meta else resolved["palm_checkpoint"])
            palm = meta_module(palm) if meta else palm.to(device)
            reward_model = build_reward_model(resolved, palm, device, meta)
            # the smoke's constructor call: output captured, the prompt ids (a buffer Accelerate
            # does not prepare) moved to the device afterwards (meta ids stay on meta)
            trainer = trainers.construct_trainer(trainers.TRAINERS[resolved["name"]], palm, reward_model,
                                                 {"prompt_token_ids": ids},
                                                 {**device_kwargs, "device_placement": False} if meta else device_kwargs,
                                                 "meta" if meta else device, **resolved["trainer"])
    except exits.SkillError:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted below: the process's memory, or the library's refusal
        if exits.out_of_memory(exc):
            raise exits.SkillError(f"building at the real size ran out of memory: {exits.one_line(exc)}: the run "
                                   "does not fit the memory this process may use", exits.EXIT_CHECK_FAILED) from None
        if not isinstance(exc, (AssertionError, TypeError, ValueError, RuntimeError)):
            raise
        raise exits.SkillError(f"config: the installed {cls.__module__}.{cls.__name__} refused it: "
                               f"{exits.one_line(exc)}") from None
    if not meta:
        import cached_sampler
        cached_sampler.apply(trainer, resolved.get("sampler", cached_sampler.DEFAULT_SAMPLER))
    return Built(palm, reward_model, trainer.prompt_token_ids, held_out, run_config.tokenizer(resolved), trainer,
                 eval_groups)
