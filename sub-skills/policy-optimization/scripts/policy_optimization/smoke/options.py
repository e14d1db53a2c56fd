"""Every option of tiny-rlhf-smoke, declared once (``OPTIONS``): its argparse arguments, the modes
it applies to and any further condition, and whether the train smoke's report shows it in
``config``. The parser (``add_arguments``), the refusals of a misplaced option (``refuse_misplaced``,
exit 2 before torch), the report's ``config`` (``train_config``) and the Options table of
references/workflows.md (``doc_applies_to``, tested against it) follow from it. Torch-free at import.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import cached_sampler  # torch-free at import
import probe_kit
from skill_runtime import exits, options
from policy_optimization import tiny_trainers, trainers
from policy_optimization.smoke import learning_check, settings
from run_kit import launch

ALL_MODES = frozenset(settings.MODES)
SMOKE_MODES = frozenset({"construct-only", "train-smoke"})  # the train smoke, and its build-only form
MODE_FLAGS = {"construct-only": "--construct-only", "train-smoke": "the train smoke", "learn": "--learn"}
SAMPLING_MODES = frozenset({"train-smoke", "learn"})  # the modes that sample rollouts
MODE_WORDS = {SMOKE_MODES: "the train smoke", frozenset({"train-smoke"}): "the train smoke",
              frozenset({"construct-only"}): "--construct-only", frozenset({"learn"}): "--learn",
              SAMPLING_MODES: "the train smoke and --learn"}
GROUPS = {  # argparse groups: (title, description); "mode" is the mutually exclusive mode flags
    "multi-process": ("multi-process (DDP)", "under torchrun, accelerate launch or srun the smoke runs as one rank "
                      "of their world by itself; --nproc N starts N ranks on this machine"),
    "size": ("model size (to size a bigger smoke; defaults: the tiny config)", None),
}


@dataclass(frozen=True)
class Option:
    """One option: ``flag`` and its argparse keywords (``kwargs``), the modes it applies to (the
    report's ``mode`` values), ``only_with`` (a further condition in the docs' words, ``when(args,
    world)`` deciding it), whether it is one of the three smokes' common options (added by
    ``options.add_common_options``), its argparse group, and ``config`` (shown in the train smoke's
    report ``config``)."""
    flag: str
    modes: frozenset[str]
    kwargs: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    only_with: str | None = None
    when: Callable[[Any, Any], bool] | None = None
    common: bool = False
    config: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _flag(help_text: str) -> dict[str, Any]:
    return {"action": "store_true", "help": help_text}


def _bounded(low: int, high: int, help_text: str, **kwargs) -> dict[str, Any]:
    return {"type": options.bounded_int(low, high), "metavar": "N", "help": help_text, **kwargs}


OPTIONS = [
    Option("--trainer", ALL_MODES, {"choices": [*trainers.TRAINERS, "all"], "default": "ppo",
           "help": "ppo (root RLHFTrainer), grpo, tpo, flowrl, or all four (default: ppo)"}),
    Option("--grpo-variant", SMOKE_MODES, {
        "action": "append", "metavar": "NAME",
        "help": "GRPO advantage/objective variant: " + ", ".join(settings.GRPO_VARIANTS)
                + "; repeat or comma-separate to combine (default: default)"},
        only_with="`--trainer grpo` or `all`", when=lambda args, world: args.trainer in ("grpo", "all")),
    Option("--device", ALL_MODES, common=True),
    Option("--construct-only", frozenset({"construct-only"}), _flag("stop after building the models and trainer"),
           group="mode"),
    Option("--train-smoke", frozenset({"train-smoke"}),
           _flag("build, run one bounded update and one generate call (the default)"), group="mode"),
    Option("--learn", frozenset({"learn"}), _flag(
        "the learning check: on a toy task with a rule-based reward, the held-out reward must rise for at least "
        f"{math.ceil(learning_check.LEARN_MIN_IMPROVED * learning_check.LEARN_SEEDS)} of {learning_check.LEARN_SEEDS} "
        "seeds, by the trainer's calibrated median threshold (references/workflows.md#learning-check)"), group="mode"),
    Option("--learn-control", frozenset({"learn"}), {
        "choices": learning_check.LEARN_CONTROLS,
        "help": "with --learn: frozen (learning rates 0: the check must fail, exit 1) or inverted (reward 1 - "
                "target fraction: passes only if the target falls)"}),
    Option("--learn-seeds", frozenset({"learn"}), _bounded(
        1, learning_check.MAX_LEARN_SEEDS,
        "with --learn: seeds per trainer, --seed to --seed + N - 1; with fewer than the calibrated count, the "
        "median gain is one or two seeds' gain, and a seed just under its threshold fails the check "
        f"(default: {learning_check.LEARN_SEEDS})")),
    Option("--prompt-style", SMOKE_MODES, {
        "choices": ["token-ids", "text", "file"], "default": "token-ids",
        "help": "token-ids: padded prompt_token_ids; text: prompts= with a byte-level tokenizer; file: "
                "prompts_path= to the shipped prompts file"}),
    Option("--sampler", SAMPLING_MODES, {
        "choices": cached_sampler.SAMPLERS, "default": cached_sampler.DEFAULT_SAMPLER,
        "help": "library: PaLM.generate, one full forward per sampled token; cached: scripts/cached_sampler.py, "
                "the same sampling one position per step with each layer's keys and values kept (default: "
                f"{cached_sampler.DEFAULT_SAMPLER})"}, config=True),
    Option("--rollouts", frozenset({"train-smoke"}), _bounded(
        1, settings.MAX_ROLLOUTS, "rollouts before the single learn() (default: computed so every trainable "
        "tensor moves; fewer makes the weight checks fail)")),
    Option("--eos-token", SMOKE_MODES, _bounded(
        1, probe_kit.TINY_PALM["num_tokens"] - 1,
        "pass eos_token=ID to train() and generate(); the tiny policy's logit for ID is raised by "
        f"{settings.EOS_LOGIT_BIAS} so rollouts end at eos at varying lengths (0 is the pad id; no prompt "
        "may contain ID)", metavar="ID")),
    Option("--nproc", SMOKE_MODES, _bounded(
        1, launch.MAX_NPROC, "launch N processes with torch.distributed.run (Accelerate MULTI_CPU or MULTI_GPU, "
        "one GPU each), train on every rank with the DDP fixes of ddp_fixes.py, and check the ranks stay in sync "
        "(see policy_optimization/smoke/ranks.py)"), group="multi-process"),
    Option("--no-ddp-fixes", SMOKE_MODES, _flag(
        "with --nproc or under a launcher: skip the DDP fixes, to see what breaks without them"),
        group="multi-process", only_with="`--nproc` runs or to the ranks a launcher started",
        when=lambda args, world: world is not None or args.nproc is not None),
    Option("--oversubscribe", SMOKE_MODES, _flag(
        "start even when the predicted memory exceeds the available memory, and with --nproc even when N exceeds "
        "the usable CPU cores (refused by default, exit 2)"), group="multi-process"),
    Option("--dist-timeout", SMOKE_MODES, {
        "type": options.bounded_int(1, 86400), "default": launch.DIST_TIMEOUT_S, "metavar": "S",
        "help": "seconds a rank waits for the others to start and in each collective before it fails with one "
                f"line (default: {launch.DIST_TIMEOUT_S})"},
        group="multi-process", only_with="`--nproc` runs or to the ranks a launcher started",
        when=lambda args, world: world is not None or args.nproc is not None),
    Option("--seed", ALL_MODES, common=True),
    Option("--cpu-threads", ALL_MODES, common=True),
    Option("--dim", SMOKE_MODES, _bounded(settings.MIN_DIM, settings.MAX_DIM,
           f"PaLM model dimension (default: {probe_kit.TINY_PALM['dim']})", default=probe_kit.TINY_PALM["dim"]),
           group="size", config=True),
    Option("--depth", SMOKE_MODES, _bounded(1, settings.MAX_DEPTH,
           f"PaLM layers (default: {probe_kit.TINY_PALM['depth']})", default=probe_kit.TINY_PALM["depth"]),
           group="size", config=True),
    Option("--prompt-len", SMOKE_MODES, _bounded(
        1, settings.MAX_TOKENS, "every token-ids prompt exactly N tokens (default: random "
        f"{probe_kit.PROMPT_LENGTHS[0]}-{probe_kit.PROMPT_LENGTHS[1]})"),
        group="size", only_with="`--prompt-style token-ids`", when=lambda args, world: args.prompt_style == "token-ids",
        config=True),
    Option("--new-tokens", SMOKE_MODES, _bounded(
        1, settings.MAX_TOKENS, "tokens sampled per rollout: max_seq_len = longest prompt + N (default: "
        f"{tiny_trainers.NEW_TOKENS})", default=tiny_trainers.NEW_TOKENS), group="size", config=True),
    Option("--json", ALL_MODES, common=True),
    Option("--progress", ALL_MODES, common=True),
    Option("--verbose", SMOKE_MODES, _flag("echo the library's own prints (losses) to stderr")),
    Option("--allow-untested", ALL_MODES, common=True),
]
BY_FLAG = {option.flag: option for option in OPTIONS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of ``OPTIONS`` on ``parser``, in the table's order within each argparse group;
    the common ones through ``options.add_common_options`` (one home for the three smokes)."""
    groups: dict[str | None, Any] = {None: parser, "mode": parser.add_mutually_exclusive_group()}
    groups.update({key: parser.add_argument_group(title, description) for key, (title, description) in GROUPS.items()})
    common_added = False
    for option in OPTIONS:
        if option.common:
            if not common_added:
                options.add_common_options(parser)
                common_added = True
            continue
        groups[option.group].add_argument(option.flag, **option.kwargs)


