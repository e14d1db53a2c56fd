"""The policy-optimization sub-skill's code, one module per responsibility.

- ``trainers``: the four trainers of palm-rlhf-pytorch in one table (names, classes, optimizers,
  group arguments, display names) and the calls every helper makes on a built trainer.
- ``evaluation``: the held-out reward of a policy, sampled with fixed seeds (the learning check's
  measure and the run kit's).
- ``run_config``: the run config of ``plan`` and ``train``, one parser: read, ``--set``,
  structure (torch-free), then every key against the installed signatures.
- ``programs``: the user programs a config names (tokenizer, reward on ids, reward on text),
  loaded, signature-checked, and wrapped so their output is checked at each call.
- ``builder``: from a resolved config, the PaLM, reward model, prompts, held-out prompts and
  trainer (``build``), shared by the plan's probe and ``train``.
- ``counting``: rollouts, learn() calls and optimizer steps of a run; parameters and bytes.
- ``measuring``: process memory and its peak, available memory, what a rollout stores.
- ``probe``: the bounded probe of a run at its real size.
- ``prediction``: memory, wall time, warnings and the verdict from counts and measurements.
- ``planner``: ``plan`` (count, probe, predict) and ``execute`` (the run for real).
- ``plan_report``: the plan's plain report.
- ``accuracy``: predictions against real runs (``bench --plan-accuracy``).

Torch-free at import, like every module of the tree: the helpers' ``--help`` answers without it.
"""
