"""The policy-optimization sub-skill's code: what several rooms share at the top, one room per
kind of work below it.

- ``trainers``: the four trainers of palm-rlhf-pytorch in one table (names, classes, optimizers,
  group arguments, display names) and the calls every helper makes on a built trainer.
- ``evaluation``: the held-out reward of a policy, sampled with fixed seeds (the learning check's
  measure, the run kit's and ``evaluate``'s).
- ``run_config``: the run config of ``plan`` and ``train``, one parser: read, ``--set``,
  structure (torch-free), then every key against the installed signatures.
- ``programs``: the user programs a config names (tokenizer, reward on ids, reward on text),
  loaded, signature-checked, and wrapped so their output is checked at each call.
- ``builder``: from a resolved config, the PaLM, reward model, prompts, held-out prompts and
  trainer (``build``), shared by the plan's probe and ``train``.
- ``measuring``: process memory and its peak, available memory, what a rollout stores, clocks
  (the plan, the run kit and the bench).
- ``scaling``: ``bench --scaling``, the train smoke's time and memory against its size.
- ``rollout_bench``: ``bench --rollouts``, the library's sampler against the cached one.

The rooms, each with its own ``__init__`` listing its modules:

- ``smoke/``: the smoke helper (``tiny_rlhf_smoke.py``) along its checklist's steps.
- ``plan/``: the plan of a run (``plan_run.py``): count, probe, predict, advise, report.
- ``run/``: the run kit, a real training run in rounds (``train_run.py``, ``evaluate_run.py``).

Torch-free at import, like every module of the tree: the helpers' ``--help`` answers without it.
"""
