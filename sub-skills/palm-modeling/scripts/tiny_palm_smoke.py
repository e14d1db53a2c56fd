#!/usr/bin/env python3
"""Tiny, bounded smoke for the base PaLM of palm-rlhf-pytorch: loss, generate, LoRA scopes, save/load.

Builds a tiny ``PaLM`` on the chosen device and checks, in order:
  1. the output projection is tied to the token embedding; forward shapes;
  2. a few next-token-loss optimizer steps lower the loss on one fixed batch;
  3. greedy ``generate`` (``temperature=0.``) with a prompt and without one: shapes, and greedy
     means the argmax of the logits;
  4. a LoRA scope: fresh, it changes nothing (LoRA B starts at zero); perturbed, it changes the
     logits only under ``finetune_scope``; ``merge_finetune_params`` folds it into the base
     weights so the unscoped logits reproduce the scoped ones (within MERGE_ATOL);
  5. ``torch.save(state_dict)`` then ``PaLM.load`` gives identical logits.

Usage:
    tiny_palm_smoke.py                      # report on stdout, verdict last
    tiny_palm_smoke.py --json               # one JSON object on stdout
    tiny_palm_smoke.py --device cuda --seed 3
    tiny_palm_smoke.py --lr 0 --json        # forced failure: the loss cannot drop (exit 1)

Runs inside a private temporary directory and leaves nothing in the caller's directory.
The JSON schema is documented in references/reports.md (skill root).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import skill_bootstrap  # noqa: E402,F401  (first: the runtime; a damaged file of the tree is then one line, exit 2)
from skill_runtime import exits, options, reporting, runner, smoke_main, streams  # noqa: E402
import probe_kit  # noqa: E402  (the tiny PaLM config, shared by every smoke and probe)

BATCH, SEQ_LEN = 4, 16     # the fixed next-token-loss batch: ids in [1, 257), so no id is ignored
PROMPT_LEN, GEN_LEN = 5, 12  # generate(GEN_LEN, prompt of PROMPT_LEN): GEN_LEN counts the prompt
LORA_SCOPE = "smoke"
LORA_INIT_STD = 0.2        # perturbation of the LoRA A and B weights (B starts at zero)
MERGE_ATOL = 1e-4          # float32: merged-unscoped vs scoped logits, max absolute difference
SCOPE_MIN_EFFECT = 1e-3    # a perturbed scope must move some logit by more than this
CHECKPOINT = "palm.pt"     # written in the private temporary directory only


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Bounded smoke for the base PaLM of palm-rlhf-pytorch: next-token loss step, "
                    "greedy generate, LoRA scope isolation and merge, save/load round trip.",
        epilog="examples:\n"
               "  tiny-palm-smoke --json\n"
               "  tiny-palm-smoke --device cpu --seed 1\n"
               "  tiny-palm-smoke --steps 10 --lr 1e-2\n\n" + exits.EXIT_CODES_EPILOG)
    parser.add_argument("--steps", type=options.bounded_int(1, options.MAX_OPTIMIZER_STEPS), default=3, metavar="N",
                        help="Adam steps on the fixed next-token batch (default: 3)")
    parser.add_argument("--lr", type=options.finite_nonnegative_float, default=3e-3,
                        help="Adam learning rate for the loss steps (default: 3e-3; 0 makes the "
                             "loss check fail)")
    options.add_common_options(parser)
    return parser


def max_abs(a, b) -> float:
    """Largest absolute elementwise difference of two same-shape tensors, as a Python float."""
    return float((a.float() - b.float()).abs().max())


def fixed_batch(seed: int, device):
    """``(BATCH, SEQ_LEN)`` int64 ids in [1, num_tokens): never the ignored label id 0."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, probe_kit.TINY_PALM["num_tokens"], (BATCH, SEQ_LEN), generator=gen).to(device)


