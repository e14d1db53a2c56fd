"""The run kit: a real training run on the library's own ``train()``, in rounds.

- ``metrics``: one row per round, observed on the library's own loop without changing it.
- ``watchdog``: rules that turn rows into named silent failures while the run goes on.
- ``export``: the trained policy as a standalone PaLM state dict, LoRA merged.
- ``loop``: ``Run``, the rounds themselves; ``palm-rlhf-skill train`` is its command line.

The machinery every kind of run shares (run directory, checkpoints, trackers, watch) is the root's
``scripts/run_kit/``.

Torch-free at import, like every module of the tree.
"""
