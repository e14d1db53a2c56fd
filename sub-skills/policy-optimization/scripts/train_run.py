#!/usr/bin/env python3
"""Train a PaLM policy on your own prompts and reward: the config ``plan`` reads, run in rounds of
the library's own ``train()``, with a metrics row per round, a live watchdog, exact resume and an
exported policy.

Usage:
    train_run.py --config run.toml --run-dir runs/first       # train; report on stdout, verdict last
    train_run.py --resume runs/first                          # continue from the last checkpoint
    train_run.py --config run.toml --run-dir runs/first --log-with tensorboard --stop-on all
    train_run.py --config run.toml --run-dir runs/first --nproc 2   # 2 DDP processes (torchrun)

Progress on stderr (a bar over rounds with an ETA), the summary on stdout (``--json``: one object).
Files in the run directory: metrics.jsonl, checkpoints/, run_config.json, policy.pt, summary.json, and
train.lock while a process trains it (a second train there exits 2); what each holds, and what a
missing, damaged or foreign one does: references/run-directory.md. Resuming a run directory runs
the programs its config names (the reward program, the tokenizer): resume only runs you trust.
Config keys: references/workflows.md#plan-a-run; the run kit: references/training-run.md.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, reporting, runner, streams, version_gate, workspace  # noqa: E402
from run_kit import command, rundir  # noqa: E402
from policy_optimization.run import watchdog  # noqa: E402  (torch-free: the rule ids of --stop-on)


def cpu_threads(text: str) -> str | int:
    """``--cpu-threads``: ``auto`` or a count of at least 1 (``threads.parse``)."""
    import argparse
    from policy_optimization.run import threads  # torch-free
    try:
        return threads.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a whole number of at least 1, got {text!r}") from None


COMMAND = command.RunCommand(
    prog="palm-rlhf-skill train",
    description="Train a PaLM policy with palm-rlhf-pytorch on your prompts and reward: the config of "
                "`palm-rlhf-skill plan`, in rounds of the trainer's own train() (one learn() each), with "
                "one metrics row per round in DIR/metrics.jsonl, a watchdog that names silent failures "
                "while the run goes on, atomic checkpoints, exact --resume and DIR/policy.pt at the end.",
    examples=("palm-rlhf-skill train --config run.toml --run-dir runs/first",
              "palm-rlhf-skill train --resume runs/first",
              "palm-rlhf-skill train --config run.toml --run-dir runs/first --force --stop-on all",
              "palm-rlhf-skill train --config run.toml --run-dir runs/first --log-with tensorboard",
              "palm-rlhf-skill watch runs/first"),
    runs="its reward program and tokenizer, as Python files",
    exit_codes="exit codes: 0 the run finished (or paused at --until); 1 a --stop-on rule fired or the library "
               "raised in a round; 2 usage, config, reward program or run-directory error (disk full, or another "
               "train running in DIR); "
               "3 palm-rlhf-pytorch, torch or a --log-with tracker missing or outside the supported range; "
               "130/143 SIGINT/SIGTERM (after the round in progress and a checkpoint)",
    config_help="the run's TOML (or .json) config, plan's schema with [run] rounds "
                "(references/workflows.md#plan-a-run); - reads it from standard input",
    cpu_threads={"type": cpu_threads, "metavar": "auto|N",
                 "help": "torch intra-op threads; auto times round 1 at 1 thread and at torch's default and keeps the "
                         "faster (CPU, one process) (default: auto; --resume: the run's own)"},
    options=(("--stop-on", {"metavar": "RULE,...|all",
                            "help": "end the run (checkpoint, exit 1) when one of these watchdog rules fires: "
                                    + ", ".join(watchdog.RULE_IDS)}),))


build_parser = COMMAND.parser  # the parser, built from the table above


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = COMMAND.parse(argv)
    from config_kit import reading
    from policy_optimization.run import loop, threads
    from run_kit import alarms
    world = command.launched_world(args.nproc)  # one rank of torchrun / accelerate launch / srun?
    stop_on = frozenset()
    if args.stop_on:
        try:
            stop_on = alarms.parse_stop_on(args.stop_on, watchdog.RULE_IDS)
        except ValueError as err:
            raise exits.SkillError(f"--stop-on: {err}") from None
    env = version_gate.check_versions(args.allow_untested)
    keep, flags = command.kept_options(args)
    if args.nproc:
        return run_nproc(args, argv, env, flags)
    progress, rank_stream = command.rank_progress(world, args.json, args.progress, loop.PROG)
    run_options = loop.Options(log_with=args.log_with, stop_on=stop_on, until=args.until, progress=progress.enabled,
                               say=command.say_for(progress, rank_stream, loop.PROG), env=env,
                               allow_inexact=args.allow_inexact_resume, keep=keep, resume_flags=flags,
                               cpu_threads=args.cpu_threads or threads.AUTO)
    caller = Path.cwd()
    config = None if not args.config else args.config if reading.from_stdin(args.config) else \
        str((caller / args.config).resolve())  # standard input is read once, by loop.prepare
    run_dir = (caller / (args.resume or args.run_dir)).resolve()
    given = isinstance(args.cpu_threads, int)  # auto: the run chooses (loop.Run.rounds, threads.py)
    threads = command.threads(args.cpu_threads if given else None)
    prepared = loop.prepare(config, run_dir, bool(args.resume), args.force, args.set, run_options)
    finished = None
    if prepared.resume:
        from policy_optimization.run import summary as run_summary
        try:
            finished = run_summary.read(prepared.run, prepared.loaded.get("run_id"))
        except exits.SkillError as err:  # rewritten as this resume ends
            run_options.say(f"ignored: {err}")
    if finished and finished.get("status") == "finished" and os.path.lexists(prepared.run.policy) and \
            finished["rounds_done"] >= prepared.resolved["round"]["rounds"]:
        # every round is done (a config with more [run] rounds extends the run instead): nothing to
        # build, the run's summary again (without its policy.pt: built, to write it again)
        prepared.release()
        progress.note(f"{run_dir} finished all {finished['rounds_done']} rounds: nothing to resume")
        rundir.keep_rebased(prepared.run, finished)  # a copied or moved run: its own paths
        finished["versions"], finished["warnings"] = env["versions"], env["warnings"]
        return runner.emit(finished, args.json, plain_summary, exits.EXIT_OK)
    prepared.place(args.device)  # a device it cannot have: one line, before the build's progress line
    with workspace.private_workdir(), threads:  # the library's relative paths (TPO's replay buffer) go there
        with progress.stage("build the trainer" + (" and restore the last checkpoint" if args.resume else "")):
            run = loop.Run.build(prepared, args.device)
        try:
            status, reason = run.rounds(progress)
        except exits.SkillError as err:  # a round failed: the summary says so, the last checkpoint stays
            run.finish("failed", str(err))
            raise
        summary = run.finish(status, reason)  # with the versions and warnings (run_options.env)
    code = command.status_code(summary)
    if not run.main:  # one rank of several: rank 0 reports
        return code
    return runner.emit(summary, args.json, plain_summary, code)


def run_nproc(args, argv: list[str], env: dict, flags: str = "") -> int:
    """``--nproc N``: this command as N ranks on this machine (``command.run_ranks``); rank 0's
    summary is this run's report and exit code, its next step as this process was started."""
    from policy_optimization.run import loop
    from policy_optimization.run import summary as run_summary
    summary = command.run_ranks(Path(__file__), argv, args.nproc, args.device, args.resume or args.run_dir,
                                "--resume" if args.resume else "--run-dir",
                                streams.Progress(loop.PROG, not args.json or args.progress))
    summary["verdict"], summary["next"] = run_summary.verdict(summary, flags)
    summary["versions"], summary["warnings"] = env["versions"], env["warnings"]
    return runner.emit(summary, args.json, plain_summary, command.status_code(summary))


def plain_summary(summary: dict) -> str:
    """The plain report: rounds, held-out before -> after, rules fired, files, the verdict and the next step last."""
    held = summary["held_out"]
    lines = [f"train: {summary['trainer']} ({summary['class_name']}) on {summary['device']}: {summary['rounds_done']} of "
             f"{summary['rounds_planned']} rounds, {summary['rollouts']} rollouts, {summary['learn_calls']} learn() calls, "
             f"{reporting.seconds_text(summary['wall_s'])}"]
    if held["before"] is not None:
        after = "-" if held["after"] is None else f"{held['after']:.4g}"
        lines.append(f"held-out reward: {held['before']:.4g} -> {after} (rounds {', '.join(map(str, held['rounds']))})")
    for rule, rounds in summary["rules_fired"].items():
        lines.append(f"rule {rule}: fired in rounds {', '.join(map(str, rounds))}")
    lines += [f"{key}: {path}" for key, path in summary["files"].items() if path]
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]
    lines.append(f"{summary['verdict']}; next: {summary['next']}")
    return "\n".join(reporting.terminal_text(line) for line in lines)  # a stored summary's strings escaped


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
