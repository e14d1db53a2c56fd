"""palm-rlhf-skill train-reward (sub-skills/reward-modeling/scripts/train_reward.py): a RewardModel
trained on the worked example's preference pairs at tiny sizes, its files and figures, exact resume,
token coverage and its remedy, train's [reward] checkpoint with the reward model's own sizes, bad
input, and the worked example end to end (references/preferences.md)."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

import probe_kit

from conftest import REPO, main_in_process, one_error_line, run, usage_error_without_torch
from reward_modeling import artifacts, coverage, reward_report, reward_run
from run_kit import rundir, watch
from watch_run import LAYOUTS
from skill_runtime import exits, streams, version_gate

SCRIPTS = REPO / "sub-skills" / "reward-modeling" / "scripts"
TRAIN_REWARD = SCRIPTS / "train_reward.py"
EXAMPLE = REPO / "sub-skills" / "reward-modeling" / "assets" / "preferences"
REPORTS = REPO / "references" / "run-reports.md"
PREFERENCES = REPO / "sub-skills" / "reward-modeling" / "references" / "preferences.md"
# the kit's tiny PaLM (probe_kit.TINY_PALM), one epoch at lr 3e-3
TINY = [f"palm.{k}={v}" for k, v in probe_kit.TINY_PALM.items() if k != "num_tokens"] + ["train.lr=3e-3", "train.epochs=1"]


def train(tmp_path, name="run", overrides=(), config=EXAMPLE / "rm.toml", **options):
    """train-reward in-process on ``config`` at TINY sizes plus ``overrides``; (RewardRun, summary)."""
    options.setdefault("say", lambda line: None)
    return reward_run.train_to_end(str(config), tmp_path / name, "cpu", [*TINY, *overrides],
                                   reward_run.Options(progress=False, **options))


def built(tmp_path, overrides=()):
    """A RewardRun built (row 0 written), not trained."""
    prepared = reward_run.prepare(str(EXAMPLE / "rm.toml"), tmp_path / "run", False, False, [*TINY, *overrides],
                                  reward_run.Options(progress=False, say=lambda line: None))
    return reward_run.RewardRun.build(prepared, "cpu")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The shipped pairs at tiny sizes, one epoch in rounds of 30 steps, the remedy off: (run, summary)."""
    return train(tmp_path_factory.mktemp("shipped"), overrides=["train.steps_per_round=30",
                                                                "train.tie_unseen_embeddings=false"],
                 env=version_gate.check_versions())


def documented_keys(heading: str) -> list[str]:
    import re
    text = REPORTS.read_text(encoding="utf-8")
    assert heading in text, f"references/run-reports.md: no heading {heading!r}"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]  # without its subsections
    return re.findall(r"^\| `([a-z_]+)` \|", section, re.M)


# --- learning, rows, files ---------------------------------------------------------------------

def test_bradley_terry_raises_held_out_accuracy_on_the_shipped_pairs(shipped):
    run, summary = shipped
    rows = rundir.read_rows(run.run.metrics)
    assert [r["round"] for r in rows] == [0, 1, 2, 3] and all(list(r) == list(reward_report.ROW_KEYS) for r in rows)
    assert rows[0]["held_out_accuracy"] < 0.6 < 0.8 < rows[-1]["held_out_accuracy"], [r["held_out_accuracy"] for r in rows]
    assert rows[-1]["loss"] < rows[1]["loss"] < math.log(2) + 0.05 and rows[-1]["margin"] > rows[1]["margin"] > 0
    assert rows[-1]["step"] == 85 and rows[-1]["epoch"] == 1.0 and sum(r["examples"] or 0 for r in rows) == 2700
    assert summary["status"] == "finished" and summary["held_out_accuracy"] == rows[-1]["held_out_accuracy"]
    assert summary["examples"] == {"train": 2700, "held_out": 300, "held_out_from": "fraction"}
    assert summary["verdict"].startswith("FINISHED:")


