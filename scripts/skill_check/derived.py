"""Numbers and names in prose that follow from a library default: one source, the library.

Three checks:

1. ``FACTS``: each derived number the references state (a group size, a memory figure, a loss at
   the start) is a template rendered from the *installed* library's defaults; the section it is
   in must contain the rendering. A library whose default changed therefore names every stale
   section (``documented`` renders the template from the record the docs were written against,
   ``installed`` from the library that is installed).
2. Default claims: a record argument named in prose next to the word "default" with a value
   (``\u0060kl_div_loss_weight\u0060 (default 0.1)``, ``the default \u0060pad_value=0\u0060``) must
   carry a default that argument has in the installed library, in some symbol of the record.
   The same for a helper's own option (``\u0060--seed\u0060 (default 0)``): the default of that flag in
   the parser of some entry script of the tree (``helper_option_defaults``).
3. Versions: "palm-rlhf-pytorch X.Y.Z" in prose is the record's tested version.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import math
import re
from pathlib import Path
from typing import Any, Callable

from skill_check import markdown

Defaults = Callable[[str, str, str], Any]
PO_REFS = "sub-skills/policy-optimization/references/"
TS = PO_REFS + "troubleshooting.md"  # the symptom index and the silent-failure table
REWARD_TRAPS = PO_REFS + "traps-rewards.md"  # the traps, one file per topic
ROLLOUT_TRAPS = PO_REFS + "traps-rollouts.md"
SETUP_TRAPS = PO_REFS + "traps-setup.md"
WEIGHT_TRAPS = PO_REFS + "traps-weights.md"
TSEL = "sub-skills/policy-optimization/references/trainer-selection.md"
AR = "sub-skills/policy-optimization/references/api-reference.md"
PA = "sub-skills/palm-modeling/references/palm-api.md"
RA = "sub-skills/reward-modeling/references/reward-api.md"
GiB = 2 ** 30


def literal(text: str | None) -> Any:
    """A default's repr as a Python value (``'0.1'`` -> 0.1); non-literals stay their repr."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def defaults_of(api: dict[str, Any]) -> Defaults:
    """``d(symbol, method, param)`` over ``{symbol: {method: [param dicts]}}`` (symbols without the
    ``palm_rlhf_pytorch.`` prefix); KeyError names what is missing."""
    def d(symbol: str, method: str, param: str) -> Any:
        params = (api.get("palm_rlhf_pytorch." + symbol) or {}).get(method) or []
        for p in params:
            if p["name"] == param:
                return literal(p["default"])
        raise KeyError(f"{symbol}.{method}({param})")
    return d


def record_api(record: dict[str, Any]) -> dict[str, Any]:
    """The record's API in the shape of ``api.installed_api``."""
    return {s: {m: doc["params"] for m, doc in e["methods"].items()} for s, e in record["api"].items()}


