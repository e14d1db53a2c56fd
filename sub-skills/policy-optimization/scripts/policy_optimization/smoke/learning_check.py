"""The learning check (``tiny-rlhf-smoke --learn``): does each trainer raise a rule-based reward on
a toy task, over several seeds? Per seed the steps are build, measure, train, measure
(``learn_seed``); ``learn_trainer`` runs the seeds and judges them (``learning_verdict``). The
settings are calibrated with calibrate_learning.py. Torch-free at import."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cached_sampler
import probe_kit
from skill_runtime import exits, options, reporting, streams
from policy_optimization import evaluation, tiny_trainers, trainers
from policy_optimization.smoke import settings

# Learning check (--learn): does the reward rise? ------------------------------------------------
# The toy task: the probe kit's tiny PaLM over 16 token ids (probe_kit.LEARN_PALM) samples
# LEARN_NEW_TOKENS tokens after a random prompt of LEARN_PROMPT_LEN ids; the rule-based reward
# (reward-modeling/scripts/rule_reward.py) is the fraction of sampled tokens whose id is in
# LEARN_TARGET_IDS: half the ids, so an untrained policy scores about 0.5 and the reward has room to
# rise, or (inverted control) to fall.
LEARN_PALM = probe_kit.LEARN_PALM
LEARN_TARGET_IDS = tuple(range(1, 9))
LEARN_PROMPT_LEN = 4
LEARN_NEW_TOKENS = 8   # a power of two: every reward k/8 is exact in float32, so a group of equal
                       # rewards gets GRPO's, TPO's and FlowRL's (r - mean) / std exactly 0
LEARN_TRAIN_PROMPTS = 16  # prompts the trainer draws rollouts from
LEARN_EVAL_PROMPTS = 16   # held-out prompts, drawn after the training ones from the same generator
LEARN_EVAL_SAMPLES = 8    # completions per held-out prompt, the same sampling noise before and after
LEARN_SEEDS = 5           # seeds per trainer by default: --seed, --seed + 1, ...
LEARN_MIN_IMPROVED = 0.8  # fraction of seeds whose held-out reward must rise (4 of 5)
MAX_LEARN_SEEDS = 100
LEARN_CONTROLS = ("frozen", "inverted")


@dataclass(frozen=True)
class LearnSetting:
    """One trainer's row of the learning check; calibrated with calibrate_learning.py."""
    episodes: int        # learn() calls: train(num_episodes=episodes, ...)
    rollouts: int        # rollouts per learn(): max_timesteps = update_timesteps = rollouts
    lr: float            # actor learning rate; PPO's critic and FlowRL's partition function too
    group_size: int      # completions per prompt per rollout (PPO: 1, no group)
    minibatch_size: int
    threshold: float     # the median held-out gain over the seeds must reach it
    why: str             # the measured reason for these numbers


LEARN_SETTINGS = {  # alternatives measured on seeds 0-9: calibrate_learning.py --seeds 10 --set ...
    "ppo": LearnSetting(
        episodes=8, rollouts=16, lr=1e-2, group_size=1, minibatch_size=4, threshold=0.15,
        why="seeds 0-9 all rose (median +0.40, least +0.17); minibatch 8 gave a median of +0.30, lr 3e-3 "
            "+0.14; minibatch 16, 6 x 12 rollouts, or 6 x 8 with lr 2e-2 or minibatch 2 let a seed fall "
            "(to -0.56 at worst); one completion per rollout: PPO takes most of the check's time"),
    "grpo": LearnSetting(
        episodes=5, rollouts=4, lr=3e-3, group_size=8, minibatch_size=8, threshold=0.2,
        why="the default lr 1e-4 gave a median of +0.03, 1e-3 +0.27; groups of 8, one group per "
            "optimizer step, 4 steps per learn()"),
    "tpo": LearnSetting(
        episodes=5, rollouts=4, lr=3e-3, group_size=8, minibatch_size=1, threshold=0.2,
        why="lr 1e-4 gave a median of +0.05, 1e-3 +0.38; TPO stores a group as one item, so minibatch 1 "
            "is one group of 8 per step, as GRPO's 8"),
    "flowrl": LearnSetting(
        episodes=5, rollouts=4, lr=3e-3, group_size=8, minibatch_size=8, threshold=0.2,
        why="lr 1e-4 gave a median of +0.04, 1e-3 +0.28 (actor and partition function); otherwise as GRPO"),
}


def rule_reward_module():
    """reward-modeling/scripts/rule_reward.py (it imports torch, so only when the check runs)."""
    import rule_reward
    return rule_reward


