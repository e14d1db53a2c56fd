"""Knowledge round 4: the places where the tree was silent and an answer had to probe the library,
now written up; each test checks its section against the installed palm-rlhf-pytorch and fails
naming the doc file and section when the library stops behaving as the section says.

Tiny CPU models (the probe kit's); each test runs in its own directory (TPO's replay buffer)."""
from __future__ import annotations

import contextlib
import inspect
import io
import sys

import pytest
import torch
from palm_rlhf_pytorch import RewardModel

import accelerate
import doc_tables
import probe_kit
from conftest import REPO, run
from policy_optimization import tiny_trainers, trainers
from run_kit import launch

REWARD_API = REPO / "sub-skills/reward-modeling/references/reward-api.md"


def section(path, heading: str) -> str:
    """``doc_tables.section`` with its whitespace collapsed (claims wrap across lines)."""
    return " ".join(doc_tables.section(path, heading).split())


class NoGradReward(RewardModel):
    """reward-api.md's recipe: scores without a graph; still a RewardModel (PPO's beartype)."""

    @torch.no_grad()
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("name", tuple(trainers.TRAINERS))
def test_the_trainers_call_the_reward_model_with_autograd_on(name, tmp_path, monkeypatch):
    """reward-api.md#what-the-trainers-accept: every trainer's rollout calls the reward model with
    grad enabled, so a RewardModel as built returns a reward with a graph; the section's subclass
    (forward under no_grad) returns none, and PPO's beartype accepts it."""
    where = f"{REWARD_API.relative_to(REPO)}#what-the-trainers-accept"
    text = section(REWARD_API, "## What the trainers accept")
    assert "Those calls run with autograd on" in text and \
        "a subclass whose `forward` is `@torch.no_grad()` and returns `super().forward(...)`" in text, where
    monkeypatch.chdir(tmp_path)
    for no_grad_forward in (False, True):
        torch.manual_seed(0)
        reward = probe_kit.tiny_reward_model()
        if no_grad_forward:  # the section's subclass, built as the probe kit builds a RewardModel
            reward = NoGradReward(probe_kit.tiny_palm(), num_binned_output=0)
        seen = []
        reward.register_forward_hook(lambda module, args, output: seen.append(
            (torch.is_grad_enabled(), output.requires_grad)))
        trainer = tiny_trainers.tiny_trainer(name, reward_model=reward)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2,
                          max_seq_len=tiny_trainers.max_seq_len(trainer))
        # the hook runs in Module.__call__, outside the decorated forward: the trainer's own grad mode
        assert seen and all(enabled for enabled, _ in seen), f"{where}: {name} scored under no_grad: upstream changed"
        assert all(graph != no_grad_forward for _, graph in seen), f"{where}: {name}, no_grad={no_grad_forward}: {seen}"


FROZEN_DDP = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[1]}")
try:
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).requires_grad_(False))
except RuntimeError as err:
    print("refused", str(err).splitlines()[0])
dist.destroy_process_group()
"""


def test_ddp_refuses_a_frozen_reward_model(tmp_path):
    """reward-api.md#what-the-trainers-accept: why the recipe is no_grad, not requires_grad_(False):
    Accelerate wraps every prepared model in DDP under multi-process CPU (accelerator.py:2058-2060,
    no requires_grad check on that path), and DDP refuses a module with nothing to train."""
    where = f"{REWARD_API.relative_to(REPO)}#what-the-trainers-accept"
    assert "not `requires_grad_(False)` (under multi-process CPU, DDP refuses a frozen model)" in \
        section(REWARD_API, "## What the trainers accept"), where
    source = inspect.getsource(accelerate.Accelerator.prepare_model)
    multi_cpu = source.split("elif self.distributed_type == DistributedType.MULTI_CPU:", 1)[1].split("elif ", 1)[0]
    assert "DistributedDataParallel(model" in multi_cpu and "requires_grad" not in multi_cpu, where
    proc = run([sys.executable, "-c", FROZEN_DDP, str(launch.free_port())], tmp_path, env={"GLOO_SOCKET_IFNAME": "lo"})
    assert proc.stdout.startswith("refused DistributedDataParallel is not needed when a module doesn't have any "
                                  "parameter that requires a gradient"), (where, proc.stdout, proc.stderr[-1500:])
