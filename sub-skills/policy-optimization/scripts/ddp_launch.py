#!/usr/bin/env python3
"""Multi-process mode of tiny_rlhf_smoke.py (``--nproc N``): launch, per-rank worker, rank checks.

Launcher (``launch``, in the process that ran ``tiny-rlhf-smoke --nproc N``): picks a free port on
127.0.0.1, starts N processes with ``python -m torch.distributed.run`` (torchrun) inside a private
temporary directory, and on CPU sets ``ACCELERATE_USE_CPU=true`` so Accelerate selects MULTI_CPU
(gloo) instead of silently running N independent single-process trainers. It reads the report the
main process wrote and prints it: one JSON object for the whole run.

Worker (this file run by torchrun, ``ddp_launch.py --run-dir DIR -- <smoke args>``): every rank
runs the smoke's ``run_trainer`` with the fixes of ``ddp_fixes.py`` applied right after the trainer
is built and ``set_seed(seed, device_specific=True)``, then checks across ranks that every
parameter (trainable and frozen) is bitwise identical (all_gather_object of a SHA-256 per tensor),
that the ranks drew their rollout prompts independently, and that only the main process wrote the
checkpoint. Library prints never reach stdout; rank 0 writes DIR/report.json.

Usage (normally through tiny_rlhf_smoke.py):
    tiny_rlhf_smoke.py --trainer all --nproc 2 --json
    tiny_rlhf_smoke.py --trainer ppo --nproc 2 --no-ddp-fixes --json   # shows PPO's rank drift
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "scripts"))
import skill_runtime as rt  # noqa: E402  (shared runtime at the skill root, imported by path)

REPORT_NAME = "report.json"
CHECKPOINT_NAME = "checkpoint.pt"
LAUNCH_TIMEOUT_S = 1800        # whole multi-process run, every trainer
STOP_GRACE_S = 60             # after the timeout, time torchrun gets to stop its ranks
COLLECTIVE_TIMEOUT_S = 600     # one collective (a rank stuck in the library fails the run, no hang)
MAX_DIFF_NAMES = 8             # mismatched tensors whose max |difference| is gathered and reported


# launcher ---------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_device(spec: str, nproc: int) -> str:
    """'cpu' or 'cuda' for the workers; SkillError(2) when CUDA is asked for and cannot serve N ranks.

    One process per GPU (NCCL refuses two ranks on one device): N must not exceed the visible GPUs.
    """
    import torch
    if spec not in ("auto", "cpu", "cuda"):
        raise rt.SkillError(f"--device {spec} with --nproc: use auto, cpu or cuda (rank r uses cuda:r)")
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < nproc:
        raise rt.SkillError(f"--device {spec} --nproc {nproc} needs {nproc} visible CUDA devices, found "
                            f"{count}: one process per GPU; use --nproc {max(count, 1)} or --device cpu")
    return "cuda"


def worker_env(device: str) -> dict[str, str]:
    """Environment for the workers: CPU runs tell Accelerate so (else DistributedType.NO per rank)."""
    env = dict(os.environ)
    if device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
    env.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux") and Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo pairs on loopback, like the rendezvous
    return env


def stop_launcher(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM torchrun, on which it stops its ranks (each rank runs in a session of its own, so
    only torchrun can reach them); SIGKILL after STOP_GRACE_S. Returns its (stdout, stderr)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def run_launcher(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int | None, str, str]:
    """Run torchrun; past LAUNCH_TIMEOUT_S, or when this process is interrupted or terminated
    (KeyboardInterrupt, skill_runtime.Terminated: re-raised after), stop it and its ranks first.

    Returns (exit code, or None on timeout; stdout; stderr)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = stop_launcher(proc)
        return None, out, err + f"\nstopped after {LAUNCH_TIMEOUT_S} s"
    except BaseException:  # SIGINT / SIGTERM to this process alone: never orphan torchrun's ranks
        stop_launcher(proc)
        raise


