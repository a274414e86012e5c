"""Tests on a machine with NVIDIA cards: every test of this folder is skipped unless
``nvidia-smi`` lists a card (and, where a test trains, torch sees CUDA).

They use the machine's own cards (the ``real_cards`` marker: the rest of the suite runs as if the
machine had none).  ``tests/gpu/run_on_gpu.sh`` installs what they need on a bare GPU machine and
runs them with ``bench/gpu.py``.
"""

from __future__ import annotations

import pytest

from tests.fixtures.gpu_cards import CARDS
from tests.fixtures.notebooks import ma_papermill  # noqa: F401 (a fixture of this folder)


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        item.add_marker(pytest.mark.real_cards)
        if not CARDS:
            item.add_marker(pytest.mark.skip(reason="no NVIDIA card on this machine (nvidia-smi lists none)"))
