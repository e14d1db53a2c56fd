"""The reward-model run's config (``palm-rlhf-skill train-reward --config RM.toml``).

TOML (or JSON by its ``.json`` suffix), read by the reader every kind of run uses
(``config_kit.reading``), with the tables:

- ``[palm]``: the reward model's own PaLM (``PaLM``'s arguments; ``checkpoint``: a PaLM state dict
  to start from, such as the policy's ``policy.pt``);
- ``[reward_model]``: ``RewardModel``'s arguments (``use_lora``, ``dropout``, ``num_binned_output``...);
- ``[data]``: ``pairs`` (any layout of ``data_kit.layouts``: explicit or implicit prompt, text
  or conversations) or ``ratings`` (``{"prompt", "response", "rating"}``), each a JSONL, JSON, CSV
  or Parquet file or a datasets folder (``data_kit.tables``), ``held_out`` (a file of the same
  form) or ``held_out_fraction``, ``min_held_out``, ``tokenizer`` (``"file.py:callable"``, as
  ``train``'s ``[prompts] tokenizer``; default the skill's byte tokenizer); how to read them:
  ``format``, ``implicit_prompt``, ``template``, ``columns``, ``split``, ``held_out_split``; the
  length limit: ``max_length`` (tokens), ``truncate``;
- ``[train]``: ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``steps_per_round``,
  ``tie_unseen_embeddings``;
- ``[run]``: ``seed``, ``checkpoint_every`` (rounds);
- ``[tokenizer]``: ``file``, a ``tokenizer.json`` (``data_kit.tokenizer_file``, as the policy's),
  ``eos`` (checked to exist: the policy run uses it).

Two steps, as the policy run's config: ``FORM.load`` (torch-free: structure, types, paths made
absolute relative to the config file's folder) and ``check_against_library`` (every [palm] and
[reward_model] key against the installed signatures, the tokenizer loaded). Every bad input is one line, SkillError
exit 2, naming the key.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from config_kit import library, programs, reading
from data_kit import layouts, tables, tokenizer_file
from skill_runtime import exits, options

SECTIONS = ("palm", "reward_model", "data", "train", "run", "tokenizer")
# a policy run's sections that are not this config's: named in the error for one of them
# (tests/test_train_reward.py: the policy run's SECTIONS less these SECTIONS)
POLICY_SECTIONS = ("reward", "trainer", "prompts", "eval")
REQUIRED = ("palm", "data")
# The skill's own keys: (type, default); default None: optional, no value. The one table of them.
OWN_KEYS: dict[str, dict[str, tuple[type, Any]]] = {
    "palm": {"checkpoint": (str, None)},
    "data": {"pairs": (str, None), "ratings": (str, None), "held_out": (str, None), "held_out_fraction": (float, 0.1),
             "tokenizer": (str, None), "format": (str, "auto"), "implicit_prompt": (str, "turn"),
             "template": (dict, None), "columns": (dict, None), "split": (str, None), "held_out_split": (str, None),
             "max_length": (int, 2048), "truncate": (bool, False), "min_held_out": (int, 10)},
    "train": {"epochs": (int, 3), "batch_size": (int, 32), "lr": (float, 1e-3), "weight_decay": (float, 0.0),
              "steps_per_round": (int, None), "tie_unseen_embeddings": (bool, False)},
    "run": {"seed": (int, 0), "checkpoint_every": (int, 1)},
    "tokenizer": {"file": (str, None), "eos": (str, None)},  # as the policy's (data_kit.tokenizer_file); eos: checked
}
PATH_KEYS = (("palm", "checkpoint"), ("data", "pairs"), ("data", "ratings"), ("data", "held_out"), ("data", "tokenizer"),
             ("tokenizer", "file"))
PROGRAM_KEYS = (("data", "tokenizer"),)
CONTRACTS: dict[tuple[str, str], programs.Contract] = {
    ("data", "tokenizer"): (1, "tokenizer(texts: list[str]) -> (n, len) int64 ids padded with 0")}
DATA_KINDS = ("pairs", "ratings")
CHOICES = {("data", "format"): layouts.FORMATS, ("data", "implicit_prompt"): layouts.CUTS}
MIN_INT = {("data", "max_length"): 2, ("data", "min_held_out"): 1, ("train", "epochs"): 1, ("train", "batch_size"): 1, ("train", "steps_per_round"): 1,
           ("run", "checkpoint_every"): 1, ("run", "seed"): 0}
SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "preferences"  # the worked example's rm.toml


def check_value(section: str, key: str, value: Any) -> None:
    """One of the skill's own keys: its type (an int is a float too), bounds. Raises SkillError(2)."""
    want = OWN_KEYS[section][key][0]
    where = f"config [{section}] {key}"
    ok = type(value) is want or (want is float and type(value) is int)
    if not ok:
        raise exits.SkillError(f"{where}: expected {reading.type_name(want())}, got {reading.type_name(value)}")
    if (section, key) in CHOICES and value not in CHOICES[section, key]:
        raise exits.SkillError(f"{where}: {value!r}; choose one of {', '.join(CHOICES[section, key])}")
    if key == "template":
        layouts.check_template(value, where)
    if key == "columns":
        layouts.check_columns(value, where)
    if (section, key) in PROGRAM_KEYS and not reading.program_syntax(value):
        raise exits.SkillError(f"{where}: expected \"file.py:callable\", got {value!r}")
    low = MIN_INT.get((section, key))
    if low is not None and value < low:
        raise exits.SkillError(f"{where}: must be at least {low}, got {value}")
    if (section, key) == ("run", "seed") and value > options.MAX_SEED:
        raise exits.SkillError(f"{where}: must be at most {options.MAX_SEED}, got {value}")
    if want is float and not math.isfinite(value):
        raise exits.SkillError(f"{where}: must be a finite number, got {value}")
    if key == "held_out_fraction" and not 0 < value < 1:
        raise exits.SkillError(f"{where}: must be between 0 and 1 (the share of rows held out), got {value}")
    if key == "lr" and value <= 0:
        raise exits.SkillError(f"{where}: must be above 0, got {value}")
    if key == "weight_decay" and value < 0:
        raise exits.SkillError(f"{where}: must be at least 0, got {value}")


