"""The run config shared by ``plan`` and ``train`` (policy_optimization.run_config) and its builder:
every key beyond the library's arguments works ([palm] checkpoint, [reward] program / text_program /
checkpoint, [prompts] file / tokenizer, [eval], [run]), every misuse is one line, exit 2, naming the
key or the file, and the docs' key table is the parser's."""
from __future__ import annotations

import json
import re
import sys

import pytest

import probe_kit
from conftest import REPO, main_in_process, load_script, run
from skill_runtime import byte_tokenizer, exits, placement
from policy_optimization import builder, reward_programs, run_config
from policy_optimization.plan import planner

PLAN = REPO / "sub-skills" / "policy-optimization" / "scripts" / "plan_run.py"
plan = load_script(PLAN, "plan_run")  # in-process: its processes are tested in test_plan.py
WORKFLOWS = REPO / "sub-skills" / "policy-optimization" / "references" / "workflows.md"

BASE = "\n[palm]\n" + "".join(f"{key} = {value}\n" for key, value in probe_kit.TINY_PALM.items()) + """{palm}

[trainer]
name = "grpo"
grpo_num_times_sample_rewards = 2
minibatch_size = 4

[prompts]
{prompts}

[train]
max_seq_len = 16
{train}
{rest}
"""
VOWELS = "def vowels(prompt, response):\n    return sum(c in 'aeiou' for c in response) / max(1, len(response))\n"
ONES = ("import torch\n\ndef ones(x, response_mask):\n    return response_mask.sum(-1).float()\n\n"
        "def wide(x, response_mask):\n    return torch.zeros(x.shape[0], 5)\n\n"
        "def words(x, response_mask):\n    return ['a'] * x.shape[0]\n\n"
        "def one_arg(x):\n    return x\n\nnot_callable = 3\n")


def write_run(tmp_path, palm="", prompts='file = "p.txt"', train="update_timesteps = 2", rest="", name="run.toml"):
    (tmp_path / "p.txt").write_text("hello\nworld\n\nabc\n", encoding="utf-8")
    (tmp_path / "rules.py").write_text(VOWELS + "\n" + ONES, encoding="utf-8")
    path = tmp_path / name
    path.write_text(BASE.format(palm=palm, prompts=prompts, train=train, rest=rest), encoding="utf-8")
    return path


def resolve(path, *overrides):
    return run_config.check_against_library(run_config.FORM.load(str(path), list(overrides)))


def error_of(path, *overrides) -> str:
    with pytest.raises(exits.SkillError) as err:
        resolve(path, *overrides)
    assert err.value.exit_code == 2 and "\n" not in str(err.value), str(err.value)
    return str(err.value)


def build(res, seed=0):
    kwargs, device = placement.resolve_device("cpu")
    return builder.build(res, kwargs, device, seed)


# --- prompts and tokenizer ---------------------------------------------------------------------------

def test_byte_tokenizer_decodes_what_it_encodes():
    tok = byte_tokenizer.ByteTokenizer()
    ids = tok(["héllo", "ab"])
    assert [tok.decode(row) for row in ids] == ["héllo", "ab"]  # pad (0) skipped
    assert tok.decode([300, 105, 0]) == "h"  # ids beyond the byte range skipped


def test_prompts_file_relative_to_the_config_and_byte_tokenized(tmp_path, monkeypatch):
    path = write_run(tmp_path)
    monkeypatch.chdir(tmp_path.parent)  # the paths resolve against the config's folder, not here
    res = resolve(path)
    assert res["prompts"]["file"] == str(tmp_path / "p.txt")
    ids = builder.prompt_token_ids(res, 0)
    assert ids.tolist() == byte_tokenizer.ByteTokenizer()(["hello", "world", "abc"]).tolist()


