"""The architecture's import rules hold (issue 11; DEVELOPERS.md "pure core, thin adapters").

The contracts live in pyproject.toml ([tool.importlinter]) and are checked by import-linter, the
same check `make lint` runs:
- the domain packages import no adapter, no infrastructure library and no clock;
- each infrastructure library (confluent-kafka, faust, rocksdict, fastavro) is imported by one
  adapter package only;
- no service imports another service's internals (the read side may fold with an aggregate's own
  pure `evolve`, and the API reads the projection's store, as listed there).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert executable is not None, "import-linter is a dev dependency: pip install -e '.[dev]'"
    result = subprocess.run([executable, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
