"""The watchdog's measured cases: one healthy toy run and deliberately broken ones, each broken
config with the rule it must fire (``calibrate_watchdog.py`` measures false alarms and misses over
seeds and regenerates references/training-run.md#watchdog-rules; the tests run them once).

A case is a tiny run config (byte-level PaLM, dim 32, short prompts, a rule reward: the fraction
of ASCII bytes in the response, about 0.5 for a fresh PaLM, so groups differ and it can rise)
written into a folder by ``write``; ``overrides`` replace keys of its tables, ``reward`` the
reward program's source, ``prompts`` the training prompts. Torch-free.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import probe_kit
from policy_optimization import trainers

PROMPTS = ("ab", "cde", "fg", "hij", "kl", "mno")   # training prompts: 2-3 bytes (byte tokenizer)
HELD_OUT = ("pq", "rst", "uv")                      # held-out prompts
ASCII = '''
import torch

def score(x, response_mask):                       # (b, n) int64, (b, n) bool -> (b,)
    hits = (x <= 128) & response_mask              # byte ids 1..128: the ASCII bytes, half the vocabulary
    return hits.sum(dim=1).float() / response_mask.sum(dim=1).clamp(min=1).float()
'''


BANG = """
import torch

def score(x, response_mask):                       # each response byte's closeness to '!', averaged
    close = 1.0 - (x - (ord("!") + 1)).abs().float() / 256
    return (close * response_mask).sum(dim=1) / response_mask.sum(dim=1).clamp(min=1).float()
"""
OPPOSITE_R = ASCII + """

_ascii = score

def score(x, response_mask):                       # prompts starting with 'r' want the other half of the bytes
    ascii = _ascii(x, response_mask)
    return torch.where(x[:, 0] == ord("r") + 1, 1.0 - ascii, ascii)
"""
NEAR_PROMPT = """
import torch

def score(x, response_mask):                       # each response byte's closeness to the prompt's first byte
    close = 1.0 - (x - x[:, :1]).abs().float() / 256
    return (close * response_mask).sum(dim=1) / response_mask.sum(dim=1).clamp(min=1).float()
"""
LETTERS = """
import torch

def score(x, response_mask):                       # the gold metric: the share of response bytes that are letters
    byte = x - 1
    letters = ((byte >= 65) & (byte <= 90)) | ((byte >= 97) & (byte <= 122))
    return (letters & response_mask).sum(dim=1).float() / response_mask.sum(dim=1).clamp(min=1).float()
"""
PROXY = LETTERS.replace("def score(", "def _letters(") + """

def score(x, response_mask):                       # a proxy: ASCII bytes, letters paid half
    ascii = ((x <= 128) & response_mask).sum(dim=1).float() / response_mask.sum(dim=1).clamp(min=1).float()
    return ascii - 0.5 * _letters(x, response_mask)
