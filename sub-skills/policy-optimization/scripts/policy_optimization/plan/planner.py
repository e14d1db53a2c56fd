"""The plan of a run and its real execution: ``plan`` (count on the meta device, probe at the real
size when the weights fit, predict, warn, verdict) and ``execute`` (the run for real, what the
accuracy bench compares the plan with).

Torch-free at import.
"""
from __future__ import annotations

import time
from typing import Any

from skill_runtime import exits, reporting, streams
from policy_optimization import builder, measuring, run_config, trainers
from policy_optimization.plan import advice, budget, counting, prediction, probe

MIB = 2**20


def plan(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device, startup_s: float,
         progress: streams.Progress) -> dict[str, Any]:
    """Meta build (counts, no memory), bounded probe at the real size when the weights and the
    prompt ids fit, prediction, warnings and verdict."""
    name, spec = resolved["name"], trainers.TRAINERS[resolved["name"]]
    eff, train = resolved["effective"]["trainer"], resolved["effective"]["train"]
    meta_ids = builder.prompt_token_ids(resolved, args.seed, meta=True)
    params = counting.parameter_report(builder.build(resolved, device_kwargs, device, args.seed, meta=True,
                                                     prompt_ids=meta_ids).trainer)
    prompt_bytes = meta_ids.numel() * meta_ids.element_size()  # the trainer holds every prompt id
    meter = measuring.MemoryMeter(device)
    available = measuring.available_memory(device, meter)
    pool = "device" if device.type == "cuda" else "host"
    minibatch, epochs = eff["minibatch_size"], eff["epochs"]
    weights_need = params["weights_bytes"] + prompt_bytes + (meter.device_now() if pool == "device" else meter.rss())
    if weights_need <= available[pool]:
        probed = probe.probe_at_real_size(args, resolved, device_kwargs, device, meter, available, progress,
                                          one_round=args.one_round)
    else:
        probed = {"stored": None, "per_rollout": None, "measured": {}, "transients": {}, "report": {
            "budget_s": args.probe_seconds, "regime": "skipped", "elapsed_s": 0.0, "stages_s": {},
            "notes": ["not built at the real size: the weights and prompt ids alone exceed the memory available"]}}
        probed["measured"]["why_missing"] = {part: "not built at the real size: the weights and prompt ids alone "
                                                   "exceed the memory available" for part in ("construct", "rollouts", "learn")}
    stored, per_rollout = probed["stored"], probed["per_rollout"]
    base = probed.get("base") or {"host": meter.rss()}
    if stored is not None:
        group_size, items = stored["sequences_per_rollout"], stored["items"]
    else:  # not built, or its first rollout raised: the smoke's trainer table says which trainers
        group_size = eff[spec.group_kwarg] + 1 if spec.group_kwarg else 1  # store a group as separate items
        items = spec.items_per_rollout(group_size)
    probed["measured"]["startup_s"] = startup_s
    counts = run_counts(resolved, items)
    probe_report = probed["report"]
    memory = None if per_rollout is None else prediction.predict_memory(
        counts, per_rollout, stored["buffer"], base, params, probed["transients"], minibatch)
    if memory:
        pools = memory["pools"]
    else:  # not built: the weights and prompt ids, and what learn()'s optimizer steps add (as predict_memory)
        pools = {pool: weights_need + (params["optimizer_state_bytes"] + params["gradient_bytes"]
                                       if counts["learn_calls"] else 0)}
    failing = prediction.failing_pool(pools, available, pool)
    shown = failing or pool  # the pool the verdict names: the one that does not fit, else the run's device's
    peak, fits = pools[shown], failing is None
    wall = prediction.predict_time(counts, probed["measured"], epochs, evaluations(resolved))
    memory_text, memory_fix = prediction.memory_words(memory, pools, shown, pool, available, params, device,
                                                      resolved["defaults_applied"], bool(counts["learn_calls"]))
    optimizer = params["optimizers"][0] if params["optimizers"] else None
    warnings = prediction.build_warnings(name, resolved, counts, group_size, optimizer, fits, memory_text, memory_fix)
    units = advice.budget_units(resolved, counts, probed, params, base, pool)
    if memory and not fits:
        advice.name_the_memory_fit(warnings, units if shown == pool else
                                   advice.budget_units(resolved, counts, probed, params, base, shown), available[shown])
    warnings += [w for w in (advice.prompts_fill_max_seq_len(probed.get("prompt_lens"),
                                                             resolved["effective"]["train"]["max_seq_len"]),
                             advice.threads_warning(probed["report"].get("threads_check"),
                                                    probed["report"].get("load_average") or {}),
                             advice.long_on_cpu(device.type, wall["total_s"], units, counts,
                                                resolved["defaults_applied"])) if w]
    raised = probed["report"].get("raised")
    if raised and not any(w["blocks_learning"] for w in warnings):  # a failure no known trap explains
        warnings.append({"code": "probe_raised", "blocks_learning": True,
                         "message": f"the installed library raised in the probe's {raised['stage']}: {raised['error']}; "
                                    "the full run raises there too",
                         "fix": "change the setting the error names (tiny-rlhf-smoke on this trainer shows a "
                                "working configuration)", "doc": f"{prediction.DOCS}#symptom-index"})
    status, line = prediction.verdict(fits, counts, warnings, wall, peak, bool(memory and memory["complete"]),
                                      available[shown], args.max_days,
                                      cpu_day=any(w["code"] == "long_on_cpu" for w in warnings),
                                      where=prediction.POOL_WORDS[shown] if pool == "device" else "")
    reasons = ([memory_text] if not fits else []) + [w["message"] for w in warnings if w["blocks_learning"]]
    if status == "too_slow":
        reasons.append(f"predicted {reporting.seconds_text(wall['total_s'])} wall, over --max-days {args.max_days:g}: "
                       f"{counts['rollouts']:,} rollouts and {counts['learn_calls']:,} learn() calls"
                       + prediction.defaults_note(resolved["defaults_applied"], ("num_episodes", "max_timesteps")))
    if status == "fits":
        reasons.append(f"{counts['learn_calls']} learn() calls of {counts['items_per_learn']} experiences, "
                       f"{counts['optimizer_steps']} optimizer steps; peak {peak / MIB:,.0f} of "
                       f"{available[shown] / MIB:,.0f} MiB available")
    return {
        "status": status, "verdict": line, "reasons": reasons,
        "predicted": {"wall_s": round(wall["total_s"], 2), "wall": reporting.seconds_text(wall["total_s"]),
                      "wall_lower_bound": wall["lower_bound"], "peak_mib": round(peak / MIB, 1),
                      "available_mib": round(available[shown] / MIB, 1), "memory_pool": shown, "fits": fits,
                      "basis": probe_report["regime"]},
        "trainer": name, "class_name": f"{spec.module}.{spec.class_name}", "device": str(device),
        "counts": {**counts, "group_size": group_size, "basis": "computed"},
        "parameters": params,
        "stored_per_rollout": None if stored is None else {
            "bytes": per_rollout, "fields_bytes": probed["fields_bytes"], "replay_buffer": stored["buffer"],
            "replay_buffer_file_bytes": per_rollout * train.get("max_episodes", 1) * train["update_timesteps"]
            if stored["buffer"] else None,
            "basis": "computed from the fields the installed trainer stored in three tiny rollouts"},
        "memory": None if memory is None else {
            "base_bytes": prediction.figure(base, "measured"), "pools_bytes": memory["pools"], "complete": memory["complete"],
            **{k: v for k, v in memory["parts"].items()}},
        "time": {**{k: None if v is None else round(v, 3) for k, v in wall["parts_s"].items()},
                 "unit_s": {k: round(v, 5) for k, v in probed["measured"].items() if type(v) in (int, float)},
                 "missing": {k: why_missing(k, probed) for k, v in wall["parts_s"].items() if v is None}},
        "warnings": warnings, "probe": probe_report, "defaults_applied": resolved["defaults_applied"],
        "budget": None if args.budget is None and args.memory_budget is None else budget.plan_budget(
            units, args.budget, args.memory_budget, wall["total_s"], peak),
        "one_round": advice.one_round_report(probe_report.pop("one_round", None), probed["measured"], counts, epochs),
    }


