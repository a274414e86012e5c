"""Where a Ray job node's files are, and whether this machine sees them (items 4-5 of
:mod:`.backend`).

1. **on the nodes** -- an attempt's job folder on the Ray nodes is ``node_root/<job id>``
   (:meth:`NodeFiles.on_nodes`; a dry run's placeholder folder stays as it is);
2. **placed** -- which Ray node holds a job node's files is kept in the service's job folder
   (``nodes/<node>/placed.json``: the inventory name, the Ray node id, the job folder there and
   the attempt), so a restarted service still reads the logs of jobs that ended
   (:meth:`NodeFiles.record`, :meth:`NodeFiles.where`);
3. **shared** -- a job folder is read here only where this machine sees that very launch's
   files at the same path (shared storage, or the Ray node is this machine): its ``marker``
   file names the launch (:meth:`NodeFiles.shared`); else a read whose Ray node is gone raises
   :class:`NodeLost` (:meth:`NodeFiles.lost`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ... import config
from ...errors import MaJupyterError, NodeLost, RefusedFile
from ...jobdir import PLACEHOLDER, JobDir, check_node_name
from ...models import NodeRun
from ...untrusted import read_small
from ..base import Attempt


class NodeFiles:
    """The rules of the module docstring.

    Args:
        node_root: the folder of job folders on every Ray node.
    """

    def __init__(self, node_root: Path):
        self.node_root = node_root
        self._placed: dict[tuple[str, str], dict] = {}  # (job id, node) -> placed.json

    def on_nodes(self, attempt: Attempt) -> Attempt:
        """Rule 1: the attempt with its job folder on the Ray nodes (``node_root/<job id>``)."""
        if Path(attempt.job_dir) == PLACEHOLDER.root:
            return attempt
        return replace(attempt, job_dir=self.node_root / attempt.job_id)

    def record(self, attempt: Attempt, run: NodeRun, node_id: str) -> None:
        """Rule 2: note in the service's job folder which Ray node (``node_id``) holds a node's files."""
        placed = {
            "host": run.host,
            "node_id": node_id,
            "job_dir": str(self.on_nodes(attempt).job_dir),
            "attempt": attempt.number,  # names the launch whose files a shared copy must hold
        }
        path = attempt.jobdir.node(run.name).placed
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(placed))
        self._placed[(attempt.job_id, run.name)] = placed

    def where(self, job_id: str, node: str) -> dict | None:
        """Rule 2: ``placed.json`` of a job node (None: never launched on this backend)."""
        placed = self._placed.get((job_id, node))
        if placed is not None:
            return placed
        jd = config.jobdir(job_id)
        try:
            placed_file = jd.node(check_node_name(node)).placed.relative_to(jd.root)
            raw = read_small(jd.root, placed_file, limit=4096)
            placed = json.loads(raw)
        except (OSError, ValueError, RefusedFile):
            return None
        self._placed[(job_id, node)] = placed
        return placed

    def shared(self, job_id: str, node: str, placed: dict) -> JobDir | None:
        """Rule 3: the job folder of ``placed`` as this machine sees it, when the files of that
        very launch of ``node`` are readable here at the same path (shared storage, or the Ray
        node ran on this machine); None otherwise.

        Its ``marker`` file names the launch (``<job>/<attempt>/<node>/<nonce>``): a folder of
        the same path on this machine that an earlier attempt (or nothing) wrote is not it.
        """
        attempt = placed.get("attempt")
        if not isinstance(attempt, int) or not placed.get("job_dir"):
            return None  # recorded before launches named their attempt
        jd = JobDir(Path(placed["job_dir"]))
        try:
            relative = jd.node(check_node_name(node)).marker.relative_to(jd.root)
            marker = read_small(jd.root, str(relative), limit=512).decode("utf-8", "replace")
        except (OSError, ValueError, RefusedFile, MaJupyterError):
            return None
        return jd if marker.startswith(f"{job_id}/{attempt}/{node}/") else None

    @staticmethod
    def lost(node: str, placed: dict) -> NodeLost:
        """Rule 3: the error of a read of ``node``'s files whose Ray node is gone and whose
        files are not readable here."""
        return NodeLost(
            f"the logs of {node} are unavailable: the Ray node {placed.get('host')} that ran it left "
            f"the cluster, and its job folder ({placed.get('job_dir')}) is not on storage this "
            "service can read (put node_root on shared storage to keep them)"
        )
