"""The run kit (palm-rlhf-skill train / watch): the metrics row, the watchdog on the broken and
healthy cases, the exported policy, the trackers, watch, and bad input through the command line
(references/training-run.md)."""
from __future__ import annotations

import json
import math
import os
import re
import sys

import pytest
import torch

from conftest import REPO, default_signals, main_in_process, one_error_line, run
from policy_optimization import trainers
from policy_optimization.run import cases, loop, metrics, watchdog
from run_kit import checkpoint, claiming, launch, lock, rundir, trackers, watch
from watch_run import LAYOUTS
from skill_runtime import exits, runner

SCRIPTS = REPO / "sub-skills" / "policy-optimization" / "scripts"
TRAIN, WATCH = SCRIPTS / "train_run.py", SCRIPTS / "watch_run.py"
RUN_DOC = REPO / "sub-skills" / "policy-optimization" / "references" / "training-run.md"
REPORTS = REPO / "references" / "run-reports.md"


def open_run(case, tmp_path, rounds=None, **options):
    config = cases.write(case, tmp_path / "config", rounds=rounds)
    options.setdefault("say", lambda line: None)
    return loop.Run.open(str(config), tmp_path / "run", "cpu", options=loop.Options(progress=False, **options))


def train(case, tmp_path, rounds=None, **options):
    """Train ``case`` in-process (``loop.train_to_end``); (Run, status)."""
    config = cases.write(case, tmp_path / "config", rounds=rounds)
    options.setdefault("say", lambda line: None)
    run_, status, _ = loop.train_to_end(str(config), tmp_path / "run", options=loop.Options(progress=False, **options))
    return run_, status


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """The healthy toy run, 8 rounds, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("healthy")
    return train(cases.HEALTHY, tmp, log_with="tensorboard" if trackers_available("tensorboard") else None)[0]


def trackers_available(name):
    try:
        trackers.check_available(name)
        return True
    except exits.SkillError:
        return False


# --- the metrics row -------------------------------------------------------------------------------

def documented_keys(heading: str) -> list[str]:
    text = REPORTS.read_text(encoding="utf-8")
    assert heading in text, f"references/run-reports.md: no heading {heading!r}"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, re.M)


def test_every_row_has_the_documented_keys(healthy):
    rows = rundir.read_rows(healthy.run.metrics)
    assert [r["round"] for r in rows] == list(range(9))
    assert all(list(r) == list(metrics.ROW_KEYS) for r in rows)
    assert documented_keys("## Metrics row") == list(metrics.ROW_KEYS), \
        "references/run-reports.md#metrics-row: one table row per key of policy_optimization/run/metrics.py ROW_KEYS, in order"


def test_a_real_row_has_real_numbers(healthy):
    rows = rundir.read_rows(healthy.run.metrics)
    first, last = rows[1], rows[-1]
    assert first["rollouts"] == 4 and first["group_size"] == 4 and first["learn_calls"] == 1
    assert 0 <= first["reward_min"] <= first["reward_mean"] <= first["reward_max"] <= 1
    assert first["zero_std_group_fraction"] is not None and 0 <= first["advantage_zero_fraction"] <= 1
    assert first["losses"]["policy_loss"] and all(math.isfinite(v) for v in first["losses"]["policy_loss"])
    assert first["optimizer_steps"] == {"actor": 4}  # 4 rollouts x group 4 / minibatch 4
    assert first["trainable_change_norm"]["actor_lora"] > 0 and first["grad_norm"] > 0
    assert first["kl_base"] is None  # actor_lora=False: no LoRA-off base to compare with
    assert first["entropy"] > 0 and first["response_length_mean"] > 1 and first["tokens_per_s"] > 0
    assert rows[0]["held_out_reward"] < last["held_out_reward"], "the healthy toy run learns"
    assert all(r["rules"] == [] for r in rows)


def test_kl_base_is_measured_for_a_lora_policy(tmp_path):
    run_, _ = train(cases.Case("lora", "grpo", None, "", overrides={"trainer": {"actor_lora": True}}), tmp_path, rounds=2)
    row = run_.rows[-1]
    assert row["kl_base"] is not None and row["kl_base"] > 0 and row["trainable_change_norm"]["actor_lora"] > 0


# --- the watchdog ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", cases.BROKEN, ids=lambda c: c.expect)
def test_each_broken_config_fires_its_own_rule(case, tmp_path):
    run_, _ = train(case, tmp_path, rounds=case.within)
    fired = {rule: row["round"] for row in reversed(run_.rows) for rule in row["rules"]}
    assert case.expect in fired, f"{case.name}: {case.expect} did not fire in {case.within} rounds; fired: {fired}"
    if case.expect == "non_finite":  # a NaN reward is written as run-reports.md's '## Metrics row' says: a bare NaN
        assert '"reward_mean": NaN' in run_.run.metrics.read_text() and '"first": NaN' in run_.run.summary.read_text()
        from doc_tables import section
        assert "the bare `NaN`" in " ".join(section(REPORTS, "## Metrics row").split()), \
            "references/run-reports.md under '## Metrics row'"


def test_rules_have_their_sections_and_are_documented():
    from skill_check import markdown  # the anchor reader of the link checks
    text = RUN_DOC.read_text(encoding="utf-8")
    for rule in watchdog.RULES:
        page, _, anchor = rule.section.partition("#")
        assert anchor in markdown.anchors(REPO / page), f"{rule.id}: {rule.section} has no such anchor"
        assert f"`{rule.id}`" in text, f"{RUN_DOC.name}: rule {rule.id} is not in the rules table"
    assert {c.expect for c in cases.BROKEN} == set(watchdog.RULE_IDS) - {"held_out_falling"}


def test_stop_on_checkpoints_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    case = next(c for c in cases.BROKEN if c.expect == "equal_rewards")
    config = cases.write(case, tmp_path / "config")
    code = runner.run_cli(train_main(), ["--config", str(config), "--run-dir", str(tmp_path / "run"), "--stop-on",
                                         "equal_rewards", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 1 and "STOPPED after round 2 (rule equal_rewards fired at round 2 (--stop-on))" in out
    assert "watchdog equal_rewards (round 2):" in err and "traps-rewards.md#equal-rewards-group" in err
    assert checkpoint.latest(rundir.RunDir(tmp_path / "run")).name == "round-000002"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["rules_fired"]["equal_rewards"] == [2]


def test_stop_on_refuses_an_unknown_rule(tmp_path):
    line = one_error_line(run([sys.executable, str(TRAIN), "--config", "x.toml", "--run-dir", "d",
                               "--stop-on", "nope"], tmp_path).stderr)
    assert "--stop-on: unknown rule nope; the rules are equal_rewards" in line


# --- the end of a run ---------------------------------------------------------------------------------

@pytest.mark.parametrize("lora", [True, False])
def test_policy_pt_is_a_standalone_palm_with_the_lora_merged(lora, tmp_path):
    from palm_rlhf_pytorch import PaLM
    run_, status = train(cases.Case("export", "grpo", None, "", overrides={"trainer": {"actor_lora": lora}}), tmp_path,
                         rounds=2)
    assert status == "finished" and run_.run.policy.is_file()
    palm = PaLM(**run_.resolved["palm"])
    palm.load(run_.run.policy)
    assert not palm.finetune_modules
    policy, scope = trainers.actor_palm("grpo", run_.trainer), trainers.actor_scope("grpo", run_.trainer)
    x = torch.randint(1, 257, (2, 6))
    with torch.no_grad():
        expected, got = policy.eval()(x, finetune_scope=scope), palm.eval()(x)
    assert torch.allclose(expected, got, atol=1e-5), float((expected - got).abs().max())
    assert scope is None or scope in policy.finetune_modules  # the trainer keeps its own scope: it can train on


def test_save_state_tie_is_restored_on_load(tmp_path):
    run_, _ = train(cases.Case("tie", "ppo", None, ""), tmp_path, rounds=1)
    fresh = open_run(cases.Case("tie", "ppo", None, ""), tmp_path / "again")
    checkpoint.load(fresh.trainer, checkpoint.latest(run_.run), run_.run_id, "ppo", fresh.rotary_cap())  # its own id
    for palm in (trainers.actor_palm("ppo", fresh.trainer), trainers.unwrap(fresh.trainer, fresh.trainer.actor_critic).critic):
        assert palm.to_logits.weight is palm.token_emb.weight
    saved = trainers.actor_palm("ppo", run_.trainer).token_emb.weight
    assert torch.equal(trainers.actor_palm("ppo", fresh.trainer).token_emb.weight, saved)


def test_tensorboard_event_file_reads_back(healthy):
    if not trackers_available("tensorboard"):
        pytest.skip("tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = list(healthy.run.trackers.rglob("events.out.tfevents.*"))
    assert events, f"no event file under {healthy.run.trackers}"
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    rewards = accumulator.Scalars("reward_mean")
    rows = rundir.read_rows(healthy.run.metrics)
    assert [e.step for e in rewards] == list(range(1, 9))
    assert accumulator.Scalars("held_out_reward")[0].step == 0  # the baseline before training
    assert [round(e.value, 5) for e in rewards] == [round(r["reward_mean"], 5) for r in rows[1:]]
    assert "losses/policy_loss" in accumulator.Tags()["scalars"]


def test_tracker_values_are_flat_finite_numbers():
    row = {"round": 3, "rules": ["x"], "a": 1, "b": None, "c": float("nan"), "d": {"e": 2.0, "f": None},
           "g": [1.0, 3.0], "h": True}
    assert trackers.scalars(row) == {"a": 1.0, "d/e": 2.0, "g": 2.0, "h": 1.0}


# --- watch --------------------------------------------------------------------------------------------

def test_watch_shows_the_rows_curves_and_verdict(healthy, tmp_path):
    data = watch.view(healthy.run.path, LAYOUTS, last=3)
    assert data["state"] == "finished" and data["rounds"] == 8 and len(data["last_rows"]) == 3
    text = watch.text(data, LAYOUTS)
    assert text.splitlines()[-1].startswith("watch: FINISHED after round 8; held-out ")
    assert text.splitlines()[-1].endswith("; next: " + data["summary"]["next"])  # the next step train gave
    flat = {**data, "summary": {**data["summary"], "next": "read training-run.md#held-out-flat"}}
    assert watch.verdict(flat, LAYOUTS).endswith("; next: read training-run.md#held-out-flat")
    assert "held-out ▁" in text or re.search(r"held-out [▁-█ ]+ ", text)
    proc = run([sys.executable, str(WATCH), str(healthy.run.path), "--json"], tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["rounds"] == 8
    assert not any(line.rstrip().endswith("| torch") for line in run(
        [sys.executable, "-X", "importtime", str(WATCH), str(healthy.run.path)], tmp_path).stderr.splitlines())


def test_watch_plot_draws_a_png(healthy, tmp_path):
    pytest.importorskip("matplotlib")
    path = watch.plot(watch.view(healthy.run.path, LAYOUTS), tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_watch_plot_on_a_fresh_machine_builds_the_font_cache_and_draws(healthy, tmp_path):
    """Issue 39: a machine with no matplotlib font cache yet (an empty MPLCONFIGDIR): the first
    ``watch --plot`` scans the fonts (matplotlib runs ``fc-list``), writes the cache and draws."""
    pytest.importorskip("matplotlib")
    cache = tmp_path / "mplconfig"
    cache.mkdir()
    proc = run([sys.executable, str(WATCH), str(healthy.run.path), "--plot", "curves.png"], tmp_path,
               env={"MPLCONFIGDIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(cache.glob("fontlist-*.json")), sorted(p.name for p in cache.iterdir())  # the scan ran here


@pytest.mark.parametrize("target", ["missing/curves.png", "curves.unknown-format"])
def test_watch_plot_to_a_bad_path_is_one_line(healthy, tmp_path, target):
    pytest.importorskip("matplotlib")
    with pytest.raises(exits.SkillError) as err:
        watch.plot(watch.view(healthy.run.path, LAYOUTS), tmp_path / target)
    assert err.value.exit_code == 2 and "cannot write the plot" in str(err.value) and "\n" not in str(err.value)


def test_watch_plot_without_matplotlib_says_how_to_install(healthy, tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('blocked for the test')\n")
    proc = run([sys.executable, str(WATCH), str(healthy.run.path), "--plot", str(tmp_path / "x.png")], tmp_path,
               env={"PYTHONPATH": str(blocker)})
    assert proc.returncode == 3 and one_error_line(proc.stderr).endswith(watch.PLOT_INSTALL)


def test_watch_of_a_run_before_its_first_row_says_it_is_starting(tmp_path):
    held = lock.RunLock.acquire(rundir.RunDir(tmp_path), "--run-dir x")  # train holds it from before its first row
    with pytest.raises(exits.SkillError, match=r": a train is starting there \(train.lock, no metrics.jsonl "):
        watch.view(tmp_path, LAYOUTS)
    held.release()
    (tmp_path / rundir.LOCK).write_text("pid 1 on host\n")  # left by a start that died (os._exit): nobody holds it
    with pytest.raises(exits.SkillError, match=r": a train started there and ended before its first row "):
        watch.view(tmp_path, LAYOUTS)


def test_watch_of_a_folder_without_a_run_is_one_line(tmp_path):
    proc = run([sys.executable, str(WATCH), str(tmp_path)], tmp_path)
    assert proc.returncode == 2 and "no metrics.jsonl there" in one_error_line(proc.stderr)


# --- bad input through the command line -----------------------------------------------------------------

def error_line(err: str) -> str:
    """The one error line of a run that failed after its progress lines began (a round, an
    evaluation): progress lines above it, never a traceback."""
    errors = [line for line in err.strip().splitlines() if " error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    return errors[0]


def train_main():
    import train_run
    return train_run.main


def cli(tmp_path, capsys, *argv):
    code = runner.run_cli(train_main(), [*argv, "--device", "cpu"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, says", [
    ([], "give --config FILE and --run-dir DIR (a new run), or --resume DIR"),
    (["--resume", "a", "--force"], "--force starts over and --resume continues"),
    (["--resume", "a", "--run-dir", "b"], "--resume DIR is the run directory"),
])
def test_usage_errors_answer_without_torch(argv, says, tmp_path):
    proc = run([sys.executable, "-X", "importtime", str(TRAIN), *argv], tmp_path)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], errors
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_a_run_dir_holding_another_run_is_refused_unless_resume_or_force(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = cases.write(cases.Case("x", "grpo", None, "", rounds=1), tmp_path / "config")
    assert cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run")[0] == 0
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run")
    assert code == 2 and "holds another run (metrics.jsonl, checkpoints, policy.pt, summary.json)" in one_error_line(err)
    (tmp_path / "run" / "mine.txt").write_text("keep me")
    code, out, _ = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run", "--force")
    assert code == 0 and (tmp_path / "run" / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "run"]  # nothing else in the caller's directory


def test_config_from_standard_input_trains_and_resumes_without_it(tmp_path, monkeypatch, capsys):
    """`train --config -` read tmp/x/- (FileNotFoundError, exit 2) though workflows.md#plan-a-run
    documents `-` for plan and train alike: now standard input, read once, its paths relative to
    the current directory; the run keeps the config, so --resume needs no standard input."""
    import io
    config = cases.write(cases.Case("stdin", "grpo", None, "", rounds=1), tmp_path / "config")
    monkeypatch.chdir(tmp_path / "config")  # the config's relative paths (prompts.txt, reward.py, ...)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(config.read_bytes())))
    code, out, err = cli(tmp_path, capsys, "--config", "-", "--run-dir", str(tmp_path / "run"), "--json")
    assert code == 0 and json.loads(out)["status"] == "finished", err[-2000:]
    stored = json.loads((tmp_path / "run" / rundir.CONFIG).read_text())["config"]
    assert stored["reward"]["program"] == f"{tmp_path / 'config' / 'reward.py'}:score"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))  # nothing more to read
    code, out, err = cli(tmp_path, capsys, "--resume", str(tmp_path / "run"))
    assert code == 0 and "finished all 1 rounds: nothing to resume" in err, err[-2000:]
    code, _, err = cli(tmp_path, capsys, "--config", "-", "--run-dir", str(tmp_path / "run2"), "--nproc", "2")
    assert code == 2 and "--config - (standard input) is read by one process" in one_error_line(err)
    assert not (tmp_path / "run2").exists()


@pytest.mark.parametrize("reward, says", [
    ("import torch\n\ndef score(x, r):\n    return torch.zeros(x.shape)\n", "returned shape"),
    ("def score(x, r):\n    return 1 / 0\n", "ZeroDivisionError"),
])
def test_a_failing_reward_program_is_one_line_and_keeps_what_finished(reward, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = cases.write(cases.Case("bad", "grpo", None, "", reward=reward, rounds=2), tmp_path / "config")
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run")
    line = error_line(err)
    assert code == 2 and "reward program reward.py:score" in line and says in line, line
    assert "the held-out evaluation after round 0" in line or "round 1" in line
    rows = rundir.read_rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["round"] for r in rows] in ([], [0])  # what finished is kept


@pytest.mark.parametrize("section, key, value, says", [
    ("reward", "program", "missing.py:score", "no such file"),
    ("reward", "program", "reward.py:nothing", "nothing"),
    ("trainer", "no_such_argument", 1, "not an argument of the installed"),
    ("run", "rounds", 0, "[run] rounds: must be at least 1"),
])
def test_config_errors_are_one_line_exit_2(section, key, value, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = cases.write(cases.Case("bad", "grpo", None, "", overrides={section: {key: value}}), tmp_path / "config")
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "runs/run")
    assert code == 2 and says in one_error_line(err)
    assert not (tmp_path / "runs").exists(), "a refused run left its directory behind"


def test_a_nan_reward_in_grpo_names_the_cause(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nan = next(c for c in cases.CASES if c.name == "NaN reward")
    config = cases.write(cases.Case("NaN reward, GRPO", "grpo", None, "", reward=nan.reward), tmp_path / "config")
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run")
    line = err.strip().splitlines()[-1]  # after the progress lines
    assert code == 1 and "Traceback" not in err, err
    # every reward NaN (the first rollout's group), then safe_div's bare assert (grpo.py:204)
    assert re.search(r"round 1: the reward model gave (\d+) of \1 sequences a non-finite reward \(NaN or inf\), "
                     r"and the library then raised AssertionError \(no message\); read \S+training-run\.md#non-finite-rewards$",
                     line), line


def test_resume_of_no_run_leaves_no_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(tmp_path, capsys, "--resume", "runs/nothere")
    assert code == 2 and "no run to resume there" in one_error_line(err)
    assert not (tmp_path / "runs").exists(), "--resume of nothing created the directory"


def test_an_unwritable_run_dir_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    config = cases.write(cases.HEALTHY, tmp_path / "config")
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", str(tmp_path / "file"))
    assert code == 2 and "is a file, not a directory" in one_error_line(err)


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = cases.write(cases.Case("disk", "grpo", None, "", overrides={"run": {"checkpoint_every": 1}}, rounds=3),
                         tmp_path / "config")
    real, calls = checkpoint.save, []

    def full_on_second(trainer, run_dir, round_, state):
        calls.append(round_)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(trainer, run_dir, round_, state)

    monkeypatch.setattr(checkpoint, "save", full_on_second)
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run")
    line = error_line(err)
    assert code == 2 and "checkpoint after round 2 failed (OSError: [Errno 28] No space left on device)" in line
    assert "the checkpoint of round 1 is kept" in line
    run_dir = rundir.RunDir(tmp_path / "run")
    assert checkpoint.latest(run_dir).name == "round-000001"
    assert [r["round"] for r in rundir.read_rows(run_dir.metrics)] == [0, 1, 2]
    monkeypatch.setattr(checkpoint, "save", real)
    code, out, _ = cli(tmp_path, capsys, "--resume", "run")
    assert code == 0 and [r["round"] for r in rundir.read_rows(run_dir.metrics)] == [0, 1, 2, 3]


@pytest.mark.parametrize("signum, code", [(2, 130), (15, 143)])
def test_a_signal_finishes_the_round_checkpoints_and_exits_128_plus(signum, code, tmp_path):
    """SIGINT/SIGTERM from outside (the child's dispositions set to default, so the test also holds
    when pytest itself runs in the background with SIGINT ignored)."""
    import subprocess
    import time
    config = cases.write(cases.Case("sig", "grpo", None, "", rounds=50), tmp_path / "config")
    proc = subprocess.Popen([sys.executable, str(TRAIN), "--config", str(config), "--run-dir", str(tmp_path / "run"),
                             "--device", "cpu", "--cpu-threads", "1"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    metrics_file = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics_file.is_file() or len(metrics_file.read_text().splitlines()) < 3):
        time.sleep(0.2)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    done = summary["rounds_done"]
    assert summary["status"] == "interrupted" and 2 <= done < 50
    assert checkpoint.latest(rundir.RunDir(tmp_path / "run")).name == f"round-{done:06d}"
    assert "finishing the round in progress" in err and "Traceback" not in err
    assert f"--resume {tmp_path / 'run'}" in out.splitlines()[-1]



def run_files(path):
    """Every file under ``path`` and its bytes."""
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def test_a_second_train_on_a_live_run_is_refused_and_changes_nothing(tmp_path, monkeypatch, capsys):
    """Two trains on one run directory (issue: a --resume beside a live run rolled metrics.jsonl back
    under it, rows lost): while a train process holds DIR (stopped with SIGSTOP, so its files stay
    still), a new run there, --force and --resume each exit 2 with one line naming DIR and the
    holder's pid, and change no byte; watch still reads the live run. The holder SIGKILLed leaves
    no stale lock: --resume continues from its last checkpoint, every round once."""
    import signal
    import subprocess
    import time
    monkeypatch.chdir(tmp_path)
    config = cases.write(cases.Case("lock", "grpo", None, "", overrides={"run": {"checkpoint_every": 1}}, rounds=50),
                         tmp_path / "config")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(TRAIN), "--config", str(config), "--run-dir", str(run_dir),
                             "--device", "cpu", "--cpu-threads", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=default_signals)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None and checkpoint.latest(rundir.RunDir(run_dir)) is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        assert proc.poll() is None and checkpoint.latest(rundir.RunDir(run_dir)) is not None
        before = run_files(run_dir)
        for argv in (["--resume", "run", "--until", "1"], ["--config", str(config), "--run-dir", "run"],
                     ["--config", str(config), "--run-dir", "run", "--force"]):
            code, out, err = cli(tmp_path, capsys, *argv)
            line = one_error_line(err)
            assert code == 2 and f"another train is running in {run_dir} (pid {proc.pid} on " in line, (argv, line)
            assert run_files(run_dir) == before, f"{argv} changed the live run's files"
        assert watch.view(run_dir, LAYOUTS)["state"] == "running"
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert (run_dir / rundir.LOCK).is_file()  # a stale file, not a stale lock
    done = int(checkpoint.latest(rundir.RunDir(run_dir)).name.split("-")[1])
    code, out, err = cli(tmp_path, capsys, "--resume", "run", "--until", str(done + 1))
    assert code == 0, err[-2000:]
    assert [r["round"] for r in rundir.read_rows(run_dir / "metrics.jsonl")] == list(range(done + 2))
    assert not (run_dir / rundir.LOCK).exists()


def test_only_the_writing_rank_locks_the_run_directory(tmp_path, monkeypatch, capsys):
    """Under a launcher's world rank 0 writes the files (Run.main) and alone takes the lock; another
    rank neither locks nor does --force's removal, so a rank of a refused world changes nothing."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    held = lock.RunLock.acquire(rundir.RunDir(run_dir), "--run-dir run")  # another train's lock
    code, _, err = main_in_process(train_main(), capsys, monkeypatch, tmp_path,  # --nproc's launcher refuses it
                                   "--resume", "run", "--nproc", "2", "--device", "cpu")  # before it starts a rank
    assert code == 2 and f"--resume run: another train is running in {run_dir} (pid {os.getpid()} " in \
        one_error_line(err)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for rank, writer in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert launch.writes_files() is writer
    assert "LOCAL_RANK" not in os.environ  # a question, not a launch: the environment stays as it was
    monkeypatch.setenv("RANK", "1")
    assert claiming.prepare(run_dir, False, True, writer=launch.writes_files())[1] is None
    assert (run_dir / "metrics.jsonl").is_file(), "a rank that does not write removed a run file"
    with pytest.raises(exits.SkillError, match=f"another train is running in {run_dir} \\(pid {os.getpid()} on "):
        claiming.prepare(run_dir, False, True, writer=True)
    held.release()
    run_, taken = claiming.prepare(run_dir, False, True, writer=True)
    assert not (run_dir / "metrics.jsonl").exists() and (run_dir / rundir.LOCK).is_file()
    taken.release()
    assert sorted(p.name for p in run_dir.iterdir()) == []