def test_the_reports_keys_are_documented(shipped, tmp_path, capsys):
    run, summary = shipped
    assert documented_keys("## train-reward metrics row") == list(reward_report.ROW_KEYS), \
        "references/run-reports.md#train-reward-metrics-row: one row per key of reward_report.ROW_KEYS, in order"
    on_disk = json.loads(run.run.summary.read_text())
    assert documented_keys("## train-reward summary") == list(on_disk), \
        "references/run-reports.md#train-reward-summary: one row per key of summary.json, in order"
    assert set(documented_keys("### coverage")) == set(on_disk["coverage"]), "run-reports.md: the coverage probe's keys"
    view = watch.view(run.run.path, LAYOUTS)
    assert view["kind"] == "reward" and view["curves"]["held-out accuracy"][-1][1] == summary["held_out_accuracy"]
    assert "`kind` (`policy`, or `reward`" in REPORTS.read_text().split("## watch report", 1)[1]
    text = watch.text(view, LAYOUTS)
    assert "(a reward model)" in text and text.splitlines()[-1].startswith("watch: FINISHED after round 3; held-out accuracy")


def test_rm_config_round_trip_loads_and_scores_as_the_run(shipped):
    """RewardModel(PaLM(**c["palm"]), **c["reward_model"]) + load_state_dict(torch.load(rm.pt)) is the
    trained model: the same scores as the run's on held-out rows."""
    from palm_rlhf_pytorch import PaLM, RewardModel
    from reward_modeling import examples
    run, summary = shipped
    c = json.loads((run.run.path / "rm_config.json").read_text())
    assert set(c) == {"palm", "reward_model", "tokenizer"} and c["tokenizer"] == {"kind": "bytes"} and c["palm"]["dim"] == 32 and c["reward_model"]["use_lora"] is False
    model = RewardModel(PaLM(**c["palm"]), **c["reward_model"])
    model.load_state_dict(torch.load(run.run.path / "rm.pt"))
    model.eval()
    held = run.prepared.held_out
    x, mask, lengths = examples.collate(held.prompts[:16], held.first[:16], "cpu")
    with torch.no_grad():
        assert torch.allclose(model(x, mask=mask, prompt_lengths=lengths),
                              torch.tensor(run.score(held.prompts[:16], held.first[:16])), atol=1e-6)
    assert summary["files"]["rm"] == str(run.run.path / "rm.pt")


@pytest.mark.parametrize("lora", [True, False])
def test_every_trainable_tensor_moves_and_frozen_ones_do_not(tmp_path, lora):
    """LoRA: the head, the reward scope and the prompt/response embeddings move, every base PaLM
    weight stays; all weights: every tensor moves except the embedding rows of ids the training
    data never contains (no gradient reaches them: coverage.py)."""
    run = built(tmp_path, [f"reward_model.use_lora={'true' if lora else 'false'}", "train.steps_per_round=20",
                           "train.tie_unseen_embeddings=false"])
    model = run.unwrapped
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainable = {name for name, p in model.named_parameters() if any(p is q for q in run.trainable)}
    assert {"prompt_embed", "response_embed", "to_pred.0.weight"} <= trainable
    run.rounds(streams.Progress("t", False))
    run.finish("finished", None)
    after = dict(model.named_parameters())
    for name in before:
        moved = not torch.equal(before[name], after[name].detach())
        if name == "palm.token_emb.weight" and not lora:
            rows = (before[name] != after[name].detach()).any(dim=1)
            seen = sorted(set(range(257)) - set(run.unseen))
            assert rows[seen].all() and not rows[run.unseen].any(), "seen rows move, unseen rows stay"
        elif name in trainable:
            assert moved, f"trainable {name} did not move"
        else:
            assert lora and not moved, f"frozen {name} moved"
    assert lora == all(".finetune_modules." in n or n in ("prompt_embed", "response_embed") or n.startswith("to_pred")
                       for n in trainable)


def test_unseen_ids_are_the_complement_of_the_training_data(tmp_path):
    """With a held-out file every row of the pairs file trains: unseen_ids is exactly the ids
    (byte + 1, the pad id 0 included) that no prompt, chosen or rejected of that file contains."""
    rows = [json.loads(line) for line in (EXAMPLE / "pairs.jsonl").read_text().splitlines()[:200]]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:150]))
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[150:]))
    config = tmp_path / "rm.toml"
    config.write_text((EXAMPLE / "rm.toml").read_text().replace('pairs = "pairs.jsonl"\nheld_out_fraction = 0.1',
                                                                 'pairs = "train.jsonl"\nheld_out = "held.jsonl"'))
    _, summary = train(tmp_path, config=config)
    used = {b + 1 for r in rows[:150] for text in r.values() for b in text.encode()}
    assert summary["unseen_ids"] == sorted(set(range(257)) - used) and 0 in summary["unseen_ids"]
    assert summary["examples"] == {"train": 150, "held_out": 50, "held_out_from": "file"}


