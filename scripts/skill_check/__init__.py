"""What ``palm-rlhf-skill check`` (``scripts/check_skill.py``) compares, one module per check.

- ``markdown``: the tree's markdown files, fenced blocks, headings, anchors and sections.
- ``api``: the API record (``scripts/api_record.json``) against ``inspect.signature`` of the
  installed library.
- ``generated``: the signature blocks rendered from the record into the markdown.
- ``paths``: relative links, their anchors, and file paths named in the markdown; the doc
  sections (``<page>.md#<anchor>``) named in the tree's Python.
- ``skills``: every SKILL.md validated with ``skills-ref``.
- ``budget``: the context budget (``BUDGET``), and Claude Code's own projection.
- ``arguments``: every argument of the record has a behaviour entry in the reference that owns it.
- ``citations``: cited library lines (``file.py:N-M``) checked by content, and every reference
  section citing the lines behind its claim.
- ``derived``: numbers and names in prose that follow from a library default, computed from the
  installed library; a default typed into prose that no record symbol has; library versions named
  in prose against the record's tested version.
- ``install_state``: a check run from a source checkout whose installed copy is stale.
- ``report``: every check run in order, the report and its plain text.

Each check returns drift as ``{"file", "symbol", "documented", "installed"}`` dicts, printed as
``file: symbol: documented X, installed Y``. ``file`` is ``path#anchor`` where a drift belongs to
a section. Nothing here imports torch at module level.
"""
from __future__ import annotations

import skill_runtime

ROOT = skill_runtime.SKILL_ROOT
RECORD_FILE = "scripts/api_record.json"
