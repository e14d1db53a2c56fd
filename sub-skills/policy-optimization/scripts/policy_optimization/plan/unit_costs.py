"""Unit costs of a run from the probe's measurements (pure arithmetic, no torch): seconds of the
sampling steps of a rollout (``steps_time``: t(n) = a + b n + c n**2 fitted to the timed steps;
``prompt_sampling``: with the library's sampler or the cached one),
bytes each stored field takes at any length (``stored_at``), the [eval] scoring's seconds, and the
unit figures taken from real rollouts and learn() (``take_real``) or from the last rollout step
(``take_last_step``).
"""
from __future__ import annotations

from collections import Counter
from typing import Any


def quadratic_fit(points: list[tuple[int, float]]) -> tuple[float, float, float] | None:
    """``(a, b, c)`` of the least-squares t(n) = a + b n + c n**2 through ``points`` (three or more
    lengths): a forward over n tokens costs its linear layers about n and its attention about n**2
    (palm.py: no KV cache, each sampling step is a full forward). None when fewer than three
    lengths, or when the fit is not a cost (c < 0, or t < 0 at a measured length): then the
    piecewise-linear interpolation applies."""
    if len({n for n, _ in points}) < 3:
        return None
    scale = max(n for n, _ in points)
    xs = [(n / scale, t) for n, t in points]  # n scaled to [0, 1]: a well-conditioned system
    sums = [sum(x ** k for x, _ in xs) for k in range(5)]
    rhs = [sum(t * x ** k for x, t in xs) for k in range(3)]
    matrix = [[sums[i + j] for j in range(3)] + [rhs[i]] for i in range(3)]
    for col in range(3):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(matrix[r][col]))
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        if abs(matrix[col][col]) < 1e-12:
            return None
        for row in range(3):
            if row != col:
                factor = matrix[row][col] / matrix[col][col]
                matrix[row] = [a - factor * b for a, b in zip(matrix[row], matrix[col])]
    a, b, c = (matrix[i][3] / matrix[i][i] for i in range(3))
    b, c = b / scale, c / scale ** 2
    if c < 0 or any(a + b * n + c * n * n < 0 for n, _ in points):
        return None
    return a, b, c


def steps_time(points: list[tuple[int, float]], first: int, last: int) -> float:
    """Seconds of the sampling steps at lengths ``first .. last`` (inclusive). One rollout calls
    ``PaLM.generate``'s loop once per length (palm.py ``generate``: ``max(1, seq_len - prompt_len)``
    steps). ``t(n)``: the ``quadratic_fit`` of the measured ``(n, seconds)`` points when there is
    one (three or more lengths); else piecewise linear through them, continued with the last slope
    beyond them (a lower bound there: attention grows with n**2)."""
    points = sorted(points)
    fit = quadratic_fit(points)
    if fit is not None:
        a, b, c = fit
        return sum(a + b * n + c * n * n for n in range(first, last + 1))

    def at(n: int) -> float:
        if len(points) == 1 or n <= points[0][0]:
            return points[0][1]
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        return max(points[-1][1], t0 + (t1 - t0) * (n - n0) / (n1 - n0))

    return sum(at(n) for n in range(first, last + 1))




def stored_field(stored: dict[str, Any], name: str, prompt_len: int, max_seq_len: int) -> int:
    """Bytes of one stored field per rollout for a prompt of ``prompt_len`` tokens, from the three
    tiny rollouts (prompt, max_seq_len) = (1, 2), (1, 3), (2, 3). An experience is
    max(max_seq_len, prompt + 1) long (palm.py generate samples at least one token); a TPO buffer row
    is the padded prompt width + max_seq_len whatever the prompt."""
    a, b, *c = stored["runs"]
    per_position = b["fields"][name] - a["fields"][name]
    per_prompt_token = c[0]["fields"][name] - b["fields"][name] if c else 0
    length = max_seq_len if stored["buffer"] else max(max_seq_len, prompt_len + 1)
    return a["fields"][name] + (length - 2) * per_position + (prompt_len - 1) * per_prompt_token


def stored_at(stored: dict[str, Any], prompt_lens: Counter, max_seq_len: int) -> dict[str, int]:
    """Mean bytes per rollout of each stored field over the prompts (train() draws them uniformly);
    ``prompt_lens`` counts the prompts of each length."""
    return {f: sum(n * stored_field(stored, f, p, max_seq_len) for p, n in prompt_lens.items()) // prompt_lens.total()
            for f in stored["runs"][1]["fields"]}


def prompt_sampling(points: list[tuple[int, float]], prompt_len: int, last: int,
                    prefill: list[tuple[int, float]] | None = None) -> float:
    """Seconds of one ``generate`` loop from a prompt of ``prompt_len`` tokens to length ``last``.
    The library's sampler: one full forward per length, ``steps_time(points, p, last)``. The
    cached sampler (``prefill`` given: its first forward's seconds per prompt length): the prompt
    once, then one position per length after it, ``prefill(p) + steps_time(points, p + 1, last)``."""
    last = max(prompt_len, last)
    if not prefill:
        return steps_time(points, prompt_len, last)
    return steps_time(prefill, prompt_len, prompt_len) + (
        steps_time(points, prompt_len + 1, last) if last > prompt_len else 0.0)


