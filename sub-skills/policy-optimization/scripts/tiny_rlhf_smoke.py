#!/usr/bin/env python3
"""Tiny, bounded RLHF smoke for palm-rlhf-pytorch: PPO, GRPO, TPO and FlowRL.

Builds a tiny PaLM policy and a scalar RewardModel on the auto-selected device, constructs the
chosen trainer, runs one bounded ``train()`` call whose single ``learn()`` performs enough optimizer
steps for every trainable tensor to move, then one ``trainer.generate()`` call, and checks what
changed and what must not have.

Usage:
    tiny_rlhf_smoke.py                                  # PPO train smoke: report on stdout, verdict last
    tiny_rlhf_smoke.py --json                           # one JSON object on stdout
    tiny_rlhf_smoke.py --trainer all --json             # PPO, GRPO, TPO and FlowRL in one process
    tiny_rlhf_smoke.py --trainer grpo --grpo-variant dr-grpo
    tiny_rlhf_smoke.py --construct-only --device cpu
    tiny_rlhf_smoke.py --prompt-style text              # raw-text prompts via prompts=
    tiny_rlhf_smoke.py --prompt-style file              # the same file via prompts_path=
    tiny_rlhf_smoke.py --trainer all --nproc 2 --json   # 2 DDP processes, ranks checked in sync
    tiny_rlhf_smoke.py --dim 128 --depth 2 --prompt-len 16 --new-tokens 32   # a bigger smoke

Progress goes to stderr (under --json only with --progress), the report to stdout.
Runs inside a private temporary directory and leaves nothing in the caller's directory.
Options and exit codes: references/workflows.md#the-smoke-helper; JSON: references/reports.md.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from skill_runtime import byte_tokenizer, exits, options, placement, reporting, runner, snapshots, streams, version_gate, workspace  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMPTS_FILE = HERE.parent / "assets" / "prompts.txt"
import ddp_fixes  # noqa: E402  (torch-free at import)
from policy_optimization import evaluation, trainers  # noqa: E402
import ddp_launch  # noqa: E402  (multi-process mode: a launcher's rank, --nproc and their options; torch-free at import)

TPO_BUFFER = ddp_fixes.TPO_BUFFER  # the TPO replay-buffer folder name: one fact, kept with the DDP fixes

# Tiny model: big enough to exercise every code path, small enough for a laptop CPU.
TINY_PALM = dict(num_tokens=257, dim=32, depth=1, heads=2, dim_head=16)
NEW_TOKENS = 8         # tokens sampled after the longest prompt
PROMPT_LENGTHS = (3, 6)  # random token-ids prompt lengths, inclusive
GROUP_SAMPLES = 3      # extra samples per prompt for GRPO/TPO/FlowRL: group size = 3 + 1
NUM_GENERATE_SAMPLES = 2

# Bounds that keep the smoke a smoke: a usage error (exit 2) beyond them, before torch is imported.
MAX_ROLLOUTS, MAX_DIM, MAX_DEPTH, MAX_TOKENS = 1000, 8192, 64, 4096
# --dim 1 would build, then learn nothing: palm.py's LayerNorm normalises over the dim features, and
# one feature minus its own mean is 0, so every layer sees zeros and no LoRA tensor gets a gradient.
MIN_DIM = 2
# --eos-token: an untrained 257-token PaLM almost never samples one chosen id, so the smoke adds this
# to the policy's logit for it (a forward hook on to_logits): about 0.4 per sampled token at the tiny
# sizes (measured: 0.37-0.45 at dim 32 and 128), so rollouts end at eos at varying lengths.
EOS_LOGIT_BIAS = 3.0

# Run-time estimate, printed before a run predicted to take over ESTIMATE_NOTE_S after the imports.
# Train smoke, per trainer: ESTIMATE_ROLLOUT_S per rollout, ESTIMATE_LAYER_STEP_S per layer and
# sampling step, ESTIMATE_MULTIPLY_S per multiply-add of the forwards train() and generate() run
# (palm.py generate keeps no cache: each step runs the whole sequence). Fitted (least squares on
# the relative error) to the 26 rows of sizing.md's measured table (one torch thread,
# load average 2.6): every row within 1.8x (tests/test_output.py holds them within 2x).
ESTIMATE_ROLLOUT_S = 0.095
ESTIMATE_LAYER_STEP_S = 4.5e-4
ESTIMATE_MULTIPLY_S = 5.5e-11
ESTIMATE_FULL_FORWARDS = 3  # full-length forwards per stored sequence: scoring, reference, learn()
ESTIMATE_NOTE_S = 30.0
# --learn: seconds per seed, the "s per seed" of workflows.md's measured pass rates (control none,
# load average 5.8 on 2 CPUs: an upper figure; tests/test_output.py ties them to that table).
LEARN_SECONDS_PER_SEED = {"ppo": 5.42, "grpo": 0.66, "tpo": 1.96, "flowrl": 0.58}

GRPO_VARIANTS = {
    "default": {},
    "dr-grpo": {"use_dr_grpo": True},
    "max-rl": {"use_max_rl": True},
    "spo": {"use_simple_policy_optimization": True},
    "score-centering": {"use_score_centering": True},
    "entropy-advantage": {"add_entropy_to_advantage": True},
}
# Refused combinations: palm_rlhf_pytorch/grpo.py asserts these only after Actor() has already
# added the 'actor' LoRA scope to the PaLM, so the helper refuses them before any model exists.
GRPO_INCOMPATIBLE = [("dr-grpo", "max-rl", "cannot use both Dr. GRPO and MaxRL"),
                     ("spo", "score-centering", "cannot use both SPO and Score Centering")]


# The smoke's own setting per trainer (trainers.TRAINERS holds the library's facts): its minibatch
# size and extra constructor arguments; every grouped trainer samples GROUP_SAMPLES + 1 completions.
SMOKE_MINIBATCH = {"ppo": 2, "grpo": 4, "tpo": 1, "flowrl": 4}
SMOKE_EXTRA = {"ppo": {"max_norm": None}, "flowrl": {"partition_function_hidden_dim": TINY_PALM["dim"]}}


def smoke_group(spec: trainers.TrainerSpec) -> int:
    """Completions per prompt per rollout in the smoke: GROUP_SAMPLES + 1, PPO 1."""
    return GROUP_SAMPLES + 1 if spec.group_kwarg else 1


def smoke_rollouts(spec: trainers.TrainerSpec) -> int:
    """Rollouts before the smoke's one learn() so that it makes the optimizer's required steps."""
    return spec.rollouts_for(spec.required_steps, smoke_group(spec), SMOKE_MINIBATCH[spec.name])


def smoke_steps(spec: trainers.TrainerSpec, rollouts: int) -> int:
    """Optimizer steps of the smoke's one learn() over ``rollouts`` rollouts."""
    return spec.steps_per_learn(rollouts, smoke_group(spec), SMOKE_MINIBATCH[spec.name])