def values(d: Defaults) -> dict[str, Any]:
    """Every named value the fact templates use, computed from the defaults ``d``."""
    init, train = "__init__", "train"
    v = {"grpo_k": d("grpo.RLHFTrainer", init, "grpo_num_times_sample_rewards"),
         "tpo_k": d("tpo.RLHFTrainer", init, "num_times_sample_rewards"),
         "flowrl_k": d("flowrl.FlowRLTrainer", init, "flowrl_num_times_sample"),
         "minibatch": d("grpo.RLHFTrainer", init, "minibatch_size"),
         "update": d("grpo.RLHFTrainer", train, "update_timesteps"),
         "max_timesteps": d("grpo.RLHFTrainer", train, "max_timesteps"),
         "seq": d("grpo.RLHFTrainer", train, "max_seq_len"),
         "max_episodes": d("tpo.RLHFTrainer", train, "max_episodes"),
         "beta": d("flowrl.FlowRLTrainer", init, "beta"),
         "z_dim": d("flowrl.FlowRLTrainer", init, "partition_function_hidden_dim"),
         "kl": d("grpo.RLHFTrainer", init, "kl_div_loss_weight"),
         "bins": d("RLHFTrainer", init, "critic_num_pred_bins"),
         "hl": d("RLHFTrainer", init, "hl_gauss_loss_kwargs"),
         "beta_s": d("grpo.RLHFTrainer", init, "beta_s"),
         "num_samples": d("grpo.RLHFTrainer", "generate", "num_samples"),
         "thres": d("PaLM", "generate", "filter_thres"),
         "num_episodes": d("grpo.RLHFTrainer", train, "num_episodes"),
         "ac_dim": d("ActorCritic", init, "critic_dim_out"),
         "rm_dropout": d("RewardModel", init, "dropout"),
         "ignore": d("PaLM", init, "cross_entropy_ignore_index"),
         "ckpt": d("grpo.RLHFTrainer", "save", "filepath"),
         "heads": d("PaLM", init, "heads"),
         "lora_r": d("grpo.RLHFTrainer", init, "actor_lora_r"),
         "value_clip": d("RLHFTrainer", init, "value_clip")}
    v["grpo_group"], v["tpo_group"], v["flowrl_group"] = v["grpo_k"] + 1, v["tpo_k"] + 1, v["flowrl_k"] + 1
    v["top_pct"] = round(100 * (1 - v["thres"]))
    v["top_frac"] = round(1 - v["thres"], 6)
    v["top_of_257"] = math.ceil((1 - v["thres"]) * 257)
    v["hl_min"], v["hl_max"] = v["hl"]["min_value"], v["hl"]["max_value"]
    item = 4 * v["seq"] * 20000 * v["update"]  # one stored action_prob table per item, 20000 tokens
    v["ppo_gib"], v["grpo_gib"] = round(item / GiB), round(item * v["grpo_group"] / GiB)
    tpo_seq = v["max_episodes"] * v["update"] * v["tpo_group"] * (4 + v["seq"])  # 4-token prompts
    v["tpo_seq_gb"], v["tpo_mask_gb"] = round(4 * tpo_seq / 1e9, 1), round(tpo_seq / 1e9, 2)
    v["flowrl_start_g2"] = v["beta"] ** 2 * (2 - 1) / 2
    # sizing.md#learn-memory: where attention maps outgrow the vocabulary-wide tensors of learn(),
    # c_V * V / (c_A * depth * heads) with the measured (c_V, c_A) of GRPO, PPO, FlowRL, at the
    # upstream README's 20000 tokens and depth 12
    v["n_attn"] = [round(c_v * 20000 / (c_a * 12 * v["heads"])) for c_v, c_a in ((7, 1), (6, 2), (1, 1))]
    v["sqrt_r"] = round(math.sqrt(v["lora_r"]), 1)
    v["clip_pct"] = round(100 * v["value_clip"] / v["hl_max"])
    v["mixed_11"] = [round(1 - p ** v["grpo_group"] - (1 - p) ** v["grpo_group"], 2) for p in (0.05, 0.2)]
    return v


