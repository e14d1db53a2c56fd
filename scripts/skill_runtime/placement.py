"""Where the helpers run: ``--device`` through Accelerate (the trainers' own device choice),
the environment variables Accelerate refuses, usable CPUs, available memory and torch threads."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from skill_runtime import exits, options, streams


ACCELERATE_FIX = "fix or unset it (ACCELERATE_USE_CPU takes 1/0, true/false, yes/no or on/off)"


def probe_accelerator(kwargs: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Build ``Accelerator(**kwargs)`` once, as every trainer's constructor does, to see what this
    environment gives it: Accelerate reads ACCELERATE_USE_CPU, ACCELERATE_MIXED_PRECISION and its
    other ``ACCELERATE_*`` variables there, and raises ValueError for a value it cannot use.

    Returns ``(state, None)`` with ``state`` = {distributed_type, device, num_processes,
    mixed_precision}, or ``(None, "Type: message")`` when it raised (ValueError, RuntimeError,
    ImportError). Accelerate's process-wide states that this call created are cleared afterwards
    (the trainers build their own); ones that existed before are kept.
    """
    with streams.capture_library_output():
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState, PartialState
    had = {cls: bool(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)}
    try:
        with streams.capture_library_output():
            state = Accelerator(**kwargs).state
        return {"distributed_type": state.distributed_type.value, "device": str(state.device),
                "num_processes": state.num_processes, "mixed_precision": state.mixed_precision}, None
    except (ValueError, RuntimeError, ImportError) as err:
        return None, exits.one_line(err)
    finally:  # leave Accelerate's process-wide state as it was found
        for cls, initialized in had.items():
            if not initialized:
                cls._shared_state.clear()


# The launchers' variables Accelerate reads with int() while it builds its state (accelerate/state.py,
# PartialState.__init__; accelerate/utils/environment.py, get_cpu_distributed_information): a value
# that is not an integer raises ValueError: invalid literal for int() with base 10.
ACCELERATE_INT_VARIABLES = (
    "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
)


def non_integer_variables() -> list[str]:
    """``["LOCAL_RANK='garbage'"]``: the ACCELERATE_INT_VARIABLES set here to something int() refuses."""
    bad = []
    for name in ACCELERATE_INT_VARIABLES:
        value = os.environ.get(name)
        try:
            int(value) if value is not None else None
        except ValueError:
            bad.append(f"{name}={value!r}")
    return bad


def accelerate_variables() -> str:
    """``LOCAL_RANK='garbage', ACCELERATE_USE_CPU='banana'``: what Accelerate reads here that can make
    it refuse: launcher variables it parses as integers whose value is not one, then every
    ``ACCELERATE_*`` variable set."""
    found = [*non_integer_variables(),
             *(f"{k}={v!r}" for k, v in sorted(os.environ.items()) if k.startswith("ACCELERATE_"))]
    return ", ".join(found) or "no ACCELERATE_* variable set, and no launcher variable it reads as an integer is malformed"


def accelerate_fix() -> str:
    """How to fix what ``accelerate_variables`` names."""
    if non_integer_variables():
        return "fix or unset it: launchers (torchrun, mpirun) set these to integers; outside one, unset them"
    return ACCELERATE_FIX


def resolve_device(spec: str, trainers: bool = True) -> tuple[dict[str, Any], Any]:
    """Map ``--device auto|cpu|cuda|cuda:N`` to (accelerate_kwargs, torch.device) via Accelerate.

    auto means CUDA when ``torch.cuda.is_available()``, else CPU. The returned kwargs go to the
    trainers' ``accelerate_kwargs`` so their Accelerator picks the same device.
    Raises SkillError(exit 2) for a malformed spec, CUDA that is not available, or, when
    ``trainers`` (the caller builds a trainer, which builds an Accelerator), an environment whose
    ``ACCELERATE_*`` variables Accelerate refuses (``probe_accelerator``): an environment error,
    never a failed check of the trainer built afterwards.
    """
    import torch
    from accelerate import PartialState

    match = options.DEVICE_PATTERN.fullmatch(spec)
    if not match:
        raise exits.SkillError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise exits.SkillError(
                f"--device {spec} requested but CUDA is not available to torch {torch.__version__} "
                "(torch.cuda.is_available() is False): use --device cpu or auto, or install a CUDA "
                "build of torch")
        index = int(match.group(1) or 0)
        if index >= torch.cuda.device_count():
            raise exits.SkillError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) visible")
        torch.cuda.set_device(index)  # Accelerate places on torch.device('cuda'), the current one
    use_cpu = spec == "cpu" or (spec == "auto" and not torch.cuda.is_available())
    kwargs = {"cpu": True} if use_cpu else {}
    _, error = probe_accelerator(kwargs) if trainers else (None, None)
    if error:
        raise exits.SkillError(f"Accelerate refuses this environment ({accelerate_variables()}): {error}; "
                         + accelerate_fix())
    device = PartialState(**kwargs).device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return kwargs, device


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def available_memory_mib() -> int:
    """RAM a new allocation can get without swapping, MiB: psutil's ``virtual_memory().available``
    (MemAvailable of /proc/meminfo on Linux). psutil is a requirement of Accelerate, so it is there
    wherever the library is; the one reader for doctor, --nproc's resource check and plan."""
    import psutil
    return psutil.virtual_memory().available // 2**20


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[int]:
    """Run with ``torch.set_num_threads(count)`` and restore the previous count afterwards.

    Tiny CPU models gain nothing from intra-op threads, and on a CPU shared with other work the
    threads wait on each other (measured here: 27 s with the default pool vs 4 s with one thread
    for the reward-modeling smoke on a loaded 2-core machine). Yields the count in effect.
    """
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
