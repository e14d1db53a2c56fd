"""The reward-modeling sub-skill: its smoke helper (in-process, by path, console script) and the
facts its markdown states about RewardModel and ImplicitPRM."""
from __future__ import annotations

import inspect
import io
import contextlib
import re
import sys

import pytest

import probe_kit
from policy_optimization import tiny_trainers, trainers
from conftest import BIN, REPO, inprocess, load_script, run, run_json, usage_error_without_torch
from skill_runtime import runner

SUBSKILL = REPO / "sub-skills" / "reward-modeling"
REWARD_SMOKE = SUBSKILL / "scripts" / "tiny_reward_smoke.py"
CHECK_NAMES = ["scalar_rewards_shape", "scalar_mse_loss_decreases", "held_out_accuracy_above_chance",
               "binned_cross_entropy_decreases", "binned_inference_returns_bin_index",
               "implicit_prm_rewards_shape", "implicit_prm_loss_backpropagates",
               "implicit_prm_output_is_minus_bce", "base_palm_untouched", "caller_directory_untouched"]
TOP_KEYS = {"status", "device", "seed", "cpu_threads", "versions", "tested", "warnings", "config", "scalar", "binned",
            "implicit_prm", "data", "checks", "library_output", "timings_s"}
TINY = probe_kit.TINY_PALM  # the one tiny config (scripts/probe_kit.py)


@pytest.fixture(scope="module")
def reward_smoke():
    return load_script(REWARD_SMOKE, "tiny_reward_smoke")



def test_in_process_report(reward_smoke, capsys, monkeypatch, empty_dir):
    code, report = inprocess(reward_smoke, capsys, monkeypatch, empty_dir)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert report["status"] == "ok" and TOP_KEYS <= report.keys()
    assert [c["name"] for c in report["checks"]] == CHECK_NAMES
    scalar = report["scalar"]
    assert scalar["train_pairs"] == 21 and scalar["held_out_pairs"] == 7 and scalar["chance"] == 0.5
    assert scalar["held_out_accuracy"] > 0.5 and scalar["loss_after"] < scalar["loss_before"]
    binned = report["binned"]
    assert binned["num_bins"] == 2 and binned["loss_after"] < binned["loss_before"]
    assert all(b in (0, 1) for b in binned["inference_sample"])
    prm = report["implicit_prm"]
    assert prm["rewards_shape"] == [prm["sequence_shape"][0], prm["sequence_shape"][1] - 1]
    assert prm["reference_tensors_with_grad"] == 0 and prm["policy_tensors_with_grad"] > 0
    assert prm["labelled_output"] == pytest.approx(-prm["bce"], abs=1e-5)
    assert prm["bce_after_step"] < prm["bce"]
    assert report["data"] == {"file": "responses.txt", "pairs": 28, "keyword": "thank",
                              "prompt": "Reply to the customer: "}
    assert list(empty_dir.iterdir()) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_held_out_accuracy_above_chance_for_other_seeds(reward_smoke, capsys, monkeypatch, empty_dir, seed):
    code, report = inprocess(reward_smoke, capsys, monkeypatch, empty_dir, "--seed", str(seed))
    assert code == 0 and report["scalar"]["held_out_accuracy"] > 0.5


def test_cli_by_path_json_from_empty_dir(empty_dir):
    proc, report = run_json([sys.executable, str(REWARD_SMOKE), "--json"], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]
    assert report["device"] == "cpu" and report["scalar"]["held_out_accuracy"] > 0.5
    assert list(empty_dir.iterdir()) == []


def test_installed_console_script(empty_dir):
    exe = BIN / "tiny-reward-smoke"
    assert exe.exists(), "install the package first: pip install '.[test]'"
    proc, report = run_json([str(exe), "--json", "--device", "cpu"], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]
    assert list(empty_dir.iterdir()) == []


def test_forced_failure_exits_1(reward_smoke, capsys, monkeypatch, empty_dir):
    code, report = inprocess(reward_smoke, capsys, monkeypatch, empty_dir, "--lr", "0")
    assert code == 1 and report["status"] == "failed"
    failed = {c["name"] for c in report["checks"] if not c["passed"]}
    assert {"scalar_mse_loss_decreases", "binned_cross_entropy_decreases"} <= failed


