"""The reward-modeling sub-skill's code as a package: ``palm-rlhf-skill train-reward``.

- ``rm_config``: the reward-model run's config (RM.toml): its own [palm] sizes, [reward_model],
  [data], [train], [run]; torch-free parsing, then the keys against the installed library.
- ``examples``: preference pairs or ratings from JSONL, checked row by row, tokenized, split into
  training and held-out sets; the ids the training data contains.
- ``coverage``: token coverage: the ids the training data never contains, how the trained model
  scores them (a probe), and the remedy (``[train] tie_unseen_embeddings``).
- ``artifacts``: ``rm.pt`` and ``rm_config.json``, written at the end and read by ``train``'s
  ``[reward] checkpoint``.
- ``reward_run``: ``RewardRun``, the rounds of optimizer steps on the run kit (scripts/run_kit/).
- ``reward_report``: the metrics row, summary.json, the verdict and the next command.

Torch-free at import, like every module of the tree.
"""
