"""Multi-process mode of tiny_rlhf_smoke.py: one rank of a launcher's world, and the ``--nproc N`` shortcut.

Under a launcher (``torchrun``, ``accelerate launch``, ``srun``, or anything that sets ``RANK`` and
``WORLD_SIZE`` for torch's env:// rendezvous) the smoke sees from the environment that it is one rank
of a world (``launcher_world``) and runs ``run_rank``: every rank runs the smoke's ``run_trainer``
with the fixes of ``ddp_fixes.py`` applied right after the trainer is built and
``set_seed(seed, device_specific=True)``, then checks across ranks that every parameter (trainable
and frozen) is finite and bitwise identical (all_gather_object of a SHA-256 per tensor), that the
ranks drew their rollout prompts independently, and that only the main process wrote the
checkpoint. The ranks of one node share one private working directory, as a training script's ranks
share theirs. Library prints never reach stdout; global rank 0 prints the one report, the other
ranks' stdout stays empty, and every rank exits with the report's exit code. Rank 0 shows its progress on stderr (under ``--nproc``
in a file the launching process copies to its own stderr).

``--nproc N`` (``launch``) is the one-machine shortcut on top of it: it starts
``python -m torch.distributed.run --nproc_per_node N tiny_rlhf_smoke.py <the same arguments>`` on
a free port of 127.0.0.1 inside a private temporary directory (on CPU with ``ACCELERATE_USE_CPU=true``),
reads rank 0's report from its stdout, adds the launcher's facts and prints it. It refuses (exit 2)
more processes than usable CPU cores, or a predicted peak memory above what is available, unless
``--oversubscribe``; on CUDA, more processes than visible GPUs always.

Usage (normally through tiny_rlhf_smoke.py):
    tiny_rlhf_smoke.py --trainer all --nproc 2 --json
    tiny_rlhf_smoke.py --trainer ppo --nproc 2 --no-ddp-fixes --json   # shows PPO's rank drift
    torchrun --nproc-per-node 2 tiny_rlhf_smoke.py --trainer all --json   # the same, your launcher
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "scripts"))
from skill_runtime import exits, options, placement, reporting, runner, streams, workspace  # noqa: E402
from policy_optimization import trainers  # noqa: E402

CHECKPOINT_NAME = "checkpoint.pt"
LAUNCH_TIMEOUT_S = 1800        # whole --nproc run, every trainer
STOP_GRACE_S = 60             # after the timeout, time torchrun gets to stop its ranks
DIST_TIMEOUT_S = 600           # default --dist-timeout: process-group start-up and each collective
MAX_DIFF_NAMES = 8             # mismatched tensors whose max |difference| is gathered and reported
MAX_NPROC = 64                 # --nproc bound (a usage error beyond it, before torch is imported)
PROGRESS_ENV = "PALM_RLHF_SKILL_PROGRESS"  # --nproc: the file rank 0 writes its progress lines to
# Predicted peak resident memory of one rank, for --nproc's refusal: measured peak RSS of the smoke
# (`/usr/bin/time -f %M`, torch 2.13 CPU): 340 MiB at the tiny default size (imports alone: 310 MiB),
# +118 MiB at --dim 256 --depth 4 (12.6 MiB of float32 PaLM weights), +407 MiB at --dim 512
# --depth 4 --new-tokens 64 (49 MiB): about 10 times the PaLM's float32 bytes above the floor. Against
# sizing.md's table: PPO, the heaviest trainer, within 10 % up to --dim 2048; GRPO over by
# up to 1.5x (tests/test_distributed.py checks both).
RANK_FLOOR_MIB = 350
RANK_MIB_PER_WEIGHT_MIB = 10


def add_options(parser: argparse.ArgumentParser) -> None:
    """The smoke's multi-process options (torch-free: --help and usage errors stay fast)."""
    group = parser.add_argument_group(
        "multi-process (DDP)", "under torchrun, accelerate launch or srun the smoke runs as one rank of "
        "their world by itself; --nproc N starts N ranks on this machine")
    group.add_argument("--nproc", type=options.bounded_int(1, MAX_NPROC), metavar="N",
                       help="launch N processes with torch.distributed.run (Accelerate MULTI_CPU or "
                            "MULTI_GPU, one GPU each), train on every rank with the DDP fixes of "
                            "ddp_fixes.py, and check the ranks stay in sync (see ddp_launch.py)")
    group.add_argument("--no-ddp-fixes", action="store_true",
                       help="with --nproc or under a launcher: skip the DDP fixes, to see what breaks without them")
    group.add_argument("--oversubscribe", action="store_true",
                       help="start even when the predicted memory exceeds the available memory, and with "
                            "--nproc even when N exceeds the usable CPU cores (refused by default, exit 2)")
    group.add_argument("--dist-timeout", type=options.bounded_int(1, 86400), default=DIST_TIMEOUT_S, metavar="S",
                       help="seconds a rank waits for the others to start and in each collective before "
                            f"it fails with one line (default: {DIST_TIMEOUT_S})")


