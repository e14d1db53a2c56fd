"""The live watchdog: each silent failure the metrics rows can see is a rule with an id, the doc
section that explains it and its fix. Rules read the row of the round just finished and the rows
before it; a rule that holds "fires" for that round (its id goes into the row's ``rules``).

The rules come from the silent-failure table of
sub-skills/policy-optimization/references/troubleshooting.md#silent-failures and from what a
training run adds (the held-out reward, memory across rounds); their thresholds, false alarms and
misses are measured by ``calibrate_watchdog.py`` (references/training-run.md#watchdog-rules).
The engine (a rule's fields, which rules fire, the alarm line, ``--stop-on``) is the run kit's
(``run_kit.alarms``); this module holds the policy run's rules and what they know of the run
(``RunFacts``). Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from run_kit.alarms import Rule

# the traps the rules explain, one file per topic (troubleshooting.md indexes them)
REWARD_TRAPS = "sub-skills/policy-optimization/references/traps-rewards.md"
ROLLOUT_TRAPS = "sub-skills/policy-optimization/references/traps-rollouts.md"
SETUP_TRAPS = "sub-skills/policy-optimization/references/traps-setup.md"
RUN_DOC = "sub-skills/policy-optimization/references/training-run.md"

# Thresholds (references/training-run.md#watchdog-rules says why each is where it is).
ONE_TOKEN_FRACTION = 0.5     # one_token_responses: at least this share of responses count <= 1 token
KL_ROLLOUT_LIMIT = 1.0       # kl_blowup: nats per token between the rollout policy and the policy in learn()
KL_BASE_JUMP = 10.0          # kl_blowup: kl_base this round over the largest before it ...
KL_BASE_FLOOR = 1.0          # ... and above this many nats per token
HELD_OUT_PATIENCE = 5        # held_out_flat: evaluations without a rise (calibrate_watchdog.py: 3 gave false alarms)
HELD_OUT_WINDOW = 3          # held_out_falling: evaluations falling in a row
HELD_OUT_MARGIN = 0.05       # of the reward range seen so far, at least: a rise smaller than this is noise
NOISE_SE = 2.0               # ... and at least this many standard errors of the held-out mean
MEMORY_WINDOW = 3            # memory_growing: consecutive rounds of growth
MEMORY_STEP_MIB = 16.0       # ... each by at least this much
MEMORY_STEP_FRACTION = 0.02  # ... or this fraction of the resident memory, whichever is larger
ADVANTAGE_LIMIT = 1e3        # advantage_extreme: |advantage| above this (GRPO MaxRL's 1e8)
ENTROPY_FLOOR = math.log(2)  # entropy_collapse: below this (nats per token: fewer than 2 tokens' worth of choice) ...
ENTROPY_FALL = 0.1           # ... and below this fraction of the first trained round's entropy
ENTROPY_NOISE = 0.75         # entropy_blowup: above this fraction of log(num_tokens) (V ** 0.75 ids of choice; uniform: 1.0) ...
ENTROPY_RISE = 1.0           # ... and this many nats above the first trained round's (e times the choices)
TOP_TOKEN_SHARE = 0.5        # repeated_token: one id is at least half of every response token of the round ...
DISTINCT_FLOOR = 0.1         # ... or distinct bigrams are at most this fraction of all (each response repeats others)
PROMPT_COLLAPSE = 0.4        # held_out_prompt_collapse: one prompt below its best by this fraction of the reward range
DROP_FRACTION = 0.2          # held_out_drop: one evaluation below the one before by this fraction of the range ...
DROP_SE = 4.0                # ... and this many standard errors of a held-out mean (a few evaluations per run: 4, not 2)
UNSEEN_SHARE = 0.1           # unseen_reward_ids: at least this share of response tokens unseen by the reward model ...
GAP_FRACTION = 0.25          # train_held_out_gap: the training-prompt reward's lead grew by this fraction of the range


@dataclass(frozen=True)
class RunFacts:
    """What the rules need to know about the run besides its rows."""
    trainer: str                       # trainers.TRAINERS key
    grouped: bool                      # GRPO, TPO, FlowRL: a rollout samples a group per prompt
    lora: bool                         # the policy trains a LoRA scope (actor_lora=True)
    required_steps: int                # optimizer steps before every LoRA tensor can have moved
    update_timesteps: int              # rollouts per learn()
    critic_range: tuple[float, float] | None  # PPO: the values its critic can represent
    processes: int = 1                 # ranks: a row's rollouts are every rank's
    eval_samples: int = 0              # sequences one held-out evaluation scores ([eval] samples x prompts)
    num_tokens: int = 0                # the policy's vocabulary ([palm] num_tokens)
    coverage: bool = False             # the reward model's unseen ids are known (its train-reward summary.json)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _saturated(row, rows) -> bool:
    """Every reward of the round equals the best reward of the run, after rewards have varied: the
    policy reached the top of the reward, which is success, not a reward that cannot tell
    completions apart (a constant reward never varied)."""
    trained = [r for r in rows if r["round"] > 0]
    varied = any(_finite(r["reward_std"]) and r["reward_std"] > 0 for r in trained)
    best = max((r["reward_max"] for r in trained if _finite(r["reward_max"])), default=row["reward_max"])
    return varied and row["reward_min"] == row["reward_max"] >= best


def _equal_rewards(row, rows, facts):
    if _saturated(row, rows):
        return None
    if facts.grouped and row["zero_std_group_fraction"] == 1.0:
        return f"zero_std_group_fraction 1.00 over {row['rollouts']} rollouts (reward {row['reward_mean']:.4g})"
    if not facts.grouped and row["rollouts"] >= 2 and row["reward_min"] == row["reward_max"]:
        return f"all {row['rollouts']} rollouts scored {row['reward_min']:.4g}"
    return None


def _zero_advantage(row, rows, facts):
    if row["advantage_zero_fraction"] == 1.0 and not _saturated(row, rows):
        return "advantage_zero_fraction 1.00: every advantage the update used was exactly 0"
    return None


def _weights_frozen(row, rows, facts):
    actor_steps = row["optimizer_steps"].get("actor", 0)
    done = sum(r["optimizer_steps"].get("actor", 0) for r in rows if r["round"] > 0) + actor_steps
    if actor_steps == 0 or done - actor_steps < facts.required_steps:
        return None  # the optimizer's first steps move nothing by design (optimizer-first-steps)
    still = [group for group, norm in row["trainable_change_norm"].items() if norm == 0.0]
    if still:
        return f"{', '.join(still)} moved 0.0 in {actor_steps} optimizer steps"
    if facts.lora and row["kl_base"] == 0.0:
        return "the policy's logits still equal the base PaLM's bitwise (kl_base 0.0)"
    return None


def _non_finite(row, rows, facts):
    bad = [name for name, values in (row["losses"] or {}).items() if not all(map(math.isfinite, values))]
    for key in ("reward_mean", "grad_norm"):
        if row[key] is not None and not math.isfinite(row[key]):
            bad.append(key)
    if row["non_finite_weights"]:
        bad.append("trainable weights")
    return f"NaN or inf in {', '.join(bad)}" if bad else None


def _one_token(row, rows, facts):
    share = row["one_token_response_fraction"]
    if share is not None and share >= ONE_TOKEN_FRACTION:
        return f"one_token_response_fraction {share:.2f}: responses of at most one token that counts"
    return None


def _kl_blowup(row, rows, facts):
    if _finite(row["kl_rollout"]) and row["kl_rollout"] > KL_ROLLOUT_LIMIT:
        return f"kl_rollout {row['kl_rollout']:.3g} nats/token within one learn() (limit {KL_ROLLOUT_LIMIT:g})"
    before = [r["kl_base"] for r in rows if _finite(r.get("kl_base"))]
    if _finite(row["kl_base"]) and row["kl_base"] > KL_BASE_FLOOR and before \
            and row["kl_base"] > KL_BASE_JUMP * max(max(before), 1e-3):
        return f"kl_base {row['kl_base']:.3g} nats/token, over {KL_BASE_JUMP:g}x its largest before ({max(before):.3g})"
    return None


def _evaluations(rows, row) -> list[float]:
    return [r["held_out_reward"] for r in [*rows, row] if r["held_out_reward"] is not None]


def _reward_range(rows, row) -> float:
    """The rollouts' reward range seen so far (highest minus lowest), 0.0 before any."""
    seen = [v for r in [*rows, row] if r["round"] > 0 for v in (r["reward_min"], r["reward_max"]) if _finite(v)]
    return max(seen) - min(seen) if seen else 0.0


