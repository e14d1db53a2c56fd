"""The run directory: its files, and writing them so that a crash or a kill never leaves a half file.

``DIR/metrics.jsonl``    one JSON object per round (metrics.ROW_KEYS), appended and flushed per round
``DIR/checkpoints/``     ``round-NNNNNN/`` folders (checkpoint.py), each complete or absent
``DIR/trackers/``        the trackers' own files (tensorboard events, wandb offline runs, ...)
``DIR/policy.pt``        a policy run's trained policy, a standalone PaLM state dict
                         (policy_optimization/run/export.py)
``DIR/rm.pt``            a reward-model run's trained reward model, a state dict (reward_modeling/artifacts.py)
``DIR/rm_config.json``   ... and what builds it: ``RewardModel(PaLM(**c["palm"]), **c["reward_model"])``
``DIR/summary.json``     the run's summary, written at its end
``DIR/run_config.json``  the run's config as loaded, the digests of the files it names, the run's id
                         and the options to resume with (``config.json`` before: still read)
``DIR/train.lock``       while a ``train`` or ``train-reward`` process writes the run: its exclusive lock (lock.py)

Anything in a run directory may come from elsewhere (copied, restored, received): every file is
opened without following a symbolic link and must be a plain file (``read_file``), and what it
holds is checked before it is used. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from skill_runtime import exits

METRICS, CHECKPOINTS, TRACKERS, POLICY, SUMMARY = "metrics.jsonl", "checkpoints", "trackers", "policy.pt", "summary.json"
RM, RM_CONFIG = "rm.pt", "rm_config.json"
RUN_FILES = (METRICS, CHECKPOINTS, TRACKERS, POLICY, RM, RM_CONFIG, SUMMARY)  # what --force removes, nothing else
LOCK = "train.lock"
CONFIG, OLD_CONFIG = "run_config.json", "config.json"  # the run's config; its name before (a user's clashed)
NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
MAX_JSON_BYTES = 64 * 2**20  # a run's JSON files (summary, config, run state) are KiB to a few MiB


def read_file(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of ``path``, a plain file of the run directory, or None when it is missing. Opened
    without following a symbolic link and without blocking (a named pipe). Raises SkillError(2)
    naming it when it is a link, not a plain file, unreadable, or larger than ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise exits.SkillError(f"{path}: {not_plain(path, err)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise exits.SkillError(f"{path}: {not_plain(path)}")
        if limit is not None and info.st_size > limit:
            raise exits.SkillError(f"{path}: {info.st_size:,} bytes, more than a run's file of this kind holds "
                                   f"({limit:,}): not this run's; move it away")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise exits.SkillError(f"{path}: cannot read it ({exits.one_line(err)})") from None
    finally:
        os.close(fd)


def not_plain(path: Path, err: OSError | None = None) -> str:
    """Why ``path`` is refused: a symbolic link or another kind of file than a plain one, with the fix."""
    if err is not None and err.errno != errno.ELOOP:
        return f"cannot open it ({exits.one_line(err)})"
    kind = "a symbolic link" if path.is_symlink() else "not a plain file"
    return (f"{kind}: a run directory's files are plain files that train writes (a copied or received "
            "directory?): remove it")


def read_json(path: Path) -> Any:
    """``path`` parsed as JSON (``read_file``), or None when missing. Raises SkillError(2) naming it
    when it is not JSON (damaged or edited)."""
    data = read_file(path, MAX_JSON_BYTES)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise exits.SkillError(f"{path}: not JSON ({exits.one_line(err)}): damaged or edited") from None


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def trackers(self) -> Path:
        return self.path / TRACKERS

    @property
    def policy(self) -> Path:
        return self.path / POLICY

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    def read_summary(self) -> dict[str, Any] | None:
        """The run's summary.json as JSON (written as the run ends), or None while there is none
        yet (a running run). Raises SkillError(2) when it is a link, not a plain file or not JSON;
        ``summary.read`` checks what it holds."""
        return read_json(self.summary)

    def read_config(self, resume: bool = True) -> tuple[dict[str, Any], Path] | None:
        """The stored run config (``CONFIG``; with ``resume`` also the older ``OLD_CONFIG``, a file
        a new run never touches) and its path, or None when none is there: ``{config: {section: {key: value}}, files: {key: sha256}}`` and, from
        this version on, ``run_id`` (a string) and ``options`` (``{flag: value}`` to resume with).
        Raises SkillError(2) naming the file when it is not one (damaged, edited, or a file of
        yours with that name)."""
        for path in (self.config, self.path / OLD_CONFIG)[:2 if resume else 1]:
            stored = read_json(path)
            if stored is None:
                continue
            problem = config_problem(stored)
            if problem:
                raise exits.SkillError(f"{path}: not a run config of palm-rlhf-skill train ({problem}): damaged, "
                                       "edited, or not this run's: restore it, or move it away and start over")
            return stored, path
        return None

    def holds_a_run(self) -> list[str]:
        """The run files already here (metrics.jsonl, checkpoints/, ...): another run's. A symbolic
        link of one of those names counts, whether or not it points anywhere."""
        return [name for name in RUN_FILES if os.path.lexists(self.path / name)]

    def links(self) -> list[str]:
        """The run files (``RUN_FILES``, ``CONFIG``) that are symbolic links: never train's own."""
        return [name for name in (*RUN_FILES, CONFIG) if (self.path / name).is_symlink()]


