"""palm-rlhf-skill: an agent skill tree for palm-rlhf-pytorch, shipped with its smoke helpers."""

__version__ = "0.1.0"
