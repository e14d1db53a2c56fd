"""What the calibration scripts share (``calibrate_first_run.py``, ``calibrate_preferences.py``):
named variants of a shipped example, each measured over seeds in a private working directory with
one torch thread, into the rows their ``--markdown`` tables print. Torch-free at import."""
from __future__ import annotations

from typing import Any, Callable

from skill_runtime import exits, options, runner, streams, workspace


def add_options(parser, seeds: int, most: int = 50) -> None:
    """A calibration script's options: --variant (repeatable), --seeds (default ``seeds``, at most
    ``most``), --json, --markdown, --progress. Torch-free."""
    parser.add_argument("--variant", action="append", metavar="NAME", help="only this variant (repeatable)")
    parser.add_argument("--seeds", type=options.bounded_int(1, most), default=seeds, metavar="N",
                        help=f"seeds per variant (default: {seeds})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--markdown", action="store_true", help="print the doc's table")
    options.add_progress_option(parser)


def chosen(variants: dict[str, list[str]], asked: list[str] | None) -> list[str]:
    """The variants ``--variant`` asked for (all without it), in table order. Raises SkillError(2)
    naming an unknown one."""
    unknown = set(asked or []) - set(variants)
    if unknown:
        raise exits.SkillError(f"unknown --variant {', '.join(sorted(unknown))}; the variants are: " + "; ".join(variants))
    return [v for v in variants if not asked or v in asked]


def over_seeds(variants: dict[str, list[str]], names: list[str], seeds: int,
               measure: Callable[[list[str], int], dict[str, Any]], progress: streams.Progress) -> list[dict[str, Any]]:
    """``measure(overrides, seed)`` for each variant of ``names`` and seed 0 .. ``seeds`` - 1, one
    progress bar per variant; returns ``[{"variant", "overrides", "runs": [measure's dicts]}]``."""
    import torch
    torch.set_num_threads(1)
    rows = []
    with workspace.private_workdir():
        for name in names:
            with progress.stage(name, total=seeds, unit="seeds") as bar:
                runs = []
                for seed in range(seeds):
                    runs.append(measure(variants[name], seed))
                    if bar is not None:
                        bar.update(1)
            rows.append({"variant": name, "overrides": variants[name], "runs": runs})
    return rows


def emit(prog: str, variants: dict[str, Any], names: list[str], rows: list[dict[str, Any]],
         rose: Callable[[dict[str, Any]], bool], table: Callable[[list[dict[str, Any]]], str], args,
         **fields: Any) -> int:
    """Print a calibration's report and return its exit code: status "ok" (exit 0) when the shipped
    example, the first of ``variants``, was measured and ``rose(run)`` holds on every seed (or it
    was not measured), else "failed" (exit 1). ``--markdown`` prints ``table(rows)`` alone, the text
    report adds the status line, ``--json`` one object ``{"status", **fields, "rows"}``."""
    example = rows[0]["runs"] if names and names[0] == next(iter(variants)) else None
    ok = example is None or all(rose(x) for x in example)
    report = {"status": "ok" if ok else "failed", **fields, "rows": rows}
    return runner.emit(report, args.json, lambda r: table(r["rows"]) + ("" if args.markdown else
                       f"{prog}: {r['status'].upper()}"), exits.EXIT_OK if ok else exits.EXIT_CHECK_FAILED)
