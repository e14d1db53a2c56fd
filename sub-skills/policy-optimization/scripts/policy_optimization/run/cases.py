"""The watchdog's measured cases: one healthy toy run and deliberately broken ones, each broken
config with the rule it must fire (``calibrate_watchdog.py`` measures false alarms and misses over
seeds and regenerates references/training-run.md#watchdog-rules; the tests run them once).

A case is a tiny run config (byte-level PaLM, dim 32, short prompts, a rule reward: the fraction
of ASCII bytes in the response, about 0.5 for a fresh PaLM, so groups differ and it can rise)
written into a folder by ``write``; ``overrides`` replace keys of its tables, ``reward`` the
reward program's source, ``prompts`` the training prompts. Torch-free.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import probe_kit
from policy_optimization import trainers

PROMPTS = ("ab", "cde", "fg", "hij", "kl", "mno")   # training prompts: 2-3 bytes (byte tokenizer)
HELD_OUT = ("pq", "rst", "uv")                      # held-out prompts
ASCII = '''
import torch

def score(x, response_mask):                       # (b, n) int64, (b, n) bool -> (b,)
    hits = (x <= 128) & response_mask              # byte ids 1..128: the ASCII bytes, half the vocabulary
    return hits.sum(dim=1).float() / response_mask.sum(dim=1).clamp(min=1).float()
'''


@dataclass(frozen=True)
class Case:
    name: str
    trainer: str
    expect: str | None                      # the rule it must fire (None: the healthy run fires none)
    why: str                                # what is broken, in the words of the silent-failure table
    overrides: dict = field(default_factory=dict)
    reward: str = ASCII
    prompts: tuple[str, ...] = PROMPTS
    rounds: int = 8
    within: int = 3                         # it must fire by this round


def base_config(trainer: str, rounds: int) -> dict:
    """The healthy toy run: all weights trained at lr 1e-2 (LoRA barely moves a fresh PaLM:
    training-run.md#first-run), groups of 4, 4 rollouts per round, the held-out reward every round;
    measured: the held-out reward rises from about 0.5 within 8 rounds on every seed tried."""
    keys = {"name": trainer, "actor_lora": False, "actor_lr": 1e-2, "minibatch_size": 4}
    group_kwarg = trainers.TRAINERS[trainer].group_kwarg
    if group_kwarg:
        keys[group_kwarg] = 3
    if trainer == "flowrl":
        keys["partition_function_hidden_dim"] = 32
    if trainer == "ppo":
        keys["minibatch_size"] = 2
    return {"palm": dict(probe_kit.TINY_PALM),
            "trainer": keys, "prompts": {"file": "prompts.txt"}, "reward": {"program": "reward.py:score"},
            "train": {"update_timesteps": 4, "max_seq_len": 8},
            "eval": {"prompts_file": "held_out.txt", "every": 1, "samples": 8},
            "run": {"rounds": rounds, "checkpoint_every": rounds, "seed": 0}}


def toml(config: dict) -> str:
    """A config as TOML (tables of scalars)."""
    def value(v):
        return str(v).lower() if isinstance(v, bool) else json.dumps(v)
    return "\n".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items()) for name, table in config.items())


def write(case: Case, folder: Path, seed: int = 0, rounds: int | None = None) -> Path:
    """The case's run config in ``folder`` (run.toml, reward.py, prompts.txt, held_out.txt), seeded
    by ``seed``; returns the config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.txt").write_text("\n".join(case.prompts) + "\n", encoding="utf-8")
    (folder / "held_out.txt").write_text("\n".join(HELD_OUT) + "\n", encoding="utf-8")
    (folder / "reward.py").write_text(textwrap.dedent(case.reward), encoding="utf-8")
    config = base_config(case.trainer, rounds or case.rounds)
    config["run"]["seed"] = seed
    for section, keys in case.overrides.items():
        table = config.setdefault(section, {})
        for key, v in keys.items():
            table.pop(key, None) if v is None else table.__setitem__(key, v)
    path = folder / "run.toml"
    path.write_text(toml(config), encoding="utf-8")
    return path


HEALTHY = Case("healthy", "grpo", None, "the toy task as it should run")
# PPO has no healthy toy here: at these sizes it does not learn within 8 rounds (measured; its learning
# check runs on a 16-token vocabulary: workflows.md#learning-check), and held_out_flat says so.
HEALTHY_OTHERS = (Case("healthy tpo", "tpo", None, "the toy task as it should run"),
                  Case("healthy flowrl", "flowrl", None, "the toy task as it should run, 8 rollouts per round, lr 3e-3, 12 training prompts",
                       overrides={"train": {"update_timesteps": 8}, "trainer": {"actor_lr": 3e-3}},
                       prompts=PROMPTS + ("wx", "yza", "bc", "def", "gh", "ijk")))
BROKEN = (
    Case("constant reward", "grpo", "equal_rewards", "every completion of a prompt scores the same",
         reward="import torch\n\ndef score(x, response_mask):\n    return torch.full((x.shape[0],), 0.5)\n"),
    Case("PPO minibatch of one", "ppo", "zero_advantage", "a PPO minibatch of one: advantage exactly 0",
         overrides={"trainer": {"minibatch_size": 1}}),
    Case("LoRA at lr 1e-30", "grpo", "weights_frozen", "a learning rate too small to move float32 weights",
         overrides={"trainer": {"actor_lora": True, "actor_lr": 1e-30}}),
    Case("NaN reward", "ppo", "non_finite", "a reward program that returns NaN (GRPO raises on it)",
         reward="import torch\n\ndef score(x, response_mask):\n    return torch.full((x.shape[0],), float('nan'))\n"),
    Case("eos in every prompt", "grpo", "one_token_responses", "the eos id inside every prompt",
         overrides={"train": {"eos_token": ord("z") + 1}}, prompts=("az", "zbc", "dz", "zef", "gz", "hzi")),
    Case("lr 1.0", "grpo", "kl_blowup", "a learning rate that throws the policy away from its rollouts",
         overrides={"trainer": {"actor_lr": 1.0}}),
    Case("LoRA at lr 1e-6", "grpo", "held_out_flat", "LoRA on a fresh PaLM at a small learning rate: learns nothing",
         overrides={"trainer": {"actor_lora": True, "actor_lr": 1e-6}}, within=5),  # 5 evaluations: HELD_OUT_PATIENCE
    Case("max_timesteps 6, update_timesteps 4", "grpo", "rollouts_dropped", "update_timesteps not dividing the rollouts",
         overrides={"train": {"max_timesteps": 6}}),
    Case("PPO rewards in [0, 10]", "ppo", "reward_outside_critic_range", "PPO rewards outside [0, 5]",
         reward=ASCII.replace("    return hits", "    return 10.0 * hits")),
    Case("TPO group of one", "tpo", "group_of_one", "one completion per prompt",
         overrides={"trainer": {"num_times_sample_rewards": 0}}),
    Case("MaxRL with rewards averaging 0", "grpo", "advantage_extreme", "GRPO use_max_rl with rewards averaging 0",
         overrides={"trainer": {"use_max_rl": True}},
         reward="import torch\n\ndef score(x, response_mask):\n    half = x.shape[0] // 2\n"
                "    return torch.where(torch.arange(x.shape[0]) < half, 1.0, -1.0)\n"),
    Case("a reward program that leaks", "grpo", "memory_growing", "a reward program keeping tensors across rounds",
         reward=ASCII + "\nKEPT = []\n_score = score\n\ndef score(x, response_mask):\n"
                         "    KEPT.append(torch.ones(12_000_000))  # 46 MiB kept per rollout\n"
                         "    return _score(x, response_mask)\n",
         within=4),  # growth in 3 rounds in a row after round 1, whose growth is the run's own warm-up
)
CASES = (HEALTHY, *HEALTHY_OTHERS, *BROKEN)
