"""The train smoke's own settings (tiny-rlhf-smoke): its modes, bounds, GRPO variants, and how many
rollouts and optimizer steps its one ``learn()`` makes. The tiny sizes themselves (PaLM config,
minibatch, group size) live in the probe kit (``scripts/probe_kit.py``), shared with the probes
and the canaries. Torch-free at import."""
from __future__ import annotations

from typing import Any

import ddp_fixes  # torch-free at import
import probe_kit
from skill_runtime import exits, reporting
from policy_optimization import tiny_trainers, trainers

MODES = ("construct-only", "train-smoke", "learn")  # the report's "mode"; one flag selects each
TPO_BUFFER = ddp_fixes.TPO_BUFFER  # the TPO replay-buffer folder name: one fact, kept with the DDP fixes
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


def smoke_group(spec: trainers.TrainerSpec) -> int:
    """Completions per prompt per rollout in the smoke: GROUP_SAMPLES + 1, PPO 1."""
    return tiny_trainers.GROUP_SAMPLES + 1 if spec.group_kwarg else 1


def smoke_rollouts(spec: trainers.TrainerSpec) -> int:
    """Rollouts before the smoke's one learn() so that it makes the optimizer's required steps."""
    return spec.rollouts_for(spec.required_steps, smoke_group(spec), tiny_trainers.SMOKE_MINIBATCH[spec.name])


def smoke_steps(spec: trainers.TrainerSpec, rollouts: int) -> int:
    """Optimizer steps of the smoke's one learn() over ``rollouts`` rollouts."""
    return spec.steps_per_learn(rollouts, smoke_group(spec), tiny_trainers.SMOKE_MINIBATCH[spec.name])


def palm_config(args) -> dict[str, int]:
    """PaLM keyword arguments: the tiny config with --dim and --depth applied."""
    return {**probe_kit.TINY_PALM, "dim": args.dim, "depth": args.depth}


def mode_name(args) -> str:
    """The run's mode (one of MODES), from the mode flags."""
    return "learn" if args.learn else "construct-only" if args.construct_only else "train-smoke"


def trainer_names(args) -> list[str]:
    """The trainers a run covers, in the table's order: --trainer, or all four."""
    return list(trainers.TRAINERS) if args.trainer == "all" else [args.trainer]


def finish(result: dict[str, Any], checks) -> dict[str, Any]:
    """Close one trainer's report entry: its checks (``reporting.Checks``) and their status."""
    result["checks"] = checks.items
    result["status"] = reporting.status_of(checks.items)
    return result
