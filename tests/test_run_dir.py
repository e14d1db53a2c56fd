"""A run directory is untrusted input (issue 31): what train and watch do when a file of it is
missing, damaged, another run's or hostile, faults on the way (a full disk, a reward program that
exits), and what a user sees. Every case: one line on stderr, its documented exit code, no row or
checkpoint lost (sub-skills/policy-optimization/references/run-directory.md)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO, main_in_process, one_error_line, run
from policy_optimization import builder, reward_programs
from policy_optimization.plan import prediction
from policy_optimization.run import cases, loop, metrics
from run_kit import checkpoint, lock, rundir, watch
from watch_run import LAYOUTS
from skill_runtime import byte_tokenizer, exits, reporting

SCRIPTS = REPO / "sub-skills" / "policy-optimization" / "scripts"
TRAIN = SCRIPTS / "train_run.py"
RUN_DOC = REPO / "sub-skills" / "policy-optimization" / "references" / "run-directory.md"
TRAINING_RUN = REPO / "sub-skills" / "policy-optimization" / "references" / "training-run.md"
TIMING = {"wall_s", "tokens_per_s", "peak_mib", "rss_mib"}  # measured, not computed: differ run to run
ESC = "\x1b]0;pwned\x07\x1b[2J"  # retitles a terminal window, then erases it


def train_main():
    import train_run
    return train_run.main


def watch_main():
    import watch_run
    return watch_run.main


def cli(capsys, monkeypatch, cwd, *argv):
    """``palm-rlhf-skill train *argv --device cpu`` in-process as its process runs it: (code, out, err)."""
    return main_in_process(train_main(), capsys, monkeypatch, cwd, *argv, "--device", "cpu")


def watch_cli(capsys, monkeypatch, cwd, *argv):
    return main_in_process(watch_main(), capsys, monkeypatch, cwd, *argv)


def config(folder, rounds=3, reward=cases.ASCII, **overrides):
    """The watchdog's healthy GRPO toy run in ``folder``, a checkpoint after every round."""
    overrides = {"run": {"checkpoint_every": 1}, **overrides}
    return cases.write(cases.Case("run dir", "grpo", None, "", overrides=overrides, reward=reward, rounds=rounds), folder)


def error_line(err: str) -> str:
    """The one error line of a run refused or failed after its progress lines began (the build of
    the trainer, a round): progress lines above it, never a traceback."""
    errors = [line for line in err.strip().splitlines() if " error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    return errors[0]


def rows(path):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rundir.read_rows(path)]


def files(path):
    """Every file under ``path`` and its bytes (what a refusal must leave as it was)."""
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A GRPO toy run paused after round 2 of 3 (checkpoints 1 and 2), and the same run
    uninterrupted: (paused dir, finished dir). Its config's paths are absolute: a copy resumes."""
    tmp = tmp_path_factory.mktemp("runs")
    path = config(tmp / "config")
    quiet = dict(progress=False, say=lambda line: None)
    loop.train_to_end(str(path), tmp / "paused", options=loop.Options(until=2, **quiet))
    loop.train_to_end(str(path), tmp / "whole", options=loop.Options(**quiet))
    return tmp / "paused", tmp / "whole"


@pytest.fixture
def paused(runs, tmp_path):
    """A fresh copy of the paused run."""
    shutil.copytree(runs[0], tmp_path / "run", symlinks=True)
    return tmp_path / "run"


@pytest.fixture
def finished(runs, tmp_path):
    """A fresh copy of the finished run."""
    shutil.copytree(runs[1], tmp_path / "whole", symlinks=True)
    return tmp_path / "whole"


def as_an_older_version_wrote_it(folder):
    """A checkpoint as an older version wrote it: run_state.json without the manifest of its files."""
    state = json.loads((folder / checkpoint.STATE_FILE).read_text())
    del state["files"]
    (folder / checkpoint.STATE_FILE).write_text(json.dumps(state))


def resume(capsys, monkeypatch, run_dir, *argv):
    return cli(capsys, monkeypatch, run_dir.parent, "--resume", str(run_dir), *argv)


def refused_resume(capsys, monkeypatch, run_dir, unchanged=True) -> str:
    """``train --resume run_dir``, which must exit 2 with nothing on stdout, one error line and
    (``unchanged``) every file of the run directory as it was; the line."""
    before = files(run_dir)
    code, out, err = resume(capsys, monkeypatch, run_dir)
    line = error_line(err)
    assert code == 2 and out == "", err[-2000:]
    if unchanged:
        assert files(run_dir) == before, "a refused resume changed the run directory"
    return line


# --- security -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["symlink", "hard link", "named pipe"])
@pytest.mark.parametrize("start", ["new run", "resume"])
def test_a_train_lock_that_is_not_trains_own_is_refused_untouched(kind, start, paused, tmp_path, capsys, monkeypatch):
    """``ln -s ~/precious DIR/train.lock`` then train: the lock was opened following the link and
    truncated and written before any check, even when the start was then refused (exit 2), so
    ~/precious held "pid ... since ...". Now it is opened without following a link and written
    only once locked and found to be a plain file with one name: refused, the target as it was."""
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    run_dir = paused if start == "resume" else tmp_path / "new"
    run_dir.mkdir(exist_ok=True)
    lock_file = run_dir / rundir.LOCK
    {"symlink": lambda: lock_file.symlink_to(precious), "hard link": lambda: os.link(precious, lock_file),
     "named pipe": lambda: os.mkfifo(lock_file)}[kind]()
    before = files(run_dir)
    argv = ["--resume", str(run_dir)] if start == "resume" else ["--config", str(config(tmp_path / "cfg")),
                                                                  "--run-dir", str(run_dir)]
    code, out, err = cli(capsys, monkeypatch, tmp_path, *argv)
    line = one_error_line(err)
    assert code == 2 and out == "" and "train.lock" in line, line
    assert re.search(r"symbolic link|2 names|not a plain file", line), line
    assert precious.read_text() == "keep me\n" and files(run_dir) == before


