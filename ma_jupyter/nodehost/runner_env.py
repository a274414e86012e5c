"""The environment a node runner starts in (the fork server's, or a runner's of its own)."""

from __future__ import annotations

import os
from pathlib import Path

import ma_jupyter

from .procfs import BOOT_TIME_ENV, NODE_MARKER, boot_time


def runner_env() -> dict[str, str]:
    """The environment of the node runners (the fork server's, or a runner's of its own): this
    process's, with the package importable and the runner's bytecode cache; each runner adds
    its node's marker (``MA_NODE_RUN``), as every process of the node carries it, and counts
    start times from this process's boot time (:func:`.procfs.boot_time`, rule 1).
    """
    env = dict(os.environ)
    # the runner must import this package even when the service runs from a source tree
    package_root = str(Path(ma_jupyter.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.pop(NODE_MARKER, None)
    env["PYTHONUNBUFFERED"] = "1"
    # the start times the runners (and the fork server) report and compare are counted as this
    # process counts them, even where the clock was stepped since it read /proc/stat
    env[BOOT_TIME_ENV] = repr(boot_time())
    # Compiled modules are read where they are: the service compiled the package's next to its
    # sources at its start (``service.__main__.keep_compiled``), the installation has the rest.
    # (A cache prefix of the runners' own would mirror the standard library's and every
    # package's too, compiled again for each new home: 1.3 s of CPU at a service's first node.)
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env
