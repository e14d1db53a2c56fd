"""One metrics row per round, observed on the library's own ``train()`` without changing it.

What a round observes and where (palm-rlhf-pytorch 0.8.0):
- rollouts, rewards, groups, response lengths: a forward hook on the reward model, which every
  trainer calls once per rollout with ``(x (b, n) int64, prompt_mask=(b, n) bool, mask=(b, n)
  bool)`` (ppo.py ``train``, grpo.py ``train``, tpo.py ``train``, flowrl.py ``train``);
- the advantages the update used: GRPO's and FlowRL's stored normalized rewards (the last field of
  every ``Memory`` handed to ``learn()``), PPO's ``masked_normalize`` output inside ``learn()``
  (ppo.py), TPO's z-scored group rewards, which tpo.py ``train`` replaces by zeros when
  ``rewards.std()`` is not above 0;
- the KL term: ``masked_kl_div``'s output inside ``learn()`` (ppo.py, grpo.py), the library's KL to
  the rollout policy; FlowRL's and TPO's ``learn()`` compute none;
- steps and gradient norms: hooks on the trainer's torch optimizers;
- the policy's entropy and its KL to the LoRA-off base PaLM, on a few of the round's last
  sequences: PPO, GRPO and FlowRL store each sequence's next-token probabilities from the rollout
  (``Memory.action_prob``), so only the base needs a forward; TPO stores none, so its policy
  needs one too.
The module-level functions are wrapped only for the duration of one ``train()`` call and restored
afterwards, whatever happens.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from policy_optimization import trainers
from skill_runtime import streams

# The keys of a metrics row, in order; units and meaning: references/run-reports.md#metrics-row.
ROW_KEYS = ("round", "rollouts", "group_size", "learn_calls", "wall_s", "tokens_per_s", "peak_mib", "rss_mib",
            "reward_mean", "reward_std", "reward_min", "reward_max", "zero_std_group_fraction",
            "advantage_zero_fraction", "advantage_abs_max", "response_length_mean",
            "one_token_response_fraction", "top_token_share", "distinct_bigram_fraction", "unseen_id_fraction",
            "unseen_reward_gain", "unseen_reward_gain_se", "kl_rollout", "kl_base", "entropy", "losses", "grad_norm",
            "optimizer_steps", "trainable_change_norm", "non_finite_weights", "lr", "held_out_reward",
            "held_out_std", "held_out_per_prompt", "held_out_gold", "held_out_gold_std", "held_out_gold_per_prompt",
            "held_out_per_group", "held_out_gold_per_group", "held_out_top_token_share",
            "held_out_distinct_bigram_fraction", "held_out_longest_run", "rules")
HELD_OUT_KEYS = ("held_out_reward", "held_out_std", "held_out_per_prompt", "held_out_gold", "held_out_gold_std",
                 "held_out_gold_per_prompt", "held_out_per_group", "held_out_gold_per_group", "held_out_top_token_share",
                 "held_out_distinct_bigram_fraction", "held_out_longest_run")  # what one held-out evaluation fills (``held_out_figures``)
# The JSON type of each key that is not a number or null (every other key of ROW_KEYS is one):
# what ``parse_row`` checks in a row read back from a file.
ROW_TYPES = {"round": "round", "rollouts": "count", "group_size": "count", "learn_calls": "count",
             "losses": "losses", "optimizer_steps": "counts", "trainable_change_norm": "numbers",
             "non_finite_weights": "flag", "rules": "names", "held_out_per_prompt": "list",
             "held_out_gold_per_prompt": "list", "held_out_per_group": "numbers", "held_out_gold_per_group": "numbers",
             "held_out_longest_run": "count"}
PROBE_SEQUENCES = 2  # sequences of the round's last rollout that the entropy and kl_base forwards see
UNSEEN_SEQUENCES = 16  # the round's last sequences that unseen_gain scores twice (with a reward model's coverage)


@dataclass
class Observation:
    """What one round's ``train()`` did, as the hooks saw it (host floats and ints)."""
    rewards: list[list[float]] = field(default_factory=list)    # per rollout: one reward per sequence
    response_lengths: list[int] = field(default_factory=list)   # response tokens that count, per sequence
    sampled_tokens: int = 0                                     # tokens sampled after the prompts
    advantages: list[float] = field(default_factory=list)       # every advantage the update used
    kl_terms: list = field(default_factory=list)                # the library's KL term, per minibatch (0-d tensors)
    grad_norms: list = field(default_factory=list)              # actor optimizer, per step (0-d tensors)
    steps: dict[str, int] = field(default_factory=dict)         # optimizer steps, per optimizer
    learn_calls: int = 0
    last_rollout: tuple[Any, Any, Any] | None = None            # (x, prompt_mask, mask) of the last one
    last_memories: list = field(default_factory=list)           # the last stored experiences (PPO, GRPO, FlowRL)
    tokens: list = field(default_factory=list)                  # per rollout: its response ids, 1-D int64 (host)
    bigrams: list = field(default_factory=list)                 # per rollout: its response bigrams as a * 2**32 + b
    recent: list = field(default_factory=list)                  # with ``unseen``: the last UNSEEN_SEQUENCES (x, prompt_mask, mask)