def test_custom_tokenizer_and_its_errors(tmp_path):
    (tmp_path / "tok.py").write_text(
        "import torch\n\nclass Chars:\n    def __call__(self, lines):\n"
        "        rows = [[ord(c) - 96 for c in line] for line in lines]\n"
        "        out = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)\n"
        "        for i, r in enumerate(rows):\n            out[i, :len(r)] = torch.tensor(r)\n        return out\n"
        "    def decode(self, ids):\n        return ''.join(chr(i + 96) for i in ids if i)\n\nchars = Chars()\n\n"
        "def floats(lines):\n    return torch.zeros(len(lines), 3)\n\ndef plain(lines):\n    return [[1]] * len(lines)\n",
        encoding="utf-8")
    path = write_run(tmp_path, prompts='file = "p.txt"\ntokenizer = "tok.py:chars"',
                     rest='[reward]\ntext_program = "rules.py:vowels"')
    res = resolve(path)
    assert builder.prompt_token_ids(res, 0)[0].tolist() == [8, 5, 12, 12, 15]  # h e l l o
    with pytest.raises(exits.SkillError, match=r"\[prompts\] file: the tokenizer returned shape \(3, 3\) torch.float32"):
        builder.prompt_token_ids(resolve(path, "prompts.tokenizer=tok.py:floats", "reward.text_program=null"), 0)
    assert "text_program: needs a tokenizer that decodes" in error_of(path, "prompts.tokenizer=tok.py:plain")
    assert error_of(path, "prompts.tokenizer=tok") == 'config [prompts] tokenizer: expected "file.py:callable", got \'tok\''
    count = write_run(tmp_path, prompts='count = 2\nlength = 3\ntokenizer = "tok.py:chars"', name="count.toml")
    assert "tokenizer: applies to [prompts] file" in error_of(count)


def test_the_old_prompts_key_says_it_is_now_file(tmp_path):
    path = write_run(tmp_path, prompts='path = "p.txt"')
    with pytest.raises(exits.SkillError, match=r"^config \[prompts\] path: renamed: the key is now file"):
        run_config.FORM.load(str(path))


# --- reward sources -----------------------------------------------------------------------------------

def test_reward_program_on_ids_and_its_checked_output(tmp_path):
    import torch
    path = write_run(tmp_path, rest='[reward]\nprogram = "rules.py:ones"')
    built = build(resolve(path))
    x = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    prompt_mask = torch.tensor([[True, True, False, False], [True, False, False, False]])
    assert built.reward_model(x, prompt_mask=prompt_mask).tolist() == [2.0, 3.0]
    assert list(built.reward_model.parameters()) == []  # one process: no DDP anchor
    for function, says in (("wide", r"reward program rules.py:wide returned shape \(2, 5\), expected \(2,\)"),
                           ("words", "reward program rules.py:words returned list")):
        wrapped = build(resolve(path, f"reward.program=rules.py:{function}")).reward_model
        with pytest.raises(reward_programs.RewardProgramError, match=says):
            wrapped(x, prompt_mask=prompt_mask)


def test_text_program_gets_the_decoded_prompt_and_response(tmp_path):
    import torch
    path = write_run(tmp_path, rest='[reward]\ntext_program = "rules.py:vowels"')
    reward = build(resolve(path)).reward_model
    tok = byte_tokenizer.ByteTokenizer()
    x = torch.cat((tok(["hi"]), tok(["aab"])), dim=1)  # prompt "hi", response "aab"
    prompt_mask = torch.tensor([[True, True, False, False, False]])
    assert reward(x, prompt_mask=prompt_mask).tolist() == pytest.approx([2 / 3])


def test_rule_reward_carries_a_parameter_only_under_multi_process_cpu(tmp_path, monkeypatch):
    path = write_run(tmp_path, rest='[reward]\nprogram = "rules.py:ones"')
    monkeypatch.setattr(builder, "multi_process_cpu", lambda device: True)
    reward = build(resolve(path)).reward_model
    assert [tuple(p.shape) for p in reward.parameters()] == [()]