def launch(smoke, args, argv: list[str], env_info: dict[str, Any]) -> int:
    """Run the smoke (the loaded ``tiny_rlhf_smoke`` module, whose ``args`` and ``argv`` these are)
    on ``args.nproc`` processes; print one report; return the exit code."""
    timer = rt.Timer()
    device = launch_device(args.device, args.nproc)
    port = free_port()
    caller = os.getcwd()
    caller_before = rt.watch_directory(caller)
    with rt.private_workdir() as run_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(args.nproc), "--master_addr", "127.0.0.1",
               "--master_port", str(port), "--max_restarts", "0",
               str(Path(__file__).resolve()), "--run-dir", str(run_dir), "--", *argv]
        env = worker_env(device)
        env["TMPDIR"] = str(run_dir)  # torchrun's torchelastic_* logs go with the private dir
        with timer.stage("launch"):
            returncode, out, err = run_launcher(cmd, run_dir, env)
        if args.verbose:
            sys.stderr.write(out + err)
        report_path = run_dir / REPORT_NAME
        report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() else None
    tail = (out + err)[-2000:]
    if report is None:  # a rank died before rank 0 wrote the report (crash, timeout, launcher error)
        report = {"status": "failed", "mode": smoke.mode_name(args), "trainer": args.trainer, "device": device,
                  "seed": args.seed, "results": {}, "checks": [], "timings_s": {}}
        # the workers' own last lines: what precedes torchrun's failure log (E<date> ... elastic)
        workers_out = re.split(r"^[EWI]\d{4} [^\n]*torch/distributed/elastic", out + err, maxsplit=1,
                               flags=re.MULTILINE)[0]
        last = [line.strip() for line in workers_out.splitlines() if line.strip()][-4:]
        report["checks"].append({"name": "workers_finished", "passed": False,
                                 "detail": f"launcher exit {returncode}, no report; workers' last lines: "
                                           f"{' | '.join(last) or 'none'} (more in launcher.output_tail)"})
    workdir_check = rt.caller_directory_check(caller, caller_before)
    for result in report["results"].values():
        result["checks"].append(workdir_check)
        result["status"] = rt.status_of(result["checks"])
    if "checks" in report and args.trainer != "all" and report["results"]:
        report["checks"] = report["results"][args.trainer]["checks"]
    elif not report["results"]:
        report["checks"].append(workdir_check)
    ok = bool(report["results"]) and all(r["status"] == "ok" for r in report["results"].values())
    report["status"] = "ok" if ok else "failed"
    report.update(versions=env_info["versions"], tested=env_info["tested"], warnings=env_info["warnings"])
    report["launcher"] = {"command": "python -m torch.distributed.run", "nproc": args.nproc,
                          "master": f"127.0.0.1:{port}", "returncode": returncode,
                          "accelerate_use_cpu": device == "cpu", "ddp_fixes": not args.no_ddp_fixes}
    if not ok:
        report["launcher"]["output_tail"] = tail
    report.setdefault("timings_s", {})
    # the parent imports no torch: "import" is each rank's business, so null here (as documented)
    report["timings_s"].update(launch=timer.stages["launch"], total=timer.total())
    report["timings_s"].setdefault("import", None)
    rt.emit(report, args.json, smoke.summary)
    return rt.EXIT_OK if ok else rt.EXIT_CHECK_FAILED


# worker -----------------------------------------------------------------------------------------