def _standard_error(rows, row, sequences: int, held_out: bool = False) -> float:
    """The standard error of a mean of ``sequences`` rewards: the rollouts' mean reward std over
    the root of ``sequences`` (0.0 before any std or without sequences); with ``held_out``, the
    larger of that and the same from the held-out evaluations' own std (``held_out_std``)."""
    def mean(values):
        return sum(values) / len(values) if values else 0.0
    spread = mean([r["reward_std"] for r in [*rows, row] if r["round"] > 0 and _finite(r["reward_std"])])
    if held_out:
        spread = max(spread, mean([r["held_out_std"] for r in [*rows, row] if _finite(r.get("held_out_std"))]))
    return spread / math.sqrt(sequences) if sequences else 0.0


def _margin(rows, row, facts: RunFacts) -> float:
    """The smallest change of the held-out reward that is not noise: HELD_OUT_MARGIN of the reward
    range seen so far, or NOISE_SE standard errors of a held-out mean (the rollouts' reward std over
    the root of the sequences one evaluation scores), whichever is larger."""
    return max(HELD_OUT_MARGIN * _reward_range(rows, row), NOISE_SE * _standard_error(rows, row, facts.eval_samples),
               1e-6)


def _held_out_flat(row, rows, facts):
    values = _evaluations(rows, row)  # values[0]: the baseline (round 0)
    if row["held_out_reward"] is None or len(values) < HELD_OUT_PATIENCE + 1:
        return None
    baseline, margin = values[0], _margin(rows, row, facts)
    if max(values[1:]) <= baseline + margin:
        return (f"held-out reward {values[-1]:.4g} after {len(values) - 1} evaluations, never above its start "
                f"{baseline:.4g} by more than {margin:.2g}")
    return None


