"""The words and figures of a reward-model run: the pairwise accuracy, one metrics row per round,
``summary.json``, the verdict with the next command, the plain report, and ``LAYOUT``, how
``watch`` shows a reward-model run (``run_kit.watch.Layout``). Torch-free."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from reward_modeling import coverage
from run_kit import rundir, watch
from skill_runtime import reporting

# The keys of a reward run's metrics row, in order; units and meaning: references/run-reports.md#train-reward-metrics-row.
ROW_KEYS = ("round", "epoch", "step", "examples", "wall_s", "examples_per_s", "loss", "train_accuracy", "margin",
            "held_out_loss", "held_out_accuracy", "held_out_margin", "held_out_pairs", "grad_norm",
            "trainable_change_norm", "lr")
_NUMBER = (int, float)
STATUSES = ("finished", "paused", "interrupted", "failed")
# what a stored summary.json must hold for watch and a resume to read it (references/run-reports.md#train-reward-summary)
SHAPE = {"status": str, "reason": (str, type(None)), "kind": str, "data": str, "device": str, "rounds_done": int,
         "rounds_planned": int, "steps_done": int, "held_out": dict, "unseen_ids": list, "files": dict,
         "wall_s": _NUMBER, "verdict": str, "next": str}
LEARNED_ABOVE = 0.6  # held-out accuracy a run must pass (and rise to) to be said to have learned (chance: 0.5)
DOC = "sub-skills/reward-modeling/references/preferences.md"


def pairwise(higher: list[float], lower: list[float]) -> dict[str, Any]:
    """How often the first score of each pair is above the second (``accuracy``: ties count as
    wrong) and by how much on average (``margin``), with the sums behind them (``correct``,
    ``margin_sum``, ``count``)."""
    correct = sum(h > lo for h, lo in zip(higher, lower))
    margin_sum = sum(h - lo for h, lo in zip(higher, lower))
    count = len(higher)
    return {"accuracy": correct / count if count else None, "margin": margin_sum / count if count else None,
            "correct": correct, "margin_sum": margin_sum, "count": count}


def ordered_pairs(scores: list[float], ratings: list[float]) -> tuple[list[float], list[float]]:
    """Every pair of rows with different ratings as (score of the higher-rated, score of the
    lower-rated): ratings ranked as preference pairs."""
    higher, lower = [], []
    for i, (si, ri) in enumerate(zip(scores, ratings)):
        for sj, rj in zip(scores[i + 1:], ratings[i + 1:]):
            if ri != rj:
                higher.append(si if ri > rj else sj)
                lower.append(sj if ri > rj else si)
    return higher, lower


def ranked(scores: list[float], ratings: list[float]) -> dict[str, Any]:
    """``pairwise`` over every pair of rated rows with different ratings."""
    return pairwise(*ordered_pairs(scores, ratings))


def build_row(round_: int, steps_done: int, steps_per_epoch: int, examples: int, wall_s: float, loss: float | None,
              train_accuracy: float | None, margin: float | None, held_out: dict[str, float | None],
              grad_norm: float | None, change: float, lr: float) -> dict[str, Any]:
    """The metrics row of one round (keys ``ROW_KEYS``): ``epoch`` the epochs done (a float),
    ``step`` the optimizer steps done, ``examples`` the pairs (or rated rows) trained on in the
    round, seconds, the mean training loss, accuracy and margin, the held-out figures, the mean
    gradient norm and the L2 norm of the trainable tensors' change."""
    row = {"round": round_, "epoch": round(steps_done / steps_per_epoch, 4), "step": steps_done, "examples": examples,
           "wall_s": round(wall_s, 4), "examples_per_s": round(examples / wall_s, 1) if wall_s > 0 else None,
           "loss": loss, "train_accuracy": train_accuracy, "margin": margin, **held_out, "grad_norm": grad_norm,
           "trainable_change_norm": change, "lr": lr}
    return {key: row[key] for key in ROW_KEYS}


