"""The shared main of the palm-modeling and reward-modeling smokes: gate, import, device, a
private working directory, the body's checks, the report."""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

from skill_runtime import exits, placement, reporting, runner, streams, version_gate, workspace


IMPORT_LABEL = "import torch and palm-rlhf-pytorch"  # the import stage's progress line


def run_checked_smoke(args: argparse.Namespace, title: str, config: dict[str, Any],
                      body: Callable[[Any, streams.Timer], dict[str, Any]], started: float, next_step: str) -> int:
    """Shared main of the palm-modeling and reward-modeling smokes.

    Version gate, timed import of torch and palm_rlhf_pytorch, ``--device`` via Accelerate, then
    ``body(device, timer)`` inside a private working directory with ``--cpu-threads`` torch threads
    and the library's output captured; ``timer`` shows each of its stages as a progress line.
    ``body`` returns JSON-ready results plus ``checks`` (Checks) and ``timings_s`` (seconds per
    stage). Emits the report (``--json``, or the summary ending with the verdict and
    ``next_step``) and returns exit 0 when every check passed, else 1. ``started`` is the
    script's ``time.perf_counter()`` at start.
    Raises SkillError (exit 2 or 3) from the version gate and device resolution.
    """
    env = version_gate.check_versions(args.allow_untested)
    progress = streams.Progress(title, not args.json or args.progress)
    timer = streams.Timer(progress)
    with timer.stage("import", label=IMPORT_LABEL):
        import torch  # noqa: F401  (the import floor, timed)
        import palm_rlhf_pytorch  # noqa: F401
    _, device = placement.resolve_device(args.device, trainers=False)  # these smokes build no Accelerator
    caller = os.getcwd()
    caller_before = workspace.watch_directory(caller)
    with workspace.private_workdir(), placement.torch_threads(args.cpu_threads) as threads, \
            streams.capture_library_output() as captured:
        result = body(device, streams.Timer(progress))
    checks: reporting.Checks = result.pop("checks")
    checks.items.append(workspace.caller_directory_check(caller, caller_before))
    report: dict[str, Any] = {
        "status": "ok" if checks.passed else "failed", "device": str(device), "seed": args.seed,
        "cpu_threads": threads,
        "versions": env["versions"], "tested": env["tested"], "warnings": env["warnings"],
        "config": dict(config), **result, "checks": checks.items,
        "library_output": captured.stdout.strip() or None,
        "timings_s": {"import": timer.stages["import"], **result["timings_s"]},
    }
    report["timings_s"]["total"] = round(time.perf_counter() - started, 4)
    return runner.emit(report, args.json, lambda r: reporting.checks_summary(title, r, next_step),
                exits.EXIT_OK if checks.passed else exits.EXIT_CHECK_FAILED)
