"""What the plan advises beyond the settings' warnings: the inputs of inverse planning
(``budget_units``), a run of over a day on a CPU (``long_on_cpu``), torch threads that wait on each
other on a busy CPU (``threads_warning``), prompts that leave no room for a response
(``prompts_fill_max_seq_len``), and the comparison of ``plan --one-round`` with its prediction
(``one_round_report``).

Torch-free: arithmetic on the plan's figures.
"""
from __future__ import annotations

from typing import Any

from skill_runtime import reporting
from policy_optimization.plan import budget, counting, prediction, unit_costs
from policy_optimization.run import watchdog

DAY_S = 86400.0
SLOWER_BY = 1.5  # one thread this many times faster than the run's threads: warn threads_oversubscribed


def budget_units(resolved: dict[str, Any], counts: dict[str, int], probed: dict[str, Any], params: dict[str, Any],
                 base: dict[str, int], pool: str) -> budget.Units:
    """``budget.Units`` of this plan: unit seconds from the probe, the round of [run], and the
    memory and rollout-time functions of update_timesteps and max_seq_len (from the three tiny
    rollouts' stored fields and the timed sampling steps; learn() activations taken as linear in
    the length)."""
    measured, train = probed["measured"], resolved["effective"]["train"]
    eff, rnd, stored = resolved["effective"]["trainer"], resolved["round"], probed["stored"]
    max_seq_len, prompt_lens = train["max_seq_len"], probed.get("prompt_lens")
    points = [tuple(p) for p in probed["report"].get("sampling_step_s") or []]
    prefill = [tuple(p) for p in probed["report"].get("prefill_s") or []] or None  # the cached sampler's
    sampled = unit_costs.mean_rollout_sampling(points, prompt_lens, max_seq_len, prefill=prefill) \
        if points and prompt_lens else None
    rest = (measured["rollout_s"] - sampled) if sampled is not None and "rollout_s" in measured else None

    def rollout_at(length: int) -> float | None:
        if rest is None:
            return None
        return unit_costs.mean_rollout_sampling(points, prompt_lens, length, prefill=prefill) \
            + max(0.0, rest) * length / max_seq_len

    def peak_at(update: int, length: int) -> int | None:
        if stored is None:
            return None
        per_rollout = sum(unit_costs.stored_at(stored, prompt_lens, length).values())
        cycle = counting.run_counts(update, update, counts["items_per_rollout"], eff["minibatch_size"], eff["epochs"])
        memory = prediction.predict_memory(cycle, per_rollout, stored["buffer"], base, params, probed["transients"],
                                           eff["minibatch_size"])
        activations = memory["parts"]["learn_activations"]["value"] or 0
        return memory["pools"][pool] - int(activations * (1 - length / max_seq_len))

    evaluations = resolved["eval"] is not None
    fixed = sum(measured.get(k) or 0.0 for k in ("startup_s", "construct_s", "first_rollout_extra_s",
                                                 "first_learn_extra_s"))
    eval_s = measured.get("eval_s") or 0.0 if evaluations else 0.0
    longest = max(prompt_lens) if prompt_lens else 1
    return budget.Units(
        fixed_s=fixed + eval_s, rollout_s=measured.get("rollout_s"), learn_item_s=measured.get("learn_item_s"),
        eval_s=eval_s, update=train["update_timesteps"] if rnd is None else rnd["update_timesteps"],
        per_round=None if rnd is None else rnd["max_timesteps"],
        every=resolved["eval"]["every"] if evaluations else 1, items_per_rollout=counts["items_per_rollout"],
        epochs=max(1, eff["epochs"]), max_seq_len=max_seq_len, min_seq_len=min(max_seq_len, longest + 1),
        depth=resolved["effective"]["palm"]["depth"], dim=resolved["effective"]["palm"]["dim"],
        rollout_at=rollout_at, peak_at=peak_at)


def changes_text(changes: list[dict[str, Any]]) -> str:
    """``[train] num_episodes 1, max_timesteps 1,240`` from ``budget`` changes."""
    tables: dict[str, list[str]] = {}
    for c in changes:
        tables.setdefault(c["section"], []).append(f"{c['key']} {c['value']:,}")
    return "; ".join(f"[{section}] " + ", ".join(items) for section, items in tables.items())


def budget_text(found: dict[str, Any]) -> str:
    """One line: the largest run within the budget, or the single changes that make one round fit."""
    if found["why"] and found["rollouts"] is None:
        return f"not computed: {found['why']}"
    note = f" ({found['why']})" if found["why"] else ""
    if found["rollouts"] == 0:
        alternatives = " or ".join(changes_text([c]) for c in found["alternatives"])
        return "not even one round fits" + (f"; one round fits with {alternatives} (derived: plan again with it)"
                                            if alternatives else "; no single change found: a faster device") + note
    if found["rollouts"] is None:  # a memory budget alone
        return ("the configured run fits it" if not found["changes"] else f"fits with {changes_text(found['changes'])}")
    rounds = f" in {found['rounds']:,} rounds" if found["rounds"] else ""
    return (f"{found['rollouts']:,} rollouts and {found['learn_calls']:,} learn() calls{rounds} fit: "
            + changes_text(found["changes"]) + note)


