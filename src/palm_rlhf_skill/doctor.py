"""``palm-rlhf-skill doctor [--json]``: is this environment fit to run the palm-rlhf-pytorch trainers?

Checks, each with a verdict (ok, warn, fail, missing, skipped) and how to fix it:

    python         the interpreter against this package's Requires-Python
    library        palm-rlhf-pytorch and torch through the helpers' own version gate
                   (scripts/skill_runtime/version_gate.py check_versions, ranges and verified torch
                   releases in scripts/api_record.json): unsupported (3), not verified (warn), and
                   every file that shadows one of their modules on the import path
    dependencies   every requirement palm-rlhf-pytorch and this package declare, installed version
                   against the declared specifier
    torch          build (CPU or CUDA version), CUDA available, device names, bf16 support
    accelerate     what Accelerator() gets in a plain ``python`` process (reads ACCELERATE_USE_CPU),
                   and what ``accelerate launch`` would start (its config file, else its defaults)
    tqdm           what TQDM_DISABLE does to the trainers' generate bars and `episodes` bar
    memory         available memory (MemAvailable in /proc/meminfo), MiB
    disk           free disk in the working directory and the temporary directory, MiB

Exit codes: 0 fit (warnings allowed); 1 something must change (a fail); 3 a dependency is missing,
shadowed by another file, or palm-rlhf-pytorch or torch is outside the supported range (the helpers'
exit 3); 2 usage error.
``--help`` and usage errors answer without importing torch.
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from importlib import metadata
from typing import Any


import palm_rlhf_skill.runtime  # noqa: F401  (puts the installed skill tree's scripts/ on sys.path)
from skill_runtime import exits, options, placement, reporting, runner, streams, version_gate  # noqa: E402

# The tiny smoke's peak resident memory, measured with /usr/bin/time -v on the 2.13.0 CPU build:
# 346 MiB for the PPO train smoke, 350 MiB for --trainer all. The floors leave about 3x headroom.
MIN_MEMORY_MIB = 1024
# The helpers write checkpoints and TPO's memmap replay buffer in a private temporary directory.
MIN_DISK_MIB = 512
OWN_DISTRIBUTION = "palm-rlhf-skill"

EXIT_FIT, EXIT_MUST_CHANGE, EXIT_MISSING = 0, 1, 3
VERDICT_EXIT = {"ok": EXIT_FIT, "warn": EXIT_FIT, "skipped": EXIT_FIT, "fail": EXIT_MUST_CHANGE,
                "missing": EXIT_MISSING, "unsupported": EXIT_MISSING}
STATUS_WORD = {EXIT_FIT: "fit", EXIT_MUST_CHANGE: "must-change", EXIT_MISSING: "missing"}
NEXT_STEP = {EXIT_FIT: f"this environment can run the trainers; next: {reporting.FIRST_COMMAND}",
             EXIT_MUST_CHANGE: "apply the fix under each failed check, then run doctor again",
             EXIT_MISSING: "a dependency is missing, shadowed or outside the supported range: apply the "
                           "fix above, then run doctor again"}

EPILOG = """examples:
  palm-rlhf-skill doctor            # one line per check on stdout, with how to fix it
  palm-rlhf-skill doctor --json     # one JSON object on stdout

