"""Start a script on N local processes under torchrun, and tell, inside a process, whether a
launcher started it as one rank of a world. Generic: the smoke (``tiny-rlhf-smoke --nproc``,
policy_optimization/smoke/ranks.py) and the run kit (``palm-rlhf-skill train --nproc``) share it.

For a script that offers ``--nproc N``::

    from run_kit import launch
    world = launch.launcher_world()               # None: no launcher started this process
    if world is None and args.nproc:              # the one-machine shortcut: N ranks of this script
        done = launch.launch_script(Path(__file__), launch.without_nproc(argv), args.nproc, "cpu", run_dir)
        sys.exit(done.returncode or 0)
    if world is not None:                         # one rank: build the process group, train, report on rank 0
        ...

``launch_script`` runs ``python -m torch.distributed.run --nproc_per_node N SCRIPT ARGV`` on a
free port of 127.0.0.1 with ``worker_env`` (``ACCELERATE_USE_CPU=true`` on the CPU), stops torchrun
and its ranks on a timeout, Ctrl-C or SIGTERM, can copy rank 0's progress file to a stream while it
runs, and returns the exit code and the collected output. ``check_resources`` refuses more CPU ranks
than usable cores, or more memory than available, before anything starts. Torch-free at import.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TextIO

from skill_runtime import exits, placement, runner

LAUNCH_TIMEOUT_S = 1800        # a whole launch_script run
STOP_GRACE_S = 60             # after the timeout, time torchrun gets to stop its ranks
DIST_TIMEOUT_S = 600           # default process-group start-up and collective timeout of a rank
MAX_NPROC = 64                 # bound of an --nproc option (a usage error beyond it, before torch)
PROGRESS_ENV = "PALM_RLHF_SKILL_PROGRESS"  # the file rank 0 writes its progress lines to (launch_script)


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

    @property
    def is_main(self) -> bool:
        """Global rank 0: the rank that reports (prints to stdout, writes the shared files)."""
        return self.rank == 0

    def describe(self) -> str:
        """One line for a progress or error message: ``rank 1 of 4 (torchrun, node 0, local rank 1)``."""
        return f"rank {self.rank} of {self.size} ({self.launcher}, node {self.node}, local rank {self.local_rank})"


def _env_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise exits.SkillError(f"{name}={value!r} from the launcher is not an integer") from None


def launcher_world(environ: dict[str, str] | None = None, program: str = "this script") -> World | None:
    """The world this process is one rank of, read from the launcher's variables; None when no
    launcher started it. Torch-free. ``program`` names the process in the errors ("this smoke").

    - torchrun (torch/distributed/run.py; also what ``accelerate launch`` runs for multi-GPU and
      multi-node configs, adding ``ACCELERATE_MIXED_PRECISION`` and other ``ACCELERATE_*``): RANK,
      WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (node rank), MASTER_ADDR, MASTER_PORT,
      TORCHELASTIC_RUN_ID.
    - srun (Slurm, one task per rank): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and,
      in a job step, SLURM_STEP_ID (a batch script's own shell also has SLURM_PROCID and
      SLURM_NTASKS, but no step id). Torch reads none of them: this maps them to RANK, WORLD_SIZE
      and LOCAL_RANK in ``environ``; MASTER_ADDR and MASTER_PORT must be exported by the batch
      script (SkillError, exit 2, when missing). A step of one task is not a world.
    - anything else that sets RANK and WORLD_SIZE (``env``; MASTER_ADDR and MASTER_PORT too).
    LOCAL_RANK, when the launcher left it out (srun, env), is set in ``environ`` to the local rank:
    Accelerate reads it to tell a world from a single process (on the CPU without it only a
    WORLD_SIZE above 1 counts, so a world of one would get no process group at all: issue 22).
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
            f"srun started {program} as task {rank} of {size}, but {unset} MASTER_ADDR (the first node's host "
            "name) and MASTER_PORT (a free port) in the batch script before srun (see distributed.md)"
            if launcher == "srun" else
            f"rank {rank} of {size} ({launcher}): {unset} MASTER_ADDR (rank 0's host name) and MASTER_PORT "
            "(a free port), or start the ranks with torchrun (see distributed.md)")
    if launcher == "srun":  # what torch's env:// rendezvous and Accelerate read
        environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local_rank))
    environ.setdefault("LOCAL_RANK", str(local_rank))  # Accelerate: a rank of a world, also a world of one
    return World(launcher, rank, size, local_rank, str(node), f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}")


