"""What this machine's kernel lets the nodes' sandbox use, each probed once per process.

1. :func:`bwrap_works`: whether bubblewrap can make namespaces here (else the nodes run in the
   symlink mode, :func:`.view.default_sandbox`);
2. :func:`user_namespace_works`: whether a node can run in a user namespace of its own
   (:mod:`.userns`), checked by the runner's own code in a process of its own: forked by the
   node runners' fork server the service starts for its nodes anyway (:mod:`.forkserver` rule
   6), or, where that server cannot be started or reached, a new interpreter (``python -m
   ma_jupyter.nodehost.noderun --check-user-namespace ARGV...``);
3. a probe that does not answer in time (a loaded machine: a process start can take seconds)
   decides nothing: the answer is the stronger isolation, not kept, and the next call probes
   again.  A node whose sandbox then cannot be made fails with the reason; a job never runs
   with less isolation because the machine was busy when the service looked.

The node's cgroup has its own room (:mod:`.node_cgroups`), its network namespaces theirs
(:mod:`.network`, :mod:`.node_network`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from . import userns
from .bwrap import namespaces_probe_argv, user_namespace_probe_argv
from .runner_env import runner_env
from .view import SYSTEM_PATH

if TYPE_CHECKING:
    from .forkserver import RunnerForkServer

#: seconds the user namespace check may take (a process start, a namespace, a sandbox's start)
USERNS_CHECK_TIMEOUT = 30.0

log = logging.getLogger("ma_jupyter.nodehost")

_BWRAP_OK: bool | None = None
_USERNS_OK: bool | None = None


def user_namespace_works(forks: RunnerForkServer | None = None) -> bool:
    """Whether nodes can run in user namespaces of their own here (noderun rule 1b), checked once
    per process by the runner's own code in a process of its own (it forks): forked by ``forks``
    where given and it can, else a new interpreter (rule 2)."""
    global _USERNS_OK
    if _USERNS_OK is None:
        bwrap = shutil.which("bwrap", path=SYSTEM_PATH)
        if os.geteuid() != 0 or not bwrap:
            _USERNS_OK = False
        else:
            try:
                _USERNS_OK = _check_user_namespace(bwrap, forks) == 0
            except TimeoutError:
                return True  # rule 3: a loaded machine is no reason to isolate less
    return _USERNS_OK


def _check_user_namespace(bwrap: str, forks: RunnerForkServer | None) -> int:
    """The check's exit code (0: it works); TimeoutError where it did not answer in time."""
    probe = user_namespace_probe_argv(bwrap)
    if forks is not None:
        try:
            return forks.check_user_namespace(probe, USERNS_CHECK_TIMEOUT)
        except TimeoutError:
            raise
        except OSError:
            pass  # no server to fork it (it says why at the first node): a process of its own
    argv = [sys.executable, "-m", "ma_jupyter.nodehost.noderun", userns.CHECK_USER_NAMESPACE, *probe]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=USERNS_CHECK_TIMEOUT, env=runner_env())
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(
            f"the user namespace check gave no answer in {USERNS_CHECK_TIMEOUT:.0f} s"
        ) from exc
    except OSError:
        return 1
    return done.returncode


def bwrap_works() -> bool:
    """Whether bubblewrap can make namespaces here (once per process)."""
    global _BWRAP_OK
    if _BWRAP_OK is None:
        try:
            result = subprocess.run(namespaces_probe_argv(), capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            return True  # rule 3: a loaded machine is no reason to drop the sandbox
        except OSError as exc:
            result, why = None, str(exc)
        else:
            why = result.stderr.decode(errors="replace").strip()[:300] or f"exit code {result.returncode}"
        _BWRAP_OK = result is not None and result.returncode == 0
        if not _BWRAP_OK:  # the nodes run without a sandbox from now on: say why, once
            log.warning("bubblewrap cannot make namespaces here (%s): nodes run in the symlink mode", why)
    return _BWRAP_OK
