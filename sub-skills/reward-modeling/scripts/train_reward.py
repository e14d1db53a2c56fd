#!/usr/bin/env python3
"""Train a palm-rlhf-pytorch RewardModel on preference pairs (Bradley-Terry) or ratings, with its
own PaLM sizes, on the run kit: a metrics row per round, checkpoints, exact resume, DIR/rm.pt and
DIR/rm_config.json for ``palm-rlhf-skill train``'s ``[reward] checkpoint``, and a token-coverage probe.

Usage:
    train_reward.py --config rm.toml --run-dir runs/rm       # train; report on stdout, verdict last
    train_reward.py --resume runs/rm                         # continue from the last checkpoint
    train_reward.py --config rm.toml --run-dir runs/rm --nproc 2 --log-with tensorboard

Progress on stderr, the summary on stdout (``--json``: one object). Files in the run directory:
metrics.jsonl, checkpoints/, run_config.json, rm.pt, rm_config.json, summary.json, and train.lock
while a process trains it. Resuming a run directory runs the tokenizer its config names: resume only
runs you trust. Config keys and the worked example:
sub-skills/reward-modeling/references/preferences.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, runner, streams, version_gate  # noqa: E402
from run_kit import command, rundir  # noqa: E402

COMMAND = command.RunCommand(
    prog="palm-rlhf-skill train-reward",
    description="Train a RewardModel of palm-rlhf-pytorch on preference pairs (JSONL prompt/chosen/rejected, "
                "Bradley-Terry) or ratings (the library's labels), with its own [palm] sizes, LoRA or all "
                "weights: one metrics row per round in DIR/metrics.jsonl (loss, pairwise accuracy on training "
                "and held-out rows, margin), atomic checkpoints, exact --resume, DIR/rm.pt and DIR/rm_config.json "
                "for train's [reward] checkpoint, and the ids the data never contains with how the model scores them.",
    examples=("palm-rlhf-skill train-reward --config sub-skills/reward-modeling/assets/preferences/rm.toml "
              "--run-dir runs/rm",
              "palm-rlhf-skill train-reward --resume runs/rm",
              "palm-rlhf-skill train-reward --config rm.toml --run-dir runs/rm --until 2",
              "palm-rlhf-skill watch runs/rm"),
    runs="[data] tokenizer",
    exit_codes="exit codes: 0 the run finished (or paused at --until); 1 the loss became NaN or inf; 2 usage, "
               "config, data or run-directory error (disk full, or another train running in DIR); 3 "
               "palm-rlhf-pytorch, torch or a --log-with tracker missing or outside the supported range; 130/143 "
               "SIGINT/SIGTERM (after the round in progress and a checkpoint)",
    config_help="the reward model's TOML (or .json) config: [palm], [reward_model], [data], [train], [run] "
                "(reward-modeling/references/preferences.md); - reads it from standard input")


build_parser = COMMAND.parser  # the parser, built from the table above


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = COMMAND.parse(argv)
    from config_kit import reading
    from reward_modeling import reward_report, reward_run
    world = command.launched_world(args.nproc)
    env = version_gate.check_versions(args.allow_untested)
    keep, flags = command.kept_options(args)
    if args.nproc:
        summary = command.run_ranks(Path(__file__), argv, args.nproc, args.device,
                                    args.resume or args.run_dir, "--resume" if args.resume else "--run-dir",
                                    streams.Progress(reward_run.PROG, not args.json or args.progress))
        summary["verdict"], summary["next"] = reward_report.verdict(summary, flags)
        summary["versions"], summary["warnings"] = env["versions"], env["warnings"]
        return runner.emit(summary, args.json, reward_report.plain, command.status_code(summary))
    progress, rank_stream = command.rank_progress(world, args.json, args.progress, reward_run.PROG)
    run_options = reward_run.Options(log_with=args.log_with, until=args.until, progress=progress.enabled,
                                     say=command.say_for(progress, rank_stream, reward_run.PROG), env=env,
                                     allow_inexact=args.allow_inexact_resume, keep=keep, resume_flags=flags)
    caller = Path.cwd()
    config = None if not args.config else args.config if reading.from_stdin(args.config) else \
        str((caller / args.config).resolve())
    run_dir = (caller / (args.resume or args.run_dir)).resolve()
    with command.threads(args.cpu_threads):
        prepared = reward_run.prepare(config, run_dir, bool(args.resume), args.force, args.set, run_options)
        finished = None
        if prepared.resume:
            try:
                finished = reward_report.read(prepared.claim.run, prepared.loaded.get("run_id"))
            except exits.SkillError as err:  # rewritten as this resume ends
                run_options.say(f"ignored: {err}")
        run_dir_rm = prepared.claim.run.path / rundir.RM
        if finished and finished["status"] == "finished" and run_dir_rm.is_file() and not run_dir_rm.is_symlink() \
                and finished.get("epochs_done", 0) >= prepared.resolved["train"]["epochs"]:  # nothing to train
            prepared.claim.release()
            progress.note(f"{run_dir} finished all {finished['rounds_done']} rounds: nothing to resume")
            rundir.keep_rebased(prepared.claim.run, finished)  # a copied or moved run: its own paths
            finished["versions"], finished["warnings"] = env["versions"], env["warnings"]
            return runner.emit(finished, args.json, reward_report.plain, exits.EXIT_OK)
        prepared.place(args.device)
        with progress.stage("build the reward model" + (" and restore the last checkpoint" if args.resume else "")):
            run = reward_run.RewardRun.build(prepared, args.device)
        status, reason = run.rounds(progress)
        summary = run.finish(status, reason)
    if not run.main:
        return command.status_code(summary)
    return runner.emit(summary, args.json, reward_report.plain, command.status_code(summary))


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
