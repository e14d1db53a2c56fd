"""Reading a live or finished run directory: its rows, the curves, the rules fired, the verdict.

``palm-rlhf-skill watch DIR`` prints ``text(view(...))``, ``--json`` the ``view`` itself, ``--plot
FILE.png`` draws ``plot`` with matplotlib (the optional extra ``palm-rlhf-skill[plot]``). Each
kind of run (a policy run of ``train``, a reward-model run of ``train-reward``) brings its
``Layout``: the columns, the curves, the headline curve of the verdict, the command that resumes
it, what checks its rows and reads its summary, the sections of its rules; the command passes
them in by kind (``kind_of``: from the run's stored config).
Torch-free: it reads JSON only, so it answers in well under a second while the run trains.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from run_kit import lock, rundir
from skill_runtime import exits, reporting

@dataclass(frozen=True)
class Layout:
    """How watch shows one kind of run, brought by its sub-skill: ``table`` (column, row key,
    format) and ``curves`` (label, row key); ``headline`` the curve the verdict reports first ->
    last; ``helper`` the command that resumes it; ``parse_row`` checks a row of its metrics file;
    ``read(run, run_id)`` and ``verdict(summary, curves=...)`` read and word its summary.json;
    ``sections`` the doc section of each watchdog rule its rows can name (rule id -> path#anchor)."""
    table: tuple
    curves: tuple
    headline: str
    helper: str
    parse_row: Callable[[dict[str, Any]], dict[str, Any]]
    read: Callable[..., dict[str, Any] | None]
    verdict: Callable[..., tuple[str, str]]
    sections: dict[str, str]


def kind_of(stored: dict[str, Any] | None, layouts: dict[str, Layout]) -> str:
    """The run's kind: its stored config's ``kind`` where ``layouts`` has one for it (``reward``
    for a run of ``train-reward``), else ``policy`` (``train`` stores none)."""
    kind = (stored or {}).get("kind")
    return kind if kind in layouts else "policy"


PLOT_INSTALL = "pip install 'palm-rlhf-skill[plot]' (from a checkout of the repository: pip install '.[plot]')"


def view(path: str | Path, layouts: dict[str, Layout], last: int = 10) -> dict[str, Any]:
    """What ``watch`` shows, as JSON-ready data, through the ``Layout`` of the run's kind
    (``layouts``: kind -> Layout): the run's rows (round 0: the held-out reward before training;
    each checked, ``Layout.parse_row``), the ``last`` ones, each curve's values per round, the
    rules fired (id -> rounds), the summary when the run has ended (``summary.json``, checked:
    ``Layout.read``), and ``state``: ``finished``, ``stopped`` (ended early: a rule's
    --stop-on, a signal, an error), ``running`` (no summary, and a train holds DIR/train.lock:
    ``RunLock.held``, asked without taking it) or ``killed`` (no summary and no train holds the
    lock: killed, or its machine stopped). Raises SkillError(2) when ``path`` holds no run, a
    train that has not written its first row yet (or died before it), or a file that is damaged,
    a link, or another run's."""
    run = rundir.RunDir(Path(path).expanduser().resolve())
    alive = lock.RunLock.held(run)
    if not os.path.lexists(run.metrics) and os.path.lexists(run.path / rundir.LOCK):
        if alive is False:
            raise exits.SkillError(f"{path}: a train started there and ended before its first row ({rundir.LOCK} that "
                                   f"no process holds, no {rundir.METRICS}): start it again")
        raise exits.SkillError(f"{path}: a train is starting there ({rundir.LOCK}, no {rundir.METRICS} before its "
                               "first held-out evaluation or round): watch it again in a few seconds")
    if not os.path.lexists(run.metrics):
        raise exits.SkillError(f"{path}: no {rundir.METRICS} there: not a run directory (palm-rlhf-skill train "
                               "--config FILE --run-dir DIR writes one)")
    try:
        stored = run.read_config()
    except exits.SkillError:  # watch shows the rows without it; train --resume names the damage
        stored = None
    kind = kind_of((stored or ({}, None))[0], layouts)
    layout = layouts[kind]
    rows = rundir.read_rows(run.metrics, layout.parse_row)
    summary = layout.read(run, (stored or ({}, None))[0].get("run_id"))
    fired: dict[str, list[int]] = {}
    for row in rows:
        for rule in row.get("rules", []):
            fired.setdefault(rule, []).append(row["round"])
    if summary is not None:
        state = summary["status"] if summary["status"] in ("finished", "paused") else "stopped"  # paused: --until
    else:
        state = "killed" if alive is False else "running"
    return {"run_dir": str(run.path), "kind": kind, "state": state, "rounds": max((r["round"] for r in rows), default=0),
            "rows": rows, "last_rows": rows[-last:], "rules_fired": fired,
            "curves": {label: [[r["round"], r[key]] for r in rows if r[key] is not None] for label, key in layout.curves},
            "summary": summary}


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None and key == "held_out_accuracy" and row.get("held_out_pairs") == 0:
        return "n/a"  # an accuracy over zero pairs is not a number (reward_report.no_accuracy_reason)
    if value is None or (isinstance(value, float) and not math.isfinite(value) and fmt != "{}"):
        return "-" if value is None else str(value)
    if key == "rules":
        return ",".join(value) or "-"
    return fmt.format(value)


def table(rows: list[dict[str, Any]], columns: tuple) -> list[str]:
    """The rows as an aligned text table of ``columns`` (a ``Layout``'s table), one line per round."""
    cells = [[label for label, _, _ in columns]] + [[_cell(r, key, fmt) for _, key, fmt in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return ["  ".join(c.rjust(w) if i < len(columns) - 1 else c for i, (c, w) in enumerate(zip(line, widths)))
            for line in cells]


def text(data: dict[str, Any], layouts: dict[str, Layout]) -> str:
    """The plain report of ``view``'s ``data`` (``layouts``: as ``view`` took them): the last rows,
    a sparkline per curve (first -> last value), the rules fired with their doc section, and the
    verdict with the next step last."""
    shown, total = len(data["last_rows"]), len(data["rows"])
    rows = f"rows {data['last_rows'][0]['round']}-{data['rounds']}" if shown else "no rows"
    more = f", the last {shown} of {total} (--last N shows more)" if shown < total else ""
    layout = layouts[data.get("kind", "policy")]
    kind = " (a reward model)" if data.get("kind") == "reward" else ""
    lines = [f"run {data['run_dir']}{kind}: {data['state']}, {data['rounds']} rounds; {rows}{more}"] + \
        table(data["last_rows"], layout.table)
    for label, points in data["curves"].items():
        if points:
            values = [v for _, v in points]
            lines.append(f"{label:>10} {reporting.sparkline(values)} {values[0]:.4g} -> {values[-1]:.4g} "
                         f"(rounds {points[0][0]}-{points[-1][0]})")
    for rule, rounds in data["rules_fired"].items():
        section = layout.sections.get(rule)
        where = f"; read {section}" if section else ""
        lines.append(f"rule {rule}: rounds {_ranges(rounds)}{where}")
    if data.get("plot"):
        lines.append(f"plot: {data['plot']}")
    lines.append(verdict(data, layouts))
    return "\n".join(reporting.terminal_text(line) for line in lines)  # every string from DIR escaped


def _ranges(rounds: list[int]) -> str:
    """``1-3, 7``: consecutive rounds folded."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def verdict(data: dict[str, Any], layouts: dict[str, Layout]) -> str:
    """The last line: the state, held-out before -> after, what to do next."""
    layout = layouts[data.get("kind", "policy")]
    held = data["curves"][layout.headline]
    change = f"; {layout.headline} {held[0][1]:.4g} -> {held[-1][1]:.4g}" if len(held) >= 2 else ""
    reason = ((data.get("summary") or {}).get("held_out") or {}).get("reason")
    if not held and (reason or any(r.get("held_out_pairs") == 0 for r in data["rows"])):
        change = f"; {layout.headline} n/a ({reason or '0 held-out pairs'})"
    rules = f"; rules fired: {', '.join(data['rules_fired'])}" if data["rules_fired"] else "; no rule fired"
    plotted = bool(data.get("plot"))
    if data["state"] == "running":
        nxt = "watch it again" + ("" if plotted else ", or plot it") + ": " + \
            reporting.command("palm-rlhf-skill watch", data["run_dir"] + ("" if plotted else " --plot curves.png"))
    elif data["state"] == "paused":
        nxt = f"go on: {reporting.command(layout.helper, '--resume ' + data['run_dir'])}"
    elif data["state"] == "stopped":
        nxt = f"fix what stopped it, then {reporting.command(layout.helper, '--resume ' + data['run_dir'])}"
    elif data["state"] == "killed":
        nxt = f"no train holds it: {reporting.command(layout.helper, '--resume ' + data['run_dir'])}"
    else:  # finished: the next step train gave it (summary.verdict: the flat-held-out section when it did not learn)
        nxt = layout.verdict(data["summary"], curves=False)[1] if plotted \
            else data["summary"]["next"]
    return f"watch: {data['state'].upper()} after round {data['rounds']}{change}{rules}; next: {nxt}"


def plot(data: dict[str, Any], path: Path) -> Path:
    """Draw every curve against the round (one panel each) into ``path`` (PNG) with matplotlib's
    non-interactive Agg backend. Raises SkillError(3, a missing package) naming the install command
    when matplotlib is missing; SkillError(2) when ``path`` cannot be written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise exits.SkillError(f"--plot needs matplotlib, which is not installed: {PLOT_INSTALL}",
                               exits.EXIT_DEPENDENCY) from None
    curves = [(label, points) for label, points in data["curves"].items() if points]
    figure, axes = plt.subplots(len(curves) or 1, 1, figsize=(7, 1.9 * max(1, len(curves))), sharex=True, squeeze=False)
    for axis, (label, points) in zip(axes[:, 0], curves):
        axis.plot([r for r, _ in points], [v for _, v in points], marker="o", markersize=2)
        axis.set_ylabel(label)
        for rule, rounds in data["rules_fired"].items():
            for r in rounds:
                axis.axvline(r, color="red", alpha=0.15)
    axes[-1, 0].set_xlabel("round")
    figure.suptitle(f"{data['run_dir']} ({data['state']}, {data['rounds']} rounds)", fontsize=9)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except (OSError, ValueError) as err:  # an unwritable or missing folder, a format matplotlib lacks
        raise exits.SkillError(f"--plot {path}: cannot write the plot ({exits.one_line(err)}): name a writable "
                               "FILE.png (or .pdf, .svg)") from None
    finally:
        plt.close(figure)
    return path
