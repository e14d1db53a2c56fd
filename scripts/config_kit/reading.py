"""Reading a run's config: a TOML (or JSON, by its ``.json`` suffix) file or standard input as a
table of tables (``read_config``), ``--set SECTION.KEY=VALUE`` overrides (``apply_override``),
the file paths it names made absolute against the config file's folder (``absolute``), and
``Form``: one kind of run's config (its sections, its structure check, its path and program
keys), loaded from a file or from the copy a run directory stored.

Torch-free. Every bad input is one line, ``SkillError`` exit 2, naming the key or the file.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from skill_runtime import exits

MAX_CONFIG_BYTES = 2**20  # 1 MiB: a config is a few KiB; /dev/zero or a stray dump is refused


def from_stdin(path: str) -> bool:
    """Whether ``--config path`` names standard input: ``-`` or /dev/stdin."""
    return path in ("-", "/dev/stdin")


def read_config(path: str, shipped: Path) -> dict[str, Any]:
    """Parse ``path``: JSON when it ends in .json, else TOML; ``-`` or /dev/stdin is standard input
    (TOML). At most ``MAX_CONFIG_BYTES`` + 1 bytes are read. A named pipe (FIFO) or socket would
    block until a writer opens it: refused, except a descriptor this process already holds
    (/dev/fd/N, as ``<(...)`` gives); a device such as /dev/zero is read up to the cap, then
    refused as too large.
    Raises SkillError(2) when it cannot be read, is a FIFO or socket, is a terminal on standard
    input, is larger than the cap, cannot be parsed, or is not a table of tables; a missing file's
    error names ``shipped``, the folder of the shipped configs."""
    import stat
    import sys
    stdin = from_stdin(path)
    file = Path(path)
    try:
        inherited = path.startswith(("/dev/fd/", "/proc/self/fd/"))  # a descriptor already open: <(...)
        if not stdin and not inherited:
            mode = file.stat().st_mode
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                raise exits.SkillError(f"config {path}: a named pipe or socket, which blocks until a writer opens "
                                       "it: pass a regular file, or pipe the config into --config -")
        if stdin and sys.stdin.isatty():
            raise exits.SkillError(f"config {path}: standard input is a terminal: pipe the config in "
                                   "(--config - < run.toml) or pass its file")
        if stdin:
            data = sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)
        else:
            with file.open("rb") as stream:
                data = stream.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise exits.SkillError(f"config {path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, the most a config "
                                   "may be (a config is a few KiB): pass the TOML or JSON config file")
        text = data.decode("utf-8-sig")  # a byte-order mark, as some editors write, is not part of the TOML
    except (OSError, UnicodeDecodeError) as exc:
        hint = f" (the shipped configs are in {shipped})" if isinstance(exc, FileNotFoundError) else ""
        raise exits.SkillError(f"config {path}: cannot read it: {exits.one_line(exc)}{hint}") from None
    if file.suffix.lower() == ".json":
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise exits.SkillError(f"config {path}: not valid JSON: {exc}") from None
    else:
        import tomllib as toml
        try:
            config = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            raise exits.SkillError(f"config {path}: not valid TOML: {exc}") from None
    if not isinstance(config, dict):
        raise exits.SkillError(f"config {path}: the top level must be a table of [palm], [trainer], ... tables")
    return config


def apply_override(config: dict[str, Any], text: str, sections: tuple[str, ...]) -> None:
    """Apply ``--set SECTION.KEY=VALUE`` (SECTION one of ``sections``, the run's); VALUE is read as
    JSON (numbers, true/false, "text", [1, 2]), else kept as a string; ``null`` removes the key
    (the default applies again). Raises SkillError(2) for a malformed override."""
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key or section not in sections:
        raise exits.SkillError(f"--set {text!r}: expected SECTION.KEY=VALUE with SECTION one of {', '.join(sections)}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw.strip()
    table = config.setdefault(section, {})
    if not isinstance(table, dict):
        raise exits.SkillError(f"config [{section}]: must be a table")
    if value is None:  # null: unset it, so the default applies (or [prompts] file replaces count)
        table.pop(key.strip(), None)
    else:
        table[key.strip()] = value


def absolute(value: str, base: Path, program: bool) -> str:
    """``value`` (a path, or ``file.py:callable`` when ``program``) with its path made absolute
    against ``base``."""
    file, sep, name = value.rpartition(":") if program else (value, "", "")
    return str((base / Path(file).expanduser()).resolve()) + sep + name


def program_syntax(value: str) -> bool:
    """Whether ``value`` has the form ``file.py:callable`` (a file part, an identifier after the last colon)."""
    file, sep, name = value.rpartition(":")
    return bool(sep and file and name.isidentifier())


def type_name(value: Any) -> str:
    """The TOML word for ``value``'s type (``integer``, ``table``...), as the errors name it."""
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "table", type(None): "null"}.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class Form:
    """One kind of run's config: ``sections`` (what ``--set`` may name), ``check`` (its structure
    check, torch-free; raises SkillError(2)), ``path_keys`` ((section, key) naming a file, made
    absolute), ``program_keys`` (those of them that are ``"file.py:callable"``) and ``shipped``
    (the folder of the shipped configs, named when a file is missing)."""
    sections: tuple[str, ...]
    check: Callable[[dict[str, Any]], None]
    path_keys: tuple[tuple[str, str], ...]
    program_keys: tuple[tuple[str, str], ...]
    shipped: Path

    def load(self, path: str, overrides: list[str] | None = None, shipped: Path | None = None) -> dict[str, Any]:
        """``read_config`` (``shipped``, default the form's: the folder a missing file's message
        names), the overrides, ``check``, then every file path made absolute (relative to the
        config file's folder; for standard input the current directory). Torch-free. Returns the
        config (a dict of tables). Raises SkillError(2)."""
        config = read_config(path, shipped or self.shipped)
        for text in overrides or []:
            apply_override(config, text, self.sections)
        self.check(config)
        base = Path.cwd() if from_stdin(path) else Path(path).resolve().parent
        for section, key in self.path_keys:
            if key in config.get(section, {}):
                config[section][key] = absolute(config[section][key], base, (section, key) in self.program_keys)
        return config

    def stored(self, config: dict[str, Any], overrides: list[str] | None, where: Path) -> dict[str, Any]:
        """A copy of the config a run directory stored (``where``: its file), checked, with the
        overrides of a ``--resume`` applied and checked again. Raises SkillError(2): the stored
        one fails ``check`` (damaged or edited), or an override is malformed or fails it."""
        config = copy.deepcopy(config)
        try:
            self.check(config)
        except exits.SkillError as err:
            raise exits.SkillError(f"{where}: {err}: damaged or edited; resume with --config FILE (the run's own)") \
                from None
        for text in overrides or []:  # what extends the run ([run] rounds, [train] epochs)
            apply_override(config, text, self.sections)
        self.check(config)
        return config