def why_missing(part: str, probed: dict[str, Any]) -> str:
    """Why the prediction has no figure for ``part`` (the report's dash)."""
    reasons = probed["measured"].get("why_missing") or {}
    return reasons.get(part) or reasons.get("rollouts") or "not measured within --probe-seconds"



def run_counts(resolved: dict[str, Any], items_per_rollout: int) -> dict[str, int]:
    """``counting.run_counts`` of the configured run: [run] rounds of ``round_counts``' train()
    call, or the one ``train(**[train])`` call (num_episodes x max_timesteps rollouts)."""
    train, eff, rnd = resolved["effective"]["train"], resolved["effective"]["trainer"], resolved["round"]
    if rnd is None:
        return counting.run_counts(train["num_episodes"] * train["max_timesteps"], train["update_timesteps"],
                                   items_per_rollout, eff["minibatch_size"], eff["epochs"])
    return counting.run_counts(rnd["max_timesteps"], rnd["update_timesteps"], items_per_rollout,
                               eff["minibatch_size"], eff["epochs"], rnd["rounds"])


def evaluations(resolved: dict[str, Any]) -> int:
    """How many times [eval] scores the held-out prompts (``run_config.eval_points``); 0 without it."""
    if resolved["eval"] is None:
        return 0
    return len(run_config.eval_points(resolved["round"]["rounds"], resolved["eval"]["every"]))


