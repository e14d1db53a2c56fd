"""What every run command shares around its rounds (``palm-rlhf-skill train`` and ``train-reward``):
one-line notes on stderr, SIGINT and SIGTERM deferred to the end of the round in progress, the
progress line per round, the exit code of a run's summary, and ``--nproc N`` as N ranks of the
command under torchrun with rank 0's summary as the report. Torch-free at import.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from skill_runtime import exits, options, reporting, runner, streams, workspace


@dataclass
class RunOptions:
    """How a run command runs, beside its config (each kind of run extends it: the policy run's
    ``loop.Options``, the reward model's ``reward_run.Options``): ``log_with`` a tracker name or
    None; ``until`` the last round this call runs (None: all; a later ``--resume`` continues);
    ``progress`` bars and lines on stderr; ``say`` where one-line notes go (``stderr_lines``; each
    kind names its own command); ``env`` what ``version_gate.check_versions`` returned to the
    command (its ``versions`` and ``warnings`` go into summary.json; None: neither key);
    ``allow_inexact`` resume from a checkpoint whose random states cannot be restored
    (``--allow-inexact-resume``); ``keep`` the command-line options a ``--resume`` starts with again
    (``{"cpu_threads": "1"}``, stored in run_config.json) and ``resume_flags`` the same as flags for
    the next step's command."""
    log_with: str | None = None
    until: int | None = None
    progress: bool = True
    say: Callable[[str], None] = field(default_factory=lambda: stderr_lines("palm-rlhf-skill", sys.stderr))
    env: dict[str, Any] | None = None
    allow_inexact: bool = False
    keep: dict[str, Any] = field(default_factory=dict)
    resume_flags: str = ""


@dataclass(frozen=True)
class RunCommand:
    """One run command's parser as a table (``parser``): its ``prog``, ``description``, the
    epilog's ``examples`` (one command line each), ``runs`` (the code of the run directory's config
    that ``--resume`` runs: the epilog's trust note), ``exit_codes`` (the epilog's last paragraph),
    ``config_help`` (``--config``'s help), ``cpu_threads`` (the argparse keywords of its own
    --cpu-threads, else a count) and ``options`` (its own options: flag and argparse keywords)."""
    prog: str
    description: str
    examples: tuple[str, ...]
    runs: str
    exit_codes: str
    config_help: str
    cpu_threads: dict[str, Any] | None = None
    options: tuple[tuple[str, dict[str, Any]], ...] = ()

    def parser(self) -> options.OneLineParser:
        """The command's parser: the run options every run command has (``add_run_options``), then its own."""
        parser = options.OneLineParser(
            prog=self.prog, description=self.description,
            epilog="examples:\n" + "".join(f"  {line}\n" for line in self.examples)
                   + f"\n--resume runs the code the run directory's config names ({self.runs}): resume only a run "
                     "directory you trust.\n\n" + self.exit_codes)
        add_run_options(parser, self.config_help, self.cpu_threads)
        for flag, keywords in self.options:
            parser.add_argument(flag, **keywords)
        return parser

    def parse(self, argv: list[str]):
        """``argv`` parsed by ``parser``, a ``--resume``'s kept options taken from its run
        (``resumed_options``) and the run commands' usage checked (``check_run_arguments``):
        the namespace a run command's main starts from. Raises SkillError (exit 2) on a usage error."""
        parser = self.parser()
        args = resumed_options(parser, parser.parse_args(argv), argv)
        check_run_arguments(args)
        return args


def add_run_options(parser, config_help: str, cpu_threads: dict[str, Any] | None = None) -> None:
    """The options of a run command (``train``, ``train-reward``): --config (``config_help``),
    --run-dir, --resume, --allow-inexact-resume, --force, --set, --until, --log-with, --device, --cpu-threads, --nproc,
    --json, --progress, --allow-untested; ``cpu_threads``: the argparse keywords of a command's own
    --cpu-threads (``train``'s takes auto), else a count. Torch-free."""
    from run_kit import launch, trackers
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.add_argument("--run-dir", metavar="DIR", help="where the run writes its files (created if missing)")
    parser.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint, "
                        "exactly (--config, when given, must be the run's own); runs the programs DIR's config names")
    parser.add_argument("--allow-inexact-resume", action="store_true",
                        help="resume from a checkpoint whose random states are damaged, missing or another run's "
                             "(refused without it): the rounds from there differ from an uninterrupted run")
    parser.add_argument("--force", action="store_true", help="--run-dir holds another run: remove its run files "
                        "(metrics.jsonl, checkpoints/, ...) and start over")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one config value (as plan's --set); repeatable")
    parser.add_argument("--until", type=options.bounded_int(1), metavar="ROUND",
                        help="stop after this round with a checkpoint (exit 0); --resume continues")
    parser.add_argument("--log-with", choices=list(trackers.TRACKERS),
                        help="also send every row through Accelerate's tracker API, offline, into DIR/trackers/")
    parser.add_argument("--device", default="auto", type=options.device_spec,
                        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--cpu-threads", **(cpu_threads or {
        "type": options.bounded_int(1), "metavar": "N",
        "help": "torch intra-op threads (default: torch's default; --resume: the run's own)"}))
    parser.add_argument("--nproc", type=options.bounded_int(1, launch.MAX_NPROC), metavar="N",
                        help="train on N local processes (torchrun, DDP; the CPU or one GPU each): every rank "
                             "runs the rounds, rank 0 writes the files (training-run.md#several-processes)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    options.add_progress_option(parser)
    options.add_allow_untested_option(parser)


def check_run_arguments(args) -> None:
    """A run command's usage errors (SkillError, exit 2), before torch is imported: a new run needs
    --config and --run-dir, a resume its directory alone (or the same as --run-dir), without
    --force (its --set may extend the run: ``rundir.check_resume_overrides``); --nproc reads the config from a file, not standard input."""
    from config_kit import reading  # torch-free
    if args.resume and args.run_dir and Path(args.resume).resolve() != Path(args.run_dir).resolve():
        raise exits.SkillError("--resume DIR is the run directory: give it alone, or the same path as --run-dir")
    if not args.resume and not (args.config and args.run_dir):
        raise exits.SkillError("give --config FILE and --run-dir DIR (a new run), or --resume DIR")
    if args.resume and args.force:
        raise exits.SkillError("--force starts over and --resume continues: choose one")
    if args.allow_inexact_resume and not args.resume:
        raise exits.SkillError("--allow-inexact-resume applies to --resume DIR")
    if args.nproc and args.config and reading.from_stdin(args.config):
        raise exits.SkillError(f"--config {args.config} (standard input) is read by one process: with --nproc, "
                               "pass the config's file")


KEPT = ("cpu_threads",)  # options a --resume starts with again when not given (run_config.json "options")


def resumed_options(parser, args, argv: list[str]):
    """``args`` of a ``--resume`` with the options of KEPT that the command line leaves out taken
    from the run's run_config.json (as the run was started with them), parsed again by ``parser``
    (each value checked as typed then); ``args`` unchanged for a new run."""
    from run_kit import rundir
    if not args.resume:
        return args
    try:
        found = rundir.RunDir((Path.cwd() / args.resume).resolve()).read_config()
    except exits.SkillError:
        return args  # the run's prepare names the damage
    stored = (found or ({}, None))[0].get("options", {})
    extra = [item for key in KEPT if getattr(args, key) is None and stored.get(key) is not None
             for item in (f"--{key.replace('_', '-')}", str(stored[key]))]
    return parser.parse_args([*argv, *extra]) if extra else args


def kept_options(args) -> tuple[dict[str, str], str]:
    """The options of KEPT this command was given, for run_config.json (``{"cpu_threads": "1"}``),
    and the same as flags for the resume command a report suggests (`` --cpu-threads 1``)."""
    keep = {key: str(getattr(args, key)) for key in KEPT if getattr(args, key) is not None}
    return keep, "".join(f" --{key.replace('_', '-')} {value}" for key, value in keep.items())


def launched_world(nproc: int | None):
    """The launcher's world this process is one rank of (``launch.launcher_world``), or None.
    Raises SkillError(2) for ``--nproc`` under a launcher: both would start the processes."""
    from run_kit import launch
    world = launch.launcher_world(program="this run")
    if nproc and world is not None:
        raise exits.SkillError(f"--nproc starts the processes itself, but a launcher already started this one as "
                               f"{world.describe()}: drop --nproc or the launcher")
    return world


def threads(count: int | None):
    """``--cpu-threads``: ``placement.torch_threads(count)``, or torch's count left as it is
    (a context manager yielding the count in effect). Imports torch."""
    import contextlib
    import torch
    from skill_runtime import placement
    return placement.torch_threads(count) if count else contextlib.nullcontext(torch.get_num_threads())


def stderr_lines(prog: str, stream) -> Callable[[str], None]:
    """``say``: one line ``prog: ...`` on ``stream``, bound now, so a line said while the
    library's output is captured (a signal during a round) still reaches the terminal; best effort
    (``streams.BestEffortStream``); escaped (``reporting.terminal_text``: a line may name a file of
    the run directory)."""
    bound = streams.BestEffortStream(stream)

    def say(line: str) -> None:
        bound.write(f"{prog}: {reporting.terminal_text(line)}\n")
        bound.flush()
    return say


class deferred_signals:
    """SIGINT and SIGTERM while the rounds run: the first one finishes the round in progress
    (``requested`` holds its number; one line through ``say`` says so), a second one stops at once
    (130 or 143; the last checkpoint stays valid). Restores the previous handlers on exit. Main
    thread only (elsewhere it changes nothing)."""

    def __init__(self, say: Callable[[str], None], unit: str = "round") -> None:
        self.say, self.unit, self.requested, self.previous = say, unit, None, {}

    def handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt() if signum == signal.SIGINT else runner.Terminated()
        self.requested = signum
        self.say(f"{signal.Signals(signum).name}: finishing the {self.unit} in progress, then a checkpoint "
                 "(send it again to stop now; the last checkpoint stays valid)")

    def __enter__(self) -> "deferred_signals":
        import threading
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def report_round(progress: streams.Progress, bar, round_: int, text: str, wall_s: float, last: int,
                 started_s: float, start: int) -> None:
    """Round ``round_`` of ``last`` on stderr: at a terminal the bar's counter and ``text`` as its
    postfix, elsewhere one line with the round's seconds and the time left (``started_s``:
    ``time.perf_counter()`` when round ``start`` + 1 began)."""
    done = round_ - start
    eta = (time.perf_counter() - started_s) / done * (last - round_) if done else 0.0
    if bar is not None:
        bar.set_postfix_str(text)
        bar.update(1)
    if not progress.live:
        progress.note(f"round {round_}/{last}: {text}, {wall_s:.1f} s"
                      + (f", about {reporting.seconds_text(eta)} left" if round_ < last else ""))


def status_code(summary: dict) -> int:
    """The exit code of a summary's status (training-run.md#exit-codes)."""
    if summary["status"] == "interrupted":
        return exits.EXIT_TERMINATED if "SIGTERM" in (summary.get("reason") or "") else exits.EXIT_INTERRUPTED
    return {"finished": exits.EXIT_OK, "paused": exits.EXIT_OK, "stopped": exits.EXIT_CHECK_FAILED,
            "failed": exits.EXIT_CHECK_FAILED}[summary["status"]]


def run_ranks(script: Path, argv: list[str], nproc: int, device_spec: str, run_dir: str, flag: str,
              progress: streams.Progress) -> dict[str, Any]:
    """``--nproc N``: ``script`` (a run command) as N ranks on this machine (``launch.launch_script``,
    torchrun), each with ``--json``; returns rank 0's summary with ``processes`` added. A run
    directory that another process holds is refused here first (``lock.RunLock.probe``; rank 0
    locks it). Ctrl-C or SIGTERM here reaches the ranks as SIGTERM (each finishes its round and
    checkpoints; the launcher waits ``launch.STOP_GRACE_S``). Raises SkillError(1) when no rank
    reported, SkillError(2) for a held directory or too few GPUs. The ranks run in a private
    directory: relative paths of ``argv`` reach them made absolute (``absolute_paths``)."""
    from run_kit import launch, lock, rundir
    lock.RunLock.probe(rundir.RunDir((Path.cwd() / run_dir).resolve()), f"{flag} {run_dir}")
    device = "cpu" if launch.ddp_uses_cpu(device_spec, nproc, f"--nproc {nproc}") else "cuda"
    rank_argv = [*launch.without_nproc(absolute_paths(argv)), "--json"] + (["--progress"] if progress.enabled else [])
    with workspace.private_workdir() as cwd:
        progress.note(f"starting {nproc} processes with torchrun; each imports torch and builds the run")
        done = launch.launch_script(script, rank_argv, nproc, device, cwd,
                                    progress.stream if progress.enabled else None, timeout_s=None)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        summary = json.loads(done.stdout[done.stdout.index("{"):]) if lines else None
    except ValueError:
        summary = None
    if not isinstance(summary, dict) or "status" not in summary:
        raise exits.SkillError(f"the {nproc} processes ended without a summary (torchrun exit "
                               f"{done.returncode}): {launch.workers_errors(done.stdout + done.stderr)}",
                               exits.EXIT_CHECK_FAILED)
    summary["processes"] = nproc
    return summary


PATH_OPTIONS = ("--config", "--run-dir", "--resume")


def absolute_paths(argv: list[str], names: tuple[str, ...] = PATH_OPTIONS) -> list[str]:
    """``argv`` with the value of each option of ``names`` (spelt in full, as ``--name=value`` or
    by a prefix argparse accepted) made absolute against the current directory; ``-`` (standard
    input) kept."""
    out, pending = [], False
    for token in argv:
        name, eq, value = token.partition("=")
        is_path = name.startswith("--") and len(name) > 2 and sum(n.startswith(name) for n in names) == 1
        if pending:
            out.append(token if token == "-" else str(Path(token).resolve()))
        elif is_path and eq:
            out.append(f"{name}={value if value == '-' else Path(value).resolve()}")
        else:
            out.append(token)
        pending = is_path and not eq and not pending
    return out


def rank_progress(world, json_output: bool, progress_flag: bool, prog: str) -> tuple[streams.Progress, Any]:
    """The progress of one process of a run command: on rank 0 of ``run_ranks``'s world its
    progress file (``launch.rank_progress_stream``), elsewhere stderr; on other ranks none.
    Returns (the Progress, the rank's stream or None)."""
    from run_kit import launch
    rank_stream = launch.rank_progress_stream(world) if world is not None else None
    progress = streams.Progress(prog, (not json_output or progress_flag) and (world is None or world.is_main),
                                rank_stream)
    return progress, rank_stream


def say_for(progress: streams.Progress, rank_stream, prog: str) -> Callable[[str], None]:
    """The ``say`` of a run: to the rank's progress file when it has one, else stderr."""
    return stderr_lines(prog, progress.stream if rank_stream else sys.stderr)
