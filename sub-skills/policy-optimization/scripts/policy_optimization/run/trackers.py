"""The metrics rows through Accelerate's tracker API (``Accelerator(log_with=..., project_dir=...)``,
``init_trackers``, ``log``, ``end_training``), offline, into ``DIR/trackers/``.

The trainer builds its own Accelerator from ``accelerate_kwargs``, so the tracker settings go in
there (``accelerate_kwargs``); only the main process logs (Accelerate's trackers are main-process
only). Accelerate drops a tracker whose package is missing without a word
(``accelerate/tracking.py`` ``filter_trackers``); ``check_available`` says so first, exit 3.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from skill_runtime import exits

# --log-with NAME: (the Accelerate logger type, the PyPI package to install)
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow", "aim": "aim"}


def check_available(name: str) -> None:
    """Raise SkillError(3) when the tracker's package is not installed (Accelerate would skip it)."""
    from accelerate.utils import imports
    if not getattr(imports, f"is_{name}_available")():
        raise exits.SkillError(f"--log-with {name}: the {TRACKERS[name]} package is not installed: "
                               f"pip install {TRACKERS[name]}", exits.EXIT_DEPENDENCY)


def accelerate_kwargs(name: str, folder: Path) -> dict[str, Any]:
    """What the trainer's Accelerator needs for tracker ``name``, and the offline settings of the
    trackers that would go online: wandb runs offline (``WANDB_MODE=offline`` unless set), mlflow
    writes a file store in ``folder``, aim its repository there."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(folder))
    if name == "mlflow":
        # mlflow 3 refuses a plain file store ("maintenance mode"); a sqlite file works offline
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    return {"log_with": name, "project_dir": str(folder)}


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row as flat tracker values: nested dicts become ``key/sub``, a
    per-prompt list ``key/0``, ``key/1``, ... (file order), a list of printed losses its mean,
    booleans 0/1; None, text and non-finite values are left out."""
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
        elif isinstance(value, list) and key.endswith("_per_prompt"):  # one value per held-out prompt
            for i, inner in enumerate(value):
                put(f"{key}/{i}", inner)
        elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
            mean = sum(value) / len(value)
            if math.isfinite(mean):
                out[key] = mean
        elif isinstance(value, dict):
            for sub, inner in value.items():
                put(f"{key}/{sub}", inner)


    for key, value in row.items():
        if key not in ("round", "rules"):
            put(key, value)
    return out


def start(trainer, project: str, config: dict[str, Any], first_round: int) -> None:
    """``init_trackers(project, config)``; a resumed run (``first_round`` > 1) asks tensorboard to
    purge the steps from ``first_round`` on (``SummaryWriter(purge_step=...)``), so steps written
    after the checkpoint are replaced, as in metrics.jsonl."""
    init_kwargs = {"tensorboard": {"purge_step": first_round}} if first_round > 1 else {}
    trainer.accelerate.init_trackers(project, config=flat_config(config), init_kwargs=init_kwargs)


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as ``section.key`` scalars (what trackers accept as hyperparameters)."""
    flat = {}
    for section, table in config.items():
        if isinstance(table, dict):
            for key, value in table.items():
                flat[f"{section}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def log(trainer, row: dict[str, Any]) -> None:
    """One round's ``scalars`` at step ``row['round']``."""
    trainer.accelerate.log(scalars(row), step=row["round"])


def end(trainer) -> None:
    """Close the trackers (flushes tensorboard's event file)."""
    trainer.accelerate.end_training()
