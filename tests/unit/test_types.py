"""The package type-checks: mypy, configured in pyproject.toml ([tool.mypy]), on ma_jupyter.

Skipped, saying so, where mypy is not installed (``./dev setup`` installs it with the test
extra).  The first run on a machine checks everything (minutes on 2 busy cores); later runs
reuse mypy's cache in ``.mypy_cache/`` and check only what changed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1200)
def test_the_package_type_checks():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed: pip install -e '.[test]' (./dev setup) installs it")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert run.returncode == 0, f"mypy found errors:\n{run.stdout[-8000:]}{run.stderr[-2000:]}"
    assert "Success" in run.stdout
