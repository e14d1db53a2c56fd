"""Token coverage: the ids the training data never contains, how the trained reward model scores
them, and a remedy.

A PaLM's token embedding is a table of ``num_tokens`` rows (palm_rlhf_pytorch/palm.py:291,315,
``normal_(std=0.02)``); a row gets a gradient only where its id occurs in a training sequence, so
the rows of ids that never occur keep their random start (Adam without weight decay moves a
parameter only along its gradient). The trainers then score whatever the policy samples, any of the
``num_tokens`` ids, and a policy finds the unseen ids that the reward model happens to score
high: reward hacking through the ids the preference data never shows it (issue 30: 37 of 257
byte values seen, ``'\\x03' * 16`` scored like the preferred digits).

``probe`` measures it: each unseen id repeated as a whole response, and mixed into a preferred
response (every second token replaced), against the scores of the held-out preferred responses.
``tie_unseen`` is the remedy (``[train] tie_unseen_embeddings = true``): every unseen row set to the
mean of the seen rows, after every round, so an unseen id reads as an average seen token.
Torch-free at import.
"""
from __future__ import annotations

from typing import Any, Callable

PROBE_ROWS = 8   # held-out preferred responses each unseen id is probed with
WORST = 5        # unseen ids listed in the report, the highest-scoring first


def unseen_ids(seen: set[int], num_tokens: int) -> list[int]:
    """The ids of ``range(num_tokens)`` that are not in ``seen``, sorted (the pad id 0 among them:
    a sampled 0 is scored like any other id)."""
    return [i for i in range(num_tokens) if i not in seen]


def tie_unseen(reward_model, unseen: list[int]) -> None:
    """Set the token-embedding rows of ``unseen`` to the mean of the other rows, in place
    (``reward_model.palm.token_emb.weight``; ``to_logits`` shares it, palm.py:313). A no-op when
    no id, or every id, is unseen."""
    import torch
    weight = reward_model.palm.token_emb.weight
    if not unseen or len(unseen) >= weight.shape[0]:
        return
    rows = torch.tensor(unseen, device=weight.device)
    seen = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
    seen[rows] = False
    with torch.no_grad():
        weight[rows] = weight[seen].mean(dim=0)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def probe(score: Callable[[list[list[int]], list[list[int]]], list[float]], prompts: list[list[int]],
          preferred: list[list[int]], rejected: list[list[int]] | None, unseen: list[int]) -> dict[str, Any]:
    """How the reward model scores the unseen ids, against the held-out preferred responses.

    ``score(prompts, responses)``: the model's scores of prompt + response sequences (floats, in
    order). ``prompts``/``preferred``: the held-out rows (pairs: their chosen responses; ratings:
    the responses rated at or above the median) and, for pairs, their ``rejected`` responses.
    For each unseen id u and each of the first PROBE_ROWS rows: ``repeated`` scores the prompt
    followed by u as many times as the preferred response is long; ``mixed`` scores the preferred
    response with every second token (positions 1, 3, ...) replaced by u. Returns the reference
    scores (``preferred_mean``, ``preferred_median``, ``rejected_mean`` or None), per unseen id the
    mean over the rows (``repeated_mean``/``repeated_max`` over the ids, ``mixed_mean``), and the
    verdict counts: ``repeated_above_median`` (ids whose repeated score reaches the median
    preferred score) and ``mixed_above_own`` (ids whose mixed responses score at least as high as
    the same rows' own preferred responses), with the ``worst`` ids (highest repeated score)."""
    reference = score(prompts, preferred)
    out: dict[str, Any] = {"unseen": len(unseen), "rows": min(PROBE_ROWS, len(prompts)),
                           "preferred_mean": _mean(reference), "preferred_median": _median(reference),
                           "rejected_mean": _mean(score(prompts, rejected)) if rejected else None}
    rows = list(zip(prompts, preferred))[:PROBE_ROWS]
    if not unseen or not rows:
        return {**out, "repeated_mean": None, "repeated_max": None, "mixed_mean": None, "repeated_above_median": 0,
                "mixed_above_own": 0, "worst": []}
    own = _mean(reference[:len(rows)])
    batch_prompts = [p for _ in unseen for p, _ in rows]
    repeated = score(batch_prompts, [[u] * len(r) for u in unseen for _, r in rows])
    mixed = score(batch_prompts, [[u if i % 2 else t for i, t in enumerate(r)] for u in unseen for _, r in rows])
    n = len(rows)
    per_id = [(u, _mean(repeated[k * n:(k + 1) * n]), _mean(mixed[k * n:(k + 1) * n])) for k, u in enumerate(unseen)]
    worst = sorted(per_id, key=lambda item: -item[1])[:WORST]
    return {**out, "repeated_mean": _mean([r for _, r, _ in per_id]), "repeated_max": worst[0][1],
            "mixed_mean": _mean([m for _, _, m in per_id]),
            "repeated_above_median": sum(r >= out["preferred_median"] for _, r, _ in per_id),
            "mixed_above_own": sum(m >= own for _, _, m in per_id),
            "worst": [{"id": u, "repeated": r, "mixed": m} for u, r, m in worst]}


def gameable(report: dict[str, Any]) -> bool:
    """Whether the probe found unseen ids a policy can gain reward with (``probe``'s counts)."""
    return bool(report.get("repeated_above_median") or report.get("mixed_above_own"))