# the launcher's world ----------------------------------------------------------------------------

@dataclass(frozen=True)
class World:
    """This process's place in a world that a launcher started (from its environment variables)."""
    launcher: str    # torchrun, accelerate launch, srun, or env (RANK/WORLD_SIZE from anything else)
    rank: int        # global rank
    size: int        # world size (all nodes)
    local_rank: int  # rank on this node
    node: str        # which node: torchrun's GROUP_RANK, Slurm's SLURM_NODEID, else the host name
    master: str      # MASTER_ADDR:MASTER_PORT, the rendezvous of torch's env:// init


def _env_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise exits.SkillError(f"{name}={value!r} from the launcher is not an integer") from None


def launcher_world(environ: dict[str, str] | None = None) -> World | None:
    """The world this process is one rank of, read from the launcher's variables; None when no
    launcher started it. Torch-free.

    - torchrun (torch/distributed/run.py; also what ``accelerate launch`` runs for multi-GPU and
      multi-node configs, adding ``ACCELERATE_MIXED_PRECISION`` and other ``ACCELERATE_*``): RANK,
      WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (node rank), MASTER_ADDR, MASTER_PORT,
      TORCHELASTIC_RUN_ID.
    - srun (Slurm, one task per rank): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and,
      in a job step, SLURM_STEP_ID (a batch script's own shell also has SLURM_PROCID and
      SLURM_NTASKS, but no step id). Torch reads none of them: this maps them to RANK, WORLD_SIZE
      and LOCAL_RANK in ``environ``; MASTER_ADDR and MASTER_PORT must be exported by the batch
      script (SkillError, exit 2, when missing). A step of one task is not a world.
    Raises SkillError (exit 2) for a variable that is not an integer, and when MASTER_ADDR or
    MASTER_PORT (torch's env:// rendezvous) is missing: a configuration error, found before any
    rank waits ``--dist-timeout`` seconds for the others.
    """
    environ = os.environ if environ is None else environ
    if "RANK" in environ and "WORLD_SIZE" in environ:
        if "TORCHELASTIC_RUN_ID" in environ:
            launcher = "accelerate launch" if "ACCELERATE_MIXED_PRECISION" in environ else "torchrun"
        else:
            launcher = "env"
        rank, size = _env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE")
        local_rank = _env_int(environ, "LOCAL_RANK", 0)
        node = environ.get("GROUP_RANK", socket.gethostname())
    elif "SLURM_STEP_ID" in environ and _env_int(environ, "SLURM_NTASKS", 1) > 1:
        launcher = "srun"
        rank, size = _env_int(environ, "SLURM_PROCID"), _env_int(environ, "SLURM_NTASKS")
        local_rank = _env_int(environ, "SLURM_LOCALID", 0)
        node = environ.get("SLURM_NODEID", socket.gethostname())
    else:
        return None
    if not 0 <= rank < size or local_rank < 0:
        raise exits.SkillError(f"launcher variables out of range: rank {rank}, world size {size}, local rank {local_rank}")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(name)]
    if missing:  # torch's env:// rendezvous reads both; torchrun and accelerate launch always set them
        unset = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: export"
        raise exits.SkillError(
            f"srun started this smoke as task {rank} of {size}, but {unset} MASTER_ADDR (the first node's host "
            "name) and MASTER_PORT (a free port) in the batch script before srun (see distributed.md)"
            if launcher == "srun" else
            f"rank {rank} of {size} ({launcher}): {unset} MASTER_ADDR (rank 0's host name) and MASTER_PORT "
            "(a free port), or start the ranks with torchrun (see distributed.md)")
    if launcher == "srun":  # what torch's env:// rendezvous and Accelerate read
        environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local_rank))
    return World(launcher, rank, size, local_rank, str(node), f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}")


