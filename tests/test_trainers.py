"""Every trainer's train smoke (PPO, GRPO, TPO, FlowRL), the GRPO variants, the refused variant
combinations, and the library behaviour that makes refusing early necessary.

Facts under test come from palm_rlhf_pytorch 0.8.0: grpo.py, tpo.py, flowrl.py, ppo.py, palm.py.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys

import pytest

import doc_tables
from conftest import SMOKE, run
from doc_tables import code, documents, flatten, section, table
import probe_kit
from skill_runtime import exits, reporting, runner
from policy_optimization import tiny_trainers, trainers
from policy_optimization.smoke import options, settings

TRAINERS = list(trainers.TRAINERS)


def run_main(smoke, cwd, *argv) -> tuple[int, dict]:
    """The helper's main() in-process from ``cwd``; returns (exit code, JSON report)."""
    caller, out = os.getcwd(), io.StringIO()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            code = smoke.main(["--json", "--device", "cpu", *argv])
    finally:
        os.chdir(caller)
    return code, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def reports(smoke, tmp_path_factory) -> dict[str, tuple[int, dict, list]]:
    """One in-process train smoke per trainer: (exit code, report, what was left in its cwd or in
    the temp root that held the helper's private working directory)."""
    import tempfile

    found, saved = {}, tempfile.tempdir
    for name in TRAINERS:
        cwd, tmp = tmp_path_factory.mktemp(f"cwd-{name}"), tmp_path_factory.mktemp(f"tmp-{name}")
        tempfile.tempdir = str(tmp)  # where the helper's private working directory is created
        try:
            code, report = run_main(smoke, cwd, "--trainer", name)
        finally:
            tempfile.tempdir = saved
        # what stayed in the caller's directory, plus any private working directory left in the
        # temp root (torch may leave its own torchinductor_<user> cache there: not the helper's)
        private = [p for p in os.listdir(tmp) if p.startswith("palm-rlhf-skill-")]
        assert all(p.startswith(("palm-rlhf-skill-", "torchinductor_")) for p in os.listdir(tmp))
        found[name] = (code, report, sorted(os.listdir(cwd)) + private)
    return found


