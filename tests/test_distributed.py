"""Multi-process (DDP) training: the smoke's --nproc mode and its runs under torchrun, accelerate
launch and srun (two simulated nodes on 127.0.0.1), the user-side fixes in ddp_fixes.py and their
canaries, the FSDP findings, and the launch facts and recipes that references/distributed.md states.

Each 2-process run is tiny (dim 32, depth 1, a few rollouts) over gloo on 127.0.0.1. The tests that
start a multi-process world are marked ``distributed`` (select them with ``pytest -m distributed``;
they also run in the default suite, one world at a time: conftest.py); the single-process ones are not,
so they run beside the worlds.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import BIN, REPO, SMOKE, default_signals, load_script, run, run_json
import probe_kit
from skill_runtime import exits, placement, streams, version_gate
from policy_optimization import trainers
from policy_optimization.smoke import estimate, settings
from policy_optimization.smoke import ranks as smoke_ranks
from policy_optimization.smoke import report as smoke_report
from run_kit import launch

SCRIPTS = REPO / "sub-skills" / "policy-optimization" / "scripts"
TRAINERS = list(trainers.TRAINERS)
EOS = "3"  # an id no seed-0 prompt contains (the smoke refuses one that does)


def checks_of(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory):
    """`tiny-rlhf-smoke --trainer all --nproc 2 --eos-token 3 --json --progress` (installed console
    script) from an empty dir: rollouts end at eos at lengths that differ between the ranks."""
    cwd = tmp_path_factory.mktemp("fixed")
    exe = BIN / "tiny-rlhf-smoke"
    assert exe.exists(), "install the package first: pip install '.[test]'"
    proc, report = run_json([str(exe), "--trainer", "all", "--nproc", "2", "--eos-token", EOS, "--json",
                             "--progress"], cwd)
    return proc, report, cwd


@pytest.fixture(scope="module")
def unfixed_run(tmp_path_factory):
    """The same run without ddp_fixes.py: what each trainer does under plain DDP."""
    cwd = tmp_path_factory.mktemp("unfixed")
    proc, report = run_json([sys.executable, str(SMOKE), "--trainer", "all", "--nproc", "2",
                             "--no-ddp-fixes", "--json"], cwd)
    return proc, report, cwd


@pytest.mark.distributed
def test_all_trainers_in_sync_with_fixes(fixed_run):
    proc, report, cwd = fixed_run
    assert proc.returncode == 0, [(n, c) for n, r in report["results"].items()
                                  for c in r["checks"] if not c["passed"]]
    assert report["status"] == "ok" and report["nproc"] == 2 and report["distributed_type"] == "MULTI_CPU"
    assert report["launcher"]["master"].startswith("127.0.0.1:") and report["launcher"]["ddp_fixes"]
    assert report["launcher"]["resources"]["predicted_mib"] <= report["launcher"]["resources"]["available_mib"]
    assert set(report["results"]) == set(TRAINERS)
    differ = []
    for name, result in report["results"].items():
        checks = checks_of(result)
        for required in ("accelerate_multi_process", "ranks_in_sync", "ranks_drew_different_prompts",
                         "only_main_process_wrote", "all_ranks_passed", "caller_directory_untouched",
                         "update_ran", "actor_lora_changed", "base_weights_unchanged", "parameters_finite",
                         "rollouts_ended_at_eos"):
            assert checks[required]["passed"], (name, checks[required])
        lengths = [r["rollout_lengths"] for r in result["ranks"]]
        assert result["eos"]["longest_rollout_per_rank"] == [max(n) for n in lengths]
        if result["eos"]["ranks_differ"]:
            differ.append(name)
        sync = result["rank_sync"]
        assert sync["mismatched"] == 0 and sync["trainable_compared"] == result["parameters"]["trainable_total"]
        assert sync["tensors_compared"] == result["parameters"]["trainable_total"] + result["parameters"]["frozen_total"]
        assert [r["status"] for r in result["ranks"]] == ["ok", "ok"]
        draws = [r["prompt_draws"] for r in result["ranks"]]
        assert draws[0] != draws[1] and len(draws[0]) == result["optimizer_steps"]["rollouts"]
        assert result["checkpoint"]["saves_per_rank"] == [1, 0]
    # the case fix_buffers is for: rotary caches of different lengths on the ranks
    assert differ, [r["eos"] for r in report["results"].values()]
    tpo = checks_of(report["results"]["tpo"])
    assert tpo["replay_buffer_per_rank"]["passed"] and "rank1/tpo_memmap_replay_buffer" in tpo["replay_buffer_per_rank"]["detail"]
    assert list(cwd.iterdir()) == []


@pytest.mark.distributed
def test_rank_0_progress_reaches_the_launching_process(fixed_run):
    """--nproc with --progress: rank 0's progress lines (one per trainer and stage, with the elapsed
    time) reach the launching process's stderr; stdout holds only the report."""
    proc, report, _ = fixed_run
    for name in TRAINERS:
        assert re.search(rf"tiny-rlhf-smoke rank 0 of 2: {name}: update: \d+/\d+ rollouts \[\d\d:\d\d", proc.stderr), name
    assert "tiny-rlhf-smoke: starting 2 processes with torchrun" in proc.stderr
    assert json.loads(proc.stdout) == report