def used(option: Option, args) -> bool:
    """Whether the command line set ``option`` (its value differs from its default)."""
    return getattr(args, option.dest) != option.kwargs.get("default", False if option.kwargs.get("action") == "store_true" else None)


def refuse_misplaced(args, world) -> None:
    """A usage error (SkillError, exit 2, before torch) for the first option set on the command
    line that does not apply: first to the run's mode (``Option.modes``), then to its further
    condition (``Option.only_with``; ``world``: the launcher's ``launch.World`` or None)."""
    mode = settings.mode_name(args)
    for option in OPTIONS:
        if not option.common and mode not in option.modes and used(option, args):
            words = MODE_WORDS[option.modes]
            fixed = " (its toy task is fixed: references/workflows.md#learning-check)" if mode == "learn" else ""
            raise exits.SkillError(f"{option.flag} applies to {words}, not {MODE_FLAGS[mode]}{fixed}")
    for option in OPTIONS:
        if option.when is not None and used(option, args) and not option.when(args, world):
            raise exits.SkillError(f"{option.flag} applies to {option.only_with.replace('`', '')}")


def train_config(args, cpu_threads: int) -> dict[str, Any]:
    """The train smoke report's ``config``: the tiny PaLM with the ``config`` options' values
    (--dim, --depth, --prompt-len, --new-tokens, --sampler) and the torch threads in effect."""
    shown = {option.dest: getattr(args, option.dest) for option in OPTIONS if option.config}
    return {**probe_kit.TINY_PALM, **shown, "cpu_threads": cpu_threads}


def doc_applies_to(option: Option) -> str:
    """The option's "applies to" cell in workflows.md's Options table: its modes, then any condition."""
    modes = "every mode" if option.modes == ALL_MODES else ", ".join(
        f"`{mode}`" for mode in settings.MODES if mode in option.modes)
    return modes + (f"; only to {option.only_with}" if option.only_with else "")
