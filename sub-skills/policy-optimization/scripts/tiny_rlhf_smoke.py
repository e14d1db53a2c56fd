#!/usr/bin/env python3
"""Tiny, bounded RLHF smoke for palm-rlhf-pytorch: PPO, GRPO, TPO and FlowRL.

Builds a tiny PaLM policy and a scalar RewardModel on the auto-selected device, constructs the
chosen trainer, runs one bounded ``train()`` call whose single ``learn()`` performs enough optimizer
steps for every trainable tensor to move, then one ``trainer.generate()`` call, and checks what
changed and what must not have.

Usage:
    tiny_rlhf_smoke.py                                  # PPO train smoke: report on stdout, verdict last
    tiny_rlhf_smoke.py --json                           # one JSON object on stdout
    tiny_rlhf_smoke.py --trainer all --json             # PPO, GRPO, TPO and FlowRL in one process
    tiny_rlhf_smoke.py --trainer grpo --grpo-variant dr-grpo
    tiny_rlhf_smoke.py --construct-only --device cpu
    tiny_rlhf_smoke.py --prompt-style text              # raw-text prompts via prompts=
    tiny_rlhf_smoke.py --prompt-style file              # the same file via prompts_path=
    tiny_rlhf_smoke.py --trainer all --nproc 2 --json   # 2 DDP processes, ranks checked in sync
    tiny_rlhf_smoke.py --dim 128 --depth 2 --prompt-len 16 --new-tokens 32   # a bigger smoke

Progress goes to stderr (under --json only with --progress), the report to stdout.
Runs inside a private temporary directory and leaves nothing in the caller's directory.
Options and exit codes: references/workflows.md#the-smoke-helper; JSON: references/reports.md.

The code lives in the smoke's room of the policy_optimization package, policy_optimization/smoke/,
one module per step: options (every option, once), settings, prompts, checklist (build, snapshot,
update, compare, sample), learning_check (--learn), report, estimate, ranks (a launcher's rank,
--nproc) on launch (torchrun, generic); the tiny sizes are the probe kit's (scripts/probe_kit.py).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, options, placement, reporting, runner, streams, version_gate, workspace  # noqa: E402
from policy_optimization.smoke import checklist, estimate, learning_check, prompts, ranks, settings  # noqa: E402
from policy_optimization.smoke import options as smoke_options  # noqa: E402  (the name options is skill_runtime's)
from policy_optimization.smoke import report as smoke_report  # noqa: E402  (the name report is main's dict)
from run_kit import launch  # noqa: E402


def build_parser() -> options.OneLineParser:
    """The smoke's parser: every option from ``smoke_options.OPTIONS`` (torch-free)."""
    parser = options.OneLineParser(
        description="Bounded RLHF smoke for palm-rlhf-pytorch: build a tiny PaLM policy, a scalar "
                    "reward model and a trainer, run one update that must move every trainable "
                    "weight, one generate call, and check the results. --learn instead checks that "
                    "each trainer raises a rule-based reward on a toy task over several seeds.",
        epilog="examples:\n"
               "  tiny-rlhf-smoke --json\n"
               "  tiny-rlhf-smoke --trainer all --json\n"
               "  tiny-rlhf-smoke --trainer grpo --grpo-variant spo\n"
               "  tiny-rlhf-smoke --construct-only --device cpu\n"
               "  tiny-rlhf-smoke --prompt-style file\n"
               "  tiny-rlhf-smoke --trainer all --nproc 2 --json\n"
               "  tiny-rlhf-smoke --trainer all --nproc 2 --eos-token 3 --json\n"
               "  torchrun --nproc-per-node 2 tiny_rlhf_smoke.py --trainer all --json\n"
               "  tiny-rlhf-smoke --dim 128 --depth 2 --prompt-len 16 --new-tokens 32\n"
               "  tiny-rlhf-smoke --learn --trainer all --json\n"
               "  tiny-rlhf-smoke --learn --trainer ppo --learn-control frozen   # must exit 1\n\n"
               + exits.EXIT_CODES_EPILOG)
    smoke_options.add_arguments(parser)
    return parser


