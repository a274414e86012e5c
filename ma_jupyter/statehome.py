"""The state folder, ``$MA_JUPYTER_HOME`` (default ``~/.ma_jupyter``), and the two files in it a
client reads before anything else: the running service's runtime file and the service's log.

The standard library only: a command line finds its service without importing what the
service's configuration needs (``dataclasses``, the card probes).  :mod:`ma_jupyter.config`
owns the rest of the folder's layout and re-exports these names, so ``config.home()`` and
``statehome.home()`` are one function.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "MA_JUPYTER_HOME"
#: the folder a job's relative host paths (and the admin's project rules) start from
ENV_PROJECT_DIR = "MA_JUPYTER_PROJECT_DIR"


#: ``$MA_JUPYTER_HOME`` (or None) -> the folder it names, resolved once: every log read asks
_resolved_homes: dict[str | None, Path] = {}


def home() -> Path:
    """The state folder, created on first use (mode 0700: it holds the token, every job's spec
    and env, and every job's files)."""
    raw = os.environ.get(ENV_HOME) or None
    path = _resolved_homes.get(raw)
    if path is None:
        path = Path(raw or Path.home() / ".ma_jupyter").expanduser().resolve()
        _resolved_homes[raw] = path
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def runtime_file() -> Path:
    """The 0600 file naming the running service: url, the owner's token, the proxy token, pid."""
    return home() / "service.json"


def service_log() -> Path:
    """The job service's own log."""
    return home() / "service.log"
