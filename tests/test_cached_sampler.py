"""The cached sampler (sub-skills/policy-optimization/scripts/cached_sampler.py) against the
library's own ``PaLM.generate``: at every sampling step its logits match the library's full forward
of the same prefix (fp32 on CPU: max |diff| <= 1e-5) for every PaLM option that changes the
forward and on each trainer's generate path; the same seed samples the same tokens; a train round
with it moves the weights exactly as with the library's sampler; a broken cache fails the check."""
from __future__ import annotations

import copy

import pytest
import torch

import cached_sampler
import probe_kit
from policy_optimization import tiny_trainers, trainers

TOLERANCE = 1e-5  # fp32 on CPU, issue 32
PROMPT, NEW = 12, 20


def tiny(seed: int = 0, scopes=("actor",), **options):
    """The probe kit's tiny PaLM at depth 2 (a cut between blocks shows only from depth 2) with a
    LoRA scope 'actor' whose B is nonzero (a fresh LoRA adds exactly 0, hiding a scope mix-up), the
    adapter's weights (A @ B, A ~ N(0, 1) from lora.py) then about as large as the base's. (B at
    std 0.5, an adapter ten times the base, gave 1.5e-5 at xpos scale base 8: one-row and many-row
    matmuls round differently, and the adapter amplifies it.)"""
    return nonzero_lora(probe_kit.tiny_palm(seed=seed, **{"depth": 2, "finetune_scopes": scopes, **options}))


def nonzero_lora(palm):
    """``palm`` with every LoRA's B drawn from N(0, 0.05) (from the global generator)."""
    with torch.no_grad():
        for name, p in palm.finetune_modules.named_parameters():
            if name.endswith("B"):
                p.normal_(0, 0.05)
    return palm


def prompt_ids(batch: int = 3, length: int = PROMPT, seed: int = 0):
    return torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (batch, length),
                         generator=torch.Generator().manual_seed(seed))


def cached_steps(recorder: cached_sampler.StepRecorder) -> int:
    """Forwards that fed one token: the cache served them (the library feeds the whole prefix)."""
    return sum(ids.shape[-1] == 1 for ids in recorder.fed[1:])


