"""User-side fixes that make palm-rlhf-pytorch 0.8.0 trainers correct under DDP (Accelerate
multi-process), without editing the library.

Call ``apply_ddp_fixes(trainer)`` once, right after building a trainer, and save checkpoints with
``save_checkpoint(trainer, path)`` instead of ``trainer.save(path)``. Each fix is a no-op when
Accelerate did not wrap the trainer's model in DDP (``DistributedType.NO``), so the same script runs
either way. Accelerate wraps whenever it runs multi-process, even with one process (``torchrun
--nproc_per_node 1``), and the fixes apply then too.

What each fix works around (upstream files under ``palm_rlhf_pytorch/``):
- ppo.py ``RLHFTrainer.learn``: one forward, then ``backward(policy_loss)``, ``actor_optim.step()``,
  ``backward(value_loss)``, ``critic_optim.step()``. DDP averages gradients only when every
  parameter's gradient is ready, i.e. during the second backward, so the actor steps on its own
  rank's gradient and the ranks' actor LoRA weights drift apart. ``fix_ppo`` turns DDP's bucketed
  sync off for the actor-critic and all-reduces each optimizer's gradients right before its step.
- tpo.py ``RLHFTrainer.train`` calls ``self.actor.generate`` on the DDP wrapper (AttributeError)
  and writes the hard-coded ``./tpo_memmap_replay_buffer`` (ranks sharing a directory corrupt each
  other's buffer). ``fix_tpo`` exposes the unwrapped ``generate`` and runs ``train()`` inside a
  per-rank folder.
- flowrl.py ``FlowRLTrainer.learn`` reads ``self.actor.actor_palm`` (and ``actor_lora_scope``,
  ``actor_lora``) off the DDP wrapper (AttributeError). ``fix_flowrl`` exposes them.
- every trainer's ``save()`` writes ``self.actor(_critic).state_dict()`` of the DDP wrapper
  (keys prefixed ``module.``) from every rank to one path. ``save_checkpoint`` saves the unwrapped
  state dict from the main process only.
- every trainer, with ``train(eos_token=...)``: palm.py ``ParallelTransformerBlock.get_rotary_embedding``
  caches rotary tables in buffers grown to the longest sequence the rank has seen, so ranks whose
  rollouts stop at eos at different lengths hold buffers of different shapes; DDP broadcasts rank
  0's buffers into every rank's before each forward of a wrapped model (torch
  ``DistributedDataParallel._pre_forward``), which then corrupts them (NaN weights) or aborts in
  gloo ("Received data size doesn't match"). ``fix_buffers`` turns that broadcast off.
- grpo.py needs only ``fix_buffers``: one forward and one backward per optimizer step, so DDP's
  gradient sync is exact.

Only torch and accelerate are imported (lazily); this file imports nothing from the skill package
and runs from a copy of the skill tree.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

TPO_BUFFER = "tpo_memmap_replay_buffer"   # hard-coded in palm_rlhf_pytorch/tpo.py RLHFTrainer.train
RANK_FOLDER = "rank{rank}"                # per-rank working folder for TPO's replay buffer


def is_distributed(trainer) -> bool:
    """True when Accelerate wrapped the trainer's policy (PPO: actor-critic, else actor) for DDP.

    Accelerate wraps under MULTI_CPU / MULTI_GPU whatever the number of processes, one included.
    """
    module = policy_module(trainer)
    return trainer.accelerate.unwrap_model(module) is not module


def policy_module(trainer):
    """The module the trainer trains and ``save()`` saves, as Accelerate prepared it (maybe DDP-wrapped):
    PPO's ``actor_critic``, else ``actor``."""
    return trainer.actor_critic if trainer_kind(trainer) == "ppo" else trainer.actor


def trainer_kind(trainer) -> str:
    """'ppo', 'grpo', 'tpo' or 'flowrl' from the trainer's defining module (palm_rlhf_pytorch.*).

    Raises ValueError for a class from elsewhere.
    """
    module = type(trainer).__module__
    kind = module.rsplit(".", 1)[-1]
    if not module.startswith("palm_rlhf_pytorch.") or kind not in ("ppo", "grpo", "tpo", "flowrl"):
        raise ValueError(f"not a palm_rlhf_pytorch trainer: {module}.{type(trainer).__name__}")
    return kind