def check_structure(config: dict[str, Any]) -> None:
    """Sections, the skill's own keys and how they combine, before torch is imported. Raises
    SkillError(2) naming the first bad section or key."""
    for name, table in config.items():
        if name not in SECTIONS:
            hint = " (a policy run's section: this is train-reward's config)" if name in POLICY_SECTIONS else ""
            raise exits.SkillError(f"config: unknown section [{name}]{hint}; the sections are {', '.join(SECTIONS)}")
        if not isinstance(table, dict):
            raise exits.SkillError(f"config [{name}]: must be a table, got {reading.type_name(table)}")
    for name in REQUIRED:
        if name not in config:
            raise exits.SkillError(f"config: missing section [{name}]")
    for section, own in OWN_KEYS.items():
        for key, value in config.get(section, {}).items():
            if key in own:
                check_value(section, key, value)
            elif section not in ("palm",):  # [palm]'s other keys are PaLM's, checked against its signature
                raise exits.SkillError(f"config [{section}] {key}: unknown key; the keys are {', '.join(own)}")
    data = config["data"]
    given = [k for k in DATA_KINDS if k in data]
    if len(given) != 1:
        raise exits.SkillError("config [data]: give exactly one of pairs (JSONL {\"prompt\", \"chosen\", \"rejected\"}) "
                               "and ratings (JSONL {\"prompt\", \"response\", \"rating\"})"
                               + (", not both" if len(given) > 1 else ""))
    if "held_out_split" in data and "held_out" not in data:
        raise exits.SkillError("config [data] held_out_split: applies to a [data] held_out datasets folder; give "
                               "held_out, or remove it")
    tokenizer_file.check_table(config.get("tokenizer"), "[data] tokenizer" if "tokenizer" in data else None)
    if "held_out" in data and "held_out_fraction" in data:
        raise exits.SkillError("config [data]: held_out (a file) and held_out_fraction (rows held out of the data): "
                               "give one")


