"""scripts/data_kit: the field's preference layouts (TRL's dataset formats) read from every file kind
(JSONL, JSON, CSV, Parquet, a datasets save_to_disk folder), prompts with their groups, bad data as
one line naming the file, the row and the fix (issue 35 items 1 and 5), and every input checked
before work starts (issue 38 items 1, 3 and 4): encodings, lengths, held-out counts, memory, an
accuracy over zero pairs."""
from __future__ import annotations

import builtins
import json
import shutil

import pytest

import probe_kit
from conftest import REPO, main_in_process, one_error_line
from data_kit import layouts, sizes, tables
from reward_modeling import reward_run
from run_kit import rundir, watch
from watch_run import LAYOUTS
from skill_runtime import exits

EXAMPLE = REPO / "sub-skills" / "reward-modeling" / "assets" / "preferences"
TRAIN_REWARD = REPO / "sub-skills" / "reward-modeling" / "scripts" / "train_reward.py"
PREFERENCES = REPO / "sub-skills" / "reward-modeling" / "references" / "preferences.md"
INPUTS = REPO / "sub-skills" / "policy-optimization" / "references" / "inputs.md"
TINY = [f"palm.{k}={v}" for k, v in probe_kit.TINY_PALM.items() if k != "num_tokens"] + ["train.lr=3e-3", "train.epochs=1"]

HH = {"chosen": "\n\nHuman: What color is the sky?\n\nAssistant: It is blue.",
      "rejected": "\n\nHuman: What color is the sky?\n\nAssistant: It is green."}
MESSAGES = {"prompt": [{"role": "user", "content": "What color is the sky?"}],
            "chosen": [{"role": "assistant", "content": "It is blue."}],
            "rejected": [{"role": "assistant", "content": "It is green."}]}
WANT = ("\n\nHuman: What color is the sky?\n\nAssistant:", " It is blue.", " It is green.")


def pairs_of(rows, **options) -> list[tuple[str, str, str]]:
    table = tables.Table("f.jsonl", "jsonl", rows, [f"line {i}" for i in range(1, len(rows) + 1)])
    pairs, _ = layouts.pairs_of(table, layouts.Options(**options), "config [data] pairs")
    return [(p.prompt, p.chosen, p.rejected) for p in pairs]


def refused(rows, **options) -> str:
    with pytest.raises(exits.SkillError) as caught:
        pairs_of(rows, **options)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    return str(caught.value)


# --- the layouts -------------------------------------------------------------------------------------

def test_each_layout_reads_as_the_same_pair():
    """Explicit text, HH-RLHF's implicit text, conversational explicit and implicit: one pair, the
    default template writing conversations as HH-RLHF does."""
    implicit_messages = {"chosen": MESSAGES["prompt"] + MESSAGES["chosen"],
                         "rejected": MESSAGES["prompt"] + MESSAGES["rejected"]}
    explicit = {"prompt": WANT[0], "chosen": WANT[1], "rejected": WANT[2]}
    for row, layout in ((explicit, "explicit"), (HH, "implicit"), (MESSAGES, "conversational"),
                        (implicit_messages, "conversational_implicit")):
        assert layouts.row_layout(row, layouts.Options()) == layout
        assert pairs_of([row]) == [WANT], layout


def test_the_implicit_prompt_is_cut_at_a_turn_or_as_trl_at_a_character():
    """TRL's extract_prompt cuts at the first differing character, the space before it going to
    the responses; the default cut goes back to the end of the last assistant marker."""
    sky = {"chosen": "The sky is blue.", "rejected": "The sky is green."}
    assert pairs_of([sky]) == [("The sky is", " blue.", " green.")]  # no marker: TRL's cut
    assert pairs_of([HH], cut="character") == [(WANT[0] + " It is", " blue.", " green.")]
    two_turns = {k: "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: sky?\n\nAssistant: It is " + c
                 for k, c in (("chosen", "blue"), ("rejected", "green"))}
    assert pairs_of([two_turns])[0][0].endswith("\n\nHuman: sky?\n\nAssistant:")