@pytest.mark.distributed
def test_construct_only_on_two_ranks(empty_dir):
    """--construct-only --nproc 2: built and in sync on both ranks; TPO has no replay buffer yet,
    so the per-rank buffer check is not made (it failed this mode before)."""
    proc, report = run_json([str(BIN / "tiny-rlhf-smoke"), "--trainer", "tpo", "--nproc", "2",
                             "--construct-only", "--json"], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", report.get("checks")
    checks = checks_of(report["results"]["tpo"])
    assert checks["ranks_in_sync"]["passed"] and "replay_buffer_per_rank" not in checks
    assert report["mode"] == "construct-only" and report["timings_s"]["update"] is None
    assert list(empty_dir.iterdir()) == []


@pytest.mark.distributed
def test_no_library_output_on_stdout(fixed_run):
    proc, _, _ = fixed_run
    assert "policy_loss:" not in proc.stdout and "training complete" not in proc.stdout
    assert proc.stdout.lstrip().startswith("{") and proc.stdout.rstrip().endswith("}")


# canaries: each asserts the upstream cause its fix works around; when one fails, upstream changed:
# re-check the fix in ddp_fixes.py and drop it if it is no longer needed.

@pytest.mark.distributed
def test_unfixed_ppo_drifts_between_ranks(unfixed_run):
    """Canary for fix_ppo: PPO's actor steps before DDP has averaged its gradients."""
    proc, report, cwd = unfixed_run
    assert proc.returncode == 1 and report["status"] == "failed"
    ppo = report["results"]["ppo"]
    checks = checks_of(ppo)
    assert checks["update_ran"]["passed"] and not checks["ranks_in_sync"]["passed"]
    sync = ppo["rank_sync"]
    assert sync["trainable_mismatched"] > 0 and sync["frozen_mismatched"] == 0 and sync["max_abs_diff"] > 0
    assert all(".finetune_modules.actor." in n for n in sync["mismatched_names"])  # the actor LoRA
    assert list(cwd.iterdir()) == []


@pytest.mark.distributed
def test_unfixed_grpo_stays_in_sync(unfixed_run):
    """GRPO needs no gradient fix: one backward per step, so DDP's own averaging is exact (without
    eos, where every rollout has the same length)."""
    checks = checks_of(unfixed_run[1]["results"]["grpo"])
    assert checks["update_ran"]["passed"] and checks["ranks_in_sync"]["passed"]


@pytest.mark.distributed
def test_unfixed_tpo_has_no_generate_on_ddp_wrapper(unfixed_run):
    """Canary for fix_tpo (generate): tpo.py train() calls self.actor.generate on the DDP wrapper."""
    detail = checks_of(unfixed_run[1]["results"]["tpo"])["update_ran"]["detail"]
    assert detail == "AttributeError: 'DistributedDataParallel' object has no attribute 'generate'"


def test_tpo_replay_buffer_folder_is_hard_coded():
    """Canary for fix_tpo (per-rank folder): no argument sets the replay-buffer folder."""
    from palm_rlhf_pytorch.tpo import RLHFTrainer
    fixes = load_script(REPO / "scripts" / "ddp_fixes.py", "ddp_fixes")
    source = inspect.getsource(RLHFTrainer.train)
    assert f"folder = './{fixes.TPO_BUFFER}'" in source
    params = [*inspect.signature(RLHFTrainer.train).parameters, *inspect.signature(RLHFTrainer).parameters]
    assert not any("folder" in p or "buffer" in p for p in params)


@pytest.mark.distributed
def test_unfixed_flowrl_reads_actor_palm_off_ddp_wrapper(unfixed_run):
    """Canary for fix_flowrl: flowrl.py learn() reads self.actor.actor_palm."""
    detail = checks_of(unfixed_run[1]["results"]["flowrl"])["update_ran"]["detail"]
    assert detail == "AttributeError: 'DistributedDataParallel' object has no attribute 'actor_palm'"


@pytest.mark.distributed
def test_unfixed_save_writes_prefixed_keys_from_every_rank(unfixed_run):
    """Canary for save_checkpoint: trainer.save() saves the DDP wrapper from every rank."""
    result = unfixed_run[1]["results"]["grpo"]
    assert result["checkpoint"]["saves_per_rank"] == [1, 1]
    detail = checks_of(result)["only_main_process_wrote"]["detail"]
    assert "19 keys, 19 with 'module.' prefix" in detail


# single-process behaviour of the fixes ----------------------------------------------------------

def test_fixes_are_no_ops_in_one_process(smoke, empty_dir, monkeypatch):
    import torch
    from palm_rlhf_pytorch import PaLM, RewardModel
    from palm_rlhf_pytorch.tpo import RLHFTrainer
    fixes = load_script(REPO / "scripts" / "ddp_fixes.py", "ddp_fixes")
    monkeypatch.chdir(empty_dir)
    palm = PaLM(**probe_kit.TINY_PALM)
    trainer = RLHFTrainer(palm=palm, reward_model=RewardModel(palm, num_binned_output=0),
                          prompt_token_ids=probe_kit.tiny_prompt_ids(0), accelerate_kwargs={"cpu": True})
    train = trainer.train
    assert fixes.apply_ddp_fixes(trainer) == "tpo" and not fixes.is_distributed(trainer)
    assert trainer.train == train and "generate" not in vars(trainer.actor)
    assert fixes.save_checkpoint(trainer, empty_dir / "ckpt.pt") is True
    keys = set(torch.load(empty_dir / "ckpt.pt", weights_only=True))
    assert keys == set(trainer.actor.state_dict()) and not any(k.startswith("module.") for k in keys)
    trainer.load(empty_dir / "ckpt.pt")  # the page: trainer.load reads it in a single process
    with pytest.raises(ValueError, match="not a palm_rlhf_pytorch trainer"):
        fixes.trainer_kind(object())


def test_expose_wrapped_attributes_registers_nothing():
    import torch
    fixes = load_script(REPO / "scripts" / "ddp_fixes.py", "ddp_fixes")

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    inner = torch.nn.Module()
    inner.actor_palm = torch.nn.Linear(2, 2)
    wrapper = Wrapper(inner)
    fixes.expose_wrapped_attributes(wrapper, ["actor_palm"])
    assert wrapper.actor_palm is inner.actor_palm
    assert list(wrapper.state_dict()) == ["module.actor_palm.weight", "module.actor_palm.bias"]


def test_rank_workdir_returns_to_caller(tmp_path, monkeypatch):
    import os
    fixes = load_script(REPO / "scripts" / "ddp_fixes.py", "ddp_fixes")
    monkeypatch.chdir(tmp_path)
    with fixes.rank_workdir(1) as folder:
        assert Path(os.getcwd()) == folder == tmp_path / "rank1"
    assert Path(os.getcwd()) == tmp_path


# launch facts stated in references/distributed.md ------------------------------------------------

PROBE = textwrap.dedent("""
    import os
    from accelerate import Accelerator
    a = Accelerator()
    with open(f"probe-{os.getpid()}.txt", "w") as f:  # one file per process: no interleaving
        f.write(f"probe {os.environ.get('RANK')} {a.distributed_type} {a.num_processes}")
    with open(f"env-{os.getpid()}.txt", "w") as f:
        f.write(" ".join(sorted(os.environ)))
""")


def probe_lines(cmd, cwd, env=None):
    """What each started process's Accelerator selected: one line per process, sorted."""
    for old in cwd.glob("probe-*.txt"):
        old.unlink()
    run(cmd, cwd, env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **(env or {})}, timeout=120)
    return sorted(f.read_text() for f in cwd.glob("probe-*.txt"))


def torchrun(script, port):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(port), str(script)]


@pytest.mark.distributed
def test_torchrun_on_cpu_needs_accelerate_use_cpu(empty_dir):
    script = empty_dir.parent / "probe.py"
    script.write_text(PROBE)
    plain = probe_lines(torchrun(script, launch.free_port()), empty_dir)
    assert plain == ["probe 0 DistributedType.NO 1", "probe 1 DistributedType.NO 1"]
    cpu = probe_lines(torchrun(script, launch.free_port()), empty_dir, env={"ACCELERATE_USE_CPU": "true"})
    assert cpu == ["probe 0 DistributedType.MULTI_CPU 2", "probe 1 DistributedType.MULTI_CPU 2"]
    # the page's table of what torchrun sets in each rank's environment
    row = next(line for line in MULTI.read_text(encoding="utf-8").splitlines() if line.startswith("| `torchrun` |"))
    documented = set(re.findall(r"`([A-Z_]+)`", row))
    for names in (f.read_text().split() for f in empty_dir.glob("env-*.txt")):
        assert len(documented) == 8 and documented <= set(names), documented - set(names)


def test_accelerate_launch_cpu_starts_one_process(empty_dir):
    script = empty_dir.parent / "probe.py"
    script.write_text(PROBE)
    lines = probe_lines([str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", str(script)], empty_dir)
    assert lines == ["probe None DistributedType.NO 1"]


MIXED = textwrap.dedent("""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    for mp in ("bf16", "fp16"):
        a = Accelerator(cpu=True, mixed_precision=mp)
        model = a.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
        inner = []  # dtype inside the model (prepare converts the model's output back to fp32)
        model[0].register_forward_hook(lambda m, i, o: inner.append(o.dtype))
        out = model(torch.randn(2, 4))
        print("mixed", mp, a.mixed_precision, a.native_amp, inner[0], out.dtype, flush=True)
        AcceleratorState._reset_state(True)
""")


def test_mixed_precision_on_cpu(empty_dir):
    proc = run([sys.executable, "-c", MIXED], empty_dir, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("mixed")]
    assert lines == ["mixed bf16 bf16 True torch.bfloat16 torch.float32",  # bf16 autocast runs on CPU
                     "mixed fp16 fp16 False torch.float32 torch.float32"], proc.stderr[-1500:]  # fp16: fp32


BF16_ROLLOUT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    import probe_kit
    from policy_optimization import tiny_trainers
    for name, group in (("grpo", 2), ("ppo", None)):
        torch.manual_seed(0)
        palm, reward = probe_kit.tiny_palm(), probe_kit.tiny_reward_model()
        trainer = tiny_trainers.tiny_trainer(name, palm=palm, reward_model=reward, group_size=group, minibatch_size=2,
                                         prompt_token_ids=torch.randint(1, 64, (4, 4)),
                                         accelerate_kwargs=dict(mixed_precision="bf16"))
        cls = type(trainer)
        trainer.print = lambda *a: None
        phase, seen = ["rollout forward"], {}
        record = lambda name: lambda m, i, o: seen.setdefault(phase[0] if name == "policy" else name, set()).add(
            (torch.is_autocast_enabled("cpu"), o.dtype))
        palm.layers[0].fn.fused_attn_ff_proj.register_forward_hook(record("policy"))
        reward.palm.layers[0].fn.fused_attn_ff_proj.register_forward_hook(record("reward model"))
        generate, learn = palm.generate, trainer.learn
        def sampling(*a, **k):
            phase[0] = "sampling"
            try:
                return generate(*a, **k)
            finally:
                phase[0] = "rollout forward"
        def learning(memories):
            phase[0] = "learn"
            learn(memories)
            phase[0] = "rollout forward"
        palm.generate, trainer.learn = sampling, learning
        trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=8)
        print("bf16", cls.__module__, sorted((k, sorted(map(str, v))) for k, v in seen.items()), flush=True)
""")


def test_bf16_leaves_the_sampling_loop_in_float32(empty_dir):
    """The page's Mixed precision note: autocast covers the prepared modules' forward (the rollout's
    full-sequence policy forward, the reward model, learn()), not PaLM.generate's sampling loop."""
    proc = run([sys.executable, "-c", BF16_ROLLOUT, str(REPO / "scripts")], empty_dir, timeout=240)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("bf16")]
    on, off = "(True, torch.bfloat16)", "(False, torch.float32)"
    expected = str([("learn", [on]), ("reward model", [on]), ("rollout forward", [on]), ("sampling", [off])])
    assert lines == [f"bf16 palm_rlhf_pytorch.grpo {expected}", f"bf16 palm_rlhf_pytorch.ppo {expected}"], \
        proc.stdout[-1500:] + proc.stderr[-1500:]