def _wrap_module_function(stack: contextlib.ExitStack, module: Any, name: str, record) -> None:
    """Replace ``module.name`` by a wrapper that calls it and hands its result to ``record``,
    until ``stack`` closes. A module without that function is left alone (the metric stays empty)."""
    original = getattr(module, name, None)
    if original is None:
        return

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        record(out)
        return out

    setattr(module, name, wrapper)
    stack.callback(setattr, module, name, original)


def _grad_norm(params: list):
    """L2 norm over the gradients of ``params`` that exist, a 0-d tensor
    (``torch.nn.utils.get_total_norm``; 0 without gradients): read once per round, not per step."""
    import torch
    grads = [p.grad.detach() for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())


@contextlib.contextmanager
def observe(name: str, trainer, unseen=None) -> Iterator[Observation]:
    """Hooks that fill an ``Observation`` while the ``with`` block runs the trainer's ``train()``;
    all removed on exit. ``name`` is the trainer's ``trainers.TRAINERS`` key; ``unseen``: a (V,)
    bool tensor, True on the ids the reward model never trained on (``unseen_mask``), or None."""
    import importlib

    import torch

    tpo = importlib.import_module("palm_rlhf_pytorch.tpo")
    seen = Observation()
    with contextlib.ExitStack() as stack:
        def scored(_module, args, kwargs, output) -> None:
            x = args[0]
            prompt_mask, mask = kwargs.get("prompt_mask"), kwargs.get("mask")
            response = torch.ones_like(x, dtype=torch.bool) if prompt_mask is None else ~prompt_mask
            if mask is not None:
                response = response & mask
            seen.rewards.append(output.detach().float().reshape(-1).cpu().tolist())
            seen.response_lengths += response.sum(dim=-1).cpu().tolist()
            prompt_len = 0 if prompt_mask is None else int(prompt_mask[0].sum())
            seen.sampled_tokens += x.shape[0] * (x.shape[1] - prompt_len)
            seen.last_rollout = (x.detach(), None if prompt_mask is None else prompt_mask.detach(),
                                 None if mask is None else mask.detach())
            seen.tokens.append(x[response].cpu())
            pairs = response[:, 1:] & response[:, :-1]
            seen.bigrams.append((x[:, :-1][pairs] * 2**32 + x[:, 1:][pairs]).cpu())
            if unseen is not None:
                seen.recent.append(seen.last_rollout)
                while sum(int(r[0].shape[0]) for r in seen.recent[1:]) >= UNSEEN_SEQUENCES:
                    seen.recent.pop(0)
            if name == "tpo":  # tpo.py train: z_score(rewards) if rewards.std() > 0. else zeros
                rewards = output.detach().float()
                spread = rewards.numel() > 1 and rewards.std() > 0.  # the std of one reward is NaN: not > 0
                normalized = tpo.z_score(rewards) if spread else torch.zeros_like(rewards)
                seen.advantages += normalized.cpu().tolist()

        handle = trainers.unwrap(trainer, trainer.reward_model).register_forward_hook(scored, with_kwargs=True)
        stack.callback(handle.remove)

        real_learn = trainer.learn

        def learn(memories):
            seen.learn_calls += 1
            if name in ("grpo", "flowrl"):  # the last Memory field: the normalized reward used as advantage
                seen.advantages += torch.stack([memory[-1] for memory in memories]).float().tolist()
            if name != "tpo":  # a deque of Memory namedtuples; TPO hands its replay buffer
                seen.last_memories = list(memories)[-PROBE_SEQUENCES:]
            return real_learn(memories)

        trainer.learn = learn  # an instance attribute shadows the method train() calls
        stack.callback(delattr, trainer, "learn")

        module = importlib.import_module(trainers.TRAINERS[name].source)
        _wrap_module_function(stack, module, "masked_kl_div",
                              lambda out: seen.kl_terms.append(out.detach().float().mean()))
        if name == "ppo":
            _wrap_module_function(stack, module, "masked_normalize",
                                  lambda out: seen.advantages.extend(out.detach().float().reshape(-1).cpu().tolist()))

        for key, optimizer in trainers.optimizers(name, trainer).items():
            seen.steps[key] = 0

            def stepped(*_, key=key) -> None:
                seen.steps[key] += 1

            stack.callback(optimizer.register_step_post_hook(stepped).remove)
        actor = trainers.optimizers(name, trainer)["actor"]
        params = [p for group in actor.param_groups for p in group["params"]]
        stack.callback(actor.register_step_pre_hook(lambda *_: seen.grad_norms.append(_grad_norm(params))).remove)
        yield seen


