"""Multi-process (DDP) training: the smoke's --nproc mode, the user-side fixes in ddp_fixes.py and
their canaries, and the Accelerate launch facts that references/distributed.md states.

Each 2-process run is tiny (dim 32, depth 1, a few rollouts) over gloo on 127.0.0.1.
Select with ``pytest -m distributed``; they also run in the default suite.
"""
from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import BIN, REPO, SMOKE, load_script, run, run_json

SCRIPTS = REPO / "sub-skills" / "policy-optimization" / "scripts"
TRAINERS = ["ppo", "grpo", "tpo", "flowrl"]
pytestmark = pytest.mark.distributed


def checks_of(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory):
    """`tiny-rlhf-smoke --trainer all --nproc 2 --json` (installed console script) from an empty dir."""
    cwd = tmp_path_factory.mktemp("fixed")
    exe = BIN / "tiny-rlhf-smoke"
    assert exe.exists(), "install the package first: pip install '.[test]'"
    proc, report = run_json([str(exe), "--trainer", "all", "--nproc", "2", "--json"], cwd)
    return proc, report, cwd


@pytest.fixture(scope="module")
def unfixed_run(tmp_path_factory):
    """The same run without ddp_fixes.py: what each trainer does under plain DDP."""
    cwd = tmp_path_factory.mktemp("unfixed")
    proc, report = run_json([sys.executable, str(SMOKE), "--trainer", "all", "--nproc", "2",
                             "--no-ddp-fixes", "--json"], cwd)
    return proc, report, cwd


def test_all_trainers_in_sync_with_fixes(fixed_run):
    proc, report, cwd = fixed_run
    assert proc.returncode == 0, [(n, c) for n, r in report["results"].items()
                                  for c in r["checks"] if not c["passed"]]
    assert report["status"] == "ok" and report["nproc"] == 2 and report["distributed_type"] == "MULTI_CPU"
    assert report["launcher"]["master"].startswith("127.0.0.1:") and report["launcher"]["ddp_fixes"]
    assert set(report["results"]) == set(TRAINERS)
    for name, result in report["results"].items():
        checks = checks_of(result)
        for required in ("accelerate_multi_process", "ranks_in_sync", "ranks_drew_different_prompts",
                         "only_main_process_wrote", "all_ranks_passed", "caller_directory_untouched",
                         "update_ran", "actor_lora_changed", "base_weights_unchanged"):
            assert checks[required]["passed"], (name, checks[required])
        sync = result["rank_sync"]
        assert sync["mismatched"] == 0 and sync["trainable_compared"] == result["parameters"]["trainable_total"]
        assert sync["tensors_compared"] == result["parameters"]["trainable_total"] + result["parameters"]["frozen_total"]
        assert [r["status"] for r in result["ranks"]] == ["ok", "ok"]
        draws = [r["prompt_draws"] for r in result["ranks"]]
        assert draws[0] != draws[1] and len(draws[0]) == result["optimizer_steps"]["rollouts"]
        assert result["checkpoint"]["saves_per_rank"] == [1, 0]
    tpo = checks_of(report["results"]["tpo"])
    assert tpo["replay_buffer_per_rank"]["passed"] and "rank1/tpo_memmap_replay_buffer" in tpo["replay_buffer_per_rank"]["detail"]
    assert list(cwd.iterdir()) == []


def test_no_library_output_on_stdout(fixed_run):
    proc, _, _ = fixed_run
    assert "policy_loss:" not in proc.stdout and "training complete" not in proc.stdout
    assert proc.stdout.lstrip().startswith("{") and proc.stdout.rstrip().endswith("}")


# canaries: each asserts the upstream cause its fix works around; when one fails, upstream changed:
# re-check the fix in ddp_fixes.py and drop it if it is no longer needed.

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


def test_unfixed_grpo_stays_in_sync(unfixed_run):
    """GRPO needs no training fix: one backward per step, so DDP's own averaging is exact."""
    checks = checks_of(unfixed_run[1]["results"]["grpo"])
    assert checks["update_ran"]["passed"] and checks["ranks_in_sync"]["passed"]


def test_unfixed_tpo_has_no_generate_on_ddp_wrapper(unfixed_run):
    """Canary for fix_tpo (generate): tpo.py train() calls self.actor.generate on the DDP wrapper."""
    detail = checks_of(unfixed_run[1]["results"]["tpo"])["update_ran"]["detail"]
    assert detail == "AttributeError: 'DistributedDataParallel' object has no attribute 'generate'"


def test_tpo_replay_buffer_folder_is_hard_coded():
    """Canary for fix_tpo (per-rank folder): no argument sets the replay-buffer folder."""
    from palm_rlhf_pytorch.tpo import RLHFTrainer
    fixes = load_script(SCRIPTS / "ddp_fixes.py", "ddp_fixes")
    source = inspect.getsource(RLHFTrainer.train)
    assert f"folder = './{fixes.TPO_BUFFER}'" in source
    params = [*inspect.signature(RLHFTrainer.train).parameters, *inspect.signature(RLHFTrainer).parameters]
    assert not any("folder" in p or "buffer" in p for p in params)


