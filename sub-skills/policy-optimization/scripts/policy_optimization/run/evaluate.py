"""``palm-rlhf-skill evaluate``: a run's trained policy against its initial weights, on held-out
prompts, with the run's own reward and its gold metric, per prompt, with a few decoded samples.

Both sides are scored by ``evaluation.of_run``, the function ``train``'s evaluations use, with the
same sampling seed by default ([run] seed + ``loop.EVAL_SEED_OFFSET``), so the initial side equals
the run's round-0 ``held_out_reward`` and a policy of a finished run its last evaluation (LoRA
merged into ``policy.pt``: equal up to float rounding). The initial weights are rebuilt exactly as
``train`` built them: ``set_seed([run] seed)``, then ``builder.build`` (the PaLM of [palm], its
[palm] checkpoint loaded), every rotary table primed at the run's longest sequence.
Torch-free at import.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from config_kit import programs, reading
from policy_optimization import builder, evaluation, reward_programs, run_config, trainers
from policy_optimization.run import loop, watchdog
from run_kit import checkpoint, models, rundir
from skill_runtime import exits, reporting, streams

SHOW = 3  # decoded samples shown per side by default


def locate(run_dir: str) -> tuple[rundir.RunDir, dict[str, Any], Path, str]:
    """The run directory, its stored run config (``RunDir.read_config``: the config as loaded,
    absolute paths, its ``run_id``), and the policy to score: ``policy.pt`` (a finished run) or
    the latest checkpoint, with how to name it. Raises SkillError(2) when ``run_dir`` holds no
    run, its config is damaged, or it has no policy yet (no policy.pt, no checkpoint)."""
    run = rundir.RunDir(Path(run_dir).expanduser().resolve())
    if not run.path.is_dir():
        what = "a file, not a directory" if run.path.exists() else "no such directory"
        raise exits.SkillError(f"--run-dir {run_dir}: {what} (palm-rlhf-skill train --run-dir DIR makes one)")
    found = run.read_config()
    if found is None:
        raise exits.SkillError(f"--run-dir {run_dir}: no {rundir.CONFIG} there: not a run directory of "
                               "palm-rlhf-skill train")
    stored = found[0]
    if stored.get("kind") == "reward":
        raise exits.SkillError(f"--run-dir {run_dir}: a reward model's run (train-reward): evaluate scores a policy "
                               "run; its held-out accuracy is in summary.json (palm-rlhf-skill watch DIR)")
    if run.policy.is_file() and not run.policy.is_symlink():
        return run, stored, run.policy, rundir.POLICY
    latest = checkpoint.latest(run)
    if latest is None:
        raise exits.SkillError(f"--run-dir {run_dir}: no policy yet (no {rundir.POLICY}, no checkpoint): train "
                               "at least one checkpoint_every rounds first, or wait for the run")
    return run, stored, latest, f"checkpoint {latest.name}"


def program_option(flag: str, value: str) -> str:
    """``--metric file.py:function`` with its file made absolute against the current directory.
    Raises SkillError(2) for another form."""
    if not reading.program_syntax(value):
        raise exits.SkillError(f"{flag} {value!r}: expected file.py:function")
    return reading.absolute(value, Path.cwd(), program=True)


def with_options(config: dict[str, Any], prompts: str | None, metric: str | None, text_metric: str | None,
                 samples: int | None) -> dict[str, Any]:
    """The run's config with evaluate's options in [eval]: ``prompts`` (a file, made absolute),
    ``metric`` or ``text_metric`` (``program_option``, replacing the run's gold metric),
    ``samples``; checked as any config (``run_config.check_structure``). Raises SkillError(2)
    naming the option, or when neither the run nor ``prompts`` gives held-out prompts."""
    config = json.loads(json.dumps(config))  # a copy
    table = config.setdefault("eval", {})
    if prompts:
        table["prompts_file"] = str(Path(prompts).expanduser().resolve())
    if metric or text_metric:
        table.pop("metric", None)
        table.pop("text_metric", None)
        key, value = ("metric", metric) if metric else ("text_metric", text_metric)
        table[key] = program_option(f"--{key.replace('_', '-')}", value)
    if samples:
        table["samples"] = samples
    if "prompts_file" not in table:
        raise exits.SkillError("the run has no [eval] prompts_file: give --prompts FILE (one held-out prompt per line)")
    config.setdefault("run", {"rounds": 1})
    run_config.check_structure(config)
    return config


def decoded(tokenizer, ids: list[int]) -> str | list[int]:
    """``ids`` as text through the run's tokenizer's ``decode``, or the ids when it has none."""
    decode = getattr(tokenizer, "decode", None)
    if not callable(decode):
        return ids
    try:
        return str(decode(ids))
    except Exception:  # noqa: BLE001 - the user's tokenizer: show the ids instead
        return ids


def side(held: evaluation.HeldOut, prompt_texts: list[str], groups: list[str | None], tokenizer,
         show: int = SHOW) -> dict[str, Any]:
    """One side of the report (``initial`` or ``policy``): the means, per prompt (with its group),
    per group (``evaluation.group_means``; one entry, group null, when the prompts have no groups),
    ``repetition`` (``evaluation.repetition`` of every sample), the first ``show`` decoded samples,
    and ``all_samples`` (every sample, ids; dropped from the report by ``score``)."""
    gold = held.gold_per_prompt or [None] * len(held.per_prompt)
    rewards = evaluation.group_means(held.per_prompt, groups)
    golds = evaluation.group_means(held.gold_per_prompt, groups)
    names = [evaluation.NO_GROUP if g is None else g for g in groups]
    per_group = [{"group": None, "prompts": len(held.per_prompt), "reward": held.reward_mean, "gold": held.gold_mean}]
    if rewards is not None:
        per_group = [{"group": name, "prompts": names.count(name), "reward": value,
                      "gold": None if golds is None else golds[name]} for name, value in rewards.items()]
    with_group = [{**s, "group": names[s["index"]]} for s in held.samples]
    return {"reward_mean": held.reward_mean, "reward_std": held.reward_std, "gold_mean": held.gold_mean,
            "per_prompt": [{"prompt": text, "group": g, "reward": reward, "gold": value}
                           for text, g, reward, value in zip(prompt_texts, groups, held.per_prompt, gold)],
            "per_group": per_group, "repetition": held.repetition,
            "samples": [shown(s, tokenizer) for s in with_group[:show]], "all_samples": with_group}


def shown(sample: dict[str, Any], tokenizer) -> dict[str, Any]:
    """One sample of ``HeldOut.samples`` as the report shows it: decoded, with its group."""
    return {"prompt": decoded(tokenizer, sample["prompt"]), "response": decoded(tokenizer, sample["response"]),
            "group": sample["group"], "reward": sample["reward"], "gold": sample["gold"]}


def findings(report: dict[str, Any], tokenizer, show: int = SHOW, rule_reward: bool = False) -> dict[str, Any]:
    """What stops a policy whose mean rose from being IMPROVED, from the two sides of ``report``:
    ``groups_fallen``, the groups (more than one) whose gold metric did not rise (without one:
    whose reward did not rise; with one, what the raters want decides); ``collapse``, ``watchdog.repetition_reason`` of the policy's samples (the
    ``repeated_token`` rule's thresholds), or None; ``collapse_with_gold``, what the raters want
    that rose with the collapse, so it does not block (their rule is maxed by a repeated token:
    training-run.md#collapse): "the gold metric" (one is given and rose), "the rule reward" (no
    gold metric, and ``rule_reward``: the reward is a [reward] program or text_program, and it
    rose), else None;
    ``evidence``, up to ``show`` decoded policy
    samples that show it (the fallen group's, else the most repetitive ones)."""
    a, b = report["initial"], report["policy"]
    fallen = [q["group"] for p, q in zip(a["per_group"], b["per_group"]) if len(b["per_group"]) > 1 and (
        q["gold"] <= p["gold"] if q["gold"] is not None else q["reward"] <= p["reward"])]
    repeated = b["repetition"]
    collapse = watchdog.repetition_reason(repeated.get("top_token_share"), repeated.get("distinct_bigram_fraction"),
                                          repeated.get("response_top_token_share"), where="the policy's")
    if collapse is None:
        with_gold = None
    elif b["gold_mean"] is not None:
        with_gold = "the gold metric" if b["gold_mean"] > a["gold_mean"] else None
    else:  # a rule reward is the raters' own rule: the mean's rise is its rise
        with_gold = "the rule reward" if rule_reward and b["reward_mean"] > a["reward_mean"] else None
    pool = b["all_samples"]
    if fallen:
        evidence = [s for s in pool if s["group"] == fallen[0]][:show]
    elif collapse:
        import torch
        share = [evaluation.token_shares(torch.tensor(s["response"], dtype=torch.long), torch.zeros(0))[0] or 0.0
                 for s in pool]
        evidence = [pool[i] for i in sorted(range(len(pool)), key=lambda i: -share[i])][:show]
    else:
        evidence = []
    return {"groups_fallen": fallen, "collapse": collapse, "collapse_with_gold": with_gold,
            "evidence": [shown(s, tokenizer) for s in evidence]}


def score(run_dir: str, device_spec: str, prompts: str | None = None, metric: str | None = None,
          text_metric: str | None = None, samples: int | None = None, seed: int | None = None, show: int = SHOW,
          progress: streams.Progress | None = None) -> dict[str, Any]:
    """Score the run in ``run_dir``: its initial weights and its policy (``locate``) on the
    held-out prompts, each ``samples`` times, sampled with ``seed`` (default: the run's evaluation
    seed), with the run's reward and gold metric (or the options', ``with_options``). Returns the
    report (references/run-reports.md#evaluate-report). Raises SkillError: 2 for bad input, 1 when
    the library or the reward raised while scoring."""
    from accelerate.utils import set_seed
    from skill_runtime import placement
    progress = progress or streams.Progress("palm-rlhf-skill evaluate", False)
    run, stored, policy_file, source = locate(run_dir)
    config = with_options(stored["config"], prompts, metric, text_metric, samples)
    resolved = run_config.check_against_library(config)
    builder.check_prompt_files(resolved)
    run_seed = resolved["run"]["seed"]
    seed = run_seed + loop.EVAL_SEED_OFFSET if seed is None else seed
    device_kwargs, device = placement.resolve_device(device_spec)
    name = resolved["name"]
    with progress.stage("rebuild the run's initial weights"):
        set_seed(run_seed)
        built = builder.build(resolved, device_kwargs, device, seed=run_seed)
        trainer = built.trainer
        cap = loop.rotary_cap(built, resolved["effective"]["train"]["max_seq_len"])
        checkpoint.prime_rotary_to(trainer, cap)
    reward_model = trainers.unwrap(trainer, trainer.reward_model)
    gold = reward_programs.rule_reward(resolved, anchor=False, section="eval")
    gold = None if gold is None else gold.to(device)
    texts, groups = builder.prompt_texts(resolved, "eval")[0], built.eval_groups
    every = len(texts) * resolved["eval"]["samples"]  # every sample kept: repetition, groups, evidence

    def scored(palm, scope, label: str) -> evaluation.HeldOut:
        try:
            with progress.stage(f"score the {label} on {len(texts)} held-out prompts"), streams.capture_library_output():
                return evaluation.of_run(resolved, palm, scope, reward_model, built.eval_prompt_ids, seed, metric=gold,
                                         pad_value=int(trainer.pad_value), keep=every)
        except reward_programs.RewardProgramError as exc:  # a gold metric of the wrong kind, or a program's wrong output
            raise exits.SkillError(f"scoring the {label}: {exc}: fix the program, or give it with the other option "
                                   "(--metric: ids and a response mask -> (b,); --text-metric: prompt and response "
                                   "text -> float)") from None
        except Exception as exc:  # noqa: BLE001 - sorted: the user's program, or the library
            raise loop.round_error(f"scoring the {label}", exc) from None

    initial = scored(trainers.actor_palm(name, trainer), trainers.actor_scope(name, trainer), "initial weights")
    if policy_file == run.policy:
        from palm_rlhf_pytorch import PaLM
        palm = PaLM(**resolved["palm"])
        models.load_weights(palm, str(policy_file), f"{run.policy.name} of {run_dir}")
        palm = palm.to(device)
        for block in palm.modules():  # the run's rotary length (checkpoint.prime_rotary_to does it for a trainer)
            if type(block).__name__ == "ParallelTransformerBlock":
                block.get_rotary_embedding(cap, device)
        policy = scored(palm, None, "policy")
    else:
        checkpoint.load(trainer, policy_file, stored.get("run_id"), name, cap)
        policy = scored(trainers.actor_palm(name, trainer), trainers.actor_scope(name, trainer), "policy")
    eval_table = resolved["eval"]
    gold_key = "metric" if "metric" in eval_table else "text_metric" if "text_metric" in eval_table else None
    report = {"run_dir": str(run.path), "trainer": name, "device": str(device), "policy_source": source,
              "prompts_file": eval_table["prompts_file"], "samples_per_prompt": eval_table["samples"], "seed": seed,
              "reward": describe_reward(resolved), "gold_metric": programs.label(eval_table[gold_key]) if gold_key else None,
              "initial": side(initial, texts, groups, built.tokenizer, show),
              "policy": side(policy, texts, groups, built.tokenizer, show)}
    report.update(findings(report, built.tokenizer, show,
                           rule_reward=any(key in resolved["reward"] for key in ("program", "text_program"))))
    for part in ("initial", "policy"):
        del report[part]["all_samples"]
    report["verdict"], report["next"] = verdict(report)
    return report


def describe_reward(resolved: dict[str, Any]) -> str:
    """The run's reward in a few words: its program, text program or reward-model checkpoint."""
    reward = resolved["reward"]
    for key in ("program", "text_program"):
        if key in reward:
            return f"[reward] {key} {programs.label(reward[key])}"
    if "checkpoint" in reward:
        return f"[reward] checkpoint {reward['checkpoint']}"
    return "an untrained RewardModel of [reward_model]"


def verdict(report: dict[str, Any]) -> tuple[str, str]:
    """The last line (reward and gold initial -> policy; IMPROVED only when the mean reward rose,
    the gold metric did not fall, every group rose and no collapse blocks: ``findings``) and the
    next step."""
    a, b = report["initial"], report["policy"]
    line = f"reward {a['reward_mean']:.4g} -> {b['reward_mean']:.4g}"
    if b["gold_mean"] is not None:
        line += f", gold metric {a['gold_mean']:.4g} -> {b['gold_mean']:.4g}"
    worst = min(range(len(b["per_prompt"])), key=lambda i: b["per_prompt"][i]["reward"] - a["per_prompt"][i]["reward"])
    mean_rose = b["reward_mean"] > a["reward_mean"] and (b["gold_mean"] is None or b["gold_mean"] >= a["gold_mean"])
    collapsed = report["collapse"] is not None and not report["collapse_with_gold"]
    rose = mean_rose and not collapsed and not report["groups_fallen"]
    doc = "sub-skills/policy-optimization/references/training-run.md"
    if rose and report["policy_source"] != rundir.POLICY:  # a paused or stopped run: its latest checkpoint
        nxt = f"finish the run ({reporting.command('palm-rlhf-skill train', '--resume ' + report['run_dir'])}), " \
              f"then load its {rundir.POLICY}"
    elif rose:
        nxt = f"load {report['run_dir']}/{rundir.POLICY} with PaLM(**[palm]).load(path)"
    elif collapsed:
        nxt = f"the policy repeats itself ({report['collapse']}): read {doc}#collapse"
    elif mean_rose:
        fell = report["groups_fallen"][0]
        nxt = f"the mean rose and group {fell!r} did not: read {doc}#prompt-groups"
    elif b["gold_mean"] is not None and b["reward_mean"] > a["reward_mean"]:
        nxt = f"the reward rose and the gold metric did not: read {doc}#reward-hacking"
    else:
        nxt = f"read {doc}#held-out-flat"
    word = "IMPROVED" if rose else "NOT IMPROVED"
    why = ""
    if collapsed:
        why = f"; collapsed: {report['collapse']}"
    elif report["collapse"]:
        why = f"; {report['collapse']}, and {report['collapse_with_gold']} rose with it"
    if report["groups_fallen"]:
        why += "; no gain on group " + ", ".join(repr(g) for g in report["groups_fallen"])
    return (f"evaluate: {word} ({report['policy_source']}): {line} over {len(b['per_prompt'])} held-out prompts; "
            f"least gain on prompt {worst + 1}{why}"), nxt


def percent(value: float | None) -> str:
    """A share as a percentage, or n/a."""
    return "n/a" if value is None else f"{value:.0%}"


def text(report: dict[str, Any]) -> str:
    """The plain report: per prompt and per group initial -> policy, repetition, the samples
    (``repr``: a control byte the policy wrote cannot reach the terminal raw), the samples that
    show a fallen group or a collapse, the verdict and next step last."""
    a, b = report["initial"], report["policy"]
    lines = [f"run {report['run_dir']} ({report['trainer']}, {report['policy_source']}): {report['reward']}"
             + (f", gold metric {report['gold_metric']}" if report["gold_metric"] else "")
             + f"; {report['samples_per_prompt']} samples per prompt, seed {report['seed']}"]
    for i, (p, q) in enumerate(zip(a["per_prompt"], b["per_prompt"]), 1):
        gold = f"; gold {p['gold']:.3f} -> {q['gold']:.3f}" if q["gold"] is not None else ""
        lines.append(f"prompt {i} {str(p['prompt'])[:40]!r}: reward {p['reward']:.3f} -> {q['reward']:.3f}{gold}")
    if len(b["per_group"]) > 1:
        for p, q in zip(a["per_group"], b["per_group"]):
            gold = f"; gold {p['gold']:.3f} -> {q['gold']:.3f}" if q["gold"] is not None else ""
            lines.append(f"group {q['group']!r} ({q['prompts']} prompts): reward {p['reward']:.3f} -> "
                         f"{q['reward']:.3f}{gold}")
    for label, part in (("initial", a), ("policy", b)):
        r = part["repetition"]
        if r.get("top_token_share") is not None:
            lines.append(f"{label} repetition: top token {percent(r['top_token_share'])} (per response, median "
                         f"{percent(r['response_top_token_share'])}), distinct bigrams "
                         f"{percent(r['distinct_bigram_fraction'])}, longest run {r['longest_run']} tokens")
    for label, part in (("initial", a), ("policy", b)):
        for s in part["samples"]:
            gold = f", gold {s['gold']:.3f}" if s["gold"] is not None else ""
            lines.append(f"{label} sample: {str(s['prompt'])[:30]!r} -> {str(s['response'])[:60]!r} "
                         f"(reward {s['reward']:.3f}{gold})")
    for s in report["evidence"]:
        lines.append(f"it shows: {str(s['prompt'])[:30]!r} -> {str(s['response'])[:60]!r} (reward {s['reward']:.3f})")
    lines.append(f"{report['verdict']}; next: {report['next']}")
    return "\n".join(lines)
