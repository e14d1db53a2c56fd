"""The train smoke of one trainer, as the checklist it proves: build, snapshot, update, compare,
sample (``run_trainer``). Each step reads and extends a ``SmokeRun``; the multi-process mode
(``ranks``) runs the same steps on every rank. Torch-free at import."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cached_sampler
import probe_kit
from skill_runtime import byte_tokenizer, exits, reporting, snapshots, streams
from policy_optimization import tiny_trainers, trainers
from policy_optimization.smoke import prompts, settings


@dataclass
class SmokeRun:
    """One trainer's train smoke in progress: what each step of the checklist reads and adds."""
    name: str
    args: Any
    device: Any
    result: dict[str, Any]
    checks: reporting.Checks = field(default_factory=reporting.Checks)
    timer: streams.Timer = field(default_factory=streams.Timer)
    trainer: Any = None
    groups: dict[str, list] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    frozen: list = field(default_factory=list)
    max_seq_len: int = 0

    @property
    def spec(self) -> trainers.TrainerSpec:
        return trainers.TRAINERS[self.name]


def build(run: SmokeRun, device_kwargs: dict, variants: list[str], after_build=None) -> bool:
    """Step 1: the tiny PaLM, a scalar RewardModel and the trainer (sampling with ``--sampler``'s
    sampler: ``cached_sampler.apply``); checks that the trainer was
    built, added its LoRA scope and holds its trainable tensors on the device. False when the
    constructor raised (recorded as the failed ``trainer_constructed`` check)."""
    args, spec, device = run.args, run.spec, run.device
    with run.timer.stage("construct", label="build the models and the trainer"):
        prompt_args, prompt_info = prompts.prompt_kwargs(args.prompt_style, args.seed, args.prompt_len)
        palm = probe_kit.tiny_palm(dim=args.dim, depth=args.depth).to(device)
        reward_model = probe_kit.tiny_reward_model(palm).to(device)  # a deep copy of the policy's PaLM
        if args.eos_token is not None:  # after that copy: the policy, not the reward model, ends early
            raise_logit(palm, args.eos_token, settings.EOS_LOGIT_BIAS)
        if "prompt_token_ids" in prompt_args:
            prompt_args["prompt_token_ids"] = prompt_args["prompt_token_ids"].to(device)
        flags = {flag: value for variant in variants for flag, value in settings.GRPO_VARIANTS[variant].items()}
        kwargs = tiny_trainers.trainer_kwargs(spec.name, palm_dim=args.dim, **(flags if run.name == "grpo" else {}))
        try:
            run.trainer = trainers.construct_trainer(spec, palm, reward_model, prompt_args, device_kwargs, device, **kwargs)
        except Exception as exc:  # the library's failure is this smoke's finding, not a crash
            run.result["timings_s"] = {"construct": None, "update": None, "generate": None}
            run.result.update(parameters=None, optimizer_steps=None, losses=None, generated=None)
            run.checks.add("trainer_constructed", False, exits.one_line(exc))
            return False
        cached_sampler.apply(run.trainer, args.sampler)  # --sampler cached: rollouts sample through the cache
        if after_build is not None:
            after_build(run.name, run.trainer)

    trainer = run.trainer
    tokenizer = prompt_info.pop("tokenizer", None)
    if tokenizer is not None:
        prompt_info.update(count=int(trainer.prompt_token_ids.shape[0]),
                           max_len=int(trainer.prompt_token_ids.shape[1]),
                           dropped_empty=tokenizer.dropped_empty)
    run.groups = trainers.trainable_groups(run.name, trainer)
    trainable_ids = {id(p) for ps in run.groups.values() for p in ps}
    run.names = dict((id(p), n) for n, p in trainer.named_parameters())
    run.frozen = [(n, p) for n, p in trainer.named_parameters() if id(p) not in trainable_ids]
    run.result.update(
        class_name=spec.path, optimizer=spec.optimizer, prompts=prompt_info,
        grpo_variants=variants if run.name == "grpo" else None, group_size=settings.smoke_group(spec))
    run.checks.add("trainer_constructed", True, f"{spec.module}.{spec.class_name} on {device}")
    run.checks.add("actor_lora_scope_added", "actor" in trainers.actor_palm(run.name, trainer).finetune_modules,
                   "the trainer added LoRA scope 'actor' to the PaLM passed in")
    n_trainable = sum(len(ps) for ps in run.groups.values())
    run.checks.add("trainable_parameters_on_device",
                   n_trainable > 0 and all(p.device.type == device.type for ps in run.groups.values() for p in ps),
                   f"{n_trainable} trainable tensors in groups {', '.join(run.groups)} on {device.type}")
    run.result["parameters"] = {
        "trainable_total": n_trainable,
        "trainable_numel": sum(p.numel() for ps in run.groups.values() for p in ps),
        "trainable_changed": None, "frozen_total": len(run.frozen), "frozen_changed": None}
    run.result["timings_s"] = {"construct": run.timer.stages["construct"], "update": None, "generate": None}
    run.result.update(optimizer_steps=None, losses=None, generated=None)
    return True