def _held_out_falling(row, rows, facts):
    values = _evaluations(rows, row)
    if row["held_out_reward"] is None or len(values) < HELD_OUT_WINDOW + 1:
        return None
    window = values[-HELD_OUT_WINDOW - 1:]
    if all(b < a for a, b in zip(window, window[1:])) and max(values) - values[-1] > _margin(rows, row, facts):
        return (f"held-out reward fell {HELD_OUT_WINDOW} evaluations in a row, {window[0]:.4g} -> {window[-1]:.4g} "
                f"(best {max(values):.4g})")
    return None


def _memory_growing(row, rows, facts):
    series = [r["rss_mib"] for r in [*rows, row] if r["round"] > 0 and _finite(r.get("rss_mib"))]
    if len(series) < MEMORY_WINDOW + 1:
        return None
    window = series[-MEMORY_WINDOW - 1:]
    steps = [b - a for a, b in zip(window, window[1:])]
    if all(step >= max(MEMORY_STEP_MIB, MEMORY_STEP_FRACTION * a) for a, step in zip(window, steps)):
        return f"resident memory grew {MEMORY_WINDOW} rounds in a row: " + " -> ".join(f"{v:,.0f}" for v in window) + " MiB"
    return None


def _rollouts_dropped(row, rows, facts):
    per_rank = row["rollouts"] // facts.processes
    if row["learn_calls"] == 0:
        return f"{per_rank} rollouts and no learn(): update_timesteps {facts.update_timesteps} never reached"
    dropped = per_rank - row["learn_calls"] * facts.update_timesteps
    if dropped > 0:
        return f"{dropped} of {per_rank} rollouts sampled and dropped (update_timesteps {facts.update_timesteps})"
    return None


def _critic_range(row, rows, facts):
    if facts.critic_range is None or row["reward_min"] is None:
        return None
    low, high = facts.critic_range
    if row["reward_min"] < low or row["reward_max"] > high:
        return f"rewards {row['reward_min']:.4g} to {row['reward_max']:.4g}, the critic represents [{low:g}, {high:g}]"
    return None


def _group_of_one(row, rows, facts):
    if facts.grouped and row["group_size"] == 1:
        return "every rollout sampled one completion per prompt"
    return None


def _advantage_extreme(row, rows, facts):
    if _finite(row["advantage_abs_max"]) and row["advantage_abs_max"] > ADVANTAGE_LIMIT:
        return f"advantage_abs_max {row['advantage_abs_max']:.3g}"
    return None


