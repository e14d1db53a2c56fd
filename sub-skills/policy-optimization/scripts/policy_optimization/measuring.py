"""Measuring one process: its resident memory and peak (``MemoryMeter``), the memory a run may
use (``available_memory``), what one rollout stored for ``learn()`` (``stored_sizes``), synchronized
clocks (``now``) and the seconds since the process started (``process_seconds``).

Torch-free at import.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from skill_runtime import placement

MIB = 2**20


def peak_rss_bytes() -> int:
    """This process's peak resident set size, bytes: VmHWM of /proc/self/status (Linux; reset by
    ``MemoryMeter.start``), else ru_maxrss (KiB on Linux, bytes on macOS: getrusage(2))."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class MemoryMeter:
    """Process memory: resident set size now and its peak since ``start()``.

    Linux: the peak is VmHWM of /proc/self/status, reset by writing 5 to /proc/self/clear_refs;
    elsewhere ru_maxrss, which never resets (stage peaks are then upper bounds: ``resettable``
    False). On CUDA also the caching allocator's current and peak bytes on the device. Bytes.
    """

    def __init__(self, device) -> None:
        import psutil
        self.process, self.device = psutil.Process(), device
        self.cuda = device.type == "cuda"
        self.resettable = self._reset_hwm()

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def rss(self) -> int:
        return self.process.memory_info().rss

    def start(self) -> int:
        """Reset the peaks; return the RSS now."""
        self._reset_hwm()
        if self.cuda:
            import torch
            torch.cuda.reset_peak_memory_stats(self.device)
        return self.rss()

    def peak(self) -> int:
        return peak_rss_bytes()

    def device_now(self) -> int:
        import torch
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def device_peak(self) -> int:
        import torch
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else 0


def available_memory(device, meter: MemoryMeter) -> dict[str, int]:
    """Bytes the run may use: on CPU the RAM available now (``placement.available_memory_mib``) plus this
    process's RSS (a fresh run starts from the same imports); on CUDA the device's free memory
    (torch.cuda.mem_get_info) plus what this process holds there, and the host RAM as on CPU
    (experiences live on the host)."""
    host = placement.available_memory_mib() * 2**20 + meter.rss()
    if device.type != "cuda":
        return {"host": host}
    import torch
    free, _total = torch.cuda.mem_get_info(device)
    return {"host": host, "device": free + torch.cuda.memory_reserved(device)}


def stored_sizes(stored) -> dict[str, Any]:
    """What one rollout left for learn(): a list of namedtuple experiences (PPO, GRPO, FlowRL) or
    the TPO memmap ReplayBuffer. Returns ``{items, fields: {field: bytes per rollout}, buffer}``;
    for a buffer, ``items`` counts stored timesteps and ``fields`` the bytes of one timestep."""
    data = getattr(stored, "data", None)
    if isinstance(data, dict):  # memmap_replay_buffer.ReplayBuffer: (episodes, timesteps, *shape)
        fields = {name: int(arr.dtype.itemsize * math.prod(arr.shape[2:])) for name, arr in data.items()}
        return {"items": int(stored.timestep_index), "fields": fields, "buffer": True}
    items = list(stored)
    fields = {f: sum(int(getattr(item, f).nbytes) for item in items) for f in items[0]._fields}
    return {"items": len(items), "fields": fields, "buffer": False}


def now(device) -> float:
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)
    return time.perf_counter()



def load_average() -> float | None:
    """The 1-minute load average (runnable processes, averaged), or None where the OS has none."""
    import os
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def busy_reason(load: dict[str, Any] | None, ratio: dict[str, float], cpu_ratio: dict[str, float] | None,
                limit: float) -> str | None:
    """Why a wall-time ratio over ``limit`` cannot be judged on this run, or None when it can:
    the 1-minute load average reached the CPU count (``load``: ``{max, cpus}``), so the processes
    waited for a CPU; or some paired ratios were within the limit (the repeats disagree); or the
    CPU-time ratio is within the limit (the extra wall time was waiting, not work)."""
    if load and load.get("max") is not None and load["max"] >= load["cpus"]:
        return f"load average up to {load['max']} on {load['cpus']} CPUs"
    if ratio["min"] <= limit:
        return f"the paired ratios spread {ratio['min']:.2f}-{ratio['max']:.2f} across the limit"
    if cpu_ratio is not None and cpu_ratio["median"] <= limit:
        return f"its CPU-time ratio {cpu_ratio['median']:.2f}x is within the limit: it waited, it did not work more"
    return None


def weak_reason(load: dict[str, Any] | None, repeat: int | None) -> str | None:
    """Why a pass is weak evidence, or None: the 1-minute load average reached the CPU count (the
    figures waited for a CPU, so a pass may hide a regression the noise covered), or one repeat
    (no spread to judge it by)."""
    reasons = []
    if load and load.get("max") is not None and load["max"] >= load["cpus"]:
        reasons.append(f"load average up to {load['max']} on {load['cpus']} CPUs")
    if repeat == 1:
        reasons.append("one repeat (--repeat 1)")
    return "; ".join(reasons) or None


def process_seconds() -> float:
    """Seconds since this process started (psutil: the kernel's start time, 10 ms resolution)."""
    import psutil
    return time.time() - psutil.Process().create_time()

