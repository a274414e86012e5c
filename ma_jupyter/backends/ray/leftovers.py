"""What job nodes of a dead Ray node left on its machine, found and ended by the next agent there.

A job node's runner ends its node when the raylet hosting it ends
(:mod:`ma_jupyter.nodehost.noderun` rule 8).  A runner that could not (frozen, stopped
with SIGSTOP, started before it watched its raylet) would keep the node's processes running
after its Ray node is gone, and no service or agent would ever stop them: a job that is not
running there any more must have nothing left there.  So an agent, when it starts and before it
takes work, calls :func:`end_leftovers`:

1. a node runner is a process whose environment carries a node marker (``MA_NODE_RUN``) and
   whose working directory is the folder of that node, ``<node_root>/<job>/nodes/<node>`` (its
   ``node-run.json`` holds the runner's instructions, its ``marker`` file the same marker).
   Every process of a job inherits the marker, and a job chooses its working directory: so
   only folders below the agent's ``node_root`` are considered, and both files are read by the
   untrusted-file rules (:func:`ma_jupyter.untrusted.read_small`: no symbolic link followed,
   a FIFO or device refused, never opened to block the agent);
2. a runner is left over when its instructions name a host process (``end_with``) that is no
   longer running (:func:`ma_jupyter.nodehost.hostwatch.alive`, checked before the
   marker is read): the nodes of live Ray nodes on the same machine, and runners of the local
   backend (no ``end_with``), are never touched;
3. every process carrying a left-over runner's marker is killed (SIGKILL: its job is over), and
   the node's failure report says what was ended (unless the runner wrote its own); the agent
   reports each node ended (:meth:`~.agent.NodeAgent.info`), which the service makes an event
   of the job.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import psutil

from ...errors import RefusedFile
from ...jobdir import JobDir, NodeDir
from ...nodehost import hostwatch
from ...nodehost.instructions import RunnerInstructions
from ...nodehost.procfs import NODE_MARKER
from ...untrusted import read_small

log = logging.getLogger("ma_jupyter.ray")

#: bytes of a runner's instructions read (they are a few kB)
SPEC_LIMIT = 1 << 20


def _marker(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get(NODE_MARKER)
    except (psutil.Error, OSError):
        return None


def _left_over(proc: psutil.Process, marker: str, roots: set[Path]) -> NodeDir | None:
    """The node folder of ``proc`` when it is a runner whose host process is gone (rules 1-2);
    ``roots``: the agent's ``node_root`` (as given and resolved)."""
    try:
        folder = Path(proc.cwd())  # the kernel's name for it: nothing is opened
    except (psutil.Error, OSError):
        return None
    if (
        len(folder.parents) < 3
        or folder.parents[2] not in roots
        or folder.parent != JobDir(folder.parents[1]).nodes
    ):
        return None  # a job's own working directory elsewhere: none of the agent's business
    root = folder.parents[2]
    node_dir = NodeDir(folder)
    relative = folder.relative_to(root)
    try:
        spec = read_small(root, relative / node_dir.runner_spec.name, owner="a job node", limit=SPEC_LIMIT)
        end_with = RunnerInstructions.from_json(spec, unversioned=True).end_with
        if not isinstance(end_with, dict) or hostwatch.alive(end_with):
            return None
        written = read_small(root, relative / node_dir.marker.name, owner="a job node")
    except (OSError, ValueError, AttributeError, RefusedFile):
        return None
    if written.decode(errors="replace").strip() != marker:
        return None
    return node_dir


def end_leftovers(node_root: str | os.PathLike) -> list[dict]:
    """Kill what runners of ended host processes left on this machine below ``node_root``
    (rules 1-3); one entry per node ended: ``{"marker", "node_dir", "pids"}``."""
    roots = {Path(node_root), Path(node_root).resolve()}
    groups: dict[str, list[psutil.Process]] = {}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        marker = _marker(proc)
        if marker:
            groups.setdefault(marker, []).append(proc)
    ended = []
    for marker, procs in groups.items():
        node_dir = next((d for d in (_left_over(p, marker, roots) for p in procs) if d is not None), None)
        if node_dir is None:
            continue
        names = []
        for proc in procs:
            try:
                names.append(f"{proc.name()} ({proc.pid})")
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                continue
        psutil.wait_procs(procs, timeout=5)
        parts = marker.split("/")
        node = parts[2] if len(parts) >= 4 else marker
        what = (
            f"the processes {node} left running after its Ray node ended were ended by the next "
            f"agent on that machine: {', '.join(names[:8])}" + (", ..." if len(names) > 8 else "")
        )
        log.warning("%s (%s)", what, node_dir.root)
        if not node_dir.failure.exists():
            _write_report(node_dir.failure, {"reason": what})
        ended.append({"marker": marker, "node_dir": str(node_dir.root), "pids": [p.pid for p in procs]})
    return ended


def _write_report(path: Path, data: dict) -> None:
    """Write a small JSON report atomically (a link left at its place is replaced, never followed)."""
    tmp = path.with_name(path.name + ".agent.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        log.warning("cannot write %s", path, exc_info=True)
