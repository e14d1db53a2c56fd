"""A data file or folder as rows: each row as the file holds it (a dict for a table, a str for a
line of text) with its place, so every message names the file and the row.

The kind follows from the path: a folder is a ``datasets`` ``save_to_disk`` folder
(``datasets.load_from_disk``: a ``Dataset``, or a ``DatasetDict`` of splits); ``.jsonl`` JSON
Lines; ``.json`` a JSON array of objects, an object of equal-length columns, or JSON Lines (as
``datasets``' json loader reads either); ``.csv`` comma-separated with a header row (values are
strings); ``.parquet`` Parquet (``pyarrow.parquet.read_table``); any other name JSON Lines for
data and plain text for prompts (``text_kind``). JSON, JSON Lines, CSV and text are read with the
standard library; Parquet and folders need the ``[hf]`` extra (``HF_EXTRA``), and without it exit 2
naming it. Nothing is written anywhere: ``load_from_disk`` memory-maps the folder's Arrow files,
no ``load_dataset``, no cache.

Text is UTF-8: a byte-order mark at the start (what several editors and spreadsheet exports
write) is read and dropped; UTF-16 or UTF-32 (by their byte-order mark, or the NUL bytes of
UTF-16 without one) and bytes that are not UTF-8 are refused naming the encoding and the line.
Torch-free.
"""
from __future__ import annotations

import codecs
import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skill_runtime import exits

HF_EXTRA = "pip install 'palm-rlhf-skill[hf]'"  # datasets and pyarrow (pyproject.toml [project.optional-dependencies])
KINDS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
# a folder written by Dataset.save_to_disk holds state.json, one by DatasetDict.save_to_disk dataset_dict.json
DATASETS_MARKERS = ("dataset_dict.json", "state.json")
BOMS = ((codecs.BOM_UTF32_LE, "UTF-32 LE"), (codecs.BOM_UTF32_BE, "UTF-32 BE"), (codecs.BOM_UTF16_LE, "UTF-16 LE"),
        (codecs.BOM_UTF16_BE, "UTF-16 BE"))  # UTF-32 first: its LE mark begins with UTF-16 LE's


@dataclass
class Table:
    """Rows of one file: ``rows[i]`` as read (a dict per table row; a str per text line),
    ``places[i]`` where it is (``line 3``: JSON Lines, CSV, text; ``row 3``: JSON arrays, Parquet,
    a datasets split, counted from 1), ``kind`` (jsonl, json, csv, parquet, datasets, text),
    ``columns`` (the header, schema or keys seen), ``typed`` (False for CSV: every value a
    string), ``label`` (the path, with the split of a datasets folder)."""
    path: str
    kind: str
    rows: list[Any] = field(default_factory=list)
    places: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    typed: bool = True
    label: str = ""

    def at(self, index: int) -> str:
        """``FILE line 3``: where row ``index`` is, for a message."""
        return f"{self.label or self.path} {self.places[index]}"


def must_exist(where: str, path: str) -> None:
    """SkillError(2) after ``where`` (the config key) when ``path`` is neither a file nor a folder
    (a datasets folder is read whole; what it holds is checked when it is read)."""
    if not Path(path).exists():
        raise exits.SkillError(f"{where}: {path}: no such file or datasets folder")


def kind_of(path: str | Path, text_kind: str = "jsonl") -> str:
    """The reader a path takes: ``datasets`` for a folder, else by its suffix (KINDS), else
    ``text_kind`` (``jsonl`` for data, ``text`` for prompts)."""
    path = Path(path)
    if path.is_dir():
        return "datasets"
    return KINDS.get(path.suffix.lower(), text_kind)


