"""``Run``: a real training run in rounds of the library's own ``train()``.

A round is one call of the trainer's own ``train(num_episodes=1, max_timesteps=M,
update_timesteps=U, ...)`` (``run_config.train_kwargs``): M rollouts and, with the default M = U,
exactly one ``learn()``, as the bounded-run recipe does
(workflows.md#bounded-train-when-does-learn-really-run). Between rounds the run writes one
metrics row (``metrics``), runs the watchdog (``watchdog``), scores the
held-out prompts every ``[eval] every`` rounds (``evaluation.of_run``: per prompt, and the gold
metric), logs to the trackers (``trackers``) and checkpoints every ``[run] checkpoint_every``
rounds (``checkpoint``). ``--cpu-threads auto`` times round 1 at two thread counts (``threads``). At the end it exports the policy (``export``) and writes ``summary.json``.

The command line (``train_run.py``, ``palm-rlhf-skill train``) is a thin layer over ``train``.
"""
from __future__ import annotations

import json
import math
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from policy_optimization import builder, evaluation, reward_programs, run_config, trainers
from policy_optimization.run import export, metrics, threads, watchdog
from policy_optimization.run import summary as run_summary
from reward_modeling import artifacts
from run_kit import alarms, checkpoint, claiming, command, launch, lock, rundir, trackers
from skill_runtime import exits, placement, streams, workspace

PROG = "palm-rlhf-skill train"
EVAL_SEED_OFFSET = 7919      # held-out sampling seed = [run] seed + this: the same noise at every evaluation


@dataclass
class Options(command.RunOptions):
    """How to run, beside the config: the run options of every run command (``command.RunOptions``),
    notes said as ``palm-rlhf-skill train``, and ``stop_on`` rule ids that end the run (exit 1);
    ``cpu_threads`` ``"auto"`` (time round 1 at one thread and torch's default, keep the faster:
    ``threads``), a count, or None (torch's as it is)."""
    say: Callable[[str], None] = field(default_factory=lambda: command.stderr_lines(PROG, sys.stderr))
    stop_on: frozenset[str] = frozenset()
    cpu_threads: str | int | None = None


GROWABLE = frozenset({"run.rounds"})  # a resume may change these keys: a run can be extended


def file_digests(config: dict[str, Any]) -> dict[str, str]:
    """``rundir.file_digests`` of every file the config names (``run_config.PATH_KEYS``; a
    program's file): a resume with an edited reward program or prompt file is a changed run."""
    named = [(f"{section}.{key}", value.rpartition(":")[0] if (section, key) in run_config.PROGRAM_KEYS else value)
             for section, key in run_config.PATH_KEYS if (value := config.get(section, {}).get(key))]
    return rundir.file_digests(named)


