"""The run config: one parser shared by ``palm-rlhf-skill plan`` and ``palm-rlhf-skill train``.

A run config is TOML (or JSON, by its ``.json`` suffix) with the tables [palm], [reward_model],
[reward], [trainer], [prompts], [train], [eval] and [run] (references/workflows.md#plan-a-run has
the table of every key). Two steps:

1. ``FORM.load(path, overrides)``: torch-free. Read the file, apply ``--set`` overrides, check
   the sections and the skill's own keys (``check_structure``) and make the file paths absolute
   (relative to the config file): ``config_kit.reading`` with this run's tables.
2. ``check_against_library(config)``: every [palm], [reward_model], [trainer] and [train] key
   against ``inspect.signature`` of the installed constructors (imports torch and the library:
   ``config_kit.library``), the user programs loaded and their signatures checked
   (``config_kit.programs``). Returns the resolved config (a dict, below) that ``builder.build``
   and the planner take.

Every bad input is one line, ``SkillError`` exit 2, naming the key or the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import cached_sampler  # torch-free at import
from config_kit import library, programs, reading
from data_kit import layouts, tables, tokenizer_file
from skill_runtime import byte_tokenizer, exits, options
from policy_optimization import trainers

SECTIONS = ("palm", "reward_model", "reward", "trainer", "prompts", "train", "eval", "run", "tokenizer")
REQUIRED_SECTIONS = ("palm", "trainer", "prompts")
# The skill's own keys (not arguments of a library function): their type per table. [palm]
# also holds PaLM's arguments beside its own ``checkpoint``.
OWN_KEYS: dict[str, dict[str, type]] = {
    "palm": {"checkpoint": str},
    "prompts": {"count": int, "length": int, "file": str, "tokenizer": str, "split": str, "format": str,
                "implicit_prompt": str, "template": dict, "columns": dict},
    "reward": {"program": str, "text_program": str, "checkpoint": str},
    "eval": {"prompts_file": str, "every": int, "samples": int, "metric": str, "text_metric": str, "split": str},
    "run": {"rounds": int, "checkpoint_every": int, "seed": int, "sampler": str},
    "tokenizer": {"file": str, "eos": str},  # a tokenizer.json (data_kit.tokenizer_file)
}
LIBRARY_SECTIONS = ("palm", "reward_model", "trainer", "train")  # checked against signatures
# the skill's defaults for its own keys (listed in a plan's ``defaults_applied`` when used)
OWN_DEFAULTS = {("eval", "every"): 1, ("eval", "samples"): 1, ("run", "seed"): 0,
                ("run", "sampler"): cached_sampler.DEFAULT_SAMPLER}
CHOICES = {("run", "sampler"): cached_sampler.SAMPLERS,  # keys that take one of a few names
           ("prompts", "format"): layouts.FORMATS, ("prompts", "implicit_prompt"): layouts.CUTS}
# [prompts] keys that say how to read [prompts] file and [eval] prompts_file (data_kit.layouts.options_from)
READING_KEYS = ("format", "implicit_prompt", "template", "columns")
# keys naming a file, relative to the config file; "file.py:callable" keeps its callable part
PATH_KEYS = (("palm", "checkpoint"), ("prompts", "file"), ("prompts", "tokenizer"), ("reward", "program"),
             ("reward", "text_program"), ("reward", "checkpoint"), ("eval", "prompts_file"), ("eval", "metric"),
             ("eval", "text_metric"), ("tokenizer", "file"))
SIZE_KEYS = ("heads", "dim_head", "ff_mult")  # PaLM arguments that size the model beside dim and depth
PROGRAM_KEYS = (("prompts", "tokenizer"), ("reward", "program"), ("reward", "text_program"), ("eval", "metric"),
                ("eval", "text_metric"))
# what each program key is called with, and its contract in words (config_kit.programs.load_program)
CONTRACTS: dict[tuple[str, str], programs.Contract] = {
    ("prompts", "tokenizer"): (1, "tokenizer(prompts: list[str]) -> (n, len) int64 ids padded with 0"),
    ("reward", "program"): (2, "function(x (b, n) int64, response_mask (b, n) bool) -> (b,)"),
    ("reward", "text_program"): (2, "function(prompt: str, response: str) -> float"),
    ("eval", "metric"): (2, "function(x (b, n) int64, response_mask (b, n) bool) -> (b,)"),
    ("eval", "text_metric"): (2, "function(prompt: str, response: str) -> float"),
}
REWARD_SOURCES = ("program", "text_program", "checkpoint")
# constructor arguments the skill supplies itself, with where the config sets them instead
SUPPLIED = {**library.MODEL_SUPPLIED, "reward_model": "[reward_model] or [reward]", "prompts": "[prompts]",
            "prompts_path": "[prompts] file", "prompt_token_ids": "[prompts]",
            "tokenizer": "[prompts] tokenizer", "accelerate_kwargs": "--device",
            "critic": "nothing (a PaLM object)", "actor_critic": "nothing (a module object)"}
# lowest accepted value of a key; below it the library divides by zero or builds nothing
MIN_VALUE = {**library.PALM_MINIMUM, ("trainer", "minibatch_size"): 1,
             ("trainer", "epochs"): 0, ("train", "num_episodes"): 0, ("train", "max_timesteps"): 0,
             ("train", "update_timesteps"): 1, ("train", "max_seq_len"): 1,
             ("train", "max_episodes"): 1, ("prompts", "count"): 1, ("prompts", "length"): 1,
             ("eval", "every"): 1, ("eval", "samples"): 1, ("run", "rounds"): 1,
             ("run", "checkpoint_every"): 1, ("run", "seed"): 0}
MAX_VALUE = {("run", "seed"): options.MAX_SEED}
PLANS = Path(__file__).resolve().parents[2] / "assets" / "plans"  # the shipped configs
FIRST_RUN = PLANS.parent / "first-run"  # the shipped run: train's example


# --- structure (no torch) --------------------------------------------------------------------------

def check_own_keys(config: dict[str, Any], section: str) -> None:
    """The skill's own keys of ``section`` (OWN_KEYS): known, of their type, above their minimum;
    in [palm] the other keys are PaLM's (checked against its signature later)."""
    own = OWN_KEYS[section]
    for key, value in config.get(section, {}).items():
        if key not in own:
            if section == "palm":
                continue
            if section == "prompts" and key == "path":
                raise exits.SkillError("config [prompts] path: renamed: the key is now file (one prompt per line, "
                                       "UTF-8)")
            raise exits.SkillError(f"config [{section}] {key}: unknown key; the keys are {', '.join(own)}")
        want = own[key]
        if type(value) is not want:
            raise exits.SkillError(f"config [{section}] {key}: expected {reading.type_name(want())}, "
                                   f"got {reading.type_name(value)}")
        if want is str and ((section, key) in PROGRAM_KEYS) and not reading.program_syntax(value):
            raise exits.SkillError(f"config [{section}] {key}: expected \"file.py:callable\", got {value!r}")
        library.check_minimum(section, key, value, MIN_VALUE, MAX_VALUE)
        if (section, key) in CHOICES and value not in CHOICES[section, key]:
            raise exits.SkillError(f"config [{section}] {key}: {value!r}; choose one of {', '.join(CHOICES[section, key])}")
        if section == "prompts" and key == "template":
            layouts.check_template(value, "config [prompts] template")
        if section == "prompts" and key == "columns":
            layouts.check_columns(value, "config [prompts] columns")


