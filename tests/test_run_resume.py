"""The run kit's checkpoints: N rounds, an interruption, a resume and N more rounds end with the same
weights, optimizer state and metrics rows as 2N rounds, bitwise, for every trainer
(references/training-run.md#checkpoints)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from policy_optimization.run import cases, loop
from run_kit import checkpoint, rundir
from skill_runtime import exits

TIMING = {"wall_s", "tokens_per_s", "peak_mib", "rss_mib"}  # measured, not computed: differ run to run


def write_config(folder, name="grpo", rounds=4, **overrides):
    """The watchdog's healthy toy run (policy_optimization/run/cases.py) for ``name``, ``overrides``
    replacing keys of its tables."""
    return cases.write(cases.Case("test", name, None, "", overrides=overrides, rounds=rounds), folder)


def train(config, run_dir, until=None, resume=False, said=None):
    """Open a run, train it up to ``until``, finish it; (trainer state, status)."""
    options = loop.Options(until=until, progress=False, say=(said.append if said is not None else lambda line: None))
    run, status, _ = loop.train_to_end(str(config) if config else None, run_dir, options=options, resume=resume)
    state = {k: v.detach().clone() for k, v in run.trainer.state_dict().items()}
    optim = {k: opt.state_dict() for k, opt in (("actor", run.trainer.actor_optim),)}
    return state, optim, status


def rows_without_timing(path):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rundir.read_rows(path)]


def assert_same_state(a, b):
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ after resume, e.g. {differ[:3]}"


@pytest.mark.parametrize("name", ["ppo", "grpo", "tpo", "flowrl"])
def test_resume_is_bitwise_the_uninterrupted_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # TPO's replay buffer folder
    config = write_config(tmp_path / "cfg", name, rounds=4)
    whole, whole_optim, status = train(config, tmp_path / "whole")
    assert status == "finished"
    _, _, paused = train(config, tmp_path / "split", until=2)
    assert paused == "paused" and checkpoint.latest(rundir.RunDir(tmp_path / "split")).name == "round-000002"
    resumed, resumed_optim, status = train(None, tmp_path / "split", resume=True)
    assert status == "finished"
    assert_same_state(whole, resumed)
    for key in whole_optim:
        a, b = whole_optim[key]["state"], resumed_optim[key]["state"]
        assert all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i] if torch.is_tensor(a[i][k])), key
    assert rows_without_timing(tmp_path / "split" / "metrics.jsonl") == rows_without_timing(tmp_path / "whole" / "metrics.jsonl")
    assert [r["round"] for r in rundir.read_rows(tmp_path / "split" / "metrics.jsonl")] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("name", ["ppo", "grpo", "tpo", "flowrl"])
def test_resume_is_bitwise_within_the_cached_sampler(name, tmp_path, monkeypatch):
    """[run] sampler = "cached" (scripts/cached_sampler.py), rollouts ending at eos at different
    lengths: resumed, the run ends bitwise where the uninterrupted one does."""
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", name, rounds=4, run={"sampler": "cached"}, train={"eos_token": ord("e") + 1})
    whole, _, status = train(config, tmp_path / "whole")
    assert status == "finished"
    train(config, tmp_path / "split", until=2)
    resumed, _, status = train(None, tmp_path / "split", resume=True)
    assert status == "finished"
    assert_same_state(whole, resumed)
    rows = rows_without_timing(tmp_path / "split" / "metrics.jsonl")
    assert rows == rows_without_timing(tmp_path / "whole" / "metrics.jsonl")
    assert any(row["response_length_mean"] % 1 for row in rows[1:])  # responses of different lengths: eos


def test_rows_after_the_last_checkpoint_are_replaced_not_doubled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", "grpo", rounds=4, run={"checkpoint_every": 2})
    train(config, tmp_path / "whole")
    train(config, tmp_path / "split", until=3)  # checkpoints after rounds 2 and 3, rows 0-3
    shutil.rmtree(tmp_path / "split" / "checkpoints" / "round-000003")  # as if killed before round 3's checkpoint
    train(None, tmp_path / "split", resume=True)
    assert [r["round"] for r in rundir.read_rows(tmp_path / "split" / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert rows_without_timing(tmp_path / "split" / "metrics.jsonl") == rows_without_timing(tmp_path / "whole" / "metrics.jsonl")


def test_a_partial_checkpoint_folder_is_not_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", "grpo", rounds=3)
    train(config, tmp_path / "run", until=2)
    run = rundir.RunDir(tmp_path / "run")
    broken = run.checkpoints / "round-000003"
    shutil.copytree(run.checkpoints / "round-000002", broken)
    (broken / checkpoint.STATE_FILE).unlink()  # killed mid-checkpoint: no run_state.json
    assert checkpoint.latest(run).name == "round-000002"


def test_resume_with_a_changed_config_names_the_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", "grpo", rounds=3)
    train(config, tmp_path / "run", until=1)
    changed = write_config(tmp_path / "cfg", "grpo", rounds=5, trainer={"actor_lr": 1e-3}, train={"max_seq_len": 9})
    with pytest.raises(exits.SkillError) as err:
        loop.Run.open(str(changed), tmp_path / "run", "cpu", resume=True, options=loop.Options(progress=False))
    assert err.value.exit_code == 2
    assert "train.max_seq_len, trainer.actor_lr" in str(err.value) and "run.rounds" not in str(err.value)
    (tmp_path / "cfg" / "reward.py").write_text((tmp_path / "cfg" / "reward.py").read_text() + "\n# edited\n")
    with pytest.raises(exits.SkillError, match=r"reward\.program \(file contents\)"):
        loop.Run.open(None, tmp_path / "run", "cpu", resume=True, options=loop.Options(progress=False))


def test_resume_set_extends_the_run_and_refuses_other_keys(tmp_path, monkeypatch):
    """``--resume DIR --set run.rounds=N`` (no --config) goes on to round N with the stored config;
    a --set of any other key exits 2 naming it, before anything is built."""
    monkeypatch.chdir(tmp_path)
    train(write_config(tmp_path / "cfg", "grpo", rounds=2), tmp_path / "run")
    with pytest.raises(exits.SkillError, match=r"--set trainer\.actor_lr: a resume may change only run\.rounds") as err:
        loop.Run.open(None, tmp_path / "run", "cpu", resume=True, overrides=["trainer.actor_lr=1e-3"],
                      options=loop.Options(progress=False))
    assert err.value.exit_code == 2
    run, status, _ = loop.train_to_end(None, tmp_path / "run", overrides=["run.rounds=3"], resume=True)
    assert status == "finished" and [r["round"] for r in rundir.read_rows(tmp_path / "run" / "metrics.jsonl")][-1] == 3
    assert json.loads((tmp_path / "run" / rundir.CONFIG).read_text())["config"]["run"]["rounds"] == 3


def test_train_resume_of_a_reward_models_run_names_the_command_that_continues_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(write_config(tmp_path / "cfg", "grpo", rounds=1), tmp_path / "run")
    stored = json.loads((tmp_path / "run" / rundir.CONFIG).read_text())
    (tmp_path / "run" / rundir.CONFIG).write_text(json.dumps({**stored, "kind": "reward"}))  # as train-reward writes it
    with pytest.raises(exits.SkillError, match=r"is a reward model's run \(palm-rlhf-skill train-reward --resume"):
        loop.Run.open(None, tmp_path / "run", "cpu", resume=True, options=loop.Options(progress=False))


def test_a_renamed_file_is_one_changed_key():
    """A key naming another file is that key once, not again as its file contents."""
    stored = {"config": {"reward": {"program": "a.py:f"}, "run": {"rounds": 3}}, "files": {"reward.program": "1"}}
    renamed = {"config": {"reward": {"program": "b.py:f"}, "run": {"rounds": 5}}, "files": {"reward.program": "2"}}
    edited = {"config": stored["config"], "files": {"reward.program": "2"}}
    assert rundir.changed_keys(stored, renamed, loop.GROWABLE) == ["reward.program"]
    assert rundir.changed_keys(stored, edited, loop.GROWABLE) == ["reward.program (file contents)"]


def test_config_json_and_summary_are_plain_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(write_config(tmp_path / "cfg", "grpo", rounds=1), tmp_path / "run")
    stored = json.loads((tmp_path / "run" / rundir.CONFIG).read_text())
    assert stored["config"]["reward"]["program"].endswith("reward.py:score") and "reward.program" in stored["files"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds_done"] == 1


def test_resuming_a_finished_run_builds_nothing_and_shows_its_summary(tmp_path, monkeypatch, capsys):
    """A finished run's --resume used to rebuild the trainer and print "rounds 2-1: 0/0"; it prints
    the stored summary and exits 0 without building. A config with more rounds still extends it."""
    import train_run
    from skill_runtime import runner
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", "grpo", rounds=1, run={"checkpoint_every": 1})
    train(config, tmp_path / "run")
    stored = json.loads((tmp_path / "run" / "summary.json").read_text())
    real_build = loop.Run.build
    monkeypatch.setattr(loop.Run, "build", classmethod(lambda cls, *a, **k: pytest.fail("a finished run was rebuilt")))
    assert runner.run_cli(train_run.main, ["--resume", str(tmp_path / "run"), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "nothing to resume" in err and out.rstrip().endswith(f"{stored['verdict']}; next: {stored['next']}")
    assert runner.run_cli(train_run.main, ["--resume", str(tmp_path / "run"), "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {k: report[k] for k in stored} == stored
    monkeypatch.setattr(loop.Run, "build", real_build)
    extended = write_config(tmp_path / "cfg", "grpo", rounds=2, run={"checkpoint_every": 1})
    assert runner.run_cli(train_run.main, ["--resume", str(tmp_path / "run"), "--config", str(extended),
                                           "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rounds_done"] == 2


def test_a_run_paused_before_its_first_evaluation_names_the_baseline(tmp_path, monkeypatch):
    """--until 1 with [eval] every 2: round 0 was scored, round 1 not; the verdict gives round 0's
    held-out reward (it used to say "no held-out evaluation")."""
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", "grpo", rounds=4, eval={"every": 2})
    assert train(config, tmp_path / "run", until=1)[2] == "paused"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["held_out"]["rounds"] == [0] and summary["held_out"]["after"] is None
    assert f"held-out reward {summary['held_out']['before']:.4g} before training, not evaluated since" in summary["verdict"]


@pytest.mark.parametrize("how", ["cp -r", "mv"])
def test_a_copied_or_moved_run_prints_only_its_own_paths(how, tmp_path, monkeypatch, capsys):
    """A finished run copied with cp -r (or moved) and resumed printed the original's paths (next:
    load ORIGINAL/policy.pt, its curves command). It prints the directory given now, rewrites its
    summary.json so, and keeps its run id; a paused copy goes on writing only its own paths."""
    import train_run
    from skill_runtime import runner
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "cfg", "grpo", rounds=2, run={"checkpoint_every": 1})
    original, moved = tmp_path / "original-run", tmp_path / "elsewhere"
    train(config, original)
    run_id = json.loads((original / "run_config.json").read_text())["run_id"]
    (shutil.copytree if how == "cp -r" else shutil.move)(original, moved)
    for flags in ([], ["--json"]):
        assert runner.run_cli(train_run.main, ["--resume", str(moved), "--device", "cpu", *flags]) == 0
        out, err = capsys.readouterr()
        assert str(original) not in out + err and f"load {moved}/policy.pt" in out
    assert str(original) not in (moved / "summary.json").read_text() and str(moved) in (moved / "summary.json").read_text()
    assert json.loads((moved / "run_config.json").read_text())["run_id"] == run_id
    paused, copy = tmp_path / "paused", tmp_path / "paused-copy"
    train(config, paused, until=1)
    shutil.copytree(paused, copy)
    said: list[str] = []
    train(None, copy, resume=True, said=said)
    assert str(paused) + "/" not in "\n".join(said) + (copy / "summary.json").read_text()


def test_a_moved_reward_models_run_prints_its_own_paths(tmp_path, monkeypatch, capsys):
    import train_reward
    from skill_runtime import runner
    import probe_kit
    from reward_modeling import reward_run
    monkeypatch.chdir(tmp_path)
    example = rundir.Path(__file__).resolve().parents[1] / "sub-skills" / "reward-modeling" / "assets" / "preferences"
    tiny = [f"palm.{k}={v}" for k, v in probe_kit.TINY_PALM.items() if k != "num_tokens"] + ["train.epochs=1"]
    reward_run.train_to_end(str(example / "rm.toml"), tmp_path / "rm", "cpu", tiny)
    shutil.move(tmp_path / "rm", tmp_path / "rm-moved")
    assert runner.run_cli(train_reward.main, ["--resume", str(tmp_path / "rm-moved"), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'rm'}/" not in out + err and f'checkpoint = "{tmp_path / "rm-moved"}/rm.pt"' in out
