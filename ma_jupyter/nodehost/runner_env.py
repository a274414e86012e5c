"""The environment a node runner starts in (the fork server's, or a runner's of its own)."""

from __future__ import annotations

import os
from pathlib import Path

import ma_jupyter

from .. import config
from .procfs import NODE_MARKER


def runner_env() -> dict[str, str]:
    """The environment of the node runners (the fork server's, or a runner's of its own): this
    process's, with the package importable and the runner's bytecode cache; each runner adds
    its node's marker (``MA_NODE_RUN``), as every process of the node carries it.
    """
    env = dict(os.environ)
    # the runner must import this package even when the service runs from a source tree
    package_root = str(Path(ma_jupyter.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.pop(NODE_MARKER, None)
    env["PYTHONUNBUFFERED"] = "1"
    # The runner is the platform's own helper: it keeps its compiled modules in the service
    # home (never next to the sources), also where the environment turns bytecode files off
    # (container images often do); compiling them again at each node start costs ~40 ms.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(config.bytecode_cache())
    return env
