#!/usr/bin/env python3
"""Tiny, bounded RLHF smoke for palm-rlhf-pytorch: PPO, GRPO, TPO and FlowRL.

Builds a tiny PaLM policy and a scalar RewardModel on the auto-selected device, constructs the
chosen trainer, runs one bounded ``train()`` call whose single ``learn()`` performs enough optimizer
steps for every trainable tensor to move, then one ``trainer.generate()`` call, and checks what
changed and what must not have.

Usage:
    tiny_rlhf_smoke.py                                  # PPO train smoke, summary on stderr
    tiny_rlhf_smoke.py --json                           # one JSON object on stdout
    tiny_rlhf_smoke.py --trainer all --json             # PPO, GRPO, TPO and FlowRL in one process
    tiny_rlhf_smoke.py --trainer grpo --grpo-variant dr-grpo
    tiny_rlhf_smoke.py --construct-only --device cpu
    tiny_rlhf_smoke.py --prompt-style text              # raw-text prompts via prompts=
    tiny_rlhf_smoke.py --prompt-style file              # the same file via prompts_path=
    tiny_rlhf_smoke.py --trainer all --nproc 2 --json   # 2 DDP processes, ranks checked in sync
    tiny_rlhf_smoke.py --dim 128 --depth 2 --prompt-len 16 --new-tokens 32   # a bigger smoke

Runs inside a private temporary directory and leaves nothing in the caller's directory.
The JSON schema and exit codes are documented in references/workflows.md.
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
import skill_runtime as rt  # noqa: E402  (shared runtime at the skill root, imported by path)

HERE = Path(__file__).resolve().parent
PROMPTS_FILE = HERE.parent / "assets" / "prompts.txt"
# the TPO replay-buffer folder name: one fact, kept with the DDP fixes (torch-free at import)
TPO_BUFFER = rt.load_by_path("ddp_fixes", HERE / "ddp_fixes.py").TPO_BUFFER
# multi-process mode: a launcher's rank, --nproc and their options (torch-free at import)
ddp_launch = rt.load_by_path("ddp_launch", HERE / "ddp_launch.py")

# Tiny model: big enough to exercise every code path, small enough for a laptop CPU.
TINY_PALM = dict(num_tokens=257, dim=32, depth=1, heads=2, dim_head=16)
NEW_TOKENS = 8         # tokens sampled after the longest prompt
PROMPT_LENGTHS = (3, 6)  # random token-ids prompt lengths, inclusive
GROUP_SAMPLES = 3      # extra samples per prompt for GRPO/TPO/FlowRL: group size = 3 + 1
NUM_GENERATE_SAMPLES = 2

# Optimizer steps before every trainable tensor has moved. LoRA B starts at zero, so LoRA A gets a
# nonzero gradient only after B has moved once. AdoptAtan2 (arXiv 2411.02853, Algorithm 3) only
# initialises its second moment on step 1, so it needs 3 steps; AdamAtan2 moves on step 1: 2 steps.
REQUIRED_STEPS = {"AdoptAtan2": 3, "AdamAtan2": 2}

# Bounds that keep the smoke a smoke: a usage error (exit 2) beyond them, before torch is imported.
MAX_ROLLOUTS, MAX_DIM, MAX_DEPTH, MAX_TOKENS = 1000, 8192, 64, 4096
# --eos-token: an untrained 257-token PaLM almost never samples one chosen id, so the smoke adds this
# to the policy's logit for it (a forward hook on to_logits): about 0.4 per sampled token at the tiny
# sizes (measured: 0.37-0.45 at dim 32 and 128), so rollouts end at eos at varying lengths.
EOS_LOGIT_BIAS = 3.0

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


@dataclass(frozen=True)
class TrainerSpec:
    """How to build and bound one trainer; facts from palm_rlhf_pytorch 0.8.0 source."""
    name: str
    module: str
    class_name: str
    optimizer: str                 # class of the actor optimizer in the trainer's __init__
    group_kwarg: str | None        # constructor argument for extra samples per prompt
    minibatch_size: int
    items_per_rollout: int         # learn() items one rollout stores (TPO stores one group)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def group_size(self) -> int:
        return GROUP_SAMPLES + 1 if self.group_kwarg else 1

    @property
    def required_steps(self) -> int:
        return REQUIRED_STEPS[self.optimizer]

    def rollouts_for(self, steps: int, epochs: int = 1) -> int:
        """Rollouts per learn() so that learn() performs at least ``steps`` optimizer steps."""
        return math.ceil(steps * self.minibatch_size / (self.items_per_rollout * epochs))

    def steps_for(self, rollouts: int, epochs: int = 1) -> int:
        """Optimizer steps of one learn() over ``rollouts`` rollouts: epochs * ceil(items / minibatch)."""
        return epochs * math.ceil(rollouts * self.items_per_rollout / self.minibatch_size)


TRAINERS = {
    "ppo": TrainerSpec("ppo", "palm_rlhf_pytorch", "RLHFTrainer", "AdoptAtan2", None, 2, 1,
                       {"max_norm": None}),
    "grpo": TrainerSpec("grpo", "palm_rlhf_pytorch.grpo", "RLHFTrainer", "AdoptAtan2",
                        "grpo_num_times_sample_rewards", 4, GROUP_SAMPLES + 1),
    "tpo": TrainerSpec("tpo", "palm_rlhf_pytorch.tpo", "RLHFTrainer", "AdamAtan2",
                       "num_times_sample_rewards", 1, 1),
    "flowrl": TrainerSpec("flowrl", "palm_rlhf_pytorch.flowrl", "FlowRLTrainer", "AdoptAtan2",
                          "flowrl_num_times_sample", 4, GROUP_SAMPLES + 1,
                          {"partition_function_hidden_dim": TINY_PALM["dim"]}),
}


def build_parser() -> rt.OneLineParser:
    parser = rt.OneLineParser(
        description="Bounded RLHF smoke for palm-rlhf-pytorch: build a tiny PaLM policy, a scalar "
                    "reward model and a trainer, run one update that must move every trainable "
                    "weight, one generate call, and check the results.",
        epilog="examples:\n"
               "  tiny-rlhf-smoke --json\n"
               "  tiny-rlhf-smoke --trainer all --json\n"
               "  tiny-rlhf-smoke --trainer grpo --grpo-variant spo\n"
               "  tiny-rlhf-smoke --construct-only --device cpu\n"
               "  tiny-rlhf-smoke --prompt-style file\n"
               "  tiny-rlhf-smoke --trainer all --nproc 2 --json\n"
               "  tiny-rlhf-smoke --trainer all --nproc 2 --eos-token 3 --json\n"
               "  torchrun --nproc-per-node 2 tiny_rlhf_smoke.py --trainer all --json\n"
               "  tiny-rlhf-smoke --dim 128 --depth 2 --prompt-len 16 --new-tokens 32\n\n"
               + rt.EXIT_CODES_EPILOG)
    parser.add_argument("--trainer", choices=[*TRAINERS, "all"], default="ppo",
                        help="ppo (root RLHFTrainer), grpo, tpo, flowrl, or all four (default: ppo)")
    parser.add_argument("--grpo-variant", action="append", metavar="NAME",
                        help="GRPO advantage/objective variant: " + ", ".join(GRPO_VARIANTS)
                             + "; repeat or comma-separate to combine (default: default)")
    rt.add_common_options(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--construct-only", action="store_true",
                      help="stop after building the models and trainer")
    mode.add_argument("--train-smoke", action="store_true",
                      help="build, run one bounded update and one generate call (the default)")
    parser.add_argument("--prompt-style", choices=["token-ids", "text", "file"], default="token-ids",
                        help="token-ids: padded prompt_token_ids; text: prompts= with a byte-level "
                             "tokenizer; file: prompts_path= to the shipped prompts file")
    parser.add_argument("--rollouts", type=rt.bounded_int(1, MAX_ROLLOUTS), metavar="N",
                        help="rollouts before the single learn() (default: computed so every "
                             "trainable tensor moves; fewer makes the weight checks fail)")
    parser.add_argument("--eos-token", type=rt.bounded_int(1, TINY_PALM["num_tokens"] - 1), metavar="ID",
                        help="pass eos_token=ID to train() and generate(); the tiny policy's logit for ID "
                             f"is raised by {EOS_LOGIT_BIAS} so rollouts end at eos at varying lengths "
                             "(0 is the pad id; no prompt may contain ID)")
    ddp_launch.add_options(parser)
    size = parser.add_argument_group("model size (to size a bigger smoke; defaults: the tiny config)")
    size.add_argument("--dim", type=rt.bounded_int(1, MAX_DIM), default=TINY_PALM["dim"], metavar="N",
                      help=f"PaLM model dimension (default: {TINY_PALM['dim']})")
    size.add_argument("--depth", type=rt.bounded_int(1, MAX_DEPTH), default=TINY_PALM["depth"], metavar="N",
                      help=f"PaLM layers (default: {TINY_PALM['depth']})")
    size.add_argument("--prompt-len", type=rt.bounded_int(1, MAX_TOKENS), metavar="N",
                      help="every token-ids prompt exactly N tokens (default: random "
                           f"{PROMPT_LENGTHS[0]}-{PROMPT_LENGTHS[1]})")
    size.add_argument("--new-tokens", type=rt.bounded_int(1, MAX_TOKENS), default=NEW_TOKENS, metavar="N",
                      help=f"tokens sampled per rollout: max_seq_len = longest prompt + N (default: {NEW_TOKENS})")
    parser.add_argument("--verbose", action="store_true",
                        help="echo the library's own prints (losses) to stderr")
    return parser


def parse_variants(values: list[str] | None) -> list[str]:
    """Split and validate --grpo-variant values; raise SkillError(2) for unknown or refused ones."""
    names = [v.strip() for value in (values or ["default"]) for v in value.split(",") if v.strip()]
    if not names:
        raise rt.SkillError("--grpo-variant needs a name: " + ", ".join(GRPO_VARIANTS))
    unknown = [n for n in names if n not in GRPO_VARIANTS]
    if unknown:
        raise rt.SkillError(f"unknown --grpo-variant {', '.join(unknown)}; choose from {', '.join(GRPO_VARIANTS)}")
    names = [n for n in dict.fromkeys(names) if n != "default"] or ["default"]
    for a, b, reason in GRPO_INCOMPATIBLE:
        if a in names and b in names:
            raise rt.SkillError(f"--grpo-variant {a} with {b} is refused: the library says '{reason}' "
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
    return ids.masked_fill(~keep, rt.PAD_ID)


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
        raise rt.SkillError(f"prompts file unreadable: {PROMPTS_FILE}: {rt.one_line(exc)} "
                            "(reinstall the skill tree)") from None
    if not any(p.strip() for p in prompts):
        raise rt.SkillError(f"prompts file has no non-empty line: {PROMPTS_FILE} (reinstall the skill tree)")
    tokenizer = rt.ByteTokenizer()
    if style == "text":
        return {"prompts": prompts, "tokenizer": tokenizer}, {"style": style, "tokenizer": tokenizer}
    return ({"prompts_path": str(PROMPTS_FILE), "tokenizer": tokenizer},
            {"style": style, "tokenizer": tokenizer, "path": PROMPTS_FILE.name})


# one trainer -----------------------------------------------------------------------------------

def unwrap(trainer, module):
    return trainer.accelerate.unwrap_model(module)


def trainable_groups(name: str, trainer) -> dict[str, list]:
    """The library's own trainable parameter lists, per group, for one trainer."""
    if name == "ppo":
        ac = unwrap(trainer, trainer.actor_critic)
        critic_lora = list(ac.critic.finetune_parameters(ac.critic_lora_scope))
        return {"actor_lora": list(ac.actor_parameters()), "critic_lora": critic_lora,
                "value_head": list(ac.value_head.parameters())}
    groups = {"actor_lora": list(unwrap(trainer, trainer.actor).parameters())}
    if name == "flowrl":
        groups["partition_function"] = list(unwrap(trainer, trainer.partition_function).parameters())
    return groups


