"""The held-out reward of a policy: the measure of the learning check (``tiny-rlhf-smoke --learn``),
of a real run (``palm-rlhf-skill train``'s ``[eval]``) and of ``palm-rlhf-skill evaluate``, one
function for all three (``held_out``), with the per-prompt breakdown and an optional gold metric
scored on the same samples, and what the samples are made of (``repetition``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class HeldOut:
    """One held-out evaluation. Means weigh every prompt and sample the same; ``per_prompt`` is
    one mean per prompt in the order given (the file's); stds are population stds over every
    sample; the gold figures are None without a gold metric. ``samples``: the first ``keep``
    sequences' ``{prompt, response}`` (lists of int ids, the response up to its eos), ``index``
    (the prompt's, file order), ``reward`` and ``gold``, the first sample of each prompt first;
    ``repetition``: ``repetition`` of every sample's response."""
    reward_mean: float
    reward_std: float
    per_prompt: list[float]
    gold_mean: float | None = None
    gold_std: float | None = None
    gold_per_prompt: list[float] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    repetition: dict[str, float | int | None] = field(default_factory=dict)


def _summary(values: list[list[float]]) -> tuple[float, float, list[float]]:
    """(mean, population std, per-prompt means) of one score per sample, grouped per prompt."""
    flat = [v for group in values for v in group]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((v - mean) ** 2 for v in flat) / len(flat))
    return mean, std, [sum(group) / len(group) for group in values]


def token_shares(tokens, bigrams) -> tuple[float | None, float | None]:
    """(top_token_share, distinct_bigram_fraction) of response ``tokens`` (1-D int64 ids) and
    their ``bigrams`` (1-D int64, each ``a * 2**32 + b``): the share of every token that is the
    single most frequent id (1.0: one repeated token), and distinct bigrams over all bigrams (the
    "distinct-2" of Li et al. 2016, "A diversity-promoting objective"); None where there are none."""
    import torch
    top = float(torch.unique(tokens, return_counts=True)[1].max()) / tokens.numel() if tokens.numel() else None
    distinct = torch.unique(bigrams).numel() / bigrams.numel() if bigrams.numel() else None
    return top, distinct


OWN_MIN_TOKENS = 8  # a response shorter than this has no own top token share (``repetition``)


def repetition(responses: list) -> dict[str, float | int | None]:
    """What sampled ``responses`` (1-D int64 ids each, up to its eos) are made of, pooled as a
    round's rollouts are (``token_shares``): ``top_token_share``, ``distinct_bigram_fraction``;
    per response: ``response_top_token_share``, the median over responses of at least
    OWN_MIN_TOKENS tokens of each one's own top token share (a policy that repeats a different id
    for each prompt; None without such responses: in a shorter one a single repeat is half of it),
    and ``longest_run``, the longest run of one id in any response (tokens). Every figure None
    without response tokens."""
    import torch
    responses = [r for r in responses if r.numel()]
    if not responses:
        return dict.fromkeys(("top_token_share", "distinct_bigram_fraction", "response_top_token_share", "longest_run"))
    top, distinct = token_shares(torch.cat(responses), torch.cat([r[:-1] * 2**32 + r[1:] for r in responses]))
    own = sorted(token_shares(r, r[:0])[0] for r in responses if r.numel() >= OWN_MIN_TOKENS)
    median = None if not own else own[len(own) // 2] if len(own) % 2 else (own[len(own) // 2 - 1] + own[len(own) // 2]) / 2
    runs = max(int(torch.unique_consecutive(r, return_counts=True)[1].max()) for r in responses)
    return {"top_token_share": top, "distinct_bigram_fraction": distinct, "response_top_token_share": median,
            "longest_run": runs}


NO_GROUP = "(no group)"  # the group of a prompt without one, beside prompts that have one


def group_means(values: list[float] | None, groups: list[str | None]) -> dict[str, float] | None:
    """The mean of per-prompt ``values`` (``HeldOut.per_prompt`` or ``gold_per_prompt``) within
    each group of ``groups`` (one name per prompt, file order; None: NO_GROUP), in order of first
    appearance; every prompt has the same number of samples, so this is the mean over the group's
    samples. None without values, or when every prompt is in one group (the held-out mean says it)."""
    if values is None or len(set(groups)) < 2:
        return None
    out: dict[str, list[float]] = {}
    for value, group in zip(values, groups):
        out.setdefault(NO_GROUP if group is None else group, []).append(value)
    return {group: sum(v) / len(v) for group, v in out.items()}


def held_out(palm, scope: str | None, reward_model, prompts, samples: int, max_seq_len: int, seed: int,
             temperature: float = 1.0, eos_token: int | None = None, pad_value: int = 0, metric=None,
             keep: int = 0) -> HeldOut:
    """The reward of ``palm`` sampled on held-out ``prompts``, each ``samples`` times, exactly as a
    rollout samples: ``PaLM.generate(max_seq_len, prompt=..., finetune_scope=scope)`` with its
    default top-k filter (palm_rlhf_pytorch/palm.py ``generate``), ``temperature`` and
    ``eos_token``; ``scope`` is the policy's LoRA scope (``trainers.actor_scope``; None trains and
    samples the plain PaLM). Prompts of one length are sampled as one batch, in order of first
    appearance, so a set of equal-length prompts is one ``generate`` call.

    ``prompts``: (p, n) int64 ids right-padded with ``pad_value`` (stripped, as the trainers strip
    it before a rollout), or a list of 1-D int64 tensors. The reward model, and ``metric`` (the
    gold metric: a module called the same way, e.g. a ``RuleReward``; None: no gold figures), get
    the trainers' arguments: ``prompt_mask`` (b, n) bool, and with ``eos_token`` a ``mask`` (b, n)
    bool, False after each row's first eos (palm_rlhf_pytorch/grpo.py ``Actor.generate``).
    Sampling runs inside ``torch.random.fork_rng`` with the generator seeded by ``seed``:
    training's random stream is untouched, and the same noise is drawn before and after training.
    ``keep``: how many decoded sequences to return in ``samples`` (0: none); ``repetition`` is over
    every sample's response either way. Returns a HeldOut.
    """
    import torch
    import torch.nn.functional as F

    rows = [row[row != pad_value] for row in prompts]
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(int(row.shape[0]), []).append(i)
    device = next(iter(palm.parameters())).device
    rewards: list[list[float]] = [[] for _ in rows]
    gold: list[list[float]] = [[] for _ in rows]
    kept: list[tuple[int, int, dict[str, Any]]] = []  # (sample index, prompt index, sample)
    responses = []  # every sample's response ids, up to its eos (host)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for group in by_length.values():
            batch = torch.stack([rows[i] for i in group]).to(device).repeat_interleave(samples, dim=0)
            response = palm.generate(max_seq_len, prompt=batch, finetune_scope=scope,
                                     temperature=temperature, eos_token=eos_token)
            sequence = torch.cat((batch, response), dim=1)
            prompt_mask = (torch.arange(sequence.shape[1], device=device) < batch.shape[1]).expand_as(sequence)
            kwargs = {}
            if eos_token is not None:
                mask = (sequence == eos_token).cumsum(dim=-1) == 0
                kwargs["mask"] = F.pad(mask, (1, -1), value=True)  # the eos itself counts
            with torch.no_grad():
                scores = reward_model(sequence, prompt_mask=prompt_mask, **kwargs).float().reshape(-1).tolist()
                golds = None if metric is None else metric(sequence, prompt_mask=prompt_mask, **kwargs).float().reshape(-1).tolist()
            for j, score in enumerate(scores):
                i = group[j // samples]
                rewards[i].append(score)
                if golds is not None:
                    gold[i].append(golds[j])
                valid = kwargs["mask"][j, batch.shape[1]:] if kwargs else torch.ones_like(response[j], dtype=torch.bool)
                responses.append(response[j][valid].cpu())
                if keep:
                    kept.append((j % samples, i, {"prompt": rows[i].tolist(), "response": responses[-1].tolist(),
                                                  "index": i, "reward": score,
                                                  "gold": None if golds is None else golds[j]}))
    mean, std, per_prompt = _summary(rewards)
    out = HeldOut(mean, std, per_prompt, samples=[s for _, _, s in sorted(kept, key=lambda k: k[:2])[:keep]],
                  repetition=repetition(responses))
    if metric is not None:
        out.gold_mean, out.gold_std, out.gold_per_prompt = _summary(gold)
    return out


def of_run(resolved: dict[str, Any], palm, scope: str | None, reward_model, prompt_ids, seed: int, metric=None,
           pad_value: int = 0, keep: int = 0) -> HeldOut:
    """``held_out`` as a run config samples: [eval] samples per prompt, [train] max_seq_len,
    temperature and eos_token (the library's defaults filled in); what ``train``'s evaluations,
    ``plan --execute`` and ``evaluate`` call, so the three score alike."""
    train = resolved["effective"]["train"]
    return held_out(palm, scope, reward_model, prompt_ids, resolved["eval"]["samples"], train["max_seq_len"], seed,
                    temperature=train.get("temperature", 1.0), eos_token=train.get("eos_token"),
                    pad_value=pad_value, metric=metric, keep=keep)