def test_strings_from_a_run_directory_are_escaped(finished, tmp_path, capsys, monkeypatch):
    """watch and train --resume of a finished run printed summary.json's and metrics.jsonl's
    strings raw: an escape sequence there retitled the window and erased lines. Every line goes
    through reporting.terminal_text; the JSON reports escape them anyway (json.dumps)."""
    assert reporting.terminal_text(ESC) == "\\x1b]0;pwned\\x07\\x1b[2J"
    assert reporting.terminal_text("héllo 日本") == "héllo 日本"  # printable text as it is
    summary = json.loads((finished / rundir.SUMMARY).read_text())
    summary.update(trainer=ESC, device=ESC, verdict=f"FINISHED {ESC}", next=ESC, reason=None)
    (finished / rundir.SUMMARY).write_text(json.dumps(summary))
    lines = (finished / rundir.METRICS).read_text().splitlines()
    last = json.loads(lines[-1])
    last["rules"] = [ESC]
    (finished / rundir.METRICS).write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")
    code, out, err = watch_cli(capsys, monkeypatch, tmp_path, str(finished))
    assert code == 0 and "\x1b" not in out + err and "\\x1b]0;pwned" in out, out
    code, out, err = resume(capsys, monkeypatch, finished)
    assert code == 0 and "nothing to resume" in err and "\x1b" not in out + err and "\\x1b[2J" in out, out
    cfg = config(tmp_path / "cfg", rounds=1, reward=f"def score(x, r):\n    raise ValueError({ESC!r})\n")
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(cfg), "--run-dir", "new")
    assert code == 2 and "\x1b" not in err and "\\x1b]0;pwned" in err, err


@pytest.mark.slow  # starts a process: not in the quick tier
def test_help_and_docs_say_that_a_resume_runs_the_configs_programs(tmp_path):
    proc = run([sys.executable, str(TRAIN), "--help"], tmp_path)
    assert proc.returncode == 0 and "runs the code the run directory's config names" in " ".join(proc.stdout.split())
    section = RUN_DOC.read_text().split('<a id="resume-runs-code"></a>', 1)[1].split("\n## ", 2)[1]
    assert "imports and calls them" in section and "trust" in section
    assert "run-directory.md#resume-runs-code" in TRAINING_RUN.read_text()


# --- exactness ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["damaged", "another checkpoint's", "missing", "damaged, no manifest"])
def test_random_states_that_cannot_be_restored_refuse_the_resume(kind, paused, capsys, monkeypatch):
    """A damaged or foreign random_states_0.pkl was skipped without a word (Accelerate logs "Could
    not load random states" and goes on): exit 0, and the resumed run differed. Now: exit 2 and one
    line, the run directory unchanged; --allow-inexact-resume goes on and says so (a line, and
    summary.json's warnings). "no manifest": a checkpoint of an older version, caught after
    loading by comparing the restored states with the file."""
    newest = paused / "checkpoints" / "round-000002"
    rng = newest / "random_states_0.pkl"
    if kind == "another checkpoint's":
        shutil.copy(paused / "checkpoints" / "round-000001" / "random_states_0.pkl", rng)
    elif kind == "missing":
        rng.unlink()
    else:
        rng.write_bytes(b"not a pickle")
    if kind.endswith("no manifest"):
        as_an_older_version_wrote_it(newest)
    line = refused_resume(capsys, monkeypatch, paused)
    assert "random_states_0.pkl" in line and "--allow-inexact-resume" in line, line
    code, out, err = resume(capsys, monkeypatch, paused, "--allow-inexact-resume", "--json")
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["status"] == "finished" and any("without its random states" in w for w in report["warnings"])
    assert "without its random states" in err


@pytest.mark.parametrize("damage", ["cut short", "an empty object", "gone", "a row of another run"])
def test_the_last_rows_are_restored_from_the_checkpoint(damage, paused, runs, capsys, monkeypatch):
    """A last metrics row cut by a crash (rows are not fsynced; the checkpoint of its round is):
    the resume kept the rows below it and went on, round 2 lost for good; a `{}` row gave a
    traceback. The checkpoint carries its rows: the resume restores them, one line says so, and
    the run ends with the uninterrupted run's rows."""
    lines = (paused / rundir.METRICS).read_bytes().splitlines(keepends=True)
    last = {"cut short": lines[-1][:25], "an empty object": b"{}\n", "gone": b"",
            "a row of another run": json.dumps({**json.loads(lines[-1]), "reward_mean": 0.123}).encode() + b"\n"}
    (paused / rundir.METRICS).write_bytes(b"".join(lines[:-1]) + last[damage])
    code, _, err = resume(capsys, monkeypatch, paused)
    assert code == 0 and "rows 2-2 restored from the checkpoint of round 2" in err, err[-2000:]
    assert rows(paused / rundir.METRICS) == rows(runs[1] / rundir.METRICS)


def test_rows_the_checkpoint_cannot_restore_refuse_the_resume(paused, capsys, monkeypatch):
    """Rows before the newest checkpoint's own that are not the ones it saw (edited, another run's):
    exit 2 and one line; the file stays as it was."""
    lines = (paused / rundir.METRICS).read_text().splitlines()
    edited = {**json.loads(lines[1]), "reward_mean": 0.5}
    (paused / rundir.METRICS).write_text("\n".join([lines[0], json.dumps(edited), *lines[2:]]) + "\n")
    line = refused_resume(capsys, monkeypatch, paused)
    assert "rows 0-1 are missing, edited or another run's" in line and "--force" in line, line