def _number(value: Any) -> bool:
    return type(value) in (int, float)


_CHECKS = {
    "round": lambda v: type(v) is int and v >= 0,
    "count": lambda v: v is None or (type(v) is int and v >= 0),
    "number": lambda v: v is None or _number(v),
    "losses": lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, list) and all(map(_number, x)) for k, x in v.items())),
    "counts": lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and type(x) is int for k, x in v.items())),
    "numbers": lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) and _number(x) for k, x in v.items())),
    "flag": lambda v: v is None or type(v) is bool,
    "list": lambda v: v is None or (isinstance(v, list) and all(map(_number, v))),
    "names": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def parse_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row read back from a file (``rundir.parse_rows``), checked: each key of ROW_KEYS
    it has holds its type (``ROW_TYPES``, else a number or null); a key it lacks (a row of an older
    version) becomes null, ``rules`` an empty list. Keys it has beyond ROW_KEYS are kept as they
    are. Returns the row with every key of ROW_KEYS. Raises ValueError naming the first bad key."""
    for key in ROW_KEYS:
        if key in row and not _CHECKS[ROW_TYPES.get(key, "number")](row[key]):
            raise ValueError(f"has {key} {json_text(row[key])}, not a {ROW_TYPES.get(key, 'number')} (or null)")
    return {**{key: [] if key == "rules" else None for key in ROW_KEYS}, **row}


def json_text(value: Any, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters (a bad value, quoted in a message)."""
    import json
    text = json.dumps(value, allow_nan=True, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def snapshot_trainable(groups: dict[str, list]) -> dict[str, list]:
    """Detached clones of every trainable tensor of ``groups`` (``trainers.trainable_groups``): the
    round's starting point for ``change_norms``. One copy of the trainable weights (LoRA: small;
    ``actor_lora=False``: the whole policy)."""
    return {group: [p.detach().clone() for p in params] for group, params in groups.items()}


def change_norms(groups: dict[str, list], before: dict[str, list]) -> tuple[dict[str, float], bool]:
    """L2 norm of each trainable group's change since ``before`` (``snapshot_trainable``), and
    whether any trainable weight is now NaN or inf."""
    import torch
    norms, finite = {}, []
    for group, params in groups.items():
        squares = torch.stack([torch.sum((p.detach().float() - p0.float()) ** 2) for p, p0 in zip(params, before[group])])
        finite += [torch.isfinite(p).all() for p in params]
        total = float(squares.sum()) if len(params) else 0.0
        norms[group] = math.sqrt(total) if math.isfinite(total) else float("nan")
    return norms, not bool(torch.stack(finite).all()) if finite else False


def policy_probe(palm, scope: str | None, seen: Observation, sequences: int = PROBE_SEQUENCES) -> dict[str, float | None]:
    """Entropy (nats per response token) of the policy's next-token distribution and its KL to the
    LoRA-off base PaLM (KL(policy || base), nats per response token), unfiltered (no top-k), on the
    round's last ``sequences`` sequences: from the probabilities the rollout stored (PPO, GRPO,
    FlowRL: the policy as it sampled them) or, for TPO, a forward of the policy now. ``kl_base`` is
    None when the trainer trains all weights (``actor_lora=False``: no base to compare with).
    ``palm`` and ``scope``: the policy's PaLM and LoRA scope (``trainers.actor_palm``, ``actor_scope``)."""
    import torch
    stored = [m for m in seen.last_memories if m.sequence.shape == seen.last_memories[-1].sequence.shape] \
        if seen.last_memories else []
    if stored:  # row t of action_prob is the distribution that sampled token t (ppo.py, grpo.py: shift by 1)
        x = torch.stack([m.sequence for m in stored]).to(palm.device)
        response = torch.stack([~m.prompt_mask & m.mask for m in stored]).to(palm.device)
        policy = torch.stack([m.action_prob for m in stored]).to(palm.device).float().clamp(min=1e-20).log()
    elif seen.last_rollout is not None:
        x, prompt_mask, mask = (t[:sequences] if t is not None else None for t in seen.last_rollout)
        response = torch.ones_like(x, dtype=torch.bool) if prompt_mask is None else ~prompt_mask
        response = response & mask if mask is not None else response
        policy = None
    else:
        return {"entropy": None, "kl_base": None}
    positions = response.clone()
    positions[:, 0] = False  # no distribution predicted the first token
    if not bool(positions.any()):
        return {"entropy": None, "kl_base": None}
    was_training = palm.training
    palm.eval()
    try:
        with torch.no_grad():
            shifted = lambda logits: torch.nn.functional.pad(logits, (0, 0, 1, -1)).float().log_softmax(dim=-1)
            if policy is None:
                policy = shifted(palm(x, finetune_scope=scope))
            base = shifted(palm(x, finetune_scope=None)) if scope else None
    finally:
        palm.train(was_training)
    p = policy.exp()
    entropy = float(-(p * policy).sum(dim=-1)[positions].mean())
    kl = None if base is None else float((p * (policy - base)).sum(dim=-1)[positions].mean())
    return {"entropy": entropy, "kl_base": kl}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def reward_figures(seen: Observation, grouped: bool) -> dict[str, float | None]:
    """Reward mean, std (population), min and max over every sequence of the round, and for a
    grouped trainer the fraction of rollouts whose group rewards are all equal (max == min)."""
    flat = [r for rollout in seen.rewards for r in rollout]
    if not flat:
        return dict.fromkeys(("reward_mean", "reward_std", "reward_min", "reward_max", "zero_std_group_fraction"))
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((r - mean) ** 2 for r in flat) / len(flat))
    equal = [max(rollout) == min(rollout) for rollout in seen.rewards] if grouped else []
    return {"reward_mean": mean, "reward_std": std, "reward_min": min(flat), "reward_max": max(flat),
            "zero_std_group_fraction": (sum(equal) / len(equal)) if grouped else None}