def snapshot(run: SmokeRun) -> tuple[dict[str, dict], dict]:
    """Step 2: clones of every trainable tensor (per group) and of every frozen one."""
    before = {key: snapshots.snapshot((run.names[id(p)], p) for p in ps) for key, ps in run.groups.items()}
    return before, snapshots.snapshot(run.frozen)


def update(run: SmokeRun) -> bool:
    """Step 3: one bounded ``train()`` (``--rollouts`` rollouts, one ``learn()``), counting optimizer
    steps and the completions the reward model scored per rollout; checks the update ran, the step
    count and the group size. False when ``train()`` raised (the failed ``update_ran`` check)."""
    name, spec, trainer, checks, args = run.name, run.spec, run.trainer, run.checks, run.args
    rollouts = args.rollouts or settings.smoke_rollouts(spec)
    expected_steps = settings.smoke_steps(spec, rollouts)
    run.max_seq_len = int(trainer.prompt_token_ids.shape[1]) + args.new_tokens
    step_counts = {key: 0 for key in trainers.optimizers(name, trainer)}
    for key, opt in trainers.optimizers(name, trainer).items():
        opt.register_step_post_hook(lambda *_, key=key: step_counts.__setitem__(key, step_counts[key] + 1))
    reward_batches: list[int] = []
    rollout_lengths: list[int] = []  # sequence length (prompt + sampled) the reward model scored per rollout
    with run.timer.stage("update", total=rollouts, unit="rollouts") as bar:
        def scored(_module, inputs, _output) -> None:  # returns None: the output is kept
            reward_batches.append(int(inputs[0].shape[0]))
            rollout_lengths.append(int(inputs[0].shape[-1]))
            if bar is not None:
                bar.update(1)

        def stepped(*_) -> None:
            if bar is not None:
                bar.set_postfix_str(f"learn() optimizer step {step_counts['actor']}/{expected_steps}")

        hooks = [trainers.unwrap(trainer, trainer.reward_model).register_forward_hook(scored),
                 trainers.optimizers(name, trainer)["actor"].register_step_post_hook(stepped)]
        printed, error = trainers.bounded_train(trainer, rollouts, run.max_seq_len, eos_token=args.eos_token)
    for hook in hooks:
        hook.remove()
    run.result["timings_s"]["update"] = run.timer.stages["update"]
    if args.verbose:
        streams.write_stderr(printed)
    run.result["losses"] = streams.parse_losses(printed)
    run.result["rollout_lengths"] = rollout_lengths
    run.result["optimizer_steps"] = {"expected": expected_steps, "required": spec.required_steps,
                                     "observed": step_counts, "rollouts": rollouts}
    if not checks.add("update_ran", error is None,
                      error or f"train(): {rollouts} rollouts, one learn(), max_seq_len {run.max_seq_len}"):
        return False
    checks.add("optimizer_steps", step_counts["actor"] == expected_steps >= spec.required_steps,
               f"actor optimizer stepped {step_counts['actor']}x (expected {expected_steps}, "
               f"{spec.optimizer} needs >= {spec.required_steps}); all: {step_counts}")
    checks.add("rollout_group_size", set(reward_batches) == {settings.smoke_group(spec)},
               f"reward model scored {sorted(set(reward_batches))} completions per prompt per rollout "
               f"(expected {settings.smoke_group(spec)}" + (f" = {spec.group_kwarg} + 1)" if spec.group_kwarg else ")"))
    if args.eos_token is not None:
        early = sum(n < run.max_seq_len for n in rollout_lengths)
        checks.add("rollouts_ended_at_eos", early > 0,
                   f"eos_token {args.eos_token}: rollout lengths {rollout_lengths} (max_seq_len {run.max_seq_len}); "
                   f"{early} ended at eos before max_seq_len")
    return True


