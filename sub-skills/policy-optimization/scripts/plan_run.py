#!/usr/bin/env python3
"""Plan a palm-rlhf-pytorch training run before starting it: counts, memory, time, dead settings.

Reads the run config (TOML or JSON with the tables [palm], [reward_model], [reward], [trainer],
[prompts], [train], [eval], [run]: policy_optimization.run_config, the parser ``palm-rlhf-skill
train`` shares) and checks every key against the installed constructors' signatures. Then:

1. build the trainer on torch's meta device: exact parameter counts and weight bytes at any size;
2. build it for real on the device (skipped when the weights alone do not fit), then probe it,
   bounded by --probe-seconds: three tiny rollouts reveal what the installed trainer stores per
   experience; sampling steps are timed at four lengths, round-robin; then either a few real rollouts and
   learn() on a reduced number of experiences (measured), or, when one rollout would not fit the
   budget, the last step of a rollout and learn() on its experience (extrapolated);
3. predict the full run: rollouts, learn() calls, optimizer steps, dropped leftovers, the memory
   held before each learn() and the peak against what the device has, and the wall time. The
   report marks each figure computed (exact arithmetic), measured (in the probe) or derived
   (extrapolated from measurements), lists every default the config did not set, warns about
   settings that learn nothing or are ignored, and ends with a one-line verdict.

The steps live in the policy_optimization package: run_config (parse and check), builder (build
the run), and the plan's room, plan/: counting, probe, unit_costs, prediction, budget, advice,
planner (plan and --execute), report, accuracy.

Usage:
    plan_run.py --config run.toml                        # report on stdout, verdict last
    plan_run.py --config run.toml --json                 # one JSON object on stdout
    plan_run.py --config run.toml --set train.update_timesteps=64 --probe-seconds 20
    plan_run.py --config run.toml --execute --json       # run it for real (what bench --plan-accuracy times)

Runs inside a private temporary directory and leaves nothing in the caller's directory.
The configuration keys, JSON schema and exit codes are in references/workflows.md#plan-a-run.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
import cached_sampler  # noqa: E402  (torch-free at import)
from skill_runtime import exits, options, placement, runner, streams, version_gate, workspace  # noqa: E402
from policy_optimization import measuring, run_config  # noqa: E402
from policy_optimization.plan import budget, planner, prediction  # noqa: E402
from policy_optimization.plan import report as plan_report  # noqa: E402  (the name report is main's dict)

UPSTREAM_EXAMPLE = run_config.PLANS / "upstream-readme.toml"
PROBE_SECONDS = 60.0  # --probe-seconds default
PLAN_ONLY = ("probe_seconds", "max_days", "budget", "memory_budget", "one_round")  # refused with --execute


def duration(text: str) -> float:
    """argparse ``type=`` for --budget: 90s, 10m, 2h, 3d (``budget.parse_duration``)."""
    try:
        return budget.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size(text: str) -> int:
    """argparse ``type=`` for --memory-budget: 8GiB, 512MiB, 16GB (``budget.parse_size``)."""
    try:
        return budget.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    """argparse ``type=`` for --max-days: a finite number above 0."""
    value = options.finite_nonnegative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Plan a palm-rlhf-pytorch run before starting it: parameter and rollout counts, "
                    "learn() calls and dropped leftovers, memory held before each learn() and the "
                    "predicted peak against the device, wall time from a bounded probe at the real "
                    "size, warnings with their fix, and a one-line verdict.",
        epilog="config (TOML or JSON; [palm], [trainer] and [prompts] required; paths relative to the config file):\n"
               "  [palm]          PaLM keyword arguments (num_tokens, dim, depth, ...); checkpoint = \"palm.pt\"\n"
               "                  (optional pretrained weights, a PaLM state dict)\n"
               "  [reward_model]  RewardModel keyword arguments (it deep-copies the PaLM)\n"
               "  [reward]        at most one of: program = \"file.py:function\" (x, response_mask) -> (b,);\n"
               "                  text_program = \"file.py:function\" (prompt, response) -> float;\n"
               "                  checkpoint = \"rm.pt\" (a trained RewardModel of [reward_model]); none: untrained\n"
               "  [trainer]       name = \"ppo\" | \"grpo\" | \"tpo\" | \"flowrl\", plus that trainer's arguments\n"
               "  [prompts]       count and length (random ids), or file = \"prompts.txt\" (one prompt a line,\n"
               "                  UTF-8) with tokenizer = \"file.py:callable\" (default: the byte tokenizer)\n"
               "  [train]         train() keyword arguments; library defaults where absent\n"
               "  [run]           rounds (each one train(num_episodes=1, ...) call), checkpoint_every, seed,\n"
               "                  sampler = \"library\" | \"cached\" (scripts/cached_sampler.py)\n"
               "  [eval]          prompts_file, every (rounds, default 1), samples (per prompt, default 1)\n"
               "  [tokenizer]     file = \"tokenizer.json\" (Hugging Face tokenizers) instead; eos = \"<eos>\"\n\n"
               "examples:\n"
               "  palm-rlhf-skill plan --config run.toml\n"
               "  palm-rlhf-skill plan --config run.toml --json\n"
               "  palm-rlhf-skill plan --config run.toml --set train.update_timesteps=64 --probe-seconds 20\n"
               "  palm-rlhf-skill plan --config run.toml --budget 2h --memory-budget 8GiB   # the largest run in them\n"
               "  palm-rlhf-skill plan --config run.toml --one-round   # and time one round for real\n"
               "  palm-rlhf-skill plan --config run.toml --sampler cached   # rollouts with the cached sampler\n"
               "  palm-rlhf-skill plan --config - < run.toml           # the config on stdin\n"
               f"  palm-rlhf-skill plan --config {UPSTREAM_EXAMPLE}   # the upstream README's run\n\n"
               "exit codes: 0 the run fits and learns (--execute: it completed); 1 it does not fit, never "
               "learns, is too slow (--max-days) or fails; 2 usage or config error; 3 palm-rlhf-pytorch, torch or a TOML reader "
               "missing or outside the supported range")
    parser.add_argument("--config", required=True, metavar="FILE", help="the run's TOML (or .json) configuration, at most 1 MiB")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one value, e.g. train.update_timesteps=64 (VALUE read as JSON; null unsets "
                             "the key, so the library default applies); repeatable")
    parser.add_argument("--device", default="auto", type=options.device_spec,
                        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--probe-seconds", type=options.finite_nonnegative_float, metavar="S",
                        help="wall-clock budget of the probe after the model is built and its three tiny "
                             f"rollouts have run (default: {PROBE_SECONDS:g})")
    parser.add_argument("--budget", type=duration, metavar="TIME",
                        help="a wall-time budget (90s, 10m, 2h, 3d): also answer with the largest run that fits "
                             "it at this size (rollouts, learn() calls, the settings), or the size that fits one "
                             "round")
    parser.add_argument("--memory-budget", type=size, metavar="SIZE",
                        help="a memory budget (8GiB, 512MiB, 16GB) for the pool the plan compares (RAM on CPU, "
                             "the GPU's on CUDA): the update_timesteps or max_seq_len that fits it")
    parser.add_argument("--one-round", action="store_true",
                        help="after the probe, time one round at the real size without a budget: "
                             "update_timesteps rollouts and one learn() on all their experiences, against the "
                             "plan's figures for them")
    parser.add_argument("--sampler", choices=cached_sampler.SAMPLERS,
                        help="the rollouts' sampler the probe times and the plan predicts with: library "
                             "(PaLM.generate) or cached (scripts/cached_sampler.py) (default: [run] sampler, else "
                             f"{cached_sampler.DEFAULT_SAMPLER})")
    parser.add_argument("--seed", type=options.bounded_int(0, options.MAX_SEED),
                        help="seed for prompts, weights and sampling (default: [run] seed, else 0)")
    parser.add_argument("--max-days", type=positive_float, metavar="D",
                        help=f"a run predicted to take longer is too slow: verdict too_slow, exit 1 (default: "
                             f"{prediction.MAX_DAYS:g} days, longer than a run anyone plans on one device)")
    parser.add_argument("--cpu-threads", type=options.bounded_int(1, os.cpu_count() or 1), metavar="N",
                        help="torch intra-op threads for the probe (and --execute); give the run's own "
                             "count (default: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    options.add_progress_option(parser)
    parser.add_argument("--execute", action="store_true",
                        help="skip the plan: build the run and train it in full, report seconds and peak RSS")
    options.add_allow_untested_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.execute:  # the real run has no probe, verdict or budget: an option of the plan is a mistake
        given = [name for name in PLAN_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise exits.SkillError(f"--{given[0].replace('_', '-')} applies to the plan, not to --execute (which "
                                   "runs the config in full): drop one of them")
    args.probe_seconds = PROBE_SECONDS if args.probe_seconds is None else args.probe_seconds
    args.max_days = prediction.MAX_DAYS if args.max_days is None else args.max_days
    config = run_config.FORM.load(args.config, args.set)  # paths resolved before leaving the caller's directory
    env = version_gate.check_versions(args.allow_untested)
    import torch  # the run's imports, timed as part of its startup
    import palm_rlhf_pytorch  # noqa: F401
    import accelerate  # noqa: F401
    startup_s = measuring.process_seconds()
    resolved = run_config.check_against_library(config)
    if args.seed is None:
        args.seed = resolved["run"]["seed"] if resolved["run"] else 0
    if args.sampler is not None:
        resolved["sampler"] = args.sampler
    device_kwargs, device = placement.resolve_device(args.device)
    progress = streams.Progress(runner.program_name(), args.progress or not args.json)  # the name its errors give
    threads = placement.torch_threads(args.cpu_threads) if args.cpu_threads else contextlib.nullcontext(torch.get_num_threads())
    with workspace.private_workdir(), threads as count:
        report = (planner.execute if args.execute else planner.plan)(args, resolved, device_kwargs, device,
                                                                     startup_s, progress)
    report.update(seed=args.seed, sampler=resolved["sampler"], cpu_threads=count, versions=env["versions"], version_warnings=env["warnings"],
                  config={k: config[k] for k in run_config.SECTIONS if k in config},
                  effective=resolved["effective"])
    return runner.emit(report, args.json, plan_report.summary,
                       exits.EXIT_OK if report["status"] in ("fits", "ok") else exits.EXIT_CHECK_FAILED)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
