"""The data users hold, in: one reader for every command that takes preference pairs, ratings or
prompts (``train-reward``'s [data], ``train``'s [prompts] file, ``evaluate``'s and [eval]'s
held-out prompts).

- ``tables``: a file or folder as rows, each with its place (``line 3``, ``row 3``): JSONL, JSON,
  CSV (the standard library), Parquet (pyarrow) and a ``datasets`` ``save_to_disk`` folder
  (``datasets.load_from_disk``; the two are the ``[hf]`` extra), plain text (one prompt per line);
  encodings checked (a UTF-8 byte-order mark is read, another encoding is named and refused).
- ``layouts``: rows as pairs, ratings or prompts: the field's preference layouts (TRL's dataset
  formats: standard or conversational, explicit or implicit prompt), told apart from the rows,
  conversations rendered with a template; ``read_pairs``, ``read_ratings``, ``read_prompts``.
- ``sizes``: lengths in tokens against a limit, and the memory a batch of sequences needs
  against what the machine has, before a tensor is made.

Torch-free at import; every bad input is one line, ``SkillError`` exit 2, naming the file, the
row and the fix. Used by ``reward_modeling`` and ``policy_optimization`` alike.
"""