@pytest.mark.parametrize("rows, options, message", [
    ([{"chosen": "abc", "rejected": "xyz"}], {}, "line 1: chosen and rejected share no beginning"),
    ([{"chosen": "abc", "rejected": "abcdef"}], {"cut": "character"}, "line 1: chosen is the beginning of the other"),
    ([{"prompt": "p", "chosen": "a", "rejected": "b"}, HH], {}, "line 2: an implicit-prompt pair"),
    ([HH], {"format": "explicit"}, "line 1: an implicit-prompt pair ({\"chosen\", \"rejected\"} texts), but [data] "
                                   "format = 'explicit'"),
    ([{**MESSAGES, "chosen": []}], {}, "line 1: chosen is an empty conversation"),
    ([{**MESSAGES, "prompt": [{"role": "assistant", "content": "hi"}]}], {}, "roles assistant -> assistant"),
    ([{**MESSAGES, "prompt": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}]}], {},
     "roles user -> system -> assistant"),
    ([{**MESSAGES, "chosen": [{"role": "tool", "content": "x"}]}], {}, "chosen message 1: role 'tool'"),
    ([{**MESSAGES, "chosen": MESSAGES["rejected"]}], {}, "line 1: chosen and rejected are the same text"),
    ([{"chosen": MESSAGES["prompt"], "rejected": MESSAGES["prompt"] + MESSAGES["chosen"]}], {},
     "line 1: chosen is the beginning of the other conversation"),
    ([{"prompt": "p", "chosen": 3, "rejected": "x"}], {}, "line 1: chosen must be a string (or a list of messages)"),
])
def test_bad_rows_are_one_line_naming_the_row_and_the_fix(rows, options, message):
    assert message in refused(rows, **options)


def test_a_template_of_your_own_and_its_checks():
    template = layouts.check_template({"user": "<u>{content}</u>", "assistant": "<a>{content}</a>",
                                       "generation": "<a>"}, "config [data] template")
    assert pairs_of([MESSAGES], template=template) == [("<u>What color is the sky?</u><a>", "It is blue.</a>",
                                                        "It is green.</a>")]
    for bad, message in (({"user": "no field"}, "must hold {content} once"),
                         ({"generation": "<x>"}, "must begin with generation"), ({"tool": "{content}"}, "unknown key")):
        with pytest.raises(exits.SkillError, match="config \\[data\\] template"):
            layouts.check_template(bad, "config [data] template")
        with pytest.raises(exits.SkillError, match=message):
            layouts.check_template(bad, "config [data] template")


# --- the file kinds ----------------------------------------------------------------------------------

ROWS = [{"prompt": f"p{i}", "chosen": f"good {i}", "rejected": f"bad {i}", "group": "ab"[i % 2]} for i in range(12)]


def write_every_kind(folder, rows=ROWS) -> dict[str, str]:
    """``rows`` as JSONL, a JSON array, a JSON object of columns, CSV, Parquet and a datasets folder
    (a DatasetDict with train and test)."""
    import datasets
    import pyarrow
    import pyarrow.parquet
    import csv
    folder.mkdir(exist_ok=True)
    paths = {kind: folder / name for kind, name in (("jsonl", "p.jsonl"), ("json", "p.json"), ("columns", "c.json"),
                                                      ("csv", "p.csv"), ("parquet", "p.parquet"), ("datasets", "ds"))}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["json"].write_text(json.dumps(rows))
    paths["columns"].write_text(json.dumps({k: [r[k] for r in rows] for k in rows[0]}))
    with paths["csv"].open("w", newline="") as stream:
        writer = csv.DictWriter(stream, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), paths["parquet"])
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:3])}).save_to_disk(str(paths["datasets"]))
    return {k: str(v) for k, v in paths.items()}