# Learning check (--learn): does the reward rise? ------------------------------------------------
# The toy task: a tiny PaLM with 16 token ids samples LEARN_NEW_TOKENS tokens after a random prompt
# of LEARN_PROMPT_LEN ids; the rule-based reward (reward-modeling/scripts/rule_reward.py) is the
# fraction of sampled tokens whose id is in LEARN_TARGET_IDS: half the ids, so an untrained policy
# scores about 0.5 and the reward has room to rise, or (inverted control) to fall. PaLM.generate
# keeps only the top ceil(0.1 * num_tokens) logits (palm_rlhf_pytorch/utils.py top_k, thres 0.9,
# which no trainer overrides): 2 candidate ids per step here; 10 ids or fewer would leave 1, greedy.
LEARN_PALM = dict(num_tokens=16, dim=32, depth=1, heads=2, dim_head=16)
LEARN_TARGET_IDS = tuple(range(1, 9))
LEARN_PROMPT_LEN = 4
LEARN_NEW_TOKENS = 8   # a power of two: every reward k/8 is exact in float32, so a group of equal
                       # rewards gets GRPO's, TPO's and FlowRL's (r - mean) / std exactly 0
LEARN_TRAIN_PROMPTS = 16  # prompts the trainer draws rollouts from
LEARN_EVAL_PROMPTS = 16   # held-out prompts, drawn after the training ones from the same generator
LEARN_EVAL_SAMPLES = 8    # completions per held-out prompt, the same sampling noise before and after
LEARN_SEEDS = 5           # seeds per trainer by default: --seed, --seed + 1, ...
LEARN_MIN_IMPROVED = 0.8  # fraction of seeds whose held-out reward must rise (4 of 5)
MAX_LEARN_SEEDS = 100
LEARN_CONTROLS = ("frozen", "inverted")


@dataclass(frozen=True)
class LearnSetting:
    """One trainer's row of the learning check; calibrated with calibrate_learning.py."""
    episodes: int        # learn() calls: train(num_episodes=episodes, ...)
    rollouts: int        # rollouts per learn(): max_timesteps = update_timesteps = rollouts
    lr: float            # actor learning rate; PPO's critic and FlowRL's partition function too
    group_size: int      # completions per prompt per rollout (PPO: 1, no group)
    minibatch_size: int
    threshold: float     # the median held-out gain over the seeds must reach it
    why: str             # the measured reason for these numbers


LEARN_SETTINGS = {  # alternatives measured on seeds 0-9: calibrate_learning.py --seeds 10 --set ...
    "ppo": LearnSetting(
        episodes=8, rollouts=16, lr=1e-2, group_size=1, minibatch_size=4, threshold=0.15,
        why="seeds 0-9 all rose (median +0.40, least +0.17); minibatch 8 gave a median of +0.30, lr 3e-3 "
            "+0.14; minibatch 16, 6 x 12 rollouts, or 6 x 8 with lr 2e-2 or minibatch 2 let a seed fall "
            "(to -0.56 at worst); one completion per rollout: PPO takes most of the check's time"),
    "grpo": LearnSetting(
        episodes=5, rollouts=4, lr=3e-3, group_size=8, minibatch_size=8, threshold=0.2,
        why="the default lr 1e-4 gave a median of +0.03, 1e-3 +0.27; groups of 8, one group per "
            "optimizer step, 4 steps per learn()"),
    "tpo": LearnSetting(
        episodes=5, rollouts=4, lr=3e-3, group_size=8, minibatch_size=1, threshold=0.2,
        why="lr 1e-4 gave a median of +0.05, 1e-3 +0.38; TPO stores a group as one item, so minibatch 1 "
            "is one group of 8 per step, as GRPO's 8"),
    "flowrl": LearnSetting(
        episodes=5, rollouts=4, lr=3e-3, group_size=8, minibatch_size=8, threshold=0.2,
        why="lr 1e-4 gave a median of +0.04, 1e-3 +0.28 (actor and partition function); otherwise as GRPO"),
}


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Bounded RLHF smoke for palm-rlhf-pytorch: build a tiny PaLM policy, a scalar "
                    "reward model and a trainer, run one update that must move every trainable "
                    "weight, one generate call, and check the results. --learn instead checks that "
                    "each trainer raises a rule-based reward on a toy task over several seeds.",
        epilog="examples:\n"
               "  tiny-rlhf-smoke --json\n"
               "  tiny-rlhf-smoke --trainer all --json\n"
               "  tiny-rlhf-smoke --trainer grpo --grpo-variant spo\n"
               "  tiny-rlhf-smoke --construct-only --device cpu\n"
               "  tiny-rlhf-smoke --prompt-style file\n"
               "  tiny-rlhf-smoke --trainer all --nproc 2 --json\n"
               "  tiny-rlhf-smoke --trainer all --nproc 2 --eos-token 3 --json\n"
               "  torchrun --nproc-per-node 2 tiny_rlhf_smoke.py --trainer all --json\n"
               "  tiny-rlhf-smoke --dim 128 --depth 2 --prompt-len 16 --new-tokens 32\n"
               "  tiny-rlhf-smoke --learn --trainer all --json\n"
               "  tiny-rlhf-smoke --learn --trainer ppo --learn-control frozen   # must exit 1\n\n"
               + exits.EXIT_CODES_EPILOG)
    parser.add_argument("--trainer", choices=[*trainers.TRAINERS, "all"], default="ppo",
                        help="ppo (root RLHFTrainer), grpo, tpo, flowrl, or all four (default: ppo)")
    parser.add_argument("--grpo-variant", action="append", metavar="NAME",
                        help="GRPO advantage/objective variant: " + ", ".join(GRPO_VARIANTS)
                             + "; repeat or comma-separate to combine (default: default)")
    options.add_common_options(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--construct-only", action="store_true",
                      help="stop after building the models and trainer")
    mode.add_argument("--train-smoke", action="store_true",
                      help="build, run one bounded update and one generate call (the default)")
    mode.add_argument("--learn", action="store_true",
                      help="the learning check: on a toy task with a rule-based reward, the held-out "
                           f"reward must rise for at least {math.ceil(LEARN_MIN_IMPROVED * LEARN_SEEDS)} of "
                           f"{LEARN_SEEDS} seeds, by the trainer's calibrated median threshold "
                           "(references/workflows.md#learning-check)")
    parser.add_argument("--learn-control", choices=LEARN_CONTROLS,
                        help="with --learn: frozen (learning rates 0: the check must fail, exit 1) or "
                             "inverted (reward 1 - target fraction: passes only if the target falls)")
    parser.add_argument("--learn-seeds", type=options.bounded_int(1, MAX_LEARN_SEEDS), metavar="N",
                        help="with --learn: seeds per trainer, --seed to --seed + N - 1; with fewer than the "
                             "calibrated count, the median gain is one or two seeds' gain, and a seed just under "
                             f"its threshold fails the check (default: {LEARN_SEEDS})")
    parser.add_argument("--prompt-style", choices=["token-ids", "text", "file"], default="token-ids",
                        help="token-ids: padded prompt_token_ids; text: prompts= with a byte-level "
                             "tokenizer; file: prompts_path= to the shipped prompts file")
    parser.add_argument("--rollouts", type=options.bounded_int(1, MAX_ROLLOUTS), metavar="N",
                        help="rollouts before the single learn() (default: computed so every "
                             "trainable tensor moves; fewer makes the weight checks fail)")
    parser.add_argument("--eos-token", type=options.bounded_int(1, TINY_PALM["num_tokens"] - 1), metavar="ID",
                        help="pass eos_token=ID to train() and generate(); the tiny policy's logit for ID "
                             f"is raised by {EOS_LOGIT_BIAS} so rollouts end at eos at varying lengths "
                             "(0 is the pad id; no prompt may contain ID)")
    ddp_launch.add_options(parser)
    size = parser.add_argument_group("model size (to size a bigger smoke; defaults: the tiny config)")
    size.add_argument("--dim", type=options.bounded_int(MIN_DIM, MAX_DIM), default=TINY_PALM["dim"], metavar="N",
                      help=f"PaLM model dimension (default: {TINY_PALM['dim']})")
    size.add_argument("--depth", type=options.bounded_int(1, MAX_DEPTH), default=TINY_PALM["depth"], metavar="N",
                      help=f"PaLM layers (default: {TINY_PALM['depth']})")
    size.add_argument("--prompt-len", type=options.bounded_int(1, MAX_TOKENS), metavar="N",
                      help="every token-ids prompt exactly N tokens (default: random "
                           f"{PROMPT_LENGTHS[0]}-{PROMPT_LENGTHS[1]})")
    size.add_argument("--new-tokens", type=options.bounded_int(1, MAX_TOKENS), default=NEW_TOKENS, metavar="N",
                      help=f"tokens sampled per rollout: max_seq_len = longest prompt + N (default: {NEW_TOKENS})")
    parser.add_argument("--verbose", action="store_true",
                        help="echo the library's own prints (losses) to stderr")
    return parser