def fmt(value: Any) -> str:
    """A value as prose writes it: ``15.0`` -> ``15``, ``0.1`` -> ``0.1``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# (file, section anchor, template): the section contains the template rendered with values(). Every
# number in the references that follows from a default is listed here (tests/test_check_skill.py
# changes one default in a library copy and expects each of its facts named).
WF = "sub-skills/policy-optimization/references/workflows.md"
PO_SKILL, PM_SKILL = "sub-skills/policy-optimization/SKILL.md", "sub-skills/palm-modeling/SKILL.md"
GL = "references/glossary.md"
SZ = "sub-skills/policy-optimization/references/sizing.md"
FACTS: list[tuple[str, str, str]] = [
    (TS, "symptom-index", "expected shape ({tpo_group},)"),
    (TS, "symptom-index", "must match the size of tensor b ({bins})` in PPO `learn()` with `critic=ImplicitPRM"),
    (TS, "symptom-index", "`The size of tensor a ({ac_dim}) must match the size of tensor b (N)`"),
    (TS, "silent-failures", "with `max_seq_len - 1 == {bins}`"),
    (TS, "silent-failures", "[rewards outside [{hl_min}, {hl_max}]]"),
    (REWARD_TRAPS, "equal-rewards-group", "GRPO's default group of {grpo_group}"),
    (REWARD_TRAPS, "equal-rewards-group", "multiplies it by `beta` ({beta})"),
    (REWARD_TRAPS, "equal-rewards-group", "| p | G = 4 | G = {grpo_group} | G = 32 |"),
    (REWARD_TRAPS, "equal-rewards-group", "| 0.05 | 0.19 | {mixed_11[0]} | 0.81 |"),
    (REWARD_TRAPS, "equal-rewards-group", "| 0.2 | 0.59 | {mixed_11[1]} | 1.0 |"),
    (REWARD_TRAPS, "equal-rewards-group", "(`grpo_num_times_sample_rewards`, {grpo_k} + 1 by default"),
    (REWARD_TRAPS, "equal-rewards-group", "keeps only the top {top_pct}% of logits"),
    (ROLLOUT_TRAPS, "sampler-mismatch", "`ceil({top_frac} * num_tokens)` largest logits"),
    (ROLLOUT_TRAPS, "sampler-mismatch", "the top {top_pct}%"),
    (ROLLOUT_TRAPS, "printed-losses", "about `-{beta_s} * ln(num_tokens)`"),
    (ROLLOUT_TRAPS, "printed-losses", "the default {minibatch} cuts groups of {grpo_group}"),
    (ROLLOUT_TRAPS, "flowrl-printed-balance", "{flowrl_start_g2} for a group of 2 at the default `beta`"),
    (WEIGHT_TRAPS, "stored-probabilities-memory", "`max_seq_len={seq}` and the default `update_timesteps={update}` that is about "
                                        "{ppo_gib} GiB for PPO and {grpo_gib} GiB for GRPO's default group of {grpo_group}"),
    (SETUP_TRAPS, "trainer-eval-runs-train", "one episode of `max_timesteps={max_timesteps}` real rollouts"),
    (ROLLOUT_TRAPS, "kl-to-rollout-policy", "`kl_div_loss_weight` defaults to {kl}"),
    (REWARD_TRAPS, "ppo-critic-reward-range", "`critic_num_pred_bins={bins}` bins centred on 0, 1, ..., {hl_max}"),
    (REWARD_TRAPS, "ppo-critic-reward-range", "default `min_value={hl_min}, max_value={hl_max},"),
    (SETUP_TRAPS, "tpo-replay-buffer-dir", "(a `train()` argument, default {max_episodes})"),
    (SETUP_TRAPS, "tpo-replay-buffer-dir", "(group {tpo_group}, `update_timesteps={update}`, `max_seq_len={seq}`)"),
    (SETUP_TRAPS, "tpo-replay-buffer-dir", "about {tpo_seq_gb} GB of sequence file plus {tpo_mask_gb} GB per mask"),
    (SETUP_TRAPS, "tpo-replay-buffer-dir", "at the default {max_episodes}"),
    (SETUP_TRAPS, "flowrl-partition-dim", "(default {z_dim})"),
    (SETUP_TRAPS, "update-timesteps-default", "Default `update_timesteps={update}`"),
    (SETUP_TRAPS, "update-timesteps-default", "below {update} never updates"),
    (ROLLOUT_TRAPS, "flowrl-probabilities", "`beta` ({beta}) sets the loss scale"),
    (ROLLOUT_TRAPS, "generate-one-prompt", "`num_samples` (default {num_samples})"),
    (WEIGHT_TRAPS, "group-size-per-rollout", "`grpo_num_times_sample_rewards + 1` times (default {grpo_group})"),
    (WEIGHT_TRAPS, "group-size-per-rollout", "`flowrl_num_times_sample + 1` times (default {flowrl_group}"),
    (REWARD_TRAPS, "implicit-prm-critic", "`critic_num_pred_bins` ({bins}) HL-Gauss bin logits"),
    (REWARD_TRAPS, "implicit-prm-critic", "tensor b ({bins})`, and when the rollout length minus one"),
    (REWARD_TRAPS, "implicit-prm-critic", "without `eos_token`) happens to be {bins} it trains"),
    (TSEL, "decision-table", "`grpo_num_times_sample_rewards` + 1 (default {grpo_k} + 1)"),
    (TSEL, "decision-table", "`num_times_sample_rewards` + 1 (default {tpo_k} + 1)"),
    (TSEL, "decision-table", "`flowrl_num_times_sample` + 1 (default {flowrl_k} + 1)"),
    (TSEL, "decision-table", "HL-Gauss loss over {bins} bins on [{hl_min}, {hl_max}]"),
    (TSEL, "decision-table", "`Linear(dim, critic_num_pred_bins={bins})`"),
    (TSEL, "decision-table", "`partition_function_hidden_dim` (default {z_dim})"),
    (TSEL, "decision-points", "({grpo_group} by default)"),
    (TSEL, "decision-points", "rewards in [{hl_min}, {hl_max}]"),
    (TSEL, "decision-points", "the default {z_dim} builds fine"),
    (TSEL, "decision-points", "`beta` ({beta}) sets the loss scale"),
    (TSEL, "decision-points", "default `{ckpt}`"),
    (AR, "own-actor-critic", "{ac_dim} against 10 raises `The size of tensor a ({ac_dim})"),
    (PA, "generate", "({top_of_257} of 257)"),
    (RA, "training", "The copy has dropout {rm_dropout}"),
    (RA, "what-the-trainers-accept", "expected shape ({tpo_group},)"),
    (WF, "bounded-train-when-does-learn-really-run", "# default {num_episodes}"),
    (WF, "bounded-train-when-does-learn-really-run", "# default {max_timesteps}"),
    (WF, "bounded-train-when-does-learn-really-run", "# default {update}"),
    (PO_SKILL, "key-gotchas", "the PaLM `dim` (default {z_dim})"),
    (PM_SKILL, "key-gotchas", "top {top_pct}% of logits (`top_k`, `filter_thres={thres}`)"),
    (GL, "glossary", "(`cross_entropy_ignore_index={ignore}`)"),
    (SZ, "learn-memory", "the default {heads} heads) about {n_attn[0]} tokens for GRPO, {n_attn[1]} for PPO, "
                         "{n_attn[2]} for FlowRL"),
    (SZ, "lora-step-size", "(default {lora_r}, `grpo.py:65,79`)"),
    (SZ, "lora-step-size", "about {sqrt_r} times as far"),
    (SZ, "ppo-value-clip-unit-rewards", "`value_clip` (default {value_clip})"),
    (SZ, "ppo-value-clip-unit-rewards", "The critic's scale is [{hl_min}, {hl_max}]"),
    (SZ, "ppo-value-clip-unit-rewards", "of at most {value_clip} each"),
    (SZ, "ppo-value-clip-unit-rewards", "the clip is then {clip_pct}% of the range"),
    (SZ, "ppo-value-clip-unit-rewards", "`value_clip` of `{value_clip} / {hl_max}`"),
]


def render(template: str, v: dict[str, Any]) -> str:
    """``template`` with ``{name}`` (or ``{name[i]}``) replaced by ``fmt`` of the value."""
    return re.sub(r"\{(\w+)(?:\[(\d)\])?\}",
                  lambda m: fmt(v[m[1]][int(m[2])] if m[2] else v[m[1]]), template)


def normal(text: str) -> str:
    """Whitespace collapsed, so a fact may wrap across lines."""
    return " ".join(text.split())


def check_facts(record: dict[str, Any], installed: dict[str, Any], root: Path) -> list[dict[str, str]]:
    """Drift of every fact whose section lacks its rendering from the installed defaults."""
    try:
        now = values(defaults_of(installed))
    except (KeyError, TypeError, AttributeError) as err:
        return [{"file": "scripts/skill_check/derived.py", "symbol": "derived facts",
                 "documented": "every default the facts use", "installed": f"missing or changed: {err}"}]
    was = values(defaults_of(record_api(record)))
    drift = []
    for file, anchor, template in FACTS:
        section = next((s for s in markdown.sections(root / file) if s.anchor == anchor), None)
        want, old = render(template, now), render(template, was)
        text = normal(section.text) if section else ""
        if section is not None and normal(want) in text:
            continue
        names = sorted(set(re.findall(r"\{(\w+)", template)))
        drift.append({"file": f"{file}#{anchor}", "symbol": "derived fact " + ", ".join(names),
                      "documented": repr(old) if section is not None and normal(old) in text else
                      ("no such section" if section is None else f"text without {want!r}"),
                      "installed": f"defaults give {want!r} (update the section, or the fact in "
                                   "scripts/skill_check/derived.py)"})
    return drift


VALUE = r"(?P<value>-?\d+(?:\.\d+)?(?:e-?\d+)?\b\.?|True|False|None|'[^']*')"
DEFAULT_THEN_VALUE = re.compile(r"\bdefault(?:s|ing)?(?: to| is| of|:)?\s+`?" + VALUE, re.IGNORECASE)
ASSIGNED = re.compile(r"`(?P<name>[A-Za-z_]\w*)\s*=\s*" + VALUE + r"`")
# `name`, `name()`, or a helper's flag with or without its value: `--seed`, `--seed N`
HELP_DEFAULT = re.compile(r"\(default: " + VALUE)
NAMED = re.compile(r"`(?P<name>[A-Za-z_]\w*(?=(?:\(\))?`)|--[a-z][\w-]*(?=[ `]))[^`]*`")
SENTENCE_END = re.compile(r"[.;!?](?:\s|$)|\n\s*\n|\|")


def default_claims(text: str, names: set[str]) -> list[tuple[int, str, str]]:
    """``(offset, argument, value)`` of every default stated in ``text`` for an argument in
    ``names``: "`name` ... default VALUE" (the nearest argument named before "default" in the same
    clause) and "default `name=VALUE`" / "`name=VALUE` (the default)"."""
    found = []
    for m in DEFAULT_THEN_VALUE.finditer(text):
        start = max((e.end() for e in SENTENCE_END.finditer(text, 0, m.start())), default=0)
        # the nearest of the names; a helper flag outside them (no known default) claims it instead
        named = [n for n in NAMED.finditer(text, start, m.start()) if n["name"] in names or n["name"].startswith("--")]
        if named and named[-1]["name"] in names:
            found.append((m.start(), named[-1]["name"], m["value"]))
    for m in ASSIGNED.finditer(text):
        window = text[max(0, m.start() - 20):m.end() + 20]
        if m["name"] in names and re.search(r"\bdefault\b", window, re.IGNORECASE):
            found.append((m.start(), m["name"], m["value"]))
    return found


def same(claimed: str, default: Any) -> bool:
    """Whether a value written in prose equals a default (``0.`` equals ``0.0``)."""
    try:
        value = ast.literal_eval(claimed.rstrip(".") if claimed.endswith(".") and claimed[:-1].isdigit() else claimed)
    except (ValueError, SyntaxError):
        return claimed == str(default)
    if isinstance(value, bool) or isinstance(default, bool) or value is None or default is None:
        return value is default
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return math.isclose(value, default)
    return value == default


def helper_option_defaults(root: Path) -> dict[str, list[tuple[str, Any]]]:
    """``--flag`` -> ``[(entry script, default), ...]`` over every entry script of the tree under
    ``root`` that builds an argparse parser (``build_parser()``, in the tree's import roots:
    ``skill_runtime.IMPORT_ROOTS``), imported by name; the parsers import no torch. A flag whose
    parser default is None (resolved after parsing) has the default its help states, "(default:
    VALUE"; a flag with neither (or a ``store_true`` flag's ``False``) is left out."""
    from skill_runtime import IMPORT_ROOTS
    by_flag: dict[str, list[tuple[str, Any]]] = {}
    for folder in IMPORT_ROOTS:
        for path in sorted((root / folder).glob("*.py")):
            if "def build_parser(" not in path.read_text(encoding="utf-8"):
                continue
            for action in importlib.import_module(path.stem).build_parser()._actions:
                default = action.default
                if default is None:  # resolved later: the default its --help states, if any
                    stated = HELP_DEFAULT.search(action.help or "")
                    default = literal(stated["value"].rstrip(".")) if stated else None
                if default is None or default is False or default == argparse.SUPPRESS:
                    continue
                for flag in (f for f in action.option_strings if f.startswith("--")):
                    by_flag.setdefault(flag, []).append((path.name, default))
    return by_flag


