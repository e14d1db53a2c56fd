"""Rows as preference pairs, ratings or prompts, in the field's layouts (TRL's dataset formats:
huggingface/trl docs/source/dataset_formats.md, "standard" or "conversational", "explicit" or
"implicit" prompt), told apart from the rows themselves unless ``format`` names one:

- ``explicit``: ``{"prompt": str, "chosen": str, "rejected": str}``;
- ``implicit``: ``{"chosen": str, "rejected": str}``, both whole texts (the Anthropic HH-RLHF
  layout, ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``): the prompt is their longest shared
  beginning (``split_implicit``);
- ``conversational``: ``prompt``, ``chosen`` and ``rejected`` lists of ``{"role", "content"}``
  messages; ``conversational_implicit``: ``chosen`` and ``rejected`` whole conversations, the
  prompt their shared first messages (a cut at a message boundary, as TRL's ``extract_prompt``
  compares whole messages). A conversation is rendered to text with ``Options.template``
  (``render``; ``DEFAULT_TEMPLATE`` writes the HH-RLHF layout, so both read alike).

Ratings: ``{"prompt", "response", "rating"}``. Prompts: the lines of a text file, a table's
``prompt`` column (text or messages), or the prompts of pairs of any layout (``read_prompts``).
``Options.columns`` maps these names to a file's own. Every bad row is SkillError(2) naming the
file, the row and the fix. Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from data_kit import tables
from skill_runtime import exits

# layout: (one row, in words)
LAYOUTS = {"explicit": ('{"prompt", "chosen", "rejected"} texts', "an explicit-prompt pair"),
           "implicit": ('{"chosen", "rejected"} texts', "an implicit-prompt pair"),
           "conversational": ('{"prompt", "chosen", "rejected"} lists of messages', "a conversational pair"),
           "conversational_implicit": ('{"chosen", "rejected"} lists of messages',
                                       "an implicit-prompt conversational pair")}
FORMATS = ("auto", *LAYOUTS)
CUTS = ("turn", "character")  # implicit_prompt: where the shared beginning of two texts is cut
ROLES = ("system", "user", "assistant")
# The default template writes a conversation as the HH-RLHF data set does; "{content}" is the message's text.
DEFAULT_TEMPLATE = {"system": "{content}", "user": "\n\nHuman: {content}", "assistant": "\n\nAssistant: {content}",
                    "generation": "\n\nAssistant:"}
COLUMNS = ("prompt", "chosen", "rejected", "response", "rating", "group")
PAIR_KEYS = ("prompt", "chosen", "rejected")
RATING_KEYS = ("prompt", "response", "rating")


@dataclass
class Options:
    """How to read rows: ``format`` (``auto`` or a key of LAYOUTS), ``template`` (DEFAULT_TEMPLATE's
    keys), ``cut`` (CUTS: ``turn`` or ``character``), ``columns`` (our name -> the file's)."""
    format: str = "auto"
    template: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_TEMPLATE))
    cut: str = "turn"
    columns: dict[str, str] = field(default_factory=dict)

    def column(self, name: str) -> str:
        return self.columns.get(name, name)


@dataclass
class Pair:
    """One preference pair as text: ``prompt`` (may be empty), ``chosen``, ``rejected``, the row's
    ``group`` (None without a group column) and ``place`` (``FILE line 3``)."""
    prompt: str
    chosen: str
    rejected: str
    group: str | None
    place: str


# --- options ------------------------------------------------------------------------------------------

def options_from(table: dict[str, Any], where: str) -> Options:
    """A config table's reading keys (``format``, ``implicit_prompt``, ``template``, ``columns``:
    train-reward's [data], train's [prompts]) as Options; absent keys keep the defaults.
    ``where`` names the table in messages (``config [data]``)."""
    return Options(format=table.get("format") or "auto",
                   template=check_template(table.get("template") or {}, f"{where} template"),
                   cut=table.get("implicit_prompt") or "turn", columns=check_columns(table.get("columns") or {},
                                                                                      f"{where} columns"))