def test_what_a_kill_left_is_removed_at_the_next_start(paused, tmp_path, capsys, monkeypatch):
    """A kill during the pruning of old checkpoints left half-deleted folders (no run_state.json)
    that nothing removed; a kill during a write left temporary files. The next start removes them
    (one line), never what a link points to."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("keep me")
    folder = paused / "checkpoints"
    for name in ("round-000000", ".round-000003.partial", ".round-000001.removing"):
        (folder / name).mkdir()
        (folder / name / "model.safetensors").write_bytes(b"x" * 100)
    (folder / "round-000009").symlink_to(elsewhere)
    (paused / ".metrics.jsonl.abc123").write_text("half")
    code, _, err = resume(capsys, monkeypatch, paused)
    assert code == 0, err[-2000:]
    assert "removed what an interrupted run left" in err and ".metrics.jsonl.abc123" in err
    assert sorted(p.name for p in folder.iterdir()) == ["round-000002", "round-000003"]
    assert (elsewhere / "mine.txt").read_text() == "keep me"
    assert [r["round"] for r in rundir.read_rows(paused / rundir.METRICS)] == [0, 1, 2, 3]


def test_a_prune_cut_short_leaves_no_half_checkpoint_under_its_name(paused, monkeypatch):
    """Pruning renames a checkpoint out of the way before deleting it: a kill in the middle of the
    deletion leaves ``.round-N.removing``, never a ``round-N`` folder without its files."""
    old = paused / "checkpoints" / "round-000001"
    real = shutil.rmtree

    def killed(path, *args, **kwargs):
        if str(path).endswith(".removing") and os.path.isdir(path):
            os.unlink(os.path.join(path, checkpoint.STATE_FILE))  # part of it deleted, then the kill
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.remove(old)
    assert not old.exists() and (old.parent / ".round-000001.removing").is_dir()
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real)
    assert checkpoint.remove_leftovers(rundir.RunDir(paused)) == [".round-000001.removing"]
    assert [p.name for p in checkpoint.checkpoints(rundir.RunDir(paused))] == ["round-000002"]


def test_a_checkpoint_of_another_run_is_refused(paused, runs, capsys, monkeypatch):
    newest = paused / "checkpoints" / "round-000002"
    shutil.rmtree(newest)
    shutil.copytree(runs[1] / "checkpoints" / "round-000002", newest)  # the same config, another run
    line = refused_resume(capsys, monkeypatch, paused)
    assert "it belongs to another run (run id " in line and "round-000001" in line, line


# --- faults ------------------------------------------------------------------------------------------------

def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """safetensors raises SafetensorError on a full disk, not OSError: it was a traceback and exit
    1. Now exit 2 with "free space, then resume", the previous checkpoint and every row kept (the
    writer fails as safetensors does: the message measured on a full tmpfs)."""
    from accelerate.utils import other
    from safetensors import SafetensorError
    real = other.safe_save_file

    def full(tensors, filename, *args, **kwargs):
        if ".round-000002." in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(other, "safe_save_file", full)
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(config(tmp_path / "cfg")), "--run-dir", "run")
    line = [line for line in err.splitlines() if " error: " in line]
    assert code == 2 and len(line) == 1 and "Traceback" not in err, err[-2000:]
    assert "checkpoint after round 2 failed (SafetensorError: " in line[0] and "free space in" in line[0], line
    run_dir = rundir.RunDir(tmp_path / "run")
    assert [p.name for p in run_dir.checkpoints.iterdir()] == ["round-000001"]
    assert [r["round"] for r in rundir.read_rows(run_dir.metrics)] == [0, 1, 2]
    monkeypatch.setattr(other, "safe_save_file", real)
    code, _, err = resume(capsys, monkeypatch, run_dir.path)
    assert code == 0 and [r["round"] for r in rundir.read_rows(run_dir.metrics)] == [0, 1, 2, 3], err[-2000:]


def test_a_full_disk_while_exporting_the_policy_is_one_line_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """torch.save raises RuntimeError from its zip writer on a full disk (measured: "[enforce fail
    at inline_container.cc:672] . unexpected pos 576 vs 534"): exit 2, summary.json says failed,
    and a resume writes the policy."""
    real = torch.save

    def full(obj, f, *args, **kwargs):
        if os.path.basename(str(f)).startswith(f".{rundir.POLICY}."):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(config(tmp_path / "cfg", rounds=1)), "--run-dir", "run")
    line = [line for line in err.splitlines() if " error: " in line]
    assert code == 2 and len(line) == 1 and "free space there, then resume" in line[0], err[-2000:]
    assert json.loads((tmp_path / "run" / rundir.SUMMARY).read_text())["status"] == "failed"
    assert not (tmp_path / "run" / rundir.POLICY).exists() and not list((tmp_path / "run").glob(".policy.pt.*"))
    monkeypatch.setattr(torch, "save", real)
    code, _, err = resume(capsys, monkeypatch, tmp_path / "run")
    assert code == 0 and (tmp_path / "run" / rundir.POLICY).is_file(), err[-2000:]


TMPFS_RUN = """
set -u
mount -t tmpfs -o size=512k tmpfs "$1" || exit 77
"$2" "$3" --config "$4" --run-dir "$1/run" --device cpu --cpu-threads 1 2>"$1/err1"; echo "first $?"
grep ' error: ' "$1/err1"
mount -o remount,size=64m "$1"
"$2" "$3" --resume "$1/run" --device cpu --cpu-threads 1 --json >/dev/null 2>"$1/err2"; echo "resume $?"
"$2" -c "import json, sys; print('rounds', [json.loads(l)['round'] for l in open(sys.argv[1])])" "$1/run/metrics.jsonl"
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.slow  # starts a process: not in the quick tier
def test_a_real_full_disk_in_a_small_tmpfs(tmp_path):
    """The issue's reproducer for real (it used 2 MiB and the first run's 1.6 MB checkpoints),
    where a user namespace may mount a tmpfs (unshare -rm): a 512 KiB tmpfs holds one checkpoint of
    this run (about 310 KB) and fills during the second; exit 2 with one line; after the space
    grows, --resume finishes with every round once. Skipped where namespaces are not allowed."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    script = tmp_path / "full.sh"
    script.write_text(TMPFS_RUN)
    cfg = config(tmp_path / "cfg")
    proc = run(["unshare", "-rm", "sh", str(script), str(mount), sys.executable, str(TRAIN), str(cfg)], tmp_path,
               timeout=600)
    if proc.returncode == 77 or "first" not in proc.stdout:
        pytest.skip(f"no tmpfs in a user namespace here: {proc.stderr.strip()[-200:]}")
    out = proc.stdout
    assert "first 2" in out and "checkpoint after round 2 failed (" in out and "free space in" in out, out + proc.stderr
    assert len([line for line in out.splitlines() if " error: " in line]) == 1, out  # one line, whichever writer failed
    assert "resume 0" in out and "rounds [0, 1, 2, 3]" in out, out + proc.stderr


@pytest.mark.parametrize("damage", ["model.safetensors cut short", "optimizer.bin replaced",
                                    "model.safetensors cut short, no manifest"])
def test_a_damaged_checkpoint_file_is_one_line(damage, paused, capsys, monkeypatch):
    newest = paused / "checkpoints" / "round-000002"
    name = damage.split()[0]
    if "cut short" in damage:
        data = (newest / name).read_bytes()
        (newest / name).write_bytes(data[: len(data) // 2])
    else:
        (newest / name).write_bytes(b"\x80\x04not an optimizer state")
    if damage.endswith("no manifest"):
        as_an_older_version_wrote_it(newest)
    line = refused_resume(capsys, monkeypatch, paused)
    assert "round-000002" in line and "to resume from round-000001" in line, line
    assert (name in line) if "manifest" not in damage else "cannot be loaded (" in line, line


@pytest.mark.parametrize("text", ['{"config": 5}', "[1]", "not json", '{"config": {"palm": 5}, "files": {}}'])
def test_a_damaged_run_config_is_one_line(text, paused, capsys, monkeypatch):
    (paused / rundir.CONFIG).write_text(text)
    code, _, err = resume(capsys, monkeypatch, paused)
    line = one_error_line(err)
    assert code == 2 and str(paused / rundir.CONFIG) in line, line


def test_a_users_config_json_is_never_touched_and_old_runs_still_resume(paused, tmp_path, capsys, monkeypatch):
    """train wrote DIR/config.json, which clashed with a user's own config.json (issue 30): the
    run's file is run_config.json now; a run directory of an older version (config.json) resumes."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(config(tmp_path / "cfg", rounds=1)),
                       "--run-dir", str(mine))
    assert code == 0 and (mine / "config.json").read_text() == '{"my": "settings"}', err[-2000:]
    assert json.loads((mine / rundir.CONFIG).read_text())["config"]["run"]["rounds"] == 1
    (paused / rundir.CONFIG).rename(paused / rundir.OLD_CONFIG)  # as an older version wrote it
    code, _, err = resume(capsys, monkeypatch, paused)
    assert code == 0 and [r["round"] for r in rundir.read_rows(paused / rundir.METRICS)] == [0, 1, 2, 3], err[-2000:]


