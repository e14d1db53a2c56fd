"""Console entry points.

The skill tree's scripts are the single source of every helper: ``tiny-rlhf-smoke`` and the
script-backed subcommands run them by path from the installed tree (located with
importlib.resources), never from a copy. Nothing here imports torch.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from palm_rlhf_skill import __version__, skill_root

# name -> (kind, target, help). kind "script": target is a helper of the runtime's HELPER_SCRIPTS,
# whose skill-tree script runs by path;
# kind "module": a module of this package with main(argv) -> int ("module:function" names
# another function with that signature).
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("script", "palm-rlhf-skill check",
              "compare the skill's docs with the installed palm-rlhf-pytorch (exit 1 on drift)"),
    "install": ("module", "palm_rlhf_skill.install", "copy the skill tree into an agent's skills folder"),
    "uninstall": ("module", "palm_rlhf_skill.install:uninstall_main", "remove an installed copy"),
    "list": ("module", "palm_rlhf_skill.install:list_main", "show where copies are installed"),
    "doctor": ("module", "palm_rlhf_skill.doctor", "check that this environment can run the trainers"),
    "bench": ("script", "palm-rlhf-skill bench",
              "time the smoke helper against the import floor; --scaling: the sizing table; "
              "--plan-accuracy: the planner against real runs"),
    "plan": ("script", "palm-rlhf-skill plan",
             "before a run: predict its time, peak memory, learn() calls and dead settings from a config"),
    "train": ("script", "palm-rlhf-skill train",
              "run a config in rounds: metrics.jsonl, a live watchdog, checkpoints, exact --resume, policy.pt"),
    "watch": ("script", "palm-rlhf-skill watch", "show a live or finished run: its last rows, curves and rules fired"),
    "evaluate": ("script", "palm-rlhf-skill evaluate",
                 "score a run's policy and its initial weights on held-out prompts: reward, gold metric, samples"),
    "train-reward": ("script", "palm-rlhf-skill train-reward",
                     "train a RewardModel on preference pairs or ratings: metrics, checkpoints, exact --resume, "
                     "rm.pt for train's [reward] checkpoint, token coverage"),
}


def script_path(helper: str) -> Path:
    """The installed skill-tree file behind ``helper`` (``tiny-rlhf-smoke``, ``palm-rlhf-skill
    check``...): the runtime's HELPER_SCRIPTS, the one map of helpers to files."""
    import palm_rlhf_skill.runtime  # noqa: F401  (the tree's modules on sys.path)
    from skill_runtime import reporting
    return skill_root() / reporting.HELPER_SCRIPTS[helper]


def run_script(helper: str, argv: list[str]) -> int:
    """Import the skill-tree script behind ``helper`` (a plain import: its folder is one of the
    tree's import roots) and run its ``main(argv)`` under the runtime's ``run_cli`` (one-line
    errors, exit codes), reporting itself as ``helper``; return the exit code. A script missing
    from the tree raises ModuleNotFoundError with its ``path``, which the tree's hook
    (``skill_runtime.report_damaged_tree``) reports as one line, exit 2, as any other damaged file."""
    path = script_path(helper)
    from skill_runtime import runner
    sys.argv = [helper, *argv]  # argparse and run_cli name the program from argv[0]
    if not path.is_file():
        raise ModuleNotFoundError(f"No module named {path.stem!r}", name=path.stem, path=str(path))
    try:
        module = importlib.import_module(path.stem)
        return runner.run_cli(module.main, argv)
    except SystemExit as exc:        # argparse --help / usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def tiny_rlhf_smoke() -> int:
    """``tiny-rlhf-smoke``: the policy-optimization smoke helper (same file as in the tree)."""
    return run_script("tiny-rlhf-smoke", sys.argv[1:])


def tiny_palm_smoke() -> int:
    """``tiny-palm-smoke``: the palm-modeling smoke helper (same file as in the tree)."""
    return run_script("tiny-palm-smoke", sys.argv[1:])


def tiny_reward_smoke() -> int:
    """``tiny-reward-smoke``: the reward-modeling smoke helper (same file as in the tree)."""
    return run_script("tiny-reward-smoke", sys.argv[1:])


def main(argv: list[str] | None = None) -> int:
    """``palm-rlhf-skill [--version] COMMAND ...``: dispatch to a subcommand, under the runtime's
    ``run_cli`` (one-line errors, a quiet exit when stdout's reader goes away)."""
    import palm_rlhf_skill.runtime  # noqa: F401  (the tree's modules on sys.path)
    from skill_runtime import runner
    return runner.run_cli(dispatch, sys.argv[1:] if argv is None else argv)


def dispatch(argv: list[str]) -> int:
    """Parse the top-level command line and run the subcommand; return its exit code."""
    from skill_runtime import options
    parser = options.OneLineParser(
        prog="palm-rlhf-skill",
        description="Skill tree and checks for palm-rlhf-pytorch.",
        epilog="exit codes: 0 ok; 1 a check failed; 2 usage error; 3 dependency missing")
    parser.add_argument("--version", action="version", version=f"palm-rlhf-skill {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, _, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # answers --help / --version, or a one-line usage error (exit 2)
        parser.error("a COMMAND is required: " + ", ".join(SUBCOMMANDS))
    kind, target, _ = SUBCOMMANDS[argv[0]]
    if kind == "script":
        return run_script(target, argv[1:])
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function or "main")(argv[1:])


if __name__ == "__main__":  # python -m palm_rlhf_skill.cli COMMAND ...
    sys.exit(main())
