"""Node health: which inventory nodes take no new placements, and why.

A node leaves placement in one of two ways:

1. **drained**: an admin ran ``ma-jupyter nodes drain NODE`` (``POST /nodes/{name}/drain``);
2. **faulty**: the service's periodic inspection found a runner on it that stopped beating
   (its heartbeat, :meth:`ma_jupyter.backends.base.Backend.heartbeat`, older than ``[limits]
   heartbeat_timeout``), or a real card a running job holds there that failed (its device
   node gone, or NVML reporting it lost: :meth:`ma_jupyter.backends.base.Backend.card_fault`).

Either mark stays until an admin runs ``ma-jupyter nodes undrain NODE``: a node that froze once
is not trusted again by itself.  The marks are kept in ``$MA_JUPYTER_HOME/node_health.json``
(written whole and renamed into place), so a restarted service keeps them.  What a mark means
for the jobs running there is :func:`.policies.on_unhealthy`'s decision; the scheduler only
reads :attr:`NodeHealth.statuses` (no new placement on a marked node).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..models import Node

log = logging.getLogger("ma_jupyter.health")


@dataclass(frozen=True)
class Mark:
    """Why a node takes no new placements: ``status`` drained or faulty, the sentence why."""

    status: str
    reason: str


class NodeHealth:
    """The drained and faulty marks of the inventory's nodes, persisted in ``path``.

    :attr:`statuses` (node name -> ``drained``/``faulty``) is one dict object for the life of
    the instance, changed in place: the scheduler holds it as its ``unusable`` mapping.
    """

    def __init__(self, path: Path):
        self.path = path
        self.marks: dict[str, Mark] = {}
        self.statuses: dict[str, str] = {}
        self._lock = threading.Lock()
        try:
            data = json.loads(path.read_text())
            for name, mark in data.items():
                self.marks[name] = Mark(str(mark["status"]), str(mark["reason"]))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring the unreadable node health file %s", path)
        self.statuses.update({name: mark.status for name, mark in self.marks.items()})

    def mark(self, node: str, status: str, reason: str) -> bool:
        """Mark ``node`` drained or faulty; False when it already was (a drain is not turned
        into a fault, nor the other way: the first reason stays)."""
        with self._lock:
            if node in self.marks:
                return False
            self.marks[node] = Mark(status, reason)
            self.statuses[node] = status
            self._save()
            return True

    def clear(self, node: str) -> Mark | None:
        """Put ``node`` back into placement; the mark it had (None: it had none)."""
        with self._lock:
            mark = self.marks.pop(node, None)
            self.statuses.pop(node, None)
            if mark is not None:
                self._save()
            return mark

    def snapshot(self) -> dict[str, Mark]:
        """The marks now (a copy: a drain or undrain may come while the caller reads it)."""
        with self._lock:
            return dict(self.marks)

    def annotate(self, views: list[Node]) -> list[Node]:
        """The node views with the reason of each mark in ``health``."""
        marks = self.snapshot()
        return [
            v.model_copy(update={"health": marks[v.name].reason}) if v.name in marks else v for v in views
        ]

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps({name: asdict(mark) for name, mark in self.marks.items()}))
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except OSError:  # a full disk: the mark holds in memory; said in the service log
            log.exception("could not record the node health marks in %s", self.path)