"""


@dataclass(frozen=True)
class Case:
    name: str
    trainer: str
    expect: str | None                      # the rule it must fire (None: the healthy run fires none)
    why: str                                # what is broken, in the words of the silent-failure table
    overrides: dict = field(default_factory=dict)
    reward: str = ASCII
    prompts: tuple[str, ...] = PROMPTS
    rounds: int = 8
    within: int = 3                         # it must fire by this round
    metric: str | None = None               # the gold metric's source ([eval] metric = "gold.py:score")
    setup: str | None = None                # a file the case needs, made by ``write``: SETUPS key


def base_config(trainer: str, rounds: int) -> dict:
    """The healthy toy run: all weights trained at lr 1e-2 (LoRA barely moves a fresh PaLM:
    training-run.md#first-run), groups of 4, 4 rollouts per round, the held-out reward every round;
    measured: the held-out reward rises from about 0.5 within 8 rounds on every seed tried."""
    keys = {"name": trainer, "actor_lora": False, "actor_lr": 1e-2, "minibatch_size": 4}
    group_kwarg = trainers.TRAINERS[trainer].group_kwarg
    if group_kwarg:
        keys[group_kwarg] = 3
    if trainer == "flowrl":
        keys["partition_function_hidden_dim"] = 32
    if trainer == "ppo":
        keys["minibatch_size"] = 2
    return {"palm": dict(probe_kit.TINY_PALM),
            "trainer": keys, "prompts": {"file": "prompts.txt"}, "reward": {"program": "reward.py:score"},
            "train": {"update_timesteps": 4, "max_seq_len": 8},
            "eval": {"prompts_file": "held_out.txt", "every": 1, "samples": 8},
            "run": {"rounds": rounds, "checkpoint_every": rounds, "seed": 0}}


def toml(config: dict) -> str:
    """A config as TOML (tables of scalars)."""
    def value(v):
        return str(v).lower() if isinstance(v, bool) else json.dumps(v)
    return "\n".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items()) for name, table in config.items())


def write(case: Case, folder: Path, seed: int = 0, rounds: int | None = None) -> Path:
    """The case's run config in ``folder`` (run.toml, reward.py, prompts.txt, held_out.txt), seeded
    by ``seed``; returns the config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.txt").write_text("\n".join(case.prompts) + "\n", encoding="utf-8")
    (folder / "held_out.txt").write_text("\n".join(HELD_OUT) + "\n", encoding="utf-8")
    (folder / "reward.py").write_text(textwrap.dedent(case.reward), encoding="utf-8")
    config = base_config(case.trainer, rounds or case.rounds)
    config["run"]["seed"] = seed
    if case.metric is not None:
        (folder / "gold.py").write_text(textwrap.dedent(case.metric), encoding="utf-8")
        config["eval"]["metric"] = "gold.py:score"
    if case.setup is not None:
        for section, keys in SETUPS[case.setup](folder).items():  # a [reward] table replaces the program
            config[section] = keys if section == "reward" else {**config.get(section, {}), **keys}
    for section, keys in case.overrides.items():
        table = config.setdefault(section, {})
        for key, v in keys.items():
            table.pop(key, None) if v is None else table.__setitem__(key, v)
    path = folder / "run.toml"
    path.write_text(toml(config), encoding="utf-8")
    return path


HEALTHY = Case("healthy", "grpo", None, "the toy task as it should run")
# PPO has no healthy toy here: at these sizes it does not learn within 8 rounds (measured; its learning
# check runs on a 16-token vocabulary: workflows.md#learning-check), and held_out_flat says so.
HEALTHY_OTHERS = (Case("healthy tpo", "tpo", None, "the toy task as it should run"),
                  # 24 prompts: on 12, FlowRL overfits them by round 8 on 1 seed of 10 (held_out_falling, measured)
                  Case("healthy flowrl", "flowrl", None, "the toy task as it should run, 8 rollouts per round, lr 3e-3, 24 training prompts",
                       overrides={"train": {"update_timesteps": 8}, "trainer": {"actor_lr": 3e-3}},
                       prompts=PROMPTS + ("wx", "yza", "bc", "def", "gh", "ijk", "lm", "nop", "qr", "stu", "vw", "xyz",
                                          "ac", "bdf", "eg", "hik", "ln", "moq")))
BROKEN = (
    Case("constant reward", "grpo", "equal_rewards", "every completion of a prompt scores the same",
         reward="import torch\n\ndef score(x, response_mask):\n    return torch.full((x.shape[0],), 0.5)\n"),
    Case("PPO minibatch of one", "ppo", "zero_advantage", "a PPO minibatch of one: advantage exactly 0",
         overrides={"trainer": {"minibatch_size": 1}}),
    Case("LoRA at lr 1e-30", "grpo", "weights_frozen", "a learning rate too small to move float32 weights",
         overrides={"trainer": {"actor_lora": True, "actor_lr": 1e-30}}),
    Case("NaN reward", "ppo", "non_finite", "a reward program that returns NaN (GRPO raises on it)",
         reward="import torch\n\ndef score(x, response_mask):\n    return torch.full((x.shape[0],), float('nan'))\n"),
    Case("eos in every prompt", "grpo", "one_token_responses", "the eos id inside every prompt",
         overrides={"train": {"eos_token": ord("z") + 1}}, prompts=("az", "zbc", "dz", "zef", "gz", "hzi")),
    Case("lr 1.0", "grpo", "kl_blowup", "a learning rate that throws the policy away from its rollouts",
         overrides={"trainer": {"actor_lr": 1.0}}),
    Case("LoRA at lr 1e-6", "grpo", "held_out_flat", "LoRA on a fresh PaLM at a small learning rate: learns nothing",
         overrides={"trainer": {"actor_lora": True, "actor_lr": 1e-6}}, within=5),  # 5 evaluations: HELD_OUT_PATIENCE
    Case("max_timesteps 6, update_timesteps 4", "grpo", "rollouts_dropped", "update_timesteps not dividing the rollouts",
         overrides={"train": {"max_timesteps": 6}}),
    Case("PPO rewards in [0, 10]", "ppo", "reward_outside_critic_range", "PPO rewards outside [0, 5]",
         reward=ASCII.replace("    return hits", "    return 10.0 * hits")),
    Case("TPO group of one", "tpo", "group_of_one", "one completion per prompt",
         overrides={"trainer": {"num_times_sample_rewards": 0}}),
    Case("MaxRL with rewards averaging 0", "grpo", "advantage_extreme", "GRPO use_max_rl with rewards averaging 0",
         overrides={"trainer": {"use_max_rl": True}},
         reward="import torch\n\ndef score(x, response_mask):\n    half = x.shape[0] // 2\n"
                "    return torch.where(torch.arange(x.shape[0]) < half, 1.0, -1.0)\n"),
    Case("a reward program that leaks", "grpo", "memory_growing", "a reward program keeping tensors across rounds",
         reward=ASCII + "\nKEPT = []\n_score = score\n\ndef score(x, response_mask):\n"
                         "    KEPT.append(torch.ones(12_000_000))  # 46 MiB kept per rollout\n"
                         "    return _score(x, response_mask)\n",
         within=4),  # growth in 3 rounds in a row after round 1, whose growth is the run's own warm-up
    Case("a reward one byte maxes out, lr 0.3", "grpo", "repeated_token",
         "a reward for '!' (each byte scored by its closeness to '!'): the policy writes '!!!!'",
         overrides={"trainer": {"actor_lr": 0.3}}, reward=BANG, within=8),
    Case("a reward one byte maxes out, lr 0.5", "grpo", "entropy_collapse",
         "the same reward at a higher learning rate: the policy's distribution collapses",
         overrides={"trainer": {"actor_lr": 0.5}}, reward=BANG, within=8),
    Case("entropy bonus beta_s 10 on a confident policy", "grpo", "entropy_blowup",
         "an entropy bonus 1000x the default on a low-entropy PaLM: it turns into noise",
         overrides={"trainer": {"actor_lr": 3e-2, "beta_s": 10.0}}, setup="confident_palm", within=8),
    Case("one held-out prompt wants the opposite", "grpo", "held_out_prompt_collapse",
         "a held-out prompt whose reward is the opposite of the training prompts': it collapses, the mean rises",
         reward=OPPOSITE_R, within=8),
    Case("lr 0.3", "grpo", "held_out_drop", "a learning rate past the stable range: the held-out reward drops",
         overrides={"trainer": {"actor_lr": 0.3}}, within=4),
    Case("a reward model that pays for unseen ids", "grpo", "unseen_reward_ids",
         "a reward model trained on 37 byte values that scores the other ids like its preferred ones",
         reward=ASCII, setup="gamed_reward_model", within=3),
    Case("a proxy reward against a gold metric", "grpo", "proxy_gold_divergence",
         "a proxy that pays less for the letters the gold metric wants: reward up, gold down",
         reward=PROXY, metric=LETTERS, within=8),
    Case("one training prompt", "grpo", "train_held_out_gap",
         "a prompt-dependent reward trained on one prompt: it fits that prompt, not the held-out ones",
         reward=NEAR_PROMPT, prompts=("\u00e9\u00e9",), within=8),
)
CASES = (HEALTHY, *HEALTHY_OTHERS, *BROKEN)

# the seen ids of the gamed reward model: digits, lowercase letters and space (37 byte values, the issue's)
SEEN = "0123456789abcdefghijklmnopqrstuvwxyz "


def confident_palm(folder: Path) -> dict:
    """A low-entropy PaLM (``probe_kit.TINY_PALM``, seed 0, its tied embedding scaled 30x: the
    next-token entropy falls from about 5.5 to 0.001 nats) in ``folder/confident.pt``: a
    pretrained policy's confidence without pretraining. Returns the config keys that use it."""
    import torch
    from palm_rlhf_pytorch import PaLM
    torch.manual_seed(0)
    palm = PaLM(**probe_kit.TINY_PALM)
    with torch.no_grad():
        palm.token_emb.weight.mul_(30.0)
    torch.save(palm.state_dict(), folder / "confident.pt")
    return {"palm": {"checkpoint": "confident.pt"}}


def gamed_reward_model(folder: Path, tie: str = "best") -> dict:
    """A reward model as ``train-reward`` leaves one, in ``folder/rm/``: ``rm.pt`` (a RewardModel of
    ``probe_kit.TINY_PALM``, LoRA as the default), ``rm_config.json`` and ``summary.json`` with
    ``unseen_ids``. It is trained (Bradley-Terry, 60 steps) to prefer digits to letters on pairs
    that use only the 37 byte values of SEEN; then the 220 other ids get the embedding of its best
    digit (``tie`` "best"), as the issue measured (they scored like the preferred ones), or the
    mean of the seen ids' embeddings ("mean": the remedy, which the rule must leave alone).
    Returns the config keys."""
    import json
    import torch
    import torch.nn.functional as F
    from palm_rlhf_pytorch import PaLM, RewardModel
    torch.manual_seed(0)
    rm = RewardModel(PaLM(**probe_kit.TINY_PALM))
    ids = lambda text: [b + 1 for b in text.encode()]  # the byte tokenizer: id = byte + 1
    generator = torch.Generator().manual_seed(0)

    def batch(alphabet: str, n: int, length: int):
        pool = torch.tensor(ids(alphabet))
        return pool[torch.randint(len(pool), (n, length), generator=generator)]

    optimizer = torch.optim.Adam(rm.finetune_parameters(), lr=3e-3)
    prompt_mask = torch.arange(11) < 3
    for _ in range(60):
        prompts = batch("abcdefghijklmnopqrstuvwxyz", 16, 3)
        chosen = torch.cat((prompts, batch("0123456789", 16, 8)), dim=1)
        rejected = torch.cat((prompts, batch("abcdefghijklmnopqrstuvwxyz ", 16, 8)), dim=1)
        margin = rm(chosen, prompt_mask=prompt_mask.expand(16, -1)) - rm(rejected, prompt_mask=prompt_mask.expand(16, -1))
        loss = -F.logsigmoid(margin).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    rm.eval()
    seen = sorted(set(ids(SEEN)))
    unseen = [i for i in range(probe_kit.TINY_PALM["num_tokens"]) if i not in seen]
    with torch.no_grad():
        digits = torch.tensor(ids("0123456789"))
        scores = rm(torch.cat((torch.full((10, 3), ids("a")[0]), digits[:, None].expand(10, 8)), dim=1),
                    prompt_mask=prompt_mask.expand(10, -1))
        best = int(digits[scores.argmax()])
        weight = rm.palm.token_emb.weight
        weight[unseen] = (weight[best] if tie == "best" else weight[seen].mean(dim=0)).clone()
    out = folder / "rm"
    out.mkdir(exist_ok=True)
    torch.save(rm.state_dict(), out / "rm.pt")
    (out / "rm_config.json").write_text(json.dumps({"palm": dict(probe_kit.TINY_PALM), "reward_model": {}}))
    (out / "summary.json").write_text(json.dumps({"unseen_ids": unseen}))
    return {"reward": {"checkpoint": "rm/rm.pt"}}


SETUPS = {"confident_palm": confident_palm, "gamed_reward_model": gamed_reward_model,
          "covered_reward_model": lambda folder: gamed_reward_model(folder, tie="mean")}
