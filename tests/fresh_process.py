"""Run a snippet in a fresh interpreter and ask what it imported (lazy-import tests)."""

from __future__ import annotations

import subprocess
import sys


def imports(code: str, module: str) -> bool:
    """Whether ``module`` is in ``sys.modules`` after ``code`` ran in a new Python process
    (which must exit cleanly; its stderr is shown if not)."""
    script = f"{code}\nimport sys\nprint({module!r} in sys.modules)"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    return {"True": True, "False": False}[run.stdout.strip().splitlines()[-1]]