def actor_palm(name: str, trainer):
    module = trainer.actor_critic if name == "ppo" else trainer.actor
    return unwrap(trainer, module).actor_palm


def optimizers(name: str, trainer) -> dict[str, Any]:
    found = {"actor": trainer.actor_optim}
    if name == "ppo":
        found["critic"] = trainer.critic_optim
    if name == "flowrl":
        found["partition_function"] = trainer.partition_function_optim
    return {k: getattr(opt, "optimizer", opt) for k, opt in found.items()}


def run_trainer(name: str, args, device_kwargs: dict, device, variants: list[str],
                after_build=None) -> dict[str, Any]:
    """Build (and unless construct-only, train and sample from) one trainer; return its report.

    ``after_build(name, trainer)``, when given, runs right after construction (the multi-process
    worker in ddp_launch.py applies its DDP fixes and per-rank seeding there)."""
    import importlib
    import torch
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM, RewardModel

    spec, checks, timer = TRAINERS[name], rt.Checks(), rt.Timer()
    result: dict[str, Any] = {"trainer": name, "status": "failed", "mode": mode_name(args)}
    set_seed(args.seed)
    with timer.stage("construct"):
        prompt_args, prompt_info = prompt_kwargs(args.prompt_style, args.seed, args.prompt_len)
        palm = PaLM(**palm_config(args)).to(device)
        reward_model = RewardModel(palm, num_binned_output=0).to(device)  # deep-copies palm
        if args.eos_token is not None:  # after that copy: the policy, not the reward model, ends early
            raise_logit(palm, args.eos_token, EOS_LOGIT_BIAS)
        if "prompt_token_ids" in prompt_args:
            prompt_args["prompt_token_ids"] = prompt_args["prompt_token_ids"].to(device)
        kwargs = dict(palm=palm, reward_model=reward_model, minibatch_size=spec.minibatch_size,
                      epochs=1, accelerate_kwargs=device_kwargs, **spec.extra, **prompt_args)
        if kwargs.get("partition_function_hidden_dim") == TINY_PALM["dim"]:  # FlowRL: must equal
            kwargs["partition_function_hidden_dim"] = args.dim                # the PaLM dim (--dim)
        if spec.group_kwarg:
            kwargs[spec.group_kwarg] = GROUP_SAMPLES
        if name == "grpo":
            for variant in variants:
                kwargs.update(GRPO_VARIANTS[variant])
        trainer_cls = getattr(importlib.import_module(spec.module), spec.class_name)
        try:
            with rt.capture_library_output():
                trainer = trainer_cls(**kwargs)
        except Exception as exc:  # the library's failure is this smoke's finding, not a crash
            result["timings_s"] = {"construct": None, "update": None, "generate": None}
            result.update(parameters=None, optimizer_steps=None, losses=None, generated=None)
            checks.add("trainer_constructed", False, rt.one_line(exc))
            return finish(result, checks)
        # the trainer registers prompt ids as a buffer of its own (not prepared by Accelerate)
        trainer.prompt_token_ids = trainer.prompt_token_ids.to(device)
        if after_build is not None:
            after_build(name, trainer)

    tokenizer = prompt_info.pop("tokenizer", None)
    if tokenizer is not None:
        prompt_info.update(count=int(trainer.prompt_token_ids.shape[0]),
                           max_len=int(trainer.prompt_token_ids.shape[1]),
                           dropped_empty=tokenizer.dropped_empty)
    groups = trainable_groups(name, trainer)
    trainable_ids = {id(p) for ps in groups.values() for p in ps}
    names = dict((id(p), n) for n, p in trainer.named_parameters())
    frozen = [(n, p) for n, p in trainer.named_parameters() if id(p) not in trainable_ids]
    result.update(
        class_name=f"{spec.module}.{spec.class_name}", optimizer=spec.optimizer, prompts=prompt_info,
        grpo_variants=variants if name == "grpo" else None, group_size=spec.group_size)
    checks.add("trainer_constructed", True, f"{spec.module}.{spec.class_name} on {device}")
    checks.add("actor_lora_scope_added", "actor" in actor_palm(name, trainer).finetune_modules,
               "the trainer added LoRA scope 'actor' to the PaLM passed in")
    n_trainable = sum(len(ps) for ps in groups.values())
    checks.add("trainable_parameters_on_device",
               n_trainable > 0 and all(p.device.type == device.type for ps in groups.values() for p in ps),
               f"{n_trainable} trainable tensors in groups {', '.join(groups)} on {device.type}")
    result["parameters"] = {
        "trainable_total": n_trainable,
        "trainable_numel": sum(p.numel() for ps in groups.values() for p in ps),
        "trainable_changed": None, "frozen_total": len(frozen), "frozen_changed": None}
    result["timings_s"] = {"construct": timer.stages["construct"], "update": None, "generate": None}
    result.update(optimizer_steps=None, losses=None, generated=None)
    if args.construct_only:
        return finish(result, checks)

    rollouts = args.rollouts or spec.rollouts_for(spec.required_steps)
    expected_steps = spec.steps_for(rollouts)
    max_seq_len = int(trainer.prompt_token_ids.shape[1]) + args.new_tokens
    before = {key: rt.snapshot((names[id(p)], p) for p in ps) for key, ps in groups.items()}
    frozen_before = rt.snapshot(frozen)

    step_counts = {key: 0 for key in optimizers(name, trainer)}
    for key, opt in optimizers(name, trainer).items():
        opt.register_step_post_hook(lambda *_, key=key: step_counts.__setitem__(key, step_counts[key] + 1))
    reward_batches: list[int] = []
    rollout_lengths: list[int] = []  # sequence length (prompt + sampled) the reward model scored per rollout
    hook = unwrap(trainer, trainer.reward_model).register_forward_hook(
        lambda _m, inputs, _o: reward_batches.append(int(inputs[0].shape[0]))  # returns None: output kept
        or rollout_lengths.append(int(inputs[0].shape[-1])))

    with timer.stage("update"):
        try:
            with rt.capture_library_output() as captured:
                trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts,
                              max_seq_len=max_seq_len, eos_token=args.eos_token)
            error = None
        except Exception as exc:  # the library's failure is this smoke's finding, not a crash
            error = rt.one_line(exc)
    hook.remove()
    result["timings_s"]["update"] = timer.stages["update"]
    if args.verbose:
        sys.stderr.write(captured.stdout)
    losses = rt.parse_losses(captured.stdout)
    result["losses"] = losses
    result["rollout_lengths"] = rollout_lengths
    result["optimizer_steps"] = {"expected": expected_steps, "required": spec.required_steps,
                                 "observed": step_counts, "rollouts": rollouts}
    if not checks.add("update_ran", error is None,
                      error or f"train(): {rollouts} rollouts, one learn(), max_seq_len {max_seq_len}"):
        return finish(result, checks)

    checks.add("optimizer_steps", step_counts["actor"] == expected_steps >= spec.required_steps,
               f"actor optimizer stepped {step_counts['actor']}x (expected {expected_steps}, "
               f"{spec.optimizer} needs >= {spec.required_steps}); all: {step_counts}")
    checks.add("rollout_group_size", set(reward_batches) == {spec.group_size},
               f"reward model scored {sorted(set(reward_batches))} completions per prompt per rollout "
               f"(expected {spec.group_size}" + (f" = {spec.group_kwarg} + 1)" if spec.group_kwarg else ")"))
    if args.eos_token is not None:
        early = sum(n < max_seq_len for n in rollout_lengths)
        checks.add("rollouts_ended_at_eos", early > 0,
                   f"eos_token {args.eos_token}: rollout lengths {rollout_lengths} (max_seq_len {max_seq_len}); "
                   f"{early} ended at eos before max_seq_len")
    trainable_changed = 0
    for key, ps in groups.items():
        changed = rt.changed_names(before[key], ((names[id(p)], p) for p in ps))
        trainable_changed += len(changed)
        unchanged = sorted(set(before[key]) - set(changed))
        checks.add(f"{key}_changed", not unchanged,
                   f"{len(changed)}/{len(ps)} tensors changed"
                   + (f"; unchanged: {', '.join(unchanged[:4])}" if unchanged else ""))
    frozen_changed = rt.changed_names(frozen_before, frozen)
    reward_changed = [n for n in frozen_changed if n.startswith("reward_model.")]
    checks.add("base_weights_unchanged", not set(frozen_changed) - set(reward_changed),
               f"{len(frozen) - sum(n.startswith('reward_model.') for n, _ in frozen)} base PaLM tensors; "
               f"changed: {sorted(set(frozen_changed) - set(reward_changed))[:4] or 'none'}")
    checks.add("reward_model_unchanged", not reward_changed,
               f"changed: {reward_changed[:4] or 'none'}")
    result["parameters"].update(trainable_changed=trainable_changed, frozen_changed=len(frozen_changed))
    values = [v for vs in losses.values() for v in vs]
    checks.add("losses_finite", rt.all_finite(losses),
               f"{len(values)} printed values ({', '.join(losses)})" if values else "no loss printed")
    if name == "tpo":
        buffer = Path(getattr(args, "tpo_buffer", TPO_BUFFER))  # ddp_launch.py: a per-rank folder
        size = sum(f.stat().st_size for f in buffer.rglob("*") if f.is_file()) if buffer.is_dir() else 0
        result["replay_buffer"] = {"path": f"./{buffer}", "bytes": size}
        checks.add("replay_buffer_in_private_dir",
                   buffer.is_dir() and Path.cwd().resolve() != Path(args.caller_dir).resolve(),
                   f"./{buffer} written in the private working directory ({size} bytes on disk), "
                   "removed with it")
    if name == "flowrl":
        palm_, probe = actor_palm(name, trainer), trainer.prompt_token_ids[:1]
        with torch.no_grad():  # after the update the actor's LoRA moved, so LoRA off must differ
            ref_differs = not torch.equal(trainer.palm(probe, finetune_scope=None),
                                          palm_(probe, finetune_scope="actor"))
        checks.add("reference_policy_is_lora_off_palm", trainer.palm is palm_ and ref_differs,
                   "learn() scores pi_ref with self.palm(..., finetune_scope=None): the actor's own "
                   f"PaLM (same object: {trainer.palm is palm_}) with LoRA off (logits differ from "
                   f"the actor's after the update: {ref_differs})")

    prompt = trainer.prompt_token_ids[0]
    prompt = prompt[prompt != rt.PAD_ID]
    with timer.stage("generate"):
        try:
            with rt.capture_library_output():
                sequence = trainer.generate(max_seq_len, prompt=prompt, num_samples=NUM_GENERATE_SAMPLES,
                                            eos_token=args.eos_token)
        except Exception as exc:
            sequence = None
            checks.add("generated_sequence", False, f"trainer.generate raised {rt.one_line(exc)}")
    result["timings_s"]["generate"] = timer.stages["generate"]
    if sequence is None:
        return finish(result, checks)
    expected_len = max(max_seq_len, prompt.shape[0] + 1)
    result["generated"] = {"shape": list(sequence.shape), "dtype": str(sequence.dtype).replace("torch.", ""),
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
    return finish(result, checks)


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


def finish(result: dict[str, Any], checks: rt.Checks) -> dict[str, Any]:
    result["checks"] = checks.items
    result["status"] = rt.status_of(checks.items)
    return result


def palm_config(args) -> dict[str, int]:
    """PaLM keyword arguments: the tiny config with --dim and --depth applied."""
    return {**TINY_PALM, "dim": args.dim, "depth": args.depth}


def mode_name(args) -> str:
    return "construct-only" if args.construct_only else "train-smoke"


# Single trainer: these keys of its result also appear at the top level of the report (stable keys).
SINGLE_TRAINER_KEYS = ("checks", "parameters", "generated", "optimizer_steps", "losses", "prompts",
                       "grpo_variants", "class_name", "replay_buffer", "rank_sync")


def trainers_report(args, results: dict[str, dict[str, Any]], device, cpu_threads: int) -> dict[str, Any]:
    """The report's part common to single- and multi-process runs (ddp_launch.py's rank 0).

    ``results`` maps trainer name to its result (``run_trainer``); status is ok when every result
    is. ``timings_s`` holds construct, update and generate in seconds, summed over trainers, each
    None when a trainer never reached that stage (a constructor raised; --construct-only).
    """
    def stage_sum(key: str) -> float | None:
        values = [r["timings_s"].get(key) for r in results.values()]
        return None if any(v is None for v in values) else round(sum(values), 4)

    report: dict[str, Any] = {
        "status": "ok" if results and all(r["status"] == "ok" for r in results.values()) else "failed",
        "mode": mode_name(args), "trainer": args.trainer, "device": str(device), "seed": args.seed,
        "config": {**palm_config(args), "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
                   "cpu_threads": cpu_threads},
        "timings_s": {key: stage_sum(key) for key in ("construct", "update", "generate")},
    }
    if args.trainer != "all":
        single = results[args.trainer]
        report.update({key: single[key] for key in SINGLE_TRAINER_KEYS if key in single})
    report["results"] = results
    return report


def summary(report: dict[str, Any]) -> str:
    lines = [f"tiny-rlhf-smoke: {report['mode']} on {report['device']}: {report['status'].upper()}"]
    for result in report.get("results", {}).values():
        params, steps = result["parameters"], result.get("optimizer_steps")
        head = f"[{result['status']}] {result['trainer']}"
        if steps:
            head += (f": {steps['observed']['actor']} actor steps, {params['trainable_changed']}/"
                     f"{params['trainable_total']} trainable tensors changed, {params['frozen_changed']} "
                     f"frozen changed, generated {result['generated'] and result['generated']['shape']}")
        lines.append(head)
        lines += [f"    {'ok  ' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}" for c in result["checks"]]
    t = report["timings_s"]
    lines.append("timings (s): " + ", ".join(f"{k} {v}" for k, v in t.items() if v is not None))
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.grpo_variant and args.trainer not in ("grpo", "all"):
        raise rt.SkillError("--grpo-variant applies to --trainer grpo or all")
    variants = parse_variants(args.grpo_variant)
    if args.construct_only and args.rollouts is not None:
        raise rt.SkillError("--rollouts applies to the train smoke, not --construct-only")
    if args.prompt_len is not None and args.prompt_style != "token-ids":
        raise rt.SkillError("--prompt-len applies to --prompt-style token-ids")
    world = ddp_launch.launcher_world()  # one rank of torchrun / accelerate launch / srun?
    ddp_launch.check_options(args, world)
    env = rt.check_versions(args.allow_untested)
    clashes = eos_in_prompts(args) if args.eos_token is not None else []
    if clashes:
        raise rt.SkillError(f"--eos-token {args.eos_token} occurs in prompt(s) {clashes} of "
                            f"--prompt-style {args.prompt_style}: generate() would stop after one token "
                            "(it looks for eos in the prompt too); choose another id or --seed")
    if world is not None:  # a launcher started this process: run as one rank of its world
        return ddp_launch.run_rank(sys.modules[__name__], args, env, world)
    if args.nproc is not None:  # the one-machine shortcut: torchrun on this smoke, N ranks
        return ddp_launch.launch(sys.modules[__name__], args, sys.argv[1:] if argv is None else argv, env)

    timer = rt.Timer()
    with timer.stage("import"):
        import torch  # noqa: F401  (the import floor, timed)
        import palm_rlhf_pytorch  # noqa: F401
        import accelerate  # noqa: F401
    device_kwargs, device = rt.resolve_device(args.device)
    names = list(TRAINERS) if args.trainer == "all" else [args.trainer]
    args.caller_dir = os.getcwd()
    caller_before = rt.watch_directory(args.caller_dir)
    with rt.private_workdir(), rt.torch_threads(args.cpu_threads) as threads:
        results = {name: run_trainer(name, args, device_kwargs, device, variants) for name in names}
    workdir_check = rt.caller_directory_check(args.caller_dir, caller_before)
    for result in results.values():
        result["checks"].append(workdir_check)
        result["status"] = rt.status_of(result["checks"])
    report = trainers_report(args, results, device, threads)
    report.update(versions=env["versions"], tested=env["tested"], warnings=env["warnings"])
    report["timings_s"] = {"import": timer.stages["import"], **report["timings_s"]}
    report["timings_s"]["total"] = round(time.perf_counter() - START, 4)
    rt.emit(report, args.json, summary)
    return rt.EXIT_OK if report["status"] == "ok" else rt.EXIT_CHECK_FAILED


START = time.perf_counter()

if __name__ == "__main__":
    sys.exit(rt.run_cli(main))