def check_template(template: Any, where: str) -> dict[str, str]:
    """``template`` (a table: any of DEFAULT_TEMPLATE's keys; the others keep their default) as the
    full template. Each role's text holds ``{content}`` once; ``assistant`` must begin with
    ``generation`` (the prompt ends with it, and a rendered response must continue it). Raises
    SkillError(2) after ``where``."""
    if not isinstance(template, dict):
        raise exits.SkillError(f"{where}: a table of {', '.join(DEFAULT_TEMPLATE)} expected")
    unknown = [k for k in template if k not in DEFAULT_TEMPLATE]
    if unknown:
        raise exits.SkillError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(DEFAULT_TEMPLATE)}")
    full = {**DEFAULT_TEMPLATE, **template}
    for key, text in full.items():
        if not isinstance(text, str):
            raise exits.SkillError(f"{where} {key}: expected a string, got {type(text).__name__}")
        if key != "generation" and text.count("{content}") != 1:
            raise exits.SkillError(f"{where} {key}: {text!r} must hold {{content}} once (the message's text)")
    if not full["assistant"].startswith(full["generation"]):
        raise exits.SkillError(f"{where}: assistant {full['assistant']!r} must begin with generation "
                               f"{full['generation']!r} (the prompt ends with generation, a response continues it)")
    return full


def check_columns(columns: Any, where: str) -> dict[str, str]:
    """``columns`` (our name -> the file's column) checked: names of COLUMNS, non-empty strings."""
    if not isinstance(columns, dict):
        raise exits.SkillError(f"{where}: a table of {', '.join(COLUMNS)} expected")
    for key, value in columns.items():
        if key not in COLUMNS:
            raise exits.SkillError(f"{where}: unknown key {key!r}; the keys are {', '.join(COLUMNS)}")
        if not isinstance(value, str) or not value:
            raise exits.SkillError(f"{where} {key}: the file's column name expected, got {value!r}")
    return dict(columns)


# --- rendering a conversation ----------------------------------------------------------------------

def render(messages: list[dict[str, str]], template: dict[str, str]) -> str:
    """The messages as one text: each ``template[role]`` with ``{content}`` replaced by its text."""
    return "".join(template[m["role"]].replace("{content}", m["content"]) for m in messages)


def check_messages(value: Any, name: str, at: str) -> list[dict[str, str]]:
    """``value`` as a conversation: a non-empty list of ``{"role": one of ROLES, "content": str}``."""
    if not value:
        raise exits.SkillError(f"{at}: {name} is an empty conversation (no messages): drop the row or give its "
                               "messages")
    for i, message in enumerate(value, 1):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise exits.SkillError(f"{at}: {name} message {i}: a {{\"role\", \"content\"}} object with string values "
                                   f"expected, got {str(message)[:60]}")
        if message["role"] not in ROLES:
            raise exits.SkillError(f"{at}: {name} message {i}: role {message['role']!r}: the template renders "
                                   f"{', '.join(ROLES)}")
    return value


def check_roles(prompt: list[dict[str, str]], response: list[dict[str, str]], name: str, at: str) -> None:
    """The role sequence the template renders: a system message only first, then user and
    assistant in turn from user; the prompt ends with user and the response starts with
    assistant. Raises SkillError(2) naming the roles and the fix."""
    roles = [m["role"] for m in prompt + response]
    turns = roles[1:] if roles[0] == "system" else roles
    fine = all(role == ("user", "assistant")[i % 2] for i, role in enumerate(turns)) and bool(prompt) \
        and prompt[-1]["role"] == "user"
    if not fine:
        raise exits.SkillError(f"{at}: {name}: roles {' -> '.join(roles)} (prompt {len(prompt)} messages): the "
                               "template renders a system message first only, then user and assistant in turn, a "
                               "prompt ending with user and a response starting with assistant: merge or reorder the "
                               "messages")


