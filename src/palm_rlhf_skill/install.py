"""``palm-rlhf-skill install | uninstall | list``: put the skill tree where coding agents look.

The installed package carries the skill tree (root ``SKILL.md``, ``sub-skills/``, ``references/``,
``scripts/``, ``LICENSE``); ``install`` copies it into ``<skills dir>/palm-rlhf-pytorch/``, the
folder named after the skill as the Agent Skills spec requires. Skills directories:

    claude   .claude/skills   (Claude Code)
    agents   .agents/skills   (the cross-client location other agents read)
    PATH     that directory   (a value with a path separator, or starting with '.' or '~')

``--scope project`` (default) puts claude and agents under the current directory, ``--scope user``
under the home directory. A PATH is taken as written: a relative one from the current directory
(``--scope user`` with one is a usage error: write ``~/PATH``), ``~`` expanded. The copy is self-sufficient: its scripts
import the runtime ``scripts/skill_runtime/`` and need only palm-rlhf-pytorch, not this package.
Nothing here imports torch.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from palm_rlhf_skill import skill_root

import palm_rlhf_skill.runtime  # noqa: F401  (puts the installed skill tree's scripts/ on sys.path)
from skill_runtime import exits, options, runner  # noqa: E402

SKILL_ITEMS = ("SKILL.md", "LICENSE", "references", "scripts", "sub-skills")
TARGETS = {"claude": Path(".claude") / "skills", "agents": Path(".agents") / "skills"}
SCOPES = ("project", "user")

EXIT_DONE = 0      # installed, replaced, already identical, removed, nothing to remove, listed
EXIT_REFUSED = 1   # a different copy is in the way (install) or there (uninstall), or the folder is not this skill
EXIT_USAGE = 2     # bad arguments, unknown target, or a destination that cannot be written

TARGET_HELP = ("claude (.claude/skills), agents (.agents/skills), or a skills directory PATH "
               "(contains a path separator or starts with '.' or '~'); default: claude")
SCOPE_HELP = ("base of the claude and agents skills directories: project = current directory (default), "
              "user = home; a relative PATH is always from the current directory")


def skill_name(tree: Path) -> str:
    """The ``name`` in ``tree/SKILL.md``'s frontmatter (the folder the copy goes into).

    Raises SkillError(exit 2) when the file or the field is missing.
    """
    try:
        text = (tree / "SKILL.md").read_text(encoding="utf-8")
    except OSError as err:
        raise exits.SkillError(f"cannot read {tree / 'SKILL.md'}: {err.strerror}") from None
    front = re.match(r"---\r?\n(.*?)\r?\n---", text, re.DOTALL)
    name = re.search(r"^name:\s*['\"]?([^'\"\s]+)", front.group(1), re.MULTILINE) if front else None
    if name is None:
        raise exits.SkillError(f"{tree / 'SKILL.md'} has no frontmatter 'name'")
    return name.group(1)


def skills_dir(target: str, scope: str) -> Path:
    """The skills directory for ``--target`` and ``--scope`` (absolute; not created).

    A PATH is taken as written (relative: from the current directory; ``~`` expanded).
    Raises SkillError(exit 2) for a target that is neither claude, agents nor a path, for the user
    scope with a relative PATH (which of the two bases was meant is unclear), and when the user
    scope is asked for but no home directory is known.
    """
    separators = [sep for sep in (os.sep, os.altsep) if sep]
    is_path = target not in TARGETS and (any(sep in target for sep in separators) or target.startswith((".", "~")))
    if is_path and scope == "user" and not Path(target).expanduser().is_absolute():
        raise exits.SkillError(f"--scope user with the relative path {target}: a PATH is taken from the current "
                            f"directory; write ~/{target.removeprefix('./')} for one under your home, or drop --scope")
    try:
        base = Path.home() if scope == "user" else Path.cwd()
    except (RuntimeError, KeyError):
        raise exits.SkillError("--scope user: no home directory (set HOME)") from None
    if scope == "user" and not base.is_dir():
        raise exits.SkillError(f"--scope user: home directory {base} does not exist (set HOME)")
    if target in TARGETS:
        path = base / TARGETS[target]
    elif is_path:
        path = Path(target).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
    else:
        raise exits.SkillError(f"unknown target {target!r}: use claude, agents, or a skills "
                            f"directory path such as ./{target}")
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise exits.SkillError(f"{blocker} is a file, not a directory: choose a skills directory path")
    return path


def is_copy(dest: Path, name: str) -> bool:
    """Whether ``dest`` holds a copy of the skill ``name``: a folder whose SKILL.md names it. The
    one test ``install --force`` and ``uninstall`` apply before they delete anything there."""
    try:
        return dest.is_dir() and skill_name(dest) == name
    except exits.SkillError:  # no SKILL.md, or no name in it
        return False


def not_a_copy(dest: Path, name: str) -> exits.SkillError:
    """The refusal (exit 1) for a ``dest`` that is not a copy of the skill: never deleted."""
    what = "a folder whose SKILL.md does not name it" if dest.is_dir() else "a file"
    return exits.SkillError(f"{dest} is not a copy of the {name} skill ({what}): choose another --target, or "
                         "remove it by hand if you mean to", EXIT_REFUSED)


def _ignored(relative: Path) -> bool:
    """Byte-code caches are never copied nor compared (running a script writes them)."""
    return "__pycache__" in relative.parts or relative.suffix == ".pyc"


def tree_files(root: Path, items: tuple[str, ...] | None = None) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every file under ``root`` (only ``items`` when given),
    skipping ``__pycache__`` and ``*.pyc``; items that do not exist are skipped."""
    tops = [root / item for item in items] if items else [root]
    files: dict[str, str] = {}
    for top in tops:
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            relative = path.relative_to(root)
            if path.is_file() and not _ignored(relative):
                files[relative.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def describe_difference(wanted: dict[str, str], found: dict[str, str]) -> str:
    """A short account of how an installed copy differs from this package's tree."""
    changed = sum(1 for name in wanted.keys() & found.keys() if wanted[name] != found[name])
    missing, extra = len(wanted.keys() - found.keys()), len(found.keys() - wanted.keys())
    return f"{changed} changed, {missing} missing, {extra} extra file(s)"


def _copy_tree(source: Path, staging: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for item in SKILL_ITEMS:
        path = source / item
        if path.is_dir():
            shutil.copytree(path, staging / item, ignore=ignore)
        elif path.is_file():
            shutil.copy2(path, staging / item)


# What os.replace raises when another process changed the destination between our look and our
# rename: it now holds a copy (ENOTEMPTY, EEXIST), is a file (ENOTDIR), or was moved away (ENOENT).
RACE_ERRNOS = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.ENOENT)
ATTEMPTS = 10


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells the folder (or file) at ``path`` from another put there later: its lstat
    (device, inode, ctime in ns; a rename changes the ctime), None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def _look(dest: Path, name: str, wanted: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """What is at ``dest``: ``(state, its files)`` with state ``absent``, ``up-to-date`` (a folder,
    or a symlink to one, with exactly ``wanted``'s files: what ``list`` says), ``different`` (another
    copy of the skill ``name``) or ``not-a-copy`` (``is_copy`` is False). None when another process
    removed, moved or replaced ``dest`` while this look read it (an uninstall or install running
    at once): then the files read are a mixture and the state untrue, so look again. An OSError
    reading a ``dest`` that stayed the same is raised."""
    before = _identity(dest)
    try:
        if before is None:
            look = "absent", {}
        elif not is_copy(dest, name):
            look = "not-a-copy", {}
        else:
            found = tree_files(dest)
            look = ("up-to-date" if found == wanted else "different"), found
    except OSError:
        if _identity(dest) == before:
            raise
        return None
    return look if _identity(dest) == before else None


def _changing(dest: Path, command: str) -> exits.SkillError:
    """The message (exit 2) when ``dest`` changed under every one of ``ATTEMPTS`` looks."""
    return exits.SkillError(f"{dest} changed while this {command} looked at it, {ATTEMPTS} times (other installs or "
                            f"uninstalls at work there): run it again when they are done")


def _place(staging: Path, dest: Path, replace: bool) -> None:
    """Rename ``staging`` into ``dest``; with ``replace``, move the copy there aside first and
    remove it afterwards. Raises OSError, with one of RACE_ERRNOS when another process changed
    ``dest`` meanwhile."""
    if not replace:
        os.replace(staging, dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}-old-", dir=dest.parent))
    try:
        os.replace(dest, old / dest.name)
        os.replace(staging, dest)
    finally:
        shutil.rmtree(old, ignore_errors=True)


def install(target: str, scope: str, force: bool) -> tuple[str, Path, int]:
    """Copy the packaged skill tree into ``<skills dir>/<skill name>``.

    Returns ``(outcome, destination, file count)`` with outcome ``installed``, ``replaced`` or
    ``up-to-date`` (an identical copy is left alone). The new copy is assembled in a hidden
    sibling folder and renamed into place, so a failed copy never leaves half a skill behind. When
    another install places its copy between this one's look and its rename, or an uninstall or
    install changes the destination while this one looks at it (``_look``), it looks again (up to
    ``ATTEMPTS`` times), so identical concurrent installs all end ``installed`` or ``up-to-date``,
    also while uninstalls of the same copy run.
    Raises SkillError: exit 1 when a different copy is in the way and ``force`` is False, and
    whatever ``force`` when the folder or file in the way is not a copy of this skill (``is_copy``:
    nothing but a copy is ever deleted); exit 2 for a bad target or a destination that cannot be
    written.
    """
    source = skill_root()
    name = skill_name(source)
    dest = skills_dir(target, scope) / name
    wanted = tree_files(source, SKILL_ITEMS)
    staging, attempt = None, 0
    try:
        while True:
            attempt += 1
            look = _look(dest, name, wanted)
            if look is None:  # an uninstall or install changed dest while this one looked
                if attempt < ATTEMPTS:
                    continue
                raise _changing(dest, "install")
            state, found = look
            exists = state != "absent"
            if state == "up-to-date":
                return "up-to-date", dest, len(wanted)
            if state == "not-a-copy":
                raise not_a_copy(dest, name)
            if state == "different" and not force:
                raise exits.SkillError(f"{dest} already holds a different copy "
                                    f"({describe_difference(wanted, found)}): pass --force to "
                                    "replace it", EXIT_REFUSED)
            if staging is None:
                dest.parent.mkdir(parents=True, exist_ok=True)
                staging = Path(tempfile.mkdtemp(prefix=f".{name}-new-", dir=dest.parent))
                _copy_tree(source, staging)
                umask = os.umask(0)
                os.umask(umask)
                staging.chmod(0o777 & ~umask)  # mkdtemp makes it private (0700); a skill folder is not
            try:
                _place(staging, dest, replace=exists)
            except OSError as err:
                if err.errno in RACE_ERRNOS and attempt < ATTEMPTS:
                    continue  # another installer got there first: look again
                raise
            staging = None
            return ("replaced" if exists else "installed"), dest, len(wanted)
    except OSError as err:
        where = err.filename or dest
        raise exits.SkillError(f"cannot write {where}: {err.strerror or err}") from None
    finally:
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def uninstall(target: str, scope: str, force: bool = False) -> tuple[Path, bool]:
    """Remove ``<skills dir>/<skill name>``; return ``(that path, whether it was removed)``, False
    when nothing was there (uninstalling twice is not an error, as installing twice is not).

    A copy that differs from this package's tree (edited, or another version) is removed only with
    ``force``, as install replaces one only with it: else SkillError exit 1.

    For the standard targets, the ``skills`` folder and its ``.claude`` or ``.agents`` parent are
    removed too when this left them empty. Refuses (SkillError exit 1) when the folder is not a
    copy of this skill (``is_copy``), so a mistyped PATH never deletes someone else's files. The
    copy is first renamed into a private folder beside it (atomic), then deleted: of concurrent
    uninstalls exactly one removes it and the others find nothing there; one that looks while
    another process changes the folder looks again (``_look``).
    """
    source = skill_root()
    name = skill_name(source)
    dest = skills_dir(target, scope) / name
    wanted = tree_files(source, SKILL_ITEMS)
    for _ in range(ATTEMPTS):
        try:
            look = _look(dest, name, wanted)  # None: another uninstall or install changed dest meanwhile
        except OSError as err:
            raise exits.SkillError(f"cannot read {err.filename or dest}: {err.strerror or err}") from None
        if look is not None:
            break
    else:
        raise _changing(dest, "uninstall")
    state, found = look
    if state == "absent":
        return dest, False
    if state == "not-a-copy":
        raise not_a_copy(dest, name)
    if state == "different" and not force:
        raise exits.SkillError(f"{dest} differs from this package's copy ({describe_difference(wanted, found)}"
                            "): edits there would be lost; pass --force to remove it", EXIT_REFUSED)
    try:
        old = Path(tempfile.mkdtemp(prefix=f".{name}-old-", dir=dest.parent))
        try:
            os.replace(dest, old / name)  # atomic: of concurrent uninstalls, one takes it
        except FileNotFoundError:  # another uninstall took it first
            return dest, False
        finally:
            shutil.rmtree(old)  # with the copy it took, if it took it
    except OSError as err:
        raise exits.SkillError(f"cannot remove {err.filename or dest}: {err.strerror or err}") from None
    if target in TARGETS:  # the .claude/skills (or .agents/skills) that install created, if now empty
        for folder in (dest.parent, dest.parent.parent):
            try:
                folder.rmdir()
            except OSError:  # not empty (other skills, settings), or already gone
                break
    return dest, True


def status(dest: Path, wanted: dict[str, str]) -> str:
    """``up-to-date``, ``different`` or ``absent``: how ``dest`` compares with this package."""
    if not (dest.exists() or dest.is_symlink()):
        return "absent"
    return "up-to-date" if dest.is_dir() and tree_files(dest) == wanted else "different"


def locations(target: str | None, scope: str | None) -> list[tuple[str, str, Path]]:
    """``(target, scope, skills dir)`` for ``list``: the ones asked for, by default all four
    standard places (claude and agents, project and user); a PATH target is one place."""
    targets = [target] if target else list(TARGETS)
    return [(t, s, skills_dir(t, s)) for t in targets
            for s in ([scope] if scope else list(SCOPES) if t in TARGETS else ["project"])]


def _parser(command: str, description: str, epilog: str):
    return options.OneLineParser(prog=f"palm-rlhf-skill {command}", description=description,
                            epilog=epilog)


INSTALL_EPILOG = """examples:
  palm-rlhf-skill install                                # ./.claude/skills/palm-rlhf-pytorch
  palm-rlhf-skill install --target claude --scope user   # ~/.claude/skills/palm-rlhf-pytorch
  palm-rlhf-skill install --target agents                # ./.agents/skills/palm-rlhf-pytorch
  palm-rlhf-skill install --target ./tools/skills --force

exit codes: 0 installed, replaced, or an identical copy already there; 1 refused: a different
copy is in the way (pass --force), or a folder or file that is not a copy of this skill (never
replaced, --force or not); 2 usage error, unknown target, or the destination cannot be written"""

UNINSTALL_EPILOG = """examples:
  palm-rlhf-skill uninstall                              # ./.claude/skills/palm-rlhf-pytorch
  palm-rlhf-skill uninstall --target agents --scope user

exit codes: 0 removed, or nothing was installed there; 1 refused: the copy differs from this
package's (edited, or another version: pass --force), or the folder is not this skill (never
removed); 2 usage error or the folder cannot be removed"""

LIST_EPILOG = """examples:
  palm-rlhf-skill list                # claude and agents, project and user scope
  palm-rlhf-skill list --target ./tools/skills --json

status: up-to-date (same files as this package), different (another version or edited), absent
exit codes: 0 listed; 2 usage error or unknown target"""


def main(argv: list[str] | None = None) -> int:
    """``palm-rlhf-skill install [--target claude|agents|PATH] [--scope project|user] [--force]``."""
    parser = _parser("install", "Copy the palm-rlhf-pytorch skill tree into an agent's skills\n"
                     "directory, as <skills dir>/palm-rlhf-pytorch/.", INSTALL_EPILOG)
    parser.add_argument("--target", default="claude", help=TARGET_HELP)
    parser.add_argument("--scope", choices=SCOPES, default="project", help=SCOPE_HELP)
    parser.add_argument("--force", action="store_true",
                        help="replace a different copy that is already there")
    args = parser.parse_args(argv)

    def run(_: list[str] | None) -> int:
        outcome, dest, count = install(args.target, args.scope, args.force)
        if outcome == "up-to-date":
            link = f", a link to {dest.resolve()}" if dest.is_symlink() else ""
            print(f"{dest}: already up to date ({count} files{link}); nothing to do")
        else:
            print(f"{outcome} {dest} ({count} files)")
        return EXIT_DONE

    return runner.run_cli(run)


def uninstall_main(argv: list[str] | None = None) -> int:
    """``palm-rlhf-skill uninstall [--target claude|agents|PATH] [--scope project|user]``."""
    parser = _parser("uninstall", "Remove an installed copy of the palm-rlhf-pytorch skill.",
                     UNINSTALL_EPILOG)
    parser.add_argument("--target", default="claude", help=TARGET_HELP)
    parser.add_argument("--scope", choices=SCOPES, default="project", help=SCOPE_HELP)
    parser.add_argument("--force", action="store_true",
                        help="remove a copy that differs from this package's (edited, or another version)")
    args = parser.parse_args(argv)

    def run(_: list[str] | None) -> int:
        dest, removed = uninstall(args.target, args.scope, args.force)
        print(f"removed {dest}" if removed else f"{dest}: not installed there; nothing to do")
        return EXIT_DONE

    return runner.run_cli(run)


def list_main(argv: list[str] | None = None) -> int:
    """``palm-rlhf-skill list [--target ...] [--scope ...] [--json]``: where copies are installed."""
    parser = _parser("list", "Show where the palm-rlhf-pytorch skill is installed and whether\n"
                     "each copy matches this package.", LIST_EPILOG)
    parser.add_argument("--target", help=TARGET_HELP.replace("; default: claude", "; default: "
                                                             "claude and agents"))
    parser.add_argument("--scope", choices=SCOPES, help="project or user; default: both")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)

    def run(_: list[str] | None) -> int:
        from palm_rlhf_skill import __version__
        source = skill_root()
        name, wanted = skill_name(source), tree_files(source, SKILL_ITEMS)
        rows = [{"target": t, "scope": s, "path": str(d / name), "status": status(d / name, wanted)}
                for t, s, d in locations(args.target, args.scope)]
        if args.json:
            report = {"skill": name, "version": __version__, "files": len(wanted), "locations": rows}
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        else:
            width = max(len(row["target"]) for row in rows)
            for row in rows:
                print(f"{row['status']:<10}  {row['target']:<{width}}  {row['scope']:<7}  {row['path']}")
        return EXIT_DONE

    return runner.run_cli(run)