def allreduce_mean_grads(params: Iterable, accelerator) -> None:
    """Average ``param.grad`` over all processes in place (sum all-reduce / world size).

    Gradients of any shape and dtype; a parameter whose gradient is None on every rank stays None,
    one with a gradient on some rank only gets zeros elsewhere first (so collectives always match).
    Two collectives per call: a presence mask, then one flat float32 buffer of all present grads.
    """
    import torch
    import torch.distributed as dist

    params = [p for p in params if p.requires_grad]
    if not params or accelerator.num_processes == 1:  # the mean over one rank is its own gradient
        return
    device = params[0].device
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=device)
    dist.all_reduce(present, op=dist.ReduceOp.MAX)
    kept = [p for p, flag in zip(params, present.tolist()) if flag]
    if not kept:
        return
    for p in kept:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.detach().reshape(-1).float() for p in kept])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= accelerator.num_processes
    offset = 0
    for p in kept:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def _inner(optimizer):
    """The torch optimizer inside Accelerate's AcceleratedOptimizer (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def fix_ppo(trainer) -> list:
    """Make PPO (palm_rlhf_pytorch/ppo.py RLHFTrainer) step on rank-averaged gradients.

    Sets ``require_backward_grad_sync = False`` on the DDP-wrapped actor-critic (what DDP's own
    ``no_sync()`` does, here for the whole run), and registers a step pre-hook on the actor and
    critic optimizers that all-reduces their parameters' gradients (``allreduce_mean_grads``).
    Each optimizer then steps on the mean over ranks of its own loss's gradient, exactly what one
    process with the ranks' minibatches concatenated would compute (equal minibatch sizes).
    Returns the hook handles (``handle.remove()`` undoes the hooks); [] when not distributed.
    """
    if not is_distributed(trainer):
        return []
    wrapper = trainer.actor_critic
    if not hasattr(wrapper, "require_backward_grad_sync"):
        raise TypeError(f"expected a DDP-wrapped actor_critic, got {type(wrapper).__name__}")
    wrapper.require_backward_grad_sync = False
    handles = []
    for optimizer in (trainer.actor_optim, trainer.critic_optim):
        inner = _inner(optimizer)
        params = [p for group in inner.param_groups for p in group["params"]]
        hook = lambda _opt, _args, _kwargs, params=params: allreduce_mean_grads(params, trainer.accelerate)
        handles.append(inner.register_step_pre_hook(hook))
    return handles


def expose_wrapped_attributes(wrapper, names: Iterable[str]) -> None:
    """Make ``wrapper.<name>`` return ``wrapper.module.<name>`` for each name.

    Stored in the wrapper's instance ``__dict__`` (``object.__setattr__``), so nothing is registered
    as a submodule: ``state_dict()`` and ``parameters()`` are unchanged. No-op for an unwrapped module.
    """
    inner = getattr(wrapper, "module", None)
    if inner is None:
        return
    for name in names:
        object.__setattr__(wrapper, name, getattr(inner, name))


@contextlib.contextmanager
def rank_workdir(rank: int, template: str = RANK_FOLDER) -> Iterator[Path]:
    """chdir into ``./<template.format(rank=rank)>`` (created if missing), back on exit.

    The working directory is process-wide: do not run other relative-path I/O concurrently.
    """
    caller = os.getcwd()
    folder = Path(caller) / template.format(rank=rank)
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(caller)


def fix_tpo(trainer, template: str = RANK_FOLDER) -> None:
    """Make TPO (palm_rlhf_pytorch/tpo.py RLHFTrainer) run under DDP.

    Exposes the unwrapped ``actor.generate`` on the DDP wrapper (``train()`` calls it there), and
    wraps ``trainer.train`` so each call runs inside ``./rank<N>/`` (``rank_workdir``): every rank
    gets its own ``tpo_memmap_replay_buffer`` folder, left there after training.
    """
    if not is_distributed(trainer):
        return
    expose_wrapped_attributes(trainer.actor, ["generate"])
    rank = trainer.accelerate.process_index
    train = trainer.train

    @functools.wraps(train)
    def train_in_rank_folder(*args, **kwargs):
        with rank_workdir(rank, template):
            return train(*args, **kwargs)

    object.__setattr__(trainer, "train", train_in_rank_folder)


def fix_flowrl(trainer) -> None:
    """Expose ``actor_palm``, ``actor_lora_scope`` and ``actor_lora`` on FlowRL's DDP-wrapped actor.

    palm_rlhf_pytorch/flowrl.py ``learn()`` reads them off ``self.actor`` to embed prompts for the
    partition function (under no_grad, so the DDP forward is not needed there).
    """
    if is_distributed(trainer):
        expose_wrapped_attributes(trainer.actor, ["actor_palm", "actor_lora_scope", "actor_lora"])


def fix_buffers(trainer) -> list[str]:
    """Turn off DDP's buffer broadcast on every DDP-wrapped model of the trainer; returns their names.

    Before each forward of a wrapped model, DDP copies rank 0's buffers into every rank's
    (``forward_sync_buffers``, on by default; torch/nn/parallel/distributed.py ``_pre_forward``).
    The PaLM buffers are constants (``inv_freq``, ``scale``, the layer norms' ``beta``: equal on
    every rank since DDP's construction-time sync, which this leaves as it was) and the rotary
    caches ``pos_emb`` / ``pos_emb_scale``, which palm.py ``get_rotary_embedding`` grows to the
    longest sequence that rank has run. With ``eos_token`` the ranks' rollouts end at different
    lengths, the caches differ in shape, and the broadcast corrupts them. Rank-local caches are
    correct: each rank's table is computed from its own length. Nothing in these models is a
    running statistic that needs averaging, so the broadcast is never needed.

    Sets the wrapper's ``broadcast_buffers`` attribute (a property over ``forward_sync_buffers``
    in torch 2.13, a plain attribute before) after construction. The equivalent at construction,
    ``accelerate_kwargs=dict(kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])``,
    works too, but torch 2.13 warns that the DDP argument is deprecated (FutureWarning).
    """
    from torch.nn.parallel import DistributedDataParallel

    wrapped = [name for name, child in trainer.named_children() if isinstance(child, DistributedDataParallel)]
    for name in wrapped:
        getattr(trainer, name).broadcast_buffers = False
    return wrapped


FIXES: dict[str, Callable[[Any], Any]] = {
    "ppo": fix_ppo,
    "grpo": lambda trainer: None,  # one backward per optimizer step: DDP's own gradient sync is exact
    "tpo": fix_tpo,
    "flowrl": fix_flowrl,
}


def apply_ddp_fixes(trainer) -> str:
    """Apply ``fix_buffers`` and the fix for this trainer's kind (see ``FIXES``); returns the kind.
    No-op in one process."""
    kind = trainer_kind(trainer)
    fix_buffers(trainer)
    FIXES[kind](trainer)
    return kind


def checkpoint_module(trainer):
    """The module ``trainer.save()`` saves, unwrapped: PPO's actor-critic, else the actor."""
    return trainer.accelerate.unwrap_model(policy_module(trainer))