def config_problem(stored: Any) -> str | None:
    """What is wrong with a stored run config (``RunDir.read_config``), or None."""
    if not isinstance(stored, dict):
        return f"a JSON {type(stored).__name__}, not an object"
    if not isinstance(stored.get("config"), dict) or not all(isinstance(t, dict) for t in stored["config"].values()):
        return "its config is not a table of tables"
    files = stored.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return "its files are not file digests"
    if not isinstance(stored.get("run_id", ""), str) or not isinstance(stored.get("options", {}), dict):
        return "its run_id or options are not a string and an object"
    return None


def shape_problem(summary: Any, shape: dict[str, Any]) -> str | None:
    """The first way ``summary`` (a summary.json as read) is not of ``shape`` (key -> type or tuple
    of types; a bool is never a number), or None: a kind of run's shape check starts here."""
    if not isinstance(summary, dict):
        return f"a JSON {type(summary).__name__}, not an object"
    for key, kind in shape.items():
        value = summary.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{key} {value!r:.40} is not a {getattr(kind, '__name__', 'number')}"
    return None


def checked_summary(run: RunDir, run_id: str | None, problem: Callable[[Any], str | None],
                    helper: str) -> dict[str, Any] | None:
    """``run``'s summary.json checked by ``problem`` (a kind of run's shape check), and of run
    ``run_id`` when given, or None while there is none; its paths re-based (``rebased``) to where
    ``run`` is now (``keep_rebased`` writes them back). Raises
    SkillError(2) naming the file when it is a link, damaged, edited or another run's; ``helper``
    (``train``) names the command whose ``--resume`` writes it again."""
    summary = run.read_summary()
    if summary is None:
        return None
    wrong = problem(summary)
    if wrong is None and run_id and summary.get("run_id") and summary["run_id"] != run_id:
        wrong = f"run id {summary['run_id']}, this run's is {run_id}: another run's"
    if wrong:
        raise exits.SkillError(f"{run.summary}: not this run's summary ({wrong}): damaged, edited or copied; "
                               f"{helper} --resume {run.path} writes it again")
    return rebased(summary, run.path)


def keep_rebased(run: RunDir, summary: dict[str, Any]) -> None:
    """Write ``summary`` (``checked_summary``'s, re-based) to ``run``'s summary.json when the file
    still names another directory: what a ``--resume`` of a finished, copied or moved run does
    before it prints it."""
    if run.read_summary() != summary:
        write_atomic(run.summary, json.dumps(summary, indent=1, allow_nan=True))


def rebased(summary: dict[str, Any], path: Path) -> dict[str, Any]:
    """``summary`` with the run directory it was written in (its ``files.metrics``' folder) replaced
    by ``path`` in every string that names it (a file path, or a path inside a sentence such as
    ``next``), so a copied (``cp -r``) or moved run directory prints its own paths; its run id is
    kept. A summary without ``files.metrics`` is returned as it is."""
    import re
    metrics = (summary.get("files") or {}).get("metrics") if isinstance(summary.get("files"), dict) else None
    if not isinstance(metrics, str) or str(Path(metrics).parent) == str(path):
        return summary
    old = re.compile(re.escape(str(Path(metrics).parent)) + r"(?=$|[/\s,;:)'\"])")

    def move(value: Any) -> Any:
        if isinstance(value, str):
            return old.sub(lambda _: str(path), value)
        if isinstance(value, dict):
            return {key: move(v) for key, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        return value
    return move(summary)


def file_digests(named: list[tuple[str, str]]) -> dict[str, str]:
    """SHA-256 of each file of ``named`` (``(section.key, path)``, the files a config names) that
    exists: a resume with an edited program or data file is a changed run."""
    return {key: hashlib.sha256(Path(path).read_bytes()).hexdigest() for key, path in named if Path(path).is_file()}


def changed_keys(stored: dict[str, Any], now: dict[str, Any], growable: frozenset[str] = frozenset()) -> list[str]:
    """``section.key`` of every value that differs between two loaded configs (``{"config":
    tables, "files": file_digests}``: the run's stored one and the one given on resume), and
    ``section.key (file contents)`` for a named file that changed under the same name; the keys of
    ``growable`` may change (a run can be extended)."""
    def flat(config: dict[str, Any]) -> dict[str, Any]:
        return {f"{s}.{k}": v for s, table in config["config"].items() for k, v in table.items()}
    before, after = flat(stored), flat(now)
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and k not in growable)
    keys += sorted(f"{k} (file contents)" for k in stored["files"].keys() & now["files"].keys()
                   if stored["files"][k] != now["files"][k] and k not in keys)
    return keys