@dataclass
class Run:
    """One run: its directory, config, trainer and state. Build with ``Run.open``; ``rounds()``
    trains; ``finish()`` exports. Single- or multi-process (every rank builds a Run; the main
    process writes the files)."""
    run: rundir.RunDir
    config: dict[str, Any]
    resolved: dict[str, Any]
    built: builder.Built
    device: Any
    options: Options
    rows: list[dict[str, Any]]
    start: int
    facts: watchdog.RunFacts
    started_s: float = field(default_factory=time.perf_counter)
    stop_signal: int | None = None
    last_checkpoint: Path | None = None
    groups: dict[str, list] = field(default_factory=dict)   # trainable tensors per group (trainers.trainable_groups)
    policy_palm: Any = None                                  # the policy's PaLM and LoRA scope, unwrapped once
    scope: str | None = None
    lock: lock.RunLock | None = None                       # the run directory's, held until finish()
    run_id: str | None = None                                # run_config.json's (None: a run of an older version)
    notes: list[str] = field(default_factory=list)           # warnings for summary.json (an inexact resume, ...)
    unseen: Any = None      # (num_tokens,) bool: ids the reward model never trained on (metrics.unseen_mask), or None
    gold: Any = None        # the [eval] gold metric (a RuleReward), or None
    threads: dict[str, Any] = field(default_factory=dict)  # threads.start's record; a resume's: its checkpoint's

    @property
    def name(self) -> str:
        return self.resolved["name"]

    @property
    def trainer(self):
        return self.built.trainer

    @property
    def main(self) -> bool:
        return self.trainer.accelerate.is_main_process

    @property
    def rounds_planned(self) -> int:
        return self.resolved["round"]["rounds"]

    # --- building -----------------------------------------------------------------------------
    @classmethod
    def open(cls, config_path: str | None, run_dir: str | Path, device_spec: str = "auto", resume: bool = False,
             force: bool = False, overrides: list[str] | None = None, options: Options | None = None) -> "Run":
        """``prepare`` then ``build``: a run ready for ``rounds``."""
        return cls.build(prepare(config_path, run_dir, resume, force, overrides, options or Options()), device_spec)

    @classmethod
    def build(cls, prepared: "Prepared", device_spec: str = "auto") -> "Run":
        """``_build``; a refusal (any exception) releases the run directory and leaves nothing of a
        directory this invocation created (``Prepared.refused``)."""
        try:
            self = cls._build(prepared, device_spec)
        except BaseException:
            prepared.refused()
            raise
        self.lock = prepared.lock
        return self

    @classmethod
    def _build(cls, prepared: "Prepared", device_spec: str = "auto") -> "Run":
        """Build the trainer of a ``prepare``d run (``builder.build``) on ``device_spec`` with the
        DDP fixes (a no-op in one process) and every rotary table at the run's longest sequence;
        then restore the latest checkpoint (a resume) or score the held-out prompts once before
        training (row 0). Raises SkillError (2: the device or the library refuses the config)."""
        options, resolved, run = prepared.options, prepared.resolved, prepared.run
        device_kwargs, device = prepared.place(device_spec)
        if options.log_with:
            device_kwargs = {**device_kwargs, **trackers.accelerate_kwargs(options.log_with, run.trackers)}
        from accelerate.utils import set_seed
        set_seed(resolved["run"]["seed"])
        built = builder.build(resolved, device_kwargs, device, seed=resolved["run"]["seed"])
        import ddp_fixes
        ddp_fixes.apply_ddp_fixes(built.trainer)  # a no-op in one process (distributed.md#what-each-trainer-needs)
        name, trainer = resolved["name"], built.trainer
        coverage = prepared.coverage
        gold = reward_programs.rule_reward(resolved, anchor=False, section="eval")
        self = cls(run, prepared.loaded["config"], resolved, built, device, options, rows=[], start=0,
                   facts=run_facts(resolved, built, coverage is not None), groups=trainers.trainable_groups(name, trainer),
                   policy_palm=trainers.actor_palm(name, trainer), scope=trainers.actor_scope(name, trainer),
                   run_id=prepared.loaded.get("run_id"),
                   unseen=None if coverage is None else metrics.unseen_mask(coverage, resolved["palm"]["num_tokens"]),
                   gold=None if gold is None else gold.to(device))
        self.check_prompt_lengths()
        checkpoint.prime_rotary_to(self.trainer, self.rotary_cap())
        state, self.last_checkpoint, note = checkpoint.restore(self.trainer, run, prepared.resume, self.run_id, name,
                                                               self.rotary_cap(), options.allow_inexact, options.say)
        self.start, self.notes = (state["round"] if state else 0), ([note] if note else [])
        if state:
            self.threads = state.get("cpu_threads") or {}
        self.trainer.accelerate.wait_for_everyone()  # every rank has read the run directory (prepare) first
        if self.main:  # the rows through the checkpoint (checked, or restored from it); later ones are rerun
            self.rows = checkpoint.begin(run, prepared.resume, state, self.last_checkpoint, metrics.parse_row,
                                         options.say, prepared.loaded)
        if options.log_with and self.main:
            trackers.start(self.trainer, run.path.name, self.config, self.start + 1)
        if not self.rows and self.main:
            if self.built.eval_prompt_ids is not None and options.progress:  # a reward that hangs shows here
                options.say(f"round 0: scoring the {int(self.built.eval_prompt_ids.shape[0])} held-out prompts "
                            f"({resolved['eval']['samples']} samples each) before training")
            self.write_row(self.baseline_row())
        return self

    def check_prompt_lengths(self) -> None:
        """Refuse (SkillError 2) a max_seq_len that leaves a training or held-out prompt no room
        for a response: the library samples ``max(1, max_seq_len - n)`` tokens after an n-id prompt
        (``advice.prompts_fill_max_seq_len``), so the run would learn from one-token responses."""
        from collections import Counter

        from policy_optimization.plan import advice
        pad = int(self.trainer.pad_value)
        lengths = Counter((self.built.prompt_ids != pad).sum(-1).tolist())
        if self.built.eval_prompt_ids is not None:
            lengths += Counter((self.built.eval_prompt_ids != pad).sum(-1).tolist())
        full = advice.prompts_fill_max_seq_len(dict(lengths), self.train_kwargs()["max_seq_len"])
        if full:
            raise exits.SkillError(f"config [train] max_seq_len: {full['message']} (training and held-out prompts): "
                                   f"set {full['fix']}")

    def rotary_cap(self) -> int:
        """This run's ``rotary_cap`` (at [train] max_seq_len)."""
        return rotary_cap(self.built, self.train_kwargs()["max_seq_len"])

    def train_kwargs(self) -> dict[str, Any]:
        """One round's ``train()`` arguments with the library's defaults filled in."""
        effective = self.resolved["effective"]["train"]
        return {**{k: effective[k] for k in ("max_seq_len", "eos_token", "temperature") if k in effective},
                **run_config.train_kwargs(self.resolved)}

    # --- one round ----------------------------------------------------------------------------
    def held_out(self) -> evaluation.HeldOut | None:
        """The held-out evaluation now (``evaluation.of_run``: reward, per prompt, the gold metric),
        or None without [eval]; the main process only."""
        if self.built.eval_prompt_ids is None or not self.main:
            return None
        try:  # as a round: the library's output captured, the user's prints on stderr (program_output)
            with streams.capture_library_output():
                return evaluation.of_run(
                    self.resolved, self.policy_palm, self.scope,
                    trainers.unwrap(self.trainer, self.trainer.reward_model), self.built.eval_prompt_ids,
                    self.resolved["run"]["seed"] + EVAL_SEED_OFFSET, metric=self.gold,
                    pad_value=int(self.trainer.pad_value))
        except Exception as exc:  # noqa: BLE001 - sorted: the user's program, or the library
            raise round_error(f"the held-out evaluation after round {self.rows[-1]['round'] if self.rows else 0}",
                              exc) from None

    def baseline_row(self) -> dict[str, Any]:
        """Row 0: the held-out reward before training, every other figure null."""
        row = dict.fromkeys(metrics.ROW_KEYS)
        row.update(metrics.held_out_figures(self.held_out(), self.built.eval_groups), round=0, rules=[])
        return row

    def evaluates(self, round_: int) -> bool:
        return self.resolved["eval"] is not None and round_ in run_config.eval_points(
            self.rounds_planned, self.resolved["eval"]["every"])

    def one_round(self, round_: int) -> dict[str, Any]:
        """Train round ``round_`` and return its row (rules filled). Raises SkillError(2) when the
        reward program raised or returned a wrong shape, SkillError(1) when the library raised."""
        name, trainer = self.name, self.trainer
        before = metrics.snapshot_trainable(self.groups)
        meter = measuring_meter(self.device)
        t0 = time.perf_counter()
        seen = None
        try:
            with metrics.observe(name, trainer, self.unseen) as seen, streams.capture_library_output() as captured:
                trainer.train(**self.train_kwargs())
        except Exception as exc:  # noqa: BLE001 - sorted: the user's program, or the library
            raise round_error(f"round {round_}", exc, seen.rewards if seen else None) from None
        wall = time.perf_counter() - t0
        seen = gathered(self.trainer, seen)
        norms, non_finite = metrics.change_norms(self.groups, before)
        probe = metrics.policy_probe(self.policy_palm, self.scope, seen) if self.main else {"entropy": None, "kl_base": None}
        held = self.held_out() if self.evaluates(round_) else None
        memory = {"peak_mib": round(meter.peak() / 2**20, 1), "rss_mib": round(meter.rss() / 2**20, 1)}
        lr = trainers.optimizers(name, trainer)["actor"].param_groups[0]["lr"]
        gain = metrics.unseen_gain(trainers.unwrap(trainer, trainer.reward_model), seen, self.unseen,
                                   self.resolved["run"]["seed"] + round_) if self.main else None
        row = metrics.build_row(round_, seen, self.facts.grouped, wall, captured.stdout, memory, probe, norms,
                                non_finite, lr, held, self.unseen, gain, self.built.eval_groups)
        fired = alarms.evaluate(watchdog.RULES, row, self.rows, self.facts) if self.main else []
        row["rules"] = self.from_main([rule.id for rule, _ in fired])  # every rank stops on the same rules
        if self.main:
            previous = set(self.rows[-1]["rules"]) if self.rows else set()
            for rule, value in fired:
                if rule.id not in previous:
                    self.options.say(alarms.alarm_line(rule, value, round_))
        return row

    def from_main(self, value: Any) -> Any:
        """``value`` as the main process has it, on every process (one broadcast; itself alone)."""
        if self.trainer.accelerate.num_processes == 1:
            return value
        from accelerate.utils import broadcast_object_list
        return broadcast_object_list([value])[0]

    def any_rank(self, flag: int | None) -> int | None:
        """The first non-None ``flag`` of any process (a signal one rank received), on every process."""
        if self.trainer.accelerate.num_processes == 1:
            return flag
        from accelerate.utils import gather_object
        return next((f for f in gather_object([flag]) if f is not None), None)

    def write_row(self, row: dict[str, Any]) -> None:
        """Append ``row`` to metrics.jsonl and the trackers (main process), and to ``rows``.
        Raises SkillError(2) when the disk refuses the row."""
        self.rows.append(row)
        if self.main:
            rundir.append_row_or_refuse(self.run, row)
            if self.options.log_with:  # round 0 too: the held-out reward before training
                trackers.log(self.trainer, row)

    def save(self, round_: int) -> Path:
        """A checkpoint of the run after ``round_``, carrying its rows since the last checkpoint
        (and the digest of those before: ``resumed_rows``). Raises SkillError(2) when the disk
        refuses it (full, read-only: OSError, safetensors' SafetensorError, torch's RuntimeError;
        ``exits.write_failed``), SkillError(1) for another failure: the previous checkpoint stays
        the latest either way."""
        self.last_checkpoint = checkpoint.save_rounds(self.trainer, self.run, round_, self.rows, self.last_checkpoint,
                                                      self.run_id, self.name, {"cpu_threads": self.threads})
        return self.last_checkpoint

    # --- the rounds ---------------------------------------------------------------------------
    def rounds(self, progress: streams.Progress) -> tuple[str, str | None]:
        """Train from the round after ``start`` to ``options.until`` (or ``[run] rounds``).
        Returns (status, reason): ``finished``; ``paused`` (``until`` reached); ``stopped`` (a
        rule of ``stop_on`` fired); ``interrupted`` (SIGINT/SIGTERM, after the round in progress).
        Every status but an error checkpoints first. The rounds run in a private working directory
        (TPO's ``train()`` writes ``./tpo_memmap_replay_buffer``), never the caller's."""
        last = min(self.options.until or self.rounds_planned, self.rounds_planned)
        every = self.resolved["run"]["checkpoint_every"]
        import torch
        before_threads = torch.get_num_threads()
        self.threads = threads.start(self.options.cpu_threads, self.threads, self.device.type == "cpu",
                                     self.trainer.accelerate.num_processes, fresh=self.start == 0)
        try:
            return self._rounds(progress, last, every)
        finally:
            torch.set_num_threads(before_threads)

    def _rounds(self, progress: streams.Progress, last: int, every: int) -> tuple[str, str | None]:
        """``rounds`` once the thread count is set."""
        began = time.perf_counter()
        with workspace.private_workdir(), command.deferred_signals(self.options.say) as signals, progress.stage(
                f"{self.name}: rounds {self.start + 1}-{last}", total=max(0, last - self.start), unit="rounds",
                eta=True) as bar:
            for round_ in range(self.start + 1, last + 1):
                if self.threads.get("trial"):
                    row = threads.trial(self, lambda: self.one_round(round_), self.options.say)
                else:
                    row = self.one_round(round_)
                self.write_row(row)
                run_summary.report_round(progress, bar, row, last, began, self.start)
                stop = sorted(set(row["rules"]) & self.options.stop_on)
                signals.requested = self.any_rank(signals.requested)
                if round_ % every == 0 or round_ == last or stop or signals.requested:
                    self.save(round_)
                if stop:
                    return "stopped", f"rule {', '.join(stop)} fired at round {round_} (--stop-on)"
                if signals.requested:
                    return "interrupted", (f"{signal.Signals(signals.requested).name} during round {round_}, which "
                                           "finished and was checkpointed")
        return ("finished", None) if last == self.rounds_planned else ("paused", f"--until {last}")

    def finish(self, status: str, reason: str | None) -> dict[str, Any]:
        """Export the policy (a finished run), write summary.json and close the trackers (main
        process); returns the summary."""
        files = {"metrics": str(self.run.metrics), "config": str(self.run.config),
                 "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None}
        failed = None
        if status == "finished" and self.main:
            try:
                files["policy"] = str(export.export_policy(self.name, self.trainer, self.run.policy))
            except Exception as err:  # noqa: BLE001 - a full disk (torch's RuntimeError), or anything else
                status, reason = "failed", f"writing {self.run.policy} failed ({exits.one_line(err)})"
                failed = exits.SkillError(f"{reason}: free space there, then resume (every round is checkpointed)",
                                          exits.EXIT_USAGE if exits.write_failed(err) else exits.EXIT_CHECK_FAILED)
        if self.options.log_with:
            files["trackers"] = str(self.run.trackers)
            if self.main:
                trackers.end(self.trainer)
        summary = run_summary.summarize(self, status, reason, files)
        try:
            if self.main:
                rundir.write_atomic(self.run.summary, json.dumps(summary, indent=1, allow_nan=True))
        except OSError as err:
            failed = failed or exits.SkillError(f"writing {self.run.summary} failed ({exits.one_line(err)}): free "
                                                "space there, then resume (every round is checkpointed)")
        finally:
            if self.lock is not None:
                self.lock.release()
        if failed:
            raise failed
        return summary


@dataclass
class Prepared:
    """A run checked before anything is built: its directory, the config as loaded (with the
    digests of its files) and as resolved against the installed library."""
    run: rundir.RunDir
    loaded: dict[str, Any]
    resolved: dict[str, Any]
    resume: bool
    options: Options
    lock: lock.RunLock | None = None  # the writer's (claiming.prepare); None on another rank or without fcntl
    created: Path | None = None         # the topmost directory this invocation created (claiming.first_missing)
    coverage: list[int] | None = None   # the reward model's unseen ids (artifacts.unseen_ids)
    placed: dict[str, Any] = field(default_factory=dict)  # device spec -> placement.resolve_device's answer

    def place(self, device_spec: str) -> tuple[dict[str, Any], Any]:
        """``placement.resolve_device(device_spec)`` once, (accelerate kwargs, torch.device): the
        command asks before its build stage, so a refused device is its one line. Raises as that
        does; on a refusal the start is ``refused``."""
        if device_spec not in self.placed:
            try:
                self.placed[device_spec] = placement.resolve_device(device_spec)
            except BaseException:
                self.refused()
                raise
        return self.placed[device_spec]

    def release(self) -> None:
        """Unlock the run directory (a resume that has nothing to do)."""
        if self.lock is not None:
            self.lock.release()

    def refused(self) -> None:
        """The start is refused: unlock, and remove what this invocation created (``claiming.discard``)."""
        claiming.discard(self.run, self.created, self.lock)


def rotary_cap(built: builder.Built, max_seq_len: int) -> int:
    """The longest sequence any forward of a run sees: the padded prompt width (TPO's buffer rows:
    prompt width + max_seq_len) or a held-out prompt, plus ``max_seq_len``."""
    widths = [int(built.prompt_ids.shape[-1])]
    if built.eval_prompt_ids is not None:
        widths.append(int(built.eval_prompt_ids.shape[-1]))
    return max(widths) + max_seq_len


def prepare(config_path: str | None, run_dir: str | Path, resume: bool, force: bool,
            overrides: list[str] | None, options: Options) -> Prepared:
    """Everything that can be refused before a model exists: the run directory
    (``claiming.prepare``; the writer then removes what a killed run left there:
    ``checkpoint.remove_leftovers``, ``claiming.remove_temporaries``), the config (``config_path``,
    or on ``resume`` without it the one the run stored), a changed config on ``resume``, the tracker
    package, and every key against the installed library (``run_config.check_against_library``,
    which imports torch). Raises SkillError: 2 for a bad config or directory, or a changed config
    on resume; 3 for a tracker package that is missing; 2 when another process holds the
    directory's lock."""
    with claiming.claimed(run_dir, resume, force, launch.writes_files(), options.say) as claim:
        prepared = _prepare(config_path, claim.run, run_dir, resume, overrides, options)
    prepared.lock, prepared.created = claim.lock, claim.created
    return prepared


def _prepare(config_path: str | None, run: rundir.RunDir, run_dir: str | Path, resume: bool,
             overrides: list[str] | None, options: Options) -> Prepared:
    """``prepare`` once the run directory exists."""
    found = run.read_config(resume)  # raises when it is not a run config: a file of yours of that name is never replaced
    stored = found[0] if found and resume else None
    if stored is not None and stored.get("kind") == "reward":
        raise exits.SkillError(f"--resume {run_dir}: {found[1]} is a reward model's run (palm-rlhf-skill train-reward "
                               "--resume continues it)")
    if config_path is None and stored is None:
        raise exits.SkillError(f"--resume {run_dir}: no {rundir.CONFIG} there to resume from: give --config FILE")
    if stored is not None and not config_path:  # --set on the stored config: only what extends the run
        rundir.check_resume_overrides(overrides, GROWABLE, run_dir)
    config = run_config.FORM.load(config_path, overrides, run_config.FIRST_RUN) if config_path else \
        run_config.FORM.stored(stored["config"], overrides, found[1])  # [run] rounds may grow: the run goes on
    if "run" not in config:
        raise exits.SkillError("config [run] rounds: missing: train runs the config in rounds ([run] rounds = N)")
    loaded = {"config": config, "files": file_digests(config),
              "run_id": stored.get("run_id") if stored is not None else uuid.uuid4().hex,
              "options": {**(stored or {}).get("options", {}), **options.keep}}
    if loaded["run_id"] is None:  # a run of an older version: its checkpoints carry no id
        del loaded["run_id"]
    if stored is not None:
        changed = rundir.changed_keys(stored, loaded, GROWABLE)
        if changed:
            raise exits.SkillError(f"--resume {run_dir}: the config changed since the run started: "
                                   f"{', '.join(changed)}: resume with the run's own config, or start over with --force")
    if options.log_with:
        trackers.check_available(options.log_with)
    resolved = run_config.check_against_library(config)
    builder.check_prompt_files(resolved)
    return Prepared(run, loaded, resolved, resume, options, coverage=artifacts.unseen_ids(resolved["reward"].get("checkpoint")))


def gathered(trainer, seen: metrics.Observation) -> metrics.Observation:
    """One process's ``Observation``, or under several processes every rank's rollouts (rewards,
    lengths, sampled tokens, advantages) gathered into the main process's; the optimizer figures
    (steps, gradient norms, KL term) stay the main process's, which DDP keeps equal across ranks."""
    if trainer.accelerate.num_processes == 1:
        return seen
    from accelerate.utils import gather_object
    shared = ("rewards", "response_lengths", "sampled_tokens", "advantages", "tokens", "bigrams")
    parts = gather_object([{key: getattr(seen, key) for key in shared}])
    merged = metrics.Observation(steps=seen.steps, grad_norms=seen.grad_norms, kl_terms=seen.kl_terms,
                                 learn_calls=seen.learn_calls, last_rollout=seen.last_rollout)
    for part in parts:
        for key in shared:
            setattr(merged, key, getattr(merged, key) + part[key])
    return merged


def measuring_meter(device):
    """A fresh memory meter for one round (peak since now; measuring.MemoryMeter)."""
    from policy_optimization import measuring
    meter = measuring.MemoryMeter(device)
    meter.start()
    return meter


def round_error(where: str, exc: BaseException, rewards: list[list[float]] | None = None) -> exits.SkillError:
    """The one line of a round (or an evaluation) that raised: the user's reward program (exit 2),
    an allocation that failed (exit 2), or the library (exit 1), which names the non-finite rewards
    the reward model gave before it raised (``rewards``: the round's ``Observation.rewards``, one
    list of floats per rollout), whatever the trainer made of them: GRPO's safe_div asserts on a
    NaN (grpo.py:204); the others train on, and their row fires the watchdog's non_finite rule
    (training-run.md#non-finite-rewards)."""
    text = exits.one_line(exc)
    if isinstance(exc, reward_programs.RewardProgramError):
        return exits.SkillError(f"{where}: {exc}: fix the program, then start over with --force (the rows and "
                                f"checkpoints so far are kept until then; --resume refuses an edited program)")
    if exits.out_of_memory(exc):
        return exits.SkillError(f"{where}: ran out of memory ({text}): smaller sizes or update_timesteps, "
                                "then resume")
    scores = [r for rollout in rewards or [] for r in rollout]
    bad = sum(not math.isfinite(r) for r in scores)
    if bad:
        raised = text if str(exc) else f"{type(exc).__name__} (no message)"
        return exits.SkillError(f"{where}: the reward model gave {bad} of {len(scores)} sequences a non-finite reward "
                                f"(NaN or inf), and the library then raised {raised}; read "
                                f"{watchdog.RUN_DOC}#non-finite-rewards",
                                exits.EXIT_CHECK_FAILED)
    if isinstance(exc, AssertionError) and not str(exc):  # grpo.py:204, safe_div's bare assert
        return exits.SkillError(f"{where}: the library raised an empty AssertionError (GRPO's safe_div: a group "
                                "of one, or a NaN inside the update); read "
                                "sub-skills/policy-optimization/references/traps-rewards.md#group-of-one",
                                exits.EXIT_CHECK_FAILED)
    return exits.SkillError(f"{where}: the library raised {text}; read "
                            "sub-skills/policy-optimization/references/troubleshooting.md#symptom-index",
                            exits.EXIT_CHECK_FAILED)


def run_facts(resolved: dict[str, Any], built: builder.Built, coverage: bool = False) -> watchdog.RunFacts:
    """What the watchdog's rules need to know about this run; ``coverage``: the reward model's
    unseen ids are known (``reward_modeling.artifacts.unseen_ids``)."""
    name, effective = resolved["name"], resolved["effective"]["trainer"]
    spec = trainers.TRAINERS[name]
    critic = None
    if name == "ppo":  # ppo.py: HLGaussLoss(**hl_gauss_loss_kwargs), values clamped to [min_value, max_value]
        bins = effective["hl_gauss_loss_kwargs"]
        critic = (float(bins["min_value"]), float(bins["max_value"]))
    return watchdog.RunFacts(trainer=name, grouped=spec.group_kwarg is not None, lora=bool(effective.get("actor_lora", True)),
                             required_steps=spec.required_steps,
                             update_timesteps=resolved["round"]["update_timesteps"], critic_range=critic,
                             processes=built.trainer.accelerate.num_processes,
                             eval_samples=0 if built.eval_prompt_ids is None else
                             resolved["eval"]["samples"] * int(built.eval_prompt_ids.shape[0]),
                             num_tokens=resolved["palm"]["num_tokens"], coverage=coverage)


def train_to_end(config_path: str | None, run_dir: str | Path, device_spec: str = "cpu", overrides: list[str] | None = None,
                 options: Options | None = None, resume: bool = False, force: bool = False) -> tuple[Run, str, str | None]:
    """The whole run in one call (what the calibration scripts, the overhead bench and the tests
    do): ``Run.open``, ``rounds`` without progress bars, ``finish``. Returns (the Run, its status,
    the reason). Raises SkillError as ``Run.open`` and ``rounds`` do."""
    options = options or Options(progress=False, say=lambda line: None)
    run = Run.open(config_path, run_dir, device_spec, resume=resume, force=force, overrides=overrides, options=options)
    status, reason = run.rounds(streams.Progress(PROG, False))
    run.finish(status, reason)
    return run, status, reason
