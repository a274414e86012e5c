"""Code that runs inside a node imports nothing beyond the standard library.

A node runs these modules under the job's own interpreter (``python -m ...``), whose image may
be a bare venv without pydantic or anything else the package needs. ``python -S`` leaves
site-packages out, so an import of a third-party package (even through a parent package's
``__init__``) fails here as it would in such a node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NODE_SIDE = [
    "ma_jupyter.nodeside.rank_log",
    "ma_jupyter.nodeside.ascend_launch",
    "ma_jupyter.nodeside.rank_table",
    "ma_jupyter.nodeside.argv",
    "ma_jupyter.nodeside.torch_run",
    "ma_jupyter.nodeside.ssh_node",
    "ma_jupyter.nodeside.jax_cluster",
    "ma_jupyter.nodehost.rsh_agent",
    "ma_jupyter.nodehost.shell_agent",
    "ma_jupyter.nodehost.agent_wire",
]


@pytest.mark.parametrize("module", NODE_SIDE)
def test_node_side_modules_import_without_site_packages(module):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT)
    code = f"import sys, {module}; bad = sorted({{'pydantic', 'requests', 'ma_jupyter.models'}} & set(sys.modules)); sys.exit(str(bad) if bad else 0)"
    result = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr or result.stdout


def test_without_site_packages_pydantic_is_really_missing():
    """The check above means something: under ``-S`` the package's own models cannot load."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import ma_jupyter.models"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "pydantic" in result.stderr