def parse_variants(values: list[str] | None) -> list[str]:
    """Split and validate --grpo-variant values; raise SkillError(2) for unknown or refused ones."""
    names = [v.strip() for value in (values or ["default"]) for v in value.split(",") if v.strip()]
    if not names:
        raise exits.SkillError("--grpo-variant needs a name: " + ", ".join(GRPO_VARIANTS))
    unknown = [n for n in names if n not in GRPO_VARIANTS]
    if unknown:
        raise exits.SkillError(f"unknown --grpo-variant {', '.join(unknown)}; choose from {', '.join(GRPO_VARIANTS)}")
    names = [n for n in dict.fromkeys(names) if n != "default"] or ["default"]
    for a, b, reason in GRPO_INCOMPATIBLE:
        if a in names and b in names:
            raise exits.SkillError(f"--grpo-variant {a} with {b} is refused: the library says '{reason}' "
                                "(and asserts only after adding a LoRA scope to your PaLM)")
    return names


# prompts ---------------------------------------------------------------------------------------

def random_prompt_token_ids(seed: int, num_prompts: int = 4, lengths: tuple[int, int] = PROMPT_LENGTHS):
    """Padded ``(num_prompts, max_len)`` int64 prompt ids in [1, vocab), right-padded with 0."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (num_prompts,), generator=gen)
    ids = torch.randint(1, TINY_PALM["num_tokens"], (num_prompts, int(lens.max())), generator=gen)
    keep = torch.arange(ids.shape[1]) < lens[:, None]
    return ids.masked_fill(~keep, byte_tokenizer.PAD_ID)


def prompt_kwargs(style: str, seed: int, prompt_len: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trainer prompt arguments for a style, plus a description for the report.

    Raises SkillError (exit 2) when the shipped prompts file is missing, not UTF-8 or has no
    non-empty line: a damaged skill tree, reported before any model is built.
    """
    if style == "token-ids":
        ids = random_prompt_token_ids(seed, lengths=(prompt_len, prompt_len) if prompt_len else PROMPT_LENGTHS)
        return {"prompt_token_ids": ids}, {"style": style, "count": ids.shape[0], "max_len": ids.shape[1]}
    try:
        prompts = PROMPTS_FILE.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise exits.SkillError(f"prompts file unreadable: {PROMPTS_FILE}: {exits.one_line(exc)} "
                            "(reinstall the skill tree)") from None
    if not any(p.strip() for p in prompts):
        raise exits.SkillError(f"prompts file has no non-empty line: {PROMPTS_FILE} (reinstall the skill tree)")
    tokenizer = byte_tokenizer.ByteTokenizer()
    if style == "text":
        return {"prompts": prompts, "tokenizer": tokenizer}, {"style": style, "tokenizer": tokenizer}
    return ({"prompts_path": str(PROMPTS_FILE), "tokenizer": tokenizer},
            {"style": style, "tokenizer": tokenizer, "path": PROMPTS_FILE.name})


# one trainer -----------------------------------------------------------------------------------

# train smoke: the checklist's steps (build, snapshot, update, compare, sample) -------------------

@dataclass
class SmokeRun:
    """One trainer's train smoke in progress: what each step of the checklist reads and adds."""
    name: str
    args: Any
    device: Any
    result: dict[str, Any]
    checks: reporting.Checks = field(default_factory=reporting.Checks)
    timer: streams.Timer = field(default_factory=streams.Timer)
    trainer: Any = None
    groups: dict[str, list] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    frozen: list = field(default_factory=list)
    max_seq_len: int = 0

    @property
    def spec(self) -> trainers.TrainerSpec:
        return trainers.TRAINERS[self.name]


def build(run: SmokeRun, device_kwargs: dict, variants: list[str], after_build=None) -> bool:
    """Step 1: the tiny PaLM, a scalar RewardModel and the trainer; checks that the trainer was
    built, added its LoRA scope and holds its trainable tensors on the device. False when the
    constructor raised (recorded as the failed ``trainer_constructed`` check)."""
    from palm_rlhf_pytorch import PaLM, RewardModel

    args, spec, device = run.args, run.spec, run.device
    with run.timer.stage("construct", label="build the models and the trainer"):
        prompt_args, prompt_info = prompt_kwargs(args.prompt_style, args.seed, args.prompt_len)
        palm = PaLM(**palm_config(args)).to(device)
        reward_model = RewardModel(palm, num_binned_output=0).to(device)  # deep-copies palm
        if args.eos_token is not None:  # after that copy: the policy, not the reward model, ends early
            raise_logit(palm, args.eos_token, EOS_LOGIT_BIAS)
        if "prompt_token_ids" in prompt_args:
            prompt_args["prompt_token_ids"] = prompt_args["prompt_token_ids"].to(device)
        kwargs = dict(minibatch_size=SMOKE_MINIBATCH[spec.name], epochs=1, **SMOKE_EXTRA.get(spec.name, {}))
        if kwargs.get("partition_function_hidden_dim") == TINY_PALM["dim"]:  # FlowRL: must equal
            kwargs["partition_function_hidden_dim"] = args.dim                # the PaLM dim (--dim)
        if spec.group_kwarg:
            kwargs[spec.group_kwarg] = GROUP_SAMPLES
        if run.name == "grpo":
            for variant in variants:
                kwargs.update(GRPO_VARIANTS[variant])
        try:
            run.trainer = trainers.construct_trainer(spec, palm, reward_model, prompt_args, device_kwargs, device, **kwargs)
        except Exception as exc:  # the library's failure is this smoke's finding, not a crash
            run.result["timings_s"] = {"construct": None, "update": None, "generate": None}
            run.result.update(parameters=None, optimizer_steps=None, losses=None, generated=None)
            run.checks.add("trainer_constructed", False, exits.one_line(exc))
            return False
        if after_build is not None:
            after_build(run.name, run.trainer)

    trainer = run.trainer
    tokenizer = prompt_info.pop("tokenizer", None)
    if tokenizer is not None:
        prompt_info.update(count=int(trainer.prompt_token_ids.shape[0]),
                           max_len=int(trainer.prompt_token_ids.shape[1]),
                           dropped_empty=tokenizer.dropped_empty)
    run.groups = trainers.trainable_groups(run.name, trainer)
    trainable_ids = {id(p) for ps in run.groups.values() for p in ps}
    run.names = dict((id(p), n) for n, p in trainer.named_parameters())
    run.frozen = [(n, p) for n, p in trainer.named_parameters() if id(p) not in trainable_ids]
    run.result.update(
        class_name=spec.path, optimizer=spec.optimizer, prompts=prompt_info,
        grpo_variants=variants if run.name == "grpo" else None, group_size=smoke_group(spec))
    run.checks.add("trainer_constructed", True, f"{spec.module}.{spec.class_name} on {device}")
    run.checks.add("actor_lora_scope_added", "actor" in trainers.actor_palm(run.name, trainer).finetune_modules,
                   "the trainer added LoRA scope 'actor' to the PaLM passed in")
    n_trainable = sum(len(ps) for ps in run.groups.values())
    run.checks.add("trainable_parameters_on_device",
                   n_trainable > 0 and all(p.device.type == device.type for ps in run.groups.values() for p in ps),
                   f"{n_trainable} trainable tensors in groups {', '.join(run.groups)} on {device.type}")
    run.result["parameters"] = {
        "trainable_total": n_trainable,
        "trainable_numel": sum(p.numel() for ps in run.groups.values() for p in ps),
        "trainable_changed": None, "frozen_total": len(run.frozen), "frozen_changed": None}
    run.result["timings_s"] = {"construct": run.timer.stages["construct"], "update": None, "generate": None}
    run.result.update(optimizer_steps=None, losses=None, generated=None)
    return True


