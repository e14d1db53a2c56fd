"""argparse for the helpers: usage errors are one stderr line and exit 2, option values are
checked before torch is imported, and the options every smoke shares are declared once."""
from __future__ import annotations

import argparse
import math
import os
import re
from typing import Any, Callable

from skill_runtime import exits


class OneLineParser(argparse.ArgumentParser):
    """argparse parser whose usage errors are a single stderr line and exit code 2, and whose
    description and epilog (examples, exit codes) keep their line breaks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # noqa: D102 - argparse API
        self.exit(exits.EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(?::(\d+))?")


MAX_SEED = 2**32 - 1        # accelerate.utils.set_seed accepts 0 .. 2**32 - 1


MAX_OPTIMIZER_STEPS = 1000  # --steps bound of the palm and reward smokes: they stay seconds long


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse ``type=`` for an integer in ``[low, high]``: a bad value is a one-line usage error
    (exit 2) before torch is imported, never a traceback from deep in the library."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def finite_nonnegative_float(text: str) -> float:
    """argparse ``type=`` for a finite float >= 0 (a learning rate): nan, inf and negatives refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def device_spec(text: str) -> str:
    """argparse ``type=`` for ``--device``: the syntax auto|cpu|cuda|cuda:N, checked without torch."""
    if not DEVICE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of auto, cpu, cuda, cuda:N")
    return text


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options every smoke shares: --device, --seed, --cpu-threads, --json, --allow-untested."""
    parser.add_argument("--device", default="auto", type=device_spec,
                        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0,
                        help=f"seed for random, numpy and torch, 0 to {MAX_SEED} (default: 0)")
    parser.add_argument("--cpu-threads", type=bounded_int(1, os.cpu_count() or 1), default=1, metavar="N",
                        help="torch intra-op threads while the smoke runs (default: 1; tiny models gain "
                             "nothing from more, and on a busy CPU they multiply the run time)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_progress_option(parser)
    add_allow_untested_option(parser)


def add_allow_untested_option(parser: argparse.ArgumentParser) -> None:
    """``--allow-untested``: check_versions warns instead of raising SkillError(3)."""
    parser.add_argument("--allow-untested", action="store_true",
                        help="warn instead of exiting 3 when palm-rlhf-pytorch is outside 0.8.x, torch below "
                             "palm-rlhf-pytorch's own requirement, or a file on the import path shadows one "
                             "of their modules (whose code then runs); an unverified torch only warns anyway")


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress``: progress lines on stderr also with --json (plain output always has them)."""
    parser.add_argument("--progress", action="store_true",
                        help="progress lines on stderr also with --json (without --json they are on by default)")