def check_loss_step(palm, batch, args, checks: reporting.Checks) -> dict[str, Any]:
    """``args.steps`` Adam steps on ``palm(batch, return_loss=True)``; the loss must drop."""
    import torch
    palm.train()
    optim = torch.optim.Adam(palm.palm_parameters(), lr=args.lr)
    losses = []
    for _ in range(args.steps):
        loss = palm(batch, return_loss=True)
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
    palm.eval()
    with torch.no_grad():
        after = float(palm(batch, return_loss=True))
    before = losses[0] if losses else after
    checks.add("next_token_loss_decreases", after < before and all(map(math.isfinite, losses + [after])),
               f"{args.steps} Adam steps (lr {args.lr}) on a fixed ({BATCH}, {SEQ_LEN}) batch: "
               f"loss {before:.4f} -> {after:.4f}")
    return {"steps": args.steps, "lr": args.lr, "before": before, "after": after, "per_step": losses}


def check_generate(palm, batch, checks: reporting.Checks) -> dict[str, Any]:
    """Greedy generate with a batched prompt (returns only the sampled part) and with no prompt."""
    import torch
    prompt = batch[:2, :PROMPT_LEN]
    with torch.no_grad():
        sampled = palm.generate(GEN_LEN, prompt=prompt, temperature=0.)
        again = palm.generate(GEN_LEN, prompt=prompt, temperature=0.)
        full = palm.generate(GEN_LEN, prompt=prompt, temperature=0., return_seq_without_prompt=False)
        first_greedy = palm(prompt)[:, -1].argmax(dim=-1)
        no_prompt = palm.generate(GEN_LEN, temperature=0.)
    want = (2, GEN_LEN - PROMPT_LEN)
    checks.add("generate_with_prompt",
               tuple(sampled.shape) == want and sampled.dtype == torch.long and torch.equal(sampled, again)
               and torch.equal(sampled[:, 0], first_greedy) and torch.equal(full[:, :PROMPT_LEN], prompt)
               and torch.equal(full[:, PROMPT_LEN:], sampled),
               f"generate({GEN_LEN}, prompt {tuple(prompt.shape)}, temperature=0.) -> {tuple(sampled.shape)} "
               f"(seq_len counts the prompt), repeatable, first token = argmax of the logits; "
               f"return_seq_without_prompt=False -> {tuple(full.shape)}")
    checks.add("generate_without_prompt", tuple(no_prompt.shape) == (1, GEN_LEN),
               f"generate({GEN_LEN}) with no prompt -> {tuple(no_prompt.shape)}: a random 1-token "
               "prompt is drawn and returned with the sequence")
    return {"with_prompt": {"prompt_shape": list(prompt.shape), "shape": list(sampled.shape),
                            "full_shape": list(full.shape)},
            "without_prompt": {"shape": list(no_prompt.shape)}, "seq_len": GEN_LEN}


def check_lora(palm, batch, checks: reporting.Checks) -> dict[str, Any]:
    """Scope isolation and merge for LoRA scope LORA_SCOPE on an eval-mode PaLM."""
    import torch
    with torch.no_grad():
        base = palm(batch)
        palm.add_finetune_params(LORA_SCOPE)
        fresh = palm(batch, finetune_scope=LORA_SCOPE)
        checks.add("fresh_lora_scope_is_identity", torch.equal(fresh, base),
                   f"scope {LORA_SCOPE!r} just added: scoped logits equal the base logits exactly "
                   "(LoRA B starts at zero)")
        lora_tensors = list(palm.finetune_parameters(LORA_SCOPE))
        for tensor in lora_tensors:
            tensor.normal_(std=LORA_INIT_STD)
        scoped = palm(batch, finetune_scope=LORA_SCOPE)
        unscoped = palm(batch)
        disabled = palm(batch, finetune_scope=LORA_SCOPE, disable_lora=True)
        effect = max_abs(scoped, base)
        checks.add("lora_scope_isolated",
                   effect > SCOPE_MIN_EFFECT and torch.equal(unscoped, base) and torch.equal(disabled, base),
                   f"perturbed scope moves the scoped logits by up to {effect:.4g}; without the scope "
                   "and with disable_lora=True the logits equal the base exactly")
        palm.merge_finetune_params(LORA_SCOPE)
        merged = palm(batch)
        merge_diff = max_abs(merged, scoped)
        checks.add("merge_reproduces_scoped_logits",
                   merge_diff <= MERGE_ATOL and LORA_SCOPE not in palm.finetune_modules,
                   f"after merge_finetune_params({LORA_SCOPE!r}): max |unscoped - scoped before merge| "
                   f"= {merge_diff:.3g} (tolerance {MERGE_ATOL}); scope removed: "
                   f"{LORA_SCOPE not in palm.finetune_modules}")
    return {"scope": LORA_SCOPE, "tensors": len(lora_tensors), "numel": sum(t.numel() for t in lora_tensors),
            "scoped_max_abs_effect": effect, "merge_max_abs_diff": merge_diff, "merge_atol": MERGE_ATOL}