@pytest.mark.parametrize("row", ["[1, 2]", "{}", '{"round": "x"}', '{"round": 1e308}',
                                 '{"round": 9, "reward_mean": "high"}', '{"round": 9, "rules": "all"}',
                                 '{"round": 1}'])
def test_watch_of_rows_of_the_wrong_shape_is_one_line(row, finished, tmp_path, capsys, monkeypatch):
    with open(finished / rundir.METRICS, "a") as stream:
        stream.write(row + "\n")
    code, out, err = watch_cli(capsys, monkeypatch, tmp_path, str(finished))
    line = one_error_line(err)
    assert code == 2 and out == "" and "metrics.jsonl: line 5 " in line, line


def test_watch_and_resume_refuse_a_metrics_file_that_is_a_link(paused, tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "elsewhere.jsonl"
    shutil.move(paused / rundir.METRICS, elsewhere)
    (paused / rundir.METRICS).symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    for main, argv in ((watch_main(), [str(paused)]), (train_main(), ["--resume", str(paused), "--device", "cpu"])):
        code, _, err = main_in_process(main, capsys, monkeypatch, tmp_path, *argv)
        assert code == 2 and "symbolic link" in one_error_line(err), err
    assert elsewhere.read_bytes() == before


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "sys.exit(3)", "sys.exit('bye')"])
def test_a_reward_program_that_exits_is_the_programs_error(exit_call, tmp_path, capsys, monkeypatch):
    """sys.exit(0) in a reward program ended train with exit 0, no report, no summary, no policy;
    sys.exit(3) with the exit code of a missing dependency, silently: exit 2 and one line naming
    the program."""
    cfg = config(tmp_path / "cfg", rounds=1, reward=f"import sys\n\ndef score(x, r):\n    {exit_call}\n")
    code, out, err = cli(capsys, monkeypatch, tmp_path, "--config", str(cfg), "--run-dir", "run")
    line = [line for line in err.splitlines() if " error: " in line]
    assert code == 2 and out == "" and len(line) == 1 and "Traceback" not in err, err[-2000:]
    assert f"reward program reward.py:score called {exit_call}" in line[0], line


@pytest.mark.slow  # starts a process: not in the quick tier
def test_a_start_killed_before_its_first_row_does_not_block_the_next(tmp_path, capsys, monkeypatch):
    """os._exit in the reward during the round-0 evaluation leaves run_config.json and train.lock
    and no row: watch says the start died, --resume has nothing to resume, a new start runs."""
    cfg = config(tmp_path / "cfg", rounds=1, reward="import os\n\ndef score(x, r):\n    os._exit(0)\n")
    proc = run([sys.executable, str(TRAIN), "--config", str(cfg), "--run-dir", "run", "--device", "cpu",
                "--cpu-threads", "1"], tmp_path)
    run_dir = tmp_path / "run"
    assert proc.returncode == 0 and sorted(p.name for p in run_dir.iterdir()) == [rundir.CONFIG, rundir.LOCK]
    code, _, err = watch_cli(capsys, monkeypatch, tmp_path, "run")
    assert code == 2 and "a train started there and ended before its first row" in one_error_line(err)
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--resume", "run")
    assert code == 2 and "no run to resume there" in one_error_line(err)
    (tmp_path / "cfg" / "reward.py").write_text(textwrap.dedent(cases.ASCII))
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(cfg), "--run-dir", "run")
    assert code == 0 and [r["round"] for r in rundir.read_rows(run_dir / rundir.METRICS)] == [0, 1], err[-2000:]