SEEDS = textwrap.dedent("""
    import sys, torch
    from accelerate.utils import set_seed
    import palm_rlhf_pytorch.grpo as grpo, palm_rlhf_pytorch.ppo as ppo, palm_rlhf_pytorch.tpo as tpo
    import palm_rlhf_pytorch.flowrl as flowrl
    for how in ("torch", "set_seed"):  # torch's first: the process's own unseeded random state
        torch.manual_seed(0) if how == "torch" else set_seed(0)
        draws = [m.randrange(0, 1000) for m in (grpo, ppo, tpo, flowrl) for _ in range(4)]  # the prompt draw
        print("seed", how, draws, torch.rand(2).tolist(), flush=True)
""")


def test_torch_manual_seed_leaves_the_prompt_draw_unseeded(empty_dir):
    """The page's Seeding note: the trainers draw prompts with Python's random.randrange, which
    torch.manual_seed does not seed (two processes differ) and set_seed does (they agree). Each of
    the two processes seeds with torch.manual_seed first, then with set_seed."""
    def draws():
        proc = run([sys.executable, "-c", SEEDS], empty_dir, timeout=120)
        lines = [ln.split(" ", 2) for ln in proc.stdout.splitlines() if ln.startswith("seed")]
        assert [how for _, how, _ in lines] == ["torch", "set_seed"], proc.stderr[-1500:]
        return {how: tuple(rest.split("] [")) for _, how, rest in lines}
    first, second = draws(), draws()
    (a, ta), (b, tb) = first["torch"], second["torch"]
    assert a != b and ta == tb  # prompts differ, torch's sampling stream is the same
    assert first["set_seed"] == second["set_seed"]


SINGLETON = textwrap.dedent("""
    from accelerate import Accelerator
    Accelerator(cpu=True, mixed_precision="bf16")
    Accelerator(cpu=True, mixed_precision="bf16")   # the same setting again: fine
    try:
        Accelerator(cpu=True, mixed_precision="no")
    except ValueError as exc:
        print("refused", str(exc).split(",")[0])
""")


def test_one_mixed_precision_per_process(empty_dir):
    """The page's Mixed precision note: a second Accelerator (a second trainer) in one process
    cannot change mixed_precision."""
    proc = run([sys.executable, "-c", SINGLETON], empty_dir, timeout=120)
    assert proc.stdout.strip() == "refused AcceleratorState has already been initialized and cannot be changed", \
        proc.stderr[-1500:]
    assert "AcceleratorState has already been initialized and cannot be changed" in " ".join(DOC.read_text(encoding="utf-8").split())


# usage errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--nproc", "0"], "--nproc: must be between 1 and 64"),
    (["--no-ddp-fixes"], "--no-ddp-fixes applies to --nproc runs or to the ranks a launcher started"),
    (["--learn", "--oversubscribe"], "--oversubscribe applies to the train smoke, not --learn"),
    (["--nproc", "2", "--eos-token", "68"], "--eos-token 68 occurs in prompt(s) [0]"),
    (["--nproc", "2", "--device", "cuda"], "needs 2 visible CUDA devices"),
    (["--nproc", "2", "--device", "cuda:1"], "use auto, cpu or cuda"),
])
def test_nproc_usage_errors_exit_2_one_line(empty_dir, argv, message):
    proc = run([sys.executable, str(SMOKE), *argv], empty_dir)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert list(empty_dir.iterdir()) == []


PPO_EXACT = textwrap.dedent("""
    import contextlib, hashlib, io, sys
    sys.path.insert(0, sys.argv[1])
    import tiny_rlhf_smoke as smoke, ddp_fixes
    import probe_kit  # the smoke put the skill root's scripts/ on sys.path
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM, RewardModel, RLHFTrainer
    for mode in sys.argv[2:]:
        set_seed(0)
        palm = PaLM(**probe_kit.TINY_PALM)
        trainer = RLHFTrainer(palm=palm, reward_model=RewardModel(palm, num_binned_output=0),
                              prompt_token_ids=probe_kit.tiny_prompt_ids(0), minibatch_size=2,
                              accelerate_kwargs=dict(cpu=True))
        if mode == "fixed":
            ddp_fixes.apply_ddp_fixes(trainer)
        set_seed(1)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            trainer.train(num_episodes=1, max_timesteps=6, update_timesteps=6, max_seq_len=14)
        digest = hashlib.sha256()
        for _, p in sorted(trainer.accelerate.unwrap_model(trainer.actor_critic).named_parameters()):
            digest.update(p.detach().numpy().tobytes())
        print("digest", mode, trainer.accelerate.distributed_type, digest.hexdigest(), flush=True)
""")


@pytest.mark.distributed
def test_fix_ppo_reproduces_single_process_training_bitwise(tmp_path):
    """One rank under torchrun (Accelerate still wraps DDP): unfixed PPO ends on different weights
    than the same run without DDP (the reducer writes the averaged actor gradient back after the
    actor already stepped, and the next minibatch accumulates onto it); with fix_ppo, bitwise equal.
    The unfixed half is a canary for fix_ppo too."""
    script = tmp_path / "ppo_exact.py"
    script.write_text(PPO_EXACT)
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}

    def digests(launcher, modes, extra=None):
        proc = run([*launcher, str(script), str(SCRIPTS), *modes], tmp_path, env={**env, **(extra or {})},
                   timeout=180)
        lines = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("digest")]
        assert [line[0] for line in lines] == modes, proc.stderr[-2000:]
        return {mode: (kind, digest) for mode, kind, digest in lines}

    found = digests([sys.executable], ["plain"])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
                "--master_addr", "127.0.0.1", "--master_port", str(launch.free_port())]
    found.update(digests(torchrun, ["unfixed", "fixed"], {"ACCELERATE_USE_CPU": "true"}))
    assert found["plain"][0] == "DistributedType.NO"
    assert found["unfixed"][0] == found["fixed"][0] == "DistributedType.MULTI_CPU"
    assert found["fixed"][1] == found["plain"][1]
    assert found["unfixed"][1] != found["plain"][1]


# references/distributed.md -----------------------------------------------------------------------

DOC = REPO / "sub-skills" / "policy-optimization" / "references" / "distributed.md"
MULTI = DOC.parent / "multi-node.md"  # the several-machine recipes


def doc_block(marker: str) -> str:
    """The fenced python block of distributed.md that contains ``marker``."""
    blocks = DOC.read_text(encoding="utf-8").split("```python\n")[1:]
    found = [b.split("```")[0] for b in blocks if marker in b]
    assert len(found) == 1, marker
    return found[0]