def conversation(prompt: list, response: list, name: str, at: str, template: dict[str, str]) -> tuple[str, str]:
    """(prompt text, response text): the prompt rendered with ``generation`` after it, the response
    what rendering prompt + response adds after that, as TRL renders prompt and completion."""
    check_roles(prompt, response, name, at)
    head = render(prompt, template) + template["generation"]
    whole = render(prompt + response, template)
    return head, whole[len(head):]


# --- pairs ----------------------------------------------------------------------------------------

def _present(row: dict[str, Any], name: str) -> bool:
    return row.get(name) is not None


def row_layout(row: Any, options: Options) -> str | None:
    """The layout of one row (a key of LAYOUTS), or None when it is none of them."""
    if not isinstance(row, dict):
        return None
    chosen, rejected = row.get(options.column("chosen")), row.get(options.column("rejected"))
    prompt = row.get(options.column("prompt"))
    if isinstance(chosen, str) and isinstance(rejected, str):
        return "explicit" if isinstance(prompt, str) else "implicit" if prompt is None else None
    if isinstance(chosen, list) and isinstance(rejected, list):
        return "conversational" if isinstance(prompt, list) else "conversational_implicit" if prompt is None else None
    return None


def why_not(row: Any, table: tables.Table, options: Options, keys: tuple[str, ...] = PAIR_KEYS) -> str:
    """Why ``row`` is no pair (or rating) row: not an object, a column missing, a value's type."""
    word = "key" if table.kind in ("jsonl", "json") else "column"
    if not isinstance(row, dict):
        return f"a JSON object with {', '.join(keys)} expected, got {type(row).__name__}"
    needed = keys[1:] if keys == PAIR_KEYS else keys
    for name in needed:
        if not _present(row, options.column(name)):
            mapped = f" (the file's {options.column(name)!r})" if options.column(name) != name else ""
            seen = f"; the file's columns: {', '.join(table.columns)}" if word == "column" else ""
            return (f"missing {word} {name!r}{mapped} (a row has {', '.join(keys)}{seen}; [data] columns maps "
                    "other names)")
    for name in needed:
        value = row[options.column(name)]
        if not isinstance(value, (str, list)) and name != "rating":
            return f"{name} must be a string (or a list of messages), got {type(value).__name__}"
    return f"prompt must be a string or a list of messages like chosen, got {type(row[options.column('prompt')]).__name__}"


def split_implicit(chosen: str, rejected: str, cut: str, marker: str, at: str) -> tuple[str, str, str]:
    """(prompt, chosen response, rejected response) of two whole texts: the prompt is their
    longest shared beginning. ``cut`` ``character``: TRL's ``extract_prompt`` (trl/data_utils.py):
    up to the first character where they differ, one character less when the one before is a
    space (the space stays with the responses). ``turn`` (the default): that beginning cut back
    to the end of the last ``marker`` in it (the template's ``generation``, ``\\n\\nAssistant:``),
    so the prompt ends where a turn of the assistant starts and each response is the whole turn;
    with no marker in it, as ``character``. Raises SkillError(2) at ``at`` when the texts share
    nothing or one is the beginning of the other (nothing left to prefer)."""
    n = len(os.path.commonprefix([chosen, rejected]))
    if n == 0:
        raise exits.SkillError(f"{at}: chosen and rejected share no beginning, so there is no implicit prompt: give "
                               "each row its prompt ({\"prompt\", \"chosen\", \"rejected\"}), or drop the row")
    turn = chosen.rfind(marker, 0, n) if cut == "turn" and marker else -1
    if turn >= 0:
        n = turn + len(marker)
    elif n < min(len(chosen), len(rejected)) and chosen[n - 1] == " ":
        n -= 1
    prompt, first, second = chosen[:n], chosen[n:], rejected[n:]
    if not first or not second:
        whole = "chosen" if not first else "rejected"
        raise exits.SkillError(f"{at}: {whole} is the beginning of the other text, so nothing of it is left to "
                               "prefer once the shared prompt is taken: give the row an explicit prompt, or drop it")
    return prompt, first, second


