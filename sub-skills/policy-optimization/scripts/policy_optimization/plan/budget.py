"""Inverse planning (``plan --budget 2h --memory-budget 8GiB``): from the probe's unit figures, the
largest run that fits a time and a memory budget at the config's size: how many rollouts and
learn() calls, the settings that give it, and, when not even one round fits, the one change of
update_timesteps, max_seq_len, depth or dim that makes one round fit.

Pure arithmetic on the probe's figures (torch-free). Every figure is derived: plan again with the
suggested change to measure it.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SIZE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``3d`` (or ``1.5h``) as seconds, above 0.
    Raises ValueError naming the accepted forms."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if not match or float(match[1]) <= 0:
        raise ValueError(f"expected a duration above 0 such as 90s, 10m, 2h or 3d, got {text!r}")
    return float(match[1]) * DURATION_UNITS[match[2] or "s"]


def parse_size(text: str) -> int:
    """``8GiB``, ``512MiB``, ``16GB`` (SI) or a number of bytes, above 0, as bytes.
    Raises ValueError naming the accepted forms."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b)?\s*", text.lower())
    if not match or float(match[1]) <= 0:
        raise ValueError(f"expected a size above 0 such as 8GiB, 512MiB or 16GB, got {text!r}")
    return int(float(match[1]) * SIZE_UNITS[match[2] or "b"])


@dataclass
class Units:
    """What the arithmetic needs from the plan. Seconds: ``fixed_s`` (startup, construction, the
    first rollout's and first learn()'s one-time costs, the baseline [eval] scoring),
    ``rollout_s`` (one rollout at max_seq_len), ``learn_item_s`` (one experience, one epoch),
    ``eval_s`` (one [eval] scoring, 0 without it); counts: ``update`` (update_timesteps),
    ``per_round`` ([run]: max_timesteps of a round; None without [run]), ``every`` ([eval]
    every), ``items_per_rollout``, ``epochs``; sizes: ``max_seq_len``, ``min_seq_len`` (the longest
    prompt + 1), ``depth``, ``dim``; ``rollout_at(L)`` seconds of one rollout at max_seq_len L and
    ``peak_at(u, L)`` bytes of the peak with update_timesteps u at max_seq_len L (None when not
    predicted)."""
    fixed_s: float
    rollout_s: float | None
    learn_item_s: float | None
    eval_s: float
    update: int
    per_round: int | None
    every: int
    items_per_rollout: int
    epochs: int
    max_seq_len: int
    min_seq_len: int
    depth: int
    dim: int
    rollout_at: Callable[[int], float | None]
    peak_at: Callable[[int, int], int | None]


