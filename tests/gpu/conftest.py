"""Tests on a machine with NVIDIA cards: every test of this folder is skipped unless
``nvidia-smi`` lists a card (and, where a test trains, torch sees CUDA).

They use the machine's own cards (the ``real_cards`` marker: the rest of the suite runs as if the
machine had none).  ``tests/gpu/run_on_gpu.sh`` installs what they need on a bare GPU machine and
runs them with ``bench/gpu.py``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

from ma_jupyter import accelerators
from tests.fixtures.notebooks import ma_papermill  # noqa: F401 (a fixture of this folder)


def machine_cards() -> list[accelerators.Card]:
    """The cards ``nvidia-smi`` lists (asked directly, not through the platform); [] without."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, accelerators.NVIDIA_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return accelerators.parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


CARDS = machine_cards()


def torch_cuda() -> bool:
    """Whether torch with CUDA is importable here (the jobs run this interpreter)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        item.add_marker(pytest.mark.real_cards)
        if not CARDS:
            item.add_marker(pytest.mark.skip(reason="no NVIDIA card on this machine (nvidia-smi lists none)"))