def snapshot(run: SmokeRun) -> tuple[dict[str, dict], dict]:
    """Step 2: clones of every trainable tensor (per group) and of every frozen one."""
    before = {key: snapshots.snapshot((run.names[id(p)], p) for p in ps) for key, ps in run.groups.items()}
    return before, snapshots.snapshot(run.frozen)


def update(run: SmokeRun) -> bool:
    """Step 3: one bounded ``train()`` (``--rollouts`` rollouts, one ``learn()``), counting optimizer
    steps and the completions the reward model scored per rollout; checks the update ran, the step
    count and the group size. False when ``train()`` raised (the failed ``update_ran`` check)."""
    name, spec, trainer, checks, args = run.name, run.spec, run.trainer, run.checks, run.args
    rollouts = args.rollouts or smoke_rollouts(spec)
    expected_steps = smoke_steps(spec, rollouts)
    run.max_seq_len = int(trainer.prompt_token_ids.shape[1]) + args.new_tokens
    step_counts = {key: 0 for key in trainers.optimizers(name, trainer)}
    for key, opt in trainers.optimizers(name, trainer).items():
        opt.register_step_post_hook(lambda *_, key=key: step_counts.__setitem__(key, step_counts[key] + 1))
    reward_batches: list[int] = []
    rollout_lengths: list[int] = []  # sequence length (prompt + sampled) the reward model scored per rollout
    with run.timer.stage("update", total=rollouts, unit="rollouts") as bar:
        def scored(_module, inputs, _output) -> None:  # returns None: the output is kept
            reward_batches.append(int(inputs[0].shape[0]))
            rollout_lengths.append(int(inputs[0].shape[-1]))
            if bar is not None:
                bar.update(1)

        def stepped(*_) -> None:
            if bar is not None:
                bar.set_postfix_str(f"learn() optimizer step {step_counts['actor']}/{expected_steps}")

        hooks = [trainers.unwrap(trainer, trainer.reward_model).register_forward_hook(scored),
                 trainers.optimizers(name, trainer)["actor"].register_step_post_hook(stepped)]
        printed, error = trainers.bounded_train(trainer, rollouts, run.max_seq_len, eos_token=args.eos_token)
    for hook in hooks:
        hook.remove()
    run.result["timings_s"]["update"] = run.timer.stages["update"]
    if args.verbose:
        streams.write_stderr(printed)
    run.result["losses"] = streams.parse_losses(printed)
    run.result["rollout_lengths"] = rollout_lengths
    run.result["optimizer_steps"] = {"expected": expected_steps, "required": spec.required_steps,
                                     "observed": step_counts, "rollouts": rollouts}
    if not checks.add("update_ran", error is None,
                      error or f"train(): {rollouts} rollouts, one learn(), max_seq_len {run.max_seq_len}"):
        return False
    checks.add("optimizer_steps", step_counts["actor"] == expected_steps >= spec.required_steps,
               f"actor optimizer stepped {step_counts['actor']}x (expected {expected_steps}, "
               f"{spec.optimizer} needs >= {spec.required_steps}); all: {step_counts}")
    checks.add("rollout_group_size", set(reward_batches) == {smoke_group(spec)},
               f"reward model scored {sorted(set(reward_batches))} completions per prompt per rollout "
               f"(expected {smoke_group(spec)}" + (f" = {spec.group_kwarg} + 1)" if spec.group_kwarg else ")"))
    if args.eos_token is not None:
        early = sum(n < run.max_seq_len for n in rollout_lengths)
        checks.add("rollouts_ended_at_eos", early > 0,
                   f"eos_token {args.eos_token}: rollout lengths {rollout_lengths} (max_seq_len {run.max_seq_len}); "
                   f"{early} ended at eos before max_seq_len")
    return True


def compare(run: SmokeRun, before: dict[str, dict], frozen_before: dict) -> None:
    """Step 4: every trainable tensor changed, no frozen one did, printed losses are finite; TPO's
    replay buffer is in the private directory; FlowRL's reference policy is the LoRA-off PaLM."""
    import torch
    name, trainer, checks, args = run.name, run.trainer, run.checks, run.args
    trainable_changed = 0
    for key, ps in run.groups.items():
        changed = snapshots.changed_names(before[key], ((run.names[id(p)], p) for p in ps))
        trainable_changed += len(changed)
        unchanged = sorted(set(before[key]) - set(changed))
        checks.add(f"{key}_changed", not unchanged,
                   f"{len(changed)}/{len(ps)} tensors changed"
                   + (f"; unchanged: {reporting.names_text(unchanged)}" if unchanged else ""))
    frozen_changed = snapshots.changed_names(frozen_before, run.frozen)
    reward_changed = [n for n in frozen_changed if n.startswith("reward_model.")]
    checks.add("base_weights_unchanged", not set(frozen_changed) - set(reward_changed),
               f"{len(run.frozen) - sum(n.startswith('reward_model.') for n, _ in run.frozen)} base PaLM tensors; "
               f"changed: {reporting.names_text(sorted(set(frozen_changed) - set(reward_changed)))}")
    checks.add("reward_model_unchanged", not reward_changed, f"changed: {reporting.names_text(reward_changed)}")
    run.result["parameters"].update(trainable_changed=trainable_changed, frozen_changed=len(frozen_changed))
    losses = run.result["losses"]
    values = [v for vs in losses.values() for v in vs]
    checks.add("losses_finite", streams.all_finite(losses),
               f"{len(values)} printed values ({', '.join(losses)})" if values else "no loss printed")
    if name == "tpo":
        buffer = Path(getattr(args, "tpo_buffer", TPO_BUFFER))  # ddp_launch.py: a per-rank folder
        size = sum(f.stat().st_size for f in buffer.rglob("*") if f.is_file()) if buffer.is_dir() else 0
        run.result["replay_buffer"] = {"path": f"./{buffer}", "bytes": size}
        checks.add("replay_buffer_in_private_dir",
                   buffer.is_dir() and Path.cwd().resolve() != Path(args.caller_dir).resolve(),
                   f"./{buffer} written in the private working directory ({size} bytes on disk), "
                   "removed with it")
    if name == "flowrl":
        palm_, probe = trainers.actor_palm(name, trainer), trainer.prompt_token_ids[:1]
        with torch.no_grad():  # after the update the actor's LoRA moved, so LoRA off must differ
            ref_differs = not torch.equal(trainer.palm(probe, finetune_scope=None),
                                          palm_(probe, finetune_scope="actor"))
        checks.add("reference_policy_is_lora_off_palm", trainer.palm is palm_ and ref_differs,
                   "learn() scores pi_ref with self.palm(..., finetune_scope=None): the actor's own "
                   f"PaLM (same object: {trainer.palm is palm_}) with LoRA off (logits differ from "
                   f"the actor's after the update: {ref_differs})")