def test_the_remedy_ties_unseen_ids_and_changes_the_probe(shipped, tmp_path):
    """Without the remedy each unseen id keeps its own random embedding and scores differently; with
    [train] tie_unseen_embeddings every unseen row is the mean of the seen rows, so every unseen id
    scores alike (references/preferences.md#token-coverage)."""
    _, off = shipped
    run, on = train(tmp_path, overrides=["train.steps_per_round=30"])
    assert off["unseen_ids"] == on["unseen_ids"] and len(on["unseen_ids"]) == 220
    spread = lambda probe: max(w["repeated"] for w in probe["worst"]) - min(w["repeated"] for w in probe["worst"])  # noqa: E731
    assert spread(off["coverage"]) > 0.01 and spread(on["coverage"]) < 1e-5
    assert abs(on["coverage"]["repeated_max"] - on["coverage"]["repeated_mean"]) < 1e-5
    weight = torch.load(run.run.path / "rm.pt")["palm.token_emb.weight"]
    seen = sorted(set(range(257)) - set(on["unseen_ids"]))
    assert torch.allclose(weight[on["unseen_ids"]], weight[seen].mean(0).expand(220, -1), atol=1e-6)
    assert on["tie_unseen_embeddings"] is True and off["tie_unseen_embeddings"] is False
    assert coverage.gameable({"repeated_above_median": 1, "mixed_above_own": 0})
    assert not coverage.gameable(on["coverage"] | {"repeated_above_median": 0, "mixed_above_own": 0})


# --- resume -------------------------------------------------------------------------------------------