def held_out(resolved: dict[str, Any], built, seed: int) -> float:
    """The [eval] score of the policy now: the mean of ``evaluation.of_run`` on the held-out
    prompts, sampled as a rollout samples (max_seq_len, temperature, eos_token of [train])."""
    from policy_optimization import evaluation
    name, trainer = resolved["name"], built.trainer
    return evaluation.of_run(resolved, trainers.actor_palm(name, trainer), trainers.actor_scope(name, trainer),
                             trainers.unwrap(trainer, trainer.reward_model), built.eval_prompt_ids, seed,
                             pad_value=trainer.pad_value).reward_mean


def execute(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device, startup_s: float,
            progress: streams.Progress) -> dict[str, Any]:
    """Build exactly as the probe does (``builder.build``) and run it in full: ``train(**[train])``
    (library defaults where [train] is silent), or with [run] its rounds of one train() call each
    and the [eval] scores at ``run_config.eval_points``. Reports the learn() calls seen, the
    held-out scores (``eval``, empty without [eval]), seconds, and the process's peak RSS (MiB)."""
    from accelerate.utils import set_seed

    set_seed(args.seed)
    t0 = time.perf_counter()
    built = builder.build(resolved, device_kwargs, device, args.seed)
    trainer = built.trainer
    construct_s = time.perf_counter() - t0
    rounds = resolved["round"]["rounds"] if resolved["round"] else 1
    points = run_config.eval_points(rounds, resolved["eval"]["every"]) if resolved["eval"] else []
    scores: list[dict[str, Any]] = []
    calls: list[int] = []
    real_learn = trainer.learn
    trainer.learn = lambda stored: (calls.append(measuring.stored_sizes(stored)["items"]), real_learn(stored))[1]
    t0 = time.perf_counter()
    error = None
    try:
        for done in range(rounds + 1):
            if done in points:
                with progress.stage(f"[eval] after round {done}"), streams.capture_library_output():
                    scores.append({"round": done, "reward": held_out(resolved, built, args.seed)})
            if done == rounds:
                break
            label = f"round {done + 1}/{rounds}: train()" if resolved["round"] else "train() in full"
            with progress.stage(label), streams.capture_library_output():
                trainer.train(**run_config.train_kwargs(resolved))
    except Exception as exc:  # the library's failure is this run's finding, not a crash
        error = exits.one_line(exc)
    train_s = time.perf_counter() - t0
    report = {"status": "ok" if error is None else "failed", "error": error, "trainer": resolved["name"],
              "device": str(device), "learn_calls": len(calls), "items_per_learn": calls,
              "eval": scores,
              "seconds": {"startup": round(startup_s, 3), "construct": round(construct_s, 3),
                          "train": round(train_s, 3), "total": round(measuring.process_seconds(), 3)},
              "peak_rss_mib": round(measuring.peak_rss_bytes() / MIB, 1)}
    if device.type == "cuda":
        import torch
        report["device_peak_mib"] = round(torch.cuda.max_memory_allocated(device) / MIB, 1)
    return report