def sample(run: SmokeRun) -> None:
    """Step 5: one ``trainer.generate()`` on the first prompt; checks shape, dtype, vocabulary and
    that the sequence starts with the prompt."""
    import torch
    trainer, checks, args = run.trainer, run.checks, run.args
    prompt = trainer.prompt_token_ids[0]
    prompt = prompt[prompt != byte_tokenizer.PAD_ID]
    with run.timer.stage("generate", label="generate (one trainer.generate() call)"):
        try:
            with streams.capture_library_output():
                sequence = trainer.generate(run.max_seq_len, prompt=prompt, num_samples=NUM_GENERATE_SAMPLES,
                                            eos_token=args.eos_token)
        except Exception as exc:
            sequence = None
            checks.add("generated_sequence", False, f"trainer.generate raised {exits.one_line(exc)}")
    run.result["timings_s"]["generate"] = run.timer.stages["generate"]
    if sequence is None:
        return
    expected_len = max(run.max_seq_len, prompt.shape[0] + 1)
    run.result["generated"] = {"shape": list(sequence.shape), "dtype": str(sequence.dtype).replace("torch.", ""),
                               "expected_shape": [expected_len], "prompt_len": int(prompt.shape[0])}
    in_vocab = bool(((sequence >= 0) & (sequence < TINY_PALM["num_tokens"])).all())
    # with eos, sampling stops once every sample holds it: shorter, but then it contains eos
    length_ok = (len(sequence) == expected_len if args.eos_token is None else
                 prompt.shape[0] < len(sequence) <= expected_len
                 and (len(sequence) == expected_len or bool((sequence == args.eos_token).any())))
    checks.add("generated_sequence",
               sequence.dim() == 1 and length_ok and sequence.dtype == torch.long and in_vocab
               and torch.equal(sequence[:prompt.shape[0]].cpu(), prompt.cpu()),
               f"shape {tuple(sequence.shape)} (prompt {prompt.shape[0]} + sampled"
               + (f", stops at eos {args.eos_token}" if args.eos_token is not None else "")
               + f"), {sequence.dtype}, ids in [0, {TINY_PALM['num_tokens']}): {in_vocab}, starts with the prompt")


def raise_logit(palm, token: int, bias: float) -> None:
    """Add ``bias`` to ``palm``'s logit for ``token`` on every forward (a forward hook on
    ``palm.to_logits``; no parameter changes): rollouts and learn() see the same policy."""
    import torch
    offset = torch.zeros(palm.to_logits.out_features)
    offset[token] = bias
    palm.to_logits.register_forward_hook(lambda _m, _inputs, logits: logits + offset.to(logits))


def eos_in_prompts(args) -> list[int]:
    """Indices of the prompts --prompt-style would give the trainers that contain --eos-token. palm.py
    ``generate`` tests the whole sequence, prompt included, for eos: such a rollout stops after
    one sampled token, replaced by the pad id."""
    prompt_args, _ = prompt_kwargs(args.prompt_style, args.seed, args.prompt_len)
    ids = prompt_args.get("prompt_token_ids")
    if ids is None:
        ids = prompt_args["tokenizer"](prompt_args.get("prompts") or PROMPTS_FILE.read_text(encoding="utf-8").split("\n"))
    return [i for i, row in enumerate(ids.tolist()) if args.eos_token in row]


def run_trainer(name: str, args, device_kwargs: dict, device, variants: list[str],
                after_build=None, progress: streams.Progress | None = None) -> dict[str, Any]:
    """The train smoke of one trainer, step by step: build, snapshot, update, compare, sample;
    ``--construct-only`` stops after build. Returns its report entry.

    ``after_build(name, trainer)``, when given, runs right after construction (the multi-process
    worker in ddp_launch.py applies its DDP fixes and per-rank seeding there). With ``progress``
    each timed step is a progress line on stderr."""
    from accelerate.utils import set_seed

    run = SmokeRun(name, args, device, {"trainer": name, "status": "failed", "mode": mode_name(args)},
                   timer=streams.Timer(progress, name))
    set_seed(args.seed)
    if not build(run, device_kwargs, variants, after_build) or args.construct_only:
        return finish(run.result, run.checks)
    before, frozen_before = snapshot(run)
    if update(run):
        compare(run, before, frozen_before)
        sample(run)
    return finish(run.result, run.checks)


# learning check: the steps are build, measure, train, measure ------------------------------------

def rule_reward_module():
    """reward-modeling/scripts/rule_reward.py (it imports torch, so only when the check runs)."""
    import rule_reward
    return rule_reward


def learn_trainer_kwargs(spec: trainers.TrainerSpec, setting: LearnSetting) -> dict[str, Any]:
    """Constructor arguments of one trainer for the learning check."""
    kwargs = dict(minibatch_size=setting.minibatch_size, epochs=1, actor_lr=setting.lr, **SMOKE_EXTRA.get(spec.name, {}))
    if spec.name == "ppo":
        kwargs["critic_lr"] = setting.lr
    if spec.name == "flowrl":
        kwargs.update(partition_function_hidden_dim=LEARN_PALM["dim"], partition_function_lr=setting.lr)
    if spec.group_kwarg:
        kwargs[spec.group_kwarg] = setting.group_size - 1
    return kwargs


def held_out(name: str, trainer, reward_model, prompts, seed: int) -> float:
    """The learning check's held-out reward: ``evaluation.held_out_reward`` of the trainer's policy
    (its LoRA scope) on ``prompts`` (p, LEARN_PROMPT_LEN), LEARN_EVAL_SAMPLES samples each, as long
    as a rollout (LEARN_PROMPT_LEN + LEARN_NEW_TOKENS)."""
    return evaluation.held_out_reward(trainers.actor_palm(name, trainer), trainers.actor_scope(name, trainer),
                                      reward_model, prompts, LEARN_EVAL_SAMPLES,
                                      LEARN_PROMPT_LEN + LEARN_NEW_TOKENS, seed)