def compare(run: SmokeRun, before: dict[str, dict], frozen_before: dict) -> None:
    """Step 4: every trainable tensor changed, no frozen one did, printed losses are finite; TPO's
    replay buffer is in the private directory; FlowRL's reference policy is the LoRA-off PaLM."""
    import torch
    name, trainer, checks, args = run.name, run.trainer, run.checks, run.args
    trainable_changed = 0
    for key, ps in run.groups.items():
        changed = snapshots.changed_names(before[key], ((run.names[id(p)], p) for p in ps))
        trainable_changed += len(changed)
        unchanged = sorted(set(before[key]) - set(changed))
        checks.add(f"{key}_changed", not unchanged,
                   f"{len(changed)}/{len(ps)} tensors changed"
                   + (f"; unchanged: {reporting.names_text(unchanged)}" if unchanged else ""))
    frozen_changed = snapshots.changed_names(frozen_before, run.frozen)
    reward_changed = [n for n in frozen_changed if n.startswith("reward_model.")]
    checks.add("base_weights_unchanged", not set(frozen_changed) - set(reward_changed),
               f"{len(run.frozen) - sum(n.startswith('reward_model.') for n, _ in run.frozen)} base PaLM tensors; "
               f"changed: {reporting.names_text(sorted(set(frozen_changed) - set(reward_changed)))}")
    checks.add("reward_model_unchanged", not reward_changed, f"changed: {reporting.names_text(reward_changed)}")
    run.result["parameters"].update(trainable_changed=trainable_changed, frozen_changed=len(frozen_changed))
    losses = run.result["losses"]
    values = [v for vs in losses.values() for v in vs]
    checks.add("losses_finite", streams.all_finite(losses),
               f"{len(values)} printed values ({', '.join(losses)})" if values else "no loss printed")
    if name == "tpo":
        buffer = Path(getattr(args, "tpo_buffer", settings.TPO_BUFFER))  # ranks.py: a per-rank folder
        size = sum(f.stat().st_size for f in buffer.rglob("*") if f.is_file()) if buffer.is_dir() else 0
        run.result["replay_buffer"] = {"path": f"./{buffer}", "bytes": size}
        checks.add("replay_buffer_in_private_dir",
                   buffer.is_dir() and Path.cwd().resolve() != Path(args.caller_dir).resolve(),
                   f"./{buffer} written in the private working directory ({size} bytes on disk), "
                   "removed with it")
    if name == "flowrl":
        palm_, probe = trainers.actor_palm(name, trainer), trainer.prompt_token_ids[:1]
        with torch.no_grad():  # after the update the actor's LoRA moved, so LoRA off must differ
            ref_differs = not torch.equal(trainer.palm(probe, finetune_scope=None),
                                          palm_(probe, finetune_scope="actor"))
        checks.add("reference_policy_is_lora_off_palm", trainer.palm is palm_ and ref_differs,
                   "learn() scores pi_ref with self.palm(..., finetune_scope=None): the actor's own "
                   f"PaLM (same object: {trainer.palm is palm_}) with LoRA off (logits differ from "
                   f"the actor's after the update: {ref_differs})")