def checks_of(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.parametrize("name", TRAINERS)
def test_train_smoke_in_process(reports, smoke, name):
    code, report, left = reports[name]
    failed = [c for c in report["checks"] if not c["passed"]]
    assert code == 0 and report["status"] == "ok" and not failed, failed
    assert left == [], f"{name} left {left} in the caller's directory"
    spec = trainers.TRAINERS[name]
    assert report["class_name"] == f"{spec.module}.{spec.class_name}"
    checks = checks_of(report)
    assert {"actor_lora_changed", "base_weights_unchanged", "reward_model_unchanged", "losses_finite",
            "optimizer_steps", "rollout_group_size", "generated_sequence",
            "caller_directory_untouched"} <= checks.keys()
    steps = report["optimizer_steps"]
    # AdoptAtan2 (PPO, GRPO, FlowRL) moves nothing on step 1 and LoRA A only once B has moved: 3;
    # AdamAtan2 (TPO) moves on step 1: 2
    assert steps["required"] == (2 if name == "tpo" else 3)
    assert all(n == steps["expected"] >= steps["required"] for n in steps["observed"].values()), steps
    params = report["parameters"]
    assert params["trainable_changed"] == params["trainable_total"] > 0 and params["frozen_changed"] == 0


def test_ppo_moves_critic_and_value_head(reports):
    _, report, _ = reports["ppo"]
    checks = checks_of(report)
    assert checks["critic_lora_changed"]["passed"] and checks["value_head_changed"]["passed"]
    assert report["optimizer_steps"]["observed"] == {"actor": 3, "critic": 3}
    assert report["results"]["ppo"]["group_size"] == 1 and "scored [1] completions" in checks["rollout_group_size"]["detail"]


def test_grpo_group_size_is_num_times_sample_rewards_plus_one(reports, smoke):
    _, report, _ = reports["grpo"]
    assert report["grpo_variants"] == ["default"]
    assert report["results"]["grpo"]["group_size"] == tiny_trainers.GROUP_SAMPLES + 1 == 4
    detail = checks_of(report)["rollout_group_size"]["detail"]
    assert "scored [4] completions" in detail and "grpo_num_times_sample_rewards + 1" in detail
    # one learn() over 3 rollouts of 4 completions, minibatch 4: 3 optimizer steps
    assert report["optimizer_steps"]["rollouts"] * 4 / tiny_trainers.SMOKE_MINIBATCH["grpo"] == 3


def test_tpo_replay_buffer_in_private_dir_with_its_size(reports):
    _, report, left = reports["tpo"]
    buffer = report["replay_buffer"]
    assert buffer["path"] == "./tpo_memmap_replay_buffer" and buffer["bytes"] > 0
    check = checks_of(report)["replay_buffer_in_private_dir"]
    assert check["passed"] and f"({buffer['bytes']} bytes on disk)" in check["detail"]
    assert left == []
    assert report["optimizer_steps"]["observed"] == {"actor": 2}


def test_flowrl_partition_function_and_reference_policy(reports):
    _, report, _ = reports["flowrl"]
    checks = checks_of(report)
    assert checks["partition_function_changed"]["passed"]
    assert checks["partition_function_changed"]["detail"].startswith("6/6 tensors changed")
    ref = checks["reference_policy_is_lora_off_palm"]
    assert ref["passed"] and "same object: True" in ref["detail"] and "differ from the actor's after the update: True" in ref["detail"]
    assert report["optimizer_steps"]["observed"] == {"actor": 3, "partition_function": 3}
    assert set(report["losses"]) == {"flowrl_loss", "trajectory_balance"}


@pytest.fixture(scope="module")
def all_cli(smoke, tmp_path_factory) -> tuple[int, dict, list]:
    """``--trainer all --json`` from an empty directory, on the CPU, through the command line's
    ``run_cli`` in-process (its exit code and one-line errors, as the process gives them; the
    process runs by path in test_distributed.py): (exit code, report, left)."""
    cwd = tmp_path_factory.mktemp("cwd-all")
    caller, out, err = os.getcwd(), io.StringIO(), io.StringIO()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exit_code = runner.run_cli(smoke.main, ["--trainer", "all", "--json", "--device", "cpu"])
    finally:
        os.chdir(caller)
    assert out.getvalue().strip(), f"no stdout; stderr: {err.getvalue()[-2000:]}"
    assert "Traceback" not in err.getvalue(), err.getvalue()[-2000:]
    return exit_code, json.loads(out.getvalue()), sorted(os.listdir(cwd))


def test_trainer_all_cli_from_empty_dir(all_cli):
    code, report, left = all_cli
    assert code == 0 and report["status"] == "ok" and report["trainer"] == "all"
    assert list(report["results"]) == TRAINERS
    for name, result in report["results"].items():
        failed = [c for c in result["checks"] if not c["passed"]]
        assert result["status"] == "ok" and not failed, (name, failed)
        assert result["parameters"]["trainable_changed"] == result["parameters"]["trainable_total"]
    assert "checks" not in report  # per-trainer results only, under results
    assert left == []


@pytest.mark.parametrize("variant", ["dr-grpo", "max-rl", "spo", "score-centering", "entropy-advantage"])
def test_grpo_variant_train_smoke(smoke, empty_dir, variant):
    code, report = run_main(smoke, empty_dir, "--trainer", "grpo", "--grpo-variant", variant)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert report["grpo_variants"] == [variant]
    assert report["parameters"]["trainable_changed"] == report["parameters"]["trainable_total"]
    assert list(empty_dir.iterdir()) == []


def test_grpo_variants_combine_and_deduplicate(smoke):
    assert settings.parse_variants(["dr-grpo,entropy-advantage", "dr-grpo"]) == ["dr-grpo", "entropy-advantage"]
    assert settings.parse_variants(["default", "spo"]) == ["spo"]
    assert settings.parse_variants(None) == ["default"]


@pytest.mark.parametrize("argv", [["--grpo-variant", "dr-grpo,max-rl"],
                                  ["--grpo-variant", "spo", "--grpo-variant", "score-centering"],
                                  ["--trainer", "all", "--grpo-variant", "max-rl,dr-grpo"]])
@pytest.mark.slow  # starts a process: not in the quick tier
def test_refused_combinations_exit_2_one_line_before_torch(empty_dir, argv):
    argv = argv if "--trainer" in argv else ["--trainer", "grpo", *argv]
    proc = run([sys.executable, "-X", "importtime", str(SMOKE), *argv, "--json"], empty_dir)
    assert proc.returncode == 2 and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and "is refused" in errors[0], errors
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())
    assert list(empty_dir.iterdir()) == []


@pytest.mark.parametrize("flags, message", [
    ({"use_dr_grpo": True, "use_max_rl": True}, "cannot use both Dr. GRPO and MaxRL"),
    ({"use_simple_policy_optimization": True, "use_score_centering": True},
     "cannot use both SPO and Score Centering")])