def learn_seed(name: str, seed: int, control: str | None, device_kwargs: dict, device,
               setting: LearnSetting | None = None, train_score=None) -> dict[str, Any]:
    """One seed of the learning check: build, measure held-out reward, train, measure again.

    Seeds ``random``, numpy and torch with ``seed`` (Accelerate ``set_seed``), draws the training
    and held-out prompts, builds the tiny PaLM, the rule-based reward (the target-id fraction; under
    ``control == 'inverted'`` 1 - that fraction: negated, plus 1 to stay inside PPO's critic range
    [0, 5]) and the trainer (under ``'frozen'`` its optimizers' learning rates then set to 0), and
    runs ``setting.episodes`` x (``setting.rollouts`` rollouts + one ``learn()``). Returns ``{seed,
    reward_before, reward_after, gain, curve}``: held-out rewards in [0, 1] and ``curve``, the mean
    rollout reward of each episode (the policy after 0, 1, ... learn() calls).

    calibrate_learning.py only: ``control == 'negated'`` rewards minus the fraction, in [-1, 0];
    ``train_score(x, response_mask) -> (b,)`` replaces the reward the trainer optimizes (its noise
    null) while the held-out reward stays the task's.
    Raises RuntimeError ``seed N: Type: message`` when the library raises.
    """
    import torch
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM

    spec, setting = trainers.TRAINERS[name], setting or LEARN_SETTINGS[name]
    rules = rule_reward_module()
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, LEARN_PALM["num_tokens"], (LEARN_TRAIN_PROMPTS + LEARN_EVAL_PROMPTS,
                                                          LEARN_PROMPT_LEN), generator=gen).to(device)
    train_prompts, eval_prompts = prompts[:LEARN_TRAIN_PROMPTS], prompts[LEARN_TRAIN_PROMPTS:]
    fraction = rules.token_fraction(LEARN_TARGET_IDS)
    score = {"inverted": lambda x, response: 1.0 - fraction(x, response),
             "negated": lambda x, response: -fraction(x, response)}.get(control, fraction)
    reward_model = rules.RuleReward(score)
    trained_reward = rules.RuleReward(train_score) if train_score else reward_model
    try:
        trainer = trainers.construct_trainer(spec, PaLM(**LEARN_PALM).to(device), trained_reward,
                                    {"prompt_token_ids": train_prompts}, device_kwargs, device,
                                    **learn_trainer_kwargs(spec, setting))
    except Exception as exc:
        raise RuntimeError(f"seed {seed}: {exits.one_line(exc)}") from None
    if control == "frozen":  # AdoptAtan2 and AdamAtan2 assert lr > 0 when built: set it to 0 after
        for optimizer in trainers.optimizers(name, trainer).values():
            for group in optimizer.param_groups:
                group["lr"] = 0.0
    before = held_out(name, trainer, reward_model, eval_prompts, seed)
    rewards: list[float] = []
    hook = trained_reward.register_forward_hook(lambda _m, _i, out: rewards.append(float(out.mean())))
    _, error = trainers.bounded_train(trainer, setting.rollouts, LEARN_PROMPT_LEN + LEARN_NEW_TOKENS, setting.episodes)
    hook.remove()
    if error:
        raise RuntimeError(f"seed {seed}: {error}")
    after = held_out(name, trainer, reward_model, eval_prompts, seed)
    n = setting.rollouts
    curve = [sum(rewards[e * n:(e + 1) * n]) / n for e in range(setting.episodes)]
    return {"seed": seed, "reward_before": before, "reward_after": after, "gain": after - before,
            "curve": curve}


def learning_verdict(per_seed: list[dict[str, Any]], threshold: float) -> tuple[bool, str]:
    """The criterion: at least ceil(LEARN_MIN_IMPROVED * seeds) seeds raised their held-out reward
    (gain > 0) and the median gain is at least ``threshold``. Returns (passed, detail)."""
    import statistics
    gains = [s["gain"] for s in per_seed]
    need = math.ceil(LEARN_MIN_IMPROVED * len(gains))
    improved, median = sum(g > 0 for g in gains), statistics.median(gains)
    passed = improved >= need and median >= threshold
    figures = ", ".join(f"{s['seed']}: {s['reward_before']:.3f} -> {s['reward_after']:.3f}" for s in per_seed)
    missed = lambda ok: "" if ok else ": missed"  # which criterion failed, so a failure never reads as a pass
    return passed, (f"{improved}/{len(gains)} seeds improved (need {need}{missed(improved >= need)}), median gain "
                    f"{median:+.3f} (threshold {threshold}{missed(median >= threshold)}); held-out reward per seed "
                    f"{figures}")


def learn_trainer(name: str, seeds: list[int], control: str | None, device_kwargs: dict, device,
                  setting: LearnSetting | None = None, progress: streams.Progress | None = None) -> dict[str, Any]:
    """The learning check of one trainer over ``seeds``; returns its report entry with
    ``learning: {reward_before, reward_after, per_seed, curve, threshold, passed}`` (means over the
    seeds, rounded to 4 places) and the check ``reward_rose``. With ``progress``, a line that
    counts the seeds."""
    spec, setting = trainers.TRAINERS[name], setting or LEARN_SETTINGS[name]
    checks, timer = reporting.Checks(), streams.Timer(progress, name)
    result: dict[str, Any] = {"trainer": name, "status": "failed", "mode": "learn",
                              "class_name": spec.path,
                              "settings": dict(vars(setting)), "learning": None}
    per_seed = []
    with timer.stage("learn", total=len(seeds), unit="seeds",
                     label=f"learning check ({setting.episodes} learn() calls per seed)") as bar:
        try:
            for seed in seeds:
                per_seed.append(learn_seed(name, seed, control, device_kwargs, device, setting))
                if bar is not None:
                    bar.update(1)
        except RuntimeError as exc:
            checks.add("learning_ran", False, str(exc))
    result["timings_s"] = {"learn": timer.stages["learn"]}
    if checks.items:
        return finish(result, checks)
    mean = lambda values: round(sum(values) / len(values), 4)
    passed, detail = learning_verdict(per_seed, setting.threshold)
    result["learning"] = {
        "reward_before": mean([s["reward_before"] for s in per_seed]),
        "reward_after": mean([s["reward_after"] for s in per_seed]),
        "per_seed": [{k: round(s[k], 4) if k != "seed" else s[k] for k in ("seed", "reward_before", "reward_after", "gain")}
                     for s in per_seed],
        "curve": [mean(values) for values in zip(*(s["curve"] for s in per_seed))],
        "threshold": setting.threshold, "passed": passed}
    checks.add("reward_rose", passed, detail)
    return finish(result, checks)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], low: float, high: float) -> str:
    """One character per value, ``low`` -> '▁' and ``high`` -> '█' (clamped)."""
    span = (high - low) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, max(0, round((v - low) / span * (len(SPARKS) - 1))))]
                   for v in values)


def finish(result: dict[str, Any], checks: reporting.Checks) -> dict[str, Any]:
    result["checks"] = checks.items
    result["status"] = reporting.status_of(checks.items)
    return result


def palm_config(args) -> dict[str, int]:
    """PaLM keyword arguments: the tiny config with --dim and --depth applied."""
    return {**TINY_PALM, "dim": args.dim, "depth": args.depth}


def mode_name(args) -> str:
    return "learn" if args.learn else "construct-only" if args.construct_only else "train-smoke"


def learn_seeds(args) -> list[int]:
    """The seeds of a --learn run: --seed to --seed + --learn-seeds - 1."""
    return list(range(args.seed, args.seed + (args.learn_seeds or LEARN_SEEDS)))