def test_a_meta_tensor_from_the_reward_is_the_programs_fault(tmp_path, capsys, monkeypatch):
    reward = "import torch\n\ndef score(x, r):\n    return torch.empty(x.shape[0], device='meta')\n"
    cfg = config(tmp_path / "cfg", rounds=1, reward=reward)
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(cfg), "--run-dir", "run")
    line = [line for line in err.splitlines() if " error: " in line]
    assert code == 2 and len(line) == 1, err[-2000:]
    assert "reward program reward.py:score returned a tensor on the meta device" in line[0], line


# --- what a user sees ---------------------------------------------------------------------------------------

def test_watch_tells_a_killed_run_from_a_running_one(paused, tmp_path, capsys, monkeypatch):
    (paused / rundir.SUMMARY).unlink()  # killed: no summary, and train.lock left behind, held by nobody
    (paused / rundir.LOCK).write_text("pid 1 on host, since then\n")
    assert watch.view(paused, LAYOUTS)["state"] == "killed"
    code, out, _ = watch_cli(capsys, monkeypatch, tmp_path, str(paused))
    last = out.splitlines()[-1]
    assert code == 0 and last.startswith("watch: KILLED after round 2") and f"--resume {paused}" in last, last
    held = lock.RunLock.acquire(rundir.RunDir(paused), "--resume x")
    try:
        assert watch.view(paused, LAYOUTS)["state"] == "running" and lock.RunLock.held(rundir.RunDir(paused)) is True
    finally:
        held.release()


def test_watch_calls_an_until_pause_paused_and_says_go_on(paused, tmp_path, capsys, monkeypatch):
    """A run ended by --until is PAUSED in watch as in train's own line, not STOPPED with a fix to find."""
    assert watch.view(paused, LAYOUTS)["state"] == "paused"
    code, out, _ = watch_cli(capsys, monkeypatch, tmp_path, str(paused))
    last = out.splitlines()[-1]
    assert code == 0 and last.startswith("watch: PAUSED after round 2") and f"go on: palm-rlhf-skill train --resume {paused}" in last, last


def test_watch_says_which_rows_it_shows_and_where_it_plotted(finished, tmp_path, capsys, monkeypatch):
    code, out, _ = watch_cli(capsys, monkeypatch, tmp_path, str(finished), "--last", "2")
    assert code == 0 and "rows 2-3, the last 2 of 4 (--last N shows more)" in out.splitlines()[0], out
    code, out, _ = watch_cli(capsys, monkeypatch, tmp_path, str(finished))
    assert code == 0 and out.splitlines()[0].endswith("rows 0-3"), out
    pytest.importorskip("matplotlib")
    code, out, _ = watch_cli(capsys, monkeypatch, tmp_path, str(finished), "--plot", "curves.png")
    assert code == 0 and f"plot: {tmp_path / 'curves.png'}" in out.splitlines()
    assert "--plot" not in out.splitlines()[-1] and (tmp_path / "curves.png").is_file(), out


def test_the_first_run_folder_copied_for_your_own_run_runs(tmp_path, capsys, monkeypatch):
    """training-run.md: copy the folder for your own run; its config named ../prompts.txt, outside
    it, so the copy failed (exit 2). The folder is self-contained."""
    shutil.copytree(REPO / "sub-skills" / "policy-optimization" / "assets" / "first-run", tmp_path / "mine")
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", "mine/run.toml", "--run-dir", "run",
                       "--set", "run.rounds=1", "--set", "eval.every=1")
    assert code == 0, err[-2000:]
    assert "copy the folder" in TRAINING_RUN.read_text()


def test_what_a_text_program_receives_as_response():
    """training-run.md: a text_program's response is every id sampled after the prompt, through the
    first eos_token (included), decoded by the run's tokenizer; the byte tokenizer drops id 0 and
    ids above 256, makes bytes that are not UTF-8 U+FFFD, keeps control bytes."""
    from rule_reward import RuleReward
    seen = []

    def text_program(prompt, response):
        seen.append((prompt, response))
        return 1.0

    tok, eos = byte_tokenizer.ByteTokenizer(), ord("z") + 1
    ids = [ord("a") + 1, ord("b") + 1, ord("c") + 1, 0, 0xFF + 1, 0x1B + 1, 300, eos, ord("q") + 1]
    x = torch.tensor([ids])
    prompt_mask = torch.arange(len(ids))[None] < 2
    mask = torch.nn.functional.pad((x == eos).cumsum(dim=-1) == 0, (1, -1), value=True)  # as the trainers mask
    reward = RuleReward(reward_programs.TextScore(text_program, "t.py:f", tok.decode))
    assert reward(x, mask=mask, prompt_mask=prompt_mask).tolist() == [1.0]
    assert seen == [("ab", "c\ufffd\x1bz")]
    text = " ".join(TRAINING_RUN.read_text().split())
    assert "through the first `eos_token`, included, when set) decoded by the run's tokenizer" in text
    assert "drops id 0 and ids above 256, makes non-UTF-8 bytes U+FFFD, keeps control bytes" in text


def test_resume_keeps_the_cpu_threads_the_run_started_with(tmp_path, capsys, monkeypatch):
    from skill_runtime import placement
    cfg = config(tmp_path / "cfg")
    code, out, err = cli(capsys, monkeypatch, tmp_path, "--config", str(cfg), "--run-dir", "run", "--cpu-threads",
                         "1", "--until", "1", "--json")
    assert code == 0, err[-2000:]
    assert json.loads(out)["next"].endswith(f"--resume {tmp_path / 'run'} --cpu-threads 1")
    assert json.loads((tmp_path / "run" / rundir.CONFIG).read_text())["options"] == {"cpu_threads": "1"}
    asked, real = [], placement.torch_threads
    monkeypatch.setattr(placement, "torch_threads", lambda n: (asked.append(n), real(n))[1])
    code, out, err = cli(capsys, monkeypatch, tmp_path, "--resume", "run", "--until", "2")
    assert code == 0 and asked == [1], err[-2000:]  # the resumed run's torch threads: the run's own
    assert out.splitlines()[-1].endswith(f"--resume {tmp_path / 'run'} --cpu-threads 1"), out