def test_without_fcntl_there_is_no_lock_and_train_says_so(tmp_path, monkeypatch):
    """Where Python has no fcntl (Windows) no lock is taken (RunLock), nothing pretends one is, and
    loop.prepare says so in one line."""
    monkeypatch.setattr(lock, "fcntl", None)
    run_, taken = claiming.prepare(tmp_path / "run", False, False)
    assert taken is None and list(run_.path.iterdir()) == []
    said = []
    with pytest.raises(exits.SkillError, match="no non-empty line"):
        loop.prepare(str(cases.write(cases.Case("x", "grpo", None, "", prompts=("",)), tmp_path / "config")),
                     tmp_path / "run2", False, False, None, loop.Options(progress=False, say=said.append))
    assert said == [f"no lock on {tmp_path / 'run2'}: this Python has no fcntl (Windows): run one train per directory"]
    assert not (tmp_path / "run2").exists()


@pytest.mark.parametrize("broken", ["blank prompts", "empty held-out", "prompts not UTF-8", "cuda without CUDA"])
def test_a_refused_start_leaves_no_run_directory(broken, tmp_path, monkeypatch, capsys):
    """A start refused while the trainer is built (after the run directory was made) removes the
    directories it created, and leaves a directory that existed before as it was."""
    monkeypatch.chdir(tmp_path)
    config = cases.write(cases.HEALTHY, tmp_path / "config")
    device = "cpu"
    if broken == "blank prompts":
        (tmp_path / "config" / "prompts.txt").write_text(" \n\t\n\n", encoding="utf-8")
    elif broken == "empty held-out":
        (tmp_path / "config" / "held_out.txt").write_text("", encoding="utf-8")
    elif broken == "prompts not UTF-8":
        (tmp_path / "config" / "prompts.txt").write_bytes(b"ab\n\xff\xfe\n")
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        device = "cuda"
    for run_dir in ("runs/new/run", "existing"):
        if run_dir == "existing":
            (tmp_path / "existing").mkdir()
            (tmp_path / "existing" / "mine.txt").write_text("keep me")
        code, _, err = main_in_process(train_main(), capsys, monkeypatch, tmp_path,
                                       "--config", str(config), "--run-dir", run_dir, "--device", device)
        line = one_error_line(err)
        assert code == 2 and (broken.split()[-1] in line or "no non-empty line" in line or "cannot read" in line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "existing"], "a refused start left its directory"
    assert [p.name for p in (tmp_path / "existing").iterdir()] == ["mine.txt"]