def check_usage(args, world: launch.World | None) -> list[str]:
    """Every usage error a run can have before torch (SkillError, exit 2); returns the GRPO variants."""
    smoke_options.refuse_misplaced(args, world)
    variants = settings.parse_variants(args.grpo_variant)
    learning_check.check_seed_room(args)
    ranks.check_options(args, world)
    if args.learn and world is not None:
        raise exits.SkillError("--learn runs in one process: start it without torchrun, accelerate launch or srun")
    return variants


def check_eos(args) -> None:
    """Usage errors of --eos-token (SkillError, exit 2): too few new tokens, or a prompt holding it."""
    if args.eos_token is not None and args.new_tokens < 2:
        raise exits.SkillError("--eos-token needs --new-tokens 2 or more: with 1, a rollout of the longest prompt "
                               "samples one token and cannot end at eos before max_seq_len, so the check "
                               "rollouts_ended_at_eos would pass or fail by chance")
    clashes = prompts.eos_in_prompts(args) if args.eos_token is not None else []
    if clashes:
        other = ("choose another id or --seed" if args.prompt_style == "token-ids" else
                 f"choose another id (the prompts of --prompt-style {args.prompt_style} do not depend on --seed)")
        raise exits.SkillError(f"--eos-token {args.eos_token} occurs in prompt(s) {clashes} of "
                               f"--prompt-style {args.prompt_style}: generate() would stop after one token "
                               f"(it looks for eos in the prompt too); {other}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    world = launch.launcher_world(program="this smoke")  # one rank of torchrun / accelerate launch / srun?
    variants = check_usage(args, world)
    env = version_gate.check_versions(args.allow_untested)
    if args.prompt_style != "token-ids":  # a damaged prompts file: one error line, before any progress
        prompts.prompt_kwargs(args.prompt_style, args.seed)
    check_eos(args)
    if world is not None:  # a launcher started this process: run as one rank of its world
        return ranks.run_rank(args, env, world)
    progress = streams.Progress("tiny-rlhf-smoke", not args.json or args.progress)
    if args.nproc is not None:  # the one-machine shortcut: torchrun on this smoke, N ranks
        return ranks.run_nproc(Path(__file__), args, sys.argv[1:] if argv is None else argv, env, progress)

    timer = streams.Timer(progress)
    with timer.stage("import", label="import torch, palm-rlhf-pytorch and accelerate"):
        import torch  # noqa: F401  (the import floor, timed)
        import palm_rlhf_pytorch  # noqa: F401
        import accelerate  # noqa: F401
    device_kwargs, device = placement.resolve_device(args.device)
    if device.type == "cpu" and not args.learn:  # the --learn toy task is fixed and tiny
        ranks.check_resources(None, "cpu", settings.palm_config(args), args.oversubscribe)
    estimate.announce_estimate(args, progress)
    names = settings.trainer_names(args)
    args.caller_dir = os.getcwd()
    caller_before = workspace.watch_directory(args.caller_dir)
    with workspace.private_workdir(), placement.torch_threads(args.cpu_threads) as threads:
        if args.learn:
            seeds = learning_check.learn_seeds(args)
            results = {name: learning_check.learn_trainer(name, seeds, args.learn_control, device_kwargs, device,
                                                          progress=progress, sampler=args.sampler) for name in names}
        else:
            results = {name: checklist.run_trainer(name, args, device_kwargs, device, variants, progress=progress)
                       for name in names}
    workdir_check = workspace.caller_directory_check(args.caller_dir, caller_before)
    for result in results.values():
        result["checks"].append(workdir_check)
        result["status"] = reporting.status_of(result["checks"])
    report = smoke_report.trainers_report(args, results, device, threads)
    report.update(versions=env["versions"], tested=env["tested"], warnings=env["warnings"])
    report["timings_s"] = {"import": timer.stages["import"], **report["timings_s"]}
    report["timings_s"]["total"] = round(time.perf_counter() - START, 4)
    return runner.emit(report, args.json, smoke_report.summary,
                       exits.EXIT_OK if report["status"] == "ok" else exits.EXIT_CHECK_FAILED)


START = time.perf_counter()

if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
