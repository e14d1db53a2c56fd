"""The smoke on several processes: as one rank of a launcher's world (``run_rank``), and the
``--nproc N`` shortcut that starts N ranks of the smoke on this machine (``run_nproc``).

Under a launcher (``torchrun``, ``accelerate launch``, ``srun``, or anything that sets ``RANK`` and
``WORLD_SIZE`` for torch's env:// rendezvous) the smoke sees from the environment that it is one rank
of a world (``launch.launcher_world``) and runs ``run_rank``: every rank runs the smoke's checklist
(``checklist.run_trainer``) with the fixes of ``ddp_fixes.py`` applied right after the trainer
is built and ``set_seed(seed, device_specific=True)``, then checks across ranks that every parameter
(trainable and frozen) is finite and bitwise identical (all_gather_object of a SHA-256 per tensor),
that the ranks drew their rollout prompts independently, and that only the main process wrote the
checkpoint. The ranks of one node share one private working directory, as a training script's ranks
share theirs. Library prints never reach stdout; global rank 0 prints the one report, the other
ranks' stdout stays empty, and every rank exits with the report's exit code. Rank 0 shows its
progress on stderr (under ``--nproc`` in a file the launching process copies to its own stderr).

``--nproc N`` (``run_nproc``) starts the same smoke as N ranks with ``launch.launch_script`` inside
a private temporary directory, reads rank 0's report from its stdout, adds the launcher's facts and
prints it. It refuses (exit 2) more processes than usable CPU cores, or a predicted peak memory above
what is available, unless ``--oversubscribe``; on CUDA, more processes than visible GPUs always.
The generic parts (the world, torchrun, its environment and signals) are launch.py's. Torch-free at
import.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from skill_runtime import exits, placement, reporting, runner, streams, workspace
from policy_optimization import trainers
from policy_optimization.smoke import checklist, estimate, settings
from policy_optimization.smoke import report as smoke_report  # (the name report is the dict below)
from run_kit import launch

CHECKPOINT_NAME = "checkpoint.pt"
MAX_DIFF_NAMES = 8             # mismatched tensors whose max |difference| is gathered and reported
SMALLER = "a smaller --dim/--depth"  # the fix check_resources names


def check_options(args, world: launch.World | None) -> None:
    """Usage errors of the multi-process mode, before torch is imported (SkillError, exit 2): a
    device other than auto, cpu or cuda for several ranks, and --nproc under a launcher of another
    world size (options.refuse_misplaced refuses the multi-process options out of place)."""
    if (world is not None or args.nproc is not None) and args.device not in ("auto", "cpu", "cuda"):
        where = "with --nproc" if world is None else f"under {world.launcher}"
        raise exits.SkillError(f"--device {args.device} {where}: use auto, cpu or cuda (each rank uses the GPU "
                            "of its local rank, cuda:LOCAL_RANK)")
    if world is not None and args.nproc is not None and args.nproc != world.size:
        raise exits.SkillError(f"--nproc {args.nproc}, but {world.launcher} started a world of {world.size} "
                            "processes: drop --nproc under a launcher")


def check_resources(nproc: int | None, device: str, palm_config: dict[str, int], oversubscribe: bool) -> dict[str, Any]:
    """``launch.check_resources`` for the smoke at ``palm_config``: ``estimate.predicted_rank_mib``
    per process; ``nproc`` None is the single-process smoke. Raises SkillError (exit 2) when refused."""
    size = f"--dim {palm_config['dim']} --depth {palm_config['depth']}"
    return launch.check_resources(nproc, device, estimate.predicted_rank_mib(palm_config), oversubscribe,
                                  size, SMALLER)


def rank0_report(out: str) -> dict[str, Any] | None:
    """Rank 0's JSON report from torchrun's stdout (the other ranks print nothing there), or None."""
    try:
        report = json.loads(out)
    except ValueError:
        return None
    return report if isinstance(report, dict) and "results" in report else None


def run_nproc(script: Path, args, argv: list[str], env_info: dict[str, Any], progress: streams.Progress) -> int:
    """Run the smoke ``script`` (tiny_rlhf_smoke.py, whose ``args`` and ``argv`` these are) as
    ``args.nproc`` ranks on this machine (``launch.launch_script``); print one report; return the
    exit code. With ``progress`` enabled, rank 0's progress lines reach this process's stderr.

    Raises SkillError (exit 2) for CUDA that cannot serve N ranks and, without ``--oversubscribe``,
    N above the usable CPU cores or a predicted memory above the available memory."""
    timer = streams.Timer()
    device = "cpu" if launch.ddp_uses_cpu(args.device, args.nproc, f"--nproc {args.nproc}") else "cuda"
    resources = check_resources(args.nproc, device, settings.palm_config(args), args.oversubscribe)
    caller = os.getcwd()
    caller_before = workspace.watch_directory(caller)
    estimate.announce_estimate(args, progress, extra=" on each process")
    with workspace.private_workdir() as run_dir:
        rank_argv = [*launch.without_nproc(argv), "--json"] + (["--progress"] if progress.enabled else [])
        if progress.enabled:
            progress.note(f"starting {args.nproc} processes with torchrun; each imports torch first (seconds)")
        with timer.stage("launch"):
            done = launch.launch_script(script, rank_argv, args.nproc, device, run_dir,
                                        progress.stream if progress.enabled else None)
        if args.verbose:
            streams.write_stderr(done.stderr)
    report = rank0_report(done.stdout)
    if report is None:  # no rank 0 report (crash, timeout, launcher error)
        report = {"status": "failed", "mode": settings.mode_name(args), "trainer": args.trainer,
                  "device": device, "seed": args.seed, "results": {}, "checks": [], "timings_s": {"import": None}}
        report["checks"].append({"name": "workers_finished", "passed": False,
                                 "detail": f"launcher exit {done.returncode}, no report; "
                                           f"{launch.workers_errors(done.stdout + done.stderr)} (more in launcher.output_tail)"})
    workdir_check = workspace.caller_directory_check(caller, caller_before)
    for result in report["results"].values():  # the ranks checked the private run directory; this, yours
        result["checks"] = [c for c in result["checks"] if c["name"] != workdir_check["name"]] + [workdir_check]
        result["status"] = reporting.status_of(result["checks"])
    if "checks" in report and args.trainer != "all" and report["results"]:
        report["checks"] = report["results"][args.trainer]["checks"]
    elif not report["results"]:
        report["checks"].append(workdir_check)
    ok = bool(report["results"]) and all(r["status"] == "ok" for r in report["results"].values())
    report["status"] = "ok" if ok else "failed"
    report.update(versions=env_info["versions"], tested=env_info["tested"], warnings=env_info["warnings"])
    report["launcher"] = {"command": "python -m torch.distributed.run", "nproc": args.nproc,
                          "master": done.master, "returncode": done.returncode,
                          "accelerate_use_cpu": device == "cpu", "ddp_fixes": not args.no_ddp_fixes,
                          "resources": resources}
    if not ok:
        report["launcher"]["output_tail"] = done.output_tail
    report["timings_s"].update(launch=timer.stages["launch"], total=timer.total())
    return runner.emit(report, args.json, smoke_report.summary, exits.EXIT_OK if ok else exits.EXIT_CHECK_FAILED)


# one rank ----------------------------------------------------------------------------------------

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
    """all_gather_object over the default process group: a list with one entry per rank.

    Raises SkillError (exit 1) when the collective fails (a rank died, or the ranks' collectives
    went out of step and one timed out after --dist-timeout): the world cannot report any more."""
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(out, obj)
    except Exception as exc:  # noqa: BLE001 - gloo/NCCL raise RuntimeError or DistError subclasses
        raise exits.SkillError(f"rank {dist.get_rank()} of {dist.get_world_size()} lost the other ranks in a "
                            f"collective: {exits.one_line(exc)}", exits.EXIT_CHECK_FAILED) from None
    return out


def rank_checks(name: str, recorder: RankRecorder, fixes, state) -> dict[str, Any]:
    """Collective checks after one trainer ran on every rank. Every rank must call this."""
    import torch
    trainer, rank = recorder.trainer, state.process_index
    info: dict[str, Any] = {"checks": []}
    if trainer is None:  # construction failed on this rank; still join the collectives below
        digests, trainable, nonfinite = {}, set(), []
    else:
        params = dict(trainer.named_parameters())
        digests = {n: tensor_digest(p) for n, p in params.items()}
        ids = {id(p) for ps in trainers.trainable_groups(name, trainer).values() for p in ps}
        trainable = {n for n, p in params.items() if id(p) in ids}
        nonfinite = [n for n, p in params.items() if p.is_floating_point() and not bool(torch.isfinite(p).all())]
    nonfinite_per_rank = gather(nonfinite)
    info["checks"].append({
        "name": "parameters_finite", "passed": trainer is not None and not any(nonfinite_per_rank),
        "detail": "non-finite tensors per rank: " + str([len(n) for n in nonfinite_per_rank])
                  + (f"; e.g. {next(n for n in nonfinite_per_rank if n)[:3]}" if any(nonfinite_per_rank) else "")})
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
        error = exits.one_line(exc)
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
            detail_keys = f"unreadable: {exits.one_line(exc)}"
    keys_ok, detail_keys = gather((keys_ok, detail_keys))[0]  # rank 0 read it: every rank reports the same
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
        # each rank lists its node's shared working directory: its own rank folder, no shared buffer
        folders = gather(sorted(str(p.relative_to(Path.cwd())) for p in Path.cwd().rglob(settings.TPO_BUFFER)))
        per_rank = all(f"{fixes.RANK_FOLDER.format(rank=r)}/{settings.TPO_BUFFER}" in seen
                       and settings.TPO_BUFFER not in seen for r, seen in enumerate(folders))
        info["checks"].append({"name": "replay_buffer_per_rank", "passed": per_rank,
                               "detail": f"replay-buffer folders in rank 0's working directory (shared by "
                                         f"the ranks of its node): {folders[0]}"})
    return info


def merge(name: str, per_rank: list[dict[str, Any]], sync: dict[str, Any], state_info: dict,
          eos_token: int | None) -> dict:
    """Rank 0's result plus the cross-rank checks; fails when any rank's own check failed."""
    result = per_rank[0]
    failing = [f"rank {r}: {c['name']}" for r, res in enumerate(per_rank) for c in res["checks"] if not c["passed"]]
    result["checks"] = [state_info["check"], *result["checks"], *sync["checks"],
                        {"name": "all_ranks_passed", "passed": not failing,
                         "detail": f"{len(per_rank)} ranks ran the smoke checks; failed: {failing or 'none'}"}]
    result["rank_sync"] = sync["rank_sync"]
    result["checkpoint"] = sync["checkpoint"]
    result["ranks"] = [{"rank": r, "status": res["status"], "prompt_draws": sync["prompt_draws"][r],
                        "rollout_lengths": res.get("rollout_lengths"), "timings_s": res["timings_s"]}
                       for r, res in enumerate(per_rank)]
    if eos_token is not None:  # the rotary caches grow to each rank's longest sequence
        lengths = [res.get("rollout_lengths") or [] for res in per_rank]
        longest = [max(n, default=0) for n in lengths]
        result["eos"] = {"token": eos_token, "longest_rollout_per_rank": longest,
                         "ranks_differ": len(set(longest)) > 1}
        for check in result["checks"]:
            if check["name"] == "rollouts_ended_at_eos":
                check["detail"] += (f"; rollout lengths per rank {lengths}, longest {longest}"
                                    + (" (the ranks' rotary caches differ)" if len(set(longest)) > 1 else ""))
    result["status"] = reporting.status_of(result["checks"])
    return result


@contextlib.contextmanager
def node_workdir(state, world: launch.World, keys: list[str]):
    """chdir into one private temporary directory per node, shared by the ranks of that node (as a
    training script's working directory is), and remove it once every rank is done with it.
    ``keys``: every rank's ``world.node``, gathered."""
    leader = keys.index(world.node) == state.process_index  # the node's lowest rank creates it
    paths = gather(tempfile.mkdtemp(prefix="palm-rlhf-skill-") if leader else None)
    folder = paths[keys.index(world.node)]
    caller = os.getcwd()
    os.chdir(folder)
    done = False
    try:
        yield Path(folder)
        done = True
    finally:
        os.chdir(caller)
        try:
            if done:  # after an error or a signal no barrier: a peer stuck elsewhere would hold it
                gather(None)  # every rank of the node is done with the folder
        finally:
            if leader:
                shutil.rmtree(folder, ignore_errors=True)


def run_rank(args, env_info: dict[str, Any], world: launch.World) -> int:
    """Run the smoke as one rank of ``world``: every trainer, the rank checks, and on global rank 0
    the one report on stdout (``--json``, or the plain report). Returns the report's exit code on
    every rank. Raises SkillError (exit 2) when the ranks cannot form a process group within
    ``--dist-timeout`` seconds, or for a device this rank cannot use."""
    from datetime import timedelta

    stream = launch.rank_progress_stream(world)  # --nproc: the launcher shows this file
    progress = streams.Progress(f"tiny-rlhf-smoke rank 0 of {world.size}",  # global rank 0 reports and shows progress
                                world.is_main and (not args.json or args.progress), stream)
    with progress.stage("import torch, palm-rlhf-pytorch and accelerate"):
        import torch
        from accelerate import PartialState
        from accelerate.utils import DistributedType

    import ddp_fixes as fixes
    variants = settings.parse_variants(args.grpo_variant)
    cpu = launch.ddp_uses_cpu(args.device, world.local_rank + 1, f"under {world.launcher} (local rank {world.local_rank})")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            state = PartialState(cpu=cpu, timeout=timedelta(seconds=args.dist_timeout))
    except Exception as exc:  # noqa: BLE001 - e.g. DistStoreError: a rank never arrived
        raise exits.SkillError(f"rank {world.rank} of {world.size}: no process group with the other ranks at "
                            f"{world.master} within --dist-timeout {args.dist_timeout} s: {exits.one_line(exc)}") from None
    device = state.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    multi = state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
    state_info = {"check": {
        "name": "accelerate_multi_process", "passed": multi and state.num_processes == world.size,
        "detail": f"Accelerate {state.distributed_type} with {state.num_processes} processes "
                  f"({world.launcher} started {world.size}), backend {state.backend}, rank 0 on {device}"}}
    names = settings.trainer_names(args)
    caller = os.getcwd()
    caller_before = workspace.watch_directory(caller)
    results = {}
    # library and Accelerate prints go to stderr: stdout carries rank 0's report only
    nodes = gather(world.node)  # each rank's node: the node's working directory, the report's node count
    with contextlib.redirect_stdout(sys.stderr), node_workdir(state, world, nodes), \
            placement.torch_threads(args.cpu_threads) as threads:
        args.caller_dir = caller
        if not args.no_ddp_fixes:  # where fix_tpo puts this rank's replay buffer
            args.tpo_buffer = f"{fixes.RANK_FOLDER.format(rank=state.process_index)}/{settings.TPO_BUFFER}"
        for name in names:
            recorder = RankRecorder(args, fixes)
            try:
                result = checklist.run_trainer(name, args, {"cpu": True} if cpu else {}, device, variants,
                                               after_build=recorder.after_build, progress=progress)
            except Exception as exc:  # noqa: BLE001 - e.g. construction failed: report, keep ranks matched
                result = {"trainer": name, "status": "failed", "timings_s": {}, "checks": [
                    {"name": "trainer_ran", "passed": False, "detail": exits.one_line(exc)}]}
            finally:
                recorder.restore()
            if not state.is_main_process:  # Accelerator.print (the trainers' loss prints) is main-only
                for check in result["checks"]:
                    if check["name"] == "losses_finite" and check["detail"] == "no loss printed":
                        check.update(passed=True, detail="not printed here: the trainers print with "
                                     "Accelerator.print, main process only (rank 0 checks its losses)")
                result["status"] = reporting.status_of(result["checks"])
            sync = rank_checks(name, recorder, fixes, state)
            results[name] = merge(name, gather(result), sync, state_info, args.eos_token)
    # every rank's view of its caller's directory, once the node's working directory is gone
    untouched = gather(workspace.caller_directory_check(caller, caller_before))
    workdir_check = {"name": untouched[0]["name"], "passed": all(c["passed"] for c in untouched),
                     "detail": "; ".join(f"rank {r}: {c['detail']}" for r, c in enumerate(untouched))}
    for result in results.values():
        result["checks"].append(workdir_check)
        result["status"] = reporting.status_of(result["checks"])
    report = smoke_report.trainers_report(args, results, device, threads)
    report.update(nproc=state.num_processes, distributed_type=str(state.distributed_type).split(".")[-1],
                  versions=env_info["versions"], tested=env_info["tested"], warnings=env_info["warnings"])
    report["launcher"] = {"name": world.launcher, "world_size": world.size, "master": world.master,
                          "nodes": len(set(nodes)), "ddp_fixes": not args.no_ddp_fixes,
                          "accelerate_use_cpu": cpu}
    report["timings_s"].setdefault("import", None)  # each rank imported torch before its world existed
    if stream is not None:
        stream.close()
    if state.is_main_process:
        runner.emit(report, args.json, smoke_report.summary, exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED)
    state.wait_for_everyone()  # rank 0 has printed before any rank exits (torchrun stops the rest then)
    return exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED


