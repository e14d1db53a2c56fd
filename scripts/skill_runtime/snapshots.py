"""Weight snapshots: detached clones of named tensors and the names that changed since."""
from __future__ import annotations

from typing import Any, Iterator


def snapshot(named_params: Iterator[tuple[str, Any]]) -> dict[str, Any]:
    """Detached clones of ``(name, tensor)`` pairs, keyed by name, for a later ``changed_names``."""
    return {name: p.detach().clone() for name, p in named_params}


def changed_names(before: dict[str, Any], named_params: Iterator[tuple[str, Any]]) -> list[str]:
    """Names whose tensor differs (any element, exact comparison) from its snapshot."""
    import torch
    return [name for name, p in named_params if not torch.equal(before[name], p.detach().to(before[name].device))]
