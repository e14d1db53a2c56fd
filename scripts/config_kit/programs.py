"""User programs a run config names as ``"file.py:callable"`` (a tokenizer, a reward rule, a gold
metric): loading checks that the file imports, the callable exists and takes the arguments it will
get (one line, exit 2, naming the file); ``tokenize`` calls a tokenizer and checks what it returns.
Each kind of run passes the contract of its own keys (``Contract``: its ``CONTRACTS`` table).

Torch-free at import; ``tokenize`` imports torch when called.
"""
from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import Callable

from skill_runtime import exits, streams

# what a program key is called with: (the number of positional arguments, the contract in words)
Contract = tuple[int, str]


def label(value: str) -> str:
    """``rules.py:vowels`` for ``/abs/path/rules.py:vowels``: how messages name a program."""
    file, _, name = value.rpartition(":")
    return f"{Path(file).name}:{name}"


def must_be_file(where: str, file: str) -> Path:
    """``file`` as a Path, when it is a file; SkillError(2) after ``where`` (the config key) saying
    that it is a directory, or missing."""
    path = Path(file)
    if path.is_dir():
        raise exits.SkillError(f"{where}: {file}: is a directory, not a file")
    if not path.is_file():
        raise exits.SkillError(f"{where}: {file}: no such file")
    return path


def load_program(section: str, key: str, value: str, contract: Contract) -> Callable:
    """Import ``file.py`` of ``value`` (``"file.py:callable"``, the path absolute) as a fresh module
    and return its ``callable``, after checking that it accepts the arguments of ``contract``.
    Raises SkillError(2) naming the key and the file when the file is missing or fails to import
    (any exception it raises), the callable is missing or not callable, or its signature cannot
    take those arguments."""
    file, _, name = value.rpartition(":")
    where = f"config [{section}] {key}"
    path = must_be_file(where, file)
    spec = importlib.util.spec_from_file_location(f"run_program_{section}_{key}_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise exits.SkillError(f"{where}: {file}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        with streams.program_output():
            spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's file: any failure is one line
        raise exits.SkillError(f"{where}: {file} fails to import: {exits.one_line(exc)}") from None
    function = getattr(module, name, None)
    if function is None:
        raise exits.SkillError(f"{where}: {file} has no {name}")
    if not callable(function):
        raise exits.SkillError(f"{where}: {file}:{name} is a {type(function).__name__}, not callable")
    count, words = contract
    try:
        inspect.signature(function).bind(*range(count))
    except TypeError as exc:
        raise exits.SkillError(f"{where}: {label(value)} cannot be called as {words}: {exc}") from None
    except ValueError:  # a builtin without a signature: found out when called
        pass
    return function


def tokenize(tokenizer: Callable, texts: list[str], where: str, num_tokens: int):
    """``tokenizer(texts)``, its prints on stderr, as ``checked_ids``. Raises SkillError(2) after
    ``where`` when the tokenizer raises or returns something else."""
    try:
        with streams.program_output():
            ids = tokenizer(texts)
    except exits.SkillError:
        raise
    except SystemExit as exc:  # the user's tokenizer must not end the run (with its code, and no report)
        raise exits.SkillError(f"{where}: the tokenizer called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - the user's tokenizer: one line
        raise exits.SkillError(f"{where}: the tokenizer raised {exits.one_line(exc)}") from None
    return checked_ids(ids, where, num_tokens)


def checked_ids(ids, source: str, num_tokens: int):
    """``ids`` from a tokenizer as a (n, len) int64 tensor with ids in [0, num_tokens).
    Raises SkillError(2) naming ``source`` otherwise."""
    import torch
    try:
        ids = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise exits.SkillError(f"{source}: the tokenizer returned {exits.one_line(exc)}") from None
    if ids.dim() != 2 or ids.dtype != torch.long:
        raise exits.SkillError(f"{source}: the tokenizer returned shape {tuple(ids.shape)} {ids.dtype}, expected "
                               "(n, len) torch.int64 padded with 0")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_tokens):
        raise exits.SkillError(f"{source}: ids from {int(ids.min())} to {int(ids.max())}: [palm] num_tokens "
                               f"{num_tokens} must be above the largest")
    return ids
