"""A key-value-cached sampler for palm-rlhf-pytorch 0.8.0's ``PaLM.generate``, as a user-side fix
(nothing in the library is edited).

``PaLM.generate`` (palm_rlhf_pytorch/palm.py ``generate``) has no cache: every sampled token re-runs
``self.forward(out, ...)`` over the whole prefix and keeps only the last position's logits. Here
``generate(palm, seq_len, prompt, **kwargs)`` runs the library's own ``generate`` (its loop, filter,
``filter_thres``, temperature, Gumbel sampling, eos handling and padding after eos, all unchanged)
with its ``self.forward`` served by ``KVCacheForward`` for that call: the prompt once (prefill),
then one position per step, each layer's rotated keys and values kept. Every weight is applied by
the library's own modules (``token_emb``, each block's ``norm``, ``fused_attn_ff_proj``, LoRA
modules, ``attend``, ``attn_out``, ``ff_out``, the final ``norm``, ``to_logits``) and its own
functions (``apply_rotary_pos_emb``, ``l2norm``); what is re-expressed for new positions only is
the order of ``ParallelTransformerBlock.forward`` (palm.py:189-259) and, with ``flash_attn``, the
SDPA call for one query (``attend_last``). ``step_logit_diffs`` measures the difference against
the library's full forward at every step (tests/test_cached_sampler.py: fp32 max |diff| <= 1e-5
for every PaLM option that changes the forward).

Call ``install(trainer)`` (or ``install(palm)``) once after building a trainer: the policy PaLM's
``generate`` becomes a ``CachedSampler``, which every trainer's rollout reaches (ppo.py
``ActorCritic.generate``, grpo.py, tpo.py and flowrl.py ``Actor.generate`` call
``self.actor_palm.generate``). The trainers then score the sampled sequence with their own full
forward (ppo.py ``ActorCritic.forward``, grpo.py and flowrl.py ``Actor.forward``, tpo.py
``get_log_probs``), so their learning math does not depend on how the tokens were sampled.
``uninstall`` undoes it. A call the cache cannot serve (a non-causal PaLM, a forward argument
other than ``finetune_scope``/``disable_lora``, hooks on a layer, a patched ``forward``) runs the
library's generate unchanged.

Only torch and palm_rlhf_pytorch are imported (lazily); this file imports nothing from the
skill package but ``ddp_fixes`` (in the skill root's scripts/) and runs from a copy of the skill tree.
"""
from __future__ import annotations

import sys
from typing import Any

SAMPLERS = ("library", "cached")  # the run config's [run] sampler and the helpers' --sampler
DEFAULT_SAMPLER = "library"
CACHED_FORWARD_KWARGS = frozenset({"finetune_scope", "disable_lora"})  # what generate may pass to forward


def policy_palm(target):
    """The PaLM whose ``generate`` rollouts call: ``target`` itself when it is a PaLM, else the
    trainer's policy (ddp_fixes.checkpoint_module: PPO's actor-critic, else the actor, unwrapped)
    ``.actor_palm``. Raises ValueError for anything else."""
    from palm_rlhf_pytorch import PaLM
    if isinstance(target, PaLM):
        return target
    import ddp_fixes
    try:
        return ddp_fixes.checkpoint_module(target).actor_palm
    except (AttributeError, ValueError):
        raise ValueError(f"not a PaLM or a palm_rlhf_pytorch trainer: {type(target).__name__}") from None


class CachedSampler:
    """Stands in for ``palm.generate`` (an instance attribute, so ``state_dict`` and ``parameters``
    are unchanged): ``sampler(seq_len, prompt=None, **kwargs)`` is ``generate(palm, ...)``."""

    def __init__(self, palm) -> None:
        self.palm = palm

    def __call__(self, seq_len: int, prompt=None, **kwargs):
        return generate(self.palm, seq_len, prompt, **kwargs)


def install(target):
    """Make ``target``'s policy PaLM (``policy_palm``) sample through the cache; returns the PaLM.
    Idempotent. Raises ValueError when its ``generate`` is already replaced by something else."""
    palm = policy_palm(target)
    current = palm.__dict__.get("generate")
    if isinstance(current, CachedSampler):
        return palm
    if current is not None:
        raise ValueError(f"{type(palm).__name__}.generate is already replaced by {type(current).__name__}")
    palm.generate = CachedSampler(palm)  # not a Module: a plain instance attribute
    return palm


def uninstall(target):
    """Give ``target``'s policy PaLM back the library's ``generate``; returns the PaLM."""
    palm = policy_palm(target)
    if isinstance(palm.__dict__.get("generate"), CachedSampler):
        del palm.__dict__["generate"]
    return palm


def installed(target) -> bool:
    """Whether ``target``'s policy PaLM samples through the cache."""
    return isinstance(policy_palm(target).__dict__.get("generate"), CachedSampler)