def parse_row(row: dict[str, Any]) -> dict[str, Any]:
    """A reward run's metrics row read back from a file (``rundir.parse_rows``), checked: every key
    of ROW_KEYS it has is a number or null (``step`` an integer); a key it lacks becomes null.
    Returns the row with every key of ROW_KEYS. Raises ValueError naming the first bad key."""
    for key in ROW_KEYS:
        value = row.get(key)
        kind = int if key == "step" else _NUMBER
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise ValueError(f"has {key} {str(value)[:40]!r}, not a number (or null)")
    return {**dict.fromkeys(ROW_KEYS), **row}


def problem(summary: Any) -> str | None:
    """What makes ``summary`` (summary.json as read) not a reward run's summary, or None: a key of
    SHAPE missing or of another type, an unknown status or kind, held-out figures, unseen ids or
    files of other shapes."""
    if (wrong := rundir.shape_problem(summary, SHAPE)) is not None:
        return wrong
    if summary["status"] not in STATUSES or summary["kind"] != "reward":
        return f"status {summary['status']!r:.40} or kind {summary['kind']!r:.20} is not a reward run's"
    held = summary["held_out"]
    if not all(held.get(k) is None or type(held.get(k)) in _NUMBER for k in ("before", "after")):
        return "held_out is not {before, after, rounds}"
    if not all(type(i) is int for i in summary["unseen_ids"]):
        return "unseen_ids is not a list of ids"
    if not all(isinstance(v, (str, type(None))) for v in summary["files"].values()) or "metrics" not in summary["files"]:
        return "files is not names to paths"
    return None


def read(run: rundir.RunDir, run_id: str | None = None) -> dict[str, Any] | None:
    """The run's summary.json, checked (``problem``; of run ``run_id`` when given), or None while
    there is none (``rundir.checked_summary``: SkillError(2) for a link, a damaged, edited or
    another run's file; its paths re-based to where ``run`` is)."""
    return rundir.checked_summary(run, run_id, problem, "train-reward")


def baseline_row(held_out: dict[str, float | None]) -> dict[str, Any]:
    """Row 0: the held-out figures before training, every other one null."""
    row = dict.fromkeys(ROW_KEYS)
    row.update(held_out, round=0, epoch=0.0, step=0)
    return row


def progress_text(row: dict[str, Any]) -> str:
    """A round's progress postfix: loss, training and held-out accuracy."""
    def fmt(key: str, digits: str = ".3f") -> str:
        value = row[key]
        return "-" if value is None else format(value, digits)
    return f"loss {fmt('loss')}, accuracy {fmt('train_accuracy')}, held-out {fmt('held_out_accuracy')}"


def summarize(run, status: str, reason: str | None, files: dict[str, Any], probe: dict[str, Any] | None) -> dict[str, Any]:
    """summary.json of ``run`` (a ``RewardRun``): what ran, held-out accuracy before -> after, the
    token coverage (``unseen_ids``, the ``coverage`` probe), the files, the verdict and the next
    command, and (``options.env`` given) the versions and warnings."""
    trained = [r for r in run.rows if r["round"] > 0]
    held = [(r["round"], r["held_out_accuracy"]) for r in run.rows if r["held_out_accuracy"] is not None]
    pairs = run.rows[-1].get("held_out_pairs") if run.rows else None
    wall = sum(r["wall_s"] for r in trained)
    count = sum(r["examples"] for r in trained)
    resolved = run.resolved
    summary = {"status": status, "reason": reason, "kind": "reward", "data": resolved["kind"],
               "device": str(run.device), "processes": run.trainer.accelerate.num_processes,
               "rounds_done": max((r["round"] for r in trained), default=run.start),
               "rounds_planned": run.rounds_planned, "steps_done": trained[-1]["step"] if trained else 0,
               "epochs_done": trained[-1]["epoch"] if trained else 0.0,
               "examples": {"train": len(run.prepared.train), "held_out": len(run.prepared.held_out),
                            "held_out_from": run.prepared.held_out_from},
               "held_out_accuracy": held[-1][1] if held else None,
               "held_out": {"before": held[0][1] if held else None, "after": held[-1][1] if len(held) > 1 else None,
                            "rounds": [h[0] for h in held], "pairs": pairs,
                            "reason": no_accuracy_reason(run.prepared.held_out, pairs)},
               "loss": {"first": trained[0]["loss"] if trained else None, "last": trained[-1]["loss"] if trained else None},
               "examples_per_s": round(count / wall, 1) if wall > 0 else None,
               "tie_unseen_embeddings": resolved["train"]["tie_unseen_embeddings"],
               "unseen_ids": run.unseen, "coverage": probe, "files": files,
               "wall_s": round(time.perf_counter() - run.started_s, 2)}
    options = run.prepared.options
    summary["verdict"], summary["next"] = verdict(summary, options.resume_flags)
    summary["run_id"] = run.run_id
    if options.env is not None:
        summary["versions"], summary["warnings"] = options.env["versions"], options.env["warnings"]
    if run.notes:  # an inexact resume is said where the run's result is
        summary["warnings"] = [*summary.get("warnings", []), *run.notes]
    return summary