def check_save_load(palm, batch, device, checks: reporting.Checks) -> dict[str, Any]:
    """``torch.save(palm.state_dict())`` then a fresh ``PaLM(...).load(path)``: identical logits."""
    import torch
    from palm_rlhf_pytorch import PaLM
    torch.save(palm.state_dict(), CHECKPOINT)
    size = Path(CHECKPOINT).stat().st_size
    loaded = PaLM(**probe_kit.TINY_PALM).to(device)
    loaded.load(CHECKPOINT)
    loaded.eval()
    with torch.no_grad():
        diff = max_abs(loaded(batch), palm(batch))
    checks.add("save_load_round_trip", diff == 0.0,
               f"{CHECKPOINT} ({size} bytes, in the private directory) loaded into a fresh PaLM: "
               f"max logit difference {diff}")
    return {"path": CHECKPOINT, "bytes": size, "max_abs_diff": diff}


def run_smoke(args, device, timer: streams.Timer) -> dict[str, Any]:
    """All PaLM checks on one tiny model, each step timed (and shown) by ``timer``; returns the
    per-check results (JSON-ready)."""
    import torch
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM

    checks, result = reporting.Checks(), {}
    set_seed(args.seed)
    with timer.stage("construct"):
        palm = PaLM(**probe_kit.TINY_PALM).to(device)
    batch = fixed_batch(args.seed, device)
    with torch.no_grad():
        logits, embeds = palm(batch, return_logits_with_embedding=True)
    n_params = sum(p.numel() for p in palm.parameters())
    checks.add("constructed", palm.to_logits.weight is palm.token_emb.weight
               and tuple(logits.shape) == (BATCH, SEQ_LEN, probe_kit.TINY_PALM["num_tokens"])
               and tuple(embeds.shape) == (BATCH, SEQ_LEN, probe_kit.TINY_PALM["dim"]),
               f"PaLM on {device}, {n_params} parameters, to_logits tied to token_emb; logits "
               f"{tuple(logits.shape)}, embeddings {tuple(embeds.shape)}")
    result["model"] = {"parameters": n_params, "logits_shape": list(logits.shape),
                       "embedding_shape": list(embeds.shape)}
    with timer.stage("loss_step"):
        result["loss"] = check_loss_step(palm, batch, args, checks)
    with timer.stage("generate"):
        result["generate"] = check_generate(palm, batch, checks)
    with timer.stage("lora"):
        result["lora"] = check_lora(palm, batch, checks)
    with timer.stage("save_load"):
        result["save_load"] = check_save_load(palm, batch, device, checks)
    result["checks"], result["timings_s"] = checks, timer.stages
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return smoke_main.run_checked_smoke(args, "tiny-palm-smoke", probe_kit.TINY_PALM, lambda device, timer: run_smoke(args, device, timer),
                                START, next_step=reporting.command("tiny-reward-smoke"))


START = time.perf_counter()

if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