def save_checkpoint(trainer, path: str | os.PathLike = "./checkpoint.pt") -> bool:
    """Save what ``trainer.save(path)`` saves, but unwrapped (no ``module.`` key prefix) and only from
    the main process, after all processes reach this call (``wait_for_everyone``).

    The file is serialized in memory, written to ``<path>.<pid>.tmp``, flushed to disk (fsync) and renamed
    over ``path``, so a rank that reads it right after this call returns never sees a partial file
    (seen once under load with ``torch.save(obj, path)``: rank 1's ``torch.load`` right after the
    barrier did not find a complete zip file).
    Returns True in the process that wrote the file. ``trainer.load(path)`` reads it back in a
    single process; under DDP load into ``checkpoint_module(trainer)`` instead.
    """
    import io
    import torch

    accelerator = trainer.accelerate
    accelerator.wait_for_everyone()
    wrote = False
    if accelerator.is_main_process:
        buffer = io.BytesIO()
        torch.save(checkpoint_module(trainer).state_dict(), buffer)
        tmp = Path(f"{os.fspath(path)}.{os.getpid()}.tmp")  # unique: no writer can rename another's
        with open(tmp, "wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        wrote = True
    accelerator.wait_for_everyone()
    return wrote


if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("ddp_fixes.py: error: a module, not a command: imported by tiny_rlhf_smoke.py on several processes: run tiny_rlhf_smoke.py --nproc 2\n")
    sys.exit(2)
