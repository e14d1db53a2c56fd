#!/usr/bin/env python3
"""Score a training run's policy against its initial weights on held-out prompts: the run's own
reward (program, text program or reward-model checkpoint) and its gold metric, per prompt, with
fixed sampling seeds and a few decoded samples.

Usage:
    evaluate_run.py --run-dir runs/first                        # plain report on stdout, verdict last
    evaluate_run.py --run-dir runs/first --json                 # one JSON object
    evaluate_run.py --run-dir runs/first --prompts more.txt --metric gold.py:score

The initial weights are rebuilt as train built them ([palm] checkpoint or the run's seed); the
policy is DIR/policy.pt, or the latest checkpoint of a run still going. Keys:
references/run-reports.md#evaluate-report; references/training-run.md#evaluate.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, options, runner, streams, version_gate, workspace  # noqa: E402


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        prog="palm-rlhf-skill evaluate",
        description="Score a run of `palm-rlhf-skill train`: its policy and its initial weights on held-out "
                    "prompts, with the run's reward and gold metric, per prompt, with fixed sampling seeds and "
                    "a few decoded samples.",
        epilog="examples:\n"
               "  palm-rlhf-skill evaluate --run-dir runs/first\n"
               "  palm-rlhf-skill evaluate --run-dir runs/first --json\n"
               "  palm-rlhf-skill evaluate --run-dir runs/first --prompts more.txt --samples 16\n"
               "  palm-rlhf-skill evaluate --run-dir runs/first --metric gold.py:score\n\n"
               "exit codes: 0 scored; 1 the library or the reward raised while scoring; 2 usage error, no run "
               "or no policy yet in DIR, a bad --prompts or --metric; 3 palm-rlhf-pytorch or torch missing or "
               "outside the supported range")
    parser.add_argument("--run-dir", metavar="DIR", required=True, help="the run directory (train's --run-dir)")
    parser.add_argument("--prompts", metavar="FILE", help="held-out prompts, one per line (default: the run's "
                        "[eval] prompts_file)")
    gold = parser.add_mutually_exclusive_group()
    gold.add_argument("--metric", metavar="FILE.py:FUNCTION", help="a gold metric on ids, function(x (b, n) "
                      "int64, response_mask (b, n) bool) -> (b,) (default: the run's [eval] metric)")
    gold.add_argument("--text-metric", metavar="FILE.py:FUNCTION", help="a gold metric on text, "
                      "function(prompt: str, response: str) -> float")
    parser.add_argument("--samples", type=options.bounded_int(1), metavar="N",
                        help="samples per prompt (default: the run's [eval] samples)")
    parser.add_argument("--seed", type=options.bounded_int(0, options.MAX_SEED), metavar="N",
                        help="sampling seed (default: the seed of the run's own evaluations, so the initial side "
                             "equals its round 0)")
    parser.add_argument("--show", type=options.bounded_int(0), default=3, metavar="N",
                        help="decoded samples shown per side (default: 3)")
    parser.add_argument("--device", default="auto", type=options.device_spec,
                        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--cpu-threads", type=options.bounded_int(1), metavar="N",
                        help="torch intra-op threads (default: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    options.add_progress_option(parser)
    options.add_allow_untested_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from policy_optimization.run import evaluate
    evaluate.locate(args.run_dir)  # no run or no policy: one line, before torch is imported
    metric = args.metric and evaluate.program_option("--metric", args.metric)  # absolute: the work runs elsewhere
    text_metric = args.text_metric and evaluate.program_option("--text-metric", args.text_metric)
    env = version_gate.check_versions(args.allow_untested)
    progress = streams.Progress("palm-rlhf-skill evaluate", not args.json or args.progress)
    import contextlib
    from skill_runtime import placement
    threads = placement.torch_threads(args.cpu_threads) if args.cpu_threads else contextlib.nullcontext()
    run_dir, prompts = str(Path(args.run_dir).resolve()), args.prompts and str(Path(args.prompts).resolve())
    with workspace.private_workdir(), threads:  # the library's relative paths go there, not into the caller's
        report = evaluate.score(run_dir, args.device, prompts=prompts, metric=metric, text_metric=text_metric,
                                samples=args.samples, seed=args.seed, show=args.show, progress=progress)
    report.update(versions=env["versions"], warnings=env["warnings"])
    return runner.emit(report, args.json, evaluate.text, exits.EXIT_OK)


if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