def writes_files(program: str = "this run") -> bool:
    """Whether this process writes a run directory and holds its lock: a single process, or global
    rank 0 of a launcher's world (``launcher_world``, asked on a copy of the environment: asking
    sets no LOCAL_RANK in this process)."""
    world = launcher_world(dict(os.environ), program=program)
    return world is None or world.is_main


def ddp_uses_cpu(spec: str, gpus: int, where: str) -> bool:
    """Whether the ranks run on the CPU: ``--device cpu``, ACCELERATE_USE_CPU (Accelerate's own
    switch, which every rank reads), or auto without CUDA; else each rank needs its own GPU (NCCL
    refuses two ranks on one device). ``spec`` is auto, cpu or cuda; ``gpus`` the
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




# starting N ranks of a script on this machine ----------------------------------------------------

def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_resources(nproc: int | None, device: str, rank_mib: int, oversubscribe: bool, size: str,
                    smaller: str) -> dict[str, Any]:
    """Refuse (SkillError, exit 2) ``nproc`` CPU ranks on fewer usable cores, or ranks whose predicted
    memory (``rank_mib`` MiB each) exceeds the available memory (``placement.available_memory_mib``),
    unless ``oversubscribe``; ``nproc`` None is a single process (its memory only). ``size`` names
    the run in the error (``--dim 32 --depth 1``), ``smaller`` the fix (``a smaller --dim/--depth``).
    Returns what was compared: usable_cpus, predicted_mib, available_mib, oversubscribe."""
    cpus, available = placement.usable_cpus(), placement.available_memory_mib()
    predicted = (nproc or 1) * rank_mib
    facts = {"usable_cpus": cpus, "predicted_mib": predicted, "available_mib": available,
             "oversubscribe": oversubscribe}
    if oversubscribe:
        return facts
    if nproc is not None and device == "cpu" and nproc > cpus:
        raise exits.SkillError(f"--nproc {nproc} on {cpus} usable CPU cores: more ranks than cores only slow "
                            f"each other down; use --nproc {cpus} or less, or pass --oversubscribe")
    if predicted > available:
        if nproc is None:
            raise exits.SkillError(f"{size} needs about {predicted} MiB, {available} MiB available: use {smaller}, "
                                "or pass --oversubscribe to start anyway")
        raise exits.SkillError(f"--nproc {nproc} needs about {predicted} MiB ({predicted // nproc} MiB per rank), "
                            f"{available} MiB available: use fewer processes or {smaller}, or pass --oversubscribe")
    return facts


def worker_env(device: str) -> dict[str, str]:
    """Environment for the ranks: this process's, plus ``ACCELERATE_USE_CPU=true`` when ``device``
    is cpu (else Accelerate would put each rank on DistributedType.NO), one OpenMP thread unless set,
    and gloo on the loopback interface (Linux)."""
    env = dict(os.environ)
    if device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
    env.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux") and Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo pairs on loopback, like the rendezvous
    return env


def run_launcher(cmd: list[str], cwd: Path, env: dict[str, str],
                 timeout_s: float = LAUNCH_TIMEOUT_S) -> tuple[int | None, str, str]:
    """Run torchrun; past ``timeout_s`` seconds, or when this process is interrupted or terminated
    (KeyboardInterrupt, runner.Terminated: re-raised after), stop it and its ranks first:
    ``runner.stop_child``'s SIGTERM makes torchrun stop its ranks (each runs in a session of its own,
    so only torchrun can reach them), SIGKILL after STOP_GRACE_S.

    Returns (exit code, or None on timeout; stdout; stderr)."""
    proc = None
    try:
        with runner.starting_child():  # a signal during the start waits until proc is held
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = runner.stop_child(proc, STOP_GRACE_S)
        return None, out, err + f"\nstopped after {timeout_s:g} s"
    except BaseException:  # SIGINT / SIGTERM to this process alone: never orphan torchrun's ranks
        if proc is not None:
            runner.stop_child(proc, STOP_GRACE_S)
        raise


def without_nproc(argv: list[str]) -> list[str]:
    """A script's arguments minus ``--nproc N`` (also ``--nproc=N`` and the prefixes argparse
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