def check_options(args, world: World | None) -> None:
    """Usage errors of the multi-process options, before torch is imported (SkillError, exit 2)."""
    if (world is not None or args.nproc is not None) and args.device not in ("auto", "cpu", "cuda"):
        where = "with --nproc" if world is None else f"under {world.launcher}"
        raise exits.SkillError(f"--device {args.device} {where}: use auto, cpu or cuda (each rank uses the GPU "
                            "of its local rank, cuda:LOCAL_RANK)")
    if world is None:
        if args.no_ddp_fixes and args.nproc is None:
            raise exits.SkillError("--no-ddp-fixes applies to --nproc runs or to the ranks a launcher started")
        if args.dist_timeout != DIST_TIMEOUT_S and args.nproc is None:
            raise exits.SkillError("--dist-timeout applies to --nproc runs or to the ranks a launcher started")
    elif args.nproc is not None and args.nproc != world.size:
        raise exits.SkillError(f"--nproc {args.nproc}, but {world.launcher} started a world of {world.size} "
                            "processes: drop --nproc under a launcher")


def ddp_uses_cpu(spec: str, gpus: int, where: str) -> bool:
    """Whether the ranks run on the CPU: ``--device cpu``, ACCELERATE_USE_CPU (Accelerate's own
    switch, which every rank reads), or auto without CUDA; else each rank needs its own GPU (NCCL
    refuses two ranks on one device). ``spec`` is auto, cpu or cuda (``check_options``); ``gpus`` the
    GPUs this process needs visible: --nproc's N, or a rank's LOCAL_RANK + 1; ``where`` names the
    mode for the error. Raises SkillError (exit 2) when fewer GPUs are visible."""
    import torch
    if spec == "cpu" or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    if spec == "auto" and not torch.cuda.is_available():
        return True
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < gpus:
        raise exits.SkillError(f"--device {spec} {where} needs {gpus} visible CUDA devices, found {count}: one "
                            "process per GPU; " + (f"start at most {count} ranks on this machine, or " if count else "")
                            + "use --device cpu")
    return False


# the --nproc shortcut -----------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def palm_weights(config: dict[str, int]) -> int:
    """Number of weights of ``PaLM(**config)`` for the smoke's config keys (num_tokens, dim, depth,
    heads, dim_head; palm.py defaults ff_mult=4, qk_rmsnorm=False): the token embedding (tied with
    to_logits), per layer a layer norm, the fused attention/feed-forward projection and the two
    output projections, and the final norm. Counted without importing the library, which would cost
    the launching process ~300 MiB for the whole run; tests compare it with ``PaLM(...).parameters()``."""
    n, d, dh = config["num_tokens"], config["dim"], config["dim_head"]
    attn, ff = config["heads"] * dh, 4 * d
    layer = d + d * (attn + 2 * dh + 2 * ff) + attn * d + ff * d
    return n * d + d + config["depth"] * layer


def predicted_rank_mib(config: dict[str, int]) -> int:
    """Predicted peak resident memory of one rank in MiB: RANK_FLOOR_MIB plus RANK_MIB_PER_WEIGHT_MIB
    times the PaLM's float32 weights (``palm_weights``)."""
    return RANK_FLOOR_MIB + round(RANK_MIB_PER_WEIGHT_MIB * palm_weights(config) * 4 / 2**20)