def apply(trainer, sampler: str) -> None:
    """``install(trainer)`` when ``sampler`` is ``"cached"``; nothing for ``"library"``.
    Raises ValueError for another name."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: choose from {', '.join(SAMPLERS)}")
    if sampler == "cached":
        install(trainer)


def cacheable(palm) -> bool:
    """Whether ``KVCacheForward`` can serve ``palm``: causal, its layers the library's
    ``Residual(ParallelTransformerBlock)`` without hooks of their own (the cache calls their
    submodules, not them), no global module hooks, and no ``forward`` already patched."""
    import torch.nn.modules.module as module_hooks
    from palm_rlhf_pytorch.palm import ParallelTransformerBlock, Residual
    if not palm.causal or "forward" in palm.__dict__:
        return False
    if module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks:
        return False
    for layer in palm.layers:
        if type(layer) is not Residual or type(layer.fn) is not ParallelTransformerBlock:
            return False
        if any(m._forward_hooks or m._forward_pre_hooks for m in (layer, layer.fn)):
            return False
    return True


def generate(palm, seq_len: int, prompt=None, **kwargs):
    """``PaLM.generate(palm, seq_len, prompt, **kwargs)`` (palm.py ``generate``: same arguments,
    same random draws, same output: (b, sampled) int64, or (b, n + sampled) without the prompt's
    removal) with ``palm.forward`` served by a ``KVCacheForward`` during the call; the library's
    generate unchanged when ``cacheable(palm)`` is False."""
    from palm_rlhf_pytorch import PaLM
    if not cacheable(palm):
        return PaLM.generate(palm, seq_len, prompt, **kwargs)
    cache = KVCacheForward(palm, seq_len)
    palm.forward = cache  # an instance attribute shadows the method generate calls (palm.py:432)
    try:
        return PaLM.generate(palm, seq_len, prompt, **kwargs)
    finally:
        del palm.__dict__["forward"]
        cache.leave_library_state()


def attend_last(attend, q, k, v):
    """``Attention.forward`` (palm_rlhf_pytorch/attention.py) for queries at the last positions of
    the keys, ``q`` (b, h, 1, d), ``k`` and ``v`` (b, n, d) (multi-query: one key/value head);
    returns (b, h, 1, d). Without flash the library's module itself: its causal mask for one query
    is ``get_mask(1)``, a 1x1 ``triu(1)`` that masks nothing. With ``flash_attn`` re-expressed:
    the library's ``flash_attn`` passes ``is_causal=self.causal``, which for one query and n keys is
    SDPA's top-left mask (the query would see key 0 only), so the same call is made with
    ``is_causal=False`` (the last query sees every key), under the kernels the library's
    ``cpu_config``/``cuda_config`` allow."""
    if not attend.use_flash_attn:
        return attend(q, k, v)
    import contextlib
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    heads = q.shape[1]
    k = k.unsqueeze(1).expand(-1, heads, -1, -1)
    v = v.unsqueeze(1).expand(-1, heads, -1, -1)
    config = attend.cuda_config if q.is_cuda else attend.cpu_config
    kernels = contextlib.nullcontext() if config is None else sdpa_kernel(
        [backend for backend, on in ((SDPBackend.FLASH_ATTENTION, config.enable_flash),
                                     (SDPBackend.MATH, config.enable_math),
                                     (SDPBackend.EFFICIENT_ATTENTION, config.enable_mem_efficient),
                                     (SDPBackend.CUDNN_ATTENTION, True)) if on])  # sdp_kernel's enable_cudnn default
    with kernels:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=attend.dropout if attend.training else 0.)


class KVCacheForward:
    """``PaLM.forward`` for one ``generate`` call, one position per step.

    The first call (the prompt, (b, n)) runs every position and keeps each layer's rotated keys and
    values, (b, capacity, dim_head) each, capacity = max(n, seq_len - 1): the longest prefix the
    library's loop feeds. Each later call with one more token runs that token only. A call that
    does not extend the last one by one token starts over (prefill). Returns the last position's
    ``(logits (b, 1, num_tokens), embeds (b, 1, dim))``, or the logits alone, as palm.py
    ``forward`` (generate keeps ``[:, -1]`` of both). Arguments generate cannot cache
    (``return_loss``, ``extra_embed``, ``return_only_embedding``) go to the library's forward.

    Rotary tables: the block's own cached table (``pos_emb``, ``pos_emb_scale``) when it covers
    the capacity, as the library's ``get_rotary_embedding`` slices it, else ``rotary_emb(capacity)``
    without caching it; ``leave_library_state`` then grows the block's caches as the library's
    last forward would have (so a later forward of the trainer sees the same tables either way).
    """

    def __init__(self, palm, seq_len: int) -> None:
        self.palm, self.seq_len = palm, seq_len
        self.length = 0      # positions cached
        self.longest = 0     # the longest prefix fed (what the library's last forward ran)
        self.keys: list = []
        self.values: list = []
        self.rotary: list = []
        self.batch = None
        self.loras: dict[int, tuple] = {}  # id(the layer's LoRA ModuleList) -> its four x -> x @ weight

    def __call__(self, x, return_loss: bool = False, disable_lora: bool = False, finetune_scope=None,
                 extra_embed=None, return_only_embedding: bool = False, return_logits_with_embedding: bool = False):
        from palm_rlhf_pytorch import PaLM
        palm = self.palm
        if return_loss or extra_embed is not None or return_only_embedding:
            return PaLM.forward(palm, x, return_loss=return_loss, disable_lora=disable_lora,
                                finetune_scope=finetune_scope, extra_embed=extra_embed,
                                return_only_embedding=return_only_embedding,
                                return_logits_with_embedding=return_logits_with_embedding)
        loras: Any = ()
        if finetune_scope is not None and not disable_lora:  # palm.py:489-492
            assert finetune_scope in palm.finetune_modules
            loras = palm.finetune_modules[finetune_scope]
        b, n = x.shape
        if self.length and b == self.batch and n == self.length + 1 and n <= self.capacity:
            start, new = self.length, x[:, -1:]
        else:
            start, new = 0, x
            self.reset(b, n, x.device)
        h = palm.token_emb(new)
        for i, layer in enumerate(palm.layers):
            lora = self.lora_products(loras[i]) if i < len(loras) else None
            h.add_(self.block(i, layer.fn, h, lora, start))  # Residual: x.add_(y) without grad (palm.py:62-63)
        self.length, self.longest = n, max(self.longest, n)
        embeds = palm.norm(h[:, -1:])
        logits = palm.to_logits(embeds)
        return (logits, embeds) if return_logits_with_embedding else logits

    def lora_products(self, lora):
        """The four LoRA modules of one layer as functions of ``x``: ``x @ w`` with ``w`` each module's
        ``weight`` (``(A @ B) * scale``, lora.py), computed once per ``generate`` call (the weights do
        not change while it samples) instead of at every step: ``LoRA.forward`` is ``x @ self.weight``,
        so the values are the same bit for bit. A module with hooks is called as it is."""
        key = id(lora)
        if key not in self.loras:
            self.loras[key] = tuple(module if module._forward_hooks or module._forward_pre_hooks
                                    else (lambda x, w=module.weight: x @ w) for module in lora)
        return self.loras[key]

    def reset(self, batch: int, n: int, device) -> None:
        """Empty caches for ``batch`` sequences and the rotary table of every block."""
        self.batch, self.capacity = batch, max(n, self.seq_len - 1)
        self.keys = [None] * len(self.palm.layers)
        self.values = [None] * len(self.palm.layers)
        self.rotary = [self.rotary_table(layer.fn, self.capacity, device) for layer in self.palm.layers]

    @staticmethod
    def rotary_table(block, n: int, device):
        """(positions (n, dim_head), scale (n, dim_head) or (1,)): what palm.py
        ``get_rotary_embedding(n)`` returns, without caching a new table."""
        if block.pos_emb is not None and block.pos_emb.shape[-2] >= n:
            return block.pos_emb[:n], block.pos_emb_scale[:n]
        return block.rotary_emb(n, device=device)

    def block(self, i: int, block, x, lora, start: int):
        """``ParallelTransformerBlock.forward`` (palm.py:189-259) of positions ``start`` to
        ``start + m`` (``x``: (b, m, dim) residual stream there), their keys and values cached;
        returns the block's output (b, m, dim), to be added to ``x``. The same modules and
        functions in the same order; attention reads every cached key (``attend_last`` for one
        new position after the prompt)."""
        from palm_rlhf_pytorch.palm import apply_rotary_pos_emb, l2norm
        m = x.shape[1]
        x = block.norm(x)
        q, k, v, ff = block.fused_attn_ff_proj(x).split(block.fused_dims, dim=-1)
        if lora is not None:
            lora_q, lora_k, lora_v, lora_o = lora
            q = q + lora_q(x)
            k = k + lora_k(x)
            v = v + lora_v(x)
        q = q.unflatten(-1, (block.heads, -1)).transpose(1, 2)  # rearrange 'b n (h d) -> b h n d' (palm.py:228)
        if block.qk_rmsnorm:
            q, k = map(l2norm, (q, k))
            q = q * block.q_scale
            k = k * block.k_scale
        positions, scale = self.rotary[i]
        positions = positions[start:start + m]
        if scale.shape[0] == self.rotary[i][0].shape[0]:  # xpos: one row per position; else ones(1)
            scale = scale[start:start + m]
        q = apply_rotary_pos_emb(positions, q, scale)
        k = apply_rotary_pos_emb(positions, k, scale ** -1)
        if self.keys[i] is None:
            self.keys[i] = k.new_empty((k.shape[0], self.capacity, k.shape[-1]))
            self.values[i] = v.new_empty((v.shape[0], self.capacity, v.shape[-1]))
        self.keys[i][:, start:start + m] = k
        self.values[i][:, start:start + m] = v
        keys, values = self.keys[i][:, :start + m], self.values[i][:, :start + m]
        if start == 0:  # the prompt: queries and keys of the same positions, the library's causal mask
            out = block.attend(q, keys, values)
        else:
            out = attend_last(block.attend, q, keys, values)
        out = out.transpose(1, 2).flatten(2)  # rearrange 'b h n d -> b n (h d)' (palm.py:250)
        attn_out = block.attn_out(out)
        ff_out = block.ff_out(ff)
        if lora is not None:
            attn_out = attn_out + lora_o(out)
        return attn_out + ff_out

    def leave_library_state(self) -> None:
        """Grow each block's rotary and causal-mask caches to the longest prefix fed, as the
        library's forward at that length does (``get_rotary_embedding``, ``get_mask``)."""
        if not self.longest:
            return
        for layer in self.palm.layers:
            block = layer.fn
            device = block.fused_attn_ff_proj.weight.device
            block.get_rotary_embedding(self.longest, device)
            if not block.attend.use_flash_attn:
                block.attend.get_mask(self.longest, device)


class StepRecorder:
    """Records, while entered, every forward of ``palm`` that a sampling loop makes: the ids fed
    (a ``token_emb`` pre-hook) and the last position's logits (a ``to_logits`` hook), so that
    ``diffs`` can compare each step with the library's full forward of the same prefix. Works on
    either sampler and on any caller (a trainer's ``generate``): the steps are the first call (the
    prompt) and the calls that extend it by one token (the cache feeds that token alone, the
    library the whole prefix); recording stops at the first other call. A caller's own forward of
    the last prefix plus one token (a trainer scoring prompt + sampled) reads as one more step."""

    def __init__(self, palm) -> None:
        self.palm, self.fed, self.logits, self.handles = palm, [], [], []

    def __enter__(self) -> "StepRecorder":
        self.handles = [
            self.palm.token_emb.register_forward_pre_hook(lambda _m, inputs: self.fed.append(inputs[0].clone())),
            self.palm.to_logits.register_forward_hook(lambda _m, _i, out: self.logits.append(out[:, -1].detach().clone()))]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def prefixes(self) -> list:
        """The prefix (b, n) each recorded step sampled from, in order."""
        import torch
        out, prefix = [], None
        for ids in self.fed[:len(self.logits)]:
            if prefix is None:
                prefix = ids
            elif ids.shape[-1] == 1 and ids.shape[0] == prefix.shape[0]:
                prefix = torch.cat((prefix, ids), dim=-1)
            elif ids.shape == (prefix.shape[0], prefix.shape[-1] + 1) and torch.equal(ids[:, :-1], prefix):
                prefix = ids
            else:
                break
            out.append(prefix)
        return out

    def diffs(self, **forward_kwargs) -> list[float]:
        """Max |logits - library| per recorded step, in float32: the library's ``PaLM.forward`` of
        the step's prefix with ``forward_kwargs`` (``finetune_scope``, ``disable_lora``), last
        position, in eval mode (dropout off, as ``generate``'s ``eval_decorator``)."""
        import torch
        from palm_rlhf_pytorch import PaLM
        palm, was_training = self.palm, self.palm.training
        palm.eval()
        try:
            with torch.no_grad():
                return [float((logits.float() - PaLM.forward(palm, prefix, **forward_kwargs)[:, -1].float()).abs().max())
                        for prefix, logits in zip(self.prefixes(), self.logits)]
        finally:
            palm.train(was_training)


def step_logit_diffs(palm, seq_len: int, prompt, **kwargs) -> dict[str, Any]:
    """Sample with the cache (``generate``) and compare every step's logits with the library's
    full forward of the same prefix (``StepRecorder``): ``{steps, max_abs_diff, per_step,
    sequence}`` (``sequence``: what ``generate`` returned). ``kwargs`` go to ``generate``
    (``finetune_scope``, ``temperature``, ``eos_token``, ...)."""
    with StepRecorder(palm) as recorder:
        out = generate(palm, seq_len, prompt, **kwargs)
    per_step = recorder.diffs(**{k: v for k, v in kwargs.items() if k in CACHED_FORWARD_KWARGS})
    return {"steps": len(per_step), "max_abs_diff": max(per_step), "per_step": per_step, "sequence": out}


if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("cached_sampler.py: error: a module, not a command: import it and call install(trainer); "
                     "palm-rlhf-skill bench --rollouts measures it\n")
    sys.exit(2)