def test_library_asserts_only_after_adding_actor_lora_scope(smoke, flags, message):
    """Why the helper refuses early: grpo.RLHFTrainer mutates the PaLM, then asserts."""
    from palm_rlhf_pytorch import PaLM, RewardModel
    from palm_rlhf_pytorch.grpo import RLHFTrainer

    palm = PaLM(**probe_kit.TINY_PALM)
    reward_model = RewardModel(palm, num_binned_output=0)
    kwargs = dict(palm=palm, reward_model=reward_model, accelerate_kwargs={"cpu": True},
                  prompt_token_ids=probe_kit.tiny_prompt_ids(0))
    assert "actor" not in palm.finetune_modules
    with pytest.raises(AssertionError, match=message):
        RLHFTrainer(**kwargs, **flags)
    assert "actor" in palm.finetune_modules  # the failed constructor left its LoRA scope behind
    with pytest.raises(AssertionError, match="finetune scope actor already found"):
        RLHFTrainer(**kwargs)  # so even a valid trainer can no longer be built on this PaLM


def test_helper_refusal_builds_no_model(smoke, monkeypatch, capsys):
    import palm_rlhf_pytorch

    built = []

    class CountingPaLM(palm_rlhf_pytorch.PaLM):
        def __init__(self, *args, **kwargs):
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(palm_rlhf_pytorch, "PaLM", CountingPaLM)
    assert runner.run_cli(smoke.main, ["--trainer", "grpo", "--grpo-variant", "dr-grpo,max-rl"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot use both Dr. GRPO and MaxRL" in err
    assert built == []
    # the counter is live: an accepted variant does build a PaLM through it
    assert runner.run_cli(smoke.main, ["--trainer", "grpo", "--construct-only", "--device", "cpu"]) == 0
    assert len(built) == 1


def test_flowrl_default_partition_hidden_dim_fails_only_at_first_update(smoke):
    """partition_function_hidden_dim defaults to 768; on a dim-32 PaLM construction succeeds and
    the first learn() fails when the partition function meets the 32-dim prompt embeddings."""
    from palm_rlhf_pytorch import PaLM, RewardModel
    from palm_rlhf_pytorch.flowrl import FlowRLTrainer

    palm = PaLM(**probe_kit.TINY_PALM)
    trainer = FlowRLTrainer(palm=palm, reward_model=RewardModel(palm, num_binned_output=0),
                            prompt_token_ids=probe_kit.tiny_prompt_ids(0), flowrl_num_times_sample=1,
                            accelerate_kwargs={"cpu": True})
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(RuntimeError) as info:
        trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=10)
    frames = [entry.name for entry in info.traceback]
    assert "learn" in frames and "shapes cannot be multiplied" in str(info.value)


class PerTokenReward:
    """Mixin: a reward model whose forward returns one reward per token, shape (b, n) float."""

    def forward(self, x, mask=None, prompt_mask=None, **kwargs):
        import torch
        return torch.linspace(0, 1, x.numel(), device=x.device).reshape(x.shape)


@pytest.mark.parametrize("name", TRAINERS)
@pytest.mark.parametrize("shape", ["binned-sampled", "binned-logits", "per-token"])
def test_reward_shapes_each_trainer_accepts(smoke, name, shape, tmp_path, monkeypatch):
    """Scalar per sequence, shape (b,), is what all four use (the smokes above). A binned
    RewardModel samples a bin index per sequence by default, (b,) int64: all four run. Raw bin
    logits (b, num_bins) and per-token rewards (b, n): all four fail at these minibatch sizes, TPO
    with its own assertion (FlowRL's silent sizes: test_silent_failures)."""
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM, RewardModel

    monkeypatch.chdir(tmp_path)  # TPO writes ./tpo_memmap_replay_buffer
    set_seed(0)  # torch and the prompt draw: on some samples PPO's raw bin logits trip hl_gauss's own assert first
    palm = PaLM(**probe_kit.TINY_PALM)
    if shape == "per-token":
        reward_model = type("PerTokenRewardModel", (PerTokenReward, RewardModel), {})(palm, num_binned_output=0)
    else:  # 5 bins: neither the group size (4) nor PPO's 6 critic bins, so nothing broadcasts by chance
        reward_model = RewardModel(palm, num_binned_output=5, sample_from_bins=shape == "binned-sampled")
    trainer = tiny_trainers.tiny_trainer(name, palm=palm, reward_model=reward_model)  # the smoke's minibatch and group
    train = lambda: trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=9)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if shape == "binned-sampled":
            train()
        elif name == "tpo":
            with pytest.raises(AssertionError, match="rewards must be sequence level for TPO"):
                train()
        else:
            with pytest.raises(RuntimeError, match="must match the size of tensor"):
                train()