def no_accuracy_reason(held_out, pairs: int | None) -> str | None:
    """Why the held-out accuracy is not a number, or None when it is: an accuracy over zero pairs
    (ratings all equal leave none to rank) is n/a, never 0."""
    if pairs is None or pairs > 0:
        return None
    if held_out.kind == "ratings":
        return (f"0 held-out pairs: the {len(held_out)} held-out rows share one rating, so none ranks above another; "
                "hold out rows of different ratings")
    return f"0 held-out pairs among {len(held_out)} held-out rows"


def accuracy_words(held: dict[str, Any]) -> str:
    """``held-out accuracy 0.450 -> 0.850``, or ``n/a (REASON)`` when it is not a number."""
    if held["after"] is not None:
        return f"held-out accuracy {held['before']:.3f} -> {held['after']:.3f}"
    if held["before"] is not None:
        return f"held-out accuracy {held['before']:.3f} before training"
    return f"held-out accuracy n/a ({held.get('reason') or 'not scored'})"


def learned(summary: dict[str, Any]) -> bool:
    """Held-out accuracy above LEARNED_ABOVE and above where it started."""
    held = summary["held_out"]
    return held["after"] is not None and held["after"] > LEARNED_ABOVE and held["after"] > held["before"]


def coverage_words(summary: dict[str, Any]) -> str:
    """``37 of 257 ids seen; 220 unseen, 12 of them score like preferred responses`` (the probe)."""
    probe, unseen = summary.get("coverage") or {}, len(summary["unseen_ids"])
    words = f"{unseen} ids never in the training data"
    if probe.get("repeated_above_median") is None:
        return words
    words += (f"; repeated, {probe['repeated_above_median']} of them score at or above the median preferred response, "
              f"mixed in, {probe['mixed_above_own']} raise a preferred response's score")
    return words


