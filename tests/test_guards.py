"""The guards against reward hacking (issue 30): the watchdog's collapse, held-out and reward-model
rules on synthetic rows (their thresholds) and on real runs, the per-prompt held-out breakdown and
the gold metric, `palm-rlhf-skill evaluate`, `train --cpu-threads auto`, and the overhead bench's
noise judgement (references/training-run.md)."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys

import pytest
import torch

from conftest import REPO, main_in_process, one_error_line, usage_error_without_torch
from policy_optimization import evaluation
from policy_optimization.run import cases, loop, metrics, overhead, threads, watchdog
from run_kit import alarms, checkpoint, rundir, trackers, watch
from watch_run import LAYOUTS

SCRIPTS = REPO / "sub-skills" / "policy-optimization" / "scripts"
EVALUATE = SCRIPTS / "evaluate_run.py"
TIMING = {"wall_s", "tokens_per_s", "peak_mib", "rss_mib"}
BROKEN = {c.expect: c for c in cases.BROKEN}


def facts(**kwargs) -> watchdog.RunFacts:
    base = dict(trainer="grpo", grouped=True, lora=False, required_steps=3, update_timesteps=4, critic_range=None,
                eval_samples=24, num_tokens=257)
    return watchdog.RunFacts(**{**base, **kwargs})


def row(round_: int, **values) -> dict:
    """A synthetic metrics row: a healthy round of 4 rollouts of 4 sequences with rewards in [0, 1]."""
    out = dict.fromkeys(metrics.ROW_KEYS)
    out.update(round=round_, rollouts=4, group_size=4, learn_calls=1, reward_mean=0.5, reward_std=0.2,
               reward_min=0.0, reward_max=1.0, zero_std_group_fraction=0.0, advantage_zero_fraction=0.0,
               advantage_abs_max=1.0, one_token_response_fraction=0.0, kl_rollout=0.0, losses={}, grad_norm=0.1,
               optimizer_steps={"actor": 0}, trainable_change_norm={}, non_finite_weights=False, rules=[])
    out.update(values)
    return out


def fired(rows: list[dict], run_facts: watchdog.RunFacts) -> dict[str, int]:
    """Rule id -> the first round it fires on, evaluating the rows in order as a run does."""
    first: dict[str, int] = {}
    for i, r in enumerate(rows):
        if r["round"] == 0:  # the baseline row: a run writes it without the watchdog
            continue
        for rule, _ in alarms.evaluate(watchdog.RULES, r, rows[:i], run_facts):
            first.setdefault(rule.id, r["round"])
    return first


# --- thresholds on synthetic rows ---------------------------------------------------------------------

def test_entropy_collapse_needs_two_rounds_below_ln2_and_a_tenth_of_the_start():
    rows = [row(1, entropy=5.5), row(2, entropy=0.5), row(3, entropy=0.05)]
    assert fired(rows, facts()).get("entropy_collapse") == 3
    assert "entropy_collapse" not in fired(rows[:2], facts()), "one round is chance"
    low_start = [row(1, entropy=0.65), row(2, entropy=0.6), row(3, entropy=0.6)]  # below ln 2 but not a tenth of it
    assert "entropy_collapse" not in fired(low_start, facts())


def test_entropy_blowup_watches_a_run_that_started_confident():
    rows = [row(1, entropy=0.5), row(2, entropy=4.3), row(3, entropy=4.5)]
    assert fired(rows, facts()).get("entropy_blowup") == 3
    assert "entropy_blowup" not in fired([row(1, entropy=5.5), row(2, entropy=5.54), row(3, entropy=5.54)], facts()), \
        "a fresh PaLM starts near ln(num_tokens): no rise, no alarm"
    assert "entropy_blowup" not in fired(rows, facts(num_tokens=50_000)), "4.5 nats is far from ln(50000)"


@pytest.mark.parametrize("values, fires", [
    ({"top_token_share": 0.6}, True), ({"distinct_bigram_fraction": 0.05}, True),
    ({"top_token_share": 0.4, "distinct_bigram_fraction": 0.5}, False)])
def test_repeated_token(values, fires):
    rows = [row(1, top_token_share=0.05, distinct_bigram_fraction=1.0), row(2, **values), row(3, **values)]
    assert ("repeated_token" in fired(rows, facts())) is fires


def evaluations(per_prompt: list[list[float]], **values) -> list[dict]:
    """Rows 0..n with one held-out evaluation each, the mean of its per-prompt values."""
    return [row(i, held_out_per_prompt=p, held_out_reward=sum(p) / len(p), held_out_std=0.2, **values)
            if i else {**dict.fromkeys(metrics.ROW_KEYS), "round": 0, "rules": [], "held_out_per_prompt": p,
                       "held_out_reward": sum(p) / len(p), "held_out_std": 0.2}
            for i, p in enumerate(per_prompt)]


def test_one_held_out_prompt_collapsing_behind_a_rising_mean():
    rows = evaluations([[0.5, 0.6, 0.5], [0.7, 0.5, 0.7], [0.95, 0.1, 0.95]])
    assert rows[2]["held_out_reward"] > rows[0]["held_out_reward"], "the mean hides it"
    assert fired(rows, facts()) == {"held_out_prompt_collapse": 2}
    noisy = evaluations([[0.5, 0.6, 0.5], [0.7, 0.5, 0.7], [0.95, 0.1, 0.95]])
    for r in noisy:
        r["held_out_std"] = 1.5  # 8 samples per prompt: a standard error of 0.53, a fall of 0.5 is noise
    assert "held_out_prompt_collapse" not in fired(noisy, facts())


def test_a_sharp_drop_in_one_evaluation():
    rows = evaluations([[0.5] * 3, [0.8] * 3, [0.3] * 3])
    assert fired(rows, facts()).get("held_out_drop") == 2
    assert "held_out_drop" not in fired(evaluations([[0.5] * 3, [0.8] * 3, [0.74] * 3]), facts())


@pytest.mark.parametrize("gain, se, coverage, fires", [
    (4.0, 0.4, True, True), (0.5, 0.4, True, False), (4.0, 0.4, False, False)])
def test_unseen_reward_ids(gain, se, coverage, fires):
    rows = [row(i, unseen_id_fraction=0.8, unseen_reward_gain=gain, unseen_reward_gain_se=se) for i in (1, 2)]
    assert ("unseen_reward_ids" in fired(rows, facts(coverage=coverage))) is fires


@pytest.mark.parametrize("gold, fires", [((0.3, 0.35, 0.1), True), ((0.3, 0.35, 0.34), False)])
def test_proxy_gold_divergence(gold, fires):
    rows = [{**r, "held_out_gold": g, "held_out_gold_std": 0.1, "held_out_gold_per_prompt": [g] * 3}
            for r, g in zip(evaluations([[0.4] * 3, [0.6] * 3, [0.8] * 3]), gold)]
    assert ("proxy_gold_divergence" in fired(rows, facts())) is fires


def test_training_prompts_running_away_from_the_held_out_ones():
    rows = evaluations([[0.5] * 3, [0.5] * 3, [0.3] * 3, [0.3] * 3])
    for r, reward in zip(rows, (None, 0.5, 0.9, 0.95)):
        r["reward_mean"] = reward
    assert fired(rows, facts()).get("train_held_out_gap") == 3, "two evaluations in a row"
    assert "train_held_out_gap" not in fired(rows[:3], facts())


# --- real runs ------------------------------------------------------------------------------------------

def train(case, tmp_path, rounds=None, **options):
    config = cases.write(case, tmp_path / "config", rounds=rounds)
    options.setdefault("say", lambda line: None)
    run_, status, _ = loop.train_to_end(str(config), tmp_path / "run", options=loop.Options(progress=False, **options))
    return run_, status


def test_a_reward_model_with_its_unseen_ids_tied_to_the_mean_is_left_alone(tmp_path):
    """The remedy of the gamed case (unseen embeddings = the seen ones' mean): the ids stay unseen,
    but swapping them for seen ids no longer lowers the score, so the rule stays silent."""
    case = dataclasses.replace(BROKEN["unseen_reward_ids"], setup="covered_reward_model")
    run_, _ = train(case, tmp_path, rounds=3)
    trained = run_.rows[1:]
    assert all(r["unseen_id_fraction"] > 0.5 for r in trained), "a fresh policy writes mostly unseen ids"
    assert all("unseen_reward_ids" not in r["rules"] for r in trained), [r["unseen_reward_gain"] for r in trained]
    gamed = BROKEN["unseen_reward_ids"]
    run_, _ = train(gamed, tmp_path / "gamed", rounds=2)
    assert run_.rows[-1]["unseen_reward_gain"] > 1.0 and "unseen_reward_ids" in run_.rows[-1]["rules"]


@pytest.fixture(scope="module")
def gold_run(tmp_path_factory):
    """The proxy-versus-gold case, 2 rounds: a run with a gold metric and three held-out prompts."""
    return train(BROKEN["proxy_gold_divergence"], tmp_path_factory.mktemp("gold"), rounds=2)[0]


def test_the_row_holds_the_held_out_prompts_and_the_gold_metric(gold_run):
    for r in gold_run.rows:
        per_prompt, gold = r["held_out_per_prompt"], r["held_out_gold_per_prompt"]
        assert len(per_prompt) == len(cases.HELD_OUT) == len(gold)
        assert math.isclose(sum(per_prompt) / 3, r["held_out_reward"], rel_tol=1e-9)
        assert math.isclose(sum(gold) / 3, r["held_out_gold"], rel_tol=1e-9) and 0 <= r["held_out_gold"] <= 1
        assert r["held_out_gold_std"] >= 0 and r["held_out_std"] >= 0
    summary = json.loads(gold_run.run.summary.read_text())["held_out"]
    assert summary["gold_before"] == gold_run.rows[0]["held_out_gold"]
    assert summary["per_prompt_after"] == gold_run.rows[-1]["held_out_per_prompt"]
    shown = watch.text(watch.view(gold_run.run.path, LAYOUTS), LAYOUTS)
    assert "gold" in shown and f"{gold_run.rows[0]['held_out_gold']:.4g}" in shown
    flat = trackers.scalars(gold_run.rows[-1])
    assert [flat[f"held_out_per_prompt/{i}"] for i in range(3)] == gold_run.rows[-1]["held_out_per_prompt"]


def test_the_gold_metric_scores_the_same_samples_as_the_reward(gold_run):
    """Scoring the held-out samples once with the reward program and once with the gold metric as
    the reward equals one evaluation with both: the same noise, the same sequences."""
    from policy_optimization import reward_programs
    gold = reward_programs.rule_reward(gold_run.resolved, anchor=False, section="eval")
    args = (gold_run.resolved, gold_run.policy_palm, gold_run.scope)
    both = evaluation.of_run(*args, gold_run.trainer.reward_model, gold_run.built.eval_prompt_ids, 5, metric=gold)
    alone = evaluation.of_run(*args, gold, gold_run.built.eval_prompt_ids, 5)
    assert both.gold_per_prompt == alone.per_prompt and both.gold_mean == alone.reward_mean


@pytest.mark.parametrize("change, says", [
    ({"metric": "gold.py:score", "text_metric": "gold.py:score"}, "give one gold metric"),
    ({"metric": "gold.py"}, "[eval] metric: expected \"file.py:callable\""),
    ({"metric": "missing.py:score"}, "[eval] metric: "),
    ({"text_metric": "gold.py:nothing"}, "has no nothing")])
def test_a_bad_gold_metric_is_one_line_exit_2(change, says, tmp_path, monkeypatch, capsys):
    import train_run
    config = cases.write(BROKEN["proxy_gold_divergence"], tmp_path / "config", rounds=1)
    text = config.read_text().replace('metric = "gold.py:score"\n', "".join(f'{k} = "{v}"\n' for k, v in change.items()))
    config.write_text(text)
    code, _, err = main_in_process(train_run.main, capsys, monkeypatch, tmp_path, "--config", str(config), "--run-dir",
                                   "run", "--device", "cpu")
    assert code == 2 and says in one_error_line(err)
    assert not (tmp_path / "run").exists()


def test_a_damaged_coverage_record_is_one_line(tmp_path, monkeypatch, capsys):
    import train_run
    config = cases.write(BROKEN["unseen_reward_ids"], tmp_path / "config", rounds=1)
    (tmp_path / "config" / "rm" / "summary.json").write_text('{"unseen_ids": "all"}')
    code, _, err = main_in_process(train_run.main, capsys, monkeypatch, tmp_path, "--config", str(config), "--run-dir",
                                   "run", "--device", "cpu")
    assert code == 2 and "unseen_ids is not a list of integer ids" in one_error_line(err)


# --- palm-rlhf-skill evaluate ---------------------------------------------------------------------------

def evaluate_main():
    import evaluate_run
    return evaluate_run.main


def test_evaluate_scores_the_initial_weights_and_the_policy_as_the_run_did(gold_run, tmp_path, monkeypatch, capsys):
    code, out, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", str(gold_run.run.path),
                                     "--json", "--device", "cpu")
    assert code == 0, err[-2000:]
    report = json.loads(out)
    for side in ("initial", "policy"):
        assert {"reward_mean", "gold_mean", "per_prompt", "samples"} <= set(report[side])
        assert len(report[side]["per_prompt"]) == 3 and len(report[side]["samples"]) == 3
        assert all(isinstance(s["response"], str) for s in report[side]["samples"])
    first, last = gold_run.rows[0], gold_run.rows[-1]
    assert report["initial"]["reward_mean"] == first["held_out_reward"], "the initial weights, rebuilt exactly"
    assert report["initial"]["gold_mean"] == first["held_out_gold"]
    assert report["policy"]["reward_mean"] == last["held_out_reward"], "policy.pt: all weights, no LoRA to merge"
    assert [p["reward"] for p in report["policy"]["per_prompt"]] == last["held_out_per_prompt"]
    assert report["policy_source"] == "policy.pt" and report["gold_metric"] == "gold.py:score"
    assert report["verdict"].startswith("evaluate: ") and sorted(p.name for p in tmp_path.iterdir()) == []


def test_evaluate_a_paused_run_from_its_checkpoint_with_other_prompts_and_metric(tmp_path, monkeypatch, capsys):
    config = cases.write(cases.HEALTHY, tmp_path / "config", rounds=4)
    loop.train_to_end(str(config), tmp_path / "run", options=loop.Options(progress=False, say=lambda line: None, until=2))
    (tmp_path / "more.txt").write_text("hello\nworld\n")
    shutil.copy(tmp_path / "config" / "reward.py", tmp_path / "gold.py")
    code, out, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", "run", "--json",
                                     "--prompts", "more.txt", "--metric", "gold.py:score", "--samples", "2",
                                     "--show", "1", "--device", "cpu")
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["policy_source"] == "checkpoint round-000002" and report["samples_per_prompt"] == 2
    assert [p["prompt"] for p in report["policy"]["per_prompt"]] == ["hello", "world"]
    assert report["policy"]["gold_mean"] == report["policy"]["reward_mean"], "the same program as gold and reward"
    assert len(report["initial"]["samples"]) == 1
    if report["policy"]["reward_mean"] > report["initial"]["reward_mean"]:  # no policy.pt yet: finish the run first
        assert report["next"].startswith(f"finish the run (palm-rlhf-skill train --resume {tmp_path / 'run'})"), report["next"]
    (tmp_path / "text_gold.py").write_text("def score(prompt, response):\n    return float(len(response))\n")
    code, _, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", "run",
                                   "--metric", "text_gold.py:score", "--device", "cpu", "--json")
    line = one_error_line(err)
    assert code == 2 and "--text-metric: prompt and response text" in line and "--force" not in line, line


@pytest.mark.parametrize("setup, argv, says", [
    ("none", [], "no such directory"),
    ("empty", [], "not a run directory"),
    ("config only", [], "no policy yet"),
    ("run", ["--metric", "gold.py"], "--metric 'gold.py': expected file.py:function"),
    ("run", ["--metric", "nowhere.py:score"], "[eval] metric: "),
    ("run", ["--prompts", "nowhere.txt"], "nowhere.txt"),
    ("file", [], "a file, not a directory"),
    ("reward run", [], "a reward model's run (train-reward)"),
])
def test_evaluate_bad_input_is_one_line_exit_2(setup, argv, says, gold_run, tmp_path, monkeypatch, capsys):
    target = tmp_path / "d"
    if setup == "empty":
        target.mkdir()
    elif setup == "config only":
        target.mkdir()
        shutil.copy(gold_run.run.config, target / rundir.CONFIG)
    elif setup == "run":
        target = gold_run.run.path
    elif setup == "file":
        target.write_text("x")
    elif setup == "reward run":  # train-reward's run_config.json: kind "reward"
        target.mkdir()
        stored = json.loads(gold_run.run.config.read_text())
        (target / rundir.CONFIG).write_text(json.dumps({**stored, "kind": "reward"}))
    code, _, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", str(target), *argv,
                                   "--device", "cpu")
    assert code == 2 and says in one_error_line(err)


def test_evaluate_help_and_usage_errors_import_no_torch(tmp_path):
    line = usage_error_without_torch(EVALUATE, [], tmp_path)
    assert "--run-dir" in line
    line = usage_error_without_torch(EVALUATE, ["--run-dir", str(tmp_path / "nothing")], tmp_path)
    assert "no such directory" in line


# --- train --cpu-threads auto ------------------------------------------------------------------------------

class Clock:
    """``time`` for threads.py: a clock that never moves, so the one-thread trial takes 0 s and wins."""
    perf_counter = staticmethod(lambda: 0.0)


def test_cpu_threads_auto_times_round_1_and_records_the_faster(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    said = []
    try:
        run_, status = train(cases.HEALTHY, tmp_path, rounds=2, cpu_threads="auto", say=said.append)
        assert torch.get_num_threads() == 2, "the caller's count is restored"
    finally:
        torch.set_num_threads(before)
    record = json.loads(run_.run.summary.read_text())["cpu_threads"]
    assert status == "finished" and record["mode"] == "auto" and record["default"] == 2
    faster = min(record["timed_s"], key=record["timed_s"].get)
    assert record["chosen"] == int(faster) and set(record["timed_s"]) == {"1", "2"}
    assert any(line.startswith("cpu threads: round 1 took") for line in said), said
    state = checkpoint.read_state(checkpoint.latest(run_.run))
    assert state["cpu_threads"]["chosen"] == record["chosen"], "a resume reads it from the checkpoint"


def test_a_resume_with_auto_threads_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "time", Clock)  # the trial always finds one thread faster
    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config = cases.write(dataclasses.replace(cases.HEALTHY, rounds=4), tmp_path / "cfg")

        def run_to(run_dir, until=None, resume=False):
            options = loop.Options(progress=False, say=lambda line: None, cpu_threads="auto", until=until)
            return loop.train_to_end(None if resume else str(config), run_dir, options=options, resume=resume)[0]

        whole = run_to(tmp_path / "whole")
        run_to(tmp_path / "split", until=2)
        torch.set_num_threads(2)
        resumed = run_to(tmp_path / "split", resume=True)
    finally:
        torch.set_num_threads(before)
    assert whole.threads["chosen"] == 1 and resumed.threads["mode"] == "resumed" and resumed.threads["chosen"] == 1
    a, b = whole.trainer.state_dict(), resumed.trainer.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [[{k: v for k, v in r.items() if k not in TIMING} for r in rundir.read_rows(p / "metrics.jsonl")]
            for p in (tmp_path / "whole", tmp_path / "split")]
    assert rows[0] == rows[1]


def test_cpu_threads_refuses_anything_but_auto_or_a_count(tmp_path):
    line = usage_error_without_torch(SCRIPTS / "train_run.py", ["--config", "x.toml", "--run-dir", "d",
                                                                "--cpu-threads", "0"], tmp_path)
    assert "--cpu-threads: expected auto or a whole number of at least 1, got '0'" in line


# --- bench --train-overhead ---------------------------------------------------------------------------

def measured(paired, cpu, pairs=7):
    return {"pairs": pairs, "paired": {"metrics_ratio": paired, "checkpoint_ratio": {"median": 0.1, "min": 0.05, "max": 0.15}},
            "cpu_ratio": {"metrics_ratio": cpu, "checkpoint_ratio": None}}


@pytest.mark.parametrize("paired, cpu, load, verdict", [
    ({"median": 0.02, "min": 0.01, "max": 0.04}, None, 0.5, "pass"),
    ({"median": 0.09, "min": 0.07, "max": 0.12}, {"median": 0.08, "min": 0.06, "max": 0.1}, 0.5, "fail"),
    ({"median": 0.09, "min": 0.03, "max": 0.12}, None, 0.5, "inconclusive"),     # pairs on both sides of 5%
    ({"median": 0.09, "min": 0.07, "max": 0.12}, {"median": 0.02, "min": 0.0, "max": 0.04}, 0.5, "inconclusive"),
    ({"median": 0.09, "min": 0.07, "max": 0.12}, None, 2.5, "inconclusive"),     # load at the CPU count
])
def test_the_overhead_is_judged_as_the_main_bench_judges(paired, cpu, load, verdict):
    judged = overhead.judge(measured(paired, cpu), {"max": load, "cpus": 2})
    assert judged["metrics_ratio"]["verdict"] == verdict, judged
    assert judged["checkpoint_ratio"]["verdict"] == "pass"


def test_the_overhead_measure_names_where_the_time_goes():
    result = overhead.measure(str(overhead.PLANS / "learning-check-size.toml"), [], pairs=1)
    assert len(result["plain_s"]) == len(result["observed_s"]) == 1
    assert {"hooks in train()", "entropy and kl_base forwards", "watchdog", "write the row",
            "row (token figures)", "change norms"} <= set(result["parts_s"])
    assert result["cpu_ratio"]["metrics_ratio"] is not None and result["paired"]["metrics_ratio"]["min"] <= \
        result["metrics_ratio"] <= result["paired"]["metrics_ratio"]["max"]


# --- evaluate: repetition and groups (issue 35) -----------------------------------------------------------

def test_repetition_pools_the_samples_and_reads_each_long_response():
    long = torch.tensor([5] * 7 + [6, 7, 8])  # 10 tokens, 7 of one id
    r = evaluation.repetition([long, torch.tensor([1, 2, 3, 4]), torch.tensor([], dtype=torch.long)])
    assert r["top_token_share"] == 7 / 14 and r["longest_run"] == 7
    assert r["distinct_bigram_fraction"] == 7 / 12  # (5,5) x6, (5,6) (6,7) (7,8), (1,2) (2,3) (3,4)
    assert r["response_top_token_share"] == 0.7, "only responses of OWN_MIN_TOKENS or more have their own share"
    assert evaluation.repetition([torch.tensor([1, 2])])["response_top_token_share"] is None
    assert set(evaluation.repetition([]).values()) == {None}


def test_group_means_weigh_each_group_and_need_two_groups():
    assert evaluation.group_means([1.0, 3.0, 5.0], ["a", None, "a"]) == {"a": 3.0, evaluation.NO_GROUP: 3.0}
    assert evaluation.group_means([1.0, 2.0], ["a", "a"]) is None and evaluation.group_means(None, ["a", "b"]) is None


def side_of(reward, gold=None, groups=None, own=0.1):
    """One synthetic side of an evaluate report: one prompt per group, every response 8 ids."""
    groups = groups or {None: reward}
    samples = [{"prompt": [1], "response": [2, 3, 4, 5, 6, 7, 8, 9], "index": 0, "group": g, "reward": v, "gold": None}
               for g, v in groups.items()]
    return {"reward_mean": reward, "reward_std": 0.0, "gold_mean": gold,
            "per_prompt": [{"prompt": "p", "group": g, "reward": v, "gold": None} for g, v in groups.items()],
            "per_group": [{"group": g, "prompts": 1, "reward": v, "gold": None} for g, v in groups.items()],
            "repetition": {"top_token_share": own, "distinct_bigram_fraction": 0.9, "response_top_token_share": own,
                           "longest_run": 2}, "samples": samples, "all_samples": samples}


@pytest.mark.parametrize("initial, policy, rule, word, says", [
    (side_of(0.1), side_of(0.5), False, "IMPROVED", "load /r/policy.pt"),
    (side_of(0.1), side_of(0.5, own=0.9), False, "NOT IMPROVED", "training-run.md#collapse"),
    (side_of(0.1), side_of(0.5, own=0.9), True, "IMPROVED", "load /r/policy.pt"),  # the rule itself rose
    (side_of(0.1, gold=0.2), side_of(0.5, gold=0.9, own=0.9), False, "IMPROVED", "load"),
    (side_of(0.1, gold=0.2), side_of(0.5, gold=0.2, own=0.9), True, "NOT IMPROVED", "#collapse"),  # gold did not rise
    (side_of(0.3, groups={"a": 0.1, "r": 0.5}), side_of(0.6, groups={"a": 0.9, "r": 0.3}), False, "NOT IMPROVED",
     "group 'r' did not: read sub-skills/policy-optimization/references/training-run.md#prompt-groups"),
])
def test_the_verdict_needs_every_group_and_no_collapse(initial, policy, rule, word, says):
    from policy_optimization.run import evaluate
    report = {"run_dir": "/r", "policy_source": "policy.pt", "initial": initial, "policy": policy}
    report.update(evaluate.findings(report, None, rule_reward=rule))
    line, nxt = evaluate.verdict(report)
    assert line.startswith(f"evaluate: {word} (") and says in nxt, (line, nxt)
    if report["groups_fallen"]:
        assert report["evidence"] and all(s["group"] == "r" for s in report["evidence"]) and "no gain on group 'r'" in line
    elif report["collapse"]:
        assert report["evidence"] and "of the policy's response tokens" in report["collapse"]


def grouped_held_out(config) -> None:
    """The case's held-out prompts as JSONL with a group column: 'rst' alone in group 'r'."""
    (config.parent / "held.jsonl").write_text("".join(json.dumps({"prompt": p, "group": "r" if p[0] == "r" else "a"})
                                                      + "\n" for p in cases.HELD_OUT))
    config.write_text(config.read_text().replace('prompts_file = "held_out.txt"', 'prompts_file = "held.jsonl"'))


def test_evaluate_names_the_group_a_rising_mean_left_behind(tmp_path, monkeypatch, capsys):
    """The case whose held-out prompt 'rst' wants the opposite: its own group falls as the mean rises;
    the rows and evaluate report the group, and the verdict names it with its samples."""
    config = cases.write(BROKEN["held_out_prompt_collapse"], tmp_path / "config")
    grouped_held_out(config)
    run_, _, _ = loop.train_to_end(str(config), tmp_path / "run", options=loop.Options(progress=False, say=lambda l: None))
    first, last = run_.rows[0], run_.rows[-1]
    assert set(last["held_out_per_group"]) == {"a", "r"} and last["held_out_per_group"]["r"] < first["held_out_per_group"]["r"]
    code, out, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", "run", "--json",
                                     "--device", "cpu")
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["policy"]["reward_mean"] > report["initial"]["reward_mean"], "the mean rose"
    assert [g["group"] for g in report["policy"]["per_group"]] == ["a", "r"] and report["groups_fallen"] == ["r"]
    assert report["policy"]["per_group"][1]["reward"] == last["held_out_per_group"]["r"]
    assert report["verdict"].startswith("evaluate: NOT IMPROVED") and "group 'r'" in report["verdict"]
    assert {s["prompt"] for s in report["evidence"]} == {"rst"}


