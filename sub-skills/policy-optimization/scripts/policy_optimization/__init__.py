"""The policy-optimization sub-skill's code, one module per responsibility.

- ``trainers``: the four trainers of palm-rlhf-pytorch in one table (names, classes, optimizers,
  group arguments, display names) and the calls every helper makes on a built trainer.
- ``evaluation``: the held-out reward of a policy, sampled with fixed seeds (the learning check's
  measure and the run kit's).

Torch-free at import, like every module of the tree: the helpers' ``--help`` answers without it.
"""