def check_structure(config: dict[str, Any]) -> None:
    """Sections, the trainer name, the skill's own keys and how they combine, before torch is
    imported. Raises SkillError(2) naming the first bad section or key."""
    for name in config:
        if name not in SECTIONS:
            raise exits.SkillError(f"config: unknown section [{name}]; the sections are {', '.join(SECTIONS)}")
        if not isinstance(config[name], dict):
            raise exits.SkillError(f"config [{name}]: must be a table, got {reading.type_name(config[name])}")
    for name in REQUIRED_SECTIONS:
        if name not in config:
            raise exits.SkillError(f"config: missing section [{name}]")
    trainer = config["trainer"].get("name")
    if trainer not in trainers.TRAINERS:
        got = "missing" if trainer is None else repr(trainer)
        raise exits.SkillError(f"config [trainer] name: {got}; choose one of {', '.join(trainers.TRAINERS)}")
    for section in OWN_KEYS:
        check_own_keys(config, section)
    check_prompts(config["prompts"])
    tokenizer_file.check_table(config.get("tokenizer"), "[prompts] tokenizer" if "tokenizer" in config["prompts"] else None)
    check_reward(config)
    check_rounds(config)
    check_library_numbers(config)


def check_library_numbers(config: dict[str, Any]) -> None:
    """Numbers the library takes without a clear refusal: a learning rate (``*_lr``) at or below 0
    (an empty AssertionError in the optimizer), a sample count (``*num_times_sample*``) below 0 (a
    reshape error in round 1), ``[train] temperature`` at or below 0 (clamped to 1e-10: greedy
    sampling, ``palm_rlhf_pytorch/utils.py:48-49``). Raises SkillError(2) naming the key."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    for key, value in config["trainer"].items():
        if key.endswith("_lr") and number(value) and value <= 0:
            raise exits.SkillError(f"config [trainer] {key}: must be above 0, got {value}")
        if "num_times_sample" in key and number(value) and value < 0:
            raise exits.SkillError(f"config [trainer] {key}: must be at least 0 (a group of {key} + 1 completions), "
                                   f"got {value}")
    temperature = config.get("train", {}).get("temperature")
    if number(temperature) and temperature <= 0:
        raise exits.SkillError(f"config [train] temperature: must be above 0, got {temperature} (the library clamps it "
                               "to 1e-10: greedy sampling, which the stored probabilities do not describe)")


def check_prompts(prompts: dict[str, Any]) -> None:
    if ("file" in prompts) == ("count" in prompts or "length" in prompts):
        raise exits.SkillError("config [prompts]: give either file, or both count and length")
    if "file" not in prompts and not {"count", "length"} <= set(prompts):
        missing = "count" if "count" not in prompts else "length"
        raise exits.SkillError(f"config [prompts] {missing}: missing (count and length go together)")
    if "tokenizer" in prompts and "file" not in prompts:
        raise exits.SkillError("config [prompts] tokenizer: applies to [prompts] file (count and length are "
                               "random ids)")
    if "split" in prompts and "file" not in prompts:
        raise exits.SkillError("config [prompts] split: applies to a [prompts] file that is a datasets folder")


def check_reward(config: dict[str, Any]) -> None:
    given = [k for k in REWARD_SOURCES if k in config.get("reward", {})]
    if len(given) > 1:
        raise exits.SkillError(f"config [reward]: {' and '.join(given)}: give exactly one of "
                               f"{', '.join(REWARD_SOURCES)}")
    if given and given[0] != "checkpoint" and config.get("reward_model"):
        raise exits.SkillError(f"config [reward_model]: builds a RewardModel, which [reward] {given[0]} replaces: "
                               "remove one of them")


def check_rounds(config: dict[str, Any]) -> None:
    """[run] and [eval]: rounds required in [run]; [train] num_episodes is then [run]'s; [eval]
    needs [run] (it scores every ``every`` rounds) and a prompts_file."""
    run, evaluation = config.get("run"), config.get("eval")
    if run is not None:
        if "rounds" not in run:
            raise exits.SkillError("config [run] rounds: missing (a run is rounds rounds of train())")
        if "num_episodes" in config.get("train", {}):
            raise exits.SkillError("config [train] num_episodes: not allowed with [run]: [run] rounds sets it (each "
                                   "round is one train(num_episodes=1, ...))")
    if evaluation is not None:
        if run is None:
            raise exits.SkillError("config [eval]: needs [run] (held-out prompts are scored every `every` rounds)")
        if "prompts_file" not in evaluation:
            raise exits.SkillError("config [eval] prompts_file: missing (the held-out prompts, one per line)")
        if "metric" in evaluation and "text_metric" in evaluation:
            raise exits.SkillError("config [eval]: metric and text_metric: give one gold metric (ids or text)")


FORM = reading.Form(SECTIONS, check_structure, PATH_KEYS, PROGRAM_KEYS, PLANS)  # load, stored: this run's config


# --- against the installed library (imports torch) ----------------------------------------------------

def check_against_library(config: dict[str, Any]) -> dict[str, Any]:
    """Every [palm], [reward_model], [trainer] and [train] key against ``inspect.signature`` of the
    installed ``PaLM``, ``RewardModel``, trainer class and its ``train()``, so the skill cannot
    drift from the library; then the user programs ([prompts] tokenizer, [reward] program or
    text_program) imported and their signatures checked (``config_kit.programs.load_program``).

    Returns the resolved config, a dict: ``name`` (the trainer), ``trainer_class``; per library
    section the user's values (``palm``, ``reward_model``, ``trainer``, ``train``); ``effective``
    (those four with the library defaults filled in); ``reward_palm`` (the reward model's own PaLM
    arguments from the rm_config.json beside [reward] checkpoint, which then also sets
    ``reward_model``: ``reward_checkpoint_config``; else None, the policy's [palm]); ``prompts``, ``reward``, ``eval``, ``run`` (the
    skill's own tables, with OWN_DEFAULTS filled in for eval and run); ``palm_checkpoint`` (a path
    or None); ``programs`` ({key: the loaded callable}); ``round`` (``round_counts``, or None
    without [run]); ``defaults_applied`` (``defaults_applied``).
    Raises SkillError(2) naming the first unknown key, wrong type, or unusable program or file."""
    from palm_rlhf_pytorch import PaLM, RewardModel

    name = config["trainer"]["name"]
    trainer_cls = trainers.TRAINERS[name].load()
    targets = {"palm": PaLM.__init__, "reward_model": RewardModel.__init__,
               "trainer": trainer_cls.__init__, "train": trainer_cls.train}
    palm_given = {k: v for k, v in config.get("palm", {}).items() if k not in OWN_KEYS["palm"]}
    resolved: dict[str, Any] = {"name": name, "trainer_class": trainer_cls, "effective": {},
                                "palm_checkpoint": config["palm"].get("checkpoint")}
    for section, target in targets.items():
        given = palm_given if section == "palm" else {
            k: v for k, v in config.get(section, {}).items() if not (section == "trainer" and k == "name")}
        resolved[section], resolved["effective"][section] = library.check_section(section, target, given, SUPPLIED,
                                                                                  MIN_VALUE)
    resolved["reward_palm"] = None
    trained = reward_checkpoint_config(config)
    if trained is not None:
        resolved["reward_palm"], resolved["reward_model"], resolved["effective"]["reward_model"] = trained[:3]
        if resolved["palm"]["num_tokens"] > resolved["reward_palm"]["num_tokens"]:
            raise exits.SkillError(f"config [palm] num_tokens = {resolved['palm']['num_tokens']}: the policy samples ids "
                                   f"the reward model of [reward] checkpoint has no embedding for (its num_tokens is "
                                   f"{resolved['reward_palm']['num_tokens']}): the same tokenizer and num_tokens for both")
    resolved["prompts"] = dict(config["prompts"])
    resolved["reward"] = dict(config.get("reward", {}))
    resolved["eval"] = None if "eval" not in config else {
        "every": OWN_DEFAULTS[("eval", "every")], "samples": OWN_DEFAULTS[("eval", "samples")], **config["eval"]}
    resolved["run"] = None if "run" not in config else {
        "seed": OWN_DEFAULTS[("run", "seed")], "sampler": OWN_DEFAULTS[("run", "sampler")], **config["run"]}
    resolved["sampler"] = (resolved["run"] or {}).get("sampler", OWN_DEFAULTS[("run", "sampler")])
    for section, key in PATH_KEYS:
        if (section, key) in (("prompts", "file"), ("eval", "prompts_file")) and key in config.get(section, {}):
            tables.must_exist(f"config [{section}] {key}", config[section][key])  # a file, or a datasets folder
        elif key in config.get(section, {}) and (section, key) not in PROGRAM_KEYS:
            programs.must_be_file(f"config [{section}] {key}", config[section][key])
    resolved["programs"] = {f"{section}.{key}": programs.load_program(section, key, config[section][key],
                                                                      CONTRACTS[section, key])
                            for section, key in PROGRAM_KEYS if key in config.get(section, {})}
    resolved["tokenizer_file"] = tokenizer_file.load(config.get("tokenizer"), "config [tokenizer]",
                                                     resolved["palm"]["num_tokens"], "config [palm] num_tokens")
    if resolved["tokenizer_file"] is not None and "eos" in config["tokenizer"]:
        eos = resolved["tokenizer_file"].eos_id(config["tokenizer"]["eos"], "config [tokenizer] eos")
        if resolved["train"].get("eos_token", eos) != eos:
            raise exits.SkillError(f"config [train] eos_token = {resolved['train']['eos_token']}: [tokenizer] eos "
                                   f"{config['tokenizer']['eos']!r} is id {eos}: give one of them")
        resolved["train"]["eos_token"] = resolved["effective"]["train"]["eos_token"] = eos
    if trained is not None:
        tokenizer_file.check_shared(resolved["tokenizer_file"], "prompts.tokenizer" in resolved["programs"], trained[3],
                                    "config [reward] checkpoint")
    for section, key in (("reward", "text_program"), ("eval", "text_metric")):
        tokenizer = resolved["programs"].get("prompts.tokenizer")
        if f"{section}.{key}" in resolved["programs"] and tokenizer is not None \
                and not callable(getattr(tokenizer, "decode", None)):
            raise exits.SkillError(f"config [{section}] {key}: needs a tokenizer that decodes; "
                                   f"[prompts] tokenizer {config['prompts']['tokenizer']} has no decode(ids) -> str")
    resolved["round"] = round_counts(resolved)
    resolved["defaults_applied"] = defaults_applied(config, resolved)
    return resolved


def reward_checkpoint_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                                              dict[str, Any] | None] | None:
    """The reward model's own arguments when [reward] checkpoint names a ``train-reward`` output:
    ``rm_config.json`` beside the checkpoint (``reward_modeling.artifacts``), checked against the
    installed ``PaLM`` and ``RewardModel``. Returns (PaLM arguments, RewardModel arguments, the
    latter with the defaults filled in, its tokenizer's record: ``artifacts.read``), or None without a checkpoint or that file (the reward
    model is then built on the policy's [palm] and [reward_model], as before). Raises
    SkillError(2) naming the file: unreadable, an argument the library refuses, or [reward_model]
    given as well (the file sets it)."""
    from palm_rlhf_pytorch import PaLM, RewardModel
    from reward_modeling import artifacts
    checkpoint = config.get("reward", {}).get("checkpoint")
    path = artifacts.beside(checkpoint) if checkpoint else None
    if path is None or not path.is_file():
        return None
    where = "config [reward] checkpoint"
    if config.get("reward_model"):
        raise exits.SkillError(f"config [reward_model]: {path} beside [reward] checkpoint sets the reward model's "
                               "arguments (train-reward wrote it): remove [reward_model]")
    trained = artifacts.read(path, where)
    try:
        palm, _ = library.check_section("palm", PaLM.__init__, trained["palm"], SUPPLIED, MIN_VALUE)
        values, effective = library.check_section("reward_model", RewardModel.__init__, trained["reward_model"],
                                                  SUPPLIED, MIN_VALUE)
    except exits.SkillError as err:
        raise exits.SkillError(f"{where}: {path}: {str(err).removeprefix('config ')}") from None
    return palm, values, effective, trained.get("tokenizer")


def round_counts(resolved: dict[str, Any]) -> dict[str, int] | None:
    """One round of [run]: ``{rounds, max_timesteps, update_timesteps}``; a round is one
    ``train(num_episodes=1, max_timesteps=M, update_timesteps=U, ...)`` with M = [train]
    max_timesteps if given, else U = [train] update_timesteps (the library default when absent),
    so one learn() per round. None without [run]."""
    if resolved["run"] is None:
        return None
    update = resolved["effective"]["train"]["update_timesteps"]
    return {"rounds": resolved["run"]["rounds"], "max_timesteps": resolved["train"].get("max_timesteps", update),
            "update_timesteps": update}


def train_kwargs(resolved: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of one ``train()`` call: [train] as given, or with [run] one round's
    (num_episodes 1, max_timesteps and update_timesteps of ``round_counts``)."""
    rnd = resolved["round"]
    if rnd is None:
        return dict(resolved["train"])
    return {**resolved["train"], "num_episodes": 1, "max_timesteps": rnd["max_timesteps"],
            "update_timesteps": rnd["update_timesteps"]}


def eval_points(rounds: int, every: int) -> list[int]:
    """The rounds after which [eval] scores the held-out prompts: 0 (before the first round, the
    baseline), then every ``every`` rounds, and the last round."""
    return sorted({0, *range(every, rounds + 1, every), rounds})


def defaults_applied(config: dict[str, Any], resolved: dict[str, Any]) -> list[dict[str, Any]]:
    """Every value the run uses that the config did not set: the [train] arguments of the
    installed train() (num_episodes, max_timesteps, update_timesteps, max_seq_len, ...; with [run]
    num_episodes and max_timesteps are the round's), the PaLM arguments that size the model
    (SIZE_KEYS), [trainer] arguments that decide what is
    stored or learned (group size, minibatch_size, epochs), and the skill's own defaults.
    Returns ``[{section, key, value, source}]``; ``source`` is ``library`` or ``skill``."""
    out = []
    rnd = resolved["round"]
    for key, value in resolved["effective"]["train"].items():
        if key in config.get("train", {}):
            continue
        if rnd is not None and key == "num_episodes":
            continue  # [run] rounds sets it
        if rnd is not None and key == "max_timesteps":
            value, source = rnd["max_timesteps"], "skill"  # = update_timesteps: one learn() per round
        else:
            source = "library"
        out.append({"section": "train", "key": key, "value": value, "source": source})
    spec = trainers.TRAINERS[resolved["name"]]
    for section, keys in (("palm", SIZE_KEYS), ("trainer", (spec.group_kwarg, "minibatch_size", "epochs"))):
        for key in filter(None, keys):
            if key not in config[section]:
                out.append({"section": section, "key": key, "value": resolved["effective"][section][key],
                            "source": "library"})
    for (section, key), value in OWN_DEFAULTS.items():
        if section in config and key not in config[section]:
            out.append({"section": section, "key": key, "value": value, "source": "skill"})
    return out


def tokenizer(resolved: dict[str, Any]):
    """The prompt tokenizer: [prompts] tokenizer's callable, [tokenizer] file's
    (``data_kit.tokenizer_file.TokenizerFile``), else the skill's ByteTokenizer."""
    return resolved["programs"].get("prompts.tokenizer") or resolved.get("tokenizer_file") \
        or byte_tokenizer.ByteTokenizer()