def unseen_mask(ids: list[int], num_tokens: int):
    """(num_tokens,) bool, True on ``ids`` (a reward model's ``unseen_ids``; ids beyond the
    vocabulary are dropped)."""
    import torch
    mask = torch.zeros(num_tokens, dtype=torch.bool)
    kept = [i for i in ids if 0 <= i < num_tokens]
    mask[kept] = True
    return mask


def token_figures(seen: Observation, unseen=None) -> dict[str, float | None]:
    """What the round's responses are made of (``evaluation.token_shares``): ``top_token_share``,
    the share of every response token that is the round's single most frequent id;
    ``distinct_bigram_fraction``, distinct bigrams over all bigrams inside the responses; with ``unseen``
    (``unseen_mask``) ``unseen_id_fraction``, the share of response tokens the reward model never
    trained on (else None)."""
    import torch
    from policy_optimization import evaluation
    out: dict[str, float | None] = {"unseen_id_fraction": None}
    tokens = torch.cat(seen.tokens) if seen.tokens else torch.zeros(0, dtype=torch.long)
    bigrams = torch.cat(seen.bigrams) if seen.bigrams else torch.zeros(0, dtype=torch.long)
    out["top_token_share"], out["distinct_bigram_fraction"] = evaluation.token_shares(tokens, bigrams)
    if tokens.numel() and unseen is not None:
        out["unseen_id_fraction"] = float(unseen[tokens.clamp(0, unseen.shape[0] - 1)].float().mean())
    return out


def unseen_gain(reward_model, seen: Observation, unseen, seed: int) -> dict[str, float | None]:
    """What the reward model pays for the ids it never trained on, on the round's last
    UNSEEN_SEQUENCES sequences: each scored as sampled and again with every unseen response id
    replaced by a seen id drawn uniformly (a private generator seeded by ``seed``; never the pad
    id 0), in eval mode (no dropout) without gradients. ``unseen_reward_gain``: the mean of the
    paired differences (reward units; above 0: unseen ids score above an average seen id);
    ``unseen_reward_gain_se``: its standard error. Both None without ``unseen`` or sequences.
    The training RNG is untouched."""
    import torch
    out = {"unseen_reward_gain": None, "unseen_reward_gain_se": None}
    if unseen is None or not seen.recent:
        return out
    generator = torch.Generator().manual_seed(seed)
    pool = (~unseen).nonzero().flatten()
    pool = pool[pool != 0] if bool((pool != 0).any()) else pool
    was_training = reward_model.training
    reward_model.eval()
    gains: list[float] = []
    try:
        with torch.no_grad():
            for x, prompt_mask, mask in seen.recent:
                response = torch.ones_like(x, dtype=torch.bool) if prompt_mask is None else ~prompt_mask
                response = response & mask if mask is not None else response
                swap = unseen.to(x.device)[x.clamp(0, unseen.shape[0] - 1)] & response
                drawn = pool[torch.randint(len(pool), tuple(x.shape), generator=generator)].to(x.device)
                before = reward_model(x, prompt_mask=prompt_mask, mask=mask).float().reshape(-1)
                after = reward_model(torch.where(swap, drawn, x), prompt_mask=prompt_mask, mask=mask).float().reshape(-1)
                gains += (before - after).cpu().tolist()
    finally:
        reward_model.train(was_training)
    gains = gains[-UNSEEN_SEQUENCES:]
    mean = sum(gains) / len(gains)
    spread = math.sqrt(sum((g - mean) ** 2 for g in gains) / max(len(gains) - 1, 1))
    return {"unseen_reward_gain": mean, "unseen_reward_gain_se": spread / math.sqrt(len(gains))}


