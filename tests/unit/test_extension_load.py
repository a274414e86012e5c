"""``%load_ext ma_jupyter`` stays cheap: the magics load the client, pydantic and requests when
a magic first runs, not when the extension is loaded (bench/load_ext.py measures the time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter: this test process has long imported everything.
PROBE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
import ma_jupyter

ma_jupyter.load_ipython_extension(shell)
magics = shell.magics_manager.magics
print(json.dumps({
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in {"pydantic", "requests"}
                     or m.startswith(("ma_jupyter.client", "ma_jupyter.models"))),
    "cell": sorted(m for m in magics["cell"] if m.startswith("ma_")),
    "line": sorted(m for m in magics["line"] if m.startswith("ma_")),
}))
"""


def _probe() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_load_ext_registers_the_magics_without_the_client_pydantic_or_requests():
    found = _probe()
    assert found["loaded"] == [], found["loaded"]
    assert "ma_train" in found["cell"]
    assert {"ma_jobs", "ma_logs", "ma_delete", "ma_stop", "ma_attach"} <= set(found["line"])


def test_a_magic_loads_what_it_needs_on_first_use():
    """The lazy imports are real: the first ``%ma_jobs --help`` works in a fresh process."""
    probe = PROBE.replace(
        "magics = shell.magics_manager.magics",
        "shell.run_line_magic('ma_jobs', '--help')\nmagics = shell.magics_manager.magics",
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert "--favourites" in done.stdout
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "pydantic" in found["loaded"] and "ma_jupyter.models" in found["loaded"]
