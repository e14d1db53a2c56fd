"""The bench's --scaling mode: how the PPO and GRPO train smoke's update and generate time and peak
memory grow with dim, depth, prompt length and max_seq_len, one axis at a time around a base point;
``--markdown`` prints it as the "Sizing a bigger smoke (measured)" section of references/sizing.md.
The bench (bench_smoke.py, passed in as ``bench``) runs and times the children.

Torch-free at import.
"""
from __future__ import annotations

import datetime
from typing import Any

from skill_runtime import exits


def fmt(s: dict | None, digits: int = 2) -> str:
    """The median of a ``spread``, or ``-``."""
    return "-" if s is None else f"{s['median']:.{digits}f}"

# Scaling sweep: one axis varied at a time around the base point (smoke options of the same name).
SCALING_TRAINERS = ("ppo", "grpo")
SCALING_BASE = {"dim": 32, "depth": 1, "prompt-len": 8, "new-tokens": 8}
SCALING_AXES = {
    "dim": (32, 256, 1024, 2048),
    "depth": (1, 4, 16),
    "prompt-len": (8, 128, 512),
    "new-tokens": (8, 128, 512),
}
SCALING_HEADER = ("trainer", "varied", "dim", "depth", "prompt len", "max_seq_len",
                  "update (s)", "generate (s)", "peak RSS (MiB)")
SECTION_TITLE = "## Sizing a bigger smoke (measured)"


def scaling_points(trainers: list[str] | None = None, axes: list[str] | None = None) -> list[dict[str, Any]]:
    """The sweep's rows, in table order: ``{trainer, axis, value, config}`` (no measurement).

    ``config`` holds dim, depth, prompt_len, new_tokens and max_seq_len (= prompt_len + new_tokens,
    what the smoke passes to ``train()`` and ``generate()``).
    """
    rows = []
    for trainer in trainers or SCALING_TRAINERS:
        for axis in axes or SCALING_AXES:
            for value in SCALING_AXES[axis]:
                point = {**SCALING_BASE, axis: value}
                config = {"dim": point["dim"], "depth": point["depth"], "prompt_len": point["prompt-len"],
                          "new_tokens": point["new-tokens"],
                          "max_seq_len": point["prompt-len"] + point["new-tokens"]}
                rows.append({"trainer": trainer, "axis": axis, "value": value, "config": config})
    return rows


def scaling_case(bench, trainer: str, config: dict[str, int], device: str):
    extra = ("--dim", str(config["dim"]), "--depth", str(config["depth"]),
             "--prompt-len", str(config["prompt_len"]), "--new-tokens", str(config["new_tokens"]))
    case = bench.smoke_case(trainer, "train-smoke", device, extra)
    key = f"{trainer}/d{config['dim']}-l{config['depth']}-p{config['prompt_len']}-n{config['new_tokens']}"
    return bench.Case(key, key, case.argv)


def run_scaling(bench, args, env: dict[str, Any]) -> dict[str, Any]:
    """The sweep's rows measured as fresh smoke processes (``bench.measure``), with the floor."""
    trainers = [t for t in dict.fromkeys(args.trainer or SCALING_TRAINERS)]
    bad = [t for t in trainers if t not in SCALING_TRAINERS]
    if bad:
        raise exits.SkillError(f"--scaling measures {' and '.join(SCALING_TRAINERS)}, not {', '.join(bad)}")
    rows = scaling_points(trainers, list(dict.fromkeys(args.axis)) if args.axis else None)
    cases = {}
    for row in rows:  # the base point appears once per axis; measure it once
        case = scaling_case(bench, row["trainer"], row["config"], args.device)
        cases.setdefault(case.key, case)
        row["case"] = case.key
    all_cases = [bench.floor_case(), *cases.values()]
    runs = bench.measure(all_cases, args.repeat, args.warmup, args.progress_bars)
    summary = bench.summarize(all_cases, runs)
    for row in rows:
        entry = summary[row.pop("case")]
        row.update(update_s=entry["stages_s"]["update"], generate_s=entry["stages_s"]["generate"],
                   peak_rss_mib=entry["peak_rss_mib"], wall_s=entry["wall_s"], ok=entry["ok"],
                   trainable_numel=entry.get("trainable_numel"))
    ok = all(row["ok"] for row in rows)
    threads = next((e["config"].get("cpu_threads") for key, e in summary.items()
                    if key != "floor" and e.get("config")), None)
    report = {"kind": "scaling", "status": "ok" if ok else "failed", "device": args.device,
              "repeat": args.repeat, "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
              "machine": bench.machine(), "versions": env["versions"], "warnings": env["warnings"],
              "cpu_threads": threads, "base": SCALING_BASE,
              "floor": {k: summary["floor"][k] for k in bench.METRICS}, "rows": rows}
    return report