FORM = reading.Form(SECTIONS, check_structure, PATH_KEYS, PROGRAM_KEYS, SHIPPED)  # load, stored: this run's config


def defaulted(config: dict[str, Any], section: str) -> dict[str, Any]:
    """``section``'s own keys with the defaults of ``OWN_KEYS`` filled in (None: not given)."""
    given = config.get(section, {})
    return {key: given.get(key, default) for key, (_, default) in OWN_KEYS[section].items()}


def check_against_library(config: dict[str, Any]) -> dict[str, Any]:
    """[palm] against ``PaLM.__init__`` and [reward_model] against ``RewardModel.__init__``
    (``config_kit.library.check_section``: the installed signatures), every named file present, the
    tokenizer imported and its signature checked (``config_kit.programs.load_program``). Imports torch.

    Returns the resolved config: ``palm`` and ``reward_model`` (the values to pass),
    ``effective_palm`` and ``effective_reward_model`` (with the library defaults filled in: what
    rm_config.json records), ``palm_checkpoint`` (a path or None), ``kind`` (pairs or ratings),
    ``data``, ``train``, ``run`` (own keys with defaults), ``programs`` ({"data.tokenizer": callable}),
    ``tokenizer_file`` ([tokenizer] file's ``TokenizerFile``, or None).
    Raises SkillError(2) naming the first bad key, file or program; a binned model on pairs
    (``num_binned_output`` > 1: its forward returns a sampled bin index, no gradient for a
    Bradley-Terry loss, reward.py:125-130)."""
    from palm_rlhf_pytorch import PaLM, RewardModel
    palm_given = {k: v for k, v in config["palm"].items() if k not in OWN_KEYS["palm"]}
    resolved: dict[str, Any] = {"palm_checkpoint": config["palm"].get("checkpoint")}
    resolved["palm"], resolved["effective_palm"] = library.check_section(
        "palm", PaLM.__init__, palm_given, library.MODEL_SUPPLIED, library.PALM_MINIMUM)
    resolved["reward_model"], resolved["effective_reward_model"] = library.check_section(
        "reward_model", RewardModel.__init__, dict(config.get("reward_model", {})), library.MODEL_SUPPLIED,
        library.PALM_MINIMUM)
    for section in ("data", "train", "run"):
        resolved[section] = defaulted(config, section)
    resolved["kind"] = next(k for k in DATA_KINDS if resolved["data"][k] is not None)
    bins = resolved["effective_reward_model"]["num_binned_output"]
    if resolved["kind"] == "pairs" and bins > 1:
        raise exits.SkillError(f"config [reward_model] num_binned_output = {bins}: a binned model returns a sampled "
                               "bin index without gradient, so it cannot learn from pairs: 0 for pairs "
                               "(Bradley-Terry on the scalar score), or give [data] ratings")
    for section, key in PATH_KEYS:
        value = config.get(section, {}).get(key)
        if value and section == "data" and (section, key) not in PROGRAM_KEYS:
            tables.must_exist(f"config [{section}] {key}", value)  # a file, or a datasets folder
        elif value and (section, key) not in PROGRAM_KEYS:
            programs.must_be_file(f"config [{section}] {key}", value)
    tokenizer = resolved["data"]["tokenizer"]
    resolved["programs"] = {} if tokenizer is None else {
        "data.tokenizer": programs.load_program("data", "tokenizer", tokenizer, CONTRACTS["data", "tokenizer"])}
    resolved["tokenizer_file"] = tokenizer_file.load(config.get("tokenizer"), "config [tokenizer]",
                                                     resolved["effective_palm"]["num_tokens"], "config [palm] num_tokens")
    if resolved["tokenizer_file"] is not None and "eos" in config["tokenizer"]:
        resolved["tokenizer_file"].eos_id(config["tokenizer"]["eos"], "config [tokenizer] eos")
    return resolved


def files_named(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(section.key, path)`` of every file the config names (a program: its file), for the
    digests a resume compares."""
    out = []
    for section, key in PATH_KEYS:
        value = config.get(section, {}).get(key)
        if value:
            out.append((f"{section}.{key}", value.rpartition(":")[0] if (section, key) in PROGRAM_KEYS else value))
    return out