def name_the_memory_fit(warnings: list[dict[str, Any]], units: budget.Units, available: int) -> None:
    """Prefix the memory_exceeds_device warning's fix with the update_timesteps that fits
    ``available`` bytes (``budget.memory_update``), or the max_seq_len that fits with 1. ``units``
    and ``available``: those of the pool that does not fit (``budget_units``' pool), so the value
    named is one that fits that pool; never the configured value, which does not."""
    update, alternatives = budget.memory_update(units, available)
    if update is not None and update >= units.update:  # this pool's figures say it fits: nothing to name
        return
    if update is not None:
        text = f"update_timesteps {update:,} or lower fits the memory available (derived)"
    elif alternatives:
        text = f"even update_timesteps 1 does not fit: with it, {changes_text(alternatives)} does (derived)"
    else:
        return
    for w in warnings:
        if w["code"] == "memory_exceeds_device":
            w["fix"] = f"{text}; {w['fix']}"


def long_on_cpu(device_type: str, wall_s: float, units: budget.Units, counts: dict[str, int],
                defaults_applied: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The warning for a CPU run predicted to take over a day: its rollouts (and the train()
    defaults behind them), the run of this size that takes one day (``budget.plan_budget`` with a
    day) and the changes that give it."""
    if device_type != "cpu" or wall_s <= DAY_S:
        return None
    day = budget.plan_budget(units, DAY_S, None, wall_s, None)
    return {"code": "long_on_cpu", "blocks_learning": False,
            "message": f"predicted {reporting.seconds_text(wall_s)} on a CPU, more than a day: {counts['rollouts']:,} "
                       f"rollouts and {counts['learn_calls']:,} learn() calls"
                       + prediction.defaults_note(defaults_applied, ("num_episodes", "max_timesteps", "max_seq_len")),
            "fix": f"in one day at this size: {budget_text(day)}; or a GPU (--device cuda)", "doc": None}


def prompts_fill_max_seq_len(prompt_lens: dict[int, int] | None, max_seq_len: int) -> dict[str, Any] | None:
    """``prompts_fill_max_seq_len`` when some prompts are ``max_seq_len - 1`` ids or longer: a
    rollout samples ``max(1, max_seq_len - n)`` tokens after an ``n``-id prompt (palm.py:429), so
    each of those gets a one-token response (what the run's ``one_token_responses`` rule sees).
    ``prompt_lens``: prompts per unpadded length (the probe's). Blocks learning when at least the
    watchdog's ONE_TOKEN_FRACTION of the prompts do."""
    full = sum(count for n, count in (prompt_lens or {}).items() if n >= max_seq_len - 1)
    if not full:
        return None
    total, longest = sum(prompt_lens.values()), max(prompt_lens)
    return {"code": "prompts_fill_max_seq_len", "blocks_learning": full / total >= watchdog.ONE_TOKEN_FRACTION,
            "message": f"{full} of {total} prompts have {max_seq_len - 1} ids or more (the longest {longest}) for "
                       f"max_seq_len {max_seq_len}, the prompt included: each gets a one-token response",
            "fix": f"max_seq_len above {longest + 1} (the longest prompt plus the response length you want), "
                   "or shorter prompts", "doc": "references/traps-rollouts.md#generate-seq-len"}


def threads_warning(check: dict[str, Any] | None, load: dict[str, Any]) -> dict[str, Any] | None:
    """``threads_oversubscribed`` when the probe's one-thread step was SLOWER_BY times faster than
    the run's threads' (``probe.Probe.threads_check``): the run would be faster with one thread."""
    if not check or check["one_thread_step_s"] * SLOWER_BY > check["step_s"]:
        return None
    ratio = check["step_s"] / check["one_thread_step_s"]
    return {"code": "threads_oversubscribed", "blocks_learning": False,
            "message": f"{check['threads']} torch threads got {check['cpu_share']:.0%} of their CPU (load average "
                       f"{load.get('start')} on {load.get('cpus')} CPUs): a sampling step took {check['step_s']:.3f} s, "
                       f"{ratio:,.1f}x the {check['one_thread_step_s']:.3f} s of one thread, and the predicted time "
                       "is that of these waiting threads",
            "fix": "torch.set_num_threads(1) in the run (or fewer threads than idle CPUs), and plan it with "
                   "--cpu-threads 1", "doc": None}


def one_round_report(out: dict[str, Any] | None, measured: dict[str, Any], counts: dict[str, int],
                     epochs: int) -> dict[str, Any] | None:
    """``plan --one-round``: the measured round (update_timesteps rollouts, one learn() on all their
    experiences) against the plan's unit figures for the same work. Seconds; errors are
    predicted / measured - 1 (None where either side is missing)."""
    if out is None:
        return None
    rollouts = out.get("rollout_seconds") or []
    learns = out.get("learn") or []
    measured_r = sum(rollouts) if len(rollouts) == out["rollouts"] else None
    measured_l = learns[0]["seconds"] if learns else None
    rollout_s, item_s = measured.get("rollout_s"), measured.get("learn_item_s")
    predicted_r = None if rollout_s is None else out["rollouts"] * rollout_s
    items = learns[0]["items"] if learns else counts["items_per_learn"]
    predicted_l = None if item_s is None else items * max(1, epochs) * item_s

    def error(p, m):
        return None if p is None or not m else round(p / m - 1, 4)

    return {"rollouts": out["rollouts"], "learn_items": items,
            "measured_rollouts_s": None if measured_r is None else round(measured_r, 3),
            "measured_learn_s": None if measured_l is None else round(measured_l, 3),
            "predicted_rollouts_s": None if predicted_r is None else round(predicted_r, 3),
            "predicted_learn_s": None if predicted_l is None else round(predicted_l, 3),
            "rollouts_error": error(predicted_r, measured_r), "learn_error": error(predicted_l, measured_l),
            "peak_bytes": out.get("rollout_peak_bytes")}
