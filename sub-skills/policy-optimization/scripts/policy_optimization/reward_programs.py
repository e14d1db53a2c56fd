"""The policy run's score programs as reward models: [reward] program or text_program (and [eval]'s
gold metric, metric or text_metric) wrapped in a ``RuleReward`` (reward-modeling/scripts/rule_reward.py),
what the user's callable returns checked each time it is called (``RewardProgramError`` naming
the program and the shape). The programs themselves are loaded by ``config_kit.programs``.

Torch-free at import; the wrappers import torch when called.
"""
from __future__ import annotations

from typing import Any, Callable

from config_kit.programs import label
from skill_runtime import exits, streams
from policy_optimization import run_config

# the score programs of a section: (the ids form's key, the text form's key); [eval]'s is the gold metric
SCORE_KEYS = {"reward": ("program", "text_program"), "eval": ("metric", "text_metric")}


class RewardProgramError(ValueError):
    """A reward program returned something other than one real number per sequence."""


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
                          run_config.tokenizer(resolved).decode)
    else:
        return None
    model = RuleReward(score)
    if anchor:
        model.ddp_anchor = torch.nn.Parameter(torch.zeros(()))
    return model
