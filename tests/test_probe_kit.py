"""The probe kit (scripts/probe_kit.py): torch-free at import, importable from a bare copy of the
tree, each trainer built with the smoke's settings, the one home of the tiny configs (the
smokes, the learning check and the docs' figures follow it), and references/probes.md's table
against it. The probes themselves run in test_doc_code_blocks.py."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

import probe_kit
from conftest import REPO, run
from policy_optimization import tiny_trainers, trainers
from policy_optimization.smoke import learning_check, settings

PROBES = REPO / "references" / "probes.md"
TINY_TEXT = ", ".join(f"{k}={v}" for k, v in probe_kit.TINY_PALM.items())


def test_import_needs_no_torch(tmp_path):
    proc = run([sys.executable, "-X", "importtime", "-c",
                f"import sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); import probe_kit"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_a_bare_copy_with_the_library_builds_every_trainer(tmp_path):
    """Only the tree (no package of ours on the path, -I: no PYTHONPATH, no cwd): the kit imports
    from the copy and builds each trainer."""
    copy = tmp_path / "skill"
    copy.mkdir()
    for part in ("SKILL.md", "scripts", "sub-skills", "references"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, copy / part)
    script = ("import sys, time; sys.path.insert(0, sys.argv[1]); import probe_kit; "
              "from policy_optimization import tiny_trainers; start = time.perf_counter(); "
              "built = [type(tiny_trainers.tiny_trainer(n)).__module__ for n in ('ppo', 'grpo', 'tpo', 'flowrl')]; "
              "print(probe_kit.__file__, *built, round(time.perf_counter() - start, 1))")
    proc = subprocess.run([sys.executable, "-I", "-c", script, str(copy / "scripts")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={"CUDA_VISIBLE_DEVICES": "", "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, *modules, seconds = proc.stdout.split()
    assert where == str(copy / "scripts" / "probe_kit.py")
    assert modules == [spec.load().__module__ for spec in trainers.TRAINERS.values()]
    assert float(seconds) < 60  # about a second each on a quiet machine


@pytest.mark.parametrize("name", list(trainers.TRAINERS))
def test_tiny_trainer_has_the_smokes_settings(name):
    spec = trainers.TRAINERS[name]
    trainer = tiny_trainers.tiny_trainer(name)
    assert trainer.minibatch_size == tiny_trainers.SMOKE_MINIBATCH[name]
    assert trainer.accelerate.device.type == "cpu" and trainer.prompt_token_ids.device.type == "cpu"
    assert trainer.prompt_token_ids.equal(probe_kit.tiny_prompt_ids(0))
    palm = trainers.actor_palm(name, trainer)
    assert (palm.dim, palm.num_tokens) == (probe_kit.TINY_PALM["dim"], probe_kit.TINY_PALM["num_tokens"])
    if spec.group_kwarg:
        assert getattr(trainer, spec.group_kwarg) == tiny_trainers.GROUP_SAMPLES == settings.smoke_group(spec) - 1
    first = lambda t: next(m for m in t.partition_function.modules() if type(m).__name__ == "Linear")
    if name == "flowrl":
        assert first(trainer).in_features == probe_kit.TINY_PALM["dim"]
    other = tiny_trainers.tiny_trainer(name, palm=probe_kit.tiny_palm(dim=48), minibatch_size=3, epochs=2)
    assert (other.minibatch_size, other.epochs) == (3, 2)  # overrides win; FlowRL's width follows the PaLM
    if name == "flowrl":
        assert first(other).in_features == 48


def test_group_size_and_names_are_checked():
    assert tiny_trainers.trainer_kwargs("grpo", group_size=2)["grpo_num_times_sample_rewards"] == 1
    assert "max_norm" in tiny_trainers.trainer_kwargs("ppo", group_size=1)
    with pytest.raises(ValueError, match="ppo samples one completion per prompt"):
        tiny_trainers.trainer_kwargs("ppo", group_size=4)
    with pytest.raises(ValueError, match="unknown trainer 'sac': choose from ppo, grpo, tpo, flowrl"):
        tiny_trainers.tiny_trainer("sac")


def test_explicit_none_prompts_reach_the_library():
    """prompt_token_ids=None is passed on (a probe of the library's own assertion), not replaced."""
    with pytest.raises(AssertionError):
        tiny_trainers.tiny_trainer("grpo", prompt_token_ids=None)


def test_one_home_for_the_tiny_configs():
    """The smokes and the learning check take their sizes from the kit; the learning check's PaLM
    is the tiny one over 16 ids; the byte tokenizer's vocabulary is the tiny one's."""
    from skill_runtime import byte_tokenizer
    assert probe_kit.TINY_PALM == dict(num_tokens=257, dim=32, depth=1, heads=2, dim_head=16)
    assert probe_kit.TINY_PALM["num_tokens"] == byte_tokenizer.ByteTokenizer.vocab_size
    assert learning_check.LEARN_PALM == {**probe_kit.TINY_PALM, "num_tokens": 16}
    planner = {"test_plan.py", "test_bench.py"}  # whole runs to plan and time, not the tiny config
    for path in ("sub-skills/policy-optimization/scripts/policy_optimization", "sub-skills/palm-modeling/scripts",
                 "sub-skills/reward-modeling/scripts", "tests"):
        for source in sorted(p for p in (REPO / path).rglob("*.py") if p.name not in planner | {"test_probe_kit.py"}):
            text = source.read_text(encoding="utf-8")
            assert not re.search(r"\bdim_head\s*=\s*\d|\"dim_head\":\s*\d", text), f"{source}: a tiny config of its own"


def test_docs_give_the_kits_figures():
    """Every prose copy of the tiny config and of the kit's settings matches the kit."""
    for doc in (PROBES, REPO / "sub-skills" / "policy-optimization" / "references" / "workflows.md",
                REPO / "sub-skills" / "policy-optimization" / "references" / "trainer-selection.md"):
        text = " ".join(doc.read_text(encoding="utf-8").split())
        assert f"num_tokens={probe_kit.TINY_PALM['num_tokens']}, dim=" in text and TINY_TEXT in text, doc.name
    text = " ".join(PROBES.read_text(encoding="utf-8").split())
    minibatch = ", ".join(str(tiny_trainers.SMOKE_MINIBATCH[n]) for n in trainers.TRAINERS)
    assert f"`ppo`, `grpo`, `tpo` or `flowrl`: minibatch {minibatch}, groups of {tiny_trainers.GROUP_SAMPLES + 1}" in text
    low, high = probe_kit.PROMPT_LENGTHS
    assert f"`({probe_kit.PROMPT_COUNT}, max_len)` int64 prompt ids of {low} to {high} tokens" in text
    assert f"the longest prompt + {tiny_trainers.NEW_TOKENS}" in text


def test_probes_md_is_routed_and_budgeted():
    skill = (REPO / "SKILL.md").read_text(encoding="utf-8")
    row = next(line for line in skill.splitlines() if "(references/probes.md)" in line)
    assert "the tree is silent or you doubt a fact" in row
    from skill_check import budget
    assert "references/probes.md" in budget.BUDGET["reference tokens"]


def test_run_by_path_says_it_is_a_module(empty_dir):
    from conftest import usage_error_without_torch
    line = usage_error_without_torch(REPO / "scripts" / "probe_kit.py", [], empty_dir)
    assert line.startswith("probe_kit.py: error: a module, not a command: ") and "references/probes.md" in line
