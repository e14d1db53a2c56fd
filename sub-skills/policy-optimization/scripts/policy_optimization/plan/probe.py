"""The bounded probe of a run at its real size (``probe_at_real_size``): build it for real, three
tiny rollouts show what the installed trainer stores per experience, sampling steps are timed at
four lengths (round-robin), then either a few real rollouts and ``learn()`` on a reduced number of
experiences (measured), or, when one rollout would not fit the budget, the last step of a rollout and
``learn()`` on its experience (extrapolated). Every stage stops at the next forward of the policy
once the deadline has passed.

Torch-free at import.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from skill_runtime import exits, placement, streams
from policy_optimization import builder, measuring
from policy_optimization.plan import prediction, unit_costs

LEARN_MINIBATCHES = 4  # the probe's learn() runs on at most this many minibatches of experiences
SAMPLING_LENGTHS = 4    # sampling steps timed at this many lengths, mean prompt to max_seq_len - 1
SAMPLING_ROUNDS = 4     # round-robin rounds over the lengths: a warm-up, then up to three timed steps
SAMPLING_SHARE = 0.35   # at most this share of the remaining probe budget goes to the sampling steps
ONE_THREAD_BELOW = 0.6  # a CPU share below this (threads waiting on each other): time one thread too
MIB = 2**20


class ProbeTimeout(Exception):
    """Raised from a forward pre-hook on the policy's token embedding once the probe's deadline has
    passed: every forward of the policy (sampling steps, scoring, learn()) can be stopped there."""


class ProbeRaised(Exception):
    """A probe stage ended because the installed library raised there (recorded in the probe's
    report as ``raised``): the full run would raise at the same place, so the probe stops."""


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
        import cached_sampler
        self.cached = cached_sampler.installed(self.palm)  # the run's sampler (builder.build installed it)
        self.prefill_points: list[tuple[int, float]] = []   # the cached sampler's prompt forward, per length

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
        """The installed ``learn()`` on ``count`` experiences of ``stored``, taken in order and again
        from the first when there are fewer (a TPO buffer: on all of it; ``sizes`` is its
        ``stored_sizes``): ``{items, seconds, peak_bytes, device_peak_bytes}``, bytes above the
        memory before it; None when the deadline stopped it. Repeating experiences keeps the
        run's minibatch shape (``whole_minibatches``): a minibatch's time is not proportional to
        its experiences (on a GPU, launch-bound at these sizes, 8 cost about what 16 do)."""
        items = stored if sizes["buffer"] else deque(itertools.islice(itertools.cycle(list(stored)), count))
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

    # stage 2: sampling steps at four lengths -------------------------------------------------
    def step(self, prompt) -> tuple[float, float | None]:
        """Seconds of one sampling step of ``generate`` (the rollout's inner loop) on ``prompt``
        (b, n), and None; with the cached sampler (the run's), ``generate`` of two tokens, timed at
        its forwards (a pre-hook on ``token_emb``): the one-position step at length n + 1, and the
        prompt's forward (prefill) at length n."""
        kwargs = {k: self.train_kwargs[k] for k in ("temperature", "eos_token") if k in self.train_kwargs}
        stamps: list[float] = []
        hook = self.palm.token_emb.register_forward_pre_hook(lambda *_: stamps.append(measuring.now(self.device)))
        t0 = measuring.now(self.device)
        try:
            self.palm.generate(prompt.shape[-1] + (2 if self.cached else 1), prompt=prompt, finetune_scope=self.scope,
                               **kwargs)
        finally:
            hook.remove()
        end = measuring.now(self.device)
        if not self.cached or len(stamps) < 2:  # eos in every row after the prompt's forward: no step
            return end - t0, None
        return end - stamps[1], stamps[1] - t0

    def sampling_steps(self, batch: int) -> list[tuple[int, float]]:
        """Seconds of one ``PaLM.generate`` step of ``batch`` sequences at SAMPLING_LENGTHS lengths
        spread from the mean prompt to max_seq_len - 1, taken round-robin (a burst of load on a
        shared CPU then hits every length alike): per round one step at each length, up to
        SAMPLING_ROUNDS rounds, within SAMPLING_SHARE of the remaining budget. The first step at a
        length is a warm-up (the allocator grows its heap for the longer tensors); the figure is the
        mean of the others (the run's sum over many steps is their mean), the warm-up only when it
        is the one step taken. A step cannot be stopped once started, so a length is skipped when
        its cost (its last step; before its first, the previous length's scaled by (n / n_prev)**1.5,
        between the linear layers' n and attention's n**2) would overrun the share (the deadline for
        its first step). Also records ``sampling_cpu`` (process CPU seconds, wall seconds, threads) for
        ``threads_check``. With the cached sampler (``step``) the points are its one-position steps,
        and ``prefill_points`` its prompt forwards at the same lengths."""
        import torch
        first = round(sum(n * k for n, k in self.prompt_lens.items()) / self.prompt_lens.total())
        last = max(first, self.max_seq_len - 1)
        lengths = sorted({round(first + (last - first) * i / (SAMPLING_LENGTHS - 1)) for i in range(SAMPLING_LENGTHS)})
        end = time.perf_counter() + max(0.0, self.remaining()) * SAMPLING_SHARE
        samples: dict[int, list[float]] = {n: [] for n in lengths}
        prefills: dict[int, list[float]] = {n: [] for n in lengths}
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            for _ in range(SAMPLING_ROUNDS):
                previous = None
                for n in lengths:
                    cost = samples[n][-1] + (prefills[n][-1] if prefills[n] else 0.0) if samples[n] else (
                        previous[1] * (n / previous[0]) ** 1.5 if previous else 0.0)
                    if time.perf_counter() + cost > (end if samples[n] else self.deadline):
                        break
                    prompt = torch.randint(1, self.palm.num_tokens, (batch, n), device=self.device)
                    step_s, prefill_s = self.step(prompt)
                    samples[n].append(step_s)
                    if prefill_s is not None:
                        prefills[n].append(prefill_s)
                    previous = (n, samples[n][-1] + (prefill_s or 0.0))
        except ProbeTimeout:
            pass
        self.sampling_cpu = (time.process_time() - cpu0, time.perf_counter() - wall0, torch.get_num_threads())
        mean = lambda s: sum(s[1:]) / len(s[1:]) if len(s) > 1 else s[0]
        self.prefill_points = [(n, mean(s)) for n, s in prefills.items() if s]
        return [(n + self.cached, mean(s)) for n, s in samples.items() if s]  # cached: the step at n + 1

    def threads_check(self, batch: int, points: list[tuple[int, float]]) -> dict[str, Any] | None:
        """With more than one torch thread and a CPU share below ONE_THREAD_BELOW (process CPU
        seconds over wall seconds x threads, in ``sampling_steps``): the shortest step timed again
        with one thread (a warm-up, then the mean of two). OpenMP threads on a busy CPU wait on each
        other at every operation, so one thread can be many times faster there. Returns
        ``{threads, cpu_share, step_s, one_thread_step_s}`` or None when not checked."""
        import torch
        cpu, wall, threads = getattr(self, "sampling_cpu", (0.0, 0.0, 1))
        if threads < 2 or not points or wall <= 0:
            return None
        share = cpu / (wall * threads)
        if share >= ONE_THREAD_BELOW or points[0][1] * 3 > self.remaining():
            return None
        n, step = points[0]
        prompt = torch.randint(1, self.palm.num_tokens, (batch, n - self.cached), device=self.device)
        try:
            with placement.torch_threads(1):
                times = [self.step(prompt)[0] for _ in range(3)][1:]
        except ProbeTimeout:
            return None
        return {"threads": threads, "cpu_share": round(share, 3), "length": n, "step_s": round(step, 5),
                "one_thread_step_s": round(sum(times) / len(times), 5)}

    # stage 3a: real rollouts and one learn() on a reduced number of experiences -------------------
    def real_rollouts(self, rollouts: int, learn_items: int, learn: bool = True, repeats: int = 2) -> dict[str, Any]:
        """``rollouts`` real rollouts at the configured max_seq_len, then (when ``learn``) the real
        learn() on the first ``learn_items`` experiences (TPO: on the buffer of ``rollouts`` groups),
        ``repeats`` times when the budget allows (the first includes one-time costs). Seconds and
        bytes; rollout intervals are the times between the reward model's calls (one per rollout)."""
        stamps: list[float] = []
        hook = self.reward.register_forward_hook(lambda *_: stamps.append(measuring.now(self.device)))
        out: dict[str, Any] = {"rollouts": rollouts, "learn": []}

        def on_learn(stored):
            self.rollouts_done(out, stored)
            for _ in range(repeats if learn else 0):
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



def whole_minibatches(items: int, minibatch: int, items_per_learn: int) -> int:
    """The experiences the probe's learn() runs on for ``items`` stored ones: rounded up to whole
    minibatches of ``minibatch_size`` (``timed_learn`` repeats experiences to fill them), at most the
    run's own ``items_per_learn``. learn_item_s is then a full minibatch's seconds per experience,
    the run's shape: measured on an H200 (dim 512, depth 12, 640 tokens) learn() on fewer
    experiences than one minibatch made plan predict 3.40 s for a learn() that took 2.03 s."""
    return max(1, min(items_per_learn, -(-items // minibatch) * minibatch))


def missing(report: dict[str, Any], measured: dict[str, Any], part: str, why: str) -> None:
    """A figure the probe could not measure: ``why`` in its notes and as the reason the report
    gives for ``part``'s dash (``measured["why_missing"]``)."""
    report["notes"].append(why)
    measured.setdefault("why_missing", {})[part] = why


def probe_at_real_size(args, resolved: dict[str, Any], device_kwargs: dict[str, Any], device,
                       meter: measuring.MemoryMeter, available: dict[str, int], progress: streams.Progress,
                       one_round: bool = False) -> dict[str, Any]:
    """Build the run for real (its prompt ids too) and probe it until ``--probe-seconds`` after the start of the build:
    construct (timed), the three tiny rollouts (always), sampling steps at four lengths, then
    real rollouts and learn() when a rollout fits the budget, else the last step of a rollout.

    Returns ``stored`` (what a rollout stores), ``per_rollout`` and ``fields_bytes`` (bytes at the
    configured size), ``prompt_lens`` (prompts per unpadded length), ``base`` (bytes held before the rollouts, per pool), ``measured`` (unit
    seconds), ``transients`` (bytes above the memory before a stage) and ``report`` (the probe's
    own account: regime, stage seconds, notes, and ``raised`` {stage, error} when the library
    raised in a stage: the probe stops there, and what it had not measured stays None).
    learn() is never called when a known trap makes it raise (``learn_raises``). With
    ``one_round`` (plan --one-round), after the probe: one round at the real size, unbounded by the
    budget: update_timesteps rollouts and one learn() on all their experiences (``one_round`` in
    the report: what ``real_rollouts`` returns). The report also has the 1-minute load average at
    its start and end (``load_average``) and ``threads_check`` (``Probe.threads_check``).
    Raises SkillError(1) when the build or a stage runs out of memory."""
    from accelerate.utils import set_seed

    train, eff = resolved["effective"]["train"], resolved["effective"]["trainer"]
    max_seq_len, minibatch, epochs = train["max_seq_len"], eff["minibatch_size"], eff["epochs"]
    pool = "device" if device.type == "cuda" else "host"
    report: dict[str, Any] = {"budget_s": args.probe_seconds, "regime": None, "stages_s": {},
                              "sampler": resolved.get("sampler", "library"),
                              "peaks_resettable": meter.resettable, "notes": [],
                              "load_average": {"start": measuring.load_average(), "end": None,
                                               "cpus": placement.usable_cpus()}}
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

    progress.note(f"probing the run at its real size, at most {args.probe_seconds:g} s (--probe-seconds)"
                  f" at load average {report['load_average']['start']} on {report['load_average']['cpus']} CPUs")
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
        fields_bytes = unit_costs.stored_at(stored, probe.prompt_lens, max_seq_len)
        per_rollout = sum(fields_bytes.values())
        items_per_learn = train["update_timesteps"] * items
        measured["first_rollout_extra_s"] = stored["first_call_s"]
        with stage("sampling_steps", f"sampling steps at {SAMPLING_LENGTHS} lengths"):
            points = probe.sampling_steps(group_size)
            report["threads_check"] = probe.threads_check(group_size, points)
        report["sampling_step_s"] = [[n, round(s, 5)] for n, s in points]
        prefill = probe.prefill_points or None
        if prefill:
            report["prefill_s"] = [[n, round(s, 5)] for n, s in prefill]
        sampling_s = unit_costs.mean_rollout_sampling(points, probe.prompt_lens, max_seq_len, prefill=prefill)
        if built.eval_prompt_ids is not None and points:
            measured["eval_s"] = unit_costs.eval_seconds(points, group_size, built.eval_prompt_ids, resolved["eval"]["samples"],
                                              max_seq_len, probe.pad, prefill=prefill)
        # learn() on a few minibatches: memory grows over the first ones (the allocator's heap)
        learn_target = min(LEARN_MINIBATCHES * minibatch, items_per_learn) or 1
        wanted = max(3, math.ceil(learn_target / items))
        estimate = (sampling_s or 0.0) * 1.25
        affordable = int(probe.remaining() * 0.5 // estimate) if estimate > 0 else wanted
        if sampling_s is not None and affordable >= 1:
            report["regime"] = "measured"
            r = min(wanted, affordable)
            with stage(f"{r} real rollouts and learn()", f"{r} real rollouts" + ("" if raises else " and one learn()")):
                out = probe.real_rollouts(r, whole_minibatches(min(learn_target, r * items), minibatch, items_per_learn),
                                          learn=not raises)
            unit_costs.take_real(out, per_rollout, epochs, measured, transients, report)
        elif sampling_s is not None:
            report["regime"] = "extrapolated"
            seqs_per_item = group_size if stored["buffer"] else 1
            guess = 12 * seqs_per_item * max_seq_len * resolved["palm"]["num_tokens"] * 4
            learn_ok = guess < 0.5 * (available[pool] - meter.rss())
            if not learn_ok and not raises:
                missing(report, measured, "learn", f"learn() not probed: about {guess / MIB:,.0f} MiB of activations "
                                                   "for one experience would not fit half the free memory")
            # the last step: one sampling step and about three full-length forwards (scoring)
            n_last, t_last = (prefill or points)[-1]  # a full forward at n_last: the library's step, the cache's prefill
            step = t_last * (max_seq_len / n_last) ** 2  # a full-length forward, at most
            with stage("last rollout step and learn()", "the last step of one rollout, and learn()"):
                out = probe.last_step(learn_ok and not raises) if 4 * step < probe.remaining() else {}
            if out.get("learn_skipped") == "budget" or not out and not raises:
                missing(report, measured, "learn", "learn() not probed: it would overrun --probe-seconds"
                                                   + ("" if out else ", as would the last rollout step"))
            unit_costs.take_last_step(out, points, probe.prompt_lens, max_seq_len, epochs, measured, transients, report,
                                      prefill=prefill)
        else:
            missing(report, measured, "rollouts", "no sampling step timed within --probe-seconds: time not predicted")
        if one_round and not report.get("raised"):
            probe.deadline = math.inf
            with stage("one round", f"one round at the real size: {train['update_timesteps']} rollouts and one learn()"):
                report["one_round"] = probe.real_rollouts(train["update_timesteps"], items_per_learn, learn=not raises,
                                                          repeats=1)
    except ProbeRaised:
        pass
    finally:
        probe.close()
    report["elapsed_s"] = round(time.perf_counter() - started, 3)
    report["load_average"]["end"] = measuring.load_average()
    if raises:
        measured.setdefault("why_missing", {})["learn"] = f"learn() raises on this configuration (warning {raises[0]['code']})"
    return {"stored": stored, "per_rollout": per_rollout, "fields_bytes": fields_bytes, "base": base,
            "measured": measured, "transients": transients, "report": report, "prompt_lens": probe.prompt_lens}

