"""``RewardRun``: a reward model trained on preference pairs or ratings, in rounds, on the run kit.

A round is ``[train] steps_per_round`` optimizer steps (default: one epoch); after each the run
writes one metrics row (``reward_report.ROW_KEYS``), scores the held-out rows, logs to the trackers
and checkpoints every ``[run] checkpoint_every`` rounds (``run_kit.checkpoint``: the model, Adam
and the RNG states through ``accelerate.save_state``). At the end it writes ``rm.pt`` and
``rm_config.json`` (``artifacts``), probes the token coverage (``coverage``) and writes
``summary.json``.

The loss, per batch of pairs: Bradley-Terry on the scalar scores, ``-logsigmoid(r(chosen) -
r(rejected))`` (Christiano et al. 2017, "Deep reinforcement learning from human preferences", eq. 1;
Ouyang et al. 2022, "Training language models to follow instructions with human feedback", eq. 1);
per batch of ratings: the library's own loss, ``reward_model(x, ..., labels=ratings)`` (MSE, or
cross-entropy on bin indices when binned: palm_rlhf_pytorch/reward.py:123-138). The scores come from
the library's ``forward`` (``mask`` over prompt + response, ``prompt_lengths``), as the trainers
call it. The optimizer is Adam on ``finetune_parameters()`` (the head and the LoRA scope, or every
PaLM weight with ``use_lora = false``) plus ``prompt_embed`` and ``response_embed``, which
``finetune_parameters()`` leaves out (reward.py:55-56,74-78); every other weight is frozen.

The batches: epoch e's order is a shuffle seeded by (``[run] seed``, e) (``examples.epoch_order``),
so step s's batch follows from s alone and a resumed run draws what the uninterrupted one draws.
Under N processes each rank takes every N-th row of a batch and DDP averages the gradients.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from data_kit import tokenizer_file
from reward_modeling import artifacts, coverage, examples, reward_report, rm_config
from run_kit import checkpoint, claiming, command, launch, models, rundir, trackers
from skill_runtime import byte_tokenizer, exits, placement, streams

PROG = "palm-rlhf-skill train-reward"
KIND = "reward"                     # run_config.json's kind, the checkpoints' trainer (watch.kind_of)
GROWABLE = frozenset({"train.epochs"})  # a resume may raise epochs: the run goes on
EVAL_BATCH = 256                    # sequences per forward when scoring held-out rows and the probe (at most)
EVAL_LENGTH = 256                   # ... of this many tokens; longer rows score in smaller batches (eval_batch)


@dataclass
class Options(command.RunOptions):
    """How to run, beside the config: the run options of every run command (``command.RunOptions``),
    notes said as ``palm-rlhf-skill train-reward``."""
    say: Callable[[str], None] = field(default_factory=lambda: command.stderr_lines(PROG, sys.stderr))


@dataclass
class Prepared:
    """A run checked before a model exists: its directory (``claim``), the config as loaded (with
    its files' digests) and resolved, the tokenized training and held-out rows."""
    claim: claiming.Claim
    loaded: dict[str, Any]
    resolved: dict[str, Any]
    train: examples.Examples
    held_out: examples.Examples
    held_out_from: str           # "file" or "fraction"
    resume: bool
    options: Options
    placed: dict[str, Any] = field(default_factory=dict)

    def place(self, device_spec: str) -> tuple[dict[str, Any], Any]:
        """``placement.resolve_device(device_spec)`` and the memory the rows need on that device
        (``check_memory``), once; a refusal refuses the start."""
        if device_spec not in self.placed:
            try:
                self.placed[device_spec] = placement.resolve_device(device_spec)
                check_memory(self, self.placed[device_spec][1], max(1, int(os.environ.get("WORLD_SIZE", "1") or 1)))
            except BaseException:
                self.placed.pop(device_spec, None)
                self.claim.refused()
                raise
        return self.placed[device_spec]


def prepare(config_path: str | None, run_dir: str | Path, resume: bool, force: bool, overrides: list[str] | None,
            options: Options) -> Prepared:
    """Everything that can be refused before a model exists: the run directory
    (``claiming.claimed``), the config (or on ``resume`` without one, the run's own), a changed
    config on ``resume`` (``[train] epochs`` may grow), the tracker package, the keys against the
    installed library, the data read, checked and tokenized. Raises SkillError(2) (3: a tracker
    package missing); a refused start leaves no directory it created."""
    with claiming.claimed(run_dir, resume, force, launch.writes_files(PROG), options.say) as claim:
        found = claim.run.read_config(resume)  # raises when it is not a run config: never replaced
        stored = found[0] if found and resume else None
        if found and stored is not None and stored.get("kind") != KIND:
            raise exits.SkillError(f"--resume {run_dir}: {found[1]} is a policy run's (palm-rlhf-skill train "
                                   "--resume continues it)")
        if config_path is None and stored is None:
            raise exits.SkillError(f"--resume {run_dir}: no {rundir.CONFIG} there to resume from: give --config FILE")
        if stored is not None and not config_path:  # --set on the stored config: only what extends the run
            rundir.check_resume_overrides(overrides, GROWABLE, run_dir)
        config = rm_config.FORM.load(config_path, overrides) if config_path else \
            rm_config.FORM.stored(stored["config"], overrides, found[1])  # [train] epochs may grow: the run goes on
        loaded = {"kind": KIND, "config": config, "files": rundir.file_digests(rm_config.files_named(config)),
                  "run_id": stored.get("run_id") if stored is not None else uuid.uuid4().hex,
                  "options": {**(stored or {}).get("options", {}), **options.keep}}
        if stored is not None:
            changed = rundir.changed_keys(stored, loaded, GROWABLE)
            if changed:
                raise exits.SkillError(f"--resume {run_dir}: the config changed since the run started: {', '.join(changed)}: "
                                       "resume with the run's own config, or start over with --force")
        if options.log_with:
            trackers.check_available(options.log_with)
        resolved = rm_config.check_against_library(config)
        train, held_out, source = load_examples(resolved)
    return Prepared(claim, loaded, resolved, train, held_out, source, resume, options)


def load_examples(resolved: dict[str, Any]) -> tuple[examples.Examples, examples.Examples, str]:
    """(training rows, held-out rows, "file" or "fraction"): [data] pairs or ratings read
    (``examples.read_rows``: any file kind and layout), tokenized and fitted to [data] max_length
    (``examples.fit``: refused, or truncated with [data] truncate), held out from [data] held_out or
    as a seeded ``held_out_fraction`` of them. Raises SkillError(2) naming the file and the row,
    or when fewer than [data] min_held_out rows are held out (an accuracy over a handful of pairs
    says nothing) or nothing is left to train on."""
    data, kind = resolved["data"], resolved["kind"]
    bins = int(resolved["effective_reward_model"]["num_binned_output"])
    tokenizer = resolved["programs"].get("data.tokenizer") or resolved["tokenizer_file"] or byte_tokenizer.ByteTokenizer()
    num_tokens = resolved["palm"]["num_tokens"]

    def read(key: str) -> examples.Examples:
        where = f"config [data] {key}"
        rows = examples.read_rows(data[key], kind, where, bins, data, held_out=key == "held_out")
        out = examples.tokenize(rows, kind, tokenizer, num_tokens, where)
        examples.fit(out, data["max_length"], data["truncate"], where)
        return out
    rows = read(kind)
    if data["held_out"] is not None:
        train, held, source = rows, read("held_out"), "file"
        how = f"the {len(held)} rows of [data] held_out"
    else:
        fraction = data["held_out_fraction"]
        train, held = examples.split(rows, fraction, resolved["run"]["seed"])
        source, how = "fraction", f"held_out_fraction = {fraction:g} of {len(rows)} rows holds out {len(held)}"
    if len(held) < data["min_held_out"]:
        raise exits.SkillError(f"config [data]: {how}, fewer than min_held_out = {data['min_held_out']}: a held-out "
                               "accuracy over so few pairs says nothing; more rows, a larger held_out_fraction or a "
                               "held_out file (or a lower [data] min_held_out)")
    return train, held, source


def eval_batch(longest: int) -> int:
    """Sequences per forward when scoring: EVAL_BATCH, fewer for long rows so that a batch holds
    at most EVAL_BATCH sequences of EVAL_LENGTH tokens' worth of attention (``EVAL_BATCH *
    EVAL_LENGTH**2`` cells). It follows from the data alone, so a resumed run scores alike."""
    return max(1, min(EVAL_BATCH, EVAL_BATCH * EVAL_LENGTH ** 2 // max(1, longest) ** 2))


def check_memory(prepared: "Prepared", device, world: int) -> None:
    """Refuse (SkillError 2) a run whose attention cannot fit, before a model exists
    (``data_kit.sizes``): a training step's sequences (a pair is two) of this process at the
    longest row, with gradients, and a scoring batch (``eval_batch``) without, against the
    memory available on ``device``."""
    from data_kit import sizes
    resolved, palm = prepared.resolved, prepared.resolved["effective_palm"]
    longest = max(prepared.train.longest(), prepared.held_out.longest())
    per_row = 2 if prepared.train.kind == "pairs" else 1
    sequences = per_row * -(-resolved["train"]["batch_size"] // world)
    available = sizes.available_bytes(device)
    fix = (f"a lower [data] max_length (now {resolved['data']['max_length']:,}) with [data] truncate = true, or "
           "shorter rows")
    sizes.check_memory(sizes.attention_bytes(sequences, longest, palm["heads"], palm["depth"], True), available,
                       "config [data]", f"a training step of {sequences} sequences of {longest:,} tokens (the longest "
                       f"row, {palm['heads']} heads, depth {palm['depth']})", fix + ", or a smaller [train] batch_size")
    batch = eval_batch(longest)
    sizes.check_memory(sizes.attention_bytes(batch, longest, palm["heads"], palm["depth"], False), available,
                       "config [data]", f"scoring {batch} sequences of {longest:,} tokens", fix)


def torch_module():
    """``RewardTrainer``'s class, made on first use (torch is imported only when a run builds)."""
    import torch

    class RewardTrainer(torch.nn.Module):
        """The reward model (prepared by Accelerate) and its optimizer, with ``accelerate``: what
        the run kit's ``checkpoint`` and ``trackers`` take, as they take a library trainer."""

        def __init__(self, reward_model, optimizer, accelerate) -> None:
            super().__init__()
            self.reward_model, self.optimizer, self.accelerate = reward_model, optimizer, accelerate
    return RewardTrainer


@dataclass
class RewardRun:
    """One reward-model run. ``RewardRun.build(prepare(...))``; ``rounds()`` trains; ``finish()``
    writes rm.pt, rm_config.json and summary.json. Single- or multi-process (rank 0 writes)."""
    prepared: Prepared
    trainer: Any
    device: Any
    unseen: list[int]
    trainable: list
    steps_per_epoch: int
    slices: list[tuple[int, int]]
    rows: list[dict[str, Any]] = field(default_factory=list)
    start: int = 0
    started_s: float = field(default_factory=time.perf_counter)
    last_checkpoint: Path | None = None
    notes: list[str] = field(default_factory=list)         # an inexact resume, said in summary.json's warnings
    loss_sum: float = 0.0                                   # the current round's, this process's
    scored: dict[str, Any] = field(default_factory=dict)   # to_pred's last output (the forward hook)
    scoring_batch: int = EVAL_BATCH                         # sequences per scoring forward (eval_batch)

    # --- building -----------------------------------------------------------------------------
    @classmethod
    def build(cls, prepared: Prepared, device_spec: str = "auto") -> "RewardRun":
        """``_build``; a refusal releases the run directory and leaves nothing it created."""
        try:
            return cls._build(prepared, device_spec)
        except BaseException:
            prepared.claim.refused()
            raise

    @classmethod
    def _build(cls, prepared: Prepared, device_spec: str) -> "RewardRun":
        """The reward model (``RewardModel(PaLM(**[palm]), **[reward_model])``, [palm] checkpoint
        loaded), its trainable tensors and Adam, prepared by an Accelerator on ``device_spec``;
        then the latest checkpoint restored (a resume) or the held-out rows scored once (row 0).
        Raises SkillError(2) when the library refuses the sizes or a file."""
        import torch
        from accelerate import Accelerator
        from accelerate.utils import set_seed
        resolved, run, options = prepared.resolved, prepared.claim.run, prepared.options
        device_kwargs, device = prepared.place(device_spec)
        if options.log_with:
            device_kwargs = {**device_kwargs, **trackers.accelerate_kwargs(options.log_with, run.trackers)}
        set_seed(resolved["run"]["seed"])
        try:
            model = models.reward_model(models.palm(resolved["palm"], resolved["palm_checkpoint"]),
                                        resolved["reward_model"], None)
        except exits.SkillError:
            raise
        except (AssertionError, TypeError, ValueError, RuntimeError) as exc:
            raise exits.SkillError(f"config: the installed RewardModel refused it: {exits.one_line(exc)}") from None
        trainable = [*model.finetune_parameters(), model.prompt_embed, model.response_embed]
        ids = {id(p) for p in trainable}
        for p in model.parameters():
            p.requires_grad_(id(p) in ids)
        unseen = coverage.unseen_ids(prepared.train.ids(), resolved["palm"]["num_tokens"])
        if resolved["train"]["tie_unseen_embeddings"]:
            coverage.tie_unseen(model, unseen)
        optimizer = torch.optim.Adam(trainable, lr=resolved["train"]["lr"], weight_decay=resolved["train"]["weight_decay"])
        accelerate = Accelerator(**device_kwargs)
        model, optimizer = accelerate.prepare(model.to(device), optimizer)
        trainer = torch_module()(model, optimizer, accelerate)
        import ddp_fixes
        ddp_fixes.fix_buffers(trainer)  # rank-local rotary caches: no broadcast (a no-op in one process)
        world = accelerate.num_processes
        if resolved["train"]["batch_size"] < world:
            raise exits.SkillError(f"config [train] batch_size = {resolved['train']['batch_size']}: at least one row per "
                                   f"process ({world}): a larger batch_size or fewer processes")
        slices = examples.batches(len(prepared.train), resolved["train"]["batch_size"], world)
        self = cls(prepared, trainer, device, unseen, [p for p in trainable], len(slices), slices)
        self.unwrapped.to_pred.register_forward_hook(lambda module, args, output: self.scored.update(pred=output))
        longest = max(prepared.train.longest(), prepared.held_out.longest())
        self.scoring_batch = eval_batch(longest)
        checkpoint.prime_rotary_to(trainer, longest)
        state, self.last_checkpoint, note = checkpoint.restore(trainer, run, prepared.resume, self.run_id, KIND, longest,
                                                               options.allow_inexact, options.say)
        self.start, self.notes = (state["round"] if state else 0), ([note] if note else [])
        accelerate.wait_for_everyone()
        if self.main:  # the rows through the checkpoint (checked, or restored from it); later ones are rerun
            self.rows = checkpoint.begin(run, prepared.resume, state, self.last_checkpoint, reward_report.parse_row,
                                         options.say, prepared.loaded)
        if options.log_with and self.main:
            trackers.start(trainer, run.path.name, prepared.loaded["config"], self.start + 1)
        if not self.rows and self.main:
            self.write_row(reward_report.baseline_row(self.held_out_figures()))
        return self

    # --- facts --------------------------------------------------------------------------------
    @property
    def main(self) -> bool:
        return self.trainer.accelerate.is_main_process

    @property
    def unwrapped(self):
        return self.trainer.accelerate.unwrap_model(self.trainer.reward_model)

    @property
    def run_id(self) -> str | None:
        return self.prepared.loaded.get("run_id")

    @property
    def resolved(self) -> dict[str, Any]:
        return self.prepared.resolved

    @property
    def run(self) -> rundir.RunDir:
        return self.prepared.claim.run

    @property
    def steps_per_round(self) -> int:
        return self.resolved["train"]["steps_per_round"] or self.steps_per_epoch

    @property
    def total_steps(self) -> int:
        return self.resolved["train"]["epochs"] * self.steps_per_epoch

    @property
    def rounds_planned(self) -> int:
        return -(-self.total_steps // self.steps_per_round)

    # --- scoring ------------------------------------------------------------------------------
    def scores(self, pred):
        """One float score per sequence from ``to_pred``'s output: the scalar head's ``(b,)``, or a
        binned head's expected bin, softmax over ``(b, K)`` logits times ``0..K-1``."""
        import torch
        if pred.dim() == 1:
            return pred.float()
        return (pred.float().softmax(dim=-1) * torch.arange(pred.shape[-1], device=pred.device)).sum(dim=-1)

    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[float]:
        """The model's scores of prompt + response sequences, in eval mode without gradients, in
        batches of ``scoring_batch``; the model's train/eval mode is restored."""
        import torch
        model = self.unwrapped
        was_training = model.training
        model.eval()
        out: list[float] = []
        try:
            with torch.no_grad():
                step = self.scoring_batch
                for a in range(0, len(prompts), step):
                    x, mask, lengths = examples.collate(prompts[a:a + step], responses[a:a + step], self.device)
                    model(x, mask=mask, prompt_lengths=lengths)  # a binned model's own output is a sampled bin
                    out += self.scores(self.scored["pred"]).tolist()
        finally:
            model.train(was_training)
        return out

    def held_out_figures(self) -> dict[str, float | None]:
        """``held_out_loss``, ``held_out_accuracy``, ``held_out_margin`` and ``held_out_pairs`` (the
        pairs the accuracy is over: None for no pair, never 0) of the held-out rows
        (``reward_report.pairwise``); the main process only (else all None)."""
        if not self.main:
            return dict.fromkeys(("held_out_loss", "held_out_accuracy", "held_out_margin", "held_out_pairs"))
        import torch
        held = self.prepared.held_out
        first = self.score(held.prompts, held.first)
        if held.kind == "pairs":
            second = self.score(held.prompts, held.second)
            margins = torch.tensor(first) - torch.tensor(second)
            loss = float(-torch.nn.functional.logsigmoid(margins).mean())
            figures = reward_report.pairwise(first, second)
        else:
            loss = self.ratings_loss(held)
            figures = reward_report.ranked(first, held.ratings)
        return {"held_out_loss": loss, "held_out_accuracy": figures["accuracy"], "held_out_margin": figures["margin"],
                "held_out_pairs": figures["count"]}

    def ratings_loss(self, held: examples.Examples) -> float:
        """The library's loss (``labels=``: MSE, or cross-entropy when binned) over ``held``, the
        mean over rows, in eval mode."""
        import torch
        model, total = self.unwrapped, 0.0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                step = self.scoring_batch
                for a in range(0, len(held), step):
                    x, mask, lengths = examples.collate(held.prompts[a:a + step], held.first[a:a + step], self.device)
                    labels = self.labels(held.ratings[a:a + step])
                    total += float(model(x, mask=mask, prompt_lengths=lengths, labels=labels)) * len(labels)
        finally:
            model.train(was_training)
        return total / len(held)

    def labels(self, ratings: list[float]):
        """Ratings as the library's ``labels``: int64 bin indices (binned) or float32 (scalar)."""
        import torch
        binned = self.resolved["effective_reward_model"]["num_binned_output"] > 1
        return torch.tensor(ratings, dtype=torch.long if binned else torch.float32, device=self.device)

    # --- one round ----------------------------------------------------------------------------
    def step(self, rows: list[int]) -> tuple[list[float], list[float], float]:
        """One optimizer step on training ``rows`` (this process's share of a batch). Returns the
        (higher, lower) scores it compared (pairs: chosen, rejected; ratings: every pair of rows of
        the share with different ratings) and the gradient norm before the step."""
        import torch
        import torch.nn.functional as F
        train, model = self.prepared.train, self.trainer.reward_model
        prompts = [train.prompts[i] for i in rows]
        if train.kind == "pairs":
            x, mask, lengths = examples.collate(prompts * 2, [train.first[i] for i in rows] +
                                                [train.second[i] for i in rows], self.device)
            scores = model(x, mask=mask, prompt_lengths=lengths)
            chosen, rejected = scores[:len(rows)], scores[len(rows):]
            loss = -F.logsigmoid(chosen - rejected).mean()  # Bradley-Terry (Christiano et al. 2017)
            higher, lower = chosen.detach().tolist(), rejected.detach().tolist()
        else:
            x, mask, lengths = examples.collate(prompts, [train.first[i] for i in rows], self.device)
            ratings = [train.ratings[i] for i in rows]
            loss = model(x, mask=mask, prompt_lengths=lengths, labels=self.labels(ratings))  # the library's loss
            higher, lower = reward_report.ordered_pairs(self.scores(self.scored["pred"].detach()).tolist(), ratings)
        self.trainer.accelerate.backward(loss)
        grads = [p.grad.detach() for p in self.trainable if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.trainer.optimizer.step()
        self.trainer.optimizer.zero_grad()
        self.loss_sum += float(loss.detach()) * len(rows)
        return higher, lower, norm

    def one_round(self, round_: int) -> dict[str, Any]:
        """Train round ``round_`` (its optimizer steps) and return its row: the training figures
        summed over every process, the held-out ones from the main process."""
        import torch
        accelerate = self.trainer.accelerate
        rank, world = accelerate.process_index, accelerate.num_processes
        first_step = (round_ - 1) * self.steps_per_round
        steps = range(first_step, min(first_step + self.steps_per_round, self.total_steps))
        before = [p.detach().clone() for p in self.trainable]
        self.trainer.reward_model.train()
        self.loss_sum, higher, lower, norms, count = 0.0, [], [], [], 0
        orders: dict[int, list[int]] = {}
        t0 = time.perf_counter()
        for step in steps:
            epoch, k = divmod(step, self.steps_per_epoch)
            order = orders.setdefault(epoch, examples.epoch_order(len(self.prepared.train), self.resolved["run"]["seed"],
                                                                   epoch))
            a, b = self.slices[k]
            mine = order[a:b][rank::world]
            h, lo, norm = self.step(mine)
            higher += h
            lower += lo
            norms.append(norm)
            count += len(mine)
        if self.resolved["train"]["tie_unseen_embeddings"]:
            coverage.tie_unseen(self.unwrapped, self.unseen)
        wall = time.perf_counter() - t0
        compared = reward_report.pairwise(higher, lower)
        sums = torch.tensor([self.loss_sum, count, compared["correct"], compared["margin_sum"], compared["count"]],
                            dtype=torch.float64, device=self.device)
        loss_sum, count, correct, margin_sum, pairs = accelerate.reduce(sums, "sum").tolist() if world > 1 else sums.tolist()
        change = math.sqrt(sum(float(((p.detach() - p0) ** 2).sum()) for p, p0 in zip(self.trainable, before)))
        return reward_report.build_row(
            round_=round_, steps_done=steps.stop, steps_per_epoch=self.steps_per_epoch, examples=int(count),
            wall_s=wall, loss=loss_sum / count if count else None,
            train_accuracy=correct / pairs if pairs else None, margin=margin_sum / pairs if pairs else None,
            held_out=self.held_out_figures(), grad_norm=sum(norms) / len(norms) if norms else None,
            change=change, lr=self.trainer.optimizer.param_groups[0]["lr"])

    def write_row(self, row: dict[str, Any]) -> None:
        """Append ``row`` to metrics.jsonl and the trackers (main process) and to ``rows``.
        Raises SkillError(2) when the disk refuses it."""
        self.rows.append(row)
        if self.main:
            rundir.append_row_or_refuse(self.run, row)
            if self.prepared.options.log_with:
                trackers.log(self.trainer, row)

    def save(self, round_: int) -> None:
        """A checkpoint after ``round_`` with its rows (``checkpoint.save_rounds``). Raises
        SkillError as that does (the previous checkpoint stays the latest)."""
        self.last_checkpoint = checkpoint.save_rounds(self.trainer, self.run, round_, self.rows, self.last_checkpoint,
                                                      self.run_id, KIND)

    # --- the rounds ---------------------------------------------------------------------------
    def rounds(self, progress: streams.Progress) -> tuple[str, str | None]:
        """Train from the round after ``start`` to ``options.until`` (or the last). Returns
        (status, reason): ``finished``; ``paused`` (``until`` reached); ``interrupted``
        (SIGINT/SIGTERM, after the round in progress); ``failed`` (the loss became NaN or inf:
        no checkpoint of it). Every status but ``failed`` checkpoints first."""
        options = self.prepared.options
        last = min(options.until or self.rounds_planned, self.rounds_planned)
        every = self.resolved["run"]["checkpoint_every"]
        began = time.perf_counter()
        with command.deferred_signals(options.say) as signals, progress.stage(
                f"rounds {self.start + 1}-{last} of {self.steps_per_round} steps", total=max(0, last - self.start),
                unit="rounds", eta=True) as bar:
            for round_ in range(self.start + 1, last + 1):
                row = self.one_round(round_)
                self.write_row(row)
                command.report_round(progress, bar, round_, reward_report.progress_text(row), row["wall_s"], last,
                                     began, self.start)
                if row["loss"] is None or not math.isfinite(row["loss"]):
                    return "failed", (f"the training loss became {row['loss']} in round {round_}: a lower [train] lr, "
                                      "then start over with --force")
                signals.requested = self.any_rank(signals.requested)
                if round_ % every == 0 or round_ == last or signals.requested:
                    self.save(round_)
                if signals.requested:
                    return "interrupted", (f"{signal.Signals(signals.requested).name} during round {round_}, which "
                                           "finished and was checkpointed")
        return ("finished", None) if last == self.rounds_planned else ("paused", f"--until {last}")

    def any_rank(self, flag: int | None) -> int | None:
        """The first non-None ``flag`` of any process, on every process."""
        if self.trainer.accelerate.num_processes == 1:
            return flag
        from accelerate.utils import gather_object
        return next((f for f in gather_object([flag]) if f is not None), None)

    def finish(self, status: str, reason: str | None) -> dict[str, Any]:
        """A finished run's rm.pt and rm_config.json (``artifacts.write``); on the main process the
        token-coverage probe and summary.json; the trackers closed and the lock released. Returns
        the summary."""
        files = {"metrics": str(self.run.metrics), "config": str(self.run.config),
                 "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None}
        probe = None
        if self.main:
            if status == "finished":
                files.update(artifacts.write(self.unwrapped, self.resolved["effective_palm"],
                                             self.resolved["effective_reward_model"], self.run,
                                             tokenizer_file.record(self.resolved["tokenizer_file"],
                                                                   "data.tokenizer" in self.resolved["programs"])))
            probe = self.coverage_probe()
        if self.prepared.options.log_with:
            files["trackers"] = str(self.run.trackers)
            if self.main:
                trackers.end(self.trainer)
        summary = reward_report.summarize(self, status, reason, files, probe)
        try:
            if self.main:
                rundir.write_atomic(self.run.summary, json.dumps(summary, indent=1, allow_nan=True))
        except OSError as err:
            raise exits.SkillError(f"writing {self.run.summary} failed ({exits.one_line(err)}): free space there, then "
                                   "resume (every round is checkpointed)") from None
        finally:
            self.prepared.claim.release()
        return summary

    def coverage_probe(self) -> dict[str, Any]:
        """``coverage.probe`` on the held-out rows: pairs' chosen (and rejected) responses;
        ratings: the responses rated at or above the median rating."""
        held = self.prepared.held_out
        if held.kind == "pairs":
            return coverage.probe(self.score, held.prompts, held.first, held.second, self.unseen)
        middle = sorted(held.ratings)[len(held.ratings) // 2]
        top = [i for i, r in enumerate(held.ratings) if r >= middle]
        return coverage.probe(self.score, [held.prompts[i] for i in top], [held.first[i] for i in top], None,
                              self.unseen)


def train_to_end(config_path: str | None, run_dir: str | Path, device_spec: str = "cpu",
                 overrides: list[str] | None = None, options: Options | None = None, resume: bool = False,
                 force: bool = False) -> tuple[RewardRun, dict[str, Any]]:
    """The whole run in one call (the tests and the benchmark): prepare, build, rounds without
    progress bars, finish. Returns (the run, its summary). Raises SkillError as those do."""
    options = options or Options(progress=False, say=lambda line: None)
    run = RewardRun.build(prepare(config_path, run_dir, resume, force, overrides, options), device_spec)
    status, reason = run.rounds(streams.Progress(PROG, False))
    return run, run.finish(status, reason)