def check_resume_overrides(overrides: list[str] | None, growable: frozenset[str], run_dir: str | Path) -> None:
    """``--set SECTION.KEY=VALUE`` on a resume without --config, applied to the stored config: only
    the keys of ``growable`` (a run can be extended: ``[run] rounds``, ``[train] epochs``). Raises
    SkillError(2) naming the first other key."""
    for text in overrides or []:
        key = text.partition("=")[0].strip()
        if key not in growable:
            raise exits.SkillError(f"--resume {run_dir}: --set {key}: a resume may change only "
                                   f"{', '.join(sorted(growable))} (the run goes on); start over with --force to change more")


def row_line(row: dict[str, Any]) -> bytes:
    """A metrics row as the line metrics.jsonl holds (JSON, NaN allowed, newline-terminated)."""
    return (json.dumps(row, allow_nan=True) + "\n").encode("utf-8")


def append_row(run: RunDir, row: dict[str, Any]) -> None:
    """Append one metrics row as a JSON line: a reader (``watch``) sees it as soon as the round
    ends, and a kill of the process afterwards cannot lose it. Opened without following a link;
    a write the disk refuses leaves no partial line (the file is cut back to its old size). Rows are
    not fsynced: a checkpoint carries the rows it covers (``checkpoint.save``), so a machine that
    loses power loses at most rows after the last checkpoint, which a resume recomputes.
    Raises OSError when the disk refuses the row, SkillError(2) when metrics.jsonl is not a plain file."""
    fd = os.open(run.metrics, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NO_FOLLOW, 0o666)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise exits.SkillError(f"{run.metrics}: {not_plain(run.metrics)}")
        data = row_line(row)
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, info.st_size)
            raise
    finally:
        os.close(fd)


def append_row_or_refuse(run: RunDir, row: dict[str, Any]) -> None:
    """``append_row``, a disk that refuses the row as SkillError(2) with the fix."""
    try:
        append_row(run, row)
    except OSError as err:
        raise exits.SkillError(f"writing round {row['round']} to {run.metrics} failed ({exits.one_line(err)}): free "
                               "space there, then resume") from None


def parse_rows(data: bytes | None, path: Path,
               parse: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a metrics file's bytes (``data``, None: no file) in order, up to the first line
    that is not a metrics row, and what is wrong with that line (None when every line is one). A
    row is a JSON object whose ``round`` is an integer from 0, above the round before it, and that
    ``parse`` (``metrics.parse_row``: the values' types; it returns the row with every key) accepts.
    A last line without its newline (the writer was killed mid-write) is left out silently."""
    if not data:
        return [], None
    lines = data.split(b"\n")[:-1]  # the part after the last newline: a row that never finished writing
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            return rows, f"{path}: line {number} is not JSON ({exits.one_line(err)})"
        problem = None
        if not isinstance(row, dict):
            problem = f"is a JSON {type(row).__name__}, not a metrics row (an object)"
        elif type(row.get("round")) is not int or row["round"] < 0:
            problem = f"has round {row.get('round')!r}, not a round number (an integer from 0)"
        elif rows and row["round"] <= rows[-1]["round"]:
            problem = f"has round {row['round']} after round {rows[-1]['round']} (rows out of order)"
        elif parse is not None:
            try:
                row = parse(row)
            except ValueError as err:
                problem = str(err)
        if problem:
            return rows, f"{path}: line {number} {problem}"
        rows.append(row)
    return rows, None


def read_rows(path: Path, parse: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every row of a metrics file (``parse_rows``; read as ``read_file`` reads). Raises
    SkillError(2) naming the first line that is not a metrics row, or a file that is a link."""
    rows, problem = parse_rows(read_file(path), path, parse)
    if problem:
        raise exits.SkillError(f"{problem}: the file was edited or damaged; the run's own rows are in its checkpoints "
                               "(train --resume restores those)")
    return rows


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename:
    readers see the old file or the new one, never a half-written one (a link at ``path`` is
    replaced, never followed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it 0600; a run's files are plain files
        with os.fdopen(fd, "wb") as stream:
            stream.write(text.encode("utf-8") if isinstance(text, str) else text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def write_torch_atomic(state: Any, path: Path) -> Path:
    """``torch.save(state, path)`` through a temporary file in the same folder and a rename (a
    policy.pt, an rm.pt): a reader never loads a half-written file. Returns ``path``."""
    import torch
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return path


def current_umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def unlink_quietly(path: str | Path) -> None:
    """Remove ``path`` if it is there (a temporary file left by a failed write)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_rows(run: RunDir, rows: list[dict[str, Any]]) -> None:
    """Rewrite metrics.jsonl with exactly ``rows`` (atomically): on resume, the rows through the
    checkpoint; rows written after it are replaced by the rerun, not doubled."""
    write_atomic(run.metrics, b"".join(row_line(row) for row in rows))