def _first_entropy(rows) -> float | None:
    return next((r["entropy"] for r in rows if r["round"] > 0 and _finite(r.get("entropy"))), None)


def _entropy_collapse(row, rows, facts):
    first = _first_entropy([*rows, row])
    if _finite(row["entropy"]) and first and row["entropy"] < min(ENTROPY_FLOOR, ENTROPY_FALL * first):
        return (f"entropy {row['entropy']:.3g} nats per token (first round {first:.3g}): the policy samples about "
                f"{math.exp(row['entropy']):.2f} tokens' worth of choice")
    return None


def _entropy_blowup(row, rows, facts):
    first, ceiling = _first_entropy([*rows, row]), math.log(max(facts.num_tokens, 2))
    if _finite(row["entropy"]) and first is not None and row["entropy"] >= ENTROPY_NOISE * ceiling \
            and row["entropy"] - first >= ENTROPY_RISE:
        return (f"entropy {row['entropy']:.3g} nats per token, up from {first:.3g}; uniform noise over "
                f"{facts.num_tokens} ids is {ceiling:.3g}")
    return None


def repetition_reason(top: float | None, distinct: float | None, own_top: float | None = None,
                      where: str = "the round's") -> str | None:
    """Why responses collapsed, or None: ``top`` (``top_token_share``) at least TOP_TOKEN_SHARE,
    ``distinct`` (``distinct_bigram_fraction``) at most DISTINCT_FLOOR, or ``own_top`` (the median
    response's own top token share, ``evaluation.repetition``) at least TOP_TOKEN_SHARE: each
    response repeats an id of its own. The ``repeated_token`` rule, and ``evaluate``'s collapse."""
    if _finite(top) and top >= TOP_TOKEN_SHARE:
        return f"one id is {top:.0%} of {where} response tokens"
    if _finite(own_top) and own_top >= TOP_TOKEN_SHARE:
        return f"in half of {where} responses one id is at least {own_top:.0%} of the response"
    if _finite(distinct) and distinct <= DISTINCT_FLOOR:
        return f"distinct bigrams {distinct:.0%} of {where} responses' bigrams: the responses repeat each other"
    return None


def _repeated_token(row, rows, facts):
    return repetition_reason(row.get("top_token_share"), row.get("distinct_bigram_fraction"))


def _evaluated(rows, row, key: str) -> list[dict[str, Any]]:
    """The rows, ``row`` last, that hold an evaluation's ``key``."""
    return [r for r in [*rows, row] if r.get(key) is not None]


def _prompt_collapse(row, rows, facts):
    now = row.get("held_out_per_prompt")
    if not now or len(now) < 2:
        return None
    before = [r["held_out_per_prompt"] for r in _evaluated(rows, row, "held_out_per_prompt")[:-1]
              if len(r["held_out_per_prompt"]) == len(now)]
    if not before:
        return None
    per_prompt = facts.eval_samples // len(now)
    values = [v for b in before for v in b] + list(now)
    spread = max(_reward_range(rows, row), max(values) - min(values))
    margin = max(PROMPT_COLLAPSE * spread, DROP_SE * _standard_error(rows, row, per_prompt, held_out=True), 1e-6)
    drops = [(max(b[i] for b in before) - v, i) for i, v in enumerate(now)]
    fall, i = max(drops)
    if fall > margin:
        best = max(b[i] for b in before)
        return (f"held-out prompt {i + 1} of {len(now)} fell to {now[i]:.4g} from its best {best:.4g} (more than "
                f"{margin:.2g}); the held-out mean is {row['held_out_reward']:.4g}")
    return None


def _held_out_drop(row, rows, facts):
    values = _evaluations(rows, row)
    if row["held_out_reward"] is None or len(values) < 2:
        return None
    spread = max(_reward_range(rows, row), max(values) - min(values))
    margin = max(DROP_FRACTION * spread, DROP_SE * _standard_error(rows, row, facts.eval_samples, held_out=True), 1e-6)
    if values[-2] - values[-1] > margin:
        return f"held-out reward {values[-2]:.4g} -> {values[-1]:.4g} in one evaluation (more than {margin:.2g})"
    return None


