"""The PPO smoke helper: in-process, as a script by path, and as the installed console script."""
from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import (BIN, REPO, SMOKE, default_signals, inprocess, main_in_process, run, run_json,
                      usage_error_without_torch)
import probe_kit
from skill_runtime import byte_tokenizer, exits, runner, version_gate
from policy_optimization import tiny_trainers
from policy_optimization.smoke import prompts as smoke_prompts

TOP_KEYS = {"status", "mode", "trainer", "device", "versions", "timings_s", "checks", "parameters",
            "generated"}


def test_ppo_train_smoke_in_process(smoke, capsys, monkeypatch, empty_dir):
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert TOP_KEYS <= report.keys()
    assert report["status"] == "ok" and report["trainer"] == "ppo" and report["mode"] == "train-smoke"
    assert set(report["versions"]) == {"palm-rlhf-pytorch", "torch", "accelerate", "python"}
    assert set(report["timings_s"]) == {"import", "construct", "update", "generate", "total"}
    assert all(isinstance(v, float) and v >= 0 for v in report["timings_s"].values())
    params = report["parameters"]
    assert params["trainable_changed"] == params["trainable_total"] > 0
    assert params["frozen_changed"] == 0 and params["frozen_total"] > 0
    names = {c["name"] for c in report["checks"]}
    assert {"actor_lora_changed", "critic_lora_changed", "value_head_changed", "base_weights_unchanged",
            "reward_model_unchanged", "losses_finite", "generated_sequence", "optimizer_steps"} <= names
    assert all(isinstance(c["passed"], bool) and isinstance(c["detail"], str) for c in report["checks"])
    steps = report["optimizer_steps"]
    assert steps["observed"]["actor"] == steps["expected"] >= steps["required"] == 3
    assert report["generated"]["dtype"] == "int64" and len(report["generated"]["shape"]) == 1
    assert report["losses"]["policy_loss"] and report["losses"]["critic_loss"]
    assert list(empty_dir.iterdir()) == []