def tensor_digest(tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and raw bytes (bitwise identity, any dtype)."""
    import torch
    t = tensor.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class RankRecorder:
    """Per-trainer hooks of one rank: fixes, per-rank seeding and a record of the prompt draws."""

    def __init__(self, args, fixes) -> None:
        self.args, self.fixes = args, fixes
        self.trainer = None
        self.draws: list[int] = []
        self.rng_digest = ""
        self._patched: tuple[Any, Any] | None = None

    def after_build(self, name: str, trainer) -> None:
        from accelerate.utils import set_seed
        self.trainer = trainer
        if not self.args.no_ddp_fixes:
            self.fixes.apply_ddp_fixes(trainer)
        set_seed(self.args.seed, device_specific=True)  # seed + process index: ranks sample apart
        self.rng_digest = hashlib.sha256(repr(random.getstate()).encode()).hexdigest()[:16]
        # the trainers draw each rollout's prompt with `randrange(0, num_prompts)` imported into
        # their module (palm_rlhf_pytorch/{ppo,grpo,tpo,flowrl}.py): record the draws
        module = sys.modules[type(trainer).__module__]
        original = module.randrange

        def recording_randrange(*a, **kw):
            value = original(*a, **kw)
            self.draws.append(value)
            return value

        module.randrange = recording_randrange
        self._patched = (module, original)

    def restore(self) -> None:
        if self._patched:
            module, original = self._patched
            module.randrange = original
            self._patched = None


def gather(obj):
    """all_gather_object over the default process group: a list with one entry per rank."""
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rank_checks(name: str, recorder: RankRecorder, smoke, fixes, state) -> dict[str, Any]:
    """Collective checks after one trainer ran on every rank. Every rank must call this."""
    import torch
    trainer, rank = recorder.trainer, state.process_index
    info: dict[str, Any] = {"checks": []}
    if trainer is None:  # construction failed on this rank; still join the collectives below
        digests, trainable = {}, set()
    else:
        params = dict(trainer.named_parameters())
        digests = {n: tensor_digest(p) for n, p in params.items()}
        ids = {id(p) for ps in smoke.trainable_groups(name, trainer).values() for p in ps}
        trainable = {n for n, p in params.items() if id(p) in ids}
    all_digests = gather(digests)
    names = sorted(set().union(*all_digests))
    mismatched = [n for n in names if len({d.get(n) for d in all_digests}) > 1]
    diffs: dict[str, float] = {}
    if mismatched and trainer is not None:
        sample = {n: params[n].detach().float().cpu() for n in mismatched[:MAX_DIFF_NAMES] if n in params}
        tensors = gather(sample)
        for n in sample:
            diffs[n] = max(float((t[n] - tensors[0][n]).abs().max()) for t in tensors if n in t)
    else:
        gather({})  # keep the collectives matched on every rank
    frozen_bad = [n for n in mismatched if n not in trainable]
    info["rank_sync"] = {"tensors_compared": len(names), "trainable_compared": len(trainable),
                         "mismatched": len(mismatched), "trainable_mismatched": len(mismatched) - len(frozen_bad),
                         "frozen_mismatched": len(frozen_bad), "mismatched_names": mismatched[:MAX_DIFF_NAMES],
                         "max_abs_diff": max(diffs.values()) if diffs else 0.0}
    info["checks"].append({
        "name": "ranks_in_sync", "passed": bool(names) and not mismatched,
        "detail": f"{len(names)} tensors ({len(trainable)} trainable) compared across "
                  f"{state.num_processes} ranks by SHA-256: "
                  + ("all identical" if not mismatched else
                     f"{len(mismatched)} differ ({len(frozen_bad)} frozen), max |diff| "
                     f"{info['rank_sync']['max_abs_diff']:.3g}: {', '.join(mismatched[:3])}")})

    draws, rngs = gather(recorder.draws), gather(recorder.rng_digest)
    distinct = len({tuple(d) for d in draws}) == len(draws)
    independent = len(set(rngs)) == len(rngs)
    info["prompt_draws"] = draws
    info["checks"].append({
        "name": "ranks_drew_different_prompts", "passed": distinct or independent,
        "detail": f"rollout prompt indices per rank: {draws}; "
                  + ("they differ" if distinct else "identical sequences")
                  + ("; each rank's Python RNG seeded apart (set_seed(seed, device_specific=True))"
                     if independent else "; all ranks share one Python RNG state: duplicated work")})

    # checkpoint: what the user calls on every rank; count the torch.save calls of this rank
    path = Path(CHECKPOINT_NAME)
    saves, real_save = [], torch.save
    torch.save = lambda obj, f, *a, **kw: (saves.append(str(f)), real_save(obj, f, *a, **kw))[1]
    error = None
    try:
        if trainer is None:
            pass
        elif recorder.args.no_ddp_fixes:
            trainer.save(str(path))
        else:
            fixes.save_checkpoint(trainer, path)
    except Exception as exc:  # noqa: BLE001 - reported as the check's detail
        error = rt.one_line(exc)
    finally:
        torch.save = real_save
    state.wait_for_everyone()
    saves_per_rank = gather(len(saves))
    keys_ok, detail_keys = False, "no checkpoint"
    if rank == 0 and path.is_file() and trainer is not None:
        try:
            keys = set(torch.load(path, map_location="cpu", weights_only=True))
            expected = set(fixes.checkpoint_module(trainer).state_dict())
            prefixed = sorted(k for k in keys if k.startswith("module."))
            keys_ok = keys == expected
            detail_keys = (f"{len(keys)} keys, {len(prefixed)} with 'module.' prefix, "
                           f"{'equal to' if keys_ok else 'not'} the unwrapped state_dict keys")
        except Exception as exc:  # noqa: BLE001 - e.g. a file two ranks wrote at once
            detail_keys = f"unreadable: {rt.one_line(exc)}"
    state.wait_for_everyone()
    if rank == 0 and path.exists():
        path.unlink()
    errors = gather(error)
    info["checkpoint"] = {"saves_per_rank": saves_per_rank, "errors": errors}
    info["checks"].append({
        "name": "only_main_process_wrote",
        "passed": saves_per_rank == [1] + [0] * (len(saves_per_rank) - 1) and keys_ok and not any(errors),
        "detail": f"torch.save calls per rank {saves_per_rank}; checkpoint: {detail_keys}"
                  + (f"; errors {errors}" if any(errors) else "")})
    if name == "tpo" and not recorder.args.construct_only:  # the buffer exists once train() ran
        folders = gather(sorted(str(p.relative_to(Path.cwd())) for p in Path.cwd().rglob(smoke.TPO_BUFFER)))
        per_rank = folders[0] == [f"{fixes.RANK_FOLDER.format(rank=r)}/{smoke.TPO_BUFFER}"
                                  for r in range(state.num_processes)]
        info["checks"].append({"name": "replay_buffer_per_rank", "passed": per_rank,
                               "detail": f"replay-buffer folders in the shared working directory: {folders[0]}"})
    return info


def merge(name: str, per_rank: list[dict[str, Any]], sync: dict[str, Any], state_info: dict) -> dict:
    """Rank 0's result plus the cross-rank checks; fails when any rank's own check failed."""
    result = per_rank[0]
    failing = [f"rank {r}: {c['name']}" for r, res in enumerate(per_rank) for c in res["checks"] if not c["passed"]]
    result["checks"] = [state_info["check"], *result["checks"], *sync["checks"],
                        {"name": "all_ranks_passed", "passed": not failing,
                         "detail": f"{len(per_rank)} ranks ran the smoke checks; failed: {failing or 'none'}"}]
    result["rank_sync"] = sync["rank_sync"]
    result["checkpoint"] = sync["checkpoint"]
    result["ranks"] = [{"rank": r, "status": res["status"], "prompt_draws": sync["prompt_draws"][r],
                        "timings_s": res["timings_s"]} for r, res in enumerate(per_rank)]
    result["status"] = rt.status_of(result["checks"])
    return result


def worker(argv: list[str]) -> int:
    """One rank: run the smoke for each trainer, check the ranks, rank 0 writes the report."""
    parser = argparse.ArgumentParser(prog="ddp_launch.py")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("smoke_args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    smoke_args = ns.smoke_args[1:] if ns.smoke_args[:1] == ["--"] else ns.smoke_args
    smoke = rt.load_by_path("tiny_rlhf_smoke", HERE / "tiny_rlhf_smoke.py")
    fixes = rt.load_by_path("ddp_fixes", HERE / "ddp_fixes.py")
    args = smoke.build_parser().parse_args(smoke_args)
    variants = smoke.parse_variants(args.grpo_variant)

    from datetime import timedelta
    import torch
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    state = PartialState(cpu=cpu, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = state.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    multi = state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    state_info = {"check": {
        "name": "accelerate_multi_process", "passed": multi and state.num_processes == world,
        "detail": f"Accelerate {state.distributed_type} with {state.num_processes} processes "
                  f"(launcher started {world}), backend {state.backend}, rank 0 on {device}"}}
    work = ns.run_dir / "work"  # one working directory shared by all ranks, as a user's would be
    work.mkdir(exist_ok=True)
    os.chdir(work)
    args.caller_dir = str(ns.run_dir)
    if not args.no_ddp_fixes:  # where fix_tpo puts this rank's replay buffer
        args.tpo_buffer = f"{fixes.RANK_FOLDER.format(rank=state.process_index)}/{smoke.TPO_BUFFER}"
    names = list(smoke.TRAINERS) if args.trainer == "all" else [args.trainer]
    results = {}
    for name in names:
        recorder = RankRecorder(args, fixes)
        try:
            result = smoke.run_trainer(name, args, {"cpu": True} if cpu else {}, device, variants,
                                       after_build=recorder.after_build)
        except Exception as exc:  # noqa: BLE001 - e.g. construction failed: report, keep ranks matched
            result = {"trainer": name, "status": "failed", "timings_s": {}, "checks": [
                {"name": "trainer_ran", "passed": False, "detail": rt.one_line(exc)}]}
        finally:
            recorder.restore()
        if not state.is_main_process:  # Accelerator.print (the trainers' loss prints) is main-only
            for check in result["checks"]:
                if check["name"] == "losses_finite" and check["detail"] == "no loss printed":
                    check.update(passed=True, detail="not printed here: the trainers print with "
                                 "Accelerator.print, main process only (rank 0 checks its losses)")
            result["status"] = rt.status_of(result["checks"])
        sync = rank_checks(name, recorder, smoke, fixes, state)
        per_rank = gather(result)
        results[name] = merge(name, per_rank, sync, state_info)
    if state.is_main_process:
        report = smoke.trainers_report(args, results, device, args.cpu_threads)
        report.update(nproc=state.num_processes, distributed_type=str(state.distributed_type).split(".")[-1])
        (ns.run_dir / REPORT_NAME).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    state.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
