"""``palm-rlhf-skill bench --rollouts`` (policy_optimization/rollout_bench.py): usage errors are one
line before torch; a quick run prints the documented JSON (the keys other tools read: ``rows`` with
``batch``, ``prompt``, ``new``, ``dim``, ``depth``, ``library_tokens_per_s``,
``cached_tokens_per_s``, ``ratio``) with its exit code following the goal's verdict; the goal's
judgement can pass, fail and be inconclusive. Timings are never asserted."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO, run, run_json
from doc_tables import assert_keys_documented
from policy_optimization import rollout_bench

BENCH = REPO / "sub-skills" / "policy-optimization" / "scripts" / "bench_smoke.py"
ROW_KEYS = {"batch", "prompt", "new", "dim", "depth", "library_tokens_per_s", "cached_tokens_per_s", "ratio"}


@pytest.mark.parametrize("argv, says", [
    (["--quick"], "--quick applies to --rollouts"),
    (["--dims", "256x4"], "--dims applies to --rollouts"),
    (["--rollouts", "--dims", "256"], "expected DIMxDEPTH"),
    (["--rollouts", "--dims", "1x4"], "dim >= 2"),
    (["--rollouts", "--scaling"], "--scaling, --plan-accuracy, --train-overhead and --rollouts are separate runs"),
    (["--rollouts", "--cpu-threads", "0"], "--cpu-threads"),
])
def test_usage_errors_are_one_line_exit_2_without_torch(empty_dir, argv, says):
    proc = run([sys.executable, "-X", "importtime", str(BENCH), *argv], empty_dir)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], errors
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_quick_run_prints_the_documented_report(empty_dir):
    proc, report = run_json([sys.executable, str(BENCH), "--rollouts", "--quick", "--dims", "48x1", "--profile",
                             "--json"], empty_dir, timeout=900)
    assert proc.returncode == {"ok": 0, "failed": 1, "inconclusive": 75}[report["status"]], proc.stderr[-2000:]
    assert report["kind"] == "rollouts" and report["cpu_threads"] == 1 and report["num_tokens"] == 257
    rows = report["rows"]
    assert [(r["batch"], r["prompt"], r["new"], r["dim"], r["depth"]) for r in rows] == [(1, 128, 128, 48, 1),
                                                                                      (8, 128, 128, 48, 1)]
    for r in rows:
        assert ROW_KEYS <= set(r) and r["library_tokens_per_s"] > 0 and r["cached_tokens_per_s"] > 0
        assert r["ratio"] > 0 and r["floors"]["ops_per_step"] > 0 and r["profile"]
    assert [t["config"] for t in report["train_rounds"]] == list(rollout_bench.QUICK_TRAIN_CONFIGS)
    assert report["goal"]["rows"] == 2
    assert_keys_documented("### bench --rollouts report", [report])
    assert list(empty_dir.iterdir()) == []


def test_the_library_is_timed_by_its_steps_beyond_the_cap():
    """``--max-library-s 0``: the library's generate is summed from steps at four lengths."""
    import torch
    palm = rollout_bench.build_palm(32, 1, 64, torch.device("cpu"))
    row = rollout_bench.measure_row(palm, 2, 16, 8, 1, 0.0, torch.device("cpu"))
    assert row["library_basis"].startswith("steps") and row["library_s"] > 0
    full = rollout_bench.measure_row(palm, 2, 16, 8, 1, float("inf"), torch.device("cpu"))
    assert full["library_basis"] == "full"


def row(ratio, low, high, prompt=128, new=128):
    return {"batch": 1, "prompt": prompt, "new": new, "dim": 64, "depth": 2, "ratio": ratio, "ratio_range": [low, high]}


@pytest.mark.parametrize("rows, load, verdict", [
    ([row(6.0, 5.5, 7.0), row(2.0, 1.5, 2.5, 64, 64)], 0.5, "pass"),   # the short row is not judged
    ([row(6.0, 5.5, 7.0), row(3.0, 2.5, 3.5)], 0.5, "fail"),
    ([row(4.5, 4.0, 5.2)], 0.5, "inconclusive"),                        # some pair reached the goal
    ([row(3.0, 2.5, 3.5)], 2.0, "inconclusive"),                        # load at the CPU count
    ([row(3.0, 2.5, 3.5, 64, 64)], 0.5, "skip"),
])
def test_goal_verdicts(rows, load, verdict):
    goal = rollout_bench.goal_check(rows, {"max": load, "cpus": 2})
    assert goal["verdict"] == verdict
    assert goal["missed"] == ([] if verdict in ("pass", "skip") else [
        {k: r[k] for k in ("batch", "prompt", "new", "dim", "depth", "ratio")} for r in rows
        if r["prompt"] + r["new"] >= 256 and r["ratio"] < 5])


def test_parse_dims():
    assert rollout_bench.parse_dims("256x4, 512X12") == ((256, 4), (512, 12))
    for bad in ("256", "x4", "256x0", "ax4"):
        with pytest.raises(ValueError):
            rollout_bench.parse_dims(bad)