def test_unfixed_flowrl_reads_actor_palm_off_ddp_wrapper(unfixed_run):
    """Canary for fix_flowrl: flowrl.py learn() reads self.actor.actor_palm."""
    detail = checks_of(unfixed_run[1]["results"]["flowrl"])["update_ran"]["detail"]
    assert detail == "AttributeError: 'DistributedDataParallel' object has no attribute 'actor_palm'"


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
    fixes = load_script(SCRIPTS / "ddp_fixes.py", "ddp_fixes")
    monkeypatch.chdir(empty_dir)
    palm = PaLM(**smoke.TINY_PALM)
    trainer = RLHFTrainer(palm=palm, reward_model=RewardModel(palm, num_binned_output=0),
                          prompt_token_ids=smoke.random_prompt_token_ids(0), accelerate_kwargs={"cpu": True})
    train = trainer.train
    assert fixes.apply_ddp_fixes(trainer) == "tpo" and not fixes.is_distributed(trainer)
    assert trainer.train == train and "generate" not in vars(trainer.actor)
    assert fixes.save_checkpoint(trainer, empty_dir / "ckpt.pt") is True
    keys = set(torch.load(empty_dir / "ckpt.pt", weights_only=True))
    assert keys == set(trainer.actor.state_dict()) and not any(k.startswith("module.") for k in keys)
    with pytest.raises(ValueError, match="not a palm_rlhf_pytorch trainer"):
        fixes.trainer_kind(object())


def test_expose_wrapped_attributes_registers_nothing():
    import torch
    fixes = load_script(SCRIPTS / "ddp_fixes.py", "ddp_fixes")

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
    fixes = load_script(SCRIPTS / "ddp_fixes.py", "ddp_fixes")
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


def test_torchrun_on_cpu_needs_accelerate_use_cpu(empty_dir):
    launch = load_script(SCRIPTS / "ddp_launch.py", "ddp_launch")
    script = empty_dir.parent / "probe.py"
    script.write_text(PROBE)
    plain = probe_lines(torchrun(script, launch.free_port()), empty_dir)
    assert plain == ["probe 0 DistributedType.NO 1", "probe 1 DistributedType.NO 1"]
    cpu = probe_lines(torchrun(script, launch.free_port()), empty_dir, env={"ACCELERATE_USE_CPU": "true"})
    assert cpu == ["probe 0 DistributedType.MULTI_CPU 2", "probe 1 DistributedType.MULTI_CPU 2"]


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


# usage errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--nproc", "0"], "--nproc must be at least 1"),
    (["--no-ddp-fixes"], "--no-ddp-fixes applies to --nproc runs"),
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
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM, RewardModel, RLHFTrainer
    set_seed(0)
    palm = PaLM(**smoke.TINY_PALM)
    trainer = RLHFTrainer(palm=palm, reward_model=RewardModel(palm, num_binned_output=0),
                          prompt_token_ids=smoke.random_prompt_token_ids(0), minibatch_size=2,
                          accelerate_kwargs=dict(cpu=True))
    if sys.argv[2] == "fixed":
        ddp_fixes.apply_ddp_fixes(trainer)
    set_seed(1)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.train(num_episodes=1, max_timesteps=6, update_timesteps=6, max_seq_len=14)
    digest = hashlib.sha256()
    for _, p in sorted(trainer.accelerate.unwrap_model(trainer.actor_critic).named_parameters()):
        digest.update(p.detach().numpy().tobytes())
    print("digest", sys.argv[2], trainer.accelerate.distributed_type, digest.hexdigest())
""")


def test_fix_ppo_reproduces_single_process_training_bitwise(tmp_path):
    """One rank under torchrun (Accelerate still wraps DDP): unfixed PPO ends on different weights
    than the same run without DDP (the reducer writes the averaged actor gradient back after the
    actor already stepped, and the next minibatch accumulates onto it); with fix_ppo, bitwise equal.
    The unfixed half is a canary for fix_ppo too."""
    launch = load_script(SCRIPTS / "ddp_launch.py", "ddp_launch")
    script = tmp_path / "ppo_exact.py"
    script.write_text(PPO_EXACT)
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}

    def digest(mode, launcher=(), extra=None):
        proc = run([*launcher, str(script), str(SCRIPTS), mode], tmp_path, env={**env, **(extra or {})},
                   timeout=180)
        lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("digest")]
        assert len(lines) == 1, proc.stderr[-2000:]
        return lines[0][2], lines[0][3]

    def one_rank(mode):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
                    "--master_addr", "127.0.0.1", "--master_port", str(launch.free_port())]
        return digest(mode, torchrun, {"ACCELERATE_USE_CPU": "true"})

    plain = digest("plain", [sys.executable])
    unfixed, fixed = one_rank("unfixed"), one_rank("fixed")
    assert plain[0] == "DistributedType.NO" and unfixed[0] == fixed[0] == "DistributedType.MULTI_CPU"
    assert fixed[1] == plain[1]
    assert unfixed[1] != plain[1]