def learn_trainer_kwargs(spec: trainers.TrainerSpec, setting: LearnSetting) -> dict[str, Any]:
    """Constructor arguments of one trainer for the learning check: the probe kit's
    (``tiny_trainers.trainer_kwargs``) with the setting's group, minibatch and learning rate (PPO's
    critic and FlowRL's partition function learn at it too)."""
    rates = {"ppo": {"critic_lr": setting.lr}, "flowrl": {"partition_function_lr": setting.lr}}.get(spec.name, {})
    return tiny_trainers.trainer_kwargs(spec.name, group_size=setting.group_size, palm_dim=LEARN_PALM["dim"],
                                    minibatch_size=setting.minibatch_size, actor_lr=setting.lr, **rates)


def held_out(name: str, trainer, reward_model, prompts, seed: int) -> float:
    """The learning check's held-out reward: ``evaluation.held_out``'s mean of the trainer's policy
    (its LoRA scope) on ``prompts`` (p, LEARN_PROMPT_LEN), LEARN_EVAL_SAMPLES samples each, as long
    as a rollout (LEARN_PROMPT_LEN + LEARN_NEW_TOKENS)."""
    return evaluation.held_out(trainers.actor_palm(name, trainer), trainers.actor_scope(name, trainer),
                               reward_model, prompts, LEARN_EVAL_SAMPLES,
                               LEARN_PROMPT_LEN + LEARN_NEW_TOKENS, seed).reward_mean


def learn_seed(name: str, seed: int, control: str | None, device_kwargs: dict, device,
               setting: LearnSetting | None = None, train_score=None,
               sampler: str = cached_sampler.DEFAULT_SAMPLER) -> dict[str, Any]:
    """One seed of the learning check: build, measure held-out reward, train, measure again.

    Seeds ``random``, numpy and torch with ``seed`` (Accelerate ``set_seed``), draws the training
    and held-out prompts, builds the tiny PaLM, the rule-based reward (the target-id fraction; under
    ``control == 'inverted'`` 1 - that fraction: negated, plus 1 to stay inside PPO's critic range
    [0, 5]) and the trainer (under ``'frozen'`` its optimizers' learning rates then set to 0), and
    runs ``setting.episodes`` x (``setting.rollouts`` rollouts + one ``learn()``), rollouts and
    held-out samples drawn with ``sampler`` (``cached_sampler.apply``). Returns ``{seed,
    reward_before, reward_after, gain, curve}``: held-out rewards in [0, 1] and ``curve``, the mean
    rollout reward of each episode (the policy after 0, 1, ... learn() calls).

    calibrate_learning.py only: ``control == 'negated'`` rewards minus the fraction, in [-1, 0];
    ``train_score(x, response_mask) -> (b,)`` replaces the reward the trainer optimizes (its noise
    null) while the held-out reward stays the task's.
    Raises RuntimeError ``seed N: Type: message`` when the library raises.
    """
    import torch
    from accelerate.utils import set_seed

    spec, setting = trainers.TRAINERS[name], setting or LEARN_SETTINGS[name]
    rules = rule_reward_module()
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, LEARN_PALM["num_tokens"], (LEARN_TRAIN_PROMPTS + LEARN_EVAL_PROMPTS,
                                                          LEARN_PROMPT_LEN), generator=gen).to(device)
    train_prompts, eval_prompts = prompts[:LEARN_TRAIN_PROMPTS], prompts[LEARN_TRAIN_PROMPTS:]
    fraction = rules.token_fraction(LEARN_TARGET_IDS)
    score = {"inverted": lambda x, response: 1.0 - fraction(x, response),
             "negated": lambda x, response: -fraction(x, response)}.get(control, fraction)
    reward_model = rules.RuleReward(score)
    trained_reward = rules.RuleReward(train_score) if train_score else reward_model
    try:
        trainer = trainers.construct_trainer(spec, probe_kit.tiny_palm(**LEARN_PALM).to(device), trained_reward,
                                    {"prompt_token_ids": train_prompts}, device_kwargs, device,
                                    **learn_trainer_kwargs(spec, setting))
    except Exception as exc:
        raise RuntimeError(f"seed {seed}: {exits.one_line(exc)}") from None
    cached_sampler.apply(trainer, sampler)
    if control == "frozen":  # AdoptAtan2 and AdamAtan2 assert lr > 0 when built: set it to 0 after
        for optimizer in trainers.optimizers(name, trainer).values():
            for group in optimizer.param_groups:
                group["lr"] = 0.0
    before = held_out(name, trainer, reward_model, eval_prompts, seed)
    rewards: list[float] = []
    hook = trained_reward.register_forward_hook(lambda _m, _i, out: rewards.append(float(out.mean())))
    _, error = trainers.bounded_train(trainer, setting.rollouts, LEARN_PROMPT_LEN + LEARN_NEW_TOKENS, setting.episodes)
    hook.remove()
    if error:
        raise RuntimeError(f"seed {seed}: {error}")
    after = held_out(name, trainer, reward_model, eval_prompts, seed)
    n = setting.rollouts
    curve = [sum(rewards[e * n:(e + 1) * n]) / n for e in range(setting.episodes)]
    return {"seed": seed, "reward_before": before, "reward_after": after, "gain": after - before,
            "curve": curve}


