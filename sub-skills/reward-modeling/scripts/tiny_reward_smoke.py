#!/usr/bin/env python3
"""Tiny, bounded smoke for palm-rlhf-pytorch reward models: scalar and binned RewardModel, ImplicitPRM.

Checks, on the chosen device:
  1. scalar ``RewardModel`` (``num_binned_output=0``): a few Adam steps of its MSE loss on a toy
     preference task built from real text (assets/responses.txt: pairs of customer-support replies
     that differ only in thanking the customer; the thanking reply is rated 1, the other 0) raise
     the held-out pairwise accuracy (chosen scored above rejected) above chance (0.5);
  2. binned ``RewardModel`` (``num_binned_output=NUM_BINS``): its cross-entropy loss drops over the
     same steps, and at inference it returns int64 bin indices sampled with Gumbel noise;
  3. ``ImplicitPRM``: per-token rewards of shape ``(batch, seq_len - 1)``, all zero while the
     policy equals its reference copy; its labelled output equals minus the binary cross-entropy
     and backpropagates into the policy only (the reference model gets no gradient).

Usage:
    tiny_reward_smoke.py                    # report on stdout, verdict last
    tiny_reward_smoke.py --json             # one JSON object on stdout
    tiny_reward_smoke.py --seed 3 --steps 30
    tiny_reward_smoke.py --lr 0 --json      # forced failure: nothing learns (exit 1)

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
from skill_runtime import byte_tokenizer, exits, options, reporting, runner, smoke_main, streams  # noqa: E402
import probe_kit  # noqa: E402  (the tiny PaLM config, shared by every smoke and probe)

RESPONSES_FILE = Path(__file__).resolve().parents[1] / "assets" / "responses.txt"
PROMPT = "Reply to the customer: "   # shared prompt; marked with prompt_lengths
KEYWORD = "thank"                    # the rated property: a reply containing it is rated 1.0
HELD_OUT_EVERY = 4                   # every 4th pair is held out (7 of the 28 pairs)
NUM_BINS = 2                         # binned model: bin 1 = contains the keyword, bin 0 = not
CHANCE = 0.5                         # pairwise accuracy of a random scorer
PRM_ASCENT_LR = 1.0                  # plain gradient step on -prm(seq, labels)
PRM_SEQ_LEN = 24                     # ImplicitPRM sequences: first 24 bytes of each reply (no padding)


def build_parser() -> options.OneLineParser:
    parser = options.OneLineParser(
        description="Bounded smoke for palm-rlhf-pytorch reward models: train a tiny scalar "
                    "RewardModel on a toy preference task and report held-out accuracy, train a "
                    "binned one with cross-entropy, and check ImplicitPRM's rewards and gradients.",
        epilog="examples:\n"
               "  tiny-reward-smoke --json\n"
               "  tiny-reward-smoke --device cpu --seed 2\n"
               "  tiny-reward-smoke --steps 40 --lr 1e-3\n\n" + exits.EXIT_CODES_EPILOG)
    parser.add_argument("--steps", type=options.bounded_int(2, options.MAX_OPTIMIZER_STEPS), default=20, metavar="N",
                        help="full-batch Adam steps for each reward model (default: 20)")
    parser.add_argument("--lr", type=options.finite_nonnegative_float, default=3e-3,
                        help="Adam learning rate (default: 3e-3; 0 makes the training checks fail)")
    options.add_common_options(parser)
    return parser


# data ------------------------------------------------------------------------------------------

def load_pairs(path: Path | None = None) -> list[tuple[str, str]]:
    """(chosen, rejected) reply pairs: consecutive lines of ``path`` (default RESPONSES_FILE), the
    chosen one containing KEYWORD and the rejected one not. Raises SkillError(2) when the file is
    missing or malformed."""
    path = path or RESPONSES_FILE
    if not path.is_file():
        raise exits.SkillError(f"responses file missing: {path} (reinstall the skill tree)")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    pairs = list(zip(lines[0::2], lines[1::2]))
    if len(lines) % 2 or not pairs or not all(rating(a) == 1.0 and rating(b) == 0.0 for a, b in pairs):
        raise exits.SkillError(f"{path.name}: expected line pairs (reply with {KEYWORD!r}, reply without)")
    return pairs


def rating(reply: str) -> float:
    """The toy preference: 1.0 when the reply thanks the customer (contains KEYWORD), else 0.0."""
    return float(KEYWORD in reply.lower())


def split(pairs: list[tuple[str, str]]) -> tuple[list, list]:
    """Deterministic train/held-out split: every HELD_OUT_EVERY-th pair is held out."""
    held = [p for i, p in enumerate(pairs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    train = [p for i, p in enumerate(pairs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    return train, held


def encode(replies: list[str], device) -> dict[str, Any]:
    """RewardModel inputs for PROMPT + reply: ``x`` (batch, max_len) int64 byte ids + 1, right-padded
    with 0; ``mask`` (batch, max_len) bool, False on padding; ``prompt_lengths`` (batch,) int64."""
    import torch
    x = byte_tokenizer.ByteTokenizer()([PROMPT + r for r in replies]).to(device)
    lengths = torch.full((len(replies),), len(PROMPT.encode("utf-8")), dtype=torch.long, device=device)
    return {"x": x, "mask": x != byte_tokenizer.PAD_ID, "prompt_lengths": lengths}


# checks ----------------------------------------------------------------------------------------

def pairwise_accuracy(reward_model, pairs, device) -> float:
    """Fraction of (chosen, rejected) pairs whose chosen reply gets the higher scalar reward."""
    import torch
    reward_model.eval()
    with torch.no_grad():
        chosen = reward_model(**encode([c for c, _ in pairs], device))
        rejected = reward_model(**encode([r for _, r in pairs], device))
    return float((chosen > rejected).float().mean())


def eval_loss(reward_model, inputs, labels) -> float:
    """The labelled loss in eval mode (dropout off), so before and after compare like with like."""
    import torch
    reward_model.eval()
    with torch.no_grad():
        return reward_model(**inputs, labels=labels).item()


def train(reward_model, replies, labels, args, device) -> tuple[float, float]:
    """Full-batch Adam on ``reward_model.finetune_parameters()`` (LoRA scope 'reward' + head).

    Returns the eval-mode loss before and after ``args.steps`` steps (training runs with the
    model's dropout, 0.1 by default, so per-step training values are noisy)."""
    import torch
    optim = torch.optim.Adam(reward_model.finetune_parameters(), lr=args.lr)
    inputs = encode(replies, device)
    before = eval_loss(reward_model, inputs, labels)
    reward_model.train()
    for _ in range(args.steps):
        loss = reward_model(**inputs, labels=labels)
        optim.zero_grad()
        loss.backward()
        optim.step()
    return before, eval_loss(reward_model, inputs, labels)


def check_scalar(palm, train_pairs, held_pairs, args, device, checks: reporting.Checks) -> dict[str, Any]:
    import torch
    from palm_rlhf_pytorch import RewardModel
    reward_model = RewardModel(palm, num_binned_output=0).to(device)
    replies = [r for pair in train_pairs for r in pair]
    labels = torch.tensor([rating(r) for r in replies], device=device)
    before = pairwise_accuracy(reward_model, held_pairs, device)
    loss_before, loss_after = train(reward_model, replies, labels, args, device)
    after = pairwise_accuracy(reward_model, held_pairs, device)
    train_acc = pairwise_accuracy(reward_model, train_pairs, device)
    with torch.no_grad():
        scores = reward_model(**encode(held_pairs[0], device))
    checks.add("scalar_rewards_shape", tuple(scores.shape) == (2,) and scores.dtype == torch.float32,
               f"scalar RewardModel returns one float32 score per sequence: {tuple(scores.shape)}")
    checks.add("scalar_mse_loss_decreases", math.isfinite(loss_after) and loss_after < loss_before,
               f"MSE on ratings (eval mode) {loss_before:.4f} -> {loss_after:.4f} after {args.steps} Adam "
               f"steps (lr {args.lr})")
    checks.add("held_out_accuracy_above_chance", after > CHANCE,
               f"held-out pairwise accuracy {after:.3f} on {len(held_pairs)} unseen pairs (chance {CHANCE}; "
               f"before training {before:.3f}; train pairs {train_acc:.3f})")
    return {"train_pairs": len(train_pairs), "held_out_pairs": len(held_pairs), "steps": args.steps,
            "lr": args.lr, "loss_before": loss_before, "loss_after": loss_after,
            "held_out_accuracy_before": before, "held_out_accuracy": after,
            "train_accuracy": train_acc, "chance": CHANCE}


def check_binned(palm, train_pairs, args, device, checks: reporting.Checks) -> dict[str, Any]:
    import torch
    from palm_rlhf_pytorch import RewardModel
    reward_model = RewardModel(palm, num_binned_output=NUM_BINS).to(device)
    replies = [r for pair in train_pairs for r in pair]
    labels = torch.tensor([int(rating(r)) for r in replies], device=device)  # class index = bin
    loss_before, loss_after = train(reward_model, replies, labels, args, device)
    with torch.no_grad():
        bins = reward_model(**encode(replies[:4], device))
    checks.add("binned_cross_entropy_decreases", math.isfinite(loss_after) and loss_after < loss_before,
               f"cross-entropy over {NUM_BINS} bins (eval mode) {loss_before:.4f} -> {loss_after:.4f} after "
               f"{args.steps} steps")
    checks.add("binned_inference_returns_bin_index",
               bins.dtype == torch.long and tuple(bins.shape) == (4,) and bool(((bins >= 0) & (bins < NUM_BINS)).all()),
               f"without labels it returns Gumbel-sampled bin indices: {bins.tolist()} ({bins.dtype})")
    return {"num_bins": NUM_BINS, "loss_before": loss_before, "loss_after": loss_after,
            "inference_sample": bins.tolist()}


def check_implicit_prm(train_pairs, args, device, checks: reporting.Checks) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from palm_rlhf_pytorch import ImplicitPRM, PaLM
    policy = PaLM(**probe_kit.TINY_PALM).to(device)
    prm = ImplicitPRM(policy)  # reference model: a frozen deep copy of the policy
    replies = [r for pair in train_pairs[:2] for r in pair]
    seq = byte_tokenizer.ByteTokenizer()([r[:PRM_SEQ_LEN] for r in replies]).to(device)  # equal lengths: no padding
    labels = torch.tensor([rating(r) for r in replies], device=device)
    with torch.no_grad():
        fresh = prm(seq)
    checks.add("implicit_prm_rewards_shape",
               tuple(fresh.shape) == (seq.shape[0], seq.shape[1] - 1) and bool((fresh == 0).all()),
               f"per-token rewards {tuple(fresh.shape)} for sequences {tuple(seq.shape)}; all zero while "
               "the policy equals its reference copy")
    with torch.no_grad():  # move the policy off its reference so the rewards are nonzero
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    out = prm(seq, labels)
    rewards = prm(seq).detach()
    bce = F.binary_cross_entropy_with_logits(rewards, labels[:, None].expand_as(rewards))
    out.backward()
    out = out.item()
    policy_grads = [p.grad for p in policy.parameters()]
    ref_grads = [p.grad for p in prm.ref_model.parameters()]
    nonzero = sum(g is not None and bool(g.abs().sum() > 0) for g in policy_grads)
    checks.add("implicit_prm_loss_backpropagates",
               nonzero == len(policy_grads) and all(g is None for g in ref_grads)
               and all(not p.requires_grad for p in prm.ref_model.parameters()),
               f"labelled output backpropagates: {nonzero}/{len(policy_grads)} policy tensors got a nonzero "
               f"gradient; reference tensors with a gradient: {sum(g is not None for g in ref_grads)}")
    diff = abs(out + float(bce))
    with torch.no_grad():  # one gradient step that minimizes -prm(seq, labels), i.e. raises it
        for p in policy.parameters():
            p.add_(p.grad, alpha=PRM_ASCENT_LR)
        bce_after = float(F.binary_cross_entropy_with_logits(prm(seq), labels[:, None].expand_as(rewards)))
    checks.add("implicit_prm_output_is_minus_bce", diff < 1e-5 and out <= 0 and bce_after < float(bce),
               f"prm(seq, labels) = {out:.5f} = -BCE(rewards, labels) (|diff| {diff:.2g}), a log-"
               f"likelihood: one step minimizing its negative (lr {PRM_ASCENT_LR}) lowers the BCE "
               f"{float(bce):.5f} -> {bce_after:.5f}")
    return {"sequence_shape": list(seq.shape), "rewards_shape": list(fresh.shape),
            "labelled_output": out, "bce": float(bce), "bce_after_step": bce_after, "policy_tensors_with_grad": nonzero,
            "reference_tensors_with_grad": sum(g is not None for g in ref_grads)}


def run_smoke(args, device, pairs: list[tuple[str, str]], timer: streams.Timer) -> dict[str, Any]:
    """All reward-model checks, each part timed (and shown) by ``timer``; returns the per-part
    results (JSON-ready) and the checks."""
    from accelerate.utils import set_seed
    from palm_rlhf_pytorch import PaLM

    checks, result = reporting.Checks(), {}
    train_pairs, held_pairs = split(pairs)
    set_seed(args.seed)
    palm = PaLM(**probe_kit.TINY_PALM).to(device)  # each RewardModel deep-copies it
    with timer.stage("scalar"):
        result["scalar"] = check_scalar(palm, train_pairs, held_pairs, args, device, checks)
    with timer.stage("binned"):
        result["binned"] = check_binned(palm, train_pairs, args, device, checks)
    with timer.stage("implicit_prm"):
        result["implicit_prm"] = check_implicit_prm(train_pairs, args, device, checks)
    checks.add("base_palm_untouched", not palm.finetune_modules,
               "RewardModel deep-copied the PaLM: its 'reward' LoRA scope is not on the PaLM passed in")
    result["data"] = {"file": RESPONSES_FILE.name, "pairs": len(train_pairs) + len(held_pairs),
                      "keyword": KEYWORD, "prompt": PROMPT}
    result["checks"], result["timings_s"] = checks, timer.stages
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pairs = load_pairs()  # before torch: a missing asset is a one-line exit 2
    return smoke_main.run_checked_smoke(args, "tiny-reward-smoke", probe_kit.TINY_PALM,
                                lambda device, timer: run_smoke(args, device, pairs, timer), START,
                                next_step=reporting.command("tiny-rlhf-smoke", "--trainer all"))


START = time.perf_counter()

if __name__ == "__main__":
    sys.exit(runner.run_cli(main))