def pair_of(row: dict[str, Any], layout: str, options: Options, at: str) -> Pair:
    """One row of ``layout`` as a Pair, checked: responses not empty and different."""
    c = options.column
    chosen, rejected = row[c("chosen")], row[c("rejected")]
    if layout == "explicit":
        prompt = row[c("prompt")]
    elif layout == "implicit":
        prompt, chosen, rejected = split_implicit(chosen, rejected, options.cut, options.template["generation"], at)
    else:
        for name, value in (("chosen", chosen), ("rejected", rejected)):
            check_messages(value, name, at)
        if layout == "conversational":
            prompt_messages = check_messages(row[c("prompt")], "prompt", at)
        else:
            n = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
            if n == 0:
                raise exits.SkillError(f"{at}: chosen and rejected share no first message, so there is no implicit "
                                       "prompt: give the row a prompt list of messages, or drop it")
            prompt_messages, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
            for name, value in (("chosen", chosen), ("rejected", rejected)):
                if not value:
                    raise exits.SkillError(f"{at}: {name} is the beginning of the other conversation, so nothing of "
                                           "it is left to prefer once the shared prompt is taken: drop the row")
        prompt, chosen = conversation(prompt_messages, chosen, "chosen", at, options.template)
        _, rejected = conversation(prompt_messages, rejected, "rejected", at, options.template)
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not value:
            raise exits.SkillError(f"{at}: {name} is empty (a response the reward model scores has at least one token)")
    if chosen == rejected:
        raise exits.SkillError(f"{at}: chosen and rejected are the same text: the pair prefers nothing")
    group = row.get(c("group"))
    return Pair(prompt, chosen, rejected, None if group is None else str(group), at)


def pairs_of(table: tables.Table, options: Options, key: str) -> tuple[list[Pair], str]:
    """Every row of ``table`` as a Pair, all of one layout: ``options.format``, or (``auto``) the
    first row's. Returns (pairs, layout). Raises SkillError(2) naming the file and the row: a row
    of no layout, or of another than the file's (mixed layouts)."""
    layout = None if options.format == "auto" else options.format
    first = None
    out = []
    for i, row in enumerate(table.rows):
        at = f"{key}: {table.at(i)}"
        found = row_layout(row, options)
        if found is None:
            raise exits.SkillError(f"{at}: {why_not(row, table, options)}")
        if layout is None:
            layout, first = found, table.places[i]
        if found != layout:
            then = (f"but {first} is {LAYOUTS[layout][1]}: one layout per file (convert the rows, or split the file)"
                    if first else f"but [data] format = {layout!r} ({LAYOUTS[layout][0]}): another format, or "
                    "convert the rows")
            raise exits.SkillError(f"{at}: {LAYOUTS[found][1]} ({LAYOUTS[found][0]}), {then}")
        out.append(pair_of(row, found, options, at))
    return out, layout or "explicit"


def read_pairs(path: str, key: str, options: Options, split: str | None = None, split_key: str = "split",
               prefer: str = "train") -> tuple[list[Pair], str]:
    """The pairs of a file or datasets folder (``tables.read_table``, then ``pairs_of``)."""
    return pairs_of(tables.read_table(path, key, split, split_key, prefer=prefer), options, key)


# --- ratings --------------------------------------------------------------------------------------

def read_ratings(path: str, key: str, options: Options, split: str | None = None, split_key: str = "split",
                 prefer: str = "train") -> list[tuple[dict[str, Any], str]]:
    """The rows ``{"prompt", "response", "rating"}`` of a file (columns mapped; a CSV rating, a
    string, read as a number), each with its place; the values are checked by the caller.
    Raises SkillError(2) naming the row when one is not an object or lacks a column."""
    table = tables.read_table(path, key, split, split_key, prefer=prefer)
    out = []
    for i, row in enumerate(table.rows):
        at = f"{key}: {table.at(i)}"
        if not isinstance(row, dict) or any(not _present(row, options.column(k)) for k in RATING_KEYS):
            raise exits.SkillError(f"{at}: {why_not(row, table, options, RATING_KEYS)}")
        rated = {k: row[options.column(k)] for k in RATING_KEYS}
        if not table.typed:
            try:
                rated["rating"] = float(rated["rating"]) if "." in rated["rating"] or "e" in rated["rating"].lower() \
                    else int(rated["rating"])
            except ValueError:
                raise exits.SkillError(f"{at}: rating must be a finite number, got {rated['rating']!r}") from None
        group = row.get(options.column("group"))
        rated["group"] = None if group is None else str(group)
        out.append((rated, at))
    return out