@pytest.mark.distributed
def test_doc_training_script_runs_on_two_ranks_in_sync(tmp_path):
    """The page's sync check and training script (skipped by test_doc_code_blocks: it needs
    torchrun) on 2 ranks, then its DDP load line: no drift, one checkpoint without 'module.'."""
    # counts per rank for distributed.md#batch-per-rank: items each learn() gets, optimizer steps
    script = textwrap.dedent("""
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from palm_rlhf_pytorch import RLHFTrainer as _PPO
        LEARNED, STEPS, _learn = [], [], _PPO.learn
        _PPO.learn = lambda self, memories: LEARNED.append(len(memories)) or _learn(self, memories)
        register_optimizer_step_post_hook(lambda *args: STEPS.append(1))
    """)
    script += doc_block("def drifted_parameters") + doc_block("apply_ddp_fixes(trainer)").replace(
        '"scripts"', repr(str(REPO / "scripts")))
    script += textwrap.dedent("""
        from ddp_fixes import checkpoint_module
        import torch.distributed as dist
        checkpoint_module(trainer).load_state_dict(torch.load("checkpoint.pt"))
        import os
        line = (f"doc-run {dist.get_rank()} {dist.get_world_size()} {len(list(trainer.parameters()))} {drifted} "
                f"{LEARNED} {len(STEPS)}\\n")
        os.write(1, line.encode())  # one write(2) per rank: lines from the two ranks never interleave
    """)
    (tmp_path / "train.py").write_text(script)
    cwd = tmp_path / "run"
    cwd.mkdir()
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(launch.free_port()), str(tmp_path / "train.py")], cwd,
               env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}, timeout=240)
    assert proc.returncode == 0, proc.stderr[:3000] + proc.stderr[-1500:]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("doc-run"))
    # each rank: its own 4 rollouts in one learn(), 2 minibatches of 2 (actor and critic step each)
    assert len(lines) == 2 and all(line.endswith(" 2 47 [] [4] 4") for line in lines), lines
    import torch
    keys = torch.load(cwd / "checkpoint.pt", weights_only=True)
    assert keys and not any(k.startswith("module.") for k in keys)
    assert sorted(p.name for p in cwd.iterdir()) == ["checkpoint.pt"]


DDP_FLAGS = textwrap.dedent("""
    import contextlib, io, json, os, sys, traceback
    sys.path.insert(0, sys.argv[1])
    import tiny_rlhf_smoke as smoke, ddp_fixes
    import probe_kit  # the smoke put the skill root's scripts/ on sys.path
    from accelerate.utils import DistributedDataParallelKwargs, set_seed
    from palm_rlhf_pytorch import PaLM, RewardModel, RLHFTrainer
    from palm_rlhf_pytorch.tpo import RLHFTrainer as TPOTrainer
    rank = os.environ["RANK"]

    def build(cls, **kwargs):
        set_seed(0)
        palm = PaLM(**probe_kit.TINY_PALM)
        return cls(palm=palm, reward_model=RewardModel(palm, num_binned_output=0),
                   prompt_token_ids=probe_kit.tiny_prompt_ids(0), **kwargs)

    def attempt(label, trainer, **train_kwargs):
        set_seed(0, device_specific=True)
        outcome = dict(error=None, in_replay_buffer=False)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                trainer.train(**train_kwargs)
        except Exception as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            frames = traceback.extract_tb(exc.__traceback__)
            outcome["in_replay_buffer"] = any("memmap_replay_buffer" in frame.filename for frame in frames)
        with open(f"{label}-{rank}.json", "w") as f:
            json.dump(outcome, f)

    for flag in ("find_unused_parameters", "static_graph"):
        handler = DistributedDataParallelKwargs(**{flag: True})
        trainer = build(RLHFTrainer, minibatch_size=2, accelerate_kwargs=dict(cpu=True, kwargs_handlers=[handler]))
        attempt(f"ppo-{flag}", trainer, num_episodes=1, max_timesteps=4, update_timesteps=4, max_seq_len=12)
    trainer = build(TPOTrainer, minibatch_size=1, num_times_sample_rewards=3, accelerate_kwargs=dict(cpu=True))
    ddp_fixes.expose_wrapped_attributes(trainer.actor, ["generate"])  # fix_tpo without the rank folder
    attempt("tpo-shared-folder", trainer, num_episodes=2, max_timesteps=2, update_timesteps=2, max_seq_len=12)
""")


@pytest.mark.distributed
def test_doc_failures_of_ddp_flags_and_shared_tpo_buffer(tmp_path):
    """Canaries for the page's table: PPO with find_unused_parameters / static_graph, and TPO ranks
    sharing ./tpo_memmap_replay_buffer (the per-rank folder of fix_tpo)."""
    (tmp_path / "flags.py").write_text(DDP_FLAGS)
    cwd = tmp_path / "run"
    cwd.mkdir()
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(launch.free_port()), str(tmp_path / "flags.py"), str(SCRIPTS)], cwd,
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}, timeout=240)
    outcome = {f.stem: json.loads(f.read_text()) for f in cwd.glob("*.json")}
    for rank in ("0", "1"):
        for flag in ("find_unused_parameters", "static_graph"):
            assert (outcome[f"ppo-{flag}-{rank}"]["error"] or "").startswith(
                "RuntimeError: Trying to backward through the graph a second time"), outcome
    # Which error the shared buffer raises depends on timing (seen here: the max_timesteps overflow,
    # "timestep_index 2 out of range", "mmap length is greater than file size"); it is always raised
    # inside memmap_replay_buffer, and the other rank may instead meet the dead peer in a collective.
    tpo = [outcome[f"tpo-shared-folder-{rank}"] for rank in ("0", "1")]
    peer_gone = re.compile(r"RuntimeError: .*gloo.*Connection (closed|reset) by peer")
    assert any(o["in_replay_buffer"] for o in tpo), tpo
    assert all(o["in_replay_buffer"] or peer_gone.match(o["error"] or "") for o in tpo), tpo
    text = DOC.read_text(encoding="utf-8")
    assert "Trying to backward through the graph a second time" in text
    assert "Connection closed by peer" in text


def test_doc_replay_buffers_sharing_a_folder_share_one_timestep_counter(tmp_path):
    """The cause behind the shared-folder row: two buffers opened on one folder, as tpo.py train()
    opens it on every rank, read and advance one timestep counter, so one rank's stores overflow the
    other's `max_timesteps` (the error the page quotes)."""
    import numpy as np
    from palm_rlhf_pytorch import tpo
    fields = dict(sequence=("int", (2, 4)), target_q=("float", (2,)))
    ranks = [tpo.ReplayBuffer(folder=tmp_path / "shared", max_episodes=4, max_timesteps=2, fields=fields)
             for _ in range(2)]
    step = dict(sequence=np.zeros((2, 4), dtype=np.int64), target_q=np.zeros(2, dtype=np.float32))
    ranks[0].store(**step)
    assert ranks[1].timestep_index == 1
    ranks[1].store(**step)
    with pytest.raises(ValueError, match=r"You exceeded the `max_timesteps` \(2\) set on the replay buffer"):
        ranks[0].store(**step)
    assert "You exceeded the `max_timesteps`" in DOC.read_text(encoding="utf-8")
    assert "share one timestep counter" in (DOC.parent / "traps-setup.md").read_text(encoding="utf-8")


def test_doc_gpu_backend_fact_matches_accelerate_source():
    """distributed.md#launching: with LOCAL_RANK set and not cpu, the accelerator's device type
    picks the distributed type and backend: cuda -> MULTI_GPU with nccl (accelerate 1.16)."""
    from accelerate import PartialState
    from accelerate.utils.imports import get_distributed_backend
    source = inspect.getsource(PartialState._prepare_backend)
    assert 'int(os.environ.get("LOCAL_RANK", -1)) != -1 and not cpu' in source
    assert 'if device_type == "cuda":\n                    distributed_type = DistributedType.MULTI_GPU' in source
    assert get_distributed_backend("cuda") == "nccl"


def test_doc_names_exist():
    fixes = load_script(REPO / "scripts" / "ddp_fixes.py", "ddp_fixes")
    text = DOC.read_text(encoding="utf-8")
    for name in ("fix_ppo", "fix_tpo", "fix_flowrl", "fix_buffers", "apply_ddp_fixes", "save_checkpoint",
                 "checkpoint_module"):
        assert f"`{name}" in text and callable(getattr(fixes, name))
    assert "`tensor_digest`" in text and callable(smoke_ranks.tensor_digest)
    checks_table = text[text.index("| check | passes when |"):].split("\n\n")[0]
    names = {row.split("`")[0] for row in checks_table.split("\n| `")[1:]}
    assert names == {"accelerate_multi_process", "parameters_finite", "ranks_in_sync", "ranks_drew_different_prompts",
                     "only_main_process_wrote", "replay_buffer_per_rank", "all_ranks_passed"}
    help_text = run([sys.executable, str(SMOKE), "--help"], REPO).stdout
    for option in ("--nproc", "--no-ddp-fixes", "--oversubscribe", "--dist-timeout", "--eos-token"):
        assert option in help_text and f"`{option}" in text, option