@pytest.mark.parametrize("argv", [["--bogus"], ["--steps", "1"], ["--lr", "-1"], ["--cpu-threads", "0"],
                                  ["--lr", "inf"], ["--steps", "100000000"], ["--seed", "-1"], ["--cpu-threads", "100000"], ["--device", "tpu"]])
def test_usage_errors_one_line_exit_2(empty_dir, argv):
    usage_error_without_torch(REWARD_SMOKE, argv, empty_dir)


def test_help_without_torch(empty_dir):
    proc = run([sys.executable, "-X", "importtime", str(REWARD_SMOKE), "--help"], empty_dir)
    assert proc.returncode == 0 and "--steps" in proc.stdout and "exit codes" in proc.stdout
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_missing_responses_file_exits_2(reward_smoke, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(reward_smoke, "RESPONSES_FILE", tmp_path / "absent.txt")
    monkeypatch.chdir(tmp_path)
    assert runner.run_cli(reward_smoke.main, ["--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "responses file missing" in err


def test_responses_file_is_pairs_of_thanking_and_plain_replies(reward_smoke):
    pairs = reward_smoke.load_pairs()
    assert len(pairs) == 28
    assert all(reward_smoke.rating(a) == 1.0 and reward_smoke.rating(b) == 0.0 for a, b in pairs)
    train, held = reward_smoke.split(pairs)
    assert len(train) == 21 and len(held) == 7 and not set(train) & set(held)


# facts stated in sub-skills/reward-modeling/*.md (their code blocks run in test_doc_code_blocks.py)

def test_reward_model_signature_as_documented():
    """reward-api.md owns RewardModel's generated signature block; palm-rlhf-skill check compares
    it with the installed library."""
    from palm_rlhf_pytorch import RewardModel
    check = load_script(REPO / "scripts" / "check_skill.py", "check_skill")
    path = SUBSKILL / "references" / "reward-api.md"
    doc = path.read_text(encoding="utf-8")
    assert [m["symbol"] for m in check.generated_blocks(doc)] == ["palm_rlhf_pytorch.RewardModel"]
    assert check.compare_docs(check.version_gate.load_api_record(), [path]) == []
    assert list(inspect.signature(RewardModel.forward).parameters)[1:] == [
        "x", "mask", "prompt_mask", "prompt_lengths", "labels", "disable_lora"]


def test_use_lora_false_trains_the_whole_copy():
    from palm_rlhf_pytorch import PaLM, RewardModel
    reward_model = RewardModel(PaLM(**TINY), use_lora=False)
    assert reward_model.reward_lora_scope is None and not reward_model.palm.finetune_modules
    ids = {id(p) for p in reward_model.finetune_parameters()}
    assert {id(p) for p in reward_model.palm.parameters()} <= ids
    assert {id(p) for p in reward_model.to_pred.parameters()} <= ids
    assert not RewardModel(PaLM(**TINY), num_binned_output=1).binned_output
    logits = RewardModel(PaLM(**TINY), num_binned_output=5, sample_from_bins=False).eval()(
        __import__("torch").randint(1, 257, (3, 6)))
    assert tuple(logits.shape) == (3, 5) and logits.is_floating_point()


def test_trainers_declare_reward_model_and_reject_implicit_prm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # TPO writes ./tpo_memmap_replay_buffer
    import importlib
    import torch
    from palm_rlhf_pytorch import ImplicitPRM, PaLM, RewardModel
    from beartype.roar import BeartypeCallHintParamViolation
    for spec in trainers.TRAINERS.values():
        trainer = spec.load()
        assert inspect.signature(trainer.__init__).parameters["reward_model"].annotation in (RewardModel, "RewardModel")
        source = inspect.getsource(sys.modules[trainer.__module__])
        assert "prompt_mask = prompt_mask" in source and "mask = mask" in source
    assert "rewards must be sequence level for TPO" in inspect.getsource(importlib.import_module("palm_rlhf_pytorch.tpo"))
    from palm_rlhf_pytorch import RLHFTrainer
    with pytest.raises(BeartypeCallHintParamViolation):
        RLHFTrainer(palm=PaLM(**TINY), reward_model=ImplicitPRM(PaLM(**TINY)),
                    prompt_token_ids=torch.randint(1, 257, (2, 3)))
    assert "prompt_mask" not in inspect.signature(ImplicitPRM.forward).parameters
    # GRPO, TPO and FlowRL have no beartype: they accept an ImplicitPRM and fail at the first rollout
    for name in [n for n in trainers.TRAINERS if n != "ppo"]:
        trainer = tiny_trainers.tiny_trainer(name, reward_model=ImplicitPRM(probe_kit.tiny_palm()),
                                         prompt_token_ids=torch.randint(1, TINY["num_tokens"], (2, 3)))
        with pytest.raises(TypeError, match="unexpected keyword argument 'prompt_mask'"):
            trainer.train(num_episodes=1, max_timesteps=1, update_timesteps=1, max_seq_len=6)
    from palm_rlhf_pytorch import ActorCritic
    critic_type = inspect.signature(ActorCritic.__init__).parameters["critic"].annotation
    assert "ImplicitPRM" in str(critic_type) and "PaLM" in str(critic_type)
    assert "ImplicitPRM" in str(inspect.signature(RLHFTrainer.__init__).parameters["critic"].annotation)


def test_grpo_trains_with_a_binned_reward_model(tmp_path, monkeypatch):
    import torch
    from palm_rlhf_pytorch import PaLM, RewardModel
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    palm = PaLM(**TINY)
    reward_model = RewardModel(palm, num_binned_output=5)
    scores = []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer = tiny_trainers.tiny_trainer("grpo", palm=palm, reward_model=reward_model,  # groups of 4, minibatch 4
                                         prompt_token_ids=torch.randint(1, TINY["num_tokens"], (4, 3)))
        hook = trainer.reward_model.register_forward_hook(lambda _m, _i, out: scores.append(out))
        trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=8)
        hook.remove()
    assert scores and all(s.dtype == torch.long and s.shape == (4,) for s in scores)


def test_implicit_prm_signature_and_params():
    import torch
    import torch.nn.functional as F
    from palm_rlhf_pytorch import ImplicitPRM, PaLM
    assert list(inspect.signature(ImplicitPRM.__init__).parameters)[1:] == ["model", "ref_model", "beta"]
    assert inspect.signature(ImplicitPRM.__init__).parameters["beta"].default == 0.1
    ref = PaLM(**TINY)
    policy = PaLM(**TINY)
    prm = ImplicitPRM(policy, ref_model=ref)
    assert prm.ref_model is ref and all(not p.requires_grad for p in ref.parameters())
    assert {id(p) for p in prm.parameters()} == {id(p) for p in policy.parameters()}
    assert {n.split(".")[0] for n, _ in prm.named_parameters()} == {"model", "ref_model"}
    seq = torch.randint(1, 257, (2, 9))
    assert prm(seq).shape == (2, 8)
    assert torch.isfinite(prm(seq, torch.tensor([1, 0]))).all()  # int labels accepted
    labels = torch.tensor([1., 0.])
    bce = lambda: F.binary_cross_entropy_with_logits(prm(seq), labels[:, None].expand(2, 8)).item()
    before = bce()
    prm(seq, labels).backward()  # plain gradient descent on the returned value...
    with torch.no_grad():
        for p in policy.parameters():
            p.sub_(p.grad, alpha=1.0)
    assert bce() > before  # ...raises the cross-entropy
    padded = seq.clone()
    padded[:, -3:] = -1
    with pytest.raises(IndexError):
        prm(padded)  # causal PaLM: negative input ids


def test_skill_md_frontmatter_and_links():
    text = (SUBSKILL / "SKILL.md").read_text(encoding="utf-8")
    assert re.search(r"^name: reward-modeling$", text, re.M)
    assert re.search(r"^disable-model-invocation: true$", text, re.M)
    description = re.search(r"^description: (.+)$", text, re.M).group(1)
    assert len(description) <= 1024 and "palm-modeling" in description and "policy-optimization" in description
    for md in [SUBSKILL / "SKILL.md", *sorted((SUBSKILL / "references").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+\.md)\)", md.read_text(encoding="utf-8")):
            assert (md.parent / target).resolve().is_file(), f"{md.name} links missing {target}"
    do_not_use = text.split("## Do not use for")[1].split("##")[0]
    assert "../policy-optimization/SKILL.md" in do_not_use and "../palm-modeling/SKILL.md" in do_not_use


def test_root_router_and_shared_references():
    root = (REPO / "SKILL.md").read_text(encoding="utf-8")
    routes = re.findall(r"\]\((sub-skills/[^)]+/SKILL\.md)\)", root)
    assert sorted(routes) == ["sub-skills/palm-modeling/SKILL.md", "sub-skills/policy-optimization/SKILL.md",
                              "sub-skills/reward-modeling/SKILL.md"]
    assert all((REPO / r).is_file() for r in routes)
    for target in re.findall(r"\]\(([^)#]+\.md)\)", root):
        assert (REPO / target).is_file(), target
    policy = (REPO / "sub-skills/policy-optimization/SKILL.md").read_text(encoding="utf-8")
    do_not_use = policy.split("## Do not use for")[1].split("##")[0]
    assert "../palm-modeling/SKILL.md" in do_not_use and "../reward-modeling/SKILL.md" in do_not_use
    install = (REPO / "references/installation.md").read_text(encoding="utf-8")
    for script in ("tiny_rlhf_smoke.py", "tiny_palm_smoke.py", "tiny_reward_smoke.py",
                   "tiny-rlhf-smoke", "tiny-palm-smoke", "tiny-reward-smoke"):
        assert script in install


def test_glossary_names_exist():
    import importlib
    from palm_rlhf_pytorch import ActorCritic, PaLM, RLHFTrainer
    glossary = (REPO / "references/glossary.md").read_text(encoding="utf-8")
    for name in ("PaLM", "RewardModel", "ImplicitPRM", "ActorCritic"):
        assert name in glossary and hasattr(importlib.import_module("palm_rlhf_pytorch"), name)
    for method in ("add_finetune_params", "merge_finetune_params", "generate"):
        assert f"PaLM.{method}" in glossary and hasattr(PaLM, method)
    assert inspect.signature(RLHFTrainer.__init__).parameters["kl_div_loss_weight"].default == 0.1
    assert "self.partition_function = " in inspect.getsource(importlib.import_module("palm_rlhf_pytorch.flowrl"))
    critic_src = inspect.getsource(ActorCritic)
    assert "self.value_head" in critic_src and "self.critic" in critic_src


def test_reward_model_details_as_documented(reward_smoke):
    import torch
    from palm_rlhf_pytorch import PaLM, RewardModel
    torch.manual_seed(0)
    reward_model = RewardModel(PaLM(**TINY)).eval()
    assert all(m.p == 0.1 for m in reward_model.palm.modules() if isinstance(m, torch.nn.Dropout))
    head = reward_model.to_pred[0]
    assert isinstance(head, torch.nn.Linear) and head.out_features == 1 and head.bias is None
    for embed in (reward_model.prompt_embed, reward_model.response_embed):
        assert embed.shape == (1, 1, 32) and (embed == 0).all()
    x = torch.cat([torch.randint(1, 257, (2, 5)), torch.zeros(2, 4, dtype=torch.long)], dim=1)
    assert not torch.allclose(reward_model(x), reward_model(x, mask=x != 0))  # padding averaged in
    args = reward_smoke.build_parser().parse_args([])
    assert args.steps == 20 and args.lr == 3e-3                             # "lr 3e-3, 20 steps"
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'tiny-palm-smoke = "palm_rlhf_skill.cli:tiny_palm_smoke"' in pyproject
    assert 'tiny-reward-smoke = "palm_rlhf_skill.cli:tiny_reward_smoke"' in pyproject


def test_trainers_pad_with_zero():
    import importlib
    for module, cls in [("palm_rlhf_pytorch.ppo", "RLHFTrainer"), ("palm_rlhf_pytorch.grpo", "RLHFTrainer"),
                        ("palm_rlhf_pytorch.tpo", "RLHFTrainer"), ("palm_rlhf_pytorch.flowrl", "FlowRLTrainer")]:
        trainer = getattr(importlib.import_module(module), cls)
        assert inspect.signature(trainer.__init__).parameters["pad_value"].default == 0