# --- prompts --------------------------------------------------------------------------------------

def prompt_of(row: Any, options: Options, at: str) -> str:
    """A prompt table's row (a ``prompt`` column of text, or of messages ending with user) as text."""
    value = row.get(options.column("prompt")) if isinstance(row, dict) else None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        messages = check_messages(value, "prompt", at)
        check_roles(messages, [], "prompt", at)
        return render(messages, options.template) + options.template["generation"]
    name = options.column("prompt")
    got = "missing" if value is None else f"a {type(value).__name__}"
    raise exits.SkillError(f"{at}: the prompt column {name!r} is {got}: a prompt table has it on every row (text or "
                           "messages); pairs have chosen and rejected")


def read_prompts(path: str, key: str, options: Options | None = None, split: str | None = None,
                 split_key: str = "split", prefer: str = "train") -> tuple[list[str], list[str | None]]:
    """The prompts of ``path`` and, parallel to them, each one's group: ``(texts, groups)``.

    - a plain text file (any name but .jsonl, .json, .csv, .parquet, and not a folder): its
      non-empty lines, UTF-8 (a byte-order mark read), as ``train`` always took them;
    - a table (those kinds) with a ``prompt`` column and no ``chosen``: that column per row, text
      or messages (rendered with ``options.template`` and its ``generation``);
    - preference pairs of any layout (``pairs_of``): each pair's prompt, once (the first
      occurrence; a pair file repeats a prompt per pair), empty prompts left out.

    ``groups[i]`` is the ``group`` column's value (``options.columns`` renames it) as a string for
    prompt ``i``, None where a row has none or the file has no such column. Raises SkillError(2)
    naming ``key``, the file and the row; no prompt at all is an error."""
    texts, groups, _ = prompt_rows(path, key, options, split, split_key, prefer)
    return texts, groups


def prompt_rows(path: str, key: str, options: Options | None = None, split: str | None = None,
                split_key: str = "split", prefer: str = "train") -> tuple[list[str], list[str | None], list[str]]:
    """``read_prompts`` with a third list: each prompt's place (``config [prompts] file: FILE line
    3``), for the messages of a later check (its length in tokens)."""
    options = options or Options()
    table = tables.read_table(path, key, split, split_key, text_kind="text", prefer=prefer)
    if table.kind == "text":
        return list(table.rows), [None] * len(table.rows), [f"{key}: {table.at(i)}" for i in range(len(table.rows))]
    first = table.rows[0]
    if isinstance(first, dict) and _present(first, options.column("chosen")):
        pairs, _ = pairs_of(table, options, key)
        seen: dict[str, Pair] = {}
        for pair in pairs:
            if pair.prompt.strip() and pair.prompt not in seen:
                seen[pair.prompt] = pair
        if not seen:
            raise exits.SkillError(f"{key}: {table.label}: every pair's prompt is empty: no prompt to train on")
        return list(seen), [p.group for p in seen.values()], [p.place for p in seen.values()]
    texts, groups, places = [], [], []
    for i, row in enumerate(table.rows):
        at = f"{key}: {table.at(i)}"
        text = prompt_of(row, options, at)
        if text.strip():
            group = row.get(options.column("group"))
            texts.append(text)
            groups.append(None if group is None else str(group))
            places.append(at)
    if not texts:
        raise exits.SkillError(f"{key}: {table.label}: every prompt is empty")
    return texts, groups, places