def test_json_stdout_is_one_object_and_dir_stays_empty(empty_dir):
    proc, report = run_json([sys.executable, str(SMOKE), "--device", "auto", "--train-smoke", "--json"], empty_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["status"] == "ok" and report["device"] == "cpu"
    assert report["parameters"]["trainable_changed"] > 0 and report["parameters"]["frozen_changed"] == 0
    assert report["generated"]["shape"] == report["generated"]["expected_shape"]
    # json.loads above accepted the whole stdout: nothing else (library prints, bars) reached it
    assert "rlhf training complete" not in proc.stdout and "policy_loss:" not in proc.stdout
    assert list(empty_dir.iterdir()) == []


def test_installed_console_script(empty_dir):
    exe = BIN / "tiny-rlhf-smoke"
    assert exe.exists(), "install the package first: pip install '.[test]'"
    proc, report = run_json([str(exe), "--device", "auto", "--train-smoke", "--json"], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]
    assert report["parameters"]["trainable_changed"] > 0 and report["parameters"]["frozen_changed"] == 0
    assert list(empty_dir.iterdir()) == []


def test_construct_only(smoke, capsys, monkeypatch, empty_dir):
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only")
    assert code == 0 and report["mode"] == "construct-only"
    assert report["timings_s"]["update"] is None and report["generated"] is None
    assert report["parameters"]["trainable_total"] > 0 and report["parameters"]["trainable_changed"] is None


@pytest.mark.parametrize("style", ["token-ids", "text", "file"])
def test_prompt_styles(smoke, capsys, monkeypatch, empty_dir, style):
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--prompt-style", style)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    prompts = report["prompts"]
    assert prompts["style"] == style and prompts["count"] >= 4
    if style != "token-ids":
        assert prompts["count"] == 12  # the shipped prompts file: a dozen prompts
        # 'file' reads the file through prompts_path: the library splits on '\n', so the file's
        # trailing newline arrives as one empty prompt, which the tokenizer drops
        assert prompts["dropped_empty"] == (1 if style == "file" else 0)


def test_prompts_file_is_utf8_with_non_ascii():
    text = (REPO / "sub-skills/policy-optimization/assets/first-run/prompts.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) == 12 and all(lines) and any(not line.isascii() for line in lines)
    assert text.endswith("\n")


def test_byte_tokenizer_pads_right_and_never_uses_pad_id(smoke):
    tok = byte_tokenizer.ByteTokenizer()
    ids = tok(["ab", "", "é"])
    assert ids.dtype.is_floating_point is False and tuple(ids.shape) == (2, 2)
    assert ids.tolist() == [[ord("a") + 1, ord("b") + 1], [0xC3 + 1, 0xA9 + 1]]
    assert tok.dropped_empty == 1


def test_forced_failed_check_exits_1(smoke, capsys, monkeypatch, empty_dir):
    # one rollout means one PPO optimizer step: AdoptAtan2 moves nothing on its first step
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--rollouts", "1")
    assert code == 1 and report["status"] == "failed"
    failed = {c["name"] for c in report["checks"] if not c["passed"]}
    assert {"actor_lora_changed", "optimizer_steps"} <= failed


def test_cuda_without_cuda_exits_2_with_one_line(smoke, capsys, monkeypatch, empty_dir):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no CUDA, on any machine
    code, out, err = main_in_process(smoke.main, capsys, monkeypatch, empty_dir, "--device", "cuda", "--json", prog=SMOKE)
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "CUDA is not available" in err and "--device cpu" in err
    # plain: the import's progress line comes first, the error is the last line
    code, out, err = main_in_process(smoke.main, capsys, monkeypatch, empty_dir, "--device", "cuda", prog=SMOKE)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and "CUDA is not available" in lines[-1]
    assert all(line.lstrip("\r").startswith("tiny-rlhf-smoke: import") for line in lines[:-1]), lines


@pytest.mark.parametrize("argv", [["--bogus"], ["--device", "tpu"], ["--device", "CPU"], ["--construct-only", "--train-smoke"],
                                  ["--trainer", "ppo", "--grpo-variant", "spo"], ["--rollouts", "0"],
                                  ["--rollouts", "100000000"], ["--seed", "-1"], ["--seed", "4294967296"],
                                  ["--cpu-threads", "100000"], ["--construct-only", "--rollouts", "3"],
                                  ["--trainer", "grpo", "--grpo-variant", ","]])
def test_usage_errors_are_one_line_exit_2_without_torch(empty_dir, argv):
    usage_error_without_torch(SMOKE, argv, empty_dir)


@pytest.mark.parametrize("argv, message", [
    (["--learn", "--verbose"], "--verbose applies to the train smoke, not --learn"),
    (["--learn", "--dist-timeout", "5"], "--dist-timeout applies to the train smoke, not --learn"),
    (["--dist-timeout", "5"], "--dist-timeout applies to --nproc runs or to the ranks a launcher started"),
    (["--dim", "1"], "--dim: must be between 2 and 8192, got 1"),  # one feature: LayerNorm outputs 0
    (["--eos-token", "3", "--new-tokens", "1", "--trainer", "tpo"], "--eos-token needs --new-tokens 2 or more"),
])
def test_options_that_cannot_work_are_refused_not_ignored(empty_dir, argv, message):
    """The QA's polish findings: an option a mode ignores, or a size or combination whose checks
    cannot pass, is a usage error (one line, exit 2, before torch), not a silent no-op or exit 1."""
    assert message in usage_error_without_torch(SMOKE, argv, empty_dir)


def test_eos_in_fixed_prompts_does_not_suggest_another_seed(smoke, capsys, monkeypatch, empty_dir):
    code, out, err = main_in_process(smoke.main, capsys, monkeypatch, empty_dir, "--prompt-style", "file",
                                     "--eos-token", "102", "--json", prog=SMOKE)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("choose another id (the prompts of --prompt-style file do not depend on --seed)")


def test_sigterm_exits_143_and_removes_the_private_dir(tmp_path, empty_dir):
    import signal
    import subprocess
    import time
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, str(SMOKE), "--rollouts", "1000", "--json"], cwd=empty_dir,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)  # SIGTERM at its default, whoever started pytest
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("palm-rlhf-skill-") for p in tmp.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the smoke never made its private dir"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and out == "" and err.strip().endswith("terminated"), err[-500:]
    assert not any(p.name.startswith("palm-rlhf-skill-") for p in tmp.iterdir())
    assert list(empty_dir.iterdir()) == []


