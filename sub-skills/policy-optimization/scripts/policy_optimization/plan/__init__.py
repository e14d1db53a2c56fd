"""The plan of a run before it starts (``palm-rlhf-skill plan``): count, probe, predict, advise.

- ``counting``: rollouts, learn() calls and optimizer steps of a run; parameters and bytes.
- ``probe``: the bounded probe of a run at its real size.
- ``unit_costs``: the probe's unit figures: seconds of the sampling steps, bytes per stored field.
- ``prediction``: memory, wall time, warnings and the verdict from counts and measurements.
- ``budget``: inverse planning (``--budget``, ``--memory-budget``): the largest run that fits.
- ``advice``: what the plan advises beyond the settings' warnings.
- ``planner``: ``plan`` (count, probe, predict) and ``execute`` (the run for real).
- ``report``: the plan's plain report.
- ``accuracy``: predictions against real runs (``bench --plan-accuracy``).

The entry script, ``plan_run.py``, keeps only its parser and ``main``; what the plan shares with
``train`` (``run_config``, ``builder``, ``measuring``) stays at the package's top.

Torch-free at import, like every module of the tree.
"""
