"""The smoke helper (``tiny-rlhf-smoke``), one module per step of the checklist it proves.

- ``options``: every option once (argparse, the modes it applies to, the report's config).
- ``settings``: modes, bounds, GRPO variants, rollouts and optimizer steps of the one learn().
- ``prompts``: the prompt styles and the eos-in-prompt check.
- ``checklist``: one trainer's train smoke: build, snapshot, update, compare, sample.
- ``learning_check``: ``--learn``, the held-out reward rising over seeds.
- ``report``: the JSON report, the plain text, the next step.
- ``estimate``: seconds and memory of a run before it starts.
- ``ranks``: the smoke as one rank of a world, and ``--nproc``.

The entry script, ``tiny_rlhf_smoke.py``, keeps only its parser and ``main``; the tiny sizes all of
them build are the probe kit's (``scripts/probe_kit.py`` at the skill root).

Torch-free at import, like every module of the tree.
"""
