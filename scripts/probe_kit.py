"""The probe kit: a tiny PaLM, a scalar reward model and tiny prompts, built on the CPU in about a
second, so that a 10-line script checks a behaviour of the installed library when the tree is
silent or a fact is in doubt (references/probes.md has worked probes). Each trainer with the
smoke's settings on them: policy-optimization's ``policy_optimization/tiny_trainers.py``.

From any copy of the skill tree with only the library installed::

    import sys
    sys.path.insert(0, "<skill root>/scripts")
    import probe_kit                                    # adds the tree's import roots
    palm = probe_kit.tiny_palm(seed=0)
    reward = probe_kit.tiny_reward_model(palm)          # (b, n) ids -> (b,) scores

This module is the one home of the tiny sizes that the smokes (tiny-rlhf-smoke, tiny-palm-smoke,
tiny-reward-smoke), the learning check, the canaries and the probes build: ``TINY_PALM`` and its
variants derive from it with an override. Nothing here imports torch until a function is called.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from skill_runtime import byte_tokenizer  # noqa: E402  (adds the tree's import roots)

# The tiny PaLM: big enough to exercise every code path, small enough for a laptop CPU (about 27k
# weights). 257 token ids are the byte tokenizer's (byte b -> id b + 1, 0 the pad id), so text
# prompts and random ids share one vocabulary.
TINY_PALM = dict(num_tokens=byte_tokenizer.ByteTokenizer.vocab_size, dim=32, depth=1, heads=2, dim_head=16)
# The learning check's toy task (tiny-rlhf-smoke --learn): the same PaLM over 16 ids, so that the
# rule-based reward (half the ids are targets) starts near 0.5 and a few updates move it. PaLM.generate
# keeps the top ceil(0.1 * num_tokens) logits (palm_rlhf_pytorch/utils.py top_k, thres 0.9): 2
# candidates per step here; 10 ids or fewer would leave 1, greedy.
LEARN_PALM = {**TINY_PALM, "num_tokens": 16}

PROMPT_COUNT = 4         # random token-ids prompts of the smoke
PROMPT_LENGTHS = (3, 6)  # their lengths, inclusive; right-padded with the pad id 0


def tiny_palm(seed: int | None = None, **overrides):
    """``PaLM(**TINY_PALM, **overrides)`` on the CPU (``overrides``: any PaLM argument, e.g. ``dim=64``
    or ``causal=False``); with ``seed``, ``torch.manual_seed(seed)`` first, so two calls build
    identical weights."""
    import torch
    from palm_rlhf_pytorch import PaLM
    if seed is not None:
        torch.manual_seed(seed)
    return PaLM(**{**TINY_PALM, **overrides})


def tiny_reward_model(palm=None, **overrides):
    """A scalar ``RewardModel`` (``num_binned_output=0``; ``overrides``: any RewardModel argument)
    on its own tiny PaLM: a deep copy of ``palm`` (RewardModel copies what it is given), or of a
    fresh ``tiny_palm()``. ``reward_model(seq (b, n) int64, prompt_mask=(b, n) bool) -> (b,) float32``."""
    from palm_rlhf_pytorch import RewardModel
    return RewardModel(palm if palm is not None else tiny_palm(), **{"num_binned_output": 0, **overrides})


def tiny_prompt_ids(seed: int = 0, count: int = PROMPT_COUNT, lengths: tuple[int, int] = PROMPT_LENGTHS,
                    num_tokens: int = TINY_PALM["num_tokens"]):
    """``(count, max_len)`` int64 prompt ids in [1, num_tokens), lengths drawn from ``lengths``
    (inclusive), right-padded with 0 (the trainers' default ``pad_value``, stripped before a rollout);
    drawn from their own generator seeded with ``seed``, so the global RNG is untouched."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (count,), generator=gen)
    ids = torch.randint(1, num_tokens, (count, int(lens.max())), generator=gen)
    keep = torch.arange(ids.shape[1]) < lens[:, None]
    return ids.masked_fill(~keep, byte_tokenizer.PAD_ID)


if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("probe_kit.py: error: a module, not a command: import it in a probe "
                     "(references/probes.md): sys.path.insert(0, '<skill root>/scripts'); import probe_kit\n")
    sys.exit(2)