def test_resume_is_bitwise_the_uninterrupted_run(tmp_path):
    """--until 2 then --resume: rm.pt and every metrics row (but the seconds) equal one
    uninterrupted run's, dropout on (the RNG states come back from the checkpoint)."""
    settings = ["train.steps_per_round=20", "reward_model.dropout=0.1"]
    whole, _ = train(tmp_path, "whole", settings)
    part, paused = train(tmp_path, "part", settings, until=2)
    assert paused["status"] == "paused" and not (part.run.path / "rm.pt").exists()
    resumed, summary = reward_run.train_to_end(None, tmp_path / "part", "cpu", None,
                                               reward_run.Options(progress=False, say=lambda line: None), resume=True)
    assert summary["status"] == "finished" and resumed.start == 2
    timing = ("wall_s", "examples_per_s")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in timing} for r in rows]  # noqa: E731
    assert strip(rundir.read_rows(part.run.metrics)) == strip(rundir.read_rows(whole.run.metrics))
    a, b = torch.load(whole.run.path / "rm.pt"), torch.load(part.run.path / "rm.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_changed_config_but_takes_more_epochs(tmp_path):
    train(tmp_path, overrides=["train.steps_per_round=40"], until=1)
    options = reward_run.Options(progress=False, say=lambda line: None)
    with pytest.raises(exits.SkillError, match=r"config changed since the run started: train\.lr"):
        reward_run.prepare(str(EXAMPLE / "rm.toml"), tmp_path / "run", True, False,
                           [*TINY, "train.steps_per_round=40", "train.lr=1e-2"], options)
    prepared = reward_run.prepare(str(EXAMPLE / "rm.toml"), tmp_path / "run", True, False,
                                  [*TINY, "train.steps_per_round=40", "train.epochs=2"], options)
    prepared.claim.lock.release()
    with pytest.raises(exits.SkillError, match=r"--set train\.lr: a resume may change only train\.epochs"):
        reward_run.prepare(None, tmp_path / "run", True, False, ["train.lr=1e-2"], options)
    prepared = reward_run.prepare(None, tmp_path / "run", True, False, ["train.epochs=2"], options)  # --set alone
    assert prepared.resolved["train"]["epochs"] == 2
    prepared.claim.lock.release()


# --- train's [reward] checkpoint ------------------------------------------------------------------

def policy_config(tmp_path, checkpoint, dim=16, extra=""):
    (tmp_path / "prompts.txt").write_text("ab\ncde\n")
    path = tmp_path / "policy.toml"
    tiny = probe_kit.TINY_PALM
    path.write_text(f"""[palm]\nnum_tokens = 257\ndim = {dim}\ndepth = 1\nheads = {tiny['heads']}\ndim_head = {tiny['dim_head']}\n
[trainer]\nname = "grpo"\nactor_lora = false\ngrpo_num_times_sample_rewards = 3\nminibatch_size = 4\n
[prompts]\nfile = "prompts.txt"\n\n[reward]\ncheckpoint = "{checkpoint}"\n\n[train]\nupdate_timesteps = 2\nmax_seq_len = 8\n
[run]\nrounds = 1\n{extra}""")
    return path


def test_train_builds_the_reward_model_from_rm_config_with_its_own_sizes(shipped, tmp_path):
    from policy_optimization import builder, run_config
    run, _ = shipped
    resolved = run_config.check_against_library(run_config.FORM.load(str(policy_config(tmp_path, run.run.path / "rm.pt"))))
    assert resolved["palm"]["dim"] == 16 and resolved["reward_palm"]["dim"] == 32
    made = builder.build(resolved, {"cpu": True}, torch.device("cpu"))
    rm = made.trainer.accelerate.unwrap_model(made.trainer.reward_model)
    assert rm.palm.dim == 32 and made.palm.dim == 16
    saved = torch.load(run.run.path / "rm.pt")
    assert all(torch.equal(value, saved[key]) for key, value in rm.state_dict().items())
    meta = builder.build(resolved, {"cpu": True}, torch.device("cpu"), meta=True)  # plan counts it at its sizes
    assert meta.trainer.reward_model.palm.dim == 32


def test_a_reward_checkpoint_without_rm_config_keeps_the_policys_sizes(shipped, tmp_path):
    """An old config: rm.pt alone builds the reward model on the policy's [palm], as before; sizes
    that differ from the checkpoint's are one line, exit 2."""
    from policy_optimization import builder, run_config
    run, _ = shipped
    (tmp_path / "old").mkdir()
    shutil.copy(run.run.path / "rm.pt", tmp_path / "old" / "rm.pt")
    for dim, fits in ((32, True), (16, False)):
        folder = tmp_path / f"dim{dim}"
        folder.mkdir()
        resolved = run_config.check_against_library(run_config.FORM.load(str(policy_config(
            folder, tmp_path / "old" / "rm.pt", dim=dim, extra="\n[reward_model]\nuse_lora = false\ndropout = 0.0\n"))))
        assert resolved["reward_palm"] is None
        if fits:
            builder.build(resolved, {"cpu": True}, torch.device("cpu"))
        else:
            with pytest.raises(exits.SkillError, match=r"\[reward\] checkpoint: .*rm\.pt: RuntimeError"):
                builder.build(resolved, {"cpu": True}, torch.device("cpu"))


def test_rm_config_and_reward_model_together_are_refused(shipped, tmp_path):
    from policy_optimization import run_config
    run, _ = shipped
    config = policy_config(tmp_path, run.run.path / "rm.pt", extra="\n[reward_model]\nuse_lora = false\n")
    with pytest.raises(exits.SkillError, match=r"rm_config\.json beside \[reward\] checkpoint sets the reward model"):
        run_config.check_against_library(run_config.FORM.load(str(config)))
    bigger = policy_config(tmp_path, run.run.path / "rm.pt").read_text().replace("num_tokens = 257", "num_tokens = 300")
    (tmp_path / "policy.toml").write_text(bigger)
    with pytest.raises(exits.SkillError, match=r"num_tokens = 300: the policy samples ids"):
        run_config.check_against_library(run_config.FORM.load(str(tmp_path / "policy.toml")))


# --- the command line ------------------------------------------------------------------------------

def cli(tmp_path, capsys, monkeypatch, *argv):
    from train_reward import main
    return main_in_process(main, capsys, monkeypatch, tmp_path, *argv, prog=TRAIN_REWARD)


def write(path, text):
    path.write_text(text)
    return path


ROW = {"prompt": "p", "chosen": "a1", "rejected": "bb"}
BAD_DATA = {
    "missing key": ('{"prompt": "p", "chosen": "a"}\n', "line 1: missing key 'rejected'"),
    "empty file": ("\n\n", "no rows"),
    "not JSON": (json.dumps(ROW) + "\n{oops\n", "line 2: not JSON"),
    "equal pair": ('{"prompt": "p", "chosen": "same", "rejected": "same"}\n', "line 1: chosen and rejected are the same"),
    "empty response": ('{"prompt": "p", "chosen": "", "rejected": "x"}\n', "line 1: chosen is empty"),
    "not a string": ('{"prompt": "p", "chosen": 3, "rejected": "x"}\n', "line 1: chosen must be a string"),
    "not an object": ('["p", "a", "b"]\n', "line 1: a JSON object with prompt, chosen, rejected expected"),
}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_data_is_one_line_exit_2_and_leaves_nothing(tmp_path, capsys, monkeypatch, case):
    text, message = BAD_DATA[case]
    write(tmp_path / "pairs.jsonl", text)
    config = write(tmp_path / "rm.toml", (EXAMPLE / "rm.toml").read_text())
    code, out, err = cli(tmp_path, capsys, monkeypatch, "--config", str(config), "--run-dir", "run", "--device", "cpu")
    assert code == 2 and out == "" and message in one_error_line(err), err
    assert "config [data] pairs:" in err and not (tmp_path / "run").exists(), "a refused start left its directory"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("[data]", "[trainer]\nname = \"grpo\"\n[data]"), "unknown section [trainer] (a policy run's"),
    (lambda t: t.replace("num_binned_output = 0", "num_binned_output = 4"), "a binned model returns a sampled bin"),
    (lambda t: t.replace("epochs = 2", "epochs = 0"), "[train] epochs: must be at least 1"),
    (lambda t: t.replace("held_out_fraction = 0.1", "held_out_fraction = 1.5"), "must be between 0 and 1"),
    (lambda t: t.replace('pairs = "pairs.jsonl"', 'pairs = "pairs.jsonl"\nratings = "r.jsonl"'), "give exactly one of"),
    (lambda t: t.replace("dim = 64", "dim = 64\nbogus = 1"), "[palm] bogus: not an argument of the installed PaLM"),
    (lambda t: t.replace('pairs = "pairs.jsonl"', 'pairs = "missing.jsonl"'), "missing.jsonl: no such file"),
])
def test_bad_config_is_one_line_exit_2(tmp_path, capsys, monkeypatch, edit, message):
    write(tmp_path / "pairs.jsonl", json.dumps(ROW) + "\n")
    config = write(tmp_path / "rm.toml", edit((EXAMPLE / "rm.toml").read_text()))
    code, _, err = cli(tmp_path, capsys, monkeypatch, "--config", str(config), "--run-dir", "run", "--device", "cpu")
    assert code == 2 and message in one_error_line(err), err