@pytest.mark.parametrize("value, says", [
    ("missing.py:f", "config [reward] program: {dir}/missing.py: no such file"),
    ("folder:f", "config [reward] program: {dir}/folder: is a directory, not a file"),
    ("rules.py:nothing", "config [reward] program: {dir}/rules.py has no nothing"),
    ("rules.py:not_callable", "config [reward] program: {dir}/rules.py:not_callable is a int, not callable"),
    ("rules.py:one_arg", "config [reward] program: rules.py:one_arg cannot be called as function(x (b, n) int64"),
    ("broken.py:f", "config [reward] program: {dir}/broken.py fails to import: ZeroDivisionError: division by zero"),
])
def test_program_errors_are_one_line_exit_2_naming_the_file(tmp_path, empty_dir, capsys, monkeypatch, value, says):
    path = write_run(tmp_path, rest=f'[reward]\nprogram = "{value}"')
    (tmp_path / "broken.py").write_text("1 / 0\n", encoding="utf-8")
    (tmp_path / "folder").mkdir()
    code, out, err = main_in_process(plan.main, capsys, monkeypatch, empty_dir,
                                     "--config", str(path), "--device", "cpu")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert says.format(dir=tmp_path) in err, err
    assert list(empty_dir.iterdir()) == []


def test_checkpoints_of_the_palm_and_the_reward_model_are_loaded(tmp_path):
    import torch
    from palm_rlhf_pytorch import PaLM, RewardModel
    path = write_run(tmp_path, palm='checkpoint = "palm.pt"', rest='[reward]\ncheckpoint = "rm.pt"\n[reward_model]\n'
                                                                  'num_binned_output = 3')
    res = resolve(path, "palm.checkpoint=null", "reward.checkpoint=null")  # the sizes, before the files exist
    torch.manual_seed(1)
    palm = PaLM(**res["palm"])
    torch.save(palm.state_dict(), tmp_path / "palm.pt")
    reward_model = RewardModel(PaLM(**res["palm"]), **res["reward_model"])
    torch.save(reward_model.state_dict(), tmp_path / "rm.pt")
    res = resolve(path)
    built = build(res, seed=5)
    assert torch.equal(built.palm.token_emb.weight, palm.token_emb.weight)
    loaded = built.reward_model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in reward_model.state_dict().items())
    torch.save({"nothing": torch.zeros(1)}, tmp_path / "rm.pt")
    with pytest.raises(exits.SkillError, match=r"^config \[reward\] checkpoint: .*rm.pt: not the weights of a RewardModel: "
                                               r"\d+ of its \d+ keys missing \(e\.g\. .+\), 1 unexpected \(e\.g\. nothing\)$"):
        build(res)
    torch.save(palm.state_dict(), tmp_path / "rm.pt")  # a policy.pt given as the reward model
    with pytest.raises(exits.SkillError, match=r"rm.pt: not the weights of a RewardModel: .* keys missing .* unexpected"):
        build(res)
    (tmp_path / "palm.pt").unlink()
    assert error_of(path) == f"config [palm] checkpoint: {tmp_path / 'palm.pt'}: no such file"
    (tmp_path / "palm.pt").mkdir()
    assert error_of(path) == f"config [palm] checkpoint: {tmp_path / 'palm.pt'}: is a directory, not a file"


def test_reward_sources_combine_as_documented(tmp_path):
    path = write_run(tmp_path, rest='[reward]\nprogram = "rules.py:ones"\ncheckpoint = "rm.pt"')
    assert "[reward]: program and checkpoint: give exactly one of" in error_of(path)
    both = write_run(tmp_path, rest='[reward]\nprogram = "rules.py:ones"\n[reward_model]\nnum_binned_output = 2',
                     name="both.toml")
    assert "[reward_model]: builds a RewardModel, which [reward] program replaces" in error_of(both)
    assert "config [reward] model: unknown key" in error_of(path, "reward.checkpoint=null", "reward.model=1")


# --- rounds and held-out evaluation --------------------------------------------------------------------