def check_default_claims(installed: dict[str, Any], files: list[Path], root: Path) -> list[dict[str, str]]:
    """Drift for every default stated in prose that no record symbol's argument of that name has,
    and for every helper flag's default stated in prose that no entry script's parser under
    ``root`` gives that flag (``helper_option_defaults``)."""
    by_name: dict[str, list[tuple[str, Any]]] = helper_option_defaults(root)
    for symbol, methods in installed.items():
        for method, params in (methods or {}).items():
            for p in params or []:
                if p["default"] is not None:
                    short = symbol.removeprefix("palm_rlhf_pytorch.")
                    by_name.setdefault(p["name"], []).append((f"{short}.{method}", literal(p["default"])))
    drift = []
    for md in files:
        prose = markdown.strip_code_blocks(md.read_text(encoding="utf-8"))
        for offset, name, value in default_claims(prose, set(by_name)):
            if any(same(value, d) for _, d in by_name[name]):
                continue
            where = markdown.section_at(md, prose.count("\n", 0, offset) + 1).where
            have = sorted({f"{d!r}" for _, d in by_name[name]})
            drift.append({"file": where, "symbol": f"default of `{name}`", "documented": value.rstrip("."),
                          "installed": " or ".join(have) + " (" + ", ".join(s for s, _ in by_name[name][:3]) + ")"})
    return drift


VERSION = re.compile(r"\b(?:palm-rlhf-pytorch|in) (?P<version>\d+\.\d+\.\d+)\b")


def check_version_mentions(record: dict[str, Any], files: list[Path]) -> list[dict[str, str]]:
    """Drift for every ``palm-rlhf-pytorch X.Y.Z`` (or "in X.Y.Z") in prose that is not the record's
    tested version: the docs state what was tested, so a new tested version names each page."""
    drift = []
    for md in files:
        prose = markdown.strip_code_blocks(md.read_text(encoding="utf-8"))
        for m in VERSION.finditer(prose):
            if m["version"] != record["tested_version"]:
                where = markdown.section_at(md, prose.count("\n", 0, m.start()) + 1).where
                drift.append({"file": where, "symbol": "library version", "documented": m["version"],
                              "installed": f"tested_version {record['tested_version']} in scripts/api_record.json"})
    return drift