def largest(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest x in [low, high] with ``fits(x)`` (``fits`` monotone: true up to some x), or None."""
    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def change(section: str, key: str, value: int, why: str) -> dict[str, Any]:
    return {"section": section, "key": key, "value": value, "why": why}


def memory_update(u: Units, memory: int) -> tuple[int | None, list[dict[str, Any]]]:
    """update_timesteps that fits ``memory`` bytes: the configured one, a lower one, or None with
    the max_seq_len that fits at update_timesteps 1 (``alternatives``)."""
    peak = u.peak_at(u.update, u.max_seq_len)
    if peak is None or peak <= memory:
        return u.update, []
    lower = largest(1, u.update - 1, lambda x: (u.peak_at(x, u.max_seq_len) or 0) <= memory)
    if lower is not None:
        return lower, []
    length = largest(u.min_seq_len, u.max_seq_len - 1, lambda n: (u.peak_at(1, n) or 0) <= memory)
    return None, [change("train", "max_seq_len", length, "with update_timesteps 1, the peak fits the memory budget")
                  ] if length else []


def round_seconds(u: Units, update: int) -> tuple[float, int, int]:
    """(seconds, rollouts, learn() calls) of one round: [run]'s max_timesteps rollouts (M // U
    learn() calls), else one cycle of ``update`` rollouts and one learn(); its [eval] share
    (``eval_s / every``) included."""
    rollouts = u.per_round if u.per_round is not None and update == u.update else update
    learns = rollouts // update
    seconds = rollouts * u.rollout_s + learns * update * u.items_per_rollout * u.epochs * u.learn_item_s
    return seconds + u.eval_s / u.every, rollouts, learns


def one_round_alternatives(u: Units, seconds: float, update: int) -> list[dict[str, Any]]:
    """Each single change that makes one round fit ``seconds``: a lower update_timesteps, a
    shorter max_seq_len (the probe's step times; learn() taken as linear in the length), a lower
    depth (time taken as proportional to it) or dim (time taken as proportional to its square)."""
    room = seconds - u.fixed_s
    cycle, _, _ = round_seconds(u, update)
    out = []
    per_rollout = u.rollout_s + u.items_per_rollout * u.epochs * u.learn_item_s
    fewer = math.floor((room - u.eval_s / u.every) / per_rollout) if per_rollout > 0 else 0
    if 1 <= fewer < update:
        out.append(change("train", "update_timesteps", fewer, "fewer rollouts per learn(): one round fits"))
    learn_s = update * u.items_per_rollout * u.epochs * u.learn_item_s

    def round_at(n: int) -> bool:
        rollout = u.rollout_at(n)
        return rollout is not None and update * rollout + learn_s * n / u.max_seq_len + u.eval_s / u.every <= room

    length = largest(u.min_seq_len, u.max_seq_len - 1, round_at)
    if length:
        out.append(change("train", "max_seq_len", length, "shorter sequences: one round fits at this size"))
    factor = room / cycle if cycle > 0 else 0.0
    if factor > 0 and u.depth * factor >= 1:
        out.append(change("palm", "depth", max(1, math.floor(u.depth * factor)),
                          "time taken as proportional to depth: plan again to measure it"))
    dim = math.floor(u.dim * math.sqrt(max(factor, 0.0)) / 8) * 8
    if dim >= 8:
        out.append(change("palm", "dim", dim, "time taken as proportional to dim squared: plan again to measure it"))
    return out


def plan_budget(u: Units, seconds: float | None, memory: int | None, configured_s: float | None,
                configured_peak: int | None) -> dict[str, Any]:
    """The largest run within ``seconds`` (wall, None: no time budget) and ``memory`` (bytes of
    the memory pool the plan compares, None: no memory budget) at the config's size.

    Returns ``{seconds, memory_bytes, fits, rollouts, learn_calls, rounds, changes, alternatives,
    why, basis}``: ``fits`` whether the configured run is within both; ``rollouts`` and
    ``learn_calls`` of the largest run (0 when not even one round fits), ``rounds`` its [run]
    rounds (None without [run]); ``changes`` the settings that give it, together; ``alternatives``
    when not even one round fits (or update_timesteps 1 exceeds the memory budget), each one change
    that alone makes one round fit; ``why`` when a unit figure the probe did not measure leaves
    the time part uncomputed (no rollout timed) or an upper bound (no learn() timed: counted as 0 s);
    ``fits`` is then None (unknown)."""
    out: dict[str, Any] = {"seconds": seconds, "memory_bytes": memory, "fits": True, "rollouts": None,
                           "learn_calls": None, "rounds": None, "changes": [], "alternatives": [], "why": None,
                           "basis": "derived"}
    update = u.update
    if memory is not None:
        out["fits"] = configured_peak is not None and configured_peak <= memory
        update, out["alternatives"] = memory_update(u, memory)
        if update is None:
            out.update(rollouts=0, learn_calls=0)
            return out
        if update != u.update:
            out["changes"].append(change("train", "update_timesteps", update, "the experiences held before each "
                                                                             "learn() fit the memory budget"))
    if seconds is None:
        return out
    if u.rollout_s is None:
        out.update(why="the probe timed no rollout within --probe-seconds: raise it", fits=None)
        return out
    if u.learn_item_s is None:  # counted as free: the counts below are upper bounds
        out["why"] = "learn() not measured within --probe-seconds: counted as 0 s, so these are upper bounds"
        u = dataclasses.replace(u, learn_item_s=0.0)
        out["fits"] = None
    if out["fits"] is not None:
        out["fits"] = bool(out["fits"]) and configured_s is not None and configured_s <= seconds
    cycle, rollouts, learns = round_seconds(u, update)
    count = math.floor((seconds - u.fixed_s) / cycle) if cycle > 0 else 0
    if count < 1:
        out.update(rollouts=0, learn_calls=0)
        out["alternatives"] = one_round_alternatives(u, seconds, update)
        return out
    out.update(rollouts=count * rollouts, learn_calls=count * learns)
    if u.per_round is not None:
        out["rounds"] = count
        out["changes"].append(change("run", "rounds", count, "rounds that fit the time budget"))
        if update != u.update:
            out["changes"].append(change("train", "max_timesteps", update, "one learn() per round"))
    else:
        out["changes"] += [change("train", "num_episodes", 1, "one episode of max_timesteps rollouts"),
                           change("train", "max_timesteps", count * update, "rollouts that fit the time budget")]
    return out