@pytest.mark.parametrize("rest, train, says", [
    ("[eval]\nprompts_file = 'p.txt'", "", "config [eval]: needs [run]"),
    ("[run]\nrounds = 2\n[eval]\nevery = 1", "", "config [eval] prompts_file: missing"),
    ("[run]\ncheckpoint_every = 2", "", "config [run] rounds: missing"),
    ("[run]\nrounds = 2", "num_episodes = 3", "config [train] num_episodes: not allowed with [run]: [run] rounds sets it"),
    ("[run]\nrounds = 0", "", "config [run] rounds: must be at least 1, got 0"),
    ("[run]\nrounds = 1\nseed = -1", "", "config [run] seed: must be at least 0"),
    ("[run]\nrounds = 1\nsampler = 'fast'", "", "config [run] sampler: 'fast'; choose one of library, cached"),
    ("[run]\nrounds = 1\n[eval]\nprompts_file = 'p.txt'\nsamples = 1.5", "", "config [eval] samples: expected integer"),
])
def test_run_and_eval_errors(tmp_path, rest, train, says):
    path = write_run(tmp_path, train=train, rest=rest)
    assert says in error_of(path)


def test_a_round_is_one_train_call_and_its_defaults_are_listed(tmp_path):
    path = write_run(tmp_path, train="update_timesteps = 3", rest="[run]\nrounds = 4\n[eval]\nprompts_file = 'p.txt'")
    res = resolve(path)
    assert res["round"] == {"rounds": 4, "max_timesteps": 3, "update_timesteps": 3}  # M = U: one learn() a round
    assert run_config.train_kwargs(res) == {"max_seq_len": 16, "update_timesteps": 3, "num_episodes": 1,
                                            "max_timesteps": 3}
    assert res["eval"] == {"prompts_file": str(tmp_path / "p.txt"), "every": 1, "samples": 1}
    assert run_config.eval_points(4, 1) == [0, 1, 2, 3, 4] and run_config.eval_points(5, 2) == [0, 2, 4, 5]
    applied = {(d["section"], d["key"]): (d["value"], d["source"]) for d in res["defaults_applied"]}
    assert applied[("train", "max_timesteps")] == (3, "skill") and ("train", "num_episodes") not in applied
    assert applied[("train", "temperature")] == (1.0, "library") and ("train", "max_seq_len") not in applied
    assert applied[("eval", "samples")] == (1, "skill") and applied[("run", "seed")] == (0, "skill")
    assert applied[("run", "sampler")] == ("library", "skill") and res["sampler"] == "library"
    assert applied[("palm", "ff_mult")] == (4, "library") and applied[("trainer", "epochs")] == (1, "library")
    counts = planner.run_counts(res, 3)
    assert (counts["rollouts"], counts["learn_calls"], counts["items_per_learn"]) == (12, 4, 9)
    leftover = resolve(path, "train.max_timesteps=7")  # 7 = 2 x 3 + 1: one rollout dropped per round
    counts = planner.run_counts(leftover, 3)
    assert (counts["rollouts"], counts["learn_calls"], counts["leftover_rollouts_dropped"]) == (28, 8, 4)


def test_plan_predicts_the_rounds_and_evaluations_execute_runs(tmp_path, empty_dir, capsys, monkeypatch):
    path = write_run(tmp_path, train="update_timesteps = 2\nmax_timesteps = 4",
                     rest="[reward]\ntext_program = 'rules.py:vowels'\n[run]\nrounds = 2\nseed = 3\n"
                          "[eval]\nprompts_file = 'p.txt'\nevery = 2\nsamples = 2")
    common = ["--config", str(path), "--json", "--device", "cpu", "--cpu-threads", "1"]
    code, out, err = main_in_process(plan.main, capsys, monkeypatch, empty_dir, *common, "--probe-seconds", "5")
    report = json.loads(out)
    assert code == 0 and report["status"] == "fits", err[-2000:]
    assert (report["counts"]["rounds"], report["counts"]["rollouts"], report["counts"]["learn_calls"]) == (2, 8, 4)
    assert report["time"]["eval"] > 0 and report["seed"] == 3
    assert {"section": "train", "key": "temperature", "value": 1.0, "source": "library"} in report["defaults_applied"]
    code, out, err = main_in_process(plan.main, capsys, monkeypatch, empty_dir, *common, "--execute")
    real = json.loads(out)
    assert code == 0 and real["status"] == "ok", err[-2000:]
    assert real["learn_calls"] == 4 and [e["round"] for e in real["eval"]] == [0, 2]
    assert all(0 <= e["reward"] <= 1 for e in real["eval"])
    assert list(empty_dir.iterdir()) == []