def learning_verdict(per_seed: list[dict[str, Any]], threshold: float) -> tuple[bool, str]:
    """The criterion: at least ceil(LEARN_MIN_IMPROVED * seeds) seeds raised their held-out reward
    (gain > 0) and the median gain is at least ``threshold``. Returns (passed, detail)."""
    import statistics
    gains = [s["gain"] for s in per_seed]
    need = math.ceil(LEARN_MIN_IMPROVED * len(gains))
    improved, median = sum(g > 0 for g in gains), statistics.median(gains)
    passed = improved >= need and median >= threshold
    figures = ", ".join(f"{s['seed']}: {s['reward_before']:.3f} -> {s['reward_after']:.3f}" for s in per_seed)
    missed = lambda ok: "" if ok else ": missed"  # which criterion failed, so a failure never reads as a pass
    return passed, (f"{improved}/{len(gains)} seeds improved (need {need}{missed(improved >= need)}), median gain "
                    f"{median:+.3f} (threshold {threshold}{missed(median >= threshold)}); held-out reward per seed "
                    f"{figures}")


def learn_trainer(name: str, seeds: list[int], control: str | None, device_kwargs: dict, device,
                  setting: LearnSetting | None = None, progress: streams.Progress | None = None,
                  sampler: str = cached_sampler.DEFAULT_SAMPLER) -> dict[str, Any]:
    """The learning check of one trainer over ``seeds`` (``sampler``: ``learn_seed``'s); returns its report entry with
    ``learning: {reward_before, reward_after, per_seed, curve, threshold, passed}`` (means over the
    seeds, rounded to 4 places) and the check ``reward_rose``. With ``progress``, a line that
    counts the seeds."""
    spec, setting = trainers.TRAINERS[name], setting or LEARN_SETTINGS[name]
    checks, timer = reporting.Checks(), streams.Timer(progress, name)
    result: dict[str, Any] = {"trainer": name, "status": "failed", "mode": "learn",
                              "class_name": spec.path,
                              "settings": dict(vars(setting)), "learning": None}
    per_seed = []
    with timer.stage("learn", total=len(seeds), unit="seeds",
                     label=f"learning check ({setting.episodes} learn() calls per seed)") as bar:
        try:
            for seed in seeds:
                per_seed.append(learn_seed(name, seed, control, device_kwargs, device, setting, sampler=sampler))
                if bar is not None:
                    bar.update(1)
        except RuntimeError as exc:
            checks.add("learning_ran", False, str(exc))
    result["timings_s"] = {"learn": timer.stages["learn"]}
    if checks.items:
        return settings.finish(result, checks)
    mean = lambda values: round(sum(values) / len(values), 4)
    passed, detail = learning_verdict(per_seed, setting.threshold)
    result["learning"] = {
        "reward_before": mean([s["reward_before"] for s in per_seed]),
        "reward_after": mean([s["reward_after"] for s in per_seed]),
        "per_seed": [{k: round(s[k], 4) if k != "seed" else s[k] for k in ("seed", "reward_before", "reward_after", "gain")}
                     for s in per_seed],
        "curve": [mean(values) for values in zip(*(s["curve"] for s in per_seed))],
        "threshold": setting.threshold, "passed": passed}
    checks.add("reward_rose", passed, detail)
    return settings.finish(result, checks)


def check_seed_room(args) -> None:
    """With --learn, a usage error (SkillError, exit 2) when --seed leaves no room for the seeds
    --seed to --seed + --learn-seeds - 1 below options.MAX_SEED."""
    last = learn_seeds(args)[-1]
    if args.learn and last > options.MAX_SEED:
        raise exits.SkillError(f"--seed {args.seed} leaves no room for the learning check's seeds up to {last} "
                               f"(at most {options.MAX_SEED})")


def learn_seeds(args) -> list[int]:
    """The seeds of a --learn run: --seed to --seed + --learn-seeds - 1."""
    return list(range(args.seed, args.seed + (args.learn_seeds or LEARN_SEEDS)))


def learn_config(args, cpu_threads: int) -> dict[str, Any]:
    """The toy task, seeds and control of a --learn run, for its report."""
    seeds = learn_seeds(args)
    return {**LEARN_PALM, "prompt_len": LEARN_PROMPT_LEN, "new_tokens": LEARN_NEW_TOKENS,
            "target_ids": list(LEARN_TARGET_IDS), "train_prompts": LEARN_TRAIN_PROMPTS,
            "eval_prompts": LEARN_EVAL_PROMPTS, "eval_samples": LEARN_EVAL_SAMPLES,
            "seeds": seeds, "min_improved": math.ceil(LEARN_MIN_IMPROVED * len(seeds)),
            "control": args.learn_control, "sampler": args.sampler, "cpu_threads": cpu_threads}


