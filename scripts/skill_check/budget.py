"""The context budget: the size of what an agent loads, against the one table ``BUDGET``."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from skill_check import ROOT, markdown, skills
from skill_runtime import exits

# Agents preload every skill's name and description; a SKILL.md body loads when the skill is
# used, a reference when the body's load condition sends the agent there. Tokens are estimated as
# characters / CHARS_PER_TOKEN (Claude Code's `plugin details` projects ~116 tokens for the root's
# 445 characters of name and description: 3.8 characters a token). The budget, in one table:
CHARS_PER_TOKEN = 4
BUDGET = {
    "root description chars": 1024,  # Agent Skills spec: a description is at most 1,024 characters
    "body lines": 499,               # Agent Skills guidance: a SKILL.md body under 500 lines
    "body tokens": 5000,             # ... and about 5,000 tokens
    # Each reference: its size on 2026-11-30, after the routing rework and the split of the
    # --json schemas (reports.md), the several-machine recipes (multi-node.md) and the sizing table
    # (sizing.md) out of workflows.md and distributed.md, plus 15%, rounded up to 250 tokens.
    # reports.md: 7204 tokens after the key tables of plan, plan --execute, doctor, bench and list
    # were added (QA D6; each compared with a real report by a test), plus 15%.
    # api-reference.md: 5250 -> 5500 after the held-out check (LR-schedule and best-of-n recipes,
    # tpo_eta, GRPO entropy bonus and value_clip semantics: ~5350 tokens, trimmed), plus headroom.
    # distributed.md 4250 -> 4750 and reward-api.md 4250 -> 4750 after the third knowledge test
    # (batch per rank, seeding, checkpoints, bf16; reward modules the trainers accept, binned
    # sampling attributes): ~4400 and ~4310 tokens, plus about 10%.
    # Issue 21 (every argument has an entry; eight gaps; every section cites its lines), after moving
    # prose that the argument rows now hold out of the sections: api-reference.md 5500 -> 9250
    # (entries for the 177 arguments of ActorCritic and the four trainers, shared rows written once:
    # ~3500 tokens; your own ActorCritic), palm-api.md 3750 -> 4750 (argument tables in place of the
    # constructor and forward tables and the generate bullets; rotary cache, return_loss NaN),
    # lora-scopes.md 1000 -> 1350 (merging a trainer's LoRA, with its runnable block),
    # distributed.md 4750 -> 5500 (bf16 weights), trainer-selection.md 2750 -> 3350 (weight copies,
    # the decision table's lines), troubleshooting.md 15750 -> 17750 (freezing a built trainer,
    # FlowRL's printed numbers, seven symptom rows, citations for 17 sections); each ~3% headroom.
    # The run kit (issue 20): reports.md 8500 -> 9750 (the metrics row, train summary and watch
    # report tables, each tested against a real run: ~1300 tokens); training-run.md 4250 (~3750).
    # workflows.md 8250 -> 8750: issue 21's line citations for the loop shape, the DataLoader and
    # the actor scope, and issue 22's load-scaled estimate (~300 tokens; the plan section was
    # trimmed to its old size first), plus about 2%.
    # The guards against reward hacking (issue 30): training-run.md 4250 -> 5750 (eight rule rows and
    # eight measured cases, the collapse, held-out drop, reward hacking, evaluate and cpu-threads
    # sections: ~1400 tokens);
    # troubleshooting.md 17750 -> 18000 (three symptom rows for the reward-hacking signs: ~100 tokens).
    # Issue 32: sizing.md 1000 -> 5250 (the cached sampler with its measured table, and the seven
    # facts of a run at scale, each with cited lines and a probe that runs: ~4850 tokens), plus ~8%;
    # training-run.md +100 (when to use the cached sampler), troubleshooting.md +200 (two symptom rows
    # into sizing.md's run-at-scale facts), reports.md 9750 -> 10750 (the bench --rollouts key table,
    # tested against a real report: ~700 tokens, plus ~2%), workflows.md 8750 -> 9000 (the --sampler
    # option and [run] sampler rows).
    # Issue 37: troubleshooting.md (18200) split into its two indexes and five files of traps by topic,
    # reports.md (12400) into the smoke reports, tool-reports.md and run-reports.md; each its size plus ~5%
    # A reference over 300 lines opens with its contents (api-reference.md, training-run.md, workflows.md,
    # sizing.md, reward-api.md: ~60-130 tokens each); no markdown file passes 40 kB
    # (tests/test_reference_contents.py).
    # A reference not listed gets "*".
    "reference tokens": {
        "references/glossary.md": 1000,
        "references/installation.md": 2750,  # 2,250 until the verified-torch table (issue 29)
        "references/probes.md": 1500,  # the probe kit and three worked probes: ~1190 tokens, plus about 25%
        "references/reports.md": 4750,  # issue 37: the smoke reports (~4540)
        "references/run-reports.md": 3750,  # issue 37: train, watch, evaluate, train-reward (~3560)
        "references/tool-reports.md": 4500,  # issue 37: plan, doctor, bench, list (~4150)
        "sub-skills/palm-modeling/references/lora-scopes.md": 1350,
        "sub-skills/palm-modeling/references/palm-api.md": 5000,  # 4th knowledge test: size, qk_scale, flash GPUs, label leak (~3670); 5th: ids >= V, mixed lengths (~80)
        "sub-skills/policy-optimization/references/api-reference.md": 9500,  # issue 37: its contents (~60)
        "sub-skills/policy-optimization/references/distributed.md": 5500,
        "sub-skills/policy-optimization/references/multi-node.md": 1500,
        "sub-skills/policy-optimization/references/inputs.md": 2000,  # issue 38: the input table, 25 rows (~1700)
        "sub-skills/policy-optimization/references/run-directory.md": 1500,  # issue 31's file table: ~1250, plus 20%
        "sub-skills/policy-optimization/references/sizing.md": 5250,
        "sub-skills/policy-optimization/references/training-run.md": 6900,  # issue 30 item 4: the longer-run table (~330); issue 35: the verdict's groups and collapse, prompt groups (~300); issue 37: its contents (~130)
        "sub-skills/policy-optimization/references/trainer-selection.md": 3350,
        "sub-skills/policy-optimization/references/troubleshooting.md": 4250,  # issue 37: the two indexes (~4070)
        "sub-skills/policy-optimization/references/traps-rewards.md": 4000,  # issue 37: ~3790
        "sub-skills/policy-optimization/references/traps-rollouts.md": 3500,  # issue 37: ~3320
        "sub-skills/policy-optimization/references/traps-setup.md": 4250,  # issue 37: ~4080
        "sub-skills/policy-optimization/references/traps-weights.md": 3000,  # issue 37: ~2770
        "sub-skills/policy-optimization/references/traps-devices.md": 1500,  # issue 37: ~1230
        "sub-skills/policy-optimization/references/workflows.md": 9450,  # 5th knowledge test: the default-size step counts, with their block (~250); issue 35: [tokenizer] rows (~120)
        "sub-skills/reward-modeling/references/implicit-prm.md": 1500,
        "sub-skills/reward-modeling/references/reward-api.md": 5000,  # 5th knowledge test: left padding, prompt length k (~110)
        "sub-skills/reward-modeling/references/preferences.md": 3550,  # issue 30: train-reward, the worked example, token coverage; issue 35: the layouts and the [data] reading keys (~1000), the second example and [tokenizer] (~380)
        "*": 2000,
    },
}
CLAUDE_DETAILS_TIMEOUT_S = 60


def tokens(chars: int) -> int:
    """Approximate tokens for ``chars`` characters (``CHARS_PER_TOKEN`` a token, rounded up)."""
    return -(-chars // CHARS_PER_TOKEN)


def context_budget(files: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Size of each part an agent loads, against ``BUDGET``: the root's name and description
    (always loaded), each SKILL.md body, each reference. Returns (rows, drift): rows are
    ``{file, part, lines, chars, tokens, limit, within}``; drift names every part over its limit."""
    rows = []
    for md in files:
        name = markdown.rel(md)
        if md.name == "SKILL.md":
            meta, body = skills.frontmatter_and_body(md)
            if md.parent.resolve() == ROOT.resolve():
                chars = len(meta.get("name", "")) + len(meta.get("description", ""))
                limit = BUDGET["root description chars"]
                rows.append({"file": name, "part": "name and description (always loaded)", "lines": None,
                             "chars": chars, "tokens": tokens(chars), "limit": f"description <= {limit} chars",
                             "within": len(meta.get("description", "")) <= limit})
            lines = len(body.splitlines())
            rows.append({"file": name, "part": "body", "lines": lines, "chars": len(body),
                         "tokens": tokens(len(body)),
                         "limit": f"< {BUDGET['body lines'] + 1} lines, <= {BUDGET['body tokens']} tokens",
                         "within": lines <= BUDGET["body lines"] and tokens(len(body)) <= BUDGET["body tokens"]})
        elif "references" in md.relative_to(ROOT).parts:
            text = md.read_text(encoding="utf-8")
            limit = BUDGET["reference tokens"].get(name, BUDGET["reference tokens"]["*"])
            rows.append({"file": name, "part": "reference", "lines": len(text.splitlines()), "chars": len(text),
                         "tokens": tokens(len(text)), "limit": f"<= {limit} tokens",
                         "within": tokens(len(text)) <= limit})
    drift = [{"file": r["file"], "symbol": f"context budget ({r['part']})", "documented": r["limit"],
              "installed": f"{r['lines']} lines, " * (r["lines"] is not None) + f"{r['chars']} chars, ~{r['tokens']} tokens"}
             for r in rows if not r["within"]]
    return rows, drift


