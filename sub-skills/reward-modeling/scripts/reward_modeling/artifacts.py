"""What ``train-reward`` leaves for the policy run: ``DIR/rm.pt``, the reward model's state dict,
and ``DIR/rm_config.json``, ``{"palm": {...}, "reward_model": {...}, "tokenizer": {...}}``, the
arguments that build it and the tokenizer it read (the policy must read the same): ``RewardModel(PaLM(**c["palm"]), **c["reward_model"])`` then ``load_state_dict(torch.load(rm.pt))``.

``palm-rlhf-skill train``'s ``[reward] checkpoint = ".../rm.pt"`` reads the rm_config.json beside
it (``beside``, ``read``), so the reward model keeps its own sizes whatever the policy's [palm] is,
and the ids it never saw in training from the summary.json beside it (``unseen_ids``).
Torch-free at import.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from run_kit import rundir
from skill_runtime import exits


def write(reward_model, palm_kwargs: dict[str, Any], reward_model_kwargs: dict[str, Any], run: rundir.RunDir,
          tokenizer: dict[str, Any]) -> dict[str, str]:
    """Write ``rm.pt`` (``reward_model.state_dict()`` on the CPU, ``torch.save``) and
    ``rm_config.json`` (the PaLM's and the RewardModel's arguments, library defaults filled in, so
    a later default cannot change the model; ``jsonable``; ``tokenizer``, what it was trained with:
    ``data_kit.tokenizer_file.record``) into ``run``, each atomically. Returns
    ``{"rm": path, "rm_config": path}``."""
    state = {key: value.detach().cpu().clone() for key, value in reward_model.state_dict().items()}
    rm = rundir.write_torch_atomic(state, run.path / rundir.RM)
    config = run.path / rundir.RM_CONFIG
    rundir.write_atomic(config, json.dumps({"palm": jsonable(palm_kwargs), "reward_model": jsonable(reward_model_kwargs),
                                            "tokenizer": tokenizer}, indent=1))
    return {"rm": str(rm), "rm_config": str(config)}


def jsonable(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments as JSON values: a tuple (``finetune_scopes=()``) as a list; a None
    (``sample_from_bins``: derived from another argument) left out, so the constructor derives it."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in kwargs.items() if value is not None}


def beside(checkpoint: str | Path) -> Path:
    """The rm_config.json next to a reward-model checkpoint file."""
    return Path(checkpoint).parent / rundir.RM_CONFIG


def read(path: Path, where: str) -> dict[str, dict[str, Any]]:
    """``rm_config.json`` at ``path`` as ``{"palm": {...}, "reward_model": {...}}`` and, from this
    version on, ``"tokenizer"`` (``data_kit.tokenizer_file.record``). Raises
    SkillError(2) naming ``where`` (the config key) when it is unreadable, not JSON, or not two
    tables of arguments."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise exits.SkillError(f"{where}: {path}: unreadable ({exits.one_line(exc)}): train-reward writes it beside "
                               "rm.pt") from None
    if not isinstance(config, dict) or not all(isinstance(config.get(k), dict) for k in ("palm", "reward_model")):
        raise exits.SkillError(f"{where}: {path}: expected {{\"palm\": {{...}}, \"reward_model\": {{...}}}} "
                               "(the arguments that build the reward model)")
    return config


def unseen_ids(checkpoint: str | None) -> list[int] | None:
    """The ids the reward model of ``checkpoint`` (a policy run's [reward] checkpoint) never saw in
    training: ``unseen_ids`` of the ``summary.json`` beside the checkpoint file (what
    ``train-reward`` writes), or None without a checkpoint, a record or that key. Raises
    SkillError(2) when the record is there but is not JSON or its ``unseen_ids`` is not a list of
    integers."""
    record = Path(checkpoint).parent / rundir.SUMMARY if checkpoint else None
    if record is None or not record.is_file():
        return None
    try:
        ids = json.loads(record.read_text(encoding="utf-8")).get("unseen_ids")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise exits.SkillError(f"config [reward] checkpoint: {record}: unreadable ({exits.one_line(exc)}): the "
                               "reward model's record (train-reward writes it)") from None
    if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
        raise exits.SkillError(f"config [reward] checkpoint: {record}: unseen_ids is not a list of integer ids")
    return ids