def test_every_file_kind_reads_the_same_pairs_and_groups(tmp_path):
    home = set(tmp_path.iterdir())
    paths = write_every_kind(tmp_path / "data")
    want = [(r["prompt"], r["chosen"], r["rejected"]) for r in ROWS]
    for kind, path in paths.items():
        pairs, layout = layouts.read_pairs(path, "config [data] pairs", layouts.Options())
        assert layout == "explicit" and [(p.prompt, p.chosen, p.rejected) for p in pairs] == want, kind
        assert [p.group for p in pairs] == [r["group"] for r in ROWS], kind
    test, _ = layouts.read_pairs(paths["datasets"], "k", layouts.Options(), prefer="test")
    assert [p.prompt for p in test] == ["p0", "p1", "p2"]
    place = layouts.read_pairs(paths["datasets"], "k", layouts.Options())[0][4].place
    assert place == f"k: {paths['datasets']} (split train) row 5"
    assert layouts.read_pairs(paths["csv"], "k", layouts.Options())[0][4].place == f"k: {paths['csv']} line 6"
    assert set(tmp_path.iterdir()) == home | {tmp_path / "data"}, "reading wrote something beside the data"


def test_a_utf8_byte_order_mark_is_read_in_jsonl_csv_and_text(tmp_path):
    for name, text in (("p.jsonl", json.dumps(ROWS[0]) + "\n"), ("p.csv", "prompt,chosen,rejected\np,a,b\n")):
        (tmp_path / name).write_text(text, encoding="utf-8-sig")
        assert layouts.read_pairs(str(tmp_path / name), "k", layouts.Options())[0][0].prompt in ("p", "p0")
    (tmp_path / "p.txt").write_text("first\nsecond\n", encoding="utf-8-sig")
    assert layouts.read_prompts(str(tmp_path / "p.txt"), "k") == (["first", "second"], [None, None])