def check_resources(nproc: int | None, device: str, palm_config: dict[str, int], oversubscribe: bool) -> dict[str, Any]:
    """Refuse (SkillError, exit 2) N CPU ranks on fewer usable cores, or N ranks whose predicted memory
    (``predicted_rank_mib`` each) exceeds MemAvailable, unless ``oversubscribe``; ``nproc`` None is
    the single-process smoke (its memory only). Returns what was compared (for the report)."""
    cpus, available = placement.usable_cpus(), placement.available_memory_mib()
    predicted = (nproc or 1) * predicted_rank_mib(palm_config)
    facts = {"usable_cpus": cpus, "predicted_mib": predicted, "available_mib": available,
             "oversubscribe": oversubscribe}
    if oversubscribe:
        return facts
    if nproc is not None and device == "cpu" and nproc > cpus:
        raise exits.SkillError(f"--nproc {nproc} on {cpus} usable CPU cores: more ranks than cores only slow "
                            f"each other down; use --nproc {cpus} or less, or pass --oversubscribe")
    if predicted > available:
        size = f"--dim {palm_config['dim']} --depth {palm_config['depth']}"
        if nproc is None:
            raise exits.SkillError(f"{size} needs about {predicted} MiB, {available} MiB available: use a smaller "
                                "--dim/--depth, or pass --oversubscribe to start anyway")
        raise exits.SkillError(f"--nproc {nproc} needs about {predicted} MiB ({predicted // nproc} MiB per rank), "
                            f"{available} MiB available: use fewer processes or a smaller --dim/--depth, "
                            "or pass --oversubscribe")
    return facts


def worker_env(device: str) -> dict[str, str]:
    """Environment for the workers: CPU runs tell Accelerate so (else DistributedType.NO per rank)."""
    env = dict(os.environ)
    if device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
    env.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux") and Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo pairs on loopback, like the rendezvous
    return env


