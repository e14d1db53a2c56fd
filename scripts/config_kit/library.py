"""A config section against the installed library: each key an argument of the constructor (or
method) that takes the section, of the type its default has, above its minimum
(``check_section``), so the skill cannot drift from the library. Also the facts about the models
every kind of run builds from its [palm] and [reward_model]: ``PALM_MINIMUM`` and
``MODEL_SUPPLIED``.

Torch-free itself; its callers pass the installed ``__init__`` (which imports torch).
"""
from __future__ import annotations

from typing import Any

from config_kit.reading import type_name
from skill_runtime import exits

# lowest accepted value of a PaLM argument; below it the library divides by zero or builds nothing
PALM_MINIMUM = {("palm", "dim"): 1, ("palm", "num_tokens"): 2, ("palm", "depth"): 1, ("palm", "heads"): 1,
                ("palm", "dim_head"): 1}
# a RewardModel argument the skill supplies itself, with where the config sets it instead
MODEL_SUPPLIED = {"palm": "[palm]"}


def check_minimum(section: str, key: str, value: Any, minimum: dict, maximum: dict | None = None) -> None:
    """``value`` of ``[section] key`` within its bounds (``minimum``/``maximum``: (section, key) ->
    bound; a key without one is unbounded). Raises SkillError(2) naming the key."""
    low, high = minimum.get((section, key)), (maximum or {}).get((section, key))
    if low is not None and isinstance(value, int) and value < low:
        raise exits.SkillError(f"config [{section}] {key}: must be at least {low}, got {value}")
    if high is not None and isinstance(value, int) and value > high:
        raise exits.SkillError(f"config [{section}] {key}: must be at most {high}, got {value}")


def check_value(section: str, key: str, value: Any, default: Any, required: bool, minimum: dict) -> Any:
    """Check one value against the installed parameter's default (its type is the contract:
    palm-rlhf-pytorch annotates almost nothing) and ``minimum``. Returns the value to pass (lists
    become tuples where the default is a tuple). Raises SkillError(2) naming the key."""
    where = f"config [{section}] {key}"
    if required:
        expected = (int,)
    elif callable(default) and not isinstance(default, type):
        raise exits.SkillError(f"{where}: a Python callable; it cannot be set from a config file")
    elif isinstance(default, bool):
        expected = (bool,)
    elif isinstance(default, int):
        expected = (int,)
    elif isinstance(default, float):
        expected = (int, float)
    elif isinstance(default, str):
        expected = (str,)
    elif isinstance(default, tuple):
        expected = (list,)
    elif isinstance(default, dict):
        expected = (dict,)
    elif default is None:  # max_norm, dr_grpo_constant, eos_token, ...: any plain value
        expected = (bool, int, float, str)
    else:
        expected = (type(default),)
    if type(value) not in expected or (isinstance(value, bool) and bool not in expected):
        want = " or ".join(type_name(t()) for t in expected)
        raise exits.SkillError(f"{where}: expected {want}, got {type_name(value)}"
                               + ("" if value is None else f" {value!r}"))
    check_minimum(section, key, value, minimum)
    return tuple(value) if isinstance(default, tuple) else value


def signature_params(target) -> dict[str, Any]:
    """``target``'s named parameters (``inspect.signature``), without ``self``, ``*args`` and ``**kwargs``."""
    import inspect
    return {n: p for n, p in inspect.signature(target).parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def check_section(section: str, target, given: dict[str, Any], supplied: dict[str, str],
                  minimum: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """``given`` against ``target``'s signature: (values to pass, values with the defaults filled
    in). ``supplied``: arguments the skill passes itself (name -> where the config sets it), refused
    in [trainer] and [reward_model] and never required; ``minimum``: ``check_minimum``'s bounds.
    Raises SkillError(2) naming the first unknown, mistyped or missing key."""
    params = signature_params(target)
    values = {}
    for key, value in given.items():
        if key in supplied and section in ("trainer", "reward_model"):
            raise exits.SkillError(f"config [{section}] {key}: set by the skill from {supplied[key]}")
        if key not in params:
            known = ", ".join(n for n in params if n not in supplied)
            raise exits.SkillError(f"config [{section}] {key}: not an argument of the installed "
                                   f"{getattr(target, '__qualname__', section)}; known: {known}")
        param = params[key]
        values[key] = check_value(section, key, value, param.default, param.default is param.empty, minimum)
    missing = [n for n, p in params.items() if p.default is p.empty and n not in values and n not in supplied]
    if missing:
        raise exits.SkillError(f"config [{section}] {missing[0]}: missing (required by the installed library)")
    return values, {**{n: p.default for n, p in params.items() if p.default is not p.empty}, **values}