def claude_details(root: Path = ROOT) -> dict[str, Any]:
    """Claude Code's own projection of the plugin's token cost: ``claude --plugin-dir ROOT plugin
    details NAME`` when a ``claude`` executable is on PATH and ROOT holds the plugin manifest
    (``.claude-plugin/plugin.json``, in a source checkout; installed copies have none). It reads
    only local files; a throwaway HOME keeps it from writing the user's settings and telemetry.
    Returns ``{"always_on_tokens", "on_invoke_tokens"}`` (per session; per use of the skill), or
    ``{"unavailable": why}``. Never raises."""
    manifest = root / ".claude-plugin" / "plugin.json"
    claude = shutil.which("claude")
    if claude is None or not manifest.is_file():
        return {"unavailable": "no `claude` on PATH" if claude is None else
                f"no plugin manifest in {root} (a source checkout has .claude-plugin/plugin.json)"}
    name = json.loads(manifest.read_text(encoding="utf-8"))["name"]
    with tempfile.TemporaryDirectory(prefix="palm-rlhf-skill-claude-") as home:
        env = {**os.environ, "HOME": home, "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
        try:
            proc = subprocess.run([claude, "--plugin-dir", str(root), "plugin", "details", name],
                                  capture_output=True, text=True, timeout=CLAUDE_DETAILS_TIMEOUT_S, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            return {"unavailable": f"claude plugin details failed: {exits.one_line(err)}"}
    count = r"~(\d+(?:\.\d+)?k?)"  # Claude Code rounds: "~116", "~1.8k"
    always = re.search(rf"Always-on:\s+{count} tok", proc.stdout)
    row = re.search(rf"^\s+{re.escape(name)}\s+{count}\s+{count}\s*$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or not always or not row:
        return {"unavailable": f"claude plugin details exit {proc.returncode}: "
                               + (proc.stderr.strip().splitlines() or ["unexpected output"])[-1]}
    return {"always_on_tokens": _rounded_tokens(always.group(1)), "on_invoke_tokens": _rounded_tokens(row.group(2))}


def _rounded_tokens(text: str) -> int:
    """A token count as ``claude plugin details`` prints it (``"116"``, ``"1.8k"``) as an int."""
    return round(float(text[:-1]) * 1000) if text.endswith("k") else int(text)