def damage(tmp_path, case: str) -> tuple[str, dict]:
    """A damaged input of ``case``: (path, read_pairs keyword arguments)."""
    paths = write_every_kind(tmp_path / "data")
    if case == "truncated parquet":
        data = open(paths["parquet"], "rb").read()
        open(paths["parquet"], "wb").write(data[:len(data) // 2])
        return paths["parquet"], {}
    if case == "a datasets folder without the split":
        return paths["datasets"], {"split": "validation", "split_key": "[data] split"}
    if case == "a folder that is not a datasets folder":
        (tmp_path / "plain").mkdir()
        return str(tmp_path / "plain"), {}
    if case == "a datasets folder with its data cut":
        arrow = next((tmp_path / "data" / "ds" / "train").glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:100])
        return paths["datasets"], {}
    if case == "a CSV with a missing column":
        (tmp_path / "m.csv").write_text("prompt,chosen\np,a\n")
        return str(tmp_path / "m.csv"), {}
    if case == "a CSV row with a field too many":
        (tmp_path / "m.csv").write_text("prompt,chosen,rejected\np,a,b\np,a,b,c\n")
        return str(tmp_path / "m.csv"), {}
    if case == "JSON cut short":
        (tmp_path / "m.json").write_text(json.dumps(ROWS)[:-20])
        return str(tmp_path / "m.json"), {}
    if case == "UTF-16":
        (tmp_path / "m.jsonl").write_bytes(json.dumps(ROWS[0]).encode("utf-16"))
        return str(tmp_path / "m.jsonl"), {}
    if case == "UTF-16 without a mark":
        (tmp_path / "m.jsonl").write_bytes(json.dumps(ROWS[0]).encode("utf-16-le"))
        return str(tmp_path / "m.jsonl"), {}
    if case == "Latin-1":
        (tmp_path / "m.jsonl").write_bytes(json.dumps({**ROWS[0], "chosen": "caf\u00e9"}, ensure_ascii=False)
                                           .encode("latin-1"))
        return str(tmp_path / "m.jsonl"), {}
    raise AssertionError(case)


FAULTS = {"truncated parquet": "not a readable Parquet file", "a datasets folder without the split":
          "no split 'validation'; its splits are train, test: set [data] split to one",
          "a folder that is not a datasets folder": "not a datasets save_to_disk folder",
          "a datasets folder with its data cut": "not a readable datasets folder",
          "a CSV with a missing column": "line 2: missing column 'rejected' (a row has prompt, chosen, rejected; the "
                                         "file's columns: prompt, chosen",
          "a CSV row with a field too many": "line 3: 4 fields, the header has 3",
          "JSON cut short": "not JSON (", "UTF-16": "encoded as UTF-16 LE (its byte-order mark): save it as UTF-8",
          "UTF-16 without a mark": "encoded as UTF-16 LE without a byte-order mark",
          "Latin-1": "not UTF-8: byte 0xe9 at line 1 (Latin-1 or Windows-1252"}


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_damaged_input_of_each_kind_is_one_line_exit_2(tmp_path, case):
    path, kwargs = damage(tmp_path, case)
    with pytest.raises(exits.SkillError) as caught:
        layouts.read_pairs(path, "config [data] pairs", layouts.Options(), **kwargs)
    text = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in text and text.startswith(f"config [data] pairs: {path}")
    assert FAULTS[case] in text, text


@pytest.mark.parametrize("module", ["pyarrow.parquet", "datasets"])
def test_without_the_hf_extra_parquet_and_folders_name_it(tmp_path, monkeypatch, module):
    paths = write_every_kind(tmp_path / "data")
    real = builtins.__import__

    def without(name, *args, **kwargs):
        if name.split(".")[0] in ("pyarrow", "datasets"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without)
    path = paths["parquet" if module == "pyarrow.parquet" else "datasets"]
    with pytest.raises(exits.SkillError, match="pip install 'palm-rlhf-skill\\[hf\\]'") as caught:
        layouts.read_pairs(path, "config [data] pairs", layouts.Options())
    assert caught.value.exit_code == 2 and f"reading it needs {module.split('.')[0]}" in str(caught.value)
    assert layouts.read_pairs(paths["jsonl"], "k", layouts.Options())[0]  # the standard library's kinds need nothing


def test_columns_map_a_files_own_names(tmp_path):
    (tmp_path / "q.csv").write_text("question,good,bad,kind\nq,a,b,x\n")
    options = layouts.Options(columns=layouts.check_columns({"prompt": "question", "chosen": "good", "rejected": "bad",
                                                             "group": "kind"}, "config [data] columns"))
    pair = layouts.read_pairs(str(tmp_path / "q.csv"), "k", options)[0][0]
    assert (pair.prompt, pair.chosen, pair.rejected, pair.group) == ("q", "a", "b", "x")
    with pytest.raises(exits.SkillError, match="unknown key 'answer'"):
        layouts.check_columns({"answer": "a"}, "config [data] columns")


# --- prompts -----------------------------------------------------------------------------------------

def test_prompts_with_their_groups_from_text_tables_and_pairs(tmp_path):
    paths = write_every_kind(tmp_path / "data")
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert layouts.read_prompts(str(tmp_path / "p.txt"), "k") == (["one", "two"], [None, None])
    twice = tmp_path / "twice.jsonl"  # a pair file repeats a prompt per pair: each prompt once
    twice.write_text("".join(json.dumps(r) + "\n" for r in ROWS + ROWS))
    assert layouts.read_prompts(str(twice), "k") == ([r["prompt"] for r in ROWS], [r["group"] for r in ROWS])
    assert layouts.read_prompts(paths["parquet"], "k")[0] == [r["prompt"] for r in ROWS]
    table = tmp_path / "prompts.jsonl"
    table.write_text(json.dumps({"prompt": "a", "kind": "x"}) + "\n" + json.dumps({"prompt": MESSAGES["prompt"]}) + "\n")
    texts, groups = layouts.read_prompts(str(table), "k", layouts.Options(columns={"group": "kind"}))
    assert texts == ["a", WANT[0]] and groups == ["x", None]
    hh = tmp_path / "hh.jsonl"
    hh.write_text(json.dumps(HH) + "\n")
    assert layouts.read_prompts(str(hh), "k") == ([WANT[0]], [None])
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
    with pytest.raises(exits.SkillError, match="bad.jsonl line 1: the prompt column 'prompt' is missing"):
        layouts.read_prompts(str(tmp_path / "bad.jsonl"), "k")


# --- sizes -------------------------------------------------------------------------------------------

def test_the_longest_row_is_named_with_its_length_the_limit_and_the_option():
    with pytest.raises(exits.SkillError) as caught:
        sizes.check_length([3, 9, 12, 4], ["line 1", "line 2", "line 3", "line 4"], 8, "k", "raise it")
    assert str(caught.value) == "k: line 3: 12 tokens, above the limit of 8 (2 of 4 rows are over it): raise it"
    sizes.check_length([3, 8], ["a", "b"], 8, "k", "x")
    assert sizes.attention_bytes(2, 10, 4, 3, True) == 100 + 4 * 2 * 4 * 100 * 4
    assert sizes.attention_bytes(2, 10, 4, 3, False) == 100 + 2 * 2 * 4 * 100 * 4
    with pytest.raises(exits.SkillError, match="needs at least 2 MiB for attention alone, 1 MiB are available"):
        sizes.check_memory(2 * 2**20, 2**20, "k", "a step", "smaller")


# --- train-reward: each case of issue 38, and the layouts end to end ----------------------------------

def cli(tmp_path, capsys, monkeypatch, *argv):
    from train_reward import main
    return main_in_process(main, capsys, monkeypatch, tmp_path, *argv, "--device", "cpu", prog=TRAIN_REWARD)


def example_rows(count: int) -> list[dict]:
    return [json.loads(line) for line in (EXAMPLE / "pairs.jsonl").read_text().splitlines()[:count]]


def rm_config(tmp_path, data: str) -> str:
    config = tmp_path / "rm.toml"
    text = (EXAMPLE / "rm.toml").read_text().replace('pairs = "pairs.jsonl"', data)
    config.write_text(text.replace("held_out_fraction = 0.1", "") if "held_out =" in data else text)
    return str(config)


def test_a_jsonl_with_a_byte_order_mark_trains(tmp_path):
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in example_rows(200)), encoding="utf-8-sig")
    _, summary = reward_run.train_to_end(rm_config(tmp_path, 'pairs = "pairs.jsonl"'), tmp_path / "run", "cpu", TINY)
    assert summary["status"] == "finished" and summary["examples"]["train"] == 180