@pytest.mark.distributed
def test_workers_dying_without_report_is_a_failed_report(smoke, capsys, monkeypatch, empty_dir):
    """Every rank exits before rank 0 writes the report: one JSON report, status failed, exit 1."""
    args = smoke.build_parser().parse_args(["--nproc", "2", "--device", "cpu", "--json"])
    monkeypatch.chdir(empty_dir)
    env = version_gate.check_versions()
    # the workers parse the forwarded arguments again; an unknown one makes each rank exit 2
    code = smoke_ranks.run_nproc(SMOKE, args, ["--device", "cpu", "--bogus-for-workers"], env, streams.Progress("t", False))
    out = capsys.readouterr().out
    report = json.loads(out)
    assert code == 1 and report["status"] == "failed" and report["results"] == {}
    plain = smoke_report.summary(report).splitlines()  # the plain report names the failed launch and its section
    assert plain[-1].startswith("tiny-rlhf-smoke: FAILED: the train smoke failed for the run") and \
        plain[-1].endswith("distributed.md#check-first-the-smoke-helper-on-n-processes")
    failed = {c["name"]: c for c in report["checks"] if not c["passed"]}
    assert "workers_finished" in failed and "--bogus-for-workers" in failed["workers_finished"]["detail"]
    assert report["launcher"]["returncode"] not in (0, None)
    assert list(empty_dir.iterdir()) == []


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line or environment contains ``text`` (Linux /proc; torchrun and its ranks
    carry the launcher's private directory as TMPDIR)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(text in (entry / part).read_bytes().decode(errors="replace")
                                            for part in ("cmdline", "environ")):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.distributed
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_signal_to_the_launcher_stops_its_ranks_and_cleans_up(tmp_path, empty_dir, signame):
    import os
    import signal
    import subprocess
    import time
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp)}
    # a job started in the background inherits SIGINT ignored: give the smoke the default dispositions
    proc = subprocess.Popen([sys.executable, str(SMOKE), "--trainer", "all", "--nproc", "2", "--json"],
                            cwd=empty_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    deadline = time.monotonic() + 120
    run_dir = None
    while run_dir is None or len(processes_mentioning(str(run_dir))) < 3:  # torchrun + 2 ranks
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        run_dir = next((p for p in tmp.iterdir() if p.name.startswith("palm-rlhf-skill-")), None)
        time.sleep(0.1)
    time.sleep(2.5)  # into rendezvous and training: ranks left alone then hang in a collective
    proc.send_signal(getattr(signal, signame))  # to the launching process alone, not its group
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == {"SIGTERM": 143, "SIGINT": 130}[signame] and out == "", err[-800:]
    deadline = time.monotonic() + 30
    while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(run_dir)) == [], "torchrun or a rank outlived the launcher"
    assert list(tmp.iterdir()) == [] and list(empty_dir.iterdir()) == []


# eos: rotary caches of different lengths under DDP (fix_buffers) ------------------------------------

ROTARY = "distributed.md#rotary-caches-under-eos: upstream changed; re-check fix_buffers and the section"

@pytest.mark.distributed
def test_unfixed_eos_run_fails(empty_dir):
    """Canary for fix_buffers, end to end: without the fixes, rollouts that end at eos at different
    lengths on the two ranks break DDP's buffer broadcast. PPO (the first trainer) aborts in gloo
    when rank 0's longer rotary cache is copied into rank 1's shorter one."""
    proc, report = run_json([sys.executable, str(SMOKE), "--trainer", "all", "--nproc", "2", "--eos-token", EOS,
                             "--no-ddp-fixes", "--dist-timeout", "60", "--json"], empty_dir, timeout=400)
    assert proc.returncode == 1 and report["status"] == "failed"
    detail = " ".join(c["detail"] for c in report["checks"] if not c["passed"])
    assert "Received data size doesn't match expected size" in detail, (ROTARY, detail)
    assert "Received data size doesn't match expected size" in DOC.read_text(encoding="utf-8")
    assert list(empty_dir.iterdir()) == []


@pytest.mark.distributed
def test_unfixed_eos_grpo_ranks_fall_out_of_step(empty_dir):
    """Canary for the GRPO row: GRPO alone, without the fixes, under eos. Its one backward per step
    keeps gradients exact, but the buffer broadcast corrupts the rotary tables: the ranks' collectives
    fall out of step and fail only at the timeout (5 s here)."""
    proc, report = run_json([sys.executable, str(SMOKE), "--trainer", "grpo", "--nproc", "2", "--eos-token", EOS,
                             "--no-ddp-fixes", "--dist-timeout", "5", "--json"], empty_dir, timeout=400)
    detail = " ".join(c["detail"] for c in report["checks"] if not c["passed"])
    assert proc.returncode == 1 and report["status"] == "failed" and "lost the other ranks" in detail, (ROTARY, detail)
    assert list(empty_dir.iterdir()) == []


BUFFERS = textwrap.dedent("""
    import os, sys, warnings, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "..", "..", "..", "scripts")]
    import ddp_fixes, probe_kit
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
    palm = probe_kit.tiny_palm()
    lengths = []
    for n in (5, 9, 7):  # the cache grows to the longest sequence seen, never shrinks
        palm(torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (1, n)))
        lengths.append([tuple(b.shape) for name, b in palm.named_buffers() if name.endswith("pos_emb")])
    print("cache", lengths)
    holder = torch.nn.Module()
    holder.actor = DDP(palm)
    print("default", holder.actor.will_sync_module_buffers())
    print("fixed", ddp_fixes.fix_buffers(holder), holder.actor.will_sync_module_buffers())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        at_construction = DDP(palm, broadcast_buffers=False)
    print("kwargs", at_construction.will_sync_module_buffers(), [str(w.message).split(".")[0] for w in caught])
    dist.destroy_process_group()
""")


def test_ddp_broadcasts_rotary_caches_and_fix_buffers_stops_it(tmp_path):
    """Canary for fix_buffers, the cause: palm.py grows its rotary cache buffers to the longest
    sequence seen, and a DDP wrapper broadcasts buffers before each forward unless told not to; the
    construction-time alternative (broadcast_buffers=False) warns on torch 2.13."""
    (tmp_path / "buffers.py").write_text(BUFFERS)
    proc = run([sys.executable, str(tmp_path / "buffers.py"), str(SCRIPTS), str(launch.free_port())], tmp_path,
               env={"GLOO_SOCKET_IFNAME": "lo"}, timeout=120)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines.get("cache") == "[[(5, 16)], [(9, 16)], [(9, 16)]]", (ROTARY, proc.stderr[-2000:])
    assert lines["default"] == "True" and lines["fixed"] == "['actor'] False", (ROTARY, lines)
    assert lines["kwargs"] == "False ['`broadcast_buffers` is deprecated']", (ROTARY, lines)
    assert "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead" in DOC.read_text(encoding="utf-8")


# under the user's own launcher: torchrun, accelerate launch, srun (two nodes simulated) ------------

def doc_fence(lang: str, marker: str) -> str:
    """The one fenced ``lang`` block of multi-node.md that contains ``marker``."""
    blocks = ["\n" + b.split("```")[0] for b in MULTI.read_text(encoding="utf-8").split(f"```{lang}\n")[1:]]
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, marker
    return found[0]


TORCHRUN_RECIPE = doc_fence("bash", "\ntorchrun --nnodes 2").strip()
ACCELERATE_RECIPE = doc_fence("bash", "\naccelerate launch --config_file").strip()
ACCELERATE_SRUN = doc_fence("bash", "srun bash -c 'NODE_RANK=$SLURM_NODEID; accelerate launch").strip()
SLURM_SCRIPT = doc_fence("bash", "#SBATCH")


def launcher_env(**extra) -> dict[str, str]:
    """Each simulated node's environment: the installed console scripts first on PATH, CPU gloo."""
    return {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "CUDA_VISIBLE_DEVICES": "", **extra}


def start(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: int = 400) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds since start) of a started process."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err, time.monotonic() - proc.started