def test_a_directory_as_config_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    code, _, err = cli(tmp_path, capsys, monkeypatch, "--config", str(tmp_path), "--run-dir", "run")
    assert code == 2 and "cannot read it: IsADirectoryError" in one_error_line(err)


def test_usage_errors_and_help_need_no_torch(tmp_path):
    line = usage_error_without_torch(TRAIN_REWARD, ["--config", "rm.toml"], tmp_path)
    assert "give --config FILE and --run-dir DIR (a new run), or --resume DIR" in line
    proc = run([sys.executable, "-X", "importtime", str(TRAIN_REWARD), "--help"], tmp_path)
    assert proc.returncode == 0 and "--until ROUND" in proc.stdout and "exit codes: 0 the run finished" in proc.stdout
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_ratings_train_with_the_librarys_labels(tmp_path):
    """[data] ratings: a scalar model on the digit share itself (MSE, the library's loss), a binned one
    on bins of it (cross-entropy); both rank held-out responses above chance."""
    sys.path.insert(0, str(EXAMPLE))
    import rater
    rows = [json.loads(line) for line in (EXAMPLE / "pairs.jsonl").read_text().splitlines()[:600]]
    rated = [{"prompt": r["prompt"], "response": r[k], "rating": rater.digit_share("", r[k])} for r in rows
             for k in ("chosen", "rejected")]
    for bins, to_rating in ((0, lambda s: s), (3, lambda s: min(2, int(s * 3)))):
        write(tmp_path / "ratings.jsonl", "".join(json.dumps({**r, "rating": to_rating(r["rating"])}) + "\n" for r in rated))
        config = write(tmp_path / "rm.toml", (EXAMPLE / "rm.toml").read_text().replace(
            'pairs = "pairs.jsonl"', 'ratings = "ratings.jsonl"').replace("num_binned_output = 0", f"num_binned_output = {bins}"))
        run_, summary = train(tmp_path, f"bins{bins}", config=config)
        rows_ = rundir.read_rows(run_.run.metrics)
        assert summary["data"] == "ratings" and summary["held_out_accuracy"] > 0.7, (bins, summary["held_out"])
        assert rows_[-1]["held_out_loss"] < rows_[0]["held_out_loss"] and rows_[-1]["train_accuracy"] is not None