def test_three_pairs_are_refused_naming_the_numbers_and_the_option(tmp_path, capsys, monkeypatch):
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in example_rows(3)))
    code, out, err = cli(tmp_path, capsys, monkeypatch, "--config", rm_config(tmp_path, 'pairs = "pairs.jsonl"'),
                         "--run-dir", "run")
    line = one_error_line(err)
    assert code == 2 and out == "" and not (tmp_path / "run").exists()
    assert "held_out_fraction = 0.1 of 3 rows holds out 1, fewer than min_held_out = 10" in line, line


def test_one_long_prompt_is_refused_before_any_tensor(tmp_path, capsys, monkeypatch):
    """Issue 38: one 200 kB prompt among 200 pairs tried to allocate 31 GB. Refused by its length
    (the limit, [data] max_length), and with the limit raised by the memory estimate, before the
    model is built; [data] truncate fits it instead."""
    rows = example_rows(200)
    rows[17] = {**rows[17], "prompt": "x" * 200_000}
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = rm_config(tmp_path, 'pairs = "pairs.jsonl"')
    built = []
    monkeypatch.setattr(reward_run.RewardRun, "_build", classmethod(lambda cls, *a: built.append(a) or 1 / 0))
    code, _, err = cli(tmp_path, capsys, monkeypatch, "--config", config, "--run-dir", "run")
    line = one_error_line(err)
    assert code == 2 and f"config [data] pairs: {tmp_path / 'pairs.jsonl'} line 18: 200,0" in line, line
    assert "tokens, above the limit of 2,048 (1 of 200 rows are over it): raise [data] max_length, or set [data] " \
           "truncate = true" in line and not built
    monkeypatch.undo()
    code, _, err = cli(tmp_path, capsys, monkeypatch, "--config", config, "--run-dir", "run", "--set",
                       "data.max_length=300000")
    line = one_error_line(err)
    assert code == 2 and "a training step of 64 sequences of 200,0" in line and "MiB for attention alone" in line, line
    assert "not started" in line and not (tmp_path / "run").exists()