def mean_rollout_sampling(points: list[tuple[int, float]], prompt_lens: Counter, max_seq_len: int,
                          upto: int | None = None, prefill: list[tuple[int, float]] | None = None) -> float | None:
    """Mean seconds of one rollout's sampling loop over the prompts (each equally likely: train()
    draws with randrange), from lengths p to max_seq_len - 1 (``upto`` instead of that when given);
    ``prefill``: the cached sampler's (``prompt_sampling``)."""
    if not points:
        return None
    last = max_seq_len - 1 if upto is None else upto
    total = sum(n * prompt_sampling(points, p, last, prefill) for p, n in prompt_lens.items())
    return total / prompt_lens.total()


def eval_seconds(points: list[tuple[int, float]], batch: int, eval_ids, samples: int, max_seq_len: int,
                 pad: int, prefill: list[tuple[int, float]] | None = None) -> float:
    """Seconds of one [eval] scoring, derived: ``evaluation.held_out`` samples each set of
    equal-length held-out prompts as one ``generate`` call of (prompts x ``samples``) sequences to
    ``max_seq_len``; each step's time is the probe's at ``batch`` sequences (``points``; the cached
    sampler's ``prefill`` too), scaled by the ratio of the batches (a step's cost grows about
    linearly with its batch)."""
    lengths = Counter((eval_ids != pad).sum(-1).tolist())
    return sum(prompt_sampling(points, p, max_seq_len - 1, prefill) * count * samples / batch
               for p, count in lengths.items())


def take_real(out: dict[str, Any], per_rollout: int, epochs: int, measured: dict[str, Any],
              transients: dict[str, Any], probe_report: dict[str, Any]) -> None:
    """Unit figures from real rollouts and learn(): steady rollout seconds (the mean after the
    first: on a shared CPU the stalls come in bursts, and the run's sum is their mean, not their
    median),
    the first one's extra, per-experience learn seconds (second call), the first call's extra,
    transients. Anything the budget cut is left out (the prediction then says lower bound)."""
    import statistics
    intervals, learns = out.get("rollout_seconds", []), out.get("learn", [])
    probe_report["rollouts"] = {"count": len(intervals), "seconds": [round(s, 4) for s in intervals],
                                "learn": learns, "stopped": out.get("stopped")}
    why = measured.setdefault("why_missing", {})
    if not intervals:
        why["rollouts"] = "no rollout finished within --probe-seconds"
    if not learns:
        why["learn"] = "learn() did not finish within --probe-seconds"
    if intervals:
        steady = statistics.fmean(intervals[1:]) if len(intervals) > 1 else intervals[0]
        measured["rollout_s"] = steady
        measured["first_rollout_extra_s"] += max(0.0, intervals[0] - steady)
    if "rollout_peak_bytes" in out:
        transients["rollout_bytes"] = max(0, out["rollout_peak_bytes"] - (len(intervals) - 1) * per_rollout)
        transients["rollout_device_bytes"] = out["rollout_device_peak_bytes"]
    if len(learns) == 1:
        probe_report["notes"].append("learn() timed once: its one-time cost is spread over every experience "
                                     "(the learn() time is an upper bound)")
    if learns:
        last = learns[-1]
        measured["learn_item_s"] = last["seconds"] / (last["items"] * max(1, epochs))
        measured["first_learn_extra_s"] = max(0.0, learns[0]["seconds"] - last["seconds"]) if len(learns) > 1 else 0.0
        transients.update(learn_bytes=learns[0]["peak_bytes"], learn_items=learns[0]["items"],
                          learn_device_bytes=learns[0]["device_peak_bytes"])


def take_last_step(out: dict[str, Any], points, prompt_lens, max_seq_len, epochs, measured, transients,
                   probe_report, prefill: list[tuple[int, float]] | None = None) -> None:
    """Unit figures when no rollout fits the budget: sampling steps up to max_seq_len - 2 from the
    timed steps (``prefill``: the cached sampler's), plus the measured last step (one sampling step
    and the full-length scoring); learn() per experience from one experience (its first call: an
    upper bound)."""
    probe_report["last_step"] = {k: out.get(k) for k in ("seconds", "learn", "stopped")}
    if "seconds" in out:
        measured["rollout_s"] = mean_rollout_sampling(points, prompt_lens, max_seq_len, upto=max_seq_len - 2,
                                                      prefill=prefill) + out["seconds"]
        transients["rollout_bytes"] = out["rollout_peak_bytes"]
        transients["rollout_device_bytes"] = out["rollout_device_peak_bytes"]
    else:  # the sampling loop alone: without the scoring of the full sequences
        measured["rollout_s"] = mean_rollout_sampling(points, prompt_lens, max_seq_len, prefill=prefill)
        measured["lower_bound"] = True
    if points[-1][0] < max_seq_len - 1:  # the longest steps not timed: continued linearly
        measured["lower_bound"] = True
    if out.get("learn"):
        learn = out["learn"][0]
        measured["learn_item_s"] = learn["seconds"] / max(1, epochs)
        transients.update(learn_bytes=learn["peak_bytes"], learn_items=1,
                              learn_device_bytes=learn["device_peak_bytes"])


