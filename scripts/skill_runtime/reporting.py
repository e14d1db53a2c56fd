"""What a helper's plain report says: checks and their verdict, the doc section behind each
check (``CHECK_DOCS``), counts and times in words, and the command line of the next step."""
from __future__ import annotations

import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from skill_runtime import SKILL_ROOT


# The one command every doc and helper gives as the first thing to run: all four trainers, end to end.
FIRST_COMMAND = "tiny-rlhf-smoke --trainer all --json"


def status_of(checks: list[dict[str, Any]]) -> str:
    """'ok' when there is at least one ``{name, passed, detail}`` check and every one passed, else 'failed'."""
    return "ok" if checks and all(c["passed"] for c in checks) else "failed"


@dataclass
class Checks:
    """An ordered list of ``{name, passed, detail}`` checks."""
    items: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str) -> bool:
        self.items.append({"name": name, "passed": bool(passed), "detail": detail})
        return bool(passed)

    @property
    def passed(self) -> bool:
        return status_of(self.items) == "ok"


# Where each check a helper reports is explained: the section to read when it fails, as a path from
# the skill root. The one map of check names to docs (tests/test_output.py: every anchor exists and
# every check name the helpers emit is here).
# the symptom index and the silent-failure table; the traps, one file per topic
TROUBLE = "sub-skills/policy-optimization/references/troubleshooting.md"
REWARD_TRAPS = "sub-skills/policy-optimization/references/traps-rewards.md"
ROLLOUT_TRAPS = "sub-skills/policy-optimization/references/traps-rollouts.md"
SETUP_TRAPS = "sub-skills/policy-optimization/references/traps-setup.md"
WEIGHT_TRAPS = "sub-skills/policy-optimization/references/traps-weights.md"


DIST = "sub-skills/policy-optimization/references/distributed.md"


REPORTS = "references/reports.md"