def test_by_path_from_a_copy_of_the_tree_and_watch(tmp_path):
    """A bare copy of the skill tree (only the library installed): train-reward by path, then watch."""
    copy = tmp_path / "skill"
    copy.mkdir()
    for part in ("SKILL.md", "scripts", "sub-skills", "references"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, copy / part,
                                                                     **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                                        if (REPO / part).is_dir() else {}))
    argv = [sys.executable, "-I", str(copy / "sub-skills/reward-modeling/scripts/train_reward.py"), "--config",
            "skill/sub-skills/reward-modeling/assets/preferences/rm.toml", "--run-dir", "runs/rm", "--device", "cpu",
            "--cpu-threads", "1", "--json", *[a for s in TINY + ["train.steps_per_round=60"] for a in ("--set", s)]]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["status"] == "finished" and summary["files"]["rm"] == str(tmp_path / "runs" / "rm" / "rm.pt")
    assert "python skill/sub-skills/policy-optimization/scripts/train_run.py --config" in summary["next"]  # by path, as run
    shown = subprocess.run([sys.executable, "-I", str(copy / "sub-skills/policy-optimization/scripts/watch_run.py"),
                            "runs/rm"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env={"PATH": ""})
    assert shown.returncode == 0 and "(a reward model): finished, 2 rounds" in shown.stdout, shown.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "skill"]


# --- the worked example ------------------------------------------------------------------------------