def learn_config(args, cpu_threads: int) -> dict[str, Any]:
    """The toy task, seeds and control of a --learn run, for its report."""
    seeds = learn_seeds(args)
    return {**LEARN_PALM, "prompt_len": LEARN_PROMPT_LEN, "new_tokens": LEARN_NEW_TOKENS,
            "target_ids": list(LEARN_TARGET_IDS), "train_prompts": LEARN_TRAIN_PROMPTS,
            "eval_prompts": LEARN_EVAL_PROMPTS, "eval_samples": LEARN_EVAL_SAMPLES,
            "seeds": seeds, "min_improved": math.ceil(LEARN_MIN_IMPROVED * len(seeds)),
            "control": args.learn_control, "cpu_threads": cpu_threads}


# Single trainer: these keys of its result also appear at the top level of the report (stable keys).
SINGLE_TRAINER_KEYS = ("checks", "parameters", "generated", "optimizer_steps", "losses", "prompts",
                       "grpo_variants", "class_name", "replay_buffer", "rank_sync", "settings", "learning")


def trainers_report(args, results: dict[str, dict[str, Any]], device, cpu_threads: int) -> dict[str, Any]:
    """The report's part common to single- and multi-process runs (ddp_launch.py's rank 0).

    ``results`` maps trainer name to its result (``run_trainer``); status is ok when every result
    is. ``timings_s`` holds construct, update and generate in seconds (--learn: learn), summed over
    trainers, each None when a trainer never reached that stage (a constructor raised; --construct-only).
    """
    def stage_sum(key: str) -> float | None:
        values = [r["timings_s"].get(key) for r in results.values()]
        return None if any(v is None for v in values) else round(sum(values), 4)

    report: dict[str, Any] = {
        "status": "ok" if results and all(r["status"] == "ok" for r in results.values()) else "failed",
        "mode": mode_name(args), "trainer": args.trainer, "device": str(device), "seed": args.seed,
        "config": learn_config(args, cpu_threads) if args.learn else {
            **palm_config(args), "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
            "cpu_threads": cpu_threads},
        "timings_s": {key: stage_sum(key) for key in (("learn",) if args.learn else ("construct", "update", "generate"))},
    }
    if args.trainer != "all":
        single = results[args.trainer]
        report.update({key: single[key] for key in SINGLE_TRAINER_KEYS if key in single})
    report["results"] = results
    return report


def trainer_headline(result: dict[str, Any]) -> str:
    """One trainer's line: its checks counted, then what it did, in plain words."""
    head = f"{result['trainer']} ({result.get('class_name') or 'not built'}): {reporting.passed_count(result['checks'])}"
    learning, params, steps = result.get("learning"), result.get("parameters"), result.get("optimizer_steps")
    if learning:
        curve = learning["curve"]
        return (head + f"; held-out reward {learning['reward_before']:.2f} -> {learning['reward_after']:.2f} "
                f"(mean of {len(learning['per_seed'])} seeds), training reward per episode "
                f"{sparkline(curve, 0.0, 1.0)} {curve[0]:.2f} -> {curve[-1]:.2f}")
    if steps:
        generated = result.get("generated")
        n = steps["observed"]["actor"]
        head += (f"; {n} optimizer step{'s' if n != 1 else ''} changed {params['trainable_changed']} of "
                 f"{params['trainable_total']} trainable tensors and {params['frozen_changed']} frozen ones")
        if generated:
            sampled = generated["shape"][0] - generated["prompt_len"]
            head += (f"; generated {generated['shape'][0]} token ids ({generated['prompt_len']} of the prompt "
                     f"+ {sampled} sampled)")
    elif params and result.get("mode") == "construct-only":
        head += "; built, not trained (--construct-only)"
    return head


def next_step(report: dict[str, Any]) -> str:
    """The natural next command after a passing run, written the way this run was started."""
    mode, trainer = report["mode"], report["trainer"]
    if mode == "construct-only":
        return reporting.command("tiny-rlhf-smoke", f"--trainer {trainer}")
    if mode == "train-smoke" and trainer != "all":
        return reporting.command("tiny-rlhf-smoke", "--trainer all")
    if mode == "train-smoke" and "launcher" not in report:
        return reporting.command("tiny-rlhf-smoke", "--learn --trainer all")
    if mode == "learn" and (trainer != "all" or report["config"]["control"]):
        return reporting.command("tiny-rlhf-smoke", "--learn --trainer all")
    return (reporting.command("palm-rlhf-skill plan", "--config YOUR_RUN.toml")
            + " (your run's time, memory and learn() calls before it starts: workflows.md#plan-a-run)")


def summary(report: dict[str, Any]) -> str:
    """The plain report: per trainer a headline and its failing checks in full (each with the doc
    section that explains it), timings, warnings, and last the verdict with the next step."""
    lines = []
    for result in report.get("results", {}).values():
        lines.append(trainer_headline(result))
        lines += reporting.check_lines(result["checks"])
    if not report.get("results"):  # --nproc: no rank reported
        lines += reporting.check_lines(report.get("checks", []))
    t = report["timings_s"]
    lines.append(reporting.timings_line(t))
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    what = {"learn": "learning check", "train-smoke": "train smoke", "construct-only": "construct-only smoke"}[report["mode"]]
    trainers = "every trainer" if report["trainer"] == "all" else report["trainer"]
    nproc = report.get("nproc") or (report.get("launcher") or {}).get("nproc")  # launcher's: no rank reported
    where = reporting.device_words(report["device"]) + (f", {nproc} processes" if nproc else "")
    control = report.get("config", {}).get("control") if report["mode"] == "learn" else None
    if report["status"] == "ok":
        lines.append(f"tiny-rlhf-smoke: OK: the {what} passed for {trainers} on {where} (exit 0)"
                     + (f", control {control}" if control else "") + f"; next: {next_step(report)}")
        return "\n".join(lines)
    failed = [c for r in report.get("results", {}).values() for c in r["checks"] if not c["passed"]]
    failed = failed or [c for c in report.get("checks", []) if not c["passed"]]
    bad = [r["trainer"] for r in report.get("results", {}).values() if r["status"] != "ok"]
    first = reporting.CHECK_DOCS.get(failed[0]["name"], reporting.REPORTS) if failed else reporting.REPORTS
    head = f"tiny-rlhf-smoke: FAILED: the {what} failed for {', '.join(bad) or 'the run'} on {where} (exit 1)"
    if control == "frozen" and failed and all(c["name"] == "reward_rose" for c in failed):
        # the control's one expected failure (workflows.md#learning-check): nothing to read or fix
        lines.append(f"{head}, the expected result of the frozen control (every learning rate 0, so no reward "
                     f"can rise: this shows the check can fail); next: run the check itself, "
                     + reporting.command("tiny-rlhf-smoke", f"--learn --trainer {report['trainer']}"))
    else:
        lines.append(f"{head}; next: read {first}")
    return "\n".join(lines)


