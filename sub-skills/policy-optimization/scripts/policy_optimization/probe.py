"""The bounded probe of a run at its real size (``probe_at_real_size``): build it for real, three
tiny rollouts show what the installed trainer stores per experience, one sampling step is timed at
three lengths, then either a few real rollouts and ``learn()`` on a reduced number of experiences
(measured), or, when one rollout would not fit the budget, the last step of a rollout and
``learn()`` on its experience (extrapolated). Every stage stops at the next forward of the policy
once the deadline has passed.

Torch-free at import.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from skill_runtime import exits, placement, streams
from policy_optimization import builder, measuring, prediction

LEARN_MINIBATCHES = 4  # the probe's learn() runs on at most this many minibatches of experiences
MIB = 2**20


class ProbeTimeout(Exception):
    """Raised from a forward pre-hook on the policy's token embedding once the probe's deadline has
    passed: every forward of the policy (sampling steps, scoring, learn()) can be stopped there."""


class ProbeRaised(Exception):
    """A probe stage ended because the installed library raised there (recorded in the probe's
    report as ``raised``): the full run would raise at the same place, so the probe stops."""


def steps_time(points: list[tuple[int, float]], first: int, last: int) -> float:
    """Seconds of the sampling steps at lengths ``first .. last`` (inclusive): ``t(n)`` piecewise
    linear through the measured ``(n, seconds)`` points, continued with the last slope beyond them
    (a lower bound there: attention grows with n**2). One rollout calls ``PaLM.generate``'s loop
    once per length (palm.py ``generate``: ``max(1, seq_len - prompt_len)`` steps)."""
    points = sorted(points)

    def at(n: int) -> float:
        if len(points) == 1 or n <= points[0][0]:
            return points[0][1]
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        return max(points[-1][1], t0 + (t1 - t0) * (n - n0) / (n1 - n0))

    return sum(at(n) for n in range(first, last + 1))



@dataclass
class Probe:
    """The bounded probe of one real-size trainer: each method is one stage of the checklist, and
    every stage stops at the next forward of the policy once ``deadline`` (perf_counter seconds)
    has passed (ProbeTimeout)."""
    trainer: Any
    resolved: dict[str, Any]
    device: Any
    meter: measuring.MemoryMeter
    deadline: float

    def __post_init__(self) -> None:
        unwrap = self.trainer.accelerate.unwrap_model
        actor = unwrap(getattr(self.trainer, "actor_critic", None) or self.trainer.actor)
        self.palm, self.scope = actor.actor_palm, actor.actor_lora_scope  # the policy PaLM, its LoRA scope
        self.reward = unwrap(self.trainer.reward_model)
        self.pad = self.trainer.pad_value
        self.train_kwargs = {k: v for k, v in self.resolved["train"].items()
                             if k not in ("num_episodes", "max_timesteps", "update_timesteps", "max_seq_len")}
        self.max_seq_len = self.resolved["effective"]["train"]["max_seq_len"]
        lengths, counts = (self.trainer.prompt_token_ids != self.pad).sum(-1).unique(return_counts=True)
        self.prompt_lens = Counter(dict(zip(lengths.tolist(), counts.tolist())))  # {prompt length: prompts}
        # on the embedding: PaLM.generate calls PaLM.forward directly, which skips the PaLM's own
        # hooks, while every forward calls token_emb through its __call__
        self._hook = self.palm.token_emb.register_forward_pre_hook(self._check_deadline)

    def _check_deadline(self, *_):
        if time.perf_counter() > self.deadline:
            raise ProbeTimeout()

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def close(self) -> None:
        self._hook.remove()

    def train_once(self, rollouts: int, max_seq_len: int, on_learn: Callable[[Any], None], prompt=None):
        """The library's own ``train()`` for ``rollouts`` rollouts and one learn(), whose argument goes
        to ``on_learn`` instead of the real learn(); ``prompt`` (1, n) replaces the prompt set."""
        trainer, saved = self.trainer, (self.trainer.prompt_token_ids, self.trainer.num_prompts)
        if prompt is not None:
            trainer.prompt_token_ids, trainer.num_prompts = prompt, 1
        trainer.learn = on_learn  # an instance attribute shadows the method train() calls
        try:
            with streams.capture_library_output():
                trainer.train(num_episodes=1, max_timesteps=rollouts, update_timesteps=rollouts,
                              max_seq_len=max_seq_len, **self.train_kwargs)
        finally:
            del trainer.learn
            trainer.prompt_token_ids, trainer.num_prompts = saved

    # stages 3a and 3b share: rollouts measured from a memory mark, then the real learn() timed ------
    def rollouts_start(self, out: dict[str, Any]) -> None:
        """Reset the memory peaks before the rollouts; ``out`` keeps the RSS and device bytes now."""
        out["rss_before"], out["device_before"] = self.meter.start(), self.meter.device_now()

    def rollouts_done(self, out: dict[str, Any], stored) -> None:
        """In the learn() hook: ``out`` gets the rollouts' peak bytes above ``rollouts_start``'s mark
        and what they stored (``stored_sizes``)."""
        out["rollout_peak_bytes"] = self.meter.peak() - out["rss_before"]
        out["rollout_device_peak_bytes"] = self.meter.device_peak() - out["device_before"]
        out["stored"] = measuring.stored_sizes(stored)

    def timed_learn(self, stored, sizes: dict[str, Any], count: int) -> dict[str, Any] | None:
        """The installed ``learn()`` on the first ``count`` experiences of ``stored`` (a TPO buffer:
        on all of it; ``sizes`` is its ``stored_sizes``): ``{items, seconds, peak_bytes,
        device_peak_bytes}``, bytes above the memory before it; None when the deadline stopped it."""
        items = stored if sizes["buffer"] else deque(list(stored)[:count])
        rss0, dev0 = self.meter.start(), self.meter.device_now()
        t0 = measuring.now(self.device)
        try:
            with streams.capture_library_output():
                type(self.trainer).learn(self.trainer, items)  # the method, not train_once's stand-in
        except ProbeTimeout:
            return None
        return {"items": sizes["items"] if sizes["buffer"] else len(items), "seconds": measuring.now(self.device) - t0,
                "peak_bytes": self.meter.peak() - rss0, "device_peak_bytes": self.meter.device_peak() - dev0}

    # stage 1: what one rollout stores, at tiny lengths ---------------------------------------
    def stored_fields(self) -> dict[str, Any]:
        """Three rollouts of one prompt of the real padded width: 1 token with max_seq_len 2 and 3,
        then 2 tokens with max_seq_len 3. Every field the installed trainer stores has bytes affine in
        max_seq_len and in the prompt length, so these three fix them at any size. Also returns the
        sequences scored per rollout (the reward model's batch) and the first call's one-time cost
        (first minus second rollout, seconds)."""
        import torch
        ids = self.trainer.prompt_token_ids
        width, token = ids.shape[-1], next(t for t in (1, 2, 3) if t != self.pad)
        batches: list[int] = []
        hook = self.reward.register_forward_hook(lambda _m, inputs, _o: batches.append(int(inputs[0].shape[0])))
        runs = []
        try:
            for prompt_len, length in [(1, 2), (1, 3)] + ([(2, 3)] if width >= 2 else []):
                prompt = torch.full((1, width), int(self.pad), dtype=ids.dtype, device=ids.device)
                prompt[0, :prompt_len] = token
                got: dict[str, Any] = {}
                t0 = measuring.now(self.device)
                self.train_once(1, length, lambda stored: got.update(measuring.stored_sizes(stored)), prompt)
                runs.append({"prompt_len": prompt_len, "max_seq_len": length, "seconds": measuring.now(self.device) - t0, **got})
        finally:
            hook.remove()
        return {"runs": runs, "sequences_per_rollout": batches[0], "items": runs[1]["items"],
                "buffer": runs[1]["buffer"], "first_call_s": max(0.0, runs[0]["seconds"] - runs[1]["seconds"])}

    # stage 2: one sampling step at three lengths -------------------------------------------------
    def sampling_steps(self, batch: int) -> list[tuple[int, float]]:
        """Seconds of one ``PaLM.generate`` step (the rollout's inner loop) of ``batch`` sequences at
        lengths mean prompt, midway and max_seq_len - 1. A step cannot be stopped once started, so a
        length is skipped when its cost, scaled from the last one by (n / n_prev)**1.5 (between the
        linear layers' n and attention's n**2), would overrun the budget."""
        import torch
        first = round(sum(n * k for n, k in self.prompt_lens.items()) / self.prompt_lens.total())
        last = max(first, self.max_seq_len - 1)
        lengths = sorted({first, (first + last) // 2, last})
        kwargs = {k: self.train_kwargs[k] for k in ("temperature", "eos_token") if k in self.train_kwargs}
        points: list[tuple[int, float]] = []
        for n in lengths:
            if points and points[-1][1] * (n / points[-1][0]) ** 1.5 > self.remaining():
                break
            prompt = torch.randint(1, self.palm.num_tokens, (batch, n), device=self.device)
            samples = []
            try:
                while len(samples) < 3 and (not samples or sum(samples) < 0.3):
                    t0 = measuring.now(self.device)
                    self.palm.generate(n + 1, prompt=prompt, finetune_scope=self.scope, **kwargs)
                    samples.append(measuring.now(self.device) - t0)
            except ProbeTimeout:
                pass
            if not samples:
                break
            points.append((n, sorted(samples)[len(samples) // 2]))
        return points

    # stage 3a: real rollouts and one learn() on a reduced number of experiences -------------------
    def real_rollouts(self, rollouts: int, learn_items: int, learn: bool = True) -> dict[str, Any]:
        """``rollouts`` real rollouts at the configured max_seq_len, then (when ``learn``) the real
        learn() on the first ``learn_items`` experiences (TPO: on the buffer of ``rollouts`` groups),
        twice when the budget allows (the first includes one-time costs). Seconds and bytes; rollout
        intervals are the times between the reward model's calls (one per rollout)."""
        stamps: list[float] = []
        hook = self.reward.register_forward_hook(lambda *_: stamps.append(measuring.now(self.device)))
        out: dict[str, Any] = {"rollouts": rollouts, "learn": []}

        def on_learn(stored):
            self.rollouts_done(out, stored)
            for _ in range(2 if learn else 0):
                if out["learn"] and out["learn"][0]["seconds"] * 1.5 > self.remaining():
                    break
                timed = self.timed_learn(stored, out["stored"], learn_items)
                if timed is None:
                    break
                out["learn"].append(timed)

        self.rollouts_start(out)
        t0 = measuring.now(self.device)
        try:
            self.train_once(rollouts, self.max_seq_len, on_learn)
        except ProbeTimeout:
            out["stopped"] = "budget"
        finally:
            hook.remove()
        intervals = [b - a for a, b in zip([t0, *stamps], stamps)]
        out["rollout_seconds"] = intervals
        return out

    # stage 3b: the last step of one rollout and learn() on its experience -------------------------
    def last_step(self, learn_ok: bool) -> dict[str, Any]:
        """One rollout whose prompt has max_seq_len - 1 tokens: one sampling step and the scoring of
        full-length sequences (memory and seconds at the real size), then the real learn() on one of
        its experiences (TPO: its group) when ``learn_ok``."""
        import torch
        length = self.max_seq_len
        prompt = torch.randint(1, self.palm.num_tokens, (1, max(1, length - 1)), device=self.device)
        out: dict[str, Any] = {"learn": []}

        def on_learn(stored):
            out["seconds"] = measuring.now(self.device) - t0
            self.rollouts_done(out, stored)
            # learn() on one experience costs about 3x this step (forward and backward of the actor,
            # for PPO the critic too, over full-length sequences); the deadline hook cannot stop it
            # between the critic's forward and the optimizer steps, so it runs only when it fits
            if not learn_ok or self.remaining() < 3 * out["seconds"]:
                out["learn_skipped"] = "memory" if not learn_ok else "budget"
                return
            timed = self.timed_learn(stored, out["stored"], 1)
            if timed is not None:
                out["learn"].append(timed)

        self.rollouts_start(out)
        t0 = measuring.now(self.device)
        try:
            self.train_once(1, length, on_learn, prompt)
        except ProbeTimeout:
            out["stopped"] = "budget"
        return out



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


def mean_rollout_sampling(points: list[tuple[int, float]], prompt_lens: Counter, max_seq_len: int,
                          upto: int | None = None) -> float | None:
    """Mean seconds of one rollout's sampling loop over the prompts (each equally likely: train()
    draws with randrange), from lengths p to max_seq_len - 1 (``upto`` instead of that when given)."""
    if not points:
        return None
    last = max_seq_len - 1 if upto is None else upto
    total = sum(n * steps_time(points, p, max(p, last)) for p, n in prompt_lens.items())
    return total / prompt_lens.total()


def eval_seconds(points: list[tuple[int, float]], batch: int, eval_ids, samples: int, max_seq_len: int,
                 pad: int) -> float:
    """Seconds of one [eval] scoring, derived: ``evaluation.held_out_reward`` samples each set of
    equal-length held-out prompts as one ``generate`` call of (prompts x ``samples``) sequences to
    ``max_seq_len``; each step's time is the probe's at ``batch`` sequences (``points``), scaled
    by the ratio of the batches (a step's cost grows about linearly with its batch)."""
    lengths = Counter((eval_ids != pad).sum(-1).tolist())
    return sum(steps_time(points, p, max(p, max_seq_len - 1)) * count * samples / batch
               for p, count in lengths.items())


def take_real(out: dict[str, Any], per_rollout: int, epochs: int, measured: dict[str, Any],
              transients: dict[str, Any], probe_report: dict[str, Any]) -> None:
    """Unit figures from real rollouts and learn(): steady rollout seconds (median after the first),
    the first one's extra, per-experience learn seconds (second call), the first call's extra,
    transients. Anything the budget cut is left out (the prediction then says lower bound)."""
    import statistics
    intervals, learns = out.get("rollout_seconds", []), out.get("learn", [])
    probe_report["rollouts"] = {"count": len(intervals), "seconds": [round(s, 4) for s in intervals],
                                "learn": learns, "stopped": out.get("stopped")}
    if intervals:
        steady = statistics.median(intervals[1:]) if len(intervals) > 1 else intervals[0]
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
                   probe_report) -> None:
    """Unit figures when no rollout fits the budget: sampling steps up to max_seq_len - 2 from the
    timed steps, plus the measured last step (one sampling step and the full-length scoring);
    learn() per experience from one experience (its first call: an upper bound)."""
    probe_report["last_step"] = {k: out.get(k) for k in ("seconds", "learn", "stopped")}
    if "seconds" in out:
        measured["rollout_s"] = mean_rollout_sampling(points, prompt_lens, max_seq_len, upto=max_seq_len - 2) \
            + out["seconds"]
        transients["rollout_bytes"] = out["rollout_peak_bytes"]
        transients["rollout_device_bytes"] = out["rollout_device_peak_bytes"]
    else:  # the sampling loop alone: without the scoring of the full sequences
        measured["rollout_s"] = mean_rollout_sampling(points, prompt_lens, max_seq_len)
        measured["lower_bound"] = True
    if points[-1][0] < max_seq_len - 1:  # the longest steps not timed: continued linearly
        measured["lower_bound"] = True
    if out.get("learn"):
        learn = out["learn"][0]
        measured["learn_item_s"] = learn["seconds"] / max(1, epochs)
        transients.update(learn_bytes=learn["peak_bytes"], learn_items=1,
                              learn_device_bytes=learn["device_peak_bytes"])



def probe_at_real_size(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device,
                       meter: measuring.MemoryMeter, available: dict[str, int], progress: streams.Progress) -> dict[str, Any]:
    """Build the run for real (its prompt ids too) and probe it until ``--probe-seconds`` after the start of the build:
    construct (timed), the three tiny rollouts (always), one sampling step at three lengths, then
    real rollouts and learn() when a rollout fits the budget, else the last step of a rollout.

    Returns ``stored`` (what a rollout stores), ``per_rollout`` and ``fields_bytes`` (bytes at the
    configured size), ``base`` (bytes held before the rollouts, per pool), ``measured`` (unit
    seconds), ``transients`` (bytes above the memory before a stage) and ``report`` (the probe's
    own account: regime, stage seconds, notes, and ``raised`` {stage, error} when the library
    raised in a stage: the probe stops there, and what it had not measured stays None).
    learn() is never called when a known trap makes it raise (``learn_raises``).
    Raises SkillError(1) when the build or a stage runs out of memory."""
    from accelerate.utils import set_seed

    train, eff = resolved["effective"]["train"], resolved["effective"]["trainer"]
    max_seq_len, minibatch, epochs = train["max_seq_len"], eff["minibatch_size"], eff["epochs"]
    pool = "device" if device.type == "cuda" else "host"
    report: dict[str, Any] = {"budget_s": args.probe_seconds, "regime": None, "stages_s": {},
                              "peaks_resettable": meter.resettable, "notes": []}
    measured: dict[str, Any] = {}
    transients: dict[str, Any] = {}
    started = time.perf_counter()

    @contextlib.contextmanager
    def stage(key: str, label: str) -> Iterator[None]:
        """Time the probe step as ``stages_s[key]`` and show it as a progress line; the library
        raising inside it ends the probe (ProbeRaised), running out of memory ends the plan."""
        t0 = time.perf_counter()
        try:
            with progress.stage(f"probe: {label}"):
                yield
        except exits.SkillError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's failure is the plan's finding
            if exits.out_of_memory(exc):
                raise exits.SkillError(f"the probe at the real size ran out of memory ({key}): {exits.one_line(exc)}: "
                                    "the run does not fit the memory this process may use",
                                    exits.EXIT_CHECK_FAILED) from None
            report["raised"] = {"stage": key, "error": exits.one_line(exc)}
            report["notes"].append(f"the probe stopped: {key} raised {exits.one_line(exc)}")
            raise ProbeRaised() from None
        finally:
            report["stages_s"][key] = round(time.perf_counter() - t0, 3)

    progress.note(f"probing the run at its real size, at most {args.probe_seconds:g} s (--probe-seconds)")
    set_seed(args.seed)
    with stage("construct", "build the trainer"):
        built = builder.build(resolved, device_kwargs, device, args.seed)
        trainer = built.trainer
    measured["construct_s"] = report["stages_s"]["construct"]
    probe = Probe(trainer, resolved, device, meter, math.inf)
    stored = per_rollout = fields_bytes = base = None
    raises = prediction.learn_raises(resolved["name"], resolved)
    if raises:
        report["notes"].append(f"learn() not probed: it raises on this configuration (warning {raises[0]['code']})")
    try:
        # always: the smallest probe that shows what is stored. One thread: these tiny forwards gain
        # nothing from more, and a busy CPU makes many threads wait on each other for seconds
        with stage("stored_fields", "three tiny rollouts (what one rollout stores)"), placement.torch_threads(1):
            stored = probe.stored_fields()
        # the run's memory before its rollouts: the trainer, plus what the first rollout loads for
        # good (einx and sympy tracing state); the tiny rollouts' experiences are freed
        base = {"host": meter.rss(), **({"device": meter.device_now()} if pool == "device" else {})}
        probe.deadline = started + args.probe_seconds
        group_size, items = stored["sequences_per_rollout"], stored["items"]
        fields_bytes = stored_at(stored, probe.prompt_lens, max_seq_len)
        per_rollout = sum(fields_bytes.values())
        items_per_learn = train["update_timesteps"] * items
        measured["first_rollout_extra_s"] = stored["first_call_s"]
        with stage("sampling_steps", "one sampling step at three lengths"):
            points = probe.sampling_steps(group_size)
        report["sampling_step_s"] = [[n, round(s, 5)] for n, s in points]
        sampling_s = mean_rollout_sampling(points, probe.prompt_lens, max_seq_len)
        if built.eval_prompt_ids is not None and points:
            measured["eval_s"] = eval_seconds(points, group_size, built.eval_prompt_ids, resolved["eval"]["samples"],
                                              max_seq_len, probe.pad)
        # learn() on a few minibatches: memory grows over the first ones (the allocator's heap)
        learn_target = min(LEARN_MINIBATCHES * minibatch, items_per_learn) or 1
        wanted = max(3, math.ceil(learn_target / items))
        estimate = (sampling_s or 0.0) * 1.25
        affordable = int(probe.remaining() * 0.5 // estimate) if estimate > 0 else wanted
        if sampling_s is not None and affordable >= 1:
            report["regime"] = "measured"
            r = min(wanted, affordable)
            with stage(f"{r} real rollouts and learn()", f"{r} real rollouts" + ("" if raises else " and one learn()")):
                out = probe.real_rollouts(r, min(learn_target, r * items), learn=not raises)
            take_real(out, per_rollout, epochs, measured, transients, report)
        elif sampling_s is not None:
            report["regime"] = "extrapolated"
            seqs_per_item = group_size if stored["buffer"] else 1
            guess = 12 * seqs_per_item * max_seq_len * resolved["palm"]["num_tokens"] * 4
            learn_ok = guess < 0.5 * (available[pool] - meter.rss())
            if not learn_ok and not raises:
                report["notes"].append(f"learn() not probed: about {guess / MIB:,.0f} MiB of activations "
                                       "for one experience would not fit half the free memory")
            # the last step: one sampling step and about three full-length forwards (scoring)
            n_last, t_last = points[-1]
            step = t_last * (max_seq_len / n_last) ** 2  # a full-length forward, at most
            with stage("last rollout step and learn()", "the last step of one rollout, and learn()"):
                out = probe.last_step(learn_ok and not raises) if 4 * step < probe.remaining() else {}
            if out.get("learn_skipped") == "budget" or not out and not raises:
                report["notes"].append("learn() not probed: it would overrun --probe-seconds"
                                       + ("" if out else ", as would the last rollout step"))
            take_last_step(out, points, probe.prompt_lens, max_seq_len, epochs, measured, transients, report)
        else:
            report["notes"].append("no sampling step timed within --probe-seconds: time not predicted")
    except ProbeRaised:
        pass
    finally:
        probe.close()
    report["elapsed_s"] = round(time.perf_counter() - started, 3)
    return {"stored": stored, "per_rollout": per_rollout, "fields_bytes": fields_bytes, "base": base,
            "measured": measured, "transients": transients, "report": report}