def test_the_shipped_pairs_are_what_the_generator_writes(tmp_path):
    proc = run([sys.executable, str(EXAMPLE / "make_pairs.py"), "--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("pairs.jsonl", "prompts.txt", "held_out.txt"):
        assert (tmp_path / name).read_bytes() == (EXAMPLE / name).read_bytes(), f"rerun make_pairs.py: {name} differs"
    rows = [json.loads(line) for line in (EXAMPLE / "pairs.jsonl").read_text().splitlines()]
    sys.path.insert(0, str(EXAMPLE))
    import rater
    agree = sum(rater.digit_share(r["prompt"], r["chosen"]) > rater.digit_share(r["prompt"], r["rejected"]) for r in rows)
    assert len(rows) == 3000 and abs(agree / len(rows) - rater.AGREEMENT) < 0.02
    assert len({b for r in rows for t in r.values() for b in t.encode()}) == 37  # letters, digits, space


def test_the_worked_example_runs_as_typed(tmp_path, capsys, monkeypatch):
    """From a root holding the example's folder, the two commands of references/preferences.md (fewer
    epochs and rounds): train-reward prints its held-out accuracy, train builds the reward model of
    runs/rm with its own sizes, and the held-out reward and the gold metric (rater.digit_share) rise."""
    from train_run import main as train_main
    folder = tmp_path / "sub-skills" / "reward-modeling" / "assets" / "preferences"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    code, out, err = cli(tmp_path, capsys, monkeypatch, "--config", "sub-skills/reward-modeling/assets/preferences/rm.toml",
                         "--run-dir", "runs/rm", "--device", "cpu", "--set", "train.epochs=1")
    assert code == 0, err
    assert "held-out accuracy: " in out and out.splitlines()[-1].startswith("FINISHED:")
    code, out, err = main_in_process(train_main, capsys, monkeypatch, tmp_path, "--config",
                                     "sub-skills/reward-modeling/assets/preferences/policy.toml", "--run-dir",
                                     "runs/policy", "--device", "cpu", "--json", "--set", "run.rounds=10",
                                     "--set", "eval.every=10")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["held_out"]["after"] > summary["held_out"]["before"] + 1.0, summary["held_out"]
    # policy.toml's [eval] text_metric: the raters' rule scored on the same held-out samples
    assert summary["held_out"]["gold_after"] > summary["held_out"]["gold_before"], summary["held_out"]
    config = json.loads((tmp_path / "runs" / "rm" / "rm_config.json").read_text())
    assert config["palm"]["dim"] == 64


CONVERSATIONS = EXAMPLE.parent / "conversations"


def test_the_second_examples_pairs_are_what_its_generator_writes(tmp_path):
    """assets/conversations: HH-RLHF rows with a group column, the raters' rule depending on the prompt."""
    proc = run([sys.executable, str(CONVERSATIONS / "make_pairs.py"), "--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("pairs.jsonl", "held_out.jsonl"):
        assert (tmp_path / name).read_bytes() == (CONVERSATIONS / name).read_bytes(), f"rerun make_pairs.py: {name}"
    from data_kit import layouts
    pairs, layout = layouts.read_pairs(str(CONVERSATIONS / "pairs.jsonl"), "k", layouts.Options())[:2]
    assert layout == "implicit" and len(pairs) == 3000 and {p.group for p in pairs} == {"count", "spell"}
    sys.path.insert(0, str(CONVERSATIONS))
    import group_rater as rater
    agree = sum(rater.wanted_share(p.prompt, p.chosen) > rater.wanted_share(p.prompt, p.rejected) for p in pairs)
    assert abs(agree / len(pairs) - rater.AGREEMENT) < 0.02
    assert all(rater.group(p.prompt) == p.group for p in pairs), "the group column is the rule's kind of prompt"


def test_the_second_example_runs_as_typed_with_its_groups(tmp_path, capsys, monkeypatch):
    """preferences.md#second-example's commands from a root holding the folder (fewer rounds):
    train-reward reads the HH layout as it is, train takes the pairs' prompts, evaluate reports the
    two groups of held_out.jsonl with the raters' rule as the gold metric."""
    from evaluate_run import main as evaluate_main
    from train_run import main as train_main
    folder = tmp_path / "sub-skills" / "reward-modeling" / "assets" / "conversations"
    shutil.copytree(CONVERSATIONS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    code, out, err = cli(tmp_path, capsys, monkeypatch, "--config", str(folder.relative_to(tmp_path) / "rm.toml"),
                         "--run-dir", "runs/rm-conversations", "--device", "cpu", "--set", "train.epochs=1")
    assert code == 0 and out.splitlines()[-1].startswith("FINISHED:"), err
    code, out, err = main_in_process(train_main, capsys, monkeypatch, tmp_path, "--config",
                                     str(folder.relative_to(tmp_path) / "policy.toml"), "--run-dir",
                                     "runs/policy-conversations", "--device", "cpu", "--json", "--set", "run.rounds=20")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["held_out"]["gold_after"] > summary["held_out"]["gold_before"], summary["held_out"]
    code, out, err = main_in_process(evaluate_main, capsys, monkeypatch, tmp_path, "--run-dir",
                                     "runs/policy-conversations", "--json", "--device", "cpu")
    assert code == 0, err
    report = json.loads(out)
    assert [(g["group"], g["prompts"]) for g in report["policy"]["per_group"]] == [("spell", 4), ("count", 4)]
    assert report["policy"]["per_prompt"][0]["prompt"].startswith("\n\nHuman: ")
    assert report["gold_metric"] == "group_rater.py:wanted_share"


@pytest.mark.distributed
def test_nproc_2_trains_with_both_ranks_and_rank_0_writes(tmp_path, capsys, monkeypatch):
    """--nproc 2 (torchrun, gloo on the CPU): each rank takes half of every batch, rank 0 writes the
    rows, rm.pt and the summary."""
    sets = [a for s in TINY + ["train.steps_per_round=30"] for a in ("--set", s)]
    code, out, err = cli(tmp_path, capsys, monkeypatch, "--config", str(EXAMPLE / "rm.toml"), "--run-dir", "run",
                         "--nproc", "2", "--device", "cpu", "--json", *sets)
    assert code == 0, err[-2000:]
    summary = json.loads(out)
    assert summary["processes"] == 2 and summary["status"] == "finished" and summary["held_out_accuracy"] > 0.8
    rows = rundir.read_rows(tmp_path / "run" / "metrics.jsonl")
    assert sum(r["examples"] or 0 for r in rows) == 2700 and (tmp_path / "run" / "rm.pt").is_file()


def test_nproc_hands_the_ranks_absolute_paths(tmp_path, monkeypatch):
    """The ranks of --nproc run in a private directory: --config, --run-dir and --resume reach them
    absolute (train --nproc --run-dir runs/x once wrote its run there and lost it)."""
    from run_kit import command
    monkeypatch.chdir(tmp_path)
    assert command.absolute_paths(["--config", "rm.toml", "--run-dir=runs/x", "--res", "r", "--set", "a.b=c", "--co", "-"]) == \
        ["--config", str(tmp_path / "rm.toml"), f"--run-dir={tmp_path / 'runs' / 'x'}", "--res", str(tmp_path / "r"),
         "--set", "a.b=c", "--co", "-"]


# --- the docs ----------------------------------------------------------------------------------------

def test_the_config_table_is_the_own_keys():
    """preferences.md's key table: every key of rm_config.OWN_KEYS with its default, in order."""
    import re
    from reward_modeling import rm_config
    section = PREFERENCES.read_text().split("## The reward model's config", 1)[1].split("\n## ", 1)[0]
    rows = [(s, k, d.strip()) for s, k, d in re.findall(r"^\| `\[(\w+)\] (\w+)` \| ([^|]+) \|", section, re.M)]
    shown = lambda d: "-" if d is None else str(d).lower() if isinstance(d, bool) else str(d)  # noqa: E731
    assert rows == [(s, k, shown(d)) for s, keys in rm_config.OWN_KEYS.items() if s != "palm"
                    for k, (_, d) in keys.items()], "preferences.md#the-reward-models-config: one row per own key"


def test_the_measured_table_is_the_variants():
    import calibrate_preferences
    text = PREFERENCES.read_text()
    block = text.split("<!-- BEGIN MEASURED preferences -->\n", 1)[1].split("<!-- END MEASURED preferences -->", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:] if line.strip()]
    assert [r[0] for r in rows] == list(calibrate_preferences.VARIANTS), \
        "preferences.md#token-coverage: rerun calibrate_preferences.py --markdown (the variants changed)"
    on, off = rows
    before, after = (float(x) for x in on[4].split(" (")[0].split(" -> "))
    assert after > before + 0.5, "the example's policy rises on the gold metric with the remedy"
    assert float(off[4].split(" (")[0].split(" -> ")[1]) < after, "without the remedy the gold metric rises less"


def test_a_policy_runs_section_is_named_as_one(tmp_path):
    """rm_config.POLICY_SECTIONS (the hint for a policy run's section in train-reward's config) is the
    policy run's sections less the reward model's own: reward-modeling keeps the list, since it
    imports nothing of policy-optimization, and this test keeps it the policy's."""
    from policy_optimization import run_config
    from reward_modeling import rm_config
    assert set(rm_config.POLICY_SECTIONS) == set(run_config.SECTIONS) - set(rm_config.SECTIONS)
    config = tmp_path / "rm.toml"
    config.write_text('[palm]\ndim = 8\n[data]\npairs = "p.jsonl"\n[trainer]\nname = "ppo"\n', encoding="utf-8")
    with pytest.raises(exits.SkillError, match=r"unknown section \[trainer\] \(a policy run's section: this is "
                                               r"train-reward's config\)"):
        rm_config.FORM.load(str(config))
