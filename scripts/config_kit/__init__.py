"""A run's config, for every kind of run (the policy runs of ``palm-rlhf-skill plan`` and ``train``,
the reward-model runs of ``train-reward``): each kind brings its own tables (its sections, its
structure check, the keys that name files or programs) and these modules do the rest.

- ``reading``: a TOML or JSON file (or standard input) as a table of tables, ``--set
  SECTION.KEY=VALUE`` overrides, file paths made absolute; ``Form``, one kind of run's config.
- ``library``: a section's keys against the installed constructor's ``inspect.signature``.
- ``programs``: the user's own Python files a config names (``"file.py:callable"``): loaded,
  their signatures checked; a tokenizer's output checked.

Torch-free at import; every bad input is one line, ``SkillError`` exit 2, naming the key or the file.
"""
