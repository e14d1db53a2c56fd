"""``python scripts/skill_runtime``: say what it is (one line, exit 2), do nothing else."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the skill root's scripts/

from skill_runtime import reporting  # noqa: E402

sys.stderr.write("skill_runtime: error: a module, not a command: the helpers' shared runtime, imported by "
                 f"them: run one of them, e.g. {reporting.command('tiny-rlhf-smoke', '--help')}\n")  # a copy has no console scripts
sys.exit(2)