@pytest.fixture(scope="module")
def lone_ranks(tmp_path_factory):
    """Started first, waited for later (they mostly wait): the 2-node torchrun recipe with one node
    missing, node 0 alone and node 1 alone (rendezvous timeout 5 s), and one srun task of two whose
    peer never starts (--dist-timeout 5)."""
    cwd = tmp_path_factory.mktemp("lone")
    line = TORCHRUN_RECIPE.replace("timeout=300", "timeout=5")
    procs = {f"torchrun node {rank}": start(["bash", "-c", line], cwd, launcher_env(
        NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch.free_port()))) for rank in (0, 1)}
    procs.update({
        "srun": start([str(BIN / "tiny-rlhf-smoke"), "--trainer", "grpo", "--dist-timeout", "5", "--json"], cwd,
                      launcher_env(SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_LOCALID="0",
                                   SLURM_NODEID="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch.free_port())))})
    for proc in procs.values():
        proc.started = time.monotonic()
    yield procs, cwd
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, lone_ranks):
    """The page's torchrun recipe on two simulated nodes: two torchrun launchers, --nnodes 2,
    --node-rank 0 and 1, one process each, rendezvous on 127.0.0.1, each node in its own directory."""
    port = str(launch.free_port())
    cwds = [tmp_path_factory.mktemp(f"node{rank}") for rank in (0, 1)]
    procs = [start(["bash", "-c", TORCHRUN_RECIPE], cwds[rank],
                   launcher_env(NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for rank in (1, 0)]
    for proc in procs:
        proc.started = time.monotonic()
    (code1, out1, err1, _), (code0, out0, err0, seconds) = (finish(p) for p in procs)
    return code0, out0, err0, code1, out1, seconds, cwds


@pytest.mark.distributed
def test_two_torchrun_nodes_give_one_report_in_sync(two_nodes):
    code0, out0, err0, code1, out1, _, cwds = two_nodes
    assert code0 == 0 and code1 == 0, err0[-3000:]
    assert out1 == ""  # only global rank 0 prints
    report = json.loads(out0)
    assert report["status"] == "ok" and report["nproc"] == 2 and report["distributed_type"] == "MULTI_CPU"
    assert report["launcher"]["name"] == "torchrun" and report["launcher"]["nodes"] == 2
    assert set(report["results"]) == set(TRAINERS)
    for name, result in report["results"].items():
        assert checks_of(result)["ranks_in_sync"]["passed"] and result["rank_sync"]["mismatched"] == 0, name
        assert [r["status"] for r in result["ranks"]] == ["ok", "ok"], name
    assert [list(cwd.iterdir()) for cwd in cwds] == [[], []]


@pytest.mark.parametrize("node, last_line", [
    (0, r"torch\.distributed\.DistStoreError: Timed out after \d+ seconds waiting for clients\. 1/2 clients joined\."),
    (1, r"torch\.distributed\.DistNetworkError: The client socket has timed out after \d+ms while trying to "
        r"connect to \(127\.0\.0\.1, \d+\)\."),
])
@pytest.mark.distributed
def test_missing_torchrun_node_fails_within_the_rendezvous_timeout(two_nodes, lone_ranks, node, last_line):
    """torchrun waits in its rendezvous before the smoke starts; --rdzv-conf timeout bounds it and
    its last stderr line says what is missing."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous
    code, out, err, seconds = finish(lone_ranks[0][f"torchrun node {node}"])
    last = err.strip().splitlines()[-1]
    assert code == 1 and out == "" and seconds < 120, (code, seconds, err[-2000:])
    assert re.fullmatch(last_line, last), last
    text = " ".join(MULTI.read_text(encoding="utf-8").split())
    assert "waiting for clients. 1/2 clients joined." in text and "while trying to connect to (HOST, PORT)." in text
    assert static_tcp_rendezvous._default_timeout_seconds == 600 and "(default 600 s" in text


@pytest.mark.distributed
def test_missing_srun_task_fails_with_one_line(two_nodes, lone_ranks):
    code, out, err, seconds = finish(lone_ranks[0]["srun"])
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and seconds < 120, err[-2000:]
    assert lines[0].startswith("tiny-rlhf-smoke: error: rank 0 of 2: no process group with the other ranks at "
                               "127.0.0.1:") and "within --dist-timeout 5 s: DistStoreError:" in lines[0], lines
    assert "no process group with the other ranks at" in MULTI.read_text(encoding="utf-8")
    assert list(lone_ranks[1].iterdir()) == []


@pytest.mark.distributed
def test_srun_tasks_form_a_world(tmp_path):
    """srun starting the smoke once per rank (no torchrun): SLURM_PROCID/NTASKS/LOCALID become the
    rank; the batch script exports MASTER_ADDR and MASTER_PORT. Construct-only: the world and the rank
    checks are the point (the torchrun runs train)."""
    port = str(launch.free_port())
    procs = [start([str(BIN / "tiny-rlhf-smoke"), "--trainer", "grpo", "--construct-only", "--json"], tmp_path,
                   launcher_env(SLURM_STEP_ID="0", SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                SLURM_NODEID="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)) for r in (1, 0)]
    for proc in procs:
        proc.started = time.monotonic()
    (code1, out1, err1, _), (code0, out0, err0, _) = (finish(p) for p in procs)
    assert code0 == code1 == 0 and out1 == "", (err0[-2000:], err1[-2000:])
    report = json.loads(out0)
    assert report["launcher"]["name"] == "srun" and report["nproc"] == 2 and report["status"] == "ok"
    assert checks_of(report["results"]["grpo"])["ranks_in_sync"]["passed"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.distributed
def test_accelerate_launch_recipe_on_two_machines(tmp_path):
    config = doc_fence("yaml", "distributed_type: MULTI_GPU").replace(
        "main_process_port: 29500", f"main_process_port: {launch.free_port()}")
    assert "main_process_port: 29500" not in config
    (tmp_path / "multinode.yaml").write_text(config)
    procs = [start(["bash", "-c", ACCELERATE_RECIPE], tmp_path, launcher_env(NODE_RANK=str(rank))) for rank in (1, 0)]
    for proc in procs:
        proc.started = time.monotonic()
    (code1, out1, err1, _), (code0, out0, err0, _) = (finish(p) for p in procs)
    assert code0 == code1 == 0 and out1 == "", err0[-3000:]
    report = json.loads(out0)
    assert report["status"] == "ok" and report["launcher"]["name"] == "accelerate launch"
    assert report["launcher"]["nodes"] == 2 and set(report["results"]) == set(TRAINERS)
    assert all(checks_of(r)["ranks_in_sync"]["passed"] for r in report["results"].values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multinode.yaml"]


def test_slurm_script_parses_and_runs_the_torchrun_recipe(tmp_path):
    """No Slurm here: the batch script parses (bash -n), and each node's command is the page's
    torchrun recipe, run above on two simulated nodes, with SLURM_NODEID as the node rank."""
    (tmp_path / "smoke.sbatch").write_text(SLURM_SCRIPT)
    proc = run(["bash", "-n", str(tmp_path / "smoke.sbatch")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    srun = [line for line in SLURM_SCRIPT.splitlines() if line.startswith("srun ")]
    assert srun == [f"srun bash -c 'NODE_RANK=$SLURM_NODEID; {TORCHRUN_RECIPE}' > smoke-report.json"], srun
    assert "export MASTER_ADDR=" in SLURM_SCRIPT and "export MASTER_PORT=" in SLURM_SCRIPT


def test_accelerate_srun_line_is_the_accelerate_recipe_with_the_batch_address(tmp_path):
    """The accelerate-under-srun line: the page's accelerate recipe (run above on two simulated
    nodes) plus the address the batch script exports, with flags accelerate launch accepts."""
    extra = "--main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT"
    recipe = ACCELERATE_RECIPE.replace("--machine_rank $NODE_RANK", f"--machine_rank $NODE_RANK {extra}")
    assert ACCELERATE_SRUN == f"srun bash -c 'NODE_RANK=$SLURM_NODEID; {recipe}' > smoke-report.json", ACCELERATE_SRUN
    (tmp_path / "line.sh").write_text(ACCELERATE_SRUN)
    assert run(["bash", "-n", str(tmp_path / "line.sh")], tmp_path).returncode == 0
    helptext = run([str(BIN / "accelerate"), "launch", "--help"], tmp_path).stdout
    assert all(flag in helptext for flag in ("--main_process_ip", "--main_process_port", "--machine_rank"))


# the launcher's world, --nproc's arguments and resources (in-process, no launch) ------------------

@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "9",
      "TORCHELASTIC_RUN_ID": "none"}, ("torchrun", 1, 4, 1, "0", "h:9")),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "9",
      "TORCHELASTIC_RUN_ID": "none", "ACCELERATE_MIXED_PRECISION": "no"}, ("accelerate launch", 0, 2, 0, "1", "h:9")),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
      "MASTER_ADDR": "h", "MASTER_PORT": "9"}, ("srun", 3, 4, 1, "1", "h:9")),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),  # a batch script's own shell: no step, no world
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, None),  # a one-task step
])
def test_launcher_world_from_environment(env, expected):
    environ = dict(env)
    world = launch.launcher_world(environ)
    assert (world and (world.launcher, world.rank, world.size, world.local_rank, world.node, world.master)) == expected
    if expected and expected[0] == "srun":  # what torch's env:// rendezvous and Accelerate read
        assert (environ["RANK"], environ["WORLD_SIZE"], environ["LOCAL_RANK"]) == ("3", "4", "1")


RANK_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import skill_runtime  # the tree's import roots
    from run_kit import launch
    world = launch.launcher_world()
    # one write per line: the ranks share the pipe, and unbuffered print() writes each piece apart
    line = " ".join(map(str, (world.rank, world.size, world.launcher, world.is_main, *sys.argv[2:])))
    sys.stdout.write(line + chr(10))
    sys.stdout.flush()
    if "--sleep" in sys.argv:
        time.sleep(120)
    sys.exit(3 if "--fail" in sys.argv and world.rank == 1 else 0)
""")


@pytest.mark.distributed
def test_launch_script_runs_n_ranks_of_any_script(tmp_path):
    """The generic launcher the run kit reuses: N local ranks of a script, its argv without
    --nproc, the exit code and output collected; each rank sees its world; a timeout stops them."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    argv = launch.without_nproc([str(REPO / "scripts"), "--nproc", "2", "x"])
    done = launch.launch_script(script, argv, 2, "cpu", tmp_path)
    assert done.returncode == 0, done.output_tail
    assert sorted(done.stdout.split("\n"))[1:] == ["0 2 torchrun True x", "1 2 torchrun False x"]
    assert done.master.startswith("127.0.0.1:") and done.command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    failed = launch.launch_script(script, [*argv, "--fail"], 2, "cpu", tmp_path)
    assert failed.returncode not in (0, None)
    # 8 s: the rank is asleep by then (torchrun starts it in about 2 s), and the serial group of
    # worlds (conftest.py) waits no longer than it must
    stopped = launch.launch_script(script, [*argv, "--sleep"], 1, "cpu", tmp_path, timeout_s=8)
    assert stopped.returncode is None and stopped.stderr.endswith("stopped after 8 s")
    assert stopped.stdout.startswith("0 1 torchrun True x --sleep"), stopped.stdout  # stopped while asleep


def test_a_world_without_local_rank_gets_one():
    """RANK and WORLD_SIZE alone (a hand-made launcher): LOCAL_RANK is set to the local rank, 0,
    since Accelerate's CPU path counts a process as a rank only with LOCAL_RANK or a WORLD_SIZE above 1."""
    from accelerate import PartialState
    environ = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611"}
    world = launch.launcher_world(environ)
    assert (world.launcher, world.size, world.local_rank, world.is_main) == ("env", 1, 0, True)
    assert environ["LOCAL_RANK"] == "0" and world.describe().startswith("rank 0 of 1 (env, node ")
    kept = {**environ, "LOCAL_RANK": "3", "RANK": "3", "WORLD_SIZE": "4"}
    assert launch.launcher_world(kept).local_rank == 3 and kept["LOCAL_RANK"] == "3"
    source = inspect.getsource(PartialState._prepare_backend)
    assert 'int(os.environ.get("LOCAL_RANK", -1)) != -1\n                or get_int_from_env(' in source


def test_a_world_of_one_from_plain_variables_runs(empty_dir):
    """Issue 22 item 1: ``RANK=0 WORLD_SIZE=1 MASTER_ADDR=... MASTER_PORT=... tiny-rlhf-smoke --json``
    exited 1 with a traceback ("Default process group has not been initialized": on the CPU,
    Accelerate took WORLD_SIZE=1 without LOCAL_RANK for a single process). It runs as a world of one."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(launch.free_port()),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc, report = run_json([sys.executable, str(SMOKE), "--json"], empty_dir, env=env, timeout=400)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert report["status"] == "ok" and report["nproc"] == 1 and report["distributed_type"] == "MULTI_CPU"
    assert (report["launcher"]["name"], report["launcher"]["world_size"]) == ("env", 1)
    assert list(empty_dir.iterdir()) == []


@pytest.mark.parametrize("argv, env, message", [
    (["--trainer", "grpo"], {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
     "srun started this smoke as task 0 of 2, but MASTER_ADDR and MASTER_PORT are not set"),
    (["--nproc", "3"], {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "h",
                        "MASTER_PORT": "9"},
     "--nproc 3, but torchrun started a world of 2 processes: drop --nproc under a launcher"),
    (["--trainer", "grpo"], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "9"},  # not a --dist-timeout wait
     "rank 0 of 2 (env): MASTER_ADDR is not set: export MASTER_ADDR (rank 0's host name) and MASTER_PORT"),
    (["--trainer", "grpo"], {"RANK": "two", "WORLD_SIZE": "2"}, "RANK='two' from the launcher is not an integer"),
    (["--device", "cuda:1"], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "9"},
     "--device cuda:1 under env: use auto, cpu or cuda"),
    (["--nproc", "2", "--device", "cuda:1"], {}, "--device cuda:1 with --nproc: use auto, cpu or cuda"),
])
def test_launcher_usage_errors_exit_2_one_line_without_torch(empty_dir, monkeypatch, argv, env, message):
    from conftest import usage_error_without_torch
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = usage_error_without_torch(SMOKE, argv, empty_dir)
    assert message in line, line
    assert list(empty_dir.iterdir()) == []


def test_without_nproc_drops_every_spelling():
    argv = ["--trainer", "all", "--nproc", "2", "--np=3", "--npro", "4", "--json", "--new-tokens", "5", "--no-ddp-fixes"]
    assert launch.without_nproc(argv) == ["--trainer", "all", "--json", "--new-tokens", "5", "--no-ddp-fixes"]


def test_nproc_resources_refused_unless_oversubscribe(smoke, monkeypatch):
    config = settings.palm_config(smoke.build_parser().parse_args([]))
    cpus = placement.usable_cpus()
    with pytest.raises(exits.SkillError, match=rf"--nproc {cpus + 1} on {cpus} usable CPU cores: .* --oversubscribe"):
        smoke_ranks.check_resources(cpus + 1, "cpu", config, oversubscribe=False)
    smoke_ranks.check_resources(cpus + 1, "cuda", config, oversubscribe=False)  # GPUs: counted by ddp_uses_cpu
    monkeypatch.setattr(placement, "available_memory_mib", lambda: 500)
    with pytest.raises(exits.SkillError, match=r"--nproc 2 needs about \d+ MiB .* 500 MiB available"):
        smoke_ranks.check_resources(2, "cpu", config, oversubscribe=False)
    facts = smoke_ranks.check_resources(cpus + 1, "cpu", config, oversubscribe=True)
    assert facts["oversubscribe"] and facts["available_mib"] == 500 and facts["usable_cpus"] == cpus
    smoke_ranks.check_resources(None, "cpu", config, oversubscribe=False)  # one process of the tiny size fits
    monkeypatch.setattr(placement, "available_memory_mib", lambda: estimate.predicted_rank_mib(config) - 1)
    with pytest.raises(exits.SkillError, match=r"^--dim 32 --depth 1 needs about \d+ MiB, \d+ MiB available: "
                                            r"use a smaller --dim/--depth, or pass --oversubscribe"):
        smoke_ranks.check_resources(None, "cpu", config, oversubscribe=False)  # the single-process smoke


def test_single_process_sizes_beyond_memory_are_refused_before_building(empty_dir):
    """The QA's traceback: --dim 8192 --depth 64 passes the option bounds but needs terabytes; the
    one-process smoke refuses it like --nproc does (exit 2, one line), before any model exists."""
    for extra in ([], ["--construct-only"]):
        proc = run([sys.executable, str(SMOKE), "--dim", "8192", "--depth", "64", "--json", *extra], empty_dir)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith("tiny_rlhf_smoke.py: error: --dim 8192 --depth 64 needs about ") and \
            "MiB available: use a smaller --dim/--depth, or pass --oversubscribe" in line, proc.stderr[-2000:]
    assert list(empty_dir.iterdir()) == []


def test_nproc_above_cpu_cores_is_exit_2_one_line(empty_dir):
    cpus = placement.usable_cpus()
    if cpus >= launch.MAX_NPROC:
        pytest.skip(f"{cpus} CPUs: --nproc cannot exceed them")
    proc = run([sys.executable, str(SMOKE), "--nproc", str(cpus + 1), "--device", "cpu"], empty_dir)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"--nproc {cpus + 1} on {cpus} usable CPU cores" in proc.stderr and "--oversubscribe" in proc.stderr
    assert list(empty_dir.iterdir()) == []


@pytest.mark.parametrize("dim, depth, heads, dim_head", [(32, 1, 2, 16), (256, 4, 2, 16), (96, 3, 8, 64)])
def test_palm_weights_counts_what_palm_builds(dim, depth, heads, dim_head):
    import torch
    from palm_rlhf_pytorch import PaLM
    config = {**probe_kit.TINY_PALM, "dim": dim, "depth": depth, "heads": heads, "dim_head": dim_head}
    with torch.device("meta"):
        assert estimate.palm_weights(config) == sum(p.numel() for p in PaLM(**config).parameters())


def test_predicted_rank_memory_matches_the_sizing_table():
    """The per-rank prediction against the peak RSS measured in sizing.md's table (rows
    that vary dim or depth): within 15 % of the heaviest trainer (PPO: actor-critic, value head),
    never below 90 % of any row, so --nproc refuses before the memory runs out."""
    text = (SCRIPTS.parent / "references" / "sizing.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| (?:dim|depth) = \d+ \| (\d+) \| (\d+) \|.*\| (\d+) \|$", text, re.MULTILINE)
    assert len(rows) >= 8 and {r[0] for r in rows} >= {"ppo"}
    for trainer, dim, depth, rss in rows:
        predicted = estimate.predicted_rank_mib({**probe_kit.TINY_PALM, "dim": int(dim), "depth": int(depth)})
        assert predicted >= 0.9 * int(rss), (trainer, dim, depth, rss, predicted)
        if trainer == "ppo":
            assert predicted <= 1.15 * int(rss), (trainer, dim, depth, rss, predicted)


# sharding: Accelerate's FSDP plugin --------------------------------------------------------------

FSDP = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, sys.argv[1])
    import tiny_rlhf_smoke as smoke
    from policy_optimization import trainers
    from policy_optimization.smoke import checklist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    rank = os.environ["RANK"]
    def line(text):
        if rank == "0":
            os.write(1, (text + "\\n").encode())
    plain = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
    line(f"cpu {plain.distributed_type} {type(plain.prepare(torch.nn.Linear(2, 2))).__name__}")
    for version in (1, 2):  # force what Accelerate does on GPUs: distributed type FSDP with the plugin
        for shared in (PartialState._shared_state, AcceleratorState._shared_state):
            shared.update(distributed_type=DistributedType.FSDP, device=torch.device("cpu"))
        AcceleratorState._shared_state["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=version)
        for name in trainers.TRAINERS:
            construct_only = not (version == 1 and name == "ppo")
            args = smoke.build_parser().parse_args(["--trainer", name] + ["--construct-only"] * construct_only)
            args.caller_dir = "/"
            result = checklist.run_trainer(name, args, {"cpu": True}, torch.device("cpu"), ["default"])
            failed = [c["detail"] for c in result["checks"] if c["name"] in ("trainer_constructed", "update_ran")
                      and not c["passed"]]
            line(f"fsdp{version} {name} {failed[0] if failed else 'ok'}")
""")


SHARDING = "distributed.md#sharding-fsdp: Accelerate or the trainers changed; re-run and update the table"


@pytest.mark.distributed
def test_fsdp_plugin_findings(tmp_path):
    """The page's sharding table: on CPU the plugin is ignored (DDP); forced as on GPUs, FSDP2 refuses
    every trainer in Accelerator.prepare and FSDP1 fails in the trainers' own modules."""
    (tmp_path / "fsdp.py").write_text(FSDP)
    cwd = tmp_path / "run"
    cwd.mkdir()
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(launch.free_port()), str(tmp_path / "fsdp.py"), str(SCRIPTS)], cwd,
               env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}, timeout=300)
    found = {}  # "cpu" -> what it got; "fsdp<version> <trainer>" -> "ok" or the first error
    for line in proc.stdout.splitlines():
        key, rest = line.split(" ", 1)
        if key.startswith("fsdp"):
            trainer, rest = rest.split(" ", 1)
            key = f"{key} {trainer}"
        found[key] = rest
    assert found.get("cpu") == "DistributedType.MULTI_CPU DistributedDataParallel", (SHARDING, proc.stderr[-3000:])
    assert "fsdp" not in proc.stderr.lower()  # ignored without a word
    table = {row[0]: row[1:] for row in (
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in DOC.read_text(encoding="utf-8").split("## Sharding (FSDP)")[1].splitlines()
        if line.startswith("| ") and not line.startswith("| trainer") and not line.startswith("| ---"))}
    for name in TRAINERS:
        fsdp1, fsdp2 = found[f"fsdp1 {name}"], found[f"fsdp2 {name}"]
        assert fsdp2 == "ValueError: Only one model is supported when using FSDP2", (SHARDING, fsdp2)
        expected = {"ppo": "RuntimeError: setStorage:", "grpo": "TypeError: 'list' object is not an iterator",
                    "tpo": "TypeError: Actor.parameters() got an unexpected keyword argument 'recurse'",
                    "flowrl": "TypeError: 'list' object is not an iterator"}[name]
        assert fsdp1.startswith(expected), (SHARDING, name, fsdp1)
        row = table[trainers.TRAINERS[name].display]
        assert f"`{expected}" in row[0] and ("`ValueError: Only one model" in row[1] or "same `ValueError`" in row[1])
    assert list(cwd.iterdir()) == []


