"""Stand-ins for a machine's accelerator stack, for tests on machines without cards.

* ``nvml/pynvml.py``: a fake NVML module (put ``nvml/`` first on ``PYTHONPATH``);
* ``bin/nvidia-smi``: a fake ``nvidia-smi`` (put ``bin/`` first on ``PATH``);
* ``fake_dev.py``: runs a command in a private mount namespace whose ``/dev`` is a copy of the
  host's plus fake card nodes (``/dev/null``'s numbers), so a sandbox can bind them.

Both card fakes read the cards from the JSON file named by ``MA_FAKE_GPUS`` at each call (so a
test can make a card fail while a job runs)::

    {"count": 2, "model": "...", "memory_mb": 81559, "driver": "580.159.04",
     "failed": [1], "util": 37, "used_mb": 1234}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
NVML_DIR = HERE / "nvml"
BIN_DIR = HERE / "bin"
FAKE_DEV = HERE / "fake_dev.py"
STATE_ENV = "MA_FAKE_GPUS"
MODEL = "NVIDIA H100 80GB HBM3"
DRIVER = "580.159.04"


def write_state(path: Path, count: int, **extra) -> Path:
    """Write the fake cards' state file and return it."""
    state = {"count": count, "model": MODEL, "memory_mb": 81559, "driver": DRIVER, **extra}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
    return path
