"""The tested-version record (``scripts/api_record.json``) and the gate every helper passes
first: torch and palm-rlhf-pytorch installed, within what can work (refused below it), verified or
said not to be (a warning), and not shadowed by a file of the same name on the import path."""
from __future__ import annotations

import json
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import skill_runtime
from skill_runtime import SKILL_ROOT
from skill_runtime import exits


API_RECORD_PATH = SKILL_ROOT / "scripts" / "api_record.json"


def load_api_record() -> dict[str, Any]:
    """The machine-checkable record of what the docs claim: tested version range and API facts.
    Raises SkillError (exit 2) when the file is missing, unreadable or not a JSON object: a damaged
    copy of the tree (``skill_runtime.damaged``)."""
    try:
        record = json.loads(API_RECORD_PATH.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise exits.SkillError(skill_runtime.damaged(API_RECORD_PATH, f"unreadable: {exits.one_line(exc)}")) from None
    if not isinstance(record, dict):
        raise exits.SkillError(skill_runtime.damaged(API_RECORD_PATH, f"not a JSON object: {type(record).__name__}"))
    return record


def installed_version(distribution: str) -> str | None:
    """Installed version of a distribution via importlib.metadata, or None when not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def shadowed_modules() -> list[dict[str, str]]:
    """Modules of palm-rlhf-pytorch, its declared requirements and ``packaging`` that Python would
    import from somewhere other than their installed distribution.

    A ``torch.py`` or a ``palm_rlhf_pytorch/`` package earlier on ``sys.path`` (the current
    directory under ``PYTHONPATH=.``, ``python -c`` or ``python -m``; a script's own folder) wins
    over the installed one, and its code would run on import. ``importlib.util.find_spec`` locates
    a top-level module without running it. Editable installs, distributions that are not
    installed, and ones whose import name is not their normalized name are skipped.
    Returns ``[{"module", "found", "installed"}]`` (file paths), empty when nothing is shadowed.
    """
    import importlib.util

    record = load_api_record()
    try:
        requires = metadata.requires(record["library"]) or []
    except metadata.PackageNotFoundError:
        requires = []
    names = [record["library"], "packaging",
             *(re.match(r"[A-Za-z0-9._-]+", line).group(0) for line in requires if "extra ==" not in line)]
    found = []
    for dist_name in dict.fromkeys(names):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        if '"editable": true' in (dist.read_text("direct_url.json") or "").replace("'", '"'):
            continue
        module = re.sub(r"[-_.]+", "_", dist_name).lower()
        base = Path(dist.locate_file("")).resolve()
        installed = next((p for p in (base / module, base / f"{module}.py") if p.exists()), None)
        if installed is None:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            continue
        origin = Path(spec.origin).resolve()
        if origin != installed and installed not in origin.parents:
            found.append({"module": module, "found": str(origin if origin.name != "__init__.py" else origin.parent),
                          "installed": str(installed)})
    return found


SHADOW_FIX = "rename or move it, or run from another directory / drop it from PYTHONPATH"


def shadow_text(shadow: dict[str, str]) -> str:
    """One ``shadowed_modules()`` entry in words: ``FOUND shadows the installed MODULE (INSTALLED)``."""
    return f"{shadow['found']} shadows the installed {shadow['module']} ({shadow['installed']})"


def check_versions(allow_untested: bool = False, allow_shadowed: bool | None = None,
                   requirements: bool = True) -> dict[str, Any]:
    """Check torch and palm-rlhf-pytorch against ``scripts/api_record.json``, after making sure no
    file shadows them; with ``requirements`` (every helper) also each requirement of
    ``requirements_supported`` (accelerate: below its verified floor the trainers fail inside the
    library, references/installation.md#verified-floors; doctor passes False, as its dependencies
    check holds every declared floor).

    The rule: refuse only what cannot work, warn where it was not verified.
    - palm-rlhf-pytorch outside ``supported`` (0.8.x): refused; inside it but not
      ``tested_version``: a warning (``palm-rlhf-skill check`` names the sections whose code changed).
    - torch below ``torch_supported`` (palm-rlhf-pytorch's own torch requirement, as its metadata
      declares it): refused; a release not in ``torch_verified`` (the versions the helpers were run
      on, with the date: references/installation.md#verified-torch): a warning. A build label is not
      a version (``2.11.0+cu130`` is 2.11.0).

    Returns ``{"versions": {...}, "tested": {...}, "warnings": [...]}``.
    Raises SkillError(exit 3) when torch, palm-rlhf-pytorch or a gated requirement is missing; when
    a module of the library or its requirements would be imported from outside its installed
    distribution (see ``shadowed_modules``: a modified library copy on PYTHONPATH is untested too),
    unless ``allow_shadowed`` (default: ``allow_untested``; every helper's --allow-untested; then a
    warning instead); and when one is refused by the rule above, unless ``allow_untested``. ``check``
    compares the docs with any installed version (``allow_untested=True``) and with a shadow only
    on its --allow-untested.
    """
    warnings = []
    allow_shadowed = allow_untested if allow_shadowed is None else allow_shadowed
    for s in shadowed_modules():  # before anything imports them: a shadow's code never runs
        message = shadow_text(s)
        if not allow_shadowed:
            raise exits.SkillError(f"{message}: {SHADOW_FIX} (--allow-untested runs with it)", exits.EXIT_DEPENDENCY)
        warnings.append(message)
    from packaging.specifiers import SpecifierSet

    record = load_api_record()
    lib, supported = record["library"], record["supported"]
    torch_supported, torch_tested = record["torch_supported"], record["tested_with"]["torch"]
    verified = verified_torch(record)
    versions = {
        "palm-rlhf-pytorch": installed_version(lib),
        "torch": installed_version("torch"),
        "accelerate": installed_version("accelerate"),
        "python": ".".join(map(str, sys.version_info[:3])),
    }
    if versions["torch"] is None:
        raise exits.SkillError(
            f"torch is not installed: pip install torch=={torch_tested} (CPU) or a CUDA build from "
            f"https://pytorch.org, then pip install '{lib}{supported}'", exits.EXIT_DEPENDENCY)
    if versions["palm-rlhf-pytorch"] is None:
        raise exits.SkillError(f"palm-rlhf-pytorch is not installed: pip install '{lib}{supported}'",
                         exits.EXIT_DEPENDENCY)
    gated = [(lib, supported, f"the range this skill documents (tested {record['tested_version']})",
              f"pip install '{lib}{supported}'"),
             ("torch", torch_supported, f"{lib}'s own torch requirement",
              f"pip install torch=={torch_tested} (or a CUDA build of a verified release, one of {', '.join(verified)})")]
    for name, spec in (record["requirements_supported"].items() if requirements else ()):
        versions.setdefault(name, installed_version(name))
        if versions[name] is None:
            raise exits.SkillError(f"{name} is not installed: pip install '{name}{spec}'", exits.EXIT_DEPENDENCY)
        gated.append((name, spec, f"its verified floor (tested {record['tested_with'][name]})",
                      f"pip install '{name}{spec}'"))
    for name, spec, what, fix in gated:
        if versions[name] not in SpecifierSet(spec, prereleases=True):
            message = f"{name} {versions[name]} is outside {spec}, {what}"
            if not allow_untested:
                raise exits.SkillError(f"{message}: {fix}, or pass --allow-untested", exits.EXIT_DEPENDENCY)
            warnings.append(message)
    if release(versions[lib]) != release(record["tested_version"]) and versions[lib] in SpecifierSet(supported):
        warnings.append(f"{lib} {versions[lib]} is not the tested {record['tested_version']}: "
                        "palm-rlhf-skill check names the sections whose cited code changed")
    if release(versions["torch"]) not in verified and versions["torch"] in SpecifierSet(torch_supported):
        warnings.append(f"torch {versions['torch']} was not verified with these helpers (verified: "
                        f"{', '.join(verified)}); it meets {lib}'s requirement torch{torch_supported}")
    tested = {"palm-rlhf-pytorch": record["tested_version"], "supported": supported,
              "torch": torch_tested, "torch_supported": torch_supported, "torch_verified": verified}
    return {"versions": versions, "tested": tested, "warnings": warnings}


def release(version: str | None) -> str | None:
    """A version without its build label: ``2.11.0+cu130`` -> ``2.11.0`` (None stays None)."""
    from packaging.version import InvalidVersion, Version
    if version is None:
        return None
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def verified_torch(record: dict[str, Any]) -> list[str]:
    """The torch releases the helpers passed on (``torch_verified`` in the record; any build),
    oldest first, each once."""
    from packaging.version import Version
    return sorted({release(row["torch"]) for row in record.get("torch_verified", []) if row.get("result") == "pass"},
                  key=Version)