def test_truncate_keeps_the_end_of_the_prompt_and_the_responses(tmp_path):
    rows = example_rows(200)
    rows[5] = {**rows[5], "prompt": "y" * 500 + rows[5]["prompt"]}
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepared = reward_run.prepare(rm_config(tmp_path, 'pairs = "pairs.jsonl"\nmax_length = 64\ntruncate = true'),
                                  tmp_path / "run", False, False, TINY, reward_run.Options(progress=False,
                                                                                          say=lambda line: None))
    every = prepared.train.lengths() + prepared.held_out.lengths()
    assert max(every) <= 64 and len(every) == 200
    prepared.claim.refused()


@pytest.mark.parametrize("layout", ["implicit", "conversational"])
def test_train_reward_learns_from_hh_and_conversational_layouts(tmp_path, layout):
    """The example's pairs rewritten as HH-RLHF text (JSONL) or as conversations (Parquet): the
    reward model learns them as it does the explicit layout."""
    import pyarrow
    import pyarrow.parquet
    rows = example_rows(600)
    if layout == "implicit":
        data = [{k: f"\n\nHuman: {r['prompt']}\n\nAssistant: {r[k]}" for k in ("chosen", "rejected")} for r in rows]
        path = tmp_path / "hh.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    else:
        data = [{"prompt": [{"role": "user", "content": r["prompt"]}],
                 **{k: [{"role": "assistant", "content": r[k]}] for k in ("chosen", "rejected")}} for r in rows]
        path = tmp_path / "c.parquet"
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(data), path)
    _, summary = reward_run.train_to_end(rm_config(tmp_path, f'pairs = "{path.name}"'), tmp_path / "run", "cpu",
                                         [*TINY, "train.epochs=3"])
    assert summary["status"] == "finished" and summary["examples"]["train"] == 540
    assert summary["held_out"]["after"] > 0.75, summary["held_out"]


def test_an_accuracy_over_zero_pairs_is_n_a_with_its_reason(tmp_path, capsys, monkeypatch):
    """Held-out ratings that all agree leave no pair to rank: rows, summary, verdict and watch say
    n/a with the reason, and no verdict on learning is drawn."""
    rows = example_rows(60)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "response": r["chosen"],
                                                          "rating": i % 3}) + "\n" for i, r in enumerate(rows[:40])))
    (tmp_path / "h.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "response": r["chosen"],
                                                          "rating": 1}) + "\n" for r in rows[40:]))
    config = rm_config(tmp_path, 'ratings = "r.jsonl"\nheld_out = "h.jsonl"')
    run, summary = reward_run.train_to_end(config, tmp_path / "run", "cpu", TINY)
    metrics = rundir.read_rows(run.run.metrics)
    assert all(r["held_out_accuracy"] is None and r["held_out_pairs"] == 0 for r in metrics)
    assert summary["held_out"]["reason"].startswith("0 held-out pairs: the 20 held-out rows share one rating")
    assert "held-out accuracy n/a (0 held-out pairs" in summary["verdict"] and "NOT LEARNING" not in summary["verdict"]
    assert "no verdict on learning" in summary["verdict"]
    text = watch.text(watch.view(run.run.path, LAYOUTS), LAYOUTS)
    assert "n/a" in text.splitlines()[2] and "held-out accuracy n/a (0 held-out pairs" in text.splitlines()[-1]