def estimate_s(args) -> float:
    """Predicted wall seconds of the run after the imports (see ESTIMATE_* and LEARN_SECONDS_PER_SEED):
    --learn, seeds x seconds per seed; the train smoke, per trainer the rollouts' sampling steps and
    the forwards' multiply-adds (``ddp_launch.palm_weights``; attention 4 * depth * heads * dim_head
    per squared position); --construct-only, 0."""
    names = list(trainers.TRAINERS) if args.trainer == "all" else [args.trainer]
    if args.learn:
        return len(learn_seeds(args)) * sum(LEARN_SECONDS_PER_SEED[n] for n in names)
    if args.construct_only:
        return 0.0
    config = palm_config(args)
    weights = ddp_launch.palm_weights(config)
    attention = 4 * config["depth"] * config["heads"] * config["dim_head"]
    prompt = args.prompt_len or sum(PROMPT_LENGTHS) // 2
    length = (args.prompt_len or PROMPT_LENGTHS[1]) + args.new_tokens  # max_seq_len
    sampled = sum(weights * n + attention * n * n for n in range(prompt, length))
    full = weights * length + attention * length * length
    total = 0.0
    for name in names:
        spec = trainers.TRAINERS[name]
        rollouts = args.rollouts or smoke_rollouts(spec)
        stored = rollouts * smoke_group(spec) + smoke_steps(spec, rollouts) * SMOKE_MINIBATCH[spec.name]
        total += (ESTIMATE_ROLLOUT_S * rollouts + ESTIMATE_LAYER_STEP_S * rollouts * (length - prompt) * config["depth"]
                  + ESTIMATE_MULTIPLY_S * (rollouts * smoke_group(spec) * sampled + ESTIMATE_FULL_FORWARDS * stored * full))
    return total


def announce_estimate(args, progress: streams.Progress, extra: str = "") -> None:
    """The estimate line, before a run predicted to take more than ESTIMATE_NOTE_S."""
    seconds = estimate_s(args)
    if seconds > ESTIMATE_NOTE_S:
        basis = ("calibrate_learning.py's seconds per seed, measured on a busy 2-CPU machine" if args.learn else
                 "fitted to the measured table of references/sizing.md; a busy machine takes longer")
        progress.note(f"this run should take about {reporting.seconds_text(seconds)} after the imports{extra} ({basis})")


def check_learn_options(args) -> None:
    """Usage errors (exit 2) for options that do not fit --learn, or learn options without it."""
    if not args.learn:
        for option, value in (("--learn-control", args.learn_control), ("--learn-seeds", args.learn_seeds)):
            if value is not None:
                raise exits.SkillError(f"{option} applies to --learn")
        return
    for option, used in (("--grpo-variant", args.grpo_variant), ("--rollouts", args.rollouts is not None),
                         ("--prompt-style", args.prompt_style != "token-ids"),
                         ("--prompt-len", args.prompt_len is not None), ("--nproc", args.nproc is not None),
                         ("--no-ddp-fixes", args.no_ddp_fixes), ("--eos-token", args.eos_token is not None),
                         ("--oversubscribe", args.oversubscribe), ("--dim", args.dim != TINY_PALM["dim"]),
                         ("--verbose", args.verbose),
                         ("--dist-timeout", args.dist_timeout != ddp_launch.DIST_TIMEOUT_S),
                         ("--depth", args.depth != TINY_PALM["depth"]), ("--new-tokens", args.new_tokens != NEW_TOKENS)):
        if used:
            raise exits.SkillError(f"{option} applies to the train smoke, not --learn (its toy task is fixed: "
                                "references/workflows.md#learning-check)")
    last = learn_seeds(args)[-1]
    if last > options.MAX_SEED:
        raise exits.SkillError(f"--seed {args.seed} leaves no room for the learning check's seeds up to {last} "
                            f"(at most {options.MAX_SEED})")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.grpo_variant and args.trainer not in ("grpo", "all"):
        raise exits.SkillError("--grpo-variant applies to --trainer grpo or all")
    variants = parse_variants(args.grpo_variant)
    if args.construct_only and args.rollouts is not None:
        raise exits.SkillError("--rollouts applies to the train smoke, not --construct-only")
    if args.prompt_len is not None and args.prompt_style != "token-ids":
        raise exits.SkillError("--prompt-len applies to --prompt-style token-ids")
    check_learn_options(args)
    world = ddp_launch.launcher_world()  # one rank of torchrun / accelerate launch / srun?
    ddp_launch.check_options(args, world)
    if args.learn and world is not None:
        raise exits.SkillError("--learn runs in one process: start it without torchrun, accelerate launch or srun")
    env = version_gate.check_versions(args.allow_untested)
    if args.prompt_style != "token-ids":  # a damaged prompts file: one error line, before any progress
        prompt_kwargs(args.prompt_style, args.seed)
    if args.eos_token is not None and args.new_tokens < 2:
        raise exits.SkillError("--eos-token needs --new-tokens 2 or more: with 1, a rollout of the longest prompt "
                            "samples one token and cannot end at eos before max_seq_len, so the check "
                            "rollouts_ended_at_eos would pass or fail by chance")
    clashes = eos_in_prompts(args) if args.eos_token is not None else []
    if clashes:
        other = ("choose another id or --seed" if args.prompt_style == "token-ids" else
                 f"choose another id (the prompts of --prompt-style {args.prompt_style} do not depend on --seed)")
        raise exits.SkillError(f"--eos-token {args.eos_token} occurs in prompt(s) {clashes} of "
                            f"--prompt-style {args.prompt_style}: generate() would stop after one token "
                            f"(it looks for eos in the prompt too); {other}")
    if world is not None:  # a launcher started this process: run as one rank of its world
        return ddp_launch.run_rank(sys.modules[__name__], args, env, world)
    progress = streams.Progress("tiny-rlhf-smoke", not args.json or args.progress)
    if args.nproc is not None:  # the one-machine shortcut: torchrun on this smoke, N ranks
        return ddp_launch.launch(sys.modules[__name__], args, sys.argv[1:] if argv is None else argv, env, progress)

    timer = streams.Timer(progress)
    with timer.stage("import", label="import torch, palm-rlhf-pytorch and accelerate"):
        import torch  # noqa: F401  (the import floor, timed)
        import palm_rlhf_pytorch  # noqa: F401
        import accelerate  # noqa: F401
    device_kwargs, device = placement.resolve_device(args.device)
    if device.type == "cpu" and not args.learn:  # the --learn toy task is fixed and tiny
        ddp_launch.check_resources(None, "cpu", palm_config(args), args.oversubscribe)
    announce_estimate(args, progress)
    names = list(trainers.TRAINERS) if args.trainer == "all" else [args.trainer]
    args.caller_dir = os.getcwd()
    caller_before = workspace.watch_directory(args.caller_dir)
    with workspace.private_workdir(), placement.torch_threads(args.cpu_threads) as threads:
        if args.learn:
            results = {name: learn_trainer(name, learn_seeds(args), args.learn_control, device_kwargs, device,
                                           progress=progress) for name in names}
        else:
            results = {name: run_trainer(name, args, device_kwargs, device, variants, progress=progress)
                       for name in names}
    workdir_check = workspace.caller_directory_check(args.caller_dir, caller_before)
    for result in results.values():
        result["checks"].append(workdir_check)
        result["status"] = reporting.status_of(result["checks"])
    report = trainers_report(args, results, device, threads)
    report.update(versions=env["versions"], tested=env["tested"], warnings=env["warnings"])
    report["timings_s"] = {"import": timer.stages["import"], **report["timings_s"]}
    report["timings_s"]["total"] = round(time.perf_counter() - START, 4)
    return runner.emit(report, args.json, summary, exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED)


START = time.perf_counter()

if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
