"""The run kit: a real training run on the library's own ``train()``, in rounds.

- ``metrics``: one row per round, observed on the library's own loop without changing it.
- ``watchdog``: rules that turn rows into named silent failures while the run goes on.
- ``checkpoint``: atomic checkpoints through ``accelerate.save_state`` and exact resume.
- ``rundir``: the run directory's files (``metrics.jsonl``, ``summary.json``, ``policy.pt``).
- ``export``: the trained policy as a standalone PaLM state dict, LoRA merged.
- ``trackers``: the same rows through Accelerate's tracker API (tensorboard, wandb, ...), offline.
- ``loop``: ``Run``, the rounds themselves; ``palm-rlhf-skill train`` is its command line.
- ``watch``: reading a live or finished run (``palm-rlhf-skill watch``).

Torch-free at import, like every module of the tree.
"""