# --- train and evaluate take the same files ------------------------------------------------------------

def test_train_takes_pairs_as_its_prompts_and_names_a_long_one(tmp_path, capsys, monkeypatch):
    """[prompts] file and [eval] prompts_file given preference pairs (HH layout, a datasets
    folder): the prompt parts; a prompt too long for max_seq_len is refused before the build,
    naming its file and line."""
    from policy_optimization import builder, run_config
    from policy_optimization.run import cases
    folder = tmp_path / "cfg"
    cases.write(cases.HEALTHY, folder)
    write_every_kind(tmp_path / "data")
    hh = folder / "hh.jsonl"
    hh.write_text("".join(json.dumps({k: f"\n\nHuman: {p}\n\nAssistant: {c}" for k, c in (("chosen", "a"),
                                                                                          ("rejected", "b"))}) + "\n"
                          for p in ("ab", "cd", "ef")))
    sets = [f"prompts.file={hh}", f"eval.prompts_file={tmp_path / 'data' / 'ds'}", "train.max_seq_len=64"]
    resolved = run_config.check_against_library(run_config.FORM.load(str(folder / "run.toml"), sets))
    texts, groups, _ = builder.prompt_texts(resolved, "prompts")
    assert texts == [f"\n\nHuman: {p}\n\nAssistant:" for p in ("ab", "cd", "ef")] and groups == [None] * 3
    assert builder.prompt_texts(resolved, "eval")[:2] == (["p0", "p1", "p2"], ["a", "b", "a"])  # its test split
    builder.check_prompt_files(resolved)
    long = folder / "long.txt"
    long.write_text("ab\n" + "x" * 5000 + "\n")
    from train_run import main as train_main
    code, _, err = main_in_process(train_main, capsys, monkeypatch, tmp_path, "--config", str(folder / "run.toml"),
                                   "--run-dir", "run", "--device", "cpu", "--set", f"prompts.file={long}")
    line = [x for x in err.splitlines() if " error: " in x][-1]
    assert code == 2 and f"config [prompts] file: {long} line 2: 5,000 tokens, above the limit of" in line, line
    assert "[train] max_seq_len (now " in line and not (tmp_path / "run").exists()


# --- the docs ----------------------------------------------------------------------------------------

def test_preferences_shows_each_layout_in_one_line_of_json():
    """preferences.md#layouts: one line of JSON per layout, and each line reads as that layout."""
    section = PREFERENCES.read_text(encoding="utf-8").split('<a id="layouts"></a>', 1)[1].split("\n<a id=", 1)[0]
    found = {}
    for line in section.splitlines():
        if line.startswith("| `") and "`{" in line:
            name, example = line.split("|")[1].strip(" `"), line.split("`{", 1)[1].split("}`", 1)[0]
            row = json.loads("{" + example.replace("\\|", "|") + "}")
            found[name] = layouts.row_layout(row, layouts.Options())
    assert found == {name: name for name in layouts.LAYOUTS}, found


def test_the_input_audit_table_lists_each_input_with_a_test_that_exists():
    """inputs.md: every row names an input, what is checked and a test of this suite that exists;
    its stated count is its number of rows."""
    import re
    text = INPUTS.read_text(encoding="utf-8")
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| ---") and not line.startswith("| input")]
    stated = int(re.search(r"(\d+) inputs", text).group(1))
    assert stated == len(rows) and len(rows) >= 15
    for row in rows:
        for test in re.findall(r"`(tests/\w+\.py)::(\w+)`", row[-1]):
            assert (REPO / test[0]).is_file() and f"def {test[1]}(" in (REPO / test[0]).read_text(), (row[0], test)
        assert re.search(r"`tests/\w+\.py::\w+`", row[-1]), f"inputs.md: {row[0]} names no test"
    assert "(inputs.md)" in (INPUTS.parent / "run-directory.md").read_text(encoding="utf-8")
