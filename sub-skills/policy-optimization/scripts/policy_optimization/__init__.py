"""The policy-optimization sub-skill's code, one module per responsibility.

- ``trainers``: the four trainers of palm-rlhf-pytorch in one table (names, classes, optimizers,
  group arguments, display names) and the calls every helper makes on a built trainer.
- ``evaluation``: the held-out reward of a policy, sampled with fixed seeds (the learning check's
  measure and the run kit's).
- ``launch``: generic multi-process start-up: a launcher's world (``launcher_world``), and N local
  ranks of a script under torchrun (``launch_script``), with resource checks and signal forwarding.
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

The smoke helper (``tiny_rlhf_smoke.py``) in rooms along its own steps:

- ``smoke_options``: every option once (argparse, the modes it applies to, the report's config).
- ``smoke_settings``: modes, bounds, GRPO variants, rollouts and optimizer steps of the one learn().
- ``smoke_prompts``: the prompt styles and the eos-in-prompt check.
- ``smoke_checklist``: one trainer's train smoke: build, snapshot, update, compare, sample.
- ``learning_check``: ``--learn``, the held-out reward rising over seeds.
- ``smoke_report``: the JSON report, the plain text, the next step.
- ``smoke_estimate``: seconds and memory of a run before it starts.
- ``smoke_ranks``: the smoke as one rank of a world, and ``--nproc``.

The tiny sizes all of them build are the probe kit's (``scripts/probe_kit.py`` at the skill root).
Torch-free at import, like every module of the tree: the helpers' ``--help`` answers without it.
"""