@pytest.mark.distributed
def test_what_torchrun_makes_of_a_ranks_usage_error(empty_dir):
    """multi-node.md: a rank's exit 2 reaches the user as torchrun's ChildFailedError summary and
    exit 1, after the rank's one line; `--nproc` after the script is torchrun's own usage error."""
    doc = " ".join((SCRIPTS.parent / "references" / "multi-node.md").read_text(encoding="utf-8").split())
    assert "prints a `ChildFailedError` summary naming the first failed rank and its `exitcode`, and exits 1" in doc
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(launch.free_port())]
    proc = run([*torchrun, str(SMOKE), "--bogus"], empty_dir, timeout=300)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-2000:]
    assert "ChildFailedError" in proc.stderr and re.search(r"exitcode\s*:\s*2\b", proc.stderr), proc.stderr[-2000:]
    assert "tiny_rlhf_smoke.py: error: unrecognized arguments: --bogus" in proc.stderr
    proc = run([*torchrun, str(SMOKE), "--nproc", "3"], empty_dir, timeout=300)
    assert proc.returncode == 2 and "ambiguous option: --nproc could match --nproc-per-node" in proc.stderr
    assert list(empty_dir.iterdir()) == []


def test_doc_save_state_keeps_flowrl_partition_and_rng(tmp_path, monkeypatch):
    """distributed.md#checkpoints: accelerate.save_state/load_state restores FlowRL's partition
    function (which save() drops) and the RNG states (PPO's models and optimizers: the doc block)."""
    import torch
    from canary import make, tiny_palm
    monkeypatch.chdir(tmp_path)

    def build():
        torch.manual_seed(0)
        trainer = make("flowrl", palm=tiny_palm(), minibatch_size=2)
        trainer.print = lambda *a: None
        return trainer

    trainer = build()
    fresh = {k: v.clone() for k, v in trainer.partition_function.state_dict().items()}
    trainer.train(num_episodes=1, max_timesteps=2, update_timesteps=2, max_seq_len=8)
    trained = trainer.partition_function.state_dict()
    assert any(not torch.equal(trained[k], fresh[k]) for k in fresh)
    trainer.accelerate.save_state("state")
    after = torch.rand(3)
    resumed = build()
    resumed.accelerate.load_state("state")
    assert torch.equal(torch.rand(3), after), "update distributed.md#checkpoints: RNG states not restored"
    loaded = resumed.partition_function.state_dict()
    assert all(torch.equal(loaded[k], trained[k]) for k in trained), "update distributed.md#checkpoints"
    assert resumed.partition_function_optim.state_dict()["state"]