def held_out_figures(held, groups: list[str | None] | None = None) -> dict[str, Any]:
    """The row's HELD_OUT_KEYS from one ``evaluation.HeldOut`` (None: not evaluated, every key
    null); ``groups``: the held-out prompts' groups (``builder.prompt_texts``; the per-group means
    null with one group or none)."""
    from policy_optimization import evaluation
    if held is None:
        return dict.fromkeys(HELD_OUT_KEYS)
    groups = groups or [None] * len(held.per_prompt)
    repeated = held.repetition or {}
    return {"held_out_reward": held.reward_mean, "held_out_std": held.reward_std, "held_out_per_prompt": held.per_prompt,
            "held_out_gold": held.gold_mean, "held_out_gold_std": held.gold_std,
            "held_out_gold_per_prompt": held.gold_per_prompt,
            "held_out_per_group": evaluation.group_means(held.per_prompt, groups),
            "held_out_gold_per_group": evaluation.group_means(held.gold_per_prompt, groups),
            "held_out_top_token_share": repeated.get("top_token_share"),
            "held_out_distinct_bigram_fraction": repeated.get("distinct_bigram_fraction"),
            "held_out_longest_run": repeated.get("longest_run")}


def build_row(round_: int, seen: Observation, grouped: bool, wall_s: float, printed: str,
              memory: dict[str, float], probe: dict[str, float | None], norms: dict[str, float],
              non_finite_weights: bool, lr: float, held_out, unseen=None,
              gain: dict[str, float | None] | None = None, groups: list[str | None] | None = None) -> dict[str, Any]:
    """The metrics row of one round, keys ``ROW_KEYS`` (``rules`` filled by the watchdog): rewards
    and groups, advantages, response lengths and tokens (``token_figures``), the library's KL term
    (mean over minibatches), the policy probe, printed losses (``streams.parse_losses``), gradient
    norm (mean over the actor's steps), trainable change norms, seconds (``wall_s``), MiB
    (``memory``: peak_mib, rss_mib) and the held-out evaluation (``held_out``: an
    ``evaluation.HeldOut``, or None on a round not evaluated), the reward model's coverage
    (``unseen``: ``unseen_mask``; ``gain``: ``unseen_gain``'s figures), per group of held-out
    prompts (``groups``: ``held_out_figures``)."""
    lengths = seen.response_lengths
    advantages = seen.advantages
    sizes = {len(rollout) for rollout in seen.rewards}
    row = {"round": round_, "rollouts": len(seen.rewards), "group_size": sizes.pop() if len(sizes) == 1 else None,
           "learn_calls": seen.learn_calls,
           "wall_s": round(wall_s, 4), "tokens_per_s": round(seen.sampled_tokens / wall_s, 2) if wall_s > 0 else None,
           **memory, **reward_figures(seen, grouped),
           "advantage_zero_fraction": (sum(a == 0.0 for a in advantages) / len(advantages)) if advantages else None,
           "advantage_abs_max": max((abs(a) for a in advantages), default=None),
           "response_length_mean": _mean([float(n) for n in lengths]),
           "one_token_response_fraction": (sum(n <= 1 for n in lengths) / len(lengths)) if lengths else None,
           **token_figures(seen, unseen), **(gain or dict.fromkeys(("unseen_reward_gain", "unseen_reward_gain_se"))),
           "kl_rollout": _mean([float(v) for v in seen.kl_terms]), **probe, "losses": streams.parse_losses(printed),
           "grad_norm": _mean([float(v) for v in seen.grad_norms]), "optimizer_steps": dict(seen.steps),
           "trainable_change_norm": norms, "non_finite_weights": non_finite_weights, "lr": lr,
           **held_out_figures(held_out, groups), "rules": []}
    return {key: row[key] for key in ROW_KEYS}