CHECK_DOCS = {
    # tiny-rlhf-smoke train smoke
    "trainer_constructed": f"{TROUBLE}#symptom-index",
    "actor_lora_scope_added": f"{WEIGHT_TRAPS}#actor-scope-reused-palm",
    "trainable_parameters_on_device": f"{REPORTS}#train-smoke-checks",
    "update_ran": f"{TROUBLE}#symptom-index",
    "optimizer_steps": f"{SETUP_TRAPS}#optimizer-first-steps",
    "rollout_group_size": f"{WEIGHT_TRAPS}#group-size-per-rollout",
    "rollouts_ended_at_eos": f"{REPORTS}#train-smoke-checks",
    "actor_lora_changed": f"{SETUP_TRAPS}#optimizer-first-steps",
    "critic_lora_changed": f"{SETUP_TRAPS}#optimizer-first-steps",
    "value_head_changed": f"{SETUP_TRAPS}#optimizer-first-steps",
    "partition_function_changed": f"{SETUP_TRAPS}#optimizer-first-steps",
    "base_weights_unchanged": f"{WEIGHT_TRAPS}#base-weights-accumulate-grad",
    "reward_model_unchanged": f"{REPORTS}#train-smoke-checks",
    "losses_finite": f"{TROUBLE}#symptom-index",
    "replay_buffer_in_private_dir": f"{SETUP_TRAPS}#tpo-replay-buffer-dir",
    "reference_policy_is_lora_off_palm": f"{ROLLOUT_TRAPS}#flowrl-no-lora-reference",
    "generated_sequence": f"{ROLLOUT_TRAPS}#generate-one-prompt",
    "caller_directory_untouched": "references/installation.md#exit-codes-of-every-helper",
    # tiny-rlhf-smoke --learn
    "learning_ran": f"{TROUBLE}#symptom-index",
    "reward_rose": "sub-skills/policy-optimization/references/workflows.md#learning-check",
    # tiny-rlhf-smoke on several processes (--nproc, or under a launcher)
    "accelerate_multi_process": f"{DIST}#launching",
    "parameters_finite": f"{DIST}#rotary-caches-under-eos",
    "ranks_in_sync": f"{DIST}#what-each-trainer-needs",
    "ranks_drew_different_prompts": f"{DIST}#seeding",
    "only_main_process_wrote": f"{DIST}#checkpoints",
    "replay_buffer_per_rank": f"{DIST}#what-each-trainer-needs",
    "all_ranks_passed": f"{DIST}#check-first-the-smoke-helper-on-n-processes",
    "trainer_ran": f"{TROUBLE}#symptom-index",
    "workers_finished": f"{DIST}#check-first-the-smoke-helper-on-n-processes",
    # tiny-palm-smoke
    "constructed": "sub-skills/palm-modeling/references/palm-api.md#constructor",
    "next_token_loss_decreases": "sub-skills/palm-modeling/references/palm-api.md#forward",
    "generate_with_prompt": "sub-skills/palm-modeling/references/palm-api.md#generate",
    "generate_without_prompt": "sub-skills/palm-modeling/references/palm-api.md#generate",
    "fresh_lora_scope_is_identity": "sub-skills/palm-modeling/references/lora-scopes.md",
    "lora_scope_isolated": "sub-skills/palm-modeling/references/lora-scopes.md",
    "merge_reproduces_scoped_logits": "sub-skills/palm-modeling/references/lora-scopes.md",
    "save_load_round_trip": "sub-skills/palm-modeling/references/palm-api.md#dropout-saving-and-loading",
    # tiny-reward-smoke
    "scalar_rewards_shape": "sub-skills/reward-modeling/references/reward-api.md#forward",
    "scalar_mse_loss_decreases": "sub-skills/reward-modeling/references/reward-api.md#training",
    "held_out_accuracy_above_chance": f"{REPORTS}#tiny-reward-smoke",
    "binned_cross_entropy_decreases": "sub-skills/reward-modeling/references/reward-api.md#forward",
    "binned_inference_returns_bin_index": f"{REWARD_TRAPS}#binned-reward-sampled",
    "implicit_prm_rewards_shape": "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes",
    "implicit_prm_loss_backpropagates": "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes",
    "implicit_prm_output_is_minus_bce": "sub-skills/reward-modeling/references/implicit-prm.md#what-it-computes",
    "base_palm_untouched": "sub-skills/reward-modeling/references/reward-api.md#constructor",
}