def decoded(data: bytes, where: str) -> str:
    """``data`` as text: UTF-8, a UTF-8 byte-order mark dropped. Raises SkillError(2) after
    ``where`` (the key and the file) naming UTF-16/UTF-32 (byte-order mark, or NUL bytes) or the
    first byte that is not UTF-8 with its line."""
    for bom, name in BOMS:
        if data.startswith(bom):
            raise exits.SkillError(f"{where}: encoded as {name} (its byte-order mark): save it as UTF-8 "
                                   f"(iconv -f {name.split()[0]} -t UTF-8)")
    if data.count(b"\0") > len(data) // 4 > 0:  # ASCII text as UTF-16 without a mark: every other byte 0
        name = "UTF-16 LE" if data[1:2] == b"\0" else "UTF-16 BE"
        raise exits.SkillError(f"{where}: encoded as {name} without a byte-order mark (every other byte is 0): "
                               f"save it as UTF-8 (iconv -f {name.replace(' ', '')} -t UTF-8)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        byte = data[exc.start]
        guess = " (Latin-1 or Windows-1252, by the look of it)" if 0x80 <= byte <= 0xFF else ""
        raise exits.SkillError(f"{where}: not UTF-8: byte 0x{byte:02x} at line {line}{guess}: save it as UTF-8 "
                               "(iconv -f LATIN1 -t UTF-8 for Latin-1)") from None


def read_text(path: str | Path, where: str) -> str:
    """The file's text (``decoded``). Raises SkillError(2) naming ``where`` when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise exits.SkillError(f"{where}: cannot read it: {exits.one_line(exc)}") from None
    return decoded(data, where)


def read_table(path: str, key: str, split: str | None = None, split_key: str = "split",
               text_kind: str = "jsonl", prefer: str = "train") -> Table:
    """The rows of ``path`` (a file or a datasets folder, ``kind_of``). ``key`` names the config
    key in messages (``config [data] pairs``); ``split`` picks a split of a datasets folder of
    several (``split_key`` names its option); without one, its only split, else the split named
    ``prefer`` (``train`` for training data, ``test`` for held-out rows). Raises SkillError(2):
    unreadable, not of its kind, damaged, no rows, a split missing, or the ``[hf]`` extra missing
    for Parquet or a folder."""
    kind = kind_of(path, text_kind)
    where = f"{key}: {path}"
    table = {"datasets": _datasets, "parquet": _parquet, "csv": _csv, "json": _json, "jsonl": _jsonl,
             "text": _text}[kind](path, where, split, (split_key, prefer))
    table.label = table.label or path
    if not table.rows:
        raise exits.SkillError(f"{where}: no non-empty line" if kind == "text" else f"{where}: no rows")
    return table


def read_lines(path: str, key: str) -> list[str]:
    """The non-empty lines of a text file, whatever its name (``decoded``: UTF-8, a byte-order mark
    dropped). Raises SkillError(2) naming ``key`` and the file: unreadable, another encoding, no
    non-empty line."""
    table = _text(path, f"{key}: {path}", None, None)
    if not table.rows:
        raise exits.SkillError(f"{key}: {path}: no non-empty line")
    return list(table.rows)


def _text(path: str, where: str, split, split_key) -> Table:
    table = Table(path, "text", typed=False)
    for number, line in enumerate(read_text(path, where).splitlines(), 1):
        if line.strip():
            table.rows.append(line)
            table.places.append(f"line {number}")
    return table


def _jsonl(path: str, where: str, split, split_key) -> Table:
    table = Table(path, "jsonl")
    for number, line in enumerate(read_text(path, where).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise exits.SkillError(f"{where} line {number}: not JSON ({exc.msg}): one object per line") from None
        table.rows.append(row)
        table.places.append(f"line {number}")
    table.columns = _keys(table.rows)
    return table


def _json(path: str, where: str, split, split_key) -> Table:
    text = read_text(path, where)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # JSON Lines in a .json file: datasets' json loader reads it so too
            return _jsonl(path, where, split, split_key)
        raise exits.SkillError(f"{where}: not JSON ({exc.msg} at line {exc.lineno}): a JSON array of objects, "
                               "or JSON Lines") from None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise exits.SkillError(f"{where}: an object of columns of different lengths "
                                   f"({', '.join(f'{k}: {len(v)}' for k, v in data.items())})")
        rows = [dict(zip(data, values)) for values in zip(*data.values())]
    elif isinstance(data, list):
        rows = data
    else:
        raise exits.SkillError(f"{where}: a JSON {type(data).__name__}: a JSON array of objects (or an object of "
                               "equal-length columns) expected")
    table = Table(path, "json", rows, [f"row {i}" for i in range(1, len(rows) + 1)])
    table.columns = _keys(rows)
    return table


def _csv(path: str, where: str, split, split_key) -> Table:
    text = read_text(path, where)
    reader = csv.DictReader(io.StringIO(text, newline=""), restkey="\0extra")
    table = Table(path, "csv", typed=False)
    try:
        table.columns = list(reader.fieldnames or [])
        start = 2
        for row in reader:
            place = f"line {start}"
            start = reader.line_num + 1
            if not any((v or "").strip() for k, v in row.items() if k != "\0extra"):
                continue  # a blank line
            if "\0extra" in row or None in row.values():
                count = sum(v is not None for k, v in row.items() if k != "\0extra") + len(row.get("\0extra", []))
                raise exits.SkillError(f"{where} {place}: {count} fields, the header has {len(table.columns)} "
                                       f"({', '.join(table.columns)}): quote a field that holds a comma")
            table.rows.append(row)
            table.places.append(place)
    except csv.Error as exc:
        raise exits.SkillError(f"{where} line {reader.line_num}: not CSV ({exc})") from None
    return table


def _needs_hf(module: str, where: str) -> exits.SkillError:
    """The one-line error for a Parquet file or datasets folder read without the [hf] extra."""
    return exits.SkillError(f"{where}: reading it needs {module}: {HF_EXTRA}")


def _parquet(path: str, where: str, split, split_key) -> Table:
    try:
        import pyarrow
        import pyarrow.parquet as parquet
    except ImportError:
        raise _needs_hf("pyarrow", where) from None
    try:
        data = parquet.read_table(path)
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        raise exits.SkillError(f"{where}: not a readable Parquet file ({exits.one_line(exc)}): damaged or "
                               "truncated? write it again") from None
    rows = data.to_pylist()
    return Table(path, "parquet", rows, [f"row {i}" for i in range(1, len(rows) + 1)], list(data.column_names))


def _datasets(path: str, where: str, split: str | None, option: tuple[str, str]) -> Table:
    folder = Path(path)
    if not any((folder / name).is_file() for name in DATASETS_MARKERS):
        raise exits.SkillError(f"{where}: a folder without {' or '.join(DATASETS_MARKERS)}: not a datasets "
                               "save_to_disk folder (give a file, or the folder save_to_disk wrote)")
    try:
        import datasets
    except ImportError:
        raise _needs_hf("datasets", where) from None
    datasets.disable_progress_bars()
    try:
        data = datasets.load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 - a damaged folder: one line
        raise exits.SkillError(f"{where}: not a readable datasets folder ({exits.one_line(exc)}): damaged? "
                               "save it again") from None
    label = path
    if isinstance(data, datasets.DatasetDict):
        names, (split_key, prefer) = list(data), option
        chosen = split if split is not None else names[0] if len(names) == 1 else prefer
        if chosen not in data:
            got = f"no split {chosen!r}" + ("" if split is not None else f" (the default of {split_key})")
            raise exits.SkillError(f"{where}: {got}; its splits are {', '.join(names)}: set {split_key} to one")
        data, label = data[chosen], f"{path} (split {chosen})"
    try:
        rows = data.to_list()
    except Exception as exc:  # noqa: BLE001 - an Arrow file cut short: one line
        raise exits.SkillError(f"{where}: its data cannot be read ({exits.one_line(exc)}): damaged? save it again") \
            from None
    return Table(path, "datasets", rows, [f"row {i}" for i in range(1, len(rows) + 1)], list(data.column_names),
                 label=label)


def _keys(rows: list[Any]) -> list[str]:
    """The keys of the object rows, in the order first seen."""
    seen: dict[str, None] = {}
    for row in rows:
        if isinstance(row, dict):
            seen.update(dict.fromkeys(row))
    return list(seen)