def workers_errors(output: str) -> str:
    """What the ranks said before torchrun's failure log (``E<date> ... torch/distributed/elastic``):
    their error lines (a Python exception, a C++ ``what():``, a one-line helper error), first ones
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




def rank_progress_stream(world: World) -> TextIO | None:
    """On global rank 0 of a ``launch_script`` run, the progress file its launcher follows (opened
    for appending; the caller closes it); None on another rank or under another launcher."""
    path = os.environ.get(PROGRESS_ENV)
    return open(path, "a", encoding="utf-8") if path and world.is_main else None


def torchrun_command(script: Path, argv: list[str], nproc: int, port: int) -> list[str]:
    """``python -m torch.distributed.run`` for ``nproc`` ranks of ``script argv`` on one node, its
    rendezvous at 127.0.0.1:``port``, no restarts (a failed rank fails the run)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port), "--max_restarts", "0",
            str(Path(script).resolve()), *argv]


@dataclass(frozen=True)
class Launched:
    """What ``launch_script`` saw."""
    returncode: int | None  # torchrun's exit code (nonzero when a rank failed); None: stopped at the timeout
    stdout: str             # the ranks' stdout (a script that prints on rank 0 only: rank 0's)
    stderr: str             # the ranks' stderr and torchrun's own log
    master: str             # the rendezvous, 127.0.0.1:PORT
    command: list[str]

    @property
    def output_tail(self) -> str:
        """The last 2,000 characters of stdout and stderr: what a failure report keeps."""
        return (self.stdout + self.stderr)[-2000:]


def launch_script(script: Path, argv: list[str], nproc: int, device: str, cwd: Path,
                  progress: TextIO | None = None, timeout_s: float = LAUNCH_TIMEOUT_S) -> Launched:
    """Run ``script argv`` as ``nproc`` ranks on this machine (``torchrun_command`` on a
    ``free_port``) and wait for them: ``device`` cpu or cuda (``ddp_uses_cpu``; the CPU sets
    ``ACCELERATE_USE_CPU``: ``worker_env``); ``cwd`` is torchrun's working directory and the ranks'
    TMPDIR (torchelastic's logs go there, and go with it). With ``progress``, the file rank 0 writes
    (``rank_progress_stream``) is copied to that stream every 0.2 s while the ranks run.

    Stops torchrun and its ranks after ``timeout_s`` seconds (returncode None), and on Ctrl-C or
    SIGTERM to this process (re-raised once they are stopped): ``run_launcher``. ``argv`` is passed
    as given: drop ``--nproc`` first (``without_nproc``). Never raises for a failing rank: read
    ``returncode`` and the output."""
    port = free_port()
    cmd = torchrun_command(script, argv, nproc, port)
    env = worker_env(device)
    env["TMPDIR"] = str(cwd)
    stop, follower = threading.Event(), None
    if progress is not None:
        env[PROGRESS_ENV] = str(Path(cwd) / "rank0-progress.txt")
        follower = threading.Thread(target=follow, args=(Path(env[PROGRESS_ENV]), progress, stop), daemon=True)
        follower.start()
    try:
        returncode, out, err = run_launcher(cmd, Path(cwd), env, timeout_s)
    finally:
        stop.set()
        if follower:
            follower.join()
    return Launched(returncode, out, err, f"127.0.0.1:{port}", cmd)