# --- the docs ------------------------------------------------------------------------------------------

def measured_rows(name: str) -> list[list[str]]:
    text = RUN_DOC.read_text(encoding="utf-8")
    block = text.split(f"<!-- BEGIN MEASURED {name} -->\n", 1)[1].split(f"<!-- END MEASURED {name} -->", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def test_the_measured_watchdog_table_is_the_cases():
    rows = measured_rows("watchdog")
    assert [(r[0], r[1], r[2].strip("`")) for r in rows] == [(c.name, c.trainer, c.expect or "(none)") for c in cases.CASES], \
        "training-run.md#watchdog-rules: rerun calibrate_watchdog.py --markdown (the cases changed)"
    for row, case in zip(rows, cases.CASES):
        if case.expect:
            assert f"caught by round {case.within}" in row[4], (case.name, row)


def test_the_measured_first_run_table_is_the_variants():
    import calibrate_first_run
    rows = measured_rows("first-run")
    assert [r[0] for r in rows] == list(calibrate_first_run.VARIANTS), \
        "training-run.md#first-run: rerun calibrate_first_run.py --markdown (the variants changed)"
    assert rows[0][3] == "3/3", "the first run's example rose on every seed"


def test_the_measured_longer_run_table_is_the_variants():
    """training-run.md#longer-runs: one row per LONGER variant, and the learned reward model's rows
    carry the gold metric (the preferences example's [eval] text_metric), rising."""
    import calibrate_first_run
    rows = measured_rows("longer-runs")
    assert [r[0] for r in rows] == list(calibrate_first_run.LONGER), \
        "training-run.md#longer-runs: rerun calibrate_first_run.py --longer --markdown (the variants changed)"
    for row, (config, *_) in zip(rows, calibrate_first_run.LONGER.values()):
        assert (row[3] == "-") == (config == "first-run"), row
        if config == "preferences":
            before, last = (float(x) for x in row[3].split(" -> "))
            assert last > before, row


PRINTING_REWARD = cases.ASCII + '''
from pathlib import Path

ascii_score = score


def score(x, response_mask):                       # the ASCII reward, saying so on every call
    with Path(__file__).with_name("calls.txt").open("a") as calls:
        calls.write("call\\n")
    print(f"DEBUG reward of {x.shape[0]} sequences")
    return ascii_score(x, response_mask)
'''


@pytest.fixture(scope="module")
def printing_run(tmp_path_factory):
    """``train --json`` (in-process, as run_cli runs it) of 2 GRPO rounds whose reward program prints
    on every call, held-out evaluations included: (exit code, stdout, stderr, run dir, calls)."""
    import contextlib
    import io
    tmp = tmp_path_factory.mktemp("printing")
    config = cases.write(cases.Case("printing", "grpo", None, "", reward=PRINTING_REWARD, rounds=2), tmp / "config")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = runner.run_cli(train_main(), ["--config", str(config), "--run-dir", str(tmp / "run"), "--json",
                                             "--device", "cpu"])
    calls = (tmp / "config" / "calls.txt").read_text().count("call\n")
    return code, out.getvalue(), err.getvalue(), tmp / "run", calls


def test_a_printing_reward_keeps_stdout_one_json_object_and_prints_on_stderr(printing_run):
    """A reward that calls print() put its held-out evaluations' lines before the JSON, and its
    training rounds' lines nowhere: now stdout is the report alone, and every print (a round's and
    an evaluation's) is on stderr, as training-run.md#your-prints says."""
    code, out, err, run_dir, calls = printing_run
    assert code == 0, err[-2000:]
    report = json.loads(out)  # the whole of stdout: one JSON object
    assert report["status"] == "finished" and len(report["held_out"]["rounds"]) == 3
    printed = [line for line in err.splitlines() if line.startswith("DEBUG reward of ")]
    assert calls > 3 and len(printed) == calls, (calls, err[-2000:])  # 3 evaluations, and the rounds' calls
    section = RUN_DOC.read_text(encoding="utf-8").split('<a id="your-prints"></a>', 1)[1].split("\n\n", 1)[0]
    assert "stderr" in section and "stdout" in section and "--json" in section, section


def summary_table() -> dict[str, set[str]]:
    """run-reports.md ``## train summary``: each key to its JSON types (a cell of n keys and n
    comma-separated types pairs them; one type applies to every key of its cell)."""
    from doc_tables import table
    documented = {}
    for keys, types, _ in table(REPORTS, "## train summary"):
        names, kinds = re.findall(r"`([a-z_]+)`", keys), [t.strip() for t in types.split(",")]
        for name, kind in zip(names, kinds if len(kinds) == len(names) else kinds * len(names)):
            documented[name] = {t.strip() for t in kind.split(" or ")}
    return documented


def test_the_summary_keys_are_documented(printing_run):
    """run-reports.md's train summary against both copies: ``train --json`` and summary.json held
    other keys (versions and warnings were stdout only)."""
    from doc_tables import JSON_TYPES
    _, out, _, run_dir, _ = printing_run
    documented = summary_table()
    for where, summary in (("train --json", json.loads(out)),
                           ("summary.json", json.loads((run_dir / "summary.json").read_text()))):
        assert set(summary) == set(documented), (where, sorted(set(summary) ^ set(documented)))
        for key, value in summary.items():
            assert JSON_TYPES[type(value)] in documented[key], (where, key, value, documented[key])


def test_the_first_run_runs_as_typed_and_watch_shows_it_rising(tmp_path, monkeypatch, capsys):
    """The doc's block line by line: the `train` line through the console script's ``main`` in-process
    (the run, not the process, is what is checked: the signal tests run train_run.py as a process),
    every other line (the torch-free `watch`) as the installed console script, as typed."""
    from conftest import BIN
    from palm_rlhf_skill import cli as skill_cli
    text = RUN_DOC.read_text(encoding="utf-8").split('<a id="first-run"></a>', 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    (tmp_path / "sub-skills").symlink_to(REPO / "sub-skills")  # the skill root, as a clone has it
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run_script names the program in sys.argv
    monkeypatch.setattr(sys, "path", list(sys.path))  # palm_rlhf_skill.runtime puts the installed tree first
    outputs = []
    for line in block.strip().splitlines():
        program, _, rest = line.partition(" ")
        assert (BIN / program).is_file(), line
        if rest.split()[0] == "train":
            assert program == "palm-rlhf-skill", line
            code = skill_cli.main(rest.split())
            out, err = capsys.readouterr()
        else:
            proc = run([str(BIN / program), *rest.split()], tmp_path, timeout=600)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        assert code == 0, (line, err[-2000:])
        outputs.append(out)
    assert "FINISHED: 15 rounds, held-out reward" in outputs[0]
    held = [r["held_out_reward"] for r in rundir.read_rows(tmp_path / "runs" / "first" / "metrics.jsonl")
            if r["held_out_reward"] is not None]
    assert held[-1] > held[0] + 0.3, held
    assert outputs[1].splitlines()[-1].startswith("watch: FINISHED after round 15; held-out ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "sub-skills"]


@pytest.mark.distributed
def test_nproc_2_trains_and_resumes_to_the_same_rows(tmp_path, monkeypatch, capsys):
    """train --nproc 2 (torchrun, gloo on the CPU): rank 0 writes the files, both ranks' rollouts are
    in the rows, and an interrupted run resumed under --nproc 2 ends with the rows and policy of
    the uninterrupted one (training-run.md#several-processes)."""
    config = cases.write(cases.Case("nproc", "grpo", None, "", rounds=2), tmp_path / "config")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def train_cli(*argv):  # the launcher in-process; torchrun and its two ranks are processes
        code = runner.run_cli(train_main(), [*argv, "--nproc", "2", "--device", "cpu", "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err[-2000:]
        return json.loads(out)

    whole = train_cli("--config", str(config), "--run-dir", str(tmp_path / "whole"))
    assert whole["status"] == "finished" and whole["processes"] == 2 and whole["rollouts"] == 2 * 2 * 4
    assert train_cli("--config", str(config), "--run-dir", str(tmp_path / "split"), "--until", "1")["status"] == "paused"
    assert train_cli("--resume", str(tmp_path / "split"))["status"] == "finished"
    strip = lambda rows: [{k: v for k, v in r.items() if k not in {"wall_s", "tokens_per_s", "peak_mib", "rss_mib"}} for r in rows]
    assert strip(rundir.read_rows(tmp_path / "split" / "metrics.jsonl")) == strip(rundir.read_rows(tmp_path / "whole" / "metrics.jsonl"))
    a, b = torch.load(tmp_path / "whole" / "policy.pt"), torch.load(tmp_path / "split" / "policy.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_reward_program_that_fails_to_import_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    case = cases.Case("syntax", "grpo", None, "", reward="def score(x, r):\n    return (\n")
    config = cases.write(case, tmp_path / "config")
    code, _, err = cli(tmp_path, capsys, "--config", str(config), "--run-dir", "run")
    line = one_error_line(err)
    assert code == 2 and "reward.py" in line and "SyntaxError" in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