def test_plan_times_the_sampler_the_run_uses(tmp_path, empty_dir, capsys, monkeypatch):
    """[run] sampler = "cached": the probe samples through the cache (one-position steps and the
    prompt's forward timed apart), --sampler replaces it, and --execute trains with it."""
    path = write_run(tmp_path, train="update_timesteps = 2", rest="[run]\nrounds = 1\nsampler = 'cached'")
    common = ["--config", str(path), "--json", "--device", "cpu", "--cpu-threads", "1"]
    reports = {}
    for flag in ([], ["--sampler", "library"]):
        code, out, err = main_in_process(plan.main, capsys, monkeypatch, empty_dir, *common, *flag, "--probe-seconds", "5")
        reports[tuple(flag)] = report = json.loads(out)
        assert code == 0 and report["status"] == "fits" and report["time"]["rollouts"] > 0, err[-2000:]
    cached, library = reports[()], reports[("--sampler", "library")]
    assert cached["sampler"] == cached["probe"]["sampler"] == "cached" and library["sampler"] == "library"
    steps, prefill = cached["probe"]["sampling_step_s"], cached["probe"]["prefill_s"]
    assert [n for n, _ in steps] == [n + 1 for n, _ in prefill]  # the step after each timed prompt
    assert "prefill_s" not in library["probe"]
    code, out, err = main_in_process(plan.main, capsys, monkeypatch, empty_dir, *common, "--execute")
    assert code == 0 and json.loads(out)["sampler"] == "cached", err[-2000:]


# --- the docs ------------------------------------------------------------------------------------------

@pytest.mark.slow  # starts a process: not in the quick tier
def test_the_docs_key_table_is_the_parsers():
    """workflows.md#plan-a-run's table names every table and every key of the skill's own
    (run_config.OWN_KEYS), and states each default of OWN_DEFAULTS."""
    doc = WORKFLOWS.read_text(encoding="utf-8").split("\n## Plan a run\n", 1)[1]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in doc.splitlines()
            if line.startswith("| `[")]
    documented = {(r[0].strip("`[]"), k.strip("` ")) for r in rows for k in r[1].split(",")}
    own = {(section, key) for section, keys in run_config.OWN_KEYS.items() for key in keys}
    assert own <= documented, own - documented
    assert {s for s, _ in documented} == set(run_config.SECTIONS)
    for (section, key), value in run_config.OWN_DEFAULTS.items():
        row = next(r for r in rows if r[0] == f"`[{section}]`" and r[1] == f"`{key}`")
        assert re.search(rf"\(default {value}\)", row[2]), row
    proc = run([sys.executable, str(PLAN), "--help"], REPO)
    for section in run_config.SECTIONS:
        assert f"[{section}]" in proc.stdout
    for (section, key), value in run_config.OWN_DEFAULTS.items():
        if section == "eval":
            assert f"{key} (" in proc.stdout and f"default {value}" in proc.stdout


@pytest.mark.parametrize("override, says", [
    ("trainer.actor_lr=0", "config [trainer] actor_lr: must be above 0, got 0"),
    ("trainer.actor_lr=-1e-3", "config [trainer] actor_lr: must be above 0"),
    ("trainer.grpo_num_times_sample_rewards=-1", "config [trainer] grpo_num_times_sample_rewards: must be at least 0"),
    ("train.temperature=0", "config [train] temperature: must be above 0, got 0 (the library clamps it"),
])
def test_numbers_the_library_takes_without_a_clear_refusal_are_refused_first(tmp_path, override, says):
    """An lr of 0 was an empty AssertionError, a sample count of -1 a reshape error in round 1 (exit
    1, a run directory left), a temperature of 0 greedy sampling without a word (the new-user tryout)."""
    assert error_of(write_run(tmp_path), override).startswith(says)
