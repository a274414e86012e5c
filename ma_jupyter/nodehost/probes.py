"""What this machine's kernel lets the nodes' sandbox use, each probed once per process.

1. :func:`bwrap_works`: whether bubblewrap can make namespaces here (else the nodes run in the
   symlink mode, :func:`.view.default_sandbox`);
2. :func:`user_namespace_works`: whether a node can run in a user namespace of its own
   (:mod:`.userns`), checked by the runner's own code in a process of its own;
3. a probe that does not answer in time (a loaded machine: a process start can take seconds)
   decides nothing: the answer is the stronger isolation, not kept, and the next call probes
   again.  A node whose sandbox then cannot be made fails with the reason; a job never runs
   with less isolation because the machine was busy when the service looked.

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
            except subprocess.TimeoutExpired:
                return True  # rule 3: a loaded machine is no reason to isolate less
            except OSError:
                done = None
            _USERNS_OK = done is not None and done.returncode == 0
    return _USERNS_OK


def bwrap_works() -> bool:
    """Whether bubblewrap can make namespaces here (once per process)."""
    global _BWRAP_OK
    if _BWRAP_OK is None:
        try:
            result = subprocess.run(namespaces_probe_argv(), capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            return True  # rule 3: a loaded machine is no reason to drop the sandbox
        except OSError:
            result = None
        _BWRAP_OK = result is not None and result.returncode == 0
    return _BWRAP_OK