def run_launcher(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int | None, str, str]:
    """Run torchrun; past LAUNCH_TIMEOUT_S, or when this process is interrupted or terminated
    (KeyboardInterrupt, runner.Terminated: re-raised after), stop it and its ranks first:
    ``runner.stop_child``'s SIGTERM makes torchrun stop its ranks (each runs in a session of its own,
    so only torchrun can reach them), SIGKILL after STOP_GRACE_S.

    Returns (exit code, or None on timeout; stdout; stderr)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = runner.stop_child(proc, STOP_GRACE_S)
        return None, out, err + f"\nstopped after {LAUNCH_TIMEOUT_S} s"
    except BaseException:  # SIGINT / SIGTERM to this process alone: never orphan torchrun's ranks
        runner.stop_child(proc, STOP_GRACE_S)
        raise


def without_nproc(argv: list[str]) -> list[str]:
    """The smoke's arguments minus ``--nproc N`` (also ``--nproc=N`` and the prefixes argparse
    accepts, ``--np`` ...): the ranks must not launch again, and torchrun's own parser would reject
    ``--nproc`` after the script as an ambiguous prefix of its ``--nproc-per-node``."""
    out, skip = [], False
    for token in argv:
        name = token.split("=", 1)[0]
        if skip:
            skip = False
        elif len(name) > len("--n") and "--nproc".startswith(name):
            skip = "=" not in token
        else:
            out.append(token)
    return out


def rank0_report(out: str) -> dict[str, Any] | None:
    """Rank 0's JSON report from torchrun's stdout (the other ranks print nothing there), or None."""
    try:
        report = json.loads(out)
    except ValueError:
        return None
    return report if isinstance(report, dict) and "results" in report else None


def workers_errors(output: str) -> str:
    """What the ranks said before torchrun's failure log (``E<date> ... torch/distributed/elastic``):
    their error lines (a Python exception, a C++ ``what():``, a one-line smoke error), first ones
    first, or else their last lines."""
    workers_out = re.split(r"^[EWI]\d{4} [^\n]*torch/distributed/elastic", output, maxsplit=1,
                           flags=re.MULTILINE)[0]
    lines = [line.strip() for line in workers_out.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(\w+Error|what\(\)|error):", line)]
    if errors:
        return "workers' errors: " + " | ".join(dict.fromkeys(errors[:2] + errors[-2:]))
    return "workers' last lines: " + (" | ".join(lines[-4:]) or "none")


def follow(path: Path, stream, stop: threading.Event) -> None:
    """Copy what is appended to ``path`` (rank 0's progress lines) to ``stream`` every 0.2 s, until
    ``stop`` is set and the file is drained; a file not yet created is waited for."""
    offset = 0
    while True:
        done = stop.wait(0.2)
        try:
            with open(path, "rb") as new:
                new.seek(offset)
                chunk = new.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            stream.write(chunk.decode("utf-8", "replace"))
            stream.flush()
        if done:
            return


def launch(smoke, args, argv: list[str], env_info: dict[str, Any], progress: streams.Progress) -> int:
    """Run the smoke (the loaded ``tiny_rlhf_smoke`` module, whose ``args`` and ``argv`` these are)
    as ``args.nproc`` ranks on this machine under torchrun; print one report; return the exit code.
    With ``progress`` enabled, rank 0's progress lines reach this process's stderr (through a file
    named by PROGRESS_ENV).

    Raises SkillError (exit 2) for CUDA that cannot serve N ranks and, without ``--oversubscribe``,
    N above the usable CPU cores or a predicted memory above the available memory."""
    timer = streams.Timer()
    device = "cpu" if ddp_uses_cpu(args.device, args.nproc, f"--nproc {args.nproc}") else "cuda"
    resources = check_resources(args.nproc, device, smoke.palm_config(args), args.oversubscribe)
    port = free_port()
    caller = os.getcwd()
    caller_before = workspace.watch_directory(caller)
    smoke.announce_estimate(args, progress, extra=" on each process")
    with workspace.private_workdir() as run_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(args.nproc), "--master_addr", "127.0.0.1",
               "--master_port", str(port), "--max_restarts", "0",
               str(Path(smoke.__file__).resolve()), *without_nproc(argv), "--json"]
        env = worker_env(device)
        env["TMPDIR"] = str(run_dir)  # torchrun's torchelastic_* logs and the ranks' directory go with it
        stop, follower = threading.Event(), None
        if progress.enabled:
            cmd.append("--progress")
            env[PROGRESS_ENV] = str(run_dir / "rank0-progress.txt")
            follower = threading.Thread(target=follow, args=(Path(env[PROGRESS_ENV]), progress.stream, stop),
                                        daemon=True)
            follower.start()
            progress.note(f"starting {args.nproc} processes with torchrun; each imports torch first (seconds)")
        with timer.stage("launch"):
            try:
                returncode, out, err = run_launcher(cmd, run_dir, env)
            finally:
                stop.set()
                if follower:
                    follower.join()
        if args.verbose:
            streams.write_stderr(err)
    report = rank0_report(out)
    tail = (out + err)[-2000:]
    if report is None:  # no rank 0 report (crash, timeout, launcher error)
        report = {"status": "failed", "mode": smoke.mode_name(args), "trainer": args.trainer, "device": device,
                  "seed": args.seed, "results": {}, "checks": [], "timings_s": {"import": None}}
        report["checks"].append({"name": "workers_finished", "passed": False,
                                 "detail": f"launcher exit {returncode}, no report; {workers_errors(out + err)} "
                                           "(more in launcher.output_tail)"})
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
                          "master": f"127.0.0.1:{port}", "returncode": returncode,
                          "accelerate_use_cpu": device == "cpu", "ddp_fixes": not args.no_ddp_fixes,
                          "resources": resources}
    if not ok:
        report["launcher"]["output_tail"] = tail
    report["timings_s"].update(launch=timer.stages["launch"], total=timer.total())
    return runner.emit(report, args.json, smoke.summary, exits.EXIT_OK if ok else exits.EXIT_CHECK_FAILED)


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


def rank_checks(name: str, recorder: RankRecorder, smoke, fixes, state) -> dict[str, Any]:
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
        folders = gather(sorted(str(p.relative_to(Path.cwd())) for p in Path.cwd().rglob(smoke.TPO_BUFFER)))
        per_rank = all(f"{fixes.RANK_FOLDER.format(rank=r)}/{smoke.TPO_BUFFER}" in seen
                       and smoke.TPO_BUFFER not in seen for r, seen in enumerate(folders))
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
def node_workdir(state, world: World, keys: list[str]):
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


def run_rank(smoke, args, env_info: dict[str, Any], world: World) -> int:
    """Run the smoke as one rank of ``world``: every trainer, the rank checks, and on global rank 0
    the one report on stdout (``--json``, or the plain report). Returns the report's exit code on
    every rank. Raises SkillError (exit 2) when the ranks cannot form a process group within
    ``--dist-timeout`` seconds, or for a device this rank cannot use."""
    from datetime import timedelta

    main_rank = world.rank == 0  # global rank 0 reports, and shows its progress
    progress_file = os.environ.get(PROGRESS_ENV)  # --nproc: the launcher shows this file
    stream = open(progress_file, "a", encoding="utf-8") if progress_file and main_rank else None
    progress = streams.Progress(f"tiny-rlhf-smoke rank 0 of {world.size}", main_rank and (not args.json or args.progress),
                           stream)
    with progress.stage("import torch, palm-rlhf-pytorch and accelerate"):
        import torch
        from accelerate import PartialState
        from accelerate.utils import DistributedType

    import ddp_fixes as fixes
    variants = smoke.parse_variants(args.grpo_variant)
    cpu = ddp_uses_cpu(args.device, world.local_rank + 1, f"under {world.launcher} (local rank {world.local_rank})")
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
    names = list(trainers.TRAINERS) if args.trainer == "all" else [args.trainer]
    caller = os.getcwd()
    caller_before = workspace.watch_directory(caller)
    results = {}
    # library and Accelerate prints go to stderr: stdout carries rank 0's report only
    nodes = gather(world.node)  # each rank's node: the node's working directory, the report's node count
    with contextlib.redirect_stdout(sys.stderr), node_workdir(state, world, nodes), \
            placement.torch_threads(args.cpu_threads) as threads:
        args.caller_dir = caller
        if not args.no_ddp_fixes:  # where fix_tpo puts this rank's replay buffer
            args.tpo_buffer = f"{fixes.RANK_FOLDER.format(rank=state.process_index)}/{smoke.TPO_BUFFER}"
        for name in names:
            recorder = RankRecorder(args, fixes)
            try:
                result = smoke.run_trainer(name, args, {"cpu": True} if cpu else {}, device, variants,
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
            sync = rank_checks(name, recorder, smoke, fixes, state)
            results[name] = merge(name, gather(result), sync, state_info, args.eos_token)
    # every rank's view of its caller's directory, once the node's working directory is gone
    untouched = gather(workspace.caller_directory_check(caller, caller_before))
    workdir_check = {"name": untouched[0]["name"], "passed": all(c["passed"] for c in untouched),
                     "detail": "; ".join(f"rank {r}: {c['detail']}" for r, c in enumerate(untouched))}
    for result in results.values():
        result["checks"].append(workdir_check)
        result["status"] = reporting.status_of(result["checks"])
    report = smoke.trainers_report(args, results, device, threads)
    report.update(nproc=state.num_processes, distributed_type=str(state.distributed_type).split(".")[-1],
                  versions=env_info["versions"], tested=env_info["tested"], warnings=env_info["warnings"])
    report["launcher"] = {"name": world.launcher, "world_size": world.size, "master": world.master,
                          "nodes": len(set(nodes)), "ddp_fixes": not args.no_ddp_fixes,
                          "accelerate_use_cpu": cpu}
    report["timings_s"].setdefault("import", None)  # each rank imported torch before its world existed
    if stream is not None:
        stream.close()
    if state.is_main_process:
        runner.emit(report, args.json, smoke.summary, exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED)
    state.wait_for_everyone()  # rank 0 has printed before any rank exits (torchrun stops the rest then)
    return exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED


if __name__ == "__main__":  # run by path: say what it is (one line, exit 2), do nothing else
    sys.stderr.write("ddp_launch.py: error: a module, not a command: the multi-process mode of tiny_rlhf_smoke.py: run tiny_rlhf_smoke.py --nproc 2, or it under torchrun\n")
    sys.exit(2)
