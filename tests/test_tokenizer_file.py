"""A real tokenizer end to end (issue 35 item 2): ``[tokenizer] file = "tokenizer.json"`` in the
reward model's config and the policy's, a BPE tokenizer trained here (no download), and its
faults (issue 38 item 4): a damaged file, a vocabulary above num_tokens, an unknown eos, two
tokenizers at once, a policy reading another tokenizer than its reward model's."""
from __future__ import annotations

import json

import pytest

import probe_kit
from conftest import REPO, main_in_process, one_error_line
from data_kit import tokenizer_file
from reward_modeling import reward_run
from skill_runtime import exits

EXAMPLE = REPO / "sub-skills" / "reward-modeling" / "assets" / "preferences"
TINY = [f"palm.{k}={v}" for k, v in probe_kit.TINY_PALM.items() if k != "num_tokens"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE tokenizer.json of 300 tokens trained on the worked example's pairs, with
    the special tokens <unk> and <eos>: its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    texts = [t for line in (EXAMPLE / "pairs.jsonl").read_text().splitlines()[:600]
             for t in json.loads(line).values()]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_ids_are_the_files_plus_one_and_decode_back(bpe):
    tok = tokenizer_file.TokenizerFile(str(bpe), "k")
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(str(bpe))
    assert tok.vocab_size == raw.get_vocab_size() + 1 == 301
    ids = tok(["green garden", "", "c1774v2q3 stone"])
    assert tok.dropped_empty == 1 and ids.shape[0] == 2 and ids.dtype.is_floating_point is False
    first = raw.encode("green garden", add_special_tokens=False).ids
    assert ids[0, :len(first)].tolist() == [i + 1 for i in first] and set(ids[0, len(first):].tolist()) <= {0}
    assert tok.decode(ids[0]) == "green garden" and tok.decode(ids[1]) == "c1774v2q3 stone"
    assert tok.eos_id("<eos>", "k") == raw.token_to_id("<eos>") + 1


@pytest.mark.parametrize("fault, says", [
    ("missing", "nothing.json: no such file"),
    ("damaged", "not a tokenizer.json that Hugging Face tokenizers reads"),
    ("small", "config [palm] num_tokens = 257: below the 301 ids of [tokenizer] file"),
    ("eos", "config [tokenizer] eos = '</s>': "),
    ("two", "config [prompts] tokenizer: give one tokenizer, [tokenizer] file or [prompts] tokenizer"),
    ("no file", "config [tokenizer] file: missing"),
])
def test_a_bad_tokenizer_is_one_line_exit_2(fault, says, bpe, tmp_path, monkeypatch, capsys):
    from policy_optimization.run import cases
    from train_run import main
    config = cases.write(cases.HEALTHY, tmp_path / "config")
    path = {"missing": tmp_path / "nothing.json", "damaged": tmp_path / "cut.json"}.get(fault, bpe)
    (tmp_path / "cut.json").write_text(bpe.read_text()[:500])
    table = {"no file": 'eos = "<eos>"\n', "eos": f'file = "{path}"\neos = "</s>"\n'}.get(fault, f'file = "{path}"\n')
    text = config.read_text() + f"\n[tokenizer]\n{table}"
    if fault != "small":
        text = text.replace("num_tokens = 257", "num_tokens = 301")
    if fault == "two":
        (tmp_path / "config" / "tok.py").write_text("def tokenize(texts):\n    return None\n")
        text = text.replace('file = "prompts.txt"', 'file = "prompts.txt"\ntokenizer = "tok.py:tokenize"')
    config.write_text(text)
    code, _, err = main_in_process(main, capsys, monkeypatch, tmp_path, "--config", str(config), "--run-dir", "run",
                                   "--device", "cpu")
    line = one_error_line(err)
    assert code == 2 and says in line, line
    assert not (tmp_path / "run").exists()


def test_train_reward_train_and_evaluate_read_one_tokenizer_json(bpe, tmp_path, monkeypatch, capsys):
    """The worked example's pairs through the BPE file: train-reward records the tokenizer beside
    rm.pt; the policy reads the same file (its eos wired as [train] eos_token) and evaluate decodes
    with it; a policy on the byte tokenizer is refused against that reward model."""
    (tmp_path / "pairs.jsonl").write_text("\n".join((EXAMPLE / "pairs.jsonl").read_text().splitlines()[:300]) + "\n")
    rm = tmp_path / "rm.toml"
    rm.write_text((EXAMPLE / "rm.toml").read_text().replace("num_tokens = 257", "num_tokens = 301")
                  + f'\n[tokenizer]\nfile = "{bpe}"\n')
    _, summary = reward_run.train_to_end(str(rm), tmp_path / "rm", "cpu", TINY + ["train.epochs=1"])
    assert summary["status"] == "finished", summary["verdict"]
    record = json.loads((tmp_path / "rm" / "rm_config.json").read_text())["tokenizer"]
    assert record == {"kind": "file", "file": str(bpe), "sha256": tokenizer_file.TokenizerFile(str(bpe), "k").sha256}
    policy = tmp_path / "policy.toml"
    text = (EXAMPLE / "policy.toml").read_text().replace("num_tokens = 257", "num_tokens = 301")
    text = text.replace('checkpoint = "../../../../runs/rm/rm.pt"', f'checkpoint = "{tmp_path / "rm" / "rm.pt"}"')
    text = text.replace('file = "prompts.txt"', f'file = "{EXAMPLE / "prompts.txt"}"')
    text = text.replace('prompts_file = "held_out.txt"', f'prompts_file = "{EXAMPLE / "held_out.txt"}"')
    text = text.replace('text_metric = "rater.py:digit_share"', f'text_metric = "{EXAMPLE / "rater.py"}:digit_share"')
    policy.write_text(text + f'\n[tokenizer]\nfile = "{bpe}"\neos = "<eos>"\n')
    from evaluate_run import main as evaluate_main
    from train_run import main as train_main
    code, _, err = main_in_process(train_main, capsys, monkeypatch, tmp_path, "--config", str(policy), "--run-dir", "run",
                                   "--device", "cpu", "--set", "run.rounds=2", "--set", "eval.every=1")
    assert code == 0, err[-2000:]
    stored = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert stored["config"]["tokenizer"]["file"] == str(bpe)
    code, out, err = main_in_process(evaluate_main, capsys, monkeypatch, tmp_path, "--run-dir", "run", "--json",
                                     "--device", "cpu")
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert all(isinstance(s["prompt"], str) and s["prompt"] in (EXAMPLE / "held_out.txt").read_text()
               for s in report["policy"]["samples"]), "decoded with the BPE file"
    policy.write_text(text.replace("num_tokens = 301", "num_tokens = 257"))  # the byte tokenizer, against that model
    code, _, err = main_in_process(train_main, capsys, monkeypatch, tmp_path, "--config", str(policy), "--run-dir",
                                   "run2", "--device", "cpu")
    line = one_error_line(err)
    assert code == 2 and "the reward model was trained with tokenizer.json" in line and "the byte tokenizer" in line, line


def test_the_eos_of_the_file_is_the_runs_eos_token(bpe, tmp_path):
    from policy_optimization import run_config
    from policy_optimization.run import cases
    config = cases.write(cases.HEALTHY, tmp_path / "config")
    config.write_text(config.read_text().replace("num_tokens = 257", "num_tokens = 301")
                      + f'\n[tokenizer]\nfile = "{bpe}"\neos = "<eos>"\n')
    resolved = run_config.check_against_library(run_config.FORM.load(str(config)))
    eos = resolved["tokenizer_file"].eos_id("<eos>", "k")
    assert resolved["train"]["eos_token"] == resolved["effective"]["train"]["eos_token"] == eos
    with pytest.raises(exits.SkillError, match="give one of them"):
        run_config.check_against_library(run_config.FORM.load(str(config), ["train.eos_token=3"]))
