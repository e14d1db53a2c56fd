"""The plan's plain report: counts, parameters, memory, time, warnings, then the verdict and the
next step (``summary``); ``--execute``'s one line.

Torch-free.
"""
from __future__ import annotations

from typing import Any

from skill_runtime import reporting, runner
from policy_optimization.plan import advice, prediction

MIB = 2**20


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def defaults_text(applied: list[dict[str, Any]]) -> str:
    """``[train] num_episodes 50,000, max_timesteps 500; [palm] heads 8`` from ``defaults_applied``."""
    tables: dict[str, list[str]] = {}
    for d in applied:
        value = f"{d['value']:,}" if isinstance(d["value"], int) and not isinstance(d["value"], bool) else d["value"]
        tables.setdefault(d["section"], []).append(f"{d['key']} {value}")
    return "; ".join(f"[{section}] " + ", ".join(items) for section, items in tables.items())


def load_text(probe: dict[str, Any]) -> str:
    """``; load average 2.1-2.6 on 2 CPUs`` (the probe's start and end), or nothing."""
    load = probe.get("load_average") or {}
    if load.get("start") is None:
        return ""
    span = f"{load['start']}" if load.get("end") in (None, load["start"]) else f"{load['start']}-{load['end']}"
    return f"; load average {span} on {load['cpus']} CPUs"


def one_round_text(one: dict[str, Any]) -> str:
    """The --one-round line: measured against predicted, rollouts and learn()."""
    def pair(measured, predicted, error):
        text = "-" if measured is None else reporting.seconds_text(measured)
        return text + ("" if predicted is None else f" (predicted {reporting.seconds_text(predicted)}"
                       + ("" if error is None else f", {error:+.0%}") + ")")
    return (f"one round [measured]: {one['rollouts']:,} rollouts "
            + pair(one["measured_rollouts_s"], one["predicted_rollouts_s"], one["rollouts_error"])
            + f", learn() on {one['learn_items']:,} experiences "
            + pair(one["measured_learn_s"], one["predicted_learn_s"], one["learn_error"]))


def budget_line(found: dict[str, Any]) -> str:
    """The --budget / --memory-budget line (``advice.budget_text``)."""
    parts = [reporting.seconds_text(found["seconds"])] if found["seconds"] is not None else []
    parts += [f"{found['memory_bytes'] / 2**30:,.1f} GiB"] if found["memory_bytes"] is not None else []
    fits = {True: "the configured run fits it", False: "the configured run does not fit it",
            None: "whether the configured run fits it is not known"}[found["fits"]]
    return f"budget {' and '.join(parts)} [derived]: {fits}; at this size {advice.budget_text(found)}"


