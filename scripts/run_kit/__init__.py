"""The run kit: the machinery every kind of training run shares (the policy runs of
``palm-rlhf-skill train`` and the reward-model runs of ``palm-rlhf-skill train-reward``).

- ``rundir``: the run directory's files, written atomically; the metrics file; the run's lock.
- ``checkpoint``: atomic checkpoints through ``accelerate.save_state`` and exact resume.
- ``trackers``: the metrics rows through Accelerate's tracker API (tensorboard, wandb, ...), offline.
- ``watch``: reading a live or finished run (``palm-rlhf-skill watch``).
- ``launch``: N local ranks of a script under torchrun; a launcher's world.

Torch-free at import, like every module of the tree.
"""