def _unseen_ids(row, rows, facts):
    share, gain, se = row.get("unseen_id_fraction"), row.get("unseen_reward_gain"), row.get("unseen_reward_gain_se")
    if not facts.coverage or not _finite(share) or share < UNSEEN_SHARE or not _finite(gain) or not _finite(se):
        return None
    if gain > max(NOISE_SE * se, HELD_OUT_MARGIN * _reward_range(rows, row), 1e-6):
        return (f"{share:.0%} of the response tokens are ids the reward model never trained on, and they raise its "
                f"score by {gain:.3g} per sequence (+/- {se:.2g}) over seen ids in their place")
    return None


def _proxy_gold(row, rows, facts):
    if row.get("held_out_gold") is None:
        return None
    points = _evaluated(rows, row, "held_out_gold")
    best = max(points, key=lambda r: r["held_out_gold"])
    golds = [v for r in points for v in r["held_out_gold_per_prompt"] or [r["held_out_gold"]]]
    spread = [r["held_out_gold_std"] for r in points if _finite(r.get("held_out_gold_std"))]
    gold_margin = max(HELD_OUT_MARGIN * (max(golds) - min(golds)),
                      NOISE_SE * (sum(spread) / len(spread)) / math.sqrt(max(facts.eval_samples, 1)) if spread else 0.0,
                      1e-6)
    fell = best["held_out_gold"] - row["held_out_gold"]
    rose = row["held_out_reward"] - best["held_out_reward"]
    if fell > gold_margin and rose > _margin(rows, row, facts):
        return (f"since round {best['round']} the held-out reward rose {best['held_out_reward']:.4g} -> "
                f"{row['held_out_reward']:.4g} while the gold metric fell {best['held_out_gold']:.4g} -> "
                f"{row['held_out_gold']:.4g}")
    return None


def _gap_growth(row, rows) -> float | None:
    """How much further the training prompts' reward (the round's rollouts) leads the held-out
    reward at this evaluation than at the start (round 1's rollouts against round 0's held-out
    reward, both the initial policy's); None without both."""
    start = next((r for r in rows if r["round"] == 1 and _finite(r["reward_mean"])), None)
    baseline = next((r["held_out_reward"] for r in rows if r["round"] == 0 and r["held_out_reward"] is not None), None)
    if row["held_out_reward"] is None or not _finite(row["reward_mean"]) or start is None or baseline is None:
        return None
    return (row["reward_mean"] - row["held_out_reward"]) - (start["reward_mean"] - baseline)


def _train_gap(row, rows, facts):
    growth = _gap_growth(row, rows)
    if growth is None:
        return None
    sequences = (row["rollouts"] or 0) * (row["group_size"] or 1)
    noise = NOISE_SE * math.hypot(_standard_error(rows, row, sequences),
                                  _standard_error(rows, row, facts.eval_samples, held_out=True))
    margin = max(GAP_FRACTION * _reward_range(rows, row), noise, 1e-6)
    earlier = [r for r in rows if r["round"] > 1 and r["held_out_reward"] is not None]
    before = _gap_growth(earlier[-1], rows[:rows.index(earlier[-1])]) if earlier else None
    if growth > margin and before is not None and before > margin:  # two evaluations in a row
        return (f"training-prompt reward {row['reward_mean']:.4g}, held-out {row['held_out_reward']:.4g}: the "
                f"training prompts' lead grew by {growth:.3g} since the start (more than {margin:.2g}), two "
                "evaluations in a row")
    return None