def names_text(names: list[str], shown: int = 4) -> str:
    """``a, b, c, d and 3 more``: a list cut at ``shown`` that says how much it left out; 'none'."""
    if not names:
        return "none"
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def check_lines(checks: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """The failing checks in full, each with the section of ``CHECK_DOCS`` that explains it; the
    passing ones only counted (the count is on the caller's headline)."""
    lines = []
    for c in checks:
        if not c["passed"]:
            lines.append(f"{indent}FAIL {c['name']}: {c['detail']}")
            lines.append(f"{indent}     read: {CHECK_DOCS.get(c['name'], REPORTS)}")
    return lines


def passed_count(checks: list[dict[str, Any]]) -> str:
    """``all 14 checks passed`` or ``4 of 14 checks failed``."""
    failed = sum(not c["passed"] for c in checks)
    return f"all {len(checks)} checks passed" if not failed else f"{failed} of {len(checks)} checks failed"


# How a person runs each helper, and the file behind it (path from the skill root): a next step is
# written the way this run was started, by console script or by path (python path/to/script.py).
HELPER_SCRIPTS = {
    "tiny-rlhf-smoke": "sub-skills/policy-optimization/scripts/tiny_rlhf_smoke.py",
    "tiny-palm-smoke": "sub-skills/palm-modeling/scripts/tiny_palm_smoke.py",
    "tiny-reward-smoke": "sub-skills/reward-modeling/scripts/tiny_reward_smoke.py",
    "palm-rlhf-skill check": "scripts/check_skill.py",
    "palm-rlhf-skill bench": "sub-skills/policy-optimization/scripts/bench_smoke.py",
    "palm-rlhf-skill plan": "sub-skills/policy-optimization/scripts/plan_run.py",
    "palm-rlhf-skill train": "sub-skills/policy-optimization/scripts/train_run.py",
    "palm-rlhf-skill watch": "sub-skills/policy-optimization/scripts/watch_run.py",
    "palm-rlhf-skill evaluate": "sub-skills/policy-optimization/scripts/evaluate_run.py",
    "palm-rlhf-skill train-reward": "sub-skills/reward-modeling/scripts/train_reward.py",
}


def command(helper: str, arguments: str = "") -> str:
    """The command line that runs ``helper`` (a key of HELPER_SCRIPTS) with ``arguments``: the
    console script when this process was started as one, else ``python <path>``, the path relative
    to the working directory when it lies below it."""
    started_by_path = bool(sys.argv) and (sys.argv[0].endswith(".py") or Path(sys.argv[0]).is_dir())
    if started_by_path:
        path = SKILL_ROOT / HELPER_SCRIPTS[helper]
        try:
            shown = str(path.relative_to(Path.cwd()))
        except ValueError:
            shown = str(path)
        head = f"python {shown}"
    else:
        head = helper
    return f"{head} {arguments}".strip()


def device_words(device: Any) -> str:
    """``the CPU`` or ``GPU 0 (cuda:0)``: a torch device in a newcomer's words."""
    text = str(device)
    if text.startswith("cpu"):
        return "the CPU"
    if text.startswith("cuda"):
        return f"GPU {text.partition(':')[2] or 0} ({text})"
    return text


def seconds_text(seconds: float) -> str:
    """``0.042 s``, ``4.4 s``, ``2.5 min``, ``1.2 h``, ``4,572,460 days`` (plan's runs too long to run)."""
    if seconds < 1:
        return f"{seconds:.3f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def timings_line(timings: dict[str, float | None]) -> str:
    """``timings (s): import 3.09, update 0.34, total 3.48`` (stages that ran)."""
    return "timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items() if v is not None)


def checks_summary(title: str, report: dict[str, Any], next_step: str) -> str:
    """The plain report of a single-report smoke: the count of checks, each failing one in full
    with its doc section, timings, warnings, and last the verdict with the next step."""
    checks = report["checks"]
    lines = [f"{title} on {device_words(report['device'])}: {passed_count(checks)}", *check_lines(checks)]
    lines.append(timings_line(report["timings_s"]))
    lines += [f"warning: {w}" for w in report.get("warnings", [])]
    failed = [c for c in checks if not c["passed"]]
    if failed:
        lines.append(f"{title}: FAILED (exit 1): {len(failed)} check(s) failed; next: read "
                     f"{CHECK_DOCS.get(failed[0]['name'], REPORTS)}")
    else:
        lines.append(f"{title}: OK (exit 0); next: {next_step}")
    return "\n".join(lines)


def terminal_text(text: Any) -> str:
    """``text`` (any value, as ``str``) safe to write to a terminal: every control character (C0,
    DEL, C1: ESC begins the escape sequences that retitle a window or erase lines), format
    character (bidirectional overrides that reorder what is shown) and line or paragraph separator
    written as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``); everything else unchanged. The
    one function every plain report of a run directory's strings goes through (``watch``, ``train``'s
    summary, a resumed run's stored summary), and ``run_cli``'s error line."""
    import unicodedata
    text = str(text)
    if text.isprintable():  # the common case: nothing to escape (isprintable is False for every Cc, Cf, Zl, Zp)
        return text
    return "".join(ch if ch.isprintable() or ch == " " or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp")
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], low: float | None = None, high: float | None = None) -> str:
    """One character per value, ``low`` -> '▁' and ``high`` -> '█' (clamped; default: the values'
    own range), a space for None or a non-finite value."""
    finite = [v for v in values if v is not None and v == v and abs(v) != float("inf")]
    low = min(finite, default=0.0) if low is None else low
    high = max(finite, default=1.0) if high is None else high
    span = (high - low) or 1.0
    return "".join(" " if v is None or v != v or abs(v) == float("inf") else
                   SPARKS[min(len(SPARKS) - 1, max(0, round((v - low) / span * (len(SPARKS) - 1))))]
                   for v in values)
