"""What this machine's kernel lets the nodes' sandbox use, each probed once per process.

1. :func:`bwrap_works`: whether bubblewrap can make namespaces here (else the nodes run in the
   symlink mode, :func:`.view.default_sandbox`);
2. :func:`user_namespace_works`: whether a node can run in a user namespace of its own
   (:mod:`.userns`), checked by the runner's own code in a process of its own.

The node's cgroup has its own room (:mod:`.node_cgroups`), its network namespaces theirs
(:mod:`.network`, :mod:`.node_network`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from . import userns
from .bwrap import namespaces_probe_argv
from .runner_env import runner_env
from .view import SYSTEM_PATH

_BWRAP_OK: bool | None = None
_USERNS_OK: bool | None = None


def user_namespace_works() -> bool:
    """Whether nodes can run in user namespaces of their own here (noderun rule 1b), checked once
    per process by the runner's own code in a process of its own (it forks)."""
    global _USERNS_OK
    if _USERNS_OK is None:
        if os.geteuid() != 0 or not shutil.which("bwrap", path=SYSTEM_PATH):
            _USERNS_OK = False
        else:
            argv = [sys.executable, "-m", "ma_jupyter.nodehost.noderun", userns.CHECK_USER_NAMESPACE]
            argv.append(shutil.which("bwrap", path=SYSTEM_PATH))
            try:
                done = subprocess.run(argv, capture_output=True, timeout=30, env=runner_env())
                _USERNS_OK = done.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                _USERNS_OK = False
    return _USERNS_OK


def bwrap_works() -> bool:
    """Whether bubblewrap can make namespaces here (once per process)."""
    global _BWRAP_OK
    if _BWRAP_OK is None:
        try:
            result = subprocess.run(
                namespaces_probe_argv(),
                capture_output=True,
                timeout=20,
            )
            _BWRAP_OK = result.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _BWRAP_OK = False
    return _BWRAP_OK