def summary(report: dict[str, Any]) -> str:
    """Human report: counts, parameters, memory, time, warnings, then the verdict and a next step."""
    if "learn_calls" in report and "counts" not in report:  # --execute
        s = report["seconds"]
        return (f"{runner.program_name()} --execute: {report['trainer']} on {report['device']}: {report['status'].upper()}"
                + (f" ({report['error']})" if report["error"] else "")
                + f"; {report['learn_calls']} learn() calls; {s['total']} s wall (train {s['train']} s); "
                  f"peak RSS {report['peak_rss_mib']} MiB")
    c, p, probe = report["counts"], report["parameters"], report["probe"]
    lines = [f"{runner.program_name()}: {report['trainer']} ({report['class_name']}) on {report['device']}; probe "
             f"{probe['elapsed_s']} s of {probe['budget_s']:g} s ({probe['regime'] or 'not run'})" + load_text(probe),
             "counts [computed]: " + (f"{c['rounds']:,} rounds, " if "run" in report.get("config", {}) else "")
             + f"{c['rollouts']:,} rollouts; {c['learn_calls']:,} learn() calls of "
             f"{c['items_per_learn']:,} experiences ({c['items_per_rollout']} per rollout, group size "
             f"{c['group_size']}); {c['optimizer_steps_per_learn']:,} optimizer steps per learn(), "
             f"{c['optimizer_steps']:,} in all; {c['leftover_rollouts_dropped']:,} leftover rollouts dropped",
             f"parameters [computed]: {p['total_numel']:,} total, {p['trainable_numel']:,} trainable; weights "
             f"{mib(p['weights_bytes'])} MiB (" + ", ".join(f"{k} {mib(v['bytes'])}" for k, v in p["components"].items())
             + f"); optimizer state {mib(p['optimizer_state_bytes'])} MiB "
               f"({', '.join(f'{k}: {v} per parameter' for k, v in p['optimizer_state_tensors_per_parameter'].items())})"
               f", gradients {mib(p['gradient_bytes'])} MiB"]
    if report.get("defaults_applied"):
        lines.append("defaults [not set in the config]: " + defaults_text(report["defaults_applied"]))
    stored = report["stored_per_rollout"]
    if stored:
        largest = max(stored["fields_bytes"], key=stored["fields_bytes"].get)
        lines.append(f"stored per rollout [computed from the trainer's stored fields]: {mib(stored['bytes'])} MiB, "
                     f"of which {largest} {mib(stored['fields_bytes'][largest])} MiB"
                     + (f"; TPO replay buffer file {mib(stored['replay_buffer_file_bytes'])} MiB"
                        if stored["replay_buffer"] else ""))
    memory = report["memory"]
    if memory:
        why = (report["time"].get("missing") or {})
        unmeasured = {"rollout_transient": why.get("rollouts"), "learn_activations": why.get("learn")}
        parts = ", ".join(f"{k.replace('_', ' ')} {mib(v['value'])}"
                          + (f" ({unmeasured.get(k) or 'not measured'})" if v["value"] is None else f" [{v['basis']}]")
                          for k, v in memory.items()
                          if isinstance(v, dict) and "basis" in v and k != "base_bytes")
        lines.append(f"memory (MiB): process before the rollouts {mib(memory['base_bytes']['value']['host'])} "
                     f"[measured], {parts}")
    t = report["time"]
    unit = t["unit_s"]
    shown = {k: v for k, v in t.items() if k not in ("unit_s", "missing") and (k != "eval" or "eval" in report.get("config", {}))}
    why = t.get("missing") or {}
    lines.append("time: " + ", ".join(f"{k} " + (f"- ({why.get(k, 'not measured')})" if v is None
                                                 else reporting.seconds_text(v)) for k, v in shown.items())
                 + f" ({'startup and construct' if t.get('construct') is not None else 'startup'} measured; the rest "
                 + ("derived" if probe["regime"] not in (None, "skipped") else "not measured")
                 + "); one rollout " + (reporting.seconds_text(unit["rollout_s"]) if "rollout_s" in unit else "-")
                 + ", learn() per experience " + (f"{unit['learn_item_s']:.4f} s" if "learn_item_s" in unit else "-")
                 + f" [{probe['regime'] or 'not measured'}]")
    lines += [f"note: {n}" for n in probe["notes"]]
    if report.get("one_round"):
        lines.append(one_round_text(report["one_round"]))
    if report.get("budget"):
        lines.append(budget_line(report["budget"]))
    for w in report["warnings"]:
        lines.append(f"warning: {w['message']}; fix: {w['fix']}" + (f" (see {w['doc']})" if w["doc"] else ""))
    blocking = [w for w in report["warnings"] if w["blocks_learning"] or w["code"] == "memory_exceeds_device"]
    long = [w for w in report["warnings"] if w["code"] == "long_on_cpu"] if report["status"] == "fits" else []
    nxt = (blocking[0]["fix"] + ", then plan again" if blocking else long[0]["fix"] if long else
           "fewer rollouts (num_episodes, max_timesteps" + ", or [run] rounds" * ("run" in report.get("config", {}))
           + ")" + prediction.defaults_note(report.get("defaults_applied", []), ("num_episodes", "max_timesteps"))
           + ", smaller sizes or a faster device, then plan again (or raise --max-days; --budget names the largest "
             "run in a time)" if report["status"] == "too_slow" else
           "start the run; plan again after changing any size")
    lines.append(f"verdict: {report['verdict']}; next: {nxt}")
    return "\n".join(lines)