def sample(run: SmokeRun) -> None:
    """Step 5: one ``trainer.generate()`` on the first prompt; checks shape, dtype, vocabulary and
    that the sequence starts with the prompt."""
    import torch
    trainer, checks, args = run.trainer, run.checks, run.args
    prompt = trainer.prompt_token_ids[0]
    prompt = prompt[prompt != byte_tokenizer.PAD_ID]
    with run.timer.stage("generate", label="generate (one trainer.generate() call)"):
        try:
            with streams.capture_library_output():
                sequence = trainer.generate(run.max_seq_len, prompt=prompt, num_samples=settings.NUM_GENERATE_SAMPLES,
                                            eos_token=args.eos_token)
        except Exception as exc:
            sequence = None
            checks.add("generated_sequence", False, f"trainer.generate raised {exits.one_line(exc)}")
    run.result["timings_s"]["generate"] = run.timer.stages["generate"]
    if sequence is None:
        return
    expected_len = max(run.max_seq_len, prompt.shape[0] + 1)
    run.result["generated"] = {"shape": list(sequence.shape), "dtype": str(sequence.dtype).replace("torch.", ""),
                               "expected_shape": [expected_len], "prompt_len": int(prompt.shape[0])}
    in_vocab = bool(((sequence >= 0) & (sequence < probe_kit.TINY_PALM["num_tokens"])).all())
    # with eos, sampling stops once every sample holds it: shorter, but then it contains eos
    length_ok = (len(sequence) == expected_len if args.eos_token is None else
                 prompt.shape[0] < len(sequence) <= expected_len
                 and (len(sequence) == expected_len or bool((sequence == args.eos_token).any())))
    checks.add("generated_sequence",
               sequence.dim() == 1 and length_ok and sequence.dtype == torch.long and in_vocab
               and torch.equal(sequence[:prompt.shape[0]].cpu(), prompt.cpu()),
               f"shape {tuple(sequence.shape)} (prompt {prompt.shape[0]} + sampled"
               + (f", stops at eos {args.eos_token}" if args.eos_token is not None else "")
               + f"), {sequence.dtype}, ids in [0, {probe_kit.TINY_PALM['num_tokens']}): {in_vocab}, starts with the prompt")


def raise_logit(palm, token: int, bias: float) -> None:
    """Add ``bias`` to ``palm``'s logit for ``token`` on every forward (a forward hook on
    ``palm.to_logits``; no parameter changes): rollouts and learn() see the same policy."""
    import torch
    offset = torch.zeros(palm.to_logits.out_features)
    offset[token] = bias
    palm.to_logits.register_forward_hook(lambda _m, _inputs, logits: logits + offset.to(logits))


def run_trainer(name: str, args, device_kwargs: dict, device, variants: list[str],
                after_build=None, progress: streams.Progress | None = None) -> dict[str, Any]:
    """The train smoke of one trainer, step by step: build, snapshot, update, compare, sample;
    ``--construct-only`` stops after build. Returns its report entry.

    ``after_build(name, trainer)``, when given, runs right after construction (the multi-process
    worker in ranks.py applies its DDP fixes and per-rank seeding there). With ``progress``
    each timed step is a progress line on stderr."""
    from accelerate.utils import set_seed

    run = SmokeRun(name, args, device, {"trainer": name, "status": "failed", "mode": settings.mode_name(args)},
                   timer=streams.Timer(progress, name))
    set_seed(args.seed)
    if not build(run, device_kwargs, variants, after_build) or args.construct_only:
        return settings.finish(run.result, run.checks)
    before, frozen_before = snapshot(run)
    if update(run):
        compare(run, before, frozen_before)
        sample(run)
    return settings.finish(run.result, run.checks)