def test_evaluate_does_not_call_a_collapsed_policy_improved(tmp_path, monkeypatch, capsys):
    """The '!' reward at lr 0.3: the policy repeats one byte. Its rule reward rose with it, so the rule's
    own verdict stands, the collapse named; a gold metric that did not rise makes it NOT IMPROVED."""
    config = cases.write(BROKEN["repeated_token"], tmp_path / "config")
    run_, _, _ = loop.train_to_end(str(config), tmp_path / "run", options=loop.Options(progress=False, say=lambda l: None))
    assert run_.rows[-1]["held_out_top_token_share"] >= watchdog.TOP_TOKEN_SHARE > run_.rows[0]["held_out_top_token_share"]
    code, out, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", "run", "--json",
                                     "--device", "cpu")
    report = json.loads(out)
    assert code == 0 and report["collapse"] and report["collapse_with_gold"] == "the rule reward", err[-2000:]
    assert report["verdict"].startswith("evaluate: IMPROVED") and "the rule reward rose with it" in report["verdict"]
    assert report["policy"]["repetition"]["longest_run"] > report["initial"]["repetition"]["longest_run"]
    (tmp_path / "flat.py").write_text("import torch\n\ndef score(x, response_mask):\n    return torch.zeros(x.shape[0])\n")
    code, out, err = main_in_process(evaluate_main(), capsys, monkeypatch, tmp_path, "--run-dir", "run",
                                     "--metric", "flat.py:score", "--device", "cpu")
    assert code == 0, err[-2000:]
    assert "evaluate: NOT IMPROVED" in out and "collapsed: one id is" in out and "it shows: " in out
