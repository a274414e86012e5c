"""The README's shell and Python examples, pasted as written into a fresh folder (as root too).

Each ```bash block that runs ``ma-jupyter`` and each ```python block that uses the Client runs
in order in one new folder, with a fresh ``MA_JUPYTER_HOME`` and the project's virtual
environment first on ``PATH`` (as after ``source .venv/bin/activate``).  The notebook examples
run in the notebooks under ``notebooks/`` (tests/examples/test_notebooks.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_examples() -> list[tuple[str, str]]:
    """(language, code) of the README blocks a user pastes into a shell or a Python prompt."""
    found = []
    for language, code in BLOCK.findall((REPO / "README.md").read_text()):
        if language == "bash" and "ma-jupyter " in code:
            found.append((language, code))
        elif language == "python" and "from ma_jupyter import Client" in code:
            found.append((language, code))
    return found


def test_the_readme_has_examples_to_run():
    kinds = [language for language, _ in readme_examples()]
    assert "bash" in kinds and "python" in kinds


def test_every_readme_example_works_as_pasted(tmp_path):
    folder = tmp_path / "fresh"
    folder.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "MA_JUPYTER_HOME": str(tmp_path / "home"),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
    }
    env.pop("PYTHONPATH", None)  # the installed package, as a user has it
    try:
        for language, code in readme_examples():
            argv = (
                ["bash", "-euo", "pipefail", "-c", code]
                if language == "bash"
                else [sys.executable, "-c", code]
            )
            done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{language} example failed:\n{code}\n{done.stdout}\n{done.stderr}"
            if "--name hello" in code:
                assert "hello" in done.stdout.splitlines()
            if "--name ranks" in code:
                # --follow shows the first node; `logs --all` every node, each line labelled
                assert "rank 0 of 2" in done.stdout and "rank 1 of 2" in done.stdout, done.stdout
                assert "deleted ranks" in done.stdout
    finally:
        subprocess.run(
            ["ma-jupyter", "service", "stop"], cwd=folder, env=env, capture_output=True, timeout=60
        )