def test_a_max_seq_len_that_leaves_no_room_for_a_response_is_refused_before_round_1(tmp_path, capsys, monkeypatch):
    cfg = config(tmp_path / "cfg", rounds=1, train={"max_seq_len": 3})  # prompts of 2 and 3 bytes
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(cfg), "--run-dir", "run")
    line = error_line(err)  # refused before the model is built, naming the longest prompt's file and line
    assert code == 2 and "config [prompts] file: " in line and "prompts.txt line " in line, line
    assert ": 3 tokens, above the limit of 1 " in line and "[train] max_seq_len (now 3) must exceed" in line, line
    assert not (tmp_path / "run").exists()


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes("\ufeffab\ncd\n".encode("utf-8"))
    assert builder.read_lines(str(path), "[prompts] file") == ["ab", "cd"]


def test_the_round_0_evaluation_is_announced_before_it_runs(tmp_path, capsys, monkeypatch):
    """A reward that hangs in the round-0 held-out evaluation showed nothing: one line says it runs."""
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(config(tmp_path / "cfg", rounds=1)),
                       "--run-dir", "run")
    lines = err.splitlines()
    first = next(i for i, line in enumerate(lines) if "round 0: scoring the 3 held-out prompts (8 samples each)" in line)
    assert code == 0 and first < next(i for i, line in enumerate(lines) if "round 1/1" in line), err


def test_plan_names_one_program_in_every_message(tmp_path, capsys, monkeypatch):
    import plan_run
    cfg = cases.write(cases.Case("plan", "grpo", None, "", rounds=1), tmp_path / "cfg")
    code, out, err = main_in_process(plan_run.main, capsys, monkeypatch, tmp_path, "--config", str(cfg),
                                     "--device", "cpu", "--cpu-threads", "1", "--probe-seconds", "2",
                                     prog="palm-rlhf-skill plan")
    assert code == 0, err[-2000:]
    names = {line.split(":", 1)[0] for line in [*err.strip().splitlines(), out.splitlines()[0]]}
    assert names == {"palm-rlhf-skill plan"}, names


def test_the_plot_extra_says_how_to_install_it_from_a_checkout():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "pip install 'palm-rlhf-skill[plot]'" in readme and "pip install '.[plot]'` from a checkout" in readme
    assert "pip install '.[plot]'" in watch.PLOT_INSTALL and "palm-rlhf-skill[plot]" in watch.PLOT_INSTALL


# --- plan's messages agree with themselves ----------------------------------------------------------------

PARAMS = {"weights_bytes": 40 * 2**30, "optimizer_state_bytes": 6 * 2**30, "gradient_bytes": 3 * 2**30,
          "components": {"palm": {"bytes": 20 * 2**30}, "reward_model": {"bytes": 20 * 2**30}}}


def test_weights_that_alone_do_not_fit_name_sizes_not_update_timesteps():
    """At dim 100000 the peak left out the optimizer state and gradients that plan itself lists, and
    the fix was to lower update_timesteps or max_seq_len, which do not change the weights."""
    text, fix = prediction.memory_words(None, {"host": 50 * 2**30}, "host", "host", {"host": 16 * 2**30}, PARAMS,
                                        "cpu", [], learns=True)
    assert text.startswith("predicted peak 50.0 GiB exceeds the 16.0 GiB available on cpu: the weights (40.0 GiB: "
                           "palm, reward_model) and prompt ids alone do not fit, and learn() adds 9.0 GiB of "
                           "optimizer state and gradients"), text
    assert fix.startswith("smaller [palm] sizes") and "update_timesteps" not in fix and "max_seq_len" not in fix


def test_a_plan_whose_weights_do_not_fit_counts_the_optimizer_in_its_peak(tmp_path, capsys, monkeypatch):
    import plan_run
    from policy_optimization import measuring
    monkeypatch.setattr(measuring, "available_memory", lambda device, meter: {"host": 2**20})  # 1 MiB: nothing fits
    cfg = cases.write(cases.Case("plan", "grpo", None, "", rounds=1), tmp_path / "cfg")
    code, out, err = main_in_process(plan_run.main, capsys, monkeypatch, tmp_path, "--config", str(cfg),
                                     "--device", "cpu", "--json")
    report = json.loads(out)
    params = report["parameters"]
    assert code == 1 and report["status"] == "does_not_fit" and report["probe"]["regime"] == "skipped", err[-2000:]
    assert report["predicted"]["peak_mib"] * 2**20 >= params["weights_bytes"] + params["optimizer_state_bytes"] \
        + params["gradient_bytes"] - 2**20
    warning = next(w for w in report["warnings"] if w["code"] == "memory_exceeds_device")
    assert "learn() adds" in warning["message"] and warning["fix"].startswith("smaller [palm] sizes")