# references/workflows.md against the script ------------------------------------------------------

WORKFLOWS = SMOKE.parents[1] / "references" / "workflows.md"
REPORTS = doc_tables.REPORTS  # the --json keys of every helper


def report_keys(report: dict) -> list[str]:
    (result,) = report["results"].values()
    return list(result)


@documents(REPORTS, "## Keys every smoke report has", "## tiny-rlhf-smoke")
@pytest.mark.slow  # starts a process: not in the quick tier
def test_documented_json_schema_matches_real_output(reports, all_cli, smoke, tmp_path):
    rows = {code(r[0]): r for heading in ("## Keys every smoke report has", "## tiny-rlhf-smoke")
            for r in table(REPORTS, heading)}
    copies = {key for key, r in rows.items() if r[2].startswith("single trainer")}
    code_, file_report = run_main(smoke, tmp_path, "--trainer", "grpo", "--construct-only",
                                  "--prompt-style", "file")
    assert code_ == 0
    failures = []  # the library raising in the constructor and at the first update
    for extra, failed in (({"no_such_argument": 1}, "trainer_constructed"),
                          ({"partition_function_hidden_dim": 768}, "update_ran")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(tiny_trainers.SMOKE_EXTRA, "flowrl", extra)
            code_, report = run_main(smoke, tmp_path, "--trainer", "flowrl")
        assert code_ == 1 and [c["name"] for c in report["checks"] if not c["passed"]] == [failed]
        failures.append(report)
    absent = {key.rsplit(".", 1)[1] for key, r in rows.items()
              if key.startswith("results.<trainer>.") and key.count(".") == 2 and "absent when" in r[2]}
    assert absent == set(report_keys(file_report)) - set(failures[0]["results"]["flowrl"])
    found: dict[str, set] = {}
    singles = [report for _, report, _ in reports.values()] + [file_report, *failures]
    for report in singles:
        (trainer,) = report["results"]
        for key in copies & report.keys():  # single trainer: the top-level copy is that entry
            assert report[key] == report["results"][trainer][key], key
        flatten(report, "", found, copies)
    _, all_report, _ = all_cli
    assert not copies & all_report.keys(), "--trainer all must not repeat a trainer at the top level"
    flatten(all_report, "", found, copies)
    assert set(found) == set(rows), (f"undocumented: {sorted(set(found) - set(rows))}; "
                                     f"documented but never seen: {sorted(set(rows) - set(found))}")
    for key, types in found.items():
        documented = {t.strip() for t in rows[key][1].split(" or ")}
        assert types <= documented, f"{key}: real {types}, documented {documented}"


@documents(REPORTS, "### Train smoke checks")
def test_documented_checks_per_trainer_match_real_output(reports):
    """reports.md's table of train smoke checks: the trainers column says who runs each, in order;
    every check the runs emit has a doc section in the runtime's one map (CHECK_DOCS)."""
    rows = table(REPORTS, "### Train smoke checks")
    for name, (_, report, _) in reports.items():
        shown = trainers.TRAINERS[name].display
        expected = [code(r[0]) for r in rows if r[1] == "all" or r[1] == shown]
        assert [c["name"] for c in report["checks"]] == expected, name
        assert {c["name"] for c in report["checks"]} <= set(reporting.CHECK_DOCS), name


@documents(WORKFLOWS, "### Options")
def test_documented_options_match_argparse(smoke):
    """workflows.md's Options table follows the one option table (options.OPTIONS), row for
    row in its order, and both follow argparse: defaults, choices, the modes each applies to."""
    doc_rows = table(WORKFLOWS, "### Options")
    rows = {code(r[0]): r for r in doc_rows}
    actions = {max(a.option_strings, key=len): a for a in smoke.build_parser()._actions}
    assert set(rows) == set(actions)
    assert [code(r[0]) for r in doc_rows] == ["--help"] + [o.flag for o in options.OPTIONS]
    for option, action in actions.items():
        _, default, applies, meaning = rows[option]
        if option == "--help":
            continue
        assert applies == options.doc_applies_to(options.BY_FLAG[option]), option
        if action.nargs == 0:  # store_true flags
            assert default == "off", option
        elif action.default is None:  # off: --nproc unset; or the value its help names as default
            named = re.search(r"\(default: (\w+)\)", action.help or "")
            assert default in ("computed", "`default`", "off") or (named and default == f"`{named[1]}`"), option
        else:
            assert default == f"`{action.default}`", option
        for choice in action.choices or (settings.GRPO_VARIANTS if option == "--grpo-variant" else []):
            assert f"`{choice}`" in meaning, (option, choice)
    text = " ".join(WORKFLOWS.read_text(encoding="utf-8").split())
    for variant, flags in settings.GRPO_VARIANTS.items():
        for flag in flags:
            assert f"`{variant}` `{flag}=True`" in text, flag


# a value each option takes that is not its default (flags take none)
SAMPLE = {"--trainer": "grpo", "--grpo-variant": "spo", "--learn-control": "frozen", "--learn-seeds": "3",
          "--prompt-style": "text", "--rollouts": "3", "--eos-token": "3", "--nproc": "2", "--dist-timeout": "5",
          "--dim": "64", "--depth": "2", "--prompt-len": "5", "--new-tokens": "4", "--sampler": "cached"}
MODE_ARGV = {"construct-only": ["--construct-only"], "train-smoke": [], "learn": ["--learn"]}


def test_every_option_outside_its_modes_is_refused_before_torch(smoke):
    """The refusals follow the option table: each option given in a mode it does not apply to is a
    usage error naming the option (exit 2), and so is each option without its further condition."""
    settable = [o for o in options.OPTIONS if not o.common and o.kwargs.get("action") != "store_true"]
    assert {o.flag for o in settable} == set(SAMPLE), \
        f"tests/test_trainers.py SAMPLE: one value (not the default) for each option that takes one: {sorted({o.flag for o in settable} ^ set(SAMPLE))}"
    for option in options.OPTIONS:
        value = [SAMPLE[option.flag]] if option.flag in SAMPLE else []
        for mode in set(settings.MODES) - option.modes:
            if option.group == "mode":
                continue  # argparse refuses two mode flags itself
            with pytest.raises(exits.SkillError, match=rf"^{option.flag} applies to .*, not "):
                smoke.main([*MODE_ARGV[mode], option.flag, *value])
    for flag, argv in (("--grpo-variant", ["--trainer", "ppo", "--grpo-variant", "spo"]),
                       ("--prompt-len", ["--prompt-style", "file", "--prompt-len", "5"]),
                       ("--no-ddp-fixes", ["--no-ddp-fixes"]), ("--dist-timeout", ["--dist-timeout", "5"])):
        condition = options.BY_FLAG[flag].only_with.replace("`", "")
        with pytest.raises(exits.SkillError, match=f"^{flag} applies to {re.escape(condition)}$"):
            smoke.main(argv)
    assert {o.flag for o in options.OPTIONS if o.when} == {"--grpo-variant", "--prompt-len", "--no-ddp-fixes",
                                                           "--dist-timeout"}, \
        "tests/test_trainers.py: an option with a further condition (`when`) gets its own refused argv in the loop above"


def test_report_config_follows_the_option_table(reports, all_cli):
    """The train smoke report's config: the probe kit's tiny PaLM plus the options the table marks
    ``config`` (at their values), and the torch threads."""
    shown = {o.dest for o in options.OPTIONS if o.config}
    assert {"dim", "depth", "prompt_len", "new_tokens"} <= shown  # the probe kit's sizes (checked below)
    for report in [r for _, r, _ in reports.values()] + [all_cli[1]]:
        assert set(report["config"]) == set(probe_kit.TINY_PALM) | shown | {"cpu_threads"}
        assert report["config"]["new_tokens"] == tiny_trainers.NEW_TOKENS and report["config"]["prompt_len"] is None
        assert {k: report["config"][k] for k in probe_kit.TINY_PALM} == probe_kit.TINY_PALM


@documents(WORKFLOWS, "### Exit codes")
def test_documented_exit_codes_match_runtime():
    rows = table(WORKFLOWS, "### Exit codes")
    assert [int(r[0]) for r in rows] == [exits.EXIT_OK, exits.EXIT_CHECK_FAILED, exits.EXIT_USAGE, exits.EXIT_DEPENDENCY]


@documents(WORKFLOWS, "## Optimizer-step arithmetic")
def test_documented_step_table_matches_real_runs(reports, smoke):
    rows = table(WORKFLOWS, "## Optimizer-step arithmetic")
    assert [r[0] for r in rows] == TRAINERS
    for name, minibatch, items, rollouts, steps, required in rows:
        spec, report = trainers.TRAINERS[name], reports[name][1]
        observed = report["optimizer_steps"]["observed"]
        assert int(minibatch) == tiny_trainers.SMOKE_MINIBATCH[name] and int(items) == spec.items_per_rollout(settings.smoke_group(spec))
        assert int(rollouts) == report["optimizer_steps"]["rollouts"]
        assert int(required) == report["optimizer_steps"]["required"]
        documented = {(k or "actor").replace(" ", "_"): int(n)
                      for n, k in re.findall(r"(\d+)(?: \(([a-z ]+)\))?", steps)}
        assert documented == observed, (name, steps, observed)


@documents(WORKFLOWS, "### Prompt styles")
def test_documented_prompt_styles(reports, smoke, tmp_path):
    text = section(WORKFLOWS, "### Prompt styles")
    assert "(4, max_len)" in text and reports["ppo"][1]["prompts"]["count"] == 4
    assert "12 prompts" in text and "`prompts.dropped_empty == 1`" in text
    for style, dropped in (("text", 0), ("file", 1)):
        code_, report = run_main(smoke, tmp_path, "--trainer", "tpo", "--construct-only", "--prompt-style", style)
        assert code_ == 0 and report["prompts"]["count"] == 12 and report["prompts"]["dropped_empty"] == dropped


# references/trainer-selection.md against the 0.8.0 source ---------------------------------------

SELECTION = SMOKE.parents[1] / "references" / "trainer-selection.md"
COLUMNS = list(trainers.TRAINERS)


def selection_rows(heading: str) -> dict[str, dict[str, str]]:
    rows = table(SELECTION, heading)
    assert all(len(row) == 1 + len(COLUMNS) for row in rows), \
        (doc_tables.where(SELECTION, heading), [row[0] for row in rows if len(row) != 5])
    return {row[0]: dict(zip(COLUMNS, row[1:])) for row in rows}


@pytest.fixture(scope="module")
def built(smoke):
    """Each trainer constructed by the probe kit (no training), keyed like --trainer."""
    return {name: tiny_trainers.tiny_trainer(name) for name in trainers.TRAINERS}


@documents(SELECTION, "## Decision table")
def test_selection_classes_and_papers(smoke):
    import importlib
    import inspect
    import palm_rlhf_pytorch

    rows = selection_rows("## Decision table")
    assert palm_rlhf_pytorch.RLHFTrainer is importlib.import_module("palm_rlhf_pytorch.ppo").RLHFTrainer
    for name, spec in trainers.TRAINERS.items():
        path = spec.module + "." + spec.class_name
        assert f"`{path}`" in rows["class"][name]
        source = inspect.getsource(importlib.import_module(f"palm_rlhf_pytorch.{name}"))
        links = re.findall(r"https://arxiv\.org/abs/[\w.]+", rows["paper cited in the source"][name])
        assert all(link in source for link in links), name
        if rows["paper cited in the source"][name].startswith("none"):
            assert (name == "ppo") == ("arxiv.org" in source)  # PPO cites only the critic-loss paper
    flowrl = importlib.import_module("palm_rlhf_pytorch.flowrl")
    assert f'"{flowrl.__doc__.strip()}"' in rows["paper cited in the source"]["flowrl"]
    assert "arxiv.org/abs/2403.03950" in rows["paper cited in the source"]["ppo"]


@documents(SELECTION, "## Decision table")
def test_selection_group_sizes_and_defaults(smoke):
    import importlib
    import inspect

    cell = selection_rows("## Decision table")["completions sampled per prompt per rollout"]
    assert cell["ppo"] == "1"
    for name, spec in trainers.TRAINERS.items():
        if spec.group_kwarg:
            cls = getattr(importlib.import_module(spec.module), spec.class_name)
            default = inspect.signature(cls).parameters[spec.group_kwarg].default
            assert cell[name] == f"`{spec.group_kwarg}` + 1 (default {default} + 1)"


@documents(SELECTION, "## Decision table")
def test_selection_critic_optimizers_and_extra_models(built):
    from palm_rlhf_pytorch import PaLM
    from palm_rlhf_pytorch.flowrl import PartitionFunction
    import inspect

    rows = selection_rows("## Decision table")
    found = {"ppo": f"`{type(built['ppo'].actor_optim.optimizer).__name__}` (actor) + "
                    f"`{type(built['ppo'].critic_optim.optimizer).__name__}` (critic)",
             "grpo": f"`{type(built['grpo'].actor_optim.optimizer).__name__}`",
             "tpo": f"`{type(built['tpo'].actor_optim.optimizer).__name__}`",
             "flowrl": f"`{type(built['flowrl'].actor_optim.optimizer).__name__}` (actor) + "
                       f"`{type(built['flowrl'].partition_function_optim.optimizer).__name__}` (partition function)"}
    assert rows["optimizer"] == found
    required = {n: {"AdoptAtan2": "3", "AdamAtan2": "2"}[type(t.actor_optim.optimizer).__name__] for n, t in built.items()}
    steps = rows["optimizer steps before every trainable tensor moves"]
    assert {n: cell.split(" ")[0] for n, cell in steps.items()} == required  # from a fresh LoRA
    assert all(f"{int(required[n]) - 1} after `trainer.load()`)" in cell for n, cell in steps.items()), steps
    ac = built["ppo"].actor_critic
    assert isinstance(ac.critic, PaLM) and ac.critic is not ac.actor_palm and "critic" in ac.critic.finetune_modules
    assert ac.value_head.out_features == 6 == inspect.signature(type(built["ppo"])).parameters["critic_num_pred_bins"].default
    assert type(built["ppo"].critic_hl_gauss_loss).__name__.startswith("HLGaussLoss")
    kwargs = inspect.signature(type(built["ppo"])).parameters["hl_gauss_loss_kwargs"].default
    assert (kwargs["min_value"], kwargs["max_value"], kwargs["clamp_to_range"]) == (0., 5., True)
    assert "6 bins on [0, 5]" in rows["what `train()` does with the reward"]["ppo"]
    assert rows["critic"]["ppo"].startswith("yes") and all(rows["critic"][n] == "critic-free" for n in COLUMNS[1:])
    for name in COLUMNS[1:]:
        assert not hasattr(built[name], "critic_optim") and not hasattr(built[name], "actor_critic")
    flowrl = built["flowrl"]
    assert isinstance(flowrl.partition_function, PartitionFunction) and flowrl.palm is flowrl.actor.actor_palm
    linears = [m for m in flowrl.partition_function.modules() if isinstance(m, __import__("torch").nn.Linear)]
    assert len(linears) == 3 and "3-layer MLP" in rows["extra models held"]["flowrl"]
    assert inspect.signature(type(flowrl)).parameters["partition_function_hidden_dim"].default == 768
    assert "(default 768)" in rows["extra models held"]["flowrl"]
    assert "finetune_scope = None" in inspect.getsource(type(flowrl).learn)
    learn = inspect.getsource(type(flowrl).learn)  # the probability-not-log-probability quirk
    assert "action_probs = action_logits.softmax(dim = -1)" in learn
    assert "action_log_probs = einx.get_at('b n [l], b n -> b n', action_probs, sequences)" in learn
    assert "ref_log_probs = einx.get_at('b n [l], b n -> b n', ref_probs, sequences)" in learn
    grpo_train = inspect.getsource(type(built["grpo"]).train)
    assert "divisor = default(self.dr_grpo_constant, action_sample_times + 1)" in grpo_train
    assert "divisor = rewards.mean().abs()" in grpo_train and "divisor = rewards.std()" in grpo_train
    # FlowRL accepts kl_div_loss_weight but its learn() never reads it (PPO's and GRPO's do)
    assert "kl_div_loss_weight" not in inspect.getsource(type(flowrl).learn)
    assert all("kl_div_loss_weight" in inspect.getsource(type(built[n]).learn) for n in ("ppo", "grpo"))


@documents(SELECTION, "## Decision table")
def test_selection_experience_storage(built, reports):
    import inspect

    cell = selection_rows("## Decision table")["experience storage"]
    for name in ("ppo", "grpo", "flowrl"):
        assert "memories = deque([])" in inspect.getsource(type(built[name]).train)
        assert cell[name].startswith("in-memory `deque`")
    tpo_train = inspect.getsource(type(built["tpo"]).train)
    assert "folder = './tpo_memmap_replay_buffer'" in tpo_train and "deque" not in tpo_train
    assert "`./tpo_memmap_replay_buffer`" in cell["tpo"]
    # the helper saw the folder after train() returned, inside its private directory
    assert checks_of(reports["tpo"][1])["replay_buffer_in_private_dir"]["passed"]


@documents(SELECTION, "## Decision table")
def test_selection_reward_shape_rows_match_the_shape_test():
    rows = selection_rows("## Decision table")
    ok, fail = rows["reward shapes that run"], rows["reward shapes that fail"]
    assert "scalar per sequence `(b,)`" in ok["ppo"] and "bin index `(b,)` int64" in ok["ppo"]
    assert "`(b, num_bins)`" in fail["ppo"] and "per-token `(b, n)`" in fail["ppo"] and "`RuntimeError`" in fail["ppo"]
    assert [ok[n] for n in COLUMNS[1:]] == ["same"] * 3
    assert fail["grpo"] == "same" and fail["flowrl"].startswith("same as PPO, except bin logits with a minibatch of 1")
    assert "traps-rewards.md#flowrl-binned-reward-broadcast" in fail["flowrl"]  # its canary: test_silent_failures
    assert '`AssertionError` "rewards must be sequence level for TPO"' in fail["tpo"]


@documents(SELECTION, "## Decision table")
def test_selection_save_keeps_what_it_says(built, tmp_path):
    import inspect
    import torch

    rows = selection_rows("## Decision table")
    for name, trainer in built.items():
        assert inspect.signature(trainer.save).parameters["filepath"].default == "./checkpoint.pt"
        path = tmp_path / f"{name}.pt"
        trainer.save(str(path))
        keys = list(torch.load(path))
        roots = {k.split(".")[0] for k in keys}
        assert roots == ({"actor_palm", "critic", "value_head"} if name == "ppo" else {"actor_palm"}), roots
        assert "actor_palm.token_emb.weight" in keys  # base weights, not only LoRA
        assert any(k.startswith("actor_palm.finetune_modules.actor.") for k in keys)
        assert not any("partition_function" in k or "reward" in k for k in keys)
        if name == "ppo":
            assert any(k.startswith("critic.finetune_modules.critic.") for k in keys)
        keeps, drops = rows["`save()` keeps"][name], rows["`save()` does not keep"][name]
        assert keeps.startswith("`actor_critic.state_dict()`" if name == "ppo" else "`actor.state_dict()`")
        assert "reward model" in drops and "optimizer" in drops
    assert "partition function" in rows["`save()` does not keep"]["flowrl"]


@documents(SELECTION, "## Measured figures")
def test_selection_measured_counts_match_helper(reports):
    rows = selection_rows("## Measured figures")
    for name, (_, report, _) in reports.items():
        params, steps = report["parameters"], report["optimizer_steps"]
        assert rows["trainable parameters (scalars)"][name] == str(params["trainable_numel"])
        assert rows["trainable tensors"][name] == str(params["trainable_total"])
        observed = " + ".join(str(n) for n in steps["observed"].values())
        assert rows["rollouts, optimizer steps in the one `learn()`"][name] == f"{steps['rollouts']}, {observed}"
    assert rows["replay buffer on disk (bytes)"]["tpo"] == str(reports["tpo"][1]["replay_buffer"]["bytes"])


@documents(SELECTION, "## Measured figures")
def test_selection_measurement_snippet_runs(monkeypatch, capsys):
    body = re.search(r"<<'EOF'\n(.*?)\nEOF\n", section(SELECTION, "## Measured figures"), re.S).group(1)
    monkeypatch.chdir(SMOKE.parents[3])  # the snippet runs from the skill root
    monkeypatch.setattr(sys, "argv", ["-", "grpo"])
    exec(compile(body, "trainer-selection.md snippet", "exec"), {})
    name, seconds, numel, rss, unit = capsys.readouterr().out.split()
    assert name == "grpo" and float(seconds) > 0 and numel == "1792" and float(rss) > 0 and unit == "MiB"


def test_skill_md_links_both_references_with_a_condition():
    skill = (SMOKE.parents[1] / "SKILL.md").read_text(encoding="utf-8")
    for ref in (WORKFLOWS, SELECTION):
        link = f"[references/{ref.name}](references/{ref.name})"
        item = re.search(rf"^\d+\. Read {re.escape(link)} when .+?(?=^\d+\. |^$)", skill, re.M | re.S)
        assert item and ref.is_file(), ref.name
    for ref in (WORKFLOWS, SELECTION):  # their own relative links resolve
        for target in re.findall(r"\]\(([^)#:]+)\)", ref.read_text(encoding="utf-8")):
            assert (ref.parent / target).is_file(), (ref.name, target)


def test_last_partial_minibatch_is_a_step(smoke, tmp_path):
    """5 PPO rollouts with minibatch_size 2: ceil(5 / 2) = 3 steps, the last batch of 1 included."""
    code, report = run_main(smoke, tmp_path, "--trainer", "ppo", "--rollouts", "5")
    assert code == 0 and report["optimizer_steps"]["observed"] == {"actor": 3, "critic": 3}
    assert report["optimizer_steps"]["expected"] == 3
