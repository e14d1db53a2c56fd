"""User programs a run config names as ``"file.py:callable"``: the prompt tokenizer, a reward rule
on ids, a reward rule on text. Loading checks the file imports, the callable exists and takes the
arguments it will get (one line, exit 2, naming the file); the wrappers check what the callable
returns each time it is called (``RewardProgramError`` naming the program and the shape).

Torch-free at import; the wrappers import torch when called.
"""
from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import Any, Callable

from skill_runtime import byte_tokenizer, exits, streams

# what each program key is called with, and its contract in words
CONTRACTS = {
    ("prompts", "tokenizer"): (1, "tokenizer(prompts: list[str]) -> (n, len) int64 ids padded with 0"),
    ("data", "tokenizer"): (1, "tokenizer(texts: list[str]) -> (n, len) int64 ids padded with 0"),  # train-reward
    ("reward", "program"): (2, "function(x (b, n) int64, response_mask (b, n) bool) -> (b,)"),
    ("reward", "text_program"): (2, "function(prompt: str, response: str) -> float"),
    ("eval", "metric"): (2, "function(x (b, n) int64, response_mask (b, n) bool) -> (b,)"),
    ("eval", "text_metric"): (2, "function(prompt: str, response: str) -> float"),
}
# the score programs of a section: (the ids form's key, the text form's key); [eval]'s is the gold metric
SCORE_KEYS = {"reward": ("program", "text_program"), "eval": ("metric", "text_metric")}


class RewardProgramError(ValueError):
    """A reward program returned something other than one real number per sequence."""


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


def load_program(section: str, key: str, value: str) -> Callable:
    """Import ``file.py`` of ``value`` (``"file.py:callable"``, the path absolute) as a fresh module
    and return its ``callable``, after checking that it accepts the arguments of CONTRACTS.
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
    count, contract = CONTRACTS[(section, key)]
    try:
        inspect.signature(function).bind(*range(count))
    except TypeError as exc:
        raise exits.SkillError(f"{where}: {label(value)} cannot be called as {contract}: {exc}") from None
    except ValueError:  # a builtin without a signature: found out when called
        pass
    return function


def tokenizer(resolved: dict[str, Any]):
    """The prompt tokenizer: [prompts] tokenizer's callable, [tokenizer] file's
    (``data_kit.tokenizer_file.TokenizerFile``), else the skill's ByteTokenizer."""
    return resolved["programs"].get("prompts.tokenizer") or resolved.get("tokenizer_file") \
        or byte_tokenizer.ByteTokenizer()


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


def check_scores(scores, batch: int, name: str):
    """``scores`` (what a reward program returned) as a (batch,) float32 tensor.
    Raises RewardProgramError naming the program ``name`` and the shape or type it returned."""
    import torch
    try:
        tensor = torch.as_tensor(scores)
    except (TypeError, ValueError, RuntimeError):
        raise RewardProgramError(f"reward program {name} returned {type(scores).__name__}, expected a ({batch},) "
                                 "tensor or a sequence of numbers") from None
    if tensor.is_complex() or not (tensor.is_floating_point() or tensor.dtype in (
            torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)):
        raise RewardProgramError(f"reward program {name} returned dtype {tensor.dtype}, expected real numbers")
    if tensor.device.type == "meta":
        raise RewardProgramError(f"reward program {name} returned a tensor on the meta device (a shape without "
                                 "values), expected real numbers")
    if tuple(tensor.shape) != (batch,):
        raise RewardProgramError(f"reward program {name} returned shape {tuple(tensor.shape)}, expected ({batch},)")
    return tensor.float()


def call_program(function: Callable, name: str, *args):
    """``function(*args)``, its prints on stderr (``streams.program_output``); anything it raises
    becomes RewardProgramError naming the program, so a run reports the user's program, not the
    library, as the cause: ``sys.exit()`` too (SystemExit), which would otherwise end the run
    with the program's code and no report (``exit(0)``: exit 0 and no policy)."""
    try:
        with streams.program_output():
            return function(*args)
    except RewardProgramError:
        raise
    except SystemExit as exc:
        raise RewardProgramError(f"reward program {name} called sys.exit({exc.code!r}): a reward program returns "
                                 "its scores, it must not end the process") from None
    except Exception as exc:  # noqa: BLE001 - the user's program: reported by name
        raise RewardProgramError(f"reward program {name} raised {exits.one_line(exc)}") from exc


class IdsScore:
    """``score(x, response_mask)`` for ``RuleReward``: the [reward] program, its output checked
    (``check_scores``)."""

    def __init__(self, function: Callable, name: str) -> None:
        self.function, self.name = function, name

    def __call__(self, x, response_mask):
        return check_scores(call_program(self.function, self.name, x, response_mask), x.shape[0], self.name)


class TextScore:
    """``score(x, response_mask)`` for ``RuleReward`` from a [reward] text_program: each sequence
    decoded into its prompt (the ids before the first response token) and its response (the ids
    ``response_mask`` marks: every sampled id after the prompt, through the first ``eos_token``
    when the run sets one, the eos included; ``RuleReward.forward``), then ``function(prompt,
    response) -> float`` per sequence. ``decode`` (the tokenizer's) takes a list of ints and gets
    the sampled ids as they are, the pad id 0 too when the policy sampled it; the skill's byte
    tokenizer drops 0 and ids above 256 and turns bytes that are not UTF-8 into U+FFFD, control
    bytes kept (``byte_tokenizer.ByteTokenizer.decode``). Raises RewardProgramError when the
    function or the decode raises, or the function returns no real number."""

    def __init__(self, function: Callable, name: str, decode: Callable) -> None:
        self.function, self.name, self.decode = function, name, decode

    def __call__(self, x, response_mask):
        values = []
        for row, response in zip(x.tolist(), response_mask.tolist()):
            first = response.index(True) if True in response else len(row)
            decode = f"{self.name} (the tokenizer's decode)"
            prompt = call_program(self.decode, decode, row[:first])
            reply = call_program(self.decode, decode, [i for i, keep in zip(row, response) if keep])
            value = call_program(self.function, self.name, prompt, reply)
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise RewardProgramError(f"text program {self.name} returned {type(value).__name__} "
                                         f"{value!r:.40}, expected a number") from None
            values.append(number)
        return check_scores(values, x.shape[0], self.name)


def rule_reward(resolved: dict[str, Any], anchor: bool, section: str = "reward"):
    """The ``RuleReward`` (reward-modeling/scripts/rule_reward.py) of [reward] program or
    text_program (``section`` "eval": the gold metric, [eval] metric or text_metric), or None when
    the section names neither. With ``anchor`` it carries one parameter nothing uses
    (``ddp_anchor``, a 0-d float32): under multi-process CPU Accelerate wraps every model in DDP,
    which refuses a module without one (references/traps-devices.md#rule-reward-multi-cpu)."""
    import torch
    from rule_reward import RuleReward  # imports torch and the library

    ids_key, text_key = SCORE_KEYS[section]
    table = resolved[section] or {}
    if ids_key in table:
        score = IdsScore(resolved["programs"][f"{section}.{ids_key}"], label(table[ids_key]))
    elif text_key in table:
        score = TextScore(resolved["programs"][f"{section}.{text_key}"], label(table[text_key]),
                          tokenizer(resolved).decode)
    else:
        return None
    model = RuleReward(score)
    if anchor:
        model.ddp_anchor = torch.nn.Parameter(torch.zeros(()))
    return model