def verdict(summary: dict[str, Any], resume_flags: str = "", curves: bool = True) -> tuple[str, str]:
    """The verdict line and the next command of a summary; ``resume_flags`` go into the resume
    command it suggests; ``curves`` as the policy run's (``summary.verdict``: a finished reward
    run's next step is the policy run either way)."""
    held, status = summary["held_out"], summary["status"]
    run_dir = str(Path(summary["files"]["metrics"]).parent)
    change = accuracy_words(held)
    if status == "finished" and held["after"] is None and held.get("reason"):  # no number, no verdict on learning
        return (f"FINISHED: {summary['rounds_done']} rounds ({summary['epochs_done']:g} epochs), {change}: no verdict "
                f"on learning; {coverage_words(summary)}", f"read {DOC}#what-it-trains")
    if status == "finished":
        word = "FINISHED" if learned(summary) else "FINISHED, NOT LEARNING"
        risky = coverage.gameable(summary.get("coverage") or {}) and not summary["tie_unseen_embeddings"]
        line = (f"{word}: {summary['rounds_done']} rounds ({summary['epochs_done']:g} epochs), {change}; "
                f"{coverage_words(summary)}" + ("; a policy can game it: READ token coverage" if risky else ""))
        if not learned(summary):
            return line, f"read {DOC}#not-learning"
        if risky:
            return line, f"read {DOC}#token-coverage, or set [train] tie_unseen_embeddings = true and start over"
        rm = summary["files"].get("rm")
        return line, (f"train a policy against it: [reward] checkpoint = \"{rm}\" in its config, then "
                      f"{reporting.command('palm-rlhf-skill train', '--config POLICY.toml --run-dir DIR')}")
    word = {"paused": "PAUSED", "interrupted": "INTERRUPTED", "failed": "FAILED", "stopped": "STOPPED"}[status]
    nxt = reporting.command("palm-rlhf-skill train-reward", f"--resume {run_dir}{resume_flags}")
    if status == "failed":
        nxt = f"fix it, then {reporting.command('palm-rlhf-skill train-reward', '--config RM.toml --run-dir ' + run_dir + ' --force')}"
    return f"{word} after round {summary['rounds_done']} ({summary['reason']}): {change}", nxt


def plain(summary: dict[str, Any]) -> str:
    """The plain report: what ran, held-out accuracy, token coverage, files, the verdict and the
    next step last."""
    ex = summary["examples"]
    rate = summary["examples_per_s"]
    lines = [f"train-reward: {summary['data']} on {summary['device']}: {summary['rounds_done']} of "
             f"{summary['rounds_planned']} rounds, {summary['steps_done']} steps ({summary['epochs_done']:g} epochs), "
             f"{ex['train']} training and {ex['held_out']} held-out rows ({ex['held_out_from']}), "
             f"{reporting.seconds_text(summary['wall_s'])}" + (f", {rate:g} rows/s while training" if rate else "")]
    held = summary["held_out"]
    if held["before"] is not None:
        after = "-" if held["after"] is None else f"{held['after']:.3f}"
        lines.append(f"held-out accuracy: {held['before']:.3f} -> {after} (rounds {', '.join(map(str, held['rounds']))})")
    elif held.get("reason"):
        lines.append(f"held-out accuracy: n/a ({held['reason']})")
    probe = summary.get("coverage") or {}
    lines.append(f"token coverage: {coverage_words(summary)}" + (
        " (tied to the mean of the seen ones)" if summary["tie_unseen_embeddings"] else ""))
    if probe.get("repeated_mean") is not None:
        lines.append(f"coverage probe: preferred responses score {probe['preferred_median']:.3g} (median), an unseen id "
                     f"repeated {probe['repeated_mean']:.3g} (mean) to {probe['repeated_max']:.3g} (max, id "
                     f"{probe['worst'][0]['id']}), mixed into a preferred response {probe['mixed_mean']:.3g} (mean)")
    lines += [f"{key}: {path}" for key, path in summary["files"].items() if path]
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]
    lines.append(f"{summary['verdict']}; next: {summary['next']}")
    return "\n".join(reporting.terminal_text(line) for line in lines)  # a stored summary's strings escaped


# watch's columns (column, row key, format) and curves (label, row key) of a reward-model run
TABLE = (("round", "round", "{:d}"), ("epoch", "epoch", "{:.2f}"), ("loss", "loss", "{:.4f}"),
         ("accuracy", "train_accuracy", "{:.3f}"), ("held-out", "held_out_accuracy", "{:.3f}"),
         ("margin", "margin", "{:.3g}"), ("rows/s", "examples_per_s", "{:.0f}"), ("s", "wall_s", "{:.1f}"))
CURVES = (("held-out accuracy", "held_out_accuracy"), ("accuracy", "train_accuracy"), ("loss", "loss"),
          ("held-out loss", "held_out_loss"), ("margin", "margin"))
LAYOUT = watch.Layout(TABLE, CURVES, "held-out accuracy", "palm-rlhf-skill train-reward", parse_row, read, verdict, {})