RULES = (
    Rule("equal_rewards", f"{REWARD_TRAPS}#equal-rewards-group", "every group's rewards are equal: no preference to learn",
         "a reward that differs between completions of one prompt (a finer rule, a larger group, a higher temperature)",
         _equal_rewards, persist=2),
    Rule("zero_advantage", f"{REWARD_TRAPS}#group-of-one", "every advantage is exactly 0: the policy gets no reward signal",
         "a group of 2 or more completions (GRPO, TPO, FlowRL), PPO minibatch_size >= 2", _zero_advantage, persist=2),
    Rule("weights_frozen", f"{SETUP_TRAPS}#optimizer-first-steps", "trainable weights did not move",
         "a learning rate above 0 that moves float32 weights, and trainable parameters the optimizer holds",
         _weights_frozen),
    Rule("non_finite", f"{REWARD_TRAPS}#grpo-nan", "NaN or inf in a loss, a reward, a gradient or a weight",
         "a finite reward; a smaller learning rate; resume from the last checkpoint", _non_finite),
    Rule("one_token_responses", f"{SETUP_TRAPS}#eos-in-prompt", "responses of at most one token",
         "keep eos_token out of the prompts; raise max_seq_len above the longest prompt", _one_token),
    Rule("kl_blowup", f"{ROLLOUT_TRAPS}#kl-to-rollout-policy", "the policy jumps away from where it sampled",
         "a smaller actor_lr; resume from the last checkpoint", _kl_blowup),
    Rule("held_out_flat", f"{RUN_DOC}#held-out-flat", "the held-out reward does not rise",
         "read the section: all weights or LoRA, the learning rate, the rollout temperature", _held_out_flat),
    Rule("held_out_falling", f"{RUN_DOC}#held-out-flat", "the held-out reward keeps falling",
         "a higher rollout temperature or more training prompts (overfitting), a smaller actor_lr", _held_out_falling),
    Rule("memory_growing", f"{RUN_DOC}#memory-growing", "resident memory grows every round",
         "look for what keeps tensors across rounds (a reward program's cache); a smaller update_timesteps",
         _memory_growing),
    Rule("rollouts_dropped", f"{SETUP_TRAPS}#update-timesteps-default", "rollouts sampled and never learned from",
         "[train] max_timesteps a multiple of update_timesteps (the default: equal)", _rollouts_dropped),
    Rule("reward_outside_critic_range", f"{REWARD_TRAPS}#ppo-critic-reward-range",
         "PPO rewards outside the critic's range", "rescale the reward into [0, 5], or widen hl_gauss_loss_kwargs",
         _critic_range),
    Rule("group_of_one", f"{REWARD_TRAPS}#group-of-one", "one completion per prompt: no group to compare",
         "the group argument (grpo_num_times_sample_rewards, ...) at 1 or more", _group_of_one),
    Rule("advantage_extreme", f"{REWARD_TRAPS}#grpo-max-rl-mean-zero", "advantages far beyond any reward",
         "GRPO use_max_rl with rewards >= 0, or the default normalisation", _advantage_extreme),
    Rule("entropy_collapse", f"{RUN_DOC}#collapse", "the policy's entropy collapsed",
         "read the section: a reward one token can max out, a smaller actor_lr, an entropy bonus", _entropy_collapse,
         persist=2),
    Rule("entropy_blowup", f"{RUN_DOC}#collapse", "the policy's entropy rose towards uniform noise",
         "a smaller actor_lr; a reward that does not pay for rare tokens; resume from an earlier checkpoint",
         _entropy_blowup, persist=2),
    Rule("repeated_token", f"{RUN_DOC}#collapse", "the rollouts repeat one token or each other",
         "read the section: reward the content, not a token the policy can repeat", _repeated_token, persist=2),
    Rule("held_out_prompt_collapse", f"{RUN_DOC}#held-out-drop", "one held-out prompt collapsed",
         "read its samples (palm-rlhf-skill evaluate); more varied training prompts; a smaller actor_lr",
         _prompt_collapse),
    Rule("held_out_drop", f"{RUN_DOC}#held-out-drop", "the held-out reward dropped in one evaluation",
         "a smaller actor_lr; resume from the checkpoint before the drop", _held_out_drop),
    Rule("unseen_reward_ids", f"{RUN_DOC}#reward-hacking", "the reward model pays for ids it never trained on",
         "read the section: the reward model's token coverage (train-reward), or keep those ids out of the policy",
         _unseen_ids, persist=2),
    Rule("proxy_gold_divergence", f"{RUN_DOC}#reward-hacking", "the reward rises while the gold metric falls",
         "stop at the checkpoint where gold peaked; a better reward, a KL penalty, fewer rounds", _proxy_gold),
    Rule("train_held_out_gap", f"{RUN_DOC}#held-out-flat", "the training prompts' reward runs away from the held-out",
         "more and more varied training prompts; fewer rounds", _train_gap),
)
RULE_IDS = tuple(rule.id for rule in RULES)
BY_ID = {rule.id: rule for rule in RULES}