OPTIONS = {  # PaLM options that change the forward, and generate arguments that change the path
    "plain": ({}, {}),
    "lora": ({}, {"finetune_scope": "actor"}),
    "lora_disabled": ({}, {"finetune_scope": "actor", "disable_lora": True}),
    "qk_rmsnorm": ({"qk_rmsnorm": True}, {"finetune_scope": "actor"}),
    "xpos_scale_base_8": ({"rotary_xpos_scale_base": 8}, {"finetune_scope": "actor"}),
    "flash_attn": ({"flash_attn": True}, {"finetune_scope": "actor"}),
    "dropout_in_train_mode": ({"attn_dropout": 0.5, "ff_dropout": 0.5}, {"finetune_scope": "actor"}),
    "eos_and_temperature": ({}, {"finetune_scope": "actor", "eos_token": 7, "temperature": 0.7}),
    "top_p": ({}, {"finetune_scope": "actor", "filter_thres": 0.5}),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_step_matches_the_librarys_forward(option):
    palm_options, kwargs = OPTIONS[option]
    palm = tiny(**palm_options)
    # in train mode with dropout: generate's eval_decorator turns dropout off for the call, and back on after
    palm.train(option == "dropout_in_train_mode")
    if option == "top_p":
        from palm_rlhf_pytorch.utils import top_p
        kwargs = {**kwargs, "filter_logits_fn": top_p}
    if option == "eos_and_temperature":
        from policy_optimization.smoke import checklist, settings  # the smoke's eos bias (a to_logits hook)
        checklist.raise_logit(palm, 7, settings.EOS_LOGIT_BIAS)  # rows end at eos at different steps
    torch.manual_seed(0)
    with cached_sampler.StepRecorder(palm) as recorder:
        out = cached_sampler.generate(palm, PROMPT + NEW, prompt_ids(), **kwargs)
    diffs = recorder.diffs(**{k: v for k, v in kwargs.items() if k in cached_sampler.CACHED_FORWARD_KWARGS})
    assert len(diffs) == len(recorder.logits) >= 2 and cached_steps(recorder) == len(diffs) - 1
    assert max(diffs) <= TOLERANCE, f"{option}: max |diff| {max(diffs):.3e} at step {diffs.index(max(diffs))}"
    assert palm.training == (option == "dropout_in_train_mode")
    if option == "lora":  # the check sees a scope mix-up: the same steps against the LoRA-off forward
        assert max(recorder.diffs()) > 100 * TOLERANCE
    if option == "eos_and_temperature":
        assert len(diffs) < NEW and out.shape[-1] == len(diffs)  # stopped early: every row reached eos
        after = torch.nn.functional.pad((out == 7).int(), (1, -1)).cumsum(-1) > 0
        assert (out[after] == 0).all() and after.any()  # the library's padding after eos
    else:
        assert out.shape == (3, NEW)


def test_prompt_longer_than_seq_len_samples_one_token_as_the_library():
    palm = tiny()
    prompt = prompt_ids(2, 10)
    torch.manual_seed(1)
    library = palm.generate(6, prompt, finetune_scope="actor")
    torch.manual_seed(1)
    cached = cached_sampler.generate(palm, 6, prompt, finetune_scope="actor")
    assert library.shape == cached.shape == (2, 1) and torch.equal(library, cached)


def test_a_cache_off_by_one_key_fails_the_check(monkeypatch):
    """The tolerance catches a classic cache bug: each new query misses its own key (forced failure)."""
    attend_last = cached_sampler.attend_last
    monkeypatch.setattr(cached_sampler, "attend_last", lambda attend, q, k, v: attend_last(attend, q, k[:, :-1], v[:, :-1]))
    result = cached_sampler.step_logit_diffs(tiny(), PROMPT + NEW, prompt_ids(), finetune_scope="actor")
    assert result["per_step"][0] <= TOLERANCE < 100 * TOLERANCE < result["max_abs_diff"]  # the prompt's step is right


def test_the_same_seed_samples_the_same_tokens():
    """Library and cache from the same seed, each on its own copy of the model (the library's
    rotary tables cold, regrown at every step): the measured agreement, 40 of 40 sequences here."""
    identical = total = 0
    for seed in range(10):
        palm = tiny(seed)
        twin = copy.deepcopy(palm)
        prompt = prompt_ids(4, seed=seed)
        torch.manual_seed(seed)
        library = palm.generate(PROMPT + NEW, prompt, finetune_scope="actor")
        torch.manual_seed(seed)
        cached = cached_sampler.generate(twin, PROMPT + NEW, prompt, finetune_scope="actor")
        identical += sum(torch.equal(a, b) for a, b in zip(library, cached))
        total += len(prompt)
        for block, other in zip(palm.layers, twin.layers):  # the caches left as the library leaves them
            assert torch.equal(block.fn.pos_emb, other.fn.pos_emb)
    assert identical >= 0.95 * total, f"{identical}/{total} sequences identical"


def rollout(name: str, trainer, seq_len: int):
    """One rollout's generate call exactly as the trainer's train() makes it (ppo.py ``train``:
    ``actor_critic_generate``; grpo.py, flowrl.py: ``actor_generate``; tpo.py: ``self.actor.generate``)."""
    state = trainer.prompt_token_ids[0]
    state = state[state != trainer.pad_value]
    if name == "ppo":
        return trainer.actor_critic_generate(state[None], max_seq_len=seq_len, eos_token=None, temperature=1.,
                                             return_values=True)
    states = state.repeat(tiny_trainers.GROUP_SAMPLES + 1, 1)
    generate = trainer.actor.generate if name == "tpo" else trainer.actor_generate
    return generate(states, max_seq_len=seq_len, eos_token=None, temperature=1.)


@pytest.mark.parametrize("name", list(trainers.TRAINERS))
def test_each_trainers_generate_path(name):
    """install(trainer) reaches the trainer's own rollout call; every step matches the library's
    forward with the trainer's LoRA scope; the logits the trainer stores come from its own full
    forward of the sampled sequence, not from the sampler."""
    torch.manual_seed(0)
    trainer = tiny_trainers.tiny_trainer(name, palm=tiny(scopes=()))
    palm, scope = trainers.actor_palm(name, trainer), trainers.actor_scope(name, trainer)
    nonzero_lora(palm)
    assert cached_sampler.install(trainer) is palm and cached_sampler.installed(trainer)
    with cached_sampler.StepRecorder(palm) as recorder:
        returned = rollout(name, trainer, tiny_trainers.max_seq_len(trainer))
    diffs = recorder.diffs(finetune_scope=scope)
    sampled = returned[0].shape[-1]
    assert sampled == tiny_trainers.max_seq_len(trainer) - recorder.fed[0].shape[-1] and cached_steps(recorder) == sampled - 1
    assert len(diffs) == sampled + (name != "tpo")  # the scoring forward of prompt + sampled reads as one more
    assert max(diffs) <= TOLERANCE
    sequence = returned[1]
    if name != "tpo":  # tpo.py Actor.generate returns no logits: train() scores with get_log_probs
        with torch.no_grad():
            assert torch.equal(returned[4], type(palm).forward(palm, sequence, finetune_scope=scope))


def test_a_train_round_moves_the_weights_as_with_the_librarys_sampler():
    """GRPO, one round from the same seed with each sampler: the same tokens, so the same
    learn() and bitwise the same LoRA weights (the trainer's math does not see the sampler)."""
    from accelerate.utils import set_seed
    weights = []
    for sampler in cached_sampler.SAMPLERS:
        set_seed(0)
        trainer = tiny_trainers.tiny_trainer("grpo", palm=tiny(scopes=()))
        cached_sampler.apply(trainer, sampler)
        assert cached_sampler.installed(trainer) == (sampler == "cached")
        before = {n: p.detach().clone() for n, p in trainer.actor.named_parameters()}
        _, error = trainers.bounded_train(trainer, 2, tiny_trainers.max_seq_len(trainer))
        assert error is None
        weights.append({n: p.detach().clone() for n, p in trainer.actor.named_parameters()})
        assert [n for n in before if not torch.equal(before[n], weights[-1][n])], "the round moved no LoRA weight"
    library, cached = weights
    assert library.keys() == cached.keys()
    assert all(torch.equal(library[n], cached[n]) for n in library)


def test_install_uninstall_and_what_the_cache_leaves_to_the_library():
    palm = tiny()
    keys = set(palm.state_dict())
    assert cached_sampler.install(palm) is cached_sampler.install(palm) is palm  # idempotent
    assert set(palm.state_dict()) == keys and isinstance(palm.generate, cached_sampler.CachedSampler)
    twin = copy.deepcopy(palm)  # the copy samples through its own cache
    assert twin.generate.palm is twin
    palm.generate = lambda *a, **k: None
    with pytest.raises(ValueError, match="already replaced"):
        cached_sampler.install(palm)
    del palm.generate
    assert not cached_sampler.installed(palm)
    cached_sampler.install(palm)
    cached_sampler.uninstall(palm)
    assert "generate" not in palm.__dict__
    with pytest.raises(ValueError, match="not a PaLM"):
        cached_sampler.install(object())
    with pytest.raises(ValueError, match="sampler 'fast'"):
        cached_sampler.apply(palm, "fast")


@pytest.mark.parametrize("case", ["layer_hook", "non_causal"])
def test_what_the_cache_cannot_serve_runs_the_library(case):
    palm = tiny(causal=case != "non_causal")
    if case == "layer_hook":
        palm.layers[1].register_forward_hook(lambda *_: None)
    assert not cached_sampler.cacheable(palm)
    with cached_sampler.StepRecorder(palm) as recorder:
        cached_sampler.generate(palm, PROMPT + 4, prompt_ids(), finetune_scope="actor")
    assert cached_steps(recorder) == 0 and len(recorder.fed) == 4


@pytest.mark.parametrize("name", list(trainers.TRAINERS))
def test_the_learning_check_learns_the_same_with_the_cache(name):
    """One seed of each trainer's learning check (tiny-rlhf-smoke --learn --sampler cached): the
    cache samples the same tokens, so the same held-out rewards before and after, and the same curve.
    (All four trainers, 5 seeds each, with --sampler cached: PASS, per seed identical to library.)"""
    from policy_optimization.smoke import learning_check
    cpu = torch.device("cpu")
    runs = [learning_check.learn_seed(name, 1, None, {"cpu": True}, cpu, sampler=sampler)
            for sampler in cached_sampler.SAMPLERS]
    assert runs[0] == runs[1] and runs[1]["gain"] != 0