def test_the_failing_pool_is_named_with_its_own_figures_and_a_fix_that_fits_it():
    """On an H200 the upstream run's host RAM failed (763 GiB of experiences against 128 GiB) while
    the message named the GPU's 7.5 GiB peak, and "update_timesteps 5,000 or lower fits" named the
    value that does not fit."""
    from policy_optimization.plan import advice, budget
    gib = 2**30
    pools, available = {"host": 800 * gib, "device": int(7.5 * gib)}, {"host": 128 * gib, "device": 139 * gib}
    assert prediction.failing_pool(pools, available, "device") == "host"
    assert prediction.failing_pool({**pools, "host": gib}, available, "device") is None
    memory = {"parts": {"held_before_learn": {"value": 763 * gib}}}
    text, fix = prediction.memory_words(memory, pools, "host", "device", available, PARAMS, "cuda:0", [], True)
    assert text.startswith("predicted peak 800.0 GiB exceeds the 128.0 GiB available of host RAM; the experiences "
                           "held before each learn() alone take 763.0 GiB"), text
    assert "the GPU's peak, 7.5 GiB of 139.0 GiB, fits" in text and "more RAM" in fix
    per = 763 * gib // 5000  # the host pool grows with the experiences held: update_timesteps of them
    units = budget.Units(fixed_s=0, rollout_s=None, learn_item_s=None, eval_s=0, update=5000, per_round=None, every=1,
                         items_per_rollout=1, epochs=1, max_seq_len=2048, min_seq_len=513, depth=12, dim=512,
                         rollout_at=lambda n: None, peak_at=lambda u, n: 37 * gib + u * per)
    warnings = [{"code": "memory_exceeds_device", "fix": fix}]
    advice.name_the_memory_fit(warnings, units, available["host"])
    named = int(re.match(r"update_timesteps ([\d,]+) or lower fits", warnings[0]["fix"])[1].replace(",", ""))
    assert named < 5000 and units.peak_at(named, 2048) <= available["host"] < units.peak_at(named + 1, 2048)
    fits = [{"code": "memory_exceeds_device", "fix": fix}]
    advice.name_the_memory_fit(fits, units, 10**6 * gib)  # a pool the configured value fits: nothing named
    assert fits[0]["fix"] == fix


def test_an_unmeasured_figure_carries_no_measured_tag():
    """upstream-readme.toml's plan printed "rollout transient - (not measured) [measured]"."""
    from policy_optimization.plan import report as plan_report
    counts = {"items_per_rollout": 1, "learn_calls": 1, "max_items_held": 4, "items_per_learn": 4}
    params = {"optimizer_state_bytes": 8, "gradient_bytes": 4}
    memory = prediction.predict_memory(counts, 100, False, {"host": 1000}, params, {}, 4)
    assert memory["parts"]["rollout_transient"] == {"value": None, "basis": None}
    assert memory["parts"]["learn_activations"] == {"value": None, "basis": None}
    parts = {**{k: v for k, v in memory["parts"].items()}, "base_bytes": {"value": {"host": 1000}, "basis": "measured"}}
    report = {"counts": {**counts, "rollouts": 4, "group_size": 1, "optimizer_steps_per_learn": 1, "optimizer_steps": 1,
                         "leftover_rollouts_dropped": 0},
              "parameters": {"total_numel": 1, "trainable_numel": 1, "weights_bytes": 4, "components": {},
                             "optimizer_state_bytes": 8, "optimizer_state_tensors_per_parameter": {}, "gradient_bytes": 4},
              "probe": {"elapsed_s": 1.0, "budget_s": 1.0, "regime": "extrapolated", "notes": []},
              "trainer": "ppo", "class_name": "x", "device": "cpu", "stored_per_rollout": None, "memory": parts,
              "time": {"startup": 1.0, "construct": 1.0, "unit_s": {}, "missing": {}}, "warnings": [],
              "status": "fits", "verdict": "fits"}
    line = next(line for line in plan_report.summary(report).splitlines() if line.startswith("memory (MiB)"))
    assert "rollout transient - (not measured), " in line and "learn activations - (not measured)" in line, line
    assert line.count("[measured]") == 1  # the process before the rollouts, measured


def test_the_probe_learns_on_whole_minibatches(tmp_path, capsys, monkeypatch):
    """plan predicted learn() on an H200 at 3.40 s against 2.03 s measured: the probe timed learn() on
    fewer experiences than one minibatch and took the time as proportional to them, while a GPU
    minibatch costs about the same for 8 experiences as for 16. The probe fills whole minibatches."""
    import plan_run
    from policy_optimization.plan import probe
    assert [probe.whole_minibatches(n, 16, 64) for n in (1, 8, 16, 17, 63, 200)] == [16, 16, 16, 32, 64, 64]
    assert probe.whole_minibatches(3, 16, 5) == 5  # never more than one learn() of the run has
    cfg = cases.write(cases.Case("plan", "grpo", None, "", overrides={"trainer": {"minibatch_size": 5}}, rounds=1),
                      tmp_path / "cfg")
    code, out, err = main_in_process(plan_run.main, capsys, monkeypatch, tmp_path, "--config", str(cfg),
                                     "--device", "cpu", "--cpu-threads", "1", "--probe-seconds", "20", "--json")
    report = json.loads(out)
    learned = report["probe"].get("rollouts", {}).get("learn") or []
    assert code == 0 and report["probe"]["regime"] == "measured" and learned, err[-2000:]
    per_learn = report["counts"]["items_per_learn"]
    assert all(call["items"] % 5 == 0 or call["items"] == per_learn for call in learned), learned


# --- each file of the table: missing, damaged, another run's, hostile ----------------------------------------

@pytest.mark.parametrize("missing", ["metrics.jsonl, the older checkpoint newest", "metrics.jsonl",
                                     "the newest checkpoint", "run_config.json", "summary.json"])
def test_a_missing_file(missing, paused, runs, capsys, monkeypatch):
    """What a resume does without each file (run-directory.md#files, column "missing")."""
    newest = paused / "checkpoints" / "round-000002"
    if missing.startswith("metrics.jsonl"):
        (paused / rundir.METRICS).unlink()
    if missing in ("the newest checkpoint", "metrics.jsonl, the older checkpoint newest"):
        shutil.rmtree(newest)  # round-000001 holds rows 0-1: it restores them all
    if missing in ("run_config.json", "summary.json"):
        (paused / missing).unlink()
    code, _, err = resume(capsys, monkeypatch, paused)
    if missing == "metrics.jsonl":  # round-000002 holds row 2 only: rows 0-1 are gone
        assert code == 2 and "rows 0-1 are missing, edited or another run's" in error_line(err)
    elif missing == "run_config.json":
        assert code == 2 and "no run_config.json there to resume from: give --config FILE" in one_error_line(err)
    else:
        assert code == 0, err[-2000:]
        assert rows(paused / rundir.METRICS) == rows(runs[1] / rundir.METRICS)