@pytest.mark.parametrize("argv", [[], ["bogus"], ["--bogus"]])
def test_palm_rlhf_skill_usage_errors_are_one_line(empty_dir, argv):
    proc = run([str(BIN / "palm-rlhf-skill"), *argv], empty_dir)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("palm-rlhf-skill: error:")


def test_console_script_errors_name_the_command(empty_dir):
    proc = run([str(BIN / "tiny-rlhf-smoke"), "--seed", "x"], empty_dir)
    assert proc.returncode == 2 and proc.stderr.startswith("tiny-rlhf-smoke: error: argument --seed")


def test_help_does_not_import_torch(empty_dir):
    proc = run([sys.executable, "-X", "importtime", str(SMOKE), "--help"], empty_dir)
    assert proc.returncode == 0 and "--trainer" in proc.stdout and "exit codes" in proc.stdout
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_missing_library_exits_3(smoke, monkeypatch, capsys):
    monkeypatch.setattr(version_gate, "installed_version",
                        lambda dist: None if dist == "palm-rlhf-pytorch" else "9.9")
    assert runner.run_cli(smoke.main, ["--json"]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pip install 'palm-rlhf-pytorch>=0.8.0,<0.9'" in err


def test_untested_version_exits_3_unless_allowed(smoke, monkeypatch, capsys, empty_dir):
    real = version_gate.installed_version
    monkeypatch.setattr(version_gate, "installed_version",
                        lambda dist: "0.9.1" if dist == "palm-rlhf-pytorch" else real(dist))
    assert runner.run_cli(smoke.main, ["--construct-only"]) == 3
    assert "--allow-untested" in capsys.readouterr().err
    monkeypatch.chdir(empty_dir)
    assert runner.run_cli(smoke.main, ["--construct-only", "--json", "--allow-untested", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["warnings"] and "is outside >=0.8.0,<0.9" in report["warnings"][0]


def test_documented_exit_codes_and_range_match_runtime(smoke):
    doc = (REPO / "references/installation.md").read_text(encoding="utf-8")
    record = version_gate.load_api_record()
    assert f"`{record['supported']}`" in doc and record["tested_version"] in doc
    for code in (exits.EXIT_OK, exits.EXIT_CHECK_FAILED, exits.EXIT_USAGE, exits.EXIT_DEPENDENCY):
        assert f"| {code} |" in doc
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"palm-rlhf-pytorch{record["supported"]}"' in pyproject, "pyproject range != api_record.json"


@pytest.mark.parametrize("extra, failed_check", [
    ({"partition_function_hidden_dim": 768}, "update_ran"),      # library fails at the first update
    ({"no_such_argument": 1}, "trainer_constructed"),            # library rejects the constructor call
])
def test_library_failures_become_failed_checks(smoke, capsys, monkeypatch, empty_dir, extra, failed_check):
    monkeypatch.setitem(tiny_trainers.SMOKE_EXTRA, "flowrl", extra)
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--trainer", "flowrl")
    assert code == 1 and report["status"] == "failed"
    failed = [c for c in report["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == [failed_check], failed
    assert "\n" not in failed[0]["detail"] and "Error" in failed[0]["detail"]
    assert list(empty_dir.iterdir()) == []


def test_ci_runs_the_readme_test_command():
    import re
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    test_command = next(b for b in blocks if "pytest" in b)
    assert test_command in (REPO / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("content, message", [(b"", "no non-empty line"), (b"\n\n \n", "no non-empty line"),
                                              (b"\x9a\xff\x00", "prompts file unreadable")])
def test_damaged_prompts_file_is_a_one_line_exit_2(smoke, monkeypatch, tmp_path, empty_dir, capsys,
                                                   content, message):
    """A damaged shipped prompts file is an environment error (exit 2, one line), like a missing one,
    raised before any model is built; not a failed trainer_constructed check."""
    damaged = tmp_path / "prompts.txt"
    damaged.write_bytes(content)
    monkeypatch.setattr(smoke_prompts, "PROMPTS_FILE", damaged)
    monkeypatch.chdir(empty_dir)
    code = runner.run_cli(smoke.main, ["--prompt-style", "file", "--construct-only", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and message in err, err
    assert list(empty_dir.iterdir()) == []