def scaling_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown table lines for scaling rows (measured rows carry update_s, generate_s, peak_rss_mib)."""
    lines = ["| " + " | ".join(SCALING_HEADER) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(SCALING_HEADER))) + "|"]
    for row in rows:
        cfg = row["config"]
        cells = [row["trainer"], f"{row['axis']} = {row['value']}", cfg["dim"], cfg["depth"],
                 cfg["prompt_len"], cfg["max_seq_len"], fmt(row.get("update_s")),
                 fmt(row.get("generate_s"), 3), fmt(row.get("peak_rss_mib"), 0)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def scaling_markdown(report: dict[str, Any]) -> str:
    """The docs section, regenerated verbatim by ``bench_smoke.py --scaling --markdown``."""
    m, v = report["machine"], report["versions"]
    floor = report["floor"]
    text = [
        SECTION_TITLE, "",
        f"Measured {report['date']} on {m['system']}, {m['cpu']} ({m['cpu_count']} CPUs, load average "
        f"{m['load_average_1min']} at start), Python {v['python']}, torch {v['torch']}, "
        f"palm-rlhf-pytorch {v['palm-rlhf-pytorch']}, accelerate {v['accelerate']}; device "
        f"{report['device']}, {report['cpu_threads']} torch thread, median of {report['repeat']} fresh "
        "processes per row.", "",
        f"Each row is one `tiny-rlhf-smoke --trainer T --train-smoke` run with one size option changed "
        f"from the base point (`--dim {SCALING_BASE['dim']} --depth {SCALING_BASE['depth']} --prompt-len "
        f"{SCALING_BASE['prompt-len']} --new-tokens {SCALING_BASE['new-tokens']}`); max_seq_len is "
        "prompt len + new tokens. update: the one bounded `train()` call (every rollout plus one "
        "`learn()`, including the library's one-time first-call work: einx traces each expression "
        "and solves its shapes with sympy); generate: one `trainer.generate()` of 2 samples; peak "
        "RSS: the whole process, "
        f"of which importing palm-rlhf-pytorch alone takes {fmt(floor['peak_rss_mib'], 0)} MiB "
        f"({fmt(floor['wall_s'])} s wall) here. Timings vary with machine load; compare rows, not machines.",
        "",
        "Regenerate (then replace this section with the output):", "",
        "```bash",
        "python sub-skills/policy-optimization/scripts/bench_smoke.py --scaling --markdown",
        "```", "",
        *scaling_table(report["rows"]),
    ]
    return "\n".join(text) + "\n"


def scaling_summary(report: dict[str, Any]) -> str:
    """The sizing table, then the verdict."""
    ok = report["status"] == "ok"
    return scaling_markdown(report) + (
        "bench-smoke --scaling: OK (exit 0): every row ran; next: replace the section of "
        "sub-skills/policy-optimization/references/sizing.md with --markdown's output" if ok else
        "bench-smoke --scaling: FAILED (exit 1): a row's smoke failed (its cells show -); next: run it alone")