def test_a_finished_run_without_its_policy_writes_it_again(finished, capsys, monkeypatch):
    """policy.pt is written, never read: a damaged one is left alone; a missing one is written again."""
    (finished / rundir.POLICY).write_bytes(b"damaged")
    code, _, err = resume(capsys, monkeypatch, finished)
    assert code == 0 and "nothing to resume" in err and (finished / rundir.POLICY).read_bytes() == b"damaged"
    (finished / rundir.POLICY).unlink()
    code, _, err = resume(capsys, monkeypatch, finished)
    assert code == 0 and "nothing to resume" not in err and (finished / rundir.POLICY).is_file(), err[-2000:]


@pytest.mark.parametrize("hostile", ["a pickle that runs code", "a huge rotary length", "run_state.json not JSON"])
def test_a_hostile_checkpoint_runs_nothing_and_is_refused(hostile, paused, tmp_path, capsys, monkeypatch):
    newest = paused / "checkpoints" / "round-000002"
    state = json.loads((newest / checkpoint.STATE_FILE).read_text())
    marker = tmp_path / "ran"
    if hostile == "a pickle that runs code":  # an older checkpoint's (no manifest): the load itself is tried
        import pickle

        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        del state["files"]
        (newest / "optimizer.bin").write_bytes(pickle.dumps(Payload()))
    elif hostile == "a huge rotary length":
        state["rotary"] = {name: 10**12 for name in state["rotary"]}
    (newest / checkpoint.STATE_FILE).write_text("{not json" if hostile.endswith("not JSON") else json.dumps(state))
    line = refused_resume(capsys, monkeypatch, paused)
    assert "round-000002" in line and not marker.exists(), line


@pytest.mark.parametrize("case", ["damaged", "another run's"])
def test_a_summary_that_is_not_this_runs(case, finished, runs, tmp_path, capsys, monkeypatch):
    """watch refuses it (one line); a resume ignores it, says so, and writes it again."""
    summary = json.loads((finished / rundir.SUMMARY).read_text())
    if case == "damaged":
        summary["rounds_done"] = "three"
    else:
        summary["run_id"] = "0" * 32
    (finished / rundir.SUMMARY).write_text(json.dumps(summary))
    code, _, err = watch_cli(capsys, monkeypatch, tmp_path, str(finished))
    assert code == 2 and "summary.json: not this run's summary (" in one_error_line(err)
    code, _, err = resume(capsys, monkeypatch, finished)
    assert code == 0 and "ignored: " in err, err[-2000:]
    assert rundir.read_json(finished / rundir.SUMMARY)["run_id"] == json.loads((finished / rundir.CONFIG).read_text())["run_id"]


@pytest.mark.parametrize("name", [rundir.TRACKERS, rundir.POLICY, rundir.CHECKPOINTS, rundir.SUMMARY, rundir.CONFIG])
def test_a_link_in_place_of_a_run_file_is_refused_and_force_removes_the_link_alone(name, paused, tmp_path, capsys,
                                                                                   monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    if (paused / name).is_dir():
        shutil.rmtree(paused / name)
    else:
        (paused / name).unlink(missing_ok=True)
    (paused / name).symlink_to(target)
    code, _, err = resume(capsys, monkeypatch, paused)
    assert code == 2 and f"{name}: a symbolic link" in one_error_line(err), err
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(config(tmp_path / "cfg", rounds=1)),
                       "--run-dir", str(paused), "--force")
    assert code == 0 and not (paused / name).is_symlink() and (target / "mine.txt").read_text() == "keep me", err[-2000:]


def test_a_run_config_of_another_run_or_of_yours(paused, runs, tmp_path, capsys, monkeypatch):
    """Another run's run_config.json (its id fits no checkpoint): the resume is refused. A file of
    yours named run_config.json: a new run there is refused, the file untouched."""
    shutil.copy(runs[1] / rundir.CONFIG, paused / rundir.CONFIG)
    assert "it belongs to another run" in refused_resume(capsys, monkeypatch, paused)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / rundir.CONFIG).write_text('{"learning_rate": 3}')
    code, _, err = cli(capsys, monkeypatch, tmp_path, "--config", str(config(tmp_path / "cfg", rounds=1)),
                       "--run-dir", str(mine))
    assert code == 2 and "not a run config of palm-rlhf-skill train" in one_error_line(err)
    assert (mine / rundir.CONFIG).read_text() == '{"learning_rate": 3}'


# --- the audit: every file of a run directory has its row ------------------------------------------------------

def doc_rows() -> list[str]:
    section = RUN_DOC.read_text().split('<a id="files"></a>', 1)[1]
    return [line.split("|", 3)[1] + line.split("|", 3)[2] for line in section.splitlines()
            if line.startswith("| ") and "---" not in line][1:]


def test_the_file_table_has_a_row_for_every_file_a_run_writes(runs):
    """run-directory.md's table against a real run directory: each file train wrote (top level and
    in a checkpoint), the lock, trackers and the old config name, matched to the first cell of a
    row; the rows' answers are the tests of this module."""
    run_dir = runs[1]
    written = {p.name for p in run_dir.iterdir()} | {p.name for p in (run_dir / "checkpoints").iterdir()} \
        | {p.name for p in next((run_dir / "checkpoints").iterdir()).iterdir()} | {rundir.LOCK, rundir.TRACKERS}
    cells = doc_rows()
    patterns = {name: re.sub(r"(model|optimizer)(_\d+)?\.", r"\1*.", re.sub(r"round-\d+", "round-N", name))
                for name in written}
    patterns.update({"random_states_0.pkl": "random_states_K.pkl", rundir.CHECKPOINTS: "checkpoints/round-N/"})
    missing = [name for name, pattern in patterns.items() if not any(pattern in cell for cell in cells)]
    assert not missing, f"run-directory.md#files: no row for {missing}"
    assert any(rundir.OLD_CONFIG in cell for cell in cells)