exit codes: 0 fit (warnings allowed); 1 something must change; 2 usage error;
3 a dependency is missing, shadowed by another file, or palm-rlhf-pytorch or torch is outside
the supported range (palm-rlhf-pytorch 0.8.x; torch at or above palm-rlhf-pytorch's requirement);
a torch release not verified with these helpers is a warning (exit 0)"""


def _check(name: str, status: str, detail: str, fix: str = "") -> dict[str, str]:
    return {"name": name, "status": status, "detail": detail, "fix": fix}


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _mib(n_bytes: int | float) -> int:
    return int(n_bytes // (1024 * 1024))


def python_check(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The interpreter against this package's Requires-Python (from its installed metadata)."""
    from packaging.specifiers import SpecifierSet

    version = ".".join(map(str, sys.version_info[:3]))
    try:
        requires = metadata.metadata(OWN_DISTRIBUTION).get("Requires-Python")
    except metadata.PackageNotFoundError:
        requires = None
    tested = record.get("tested_with", {}).get("python")
    info = {"version": version, "executable": sys.executable, "requires": requires, "tested": tested}
    detail = f"Python {version} (requires {requires or 'unknown'}; tested {tested})"
    if requires and version not in SpecifierSet(requires):
        return info, _check("python", "fail", detail, f"use a Python that satisfies {requires}")
    return info, _check("python", "ok", detail)


def library_check(shadows: list[dict[str, str]]) -> tuple[dict[str, Any], dict[str, str]]:
    """palm-rlhf-pytorch and torch through the helpers' version gate: missing or shadowed
    ("missing", 3), refused (palm-rlhf-pytorch outside 0.8.x, torch below the library's own
    requirement: "unsupported", 3), not verified (a torch release outside ``torch_verified``, a
    0.8.x other than the tested one: "warn", 0). ``shadows`` are ``version_gate.shadowed_modules()``;
    every one is named."""
    if shadows:
        return {"shadowed": shadows}, _check("library", "missing", "; ".join(map(version_gate.shadow_text, shadows)),
                                             version_gate.SHADOW_FIX)
    try:
        gate = version_gate.check_versions(allow_untested=False, requirements=False)  # floors: dependencies_check
    except exits.SkillError as err:
        message = str(err)
        detail, _, fix = message.rpartition(": ")
        status = "missing" if " is not installed" in message else "unsupported"
        return {"error": message}, _check("library", status, detail or message, fix or message)
    versions, tested = gate["versions"], gate["tested"]
    detail = (f"palm-rlhf-pytorch {versions['palm-rlhf-pytorch']} in {tested['supported']} "
              f"(tested {tested['palm-rlhf-pytorch']}), torch {versions['torch']} in "
              f"{tested['torch_supported']} (verified: {', '.join(tested['torch_verified'])})")
    if gate["warnings"]:
        return gate, _check("library", "warn", "; ".join(gate["warnings"]),
                            "it may work: run tiny-rlhf-smoke --trainer all; for the tested setup, "
                            f"pip install torch=={tested['torch']}")
    return gate, _check("library", "ok", detail)


def declared_requirements(own: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Requirements that palm-rlhf-pytorch (its installed metadata) and this package declare
    (extras left out), merged by normalized name: ``{name: {"specifier": SpecifierSet, "declared":
    {distribution: SpecifierSet}}}``. ``own``: this package's requirement lines (default: its
    installed metadata; tools/verify_floors.py passes pyproject.toml's)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    merged: dict[str, dict[str, Any]] = {}
    for dist in (version_gate.load_api_record()["library"], OWN_DISTRIBUTION):
        try:
            lines = own if dist == OWN_DISTRIBUTION and own is not None else metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            entry = merged.setdefault(canonicalize_name(req.name), {"specifier": SpecifierSet(), "declared": {}})
            entry["specifier"] &= req.specifier
            entry["declared"][dist] = entry["declared"].get(dist, SpecifierSet()) & req.specifier
    return merged


def readable(spec) -> str:
    """A merged specifier as a person reads it: of several ``>=`` bounds (the library's and this
    package's raised floor) only the highest, e.g. ``>=0.4.0,>=0.4.1`` -> ``>=0.4.1``."""
    from packaging.version import Version
    lower = [s for s in spec if s.operator == ">="]
    keep = [s for s in spec if s.operator != ">="]
    if lower:
        keep.append(max(lower, key=lambda s: Version(s.version)))
    return ",".join(sorted(str(s) for s in keep))


def dependencies_check(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each declared requirement installed, in its declared range (missing: 3; out of range: 1).

    palm-rlhf-pytorch itself is left to the version gate (``library``)."""
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    library = canonicalize_name(record["library"])
    tested = {canonicalize_name(k): v for k, v in record.get("tested_with", {}).items()}
    packages, missing, outside = {}, [], []
    for name, entry in sorted(declared_requirements().items()):
        if name == library:
            continue
        spec, installed = entry["specifier"], version_gate.installed_version(name)
        wanted = readable(spec)
        packages[name] = {"installed": installed, "required": wanted or "any",
                          "required_by": list(entry["declared"]), "tested": tested.get(name)}
        if installed is None:
            missing.append(f"{name}{wanted}")
        elif installed not in SpecifierSet(str(spec), prereleases=True):
            outside.append(f"{name}{wanted}")
            packages[name]["problem"] = f"{installed} is outside {wanted}"
    if not packages:
        return packages, _check("dependencies", "missing", f"{record['library']} is not installed, "
                                "so its requirements are unknown", "see the library check")
    fix = "pip install " + " ".join(f"'{w}'" for w in missing + outside)
    if any(w.startswith("torch") and not w.startswith("torch-") for w in missing + outside):
        torch_pin = record.get("tested_with", {}).get("torch")
        fix = (f"install torch first (pip install torch=={torch_pin} for the CPU build, or a CUDA "
               "build from https://pytorch.org), then " + fix)
    if missing:
        return packages, _check("dependencies", "missing", "not installed: " + ", ".join(missing), fix)
    if outside:
        detail = "; ".join(f"{n}: {p['problem']}" for n, p in packages.items() if "problem" in p)
        return packages, _check("dependencies", "fail", detail, fix)
    return packages, _check("dependencies", "ok", f"{len(packages)} declared requirements installed "
                            "and in range")


def torch_check(shadowed: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """torch's build, CUDA devices (name, compute capability, memory in MiB, native bf16) and
    whether bfloat16 math runs on the CPU. Not installed, or shadowed by another file (``shadowed``:
    module names): skipped, and the library check says why."""
    if version_gate.installed_version("torch") is None:
        return {}, _check("torch", "skipped", "torch is not installed", "see the library check")
    if "torch" in shadowed:
        return {}, _check("torch", "skipped", "not imported: another file shadows torch",
                          "see the library check")
    try:
        with streams.capture_library_output():
            import torch
    except Exception as err:  # a broken install: missing shared libraries, ABI mismatch
        return {"error": repr(err)}, _check("torch", "fail", f"import torch failed: {_one_line(err)}",
                                            "reinstall torch: pip install --force-reinstall torch==2.13.0")
    cuda = torch.cuda.is_available()
    devices = []
    for index in range(torch.cuda.device_count() if cuda else 0):
        free, total = torch.cuda.mem_get_info(index)
        with torch.cuda.device(index):
            bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        devices.append({"index": index, "name": torch.cuda.get_device_name(index),
                        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
                        "total_mib": _mib(total), "free_mib": _mib(free), "bf16": bool(bf16)})
    try:
        ones = torch.ones(2, 2, dtype=torch.bfloat16)
        cpu_bf16 = (ones @ ones).sum().item() == 8.0
    except RuntimeError:
        cpu_bf16 = False
    info = {"version": torch.__version__, "build": f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU",
            "cuda_available": cuda, "device_count": len(devices), "devices": devices,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_bf16": cpu_bf16,
            "auto_device": "cuda" if cuda else "cpu"}
    names = ", ".join(f"{d['name']} (bf16 {'yes' if d['bf16'] else 'no'})" for d in devices)
    detail = (f"torch {info['version']}, {info['build']} build, "
              + (f"CUDA available: {names}" if cuda else "CUDA not available: --device auto uses the CPU")
              + f"; CPU bf16 {'runs' if cpu_bf16 else 'fails'}")
    if torch.version.cuda and not cuda:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return info, _check("torch", "warn", detail + f"; a CUDA build that sees no GPU{hint}",
                            "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or use --device cpu")
    return info, _check("torch", "ok", detail)


def processes(distributed_type: str, count: int | None, device: str = "") -> str:
    """Accelerate's distributed type and process count in words: ``NO`` on cpu -> "1 process on
    cpu, not distributed"; ``MULTI_GPU`` x2 -> "2 processes, one per GPU"."""
    where = f" on {device}" if device else ""
    if distributed_type == "NO":
        return f"1 process{where}, not distributed"
    kind = {"MULTI_CPU": "on CPUs", "MULTI_GPU": "one per GPU"}.get(distributed_type, f"with {distributed_type}")
    return f"{count} processes{where}, {kind}"


def accelerate_check(torch_info: dict[str, Any], shadowed: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """What the trainers' ``Accelerator()`` gets in a plain ``python`` process (it reads
    ACCELERATE_USE_CPU and ACCELERATE_MIXED_PRECISION), and what ``accelerate launch`` would start.

    ACCELERATE_MIXED_PRECISION is shown when set, and a warning when it is not a value of
    Accelerate's ``PrecisionType`` (no, fp8, fp16, bf16): AcceleratorState takes the variable as
    it is (accelerate/state.py, ``parse_choice_from_env``, no check), so ``BF16`` or a typo runs
    in full precision.

    ``accelerate launch`` without a config file starts one process per CUDA device (MULTI_GPU)
    when more than one is visible, else one process (accelerate/commands/launch.py,
    ``_validate_launch_command``). The Accelerator is built by ``placement.probe_accelerator``, the same
    probe the helpers run before any model (an ACCELERATE_* value it refuses: exit 2 there).
    """
    use_cpu = os.environ.get("ACCELERATE_USE_CPU")
    info: dict[str, Any] = {"ACCELERATE_USE_CPU": use_cpu,
                            "ACCELERATE_MIXED_PRECISION": os.environ.get("ACCELERATE_MIXED_PRECISION")}
    if version_gate.installed_version("accelerate") is None or not torch_info.get("version") or "accelerate" in shadowed:
        return info, _check("accelerate", "skipped", "accelerate or torch is not installed or not "
                            "importable", "see the library and dependencies checks")
    with streams.capture_library_output():
        from accelerate.commands.config.config_args import default_config_file, load_config_from_file
    state, error = placement.probe_accelerator({})
    if error:
        return info, _check("accelerate", "fail", f"Accelerator() fails here: {error}",
                            f"{placement.accelerate_variables()}: {placement.accelerate_fix()}")
    info.update(state)
    launch: dict[str, Any] = {"config_file": None}
    try:
        if os.path.isfile(default_config_file):
            config = load_config_from_file(None)
            launch = {"config_file": default_config_file, "distributed_type": str(config.distributed_type.value),
                      "num_processes": config.num_processes, "mixed_precision": config.mixed_precision}
        else:
            count = torch_info.get("device_count", 0)
            launch.update({"distributed_type": "MULTI_GPU" if count > 1 else "NO",
                           "num_processes": count if count > 1 else 1})
    except Exception as err:  # a config file accelerate itself cannot read
        info["launch"] = {"config_file": default_config_file, "error": _one_line(err)}
        return info, _check("accelerate", "fail", f"accelerate's config file is unreadable: {_one_line(err)}",
                            f"fix it with `accelerate config`, or remove {default_config_file}")
    info["launch"] = launch
    precision = info["ACCELERATE_MIXED_PRECISION"]
    detail = (f"a plain `python` run: {processes(info['distributed_type'], info['num_processes'], info['device'])}"
              + (f", ACCELERATE_MIXED_PRECISION={precision!r}" if precision is not None else "")
              + "; `accelerate launch`: "
              f"{processes(launch['distributed_type'], launch['num_processes'])}"
              + (f" (config {launch['config_file']})" if launch["config_file"] else " (no config file)"))
    with streams.capture_library_output():
        from accelerate.utils import PrecisionType
    accepted = [p.value for p in PrecisionType]
    if precision is not None and precision not in accepted:
        return info, _check("accelerate", "warn", detail + f"; Accelerate takes ACCELERATE_MIXED_PRECISION="
                            f"{precision!r} without a word and trains in full precision (its accepted values: "
                            f"{', '.join(accepted)}, lower case)",
                            f"set ACCELERATE_MIXED_PRECISION to one of {', '.join(accepted)}, or unset it")
    visible = torch_info.get("device_count", 0)
    if launch["distributed_type"] == "MULTI_GPU" and visible < (launch["num_processes"] or 0):
        return info, _check("accelerate", "warn", detail + f"; its config asks for {launch['num_processes']} "
                            f"GPU processes but {visible} CUDA device(s) are visible",
                            "run `accelerate config` again for this machine, or pass --num_processes to "
                            "accelerate launch; a plain python run is not affected")
    if info["device"].startswith("cpu") and torch_info.get("cuda_available"):
        return info, _check("accelerate", "warn", detail + f"; ACCELERATE_USE_CPU={use_cpu!r} keeps "
                            "Accelerate on the CPU although CUDA is available",
                            "unset ACCELERATE_USE_CPU to train on the GPU, or pass --device cpu to the helpers")
    return info, _check("accelerate", "ok", detail)


TQDM_DOC = "sub-skills/policy-optimization/references/traps-setup.md#tqdm-disable"
TPO_BUFFER_DOC = "sub-skills/policy-optimization/references/traps-setup.md#tpo-replay-buffer-dir"


def tqdm_check(shadowed: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """What TQDM_DISABLE does to the trainers' two kinds of progress bar, probed with the installed
    tqdm and accelerate: PaLM's generate bars use plain ``tqdm``, which takes ``disable`` from
    TQDM_DISABLE converted with ``bool`` (any non-empty value, ``0`` and ``false`` included, turns
    them off); the trainers' ``episodes`` bar comes from ``accelerate.utils.tqdm``, which passes
    ``disable=False`` itself and so ignores TQDM_DISABLE (``TQDM_DOC`` explains it)."""
    value = os.environ.get("TQDM_DISABLE")
    info: dict[str, Any] = {"TQDM_DISABLE": value, "generate_bars_off": None, "episodes_bar_off": None}
    if version_gate.installed_version("tqdm") is None or shadowed & {"tqdm", "accelerate", "torch"}:
        return info, _check("tqdm", "skipped", "tqdm is not installed or not importable",
                            "see the library and dependencies checks")
    from tqdm import tqdm
    bars = [tqdm(total=1, file=io.StringIO())]
    if version_gate.installed_version("accelerate") is not None:
        with streams.capture_library_output():
            from accelerate.utils.tqdm import tqdm as accelerate_tqdm
        bars.append(accelerate_tqdm(total=1, file=io.StringIO(), main_process_only=False))
    info["generate_bars_off"] = bool(bars[0].disable)
    if len(bars) > 1:
        info["episodes_bar_off"] = bool(bars[1].disable)
    for bar in bars:
        bar.close()
    if value is None:
        return info, _check("tqdm", "ok", "TQDM_DISABLE is not set: the trainers draw their progress "
                            "bars on stderr (the smoke helpers capture them)")
    generate = "hides" if info["generate_bars_off"] else "does not hide"
    episodes = {False: ", but the `episodes` bar still prints", True: " and the `episodes` bar",
                None: ""}[info["episodes_bar_off"]]
    detail = f"TQDM_DISABLE={value!r} {generate} the generate bars{episodes}"
    fix = f"redirect stderr to silence every bar (see {TQDM_DOC})"
    if info["generate_bars_off"] and value.strip().lower() in ("0", "false", "no", "off"):
        return info, _check("tqdm", "warn", detail + ": tqdm reads any non-empty value as true",
                            "unset TQDM_DISABLE to see the generate bars")
    return info, _check("tqdm", "ok", f"{detail} ({TQDM_DOC})", fix)


def resources_checks() -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Available memory and free disk in the working and the temporary directory, in MiB, and
    whether each is writable. A short or read-only working directory is its own fix: TPO's train()
    writes ``./tpo_memmap_replay_buffer`` there (palm_rlhf_pytorch/tpo.py), whatever TMPDIR says."""
    memory = placement.available_memory_mib()  # one reader, shared with --nproc and plan
    places = {"cwd": os.getcwd(), "tmp": tempfile.gettempdir()}
    disk = {key: {"path": path, "free_mib": _mib(shutil.disk_usage(path).free)} for key, path in places.items()}
    info = {"memory_available_mib": memory, "min_memory_mib": MIN_MEMORY_MIB, "disk": disk,
            "min_disk_mib": MIN_DISK_MIB}
    if memory < MIN_MEMORY_MIB:
        mem = _check("memory", "fail", f"{memory} MiB available, below {MIN_MEMORY_MIB} MiB",
                     "close other programs or use a machine with more memory")
    else:
        mem = _check("memory", "ok", f"{memory} MiB available (floor {MIN_MEMORY_MIB} MiB)")
    for d in disk.values():
        d["writable"] = os.access(d["path"], os.W_OK)
    short = {key: d for key, d in disk.items() if d["free_mib"] < MIN_DISK_MIB or not d["writable"]}
    detail = ", ".join(f"{key} {d['free_mib']} MiB free ({d['path']})" for key, d in disk.items())
    if short:
        problems = [f"{key} {d['path']} " + (f"has {d['free_mib']} MiB free, below {MIN_DISK_MIB} MiB"
                                              if d["free_mib"] < MIN_DISK_MIB else "is read-only")
                    for key, d in short.items()]
        fixes = {"cwd": "run from a directory on a larger, writable disk (or free space there): TPO's train() "
                        f"writes ./tpo_memmap_replay_buffer into the working directory ({TPO_BUFFER_DOC})",
                 "tmp": "free disk space in the temporary directory, or point TMPDIR at a larger disk"}
        dsk = _check("disk", "fail", "; ".join(problems), "; ".join(fixes[key] for key in short))
    else:
        dsk = _check("disk", "ok", f"{detail} (floor {MIN_DISK_MIB} MiB)")
    return info, [mem, dsk]


def diagnose() -> dict[str, Any]:
    """Run every check; the report that ``--json`` prints (see the module docstring)."""
    record = version_gate.load_api_record()
    shadows = version_gate.shadowed_modules()  # before any check imports a module that a file shadows
    shadowed = {s["module"] for s in shadows}
    python_info, python = python_check(record)
    library_info, library = library_check(shadows)
    packages, dependencies = dependencies_check(record)
    torch_info, torch_ = torch_check(shadowed)
    accelerate_info, accelerate = accelerate_check(torch_info, shadowed)
    tqdm_info, tqdm_ = tqdm_check(shadowed)
    resources, resource_checks = resources_checks()
    checks = [python, library, dependencies, torch_, accelerate, tqdm_, *resource_checks]
    exit_code = max(VERDICT_EXIT[c["status"]] for c in checks)
    return {"status": STATUS_WORD[exit_code], "exit_code": exit_code, "python": python_info,
            "library": library_info, "packages": packages, "torch": torch_info,
            "accelerate": accelerate_info, "tqdm": tqdm_info, "resources": resources,
            "tested": {"supported": record["supported"], "tested_version": record["tested_version"],
                       "tested_with": record.get("tested_with", {})},
            "checks": checks}


def summary(report: dict[str, Any]) -> str:
    """One line per check, a fix line under each that is not ok, and the verdict."""
    lines = []
    for check in report["checks"]:
        lines.append(f"{check['status']:<8} {check['name']:<13} {check['detail']}")
        if check["fix"] and check["status"] != "ok":
            lines.append(f"{'':<8} {'':<13} fix: {check['fix']}")
    lines.append(f"verdict: {report['status']} (exit {report['exit_code']}): {NEXT_STEP[report['exit_code']]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``palm-rlhf-skill doctor [--json]``; returns the exit code (0 fit, 1 must change, 3 missing)."""
    parser = options.OneLineParser(
        prog="palm-rlhf-skill doctor", epilog=EPILOG,
        description="Check that this environment can run the palm-rlhf-pytorch trainers: Python,\n"
                    "palm-rlhf-pytorch, torch and their dependencies against the supported range, torch's build\n"
                    "and devices, Accelerate's view, TQDM_DISABLE, free memory and disk.")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)

    def run(_: list[str] | None) -> int:
        report = diagnose()
        return runner.emit(report, args.json, summary, report["exit_code"])

    return runner.run_cli(run)
