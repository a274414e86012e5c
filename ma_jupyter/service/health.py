"""Node health: which inventory nodes take no new placements, and why.

A node leaves placement in one of two ways:

1. **drained**: an admin ran ``ma-jupyter nodes drain NODE`` (``POST /nodes/{name}/drain``);
2. **faulty**: the service's periodic inspection found a runner on it that stopped beating
   (its heartbeat, :meth:`ma_jupyter.backends.base.Backend.heartbeat`, older than ``[limits]
   heartbeat_timeout``), or one of its checks failed: the free space of its job folders' disk
   (under ``[limits] node_disk_free_mb``), or one of its real cards (its device node gone, or
   NVML reporting it lost: :meth:`ma_jupyter.backends.base.Backend.card_fault`).

Each mark records its :attr:`Mark.source`.  A mark of a node check (``check``: a card; ``disk``:
the job folders' disk) is cleared by the inspection itself once the node passes its checks
again (space freed, the card back).  A ``disk`` mark only makes the node unschedulable (seed
002, data preparation: a node whose disk use passes the threshold takes no new work): the jobs
running there keep running (:attr:`Mark.only_new_work`; the job whose writing filled the disk
is ended by the disk checks of its own, not through the node), and any other mark replaces it.  A
drain (``admin``) and a heartbeat fault (``heartbeat``) stay until an admin runs ``ma-jupyter
nodes undrain NODE``: a node that froze once is not trusted again by itself.  The marks are kept in ``$MA_JUPYTER_HOME/node_health.json``
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
    """Why a node takes no new placements: ``status`` drained or faulty, the sentence why, and
    what set it (``source``: ``admin``, ``heartbeat`` or ``check``; "" in a file written before
    sources were recorded, kept like a drain)."""

    status: str
    reason: str
    source: str = ""

    @property
    def only_new_work(self) -> bool:
        """Whether the mark only holds new work off the node (its disk): running jobs stay."""
        return self.source == "disk"


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
                self.marks[name] = Mark(str(mark["status"]), str(mark["reason"]), str(mark.get("source", "")))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring the unreadable node health file %s", path)
        self.statuses.update({name: mark.status for name, mark in self.marks.items()})

    def mark(self, node: str, status: str, reason: str, source: str = "admin") -> bool:
        """Mark ``node`` drained or faulty; False when it already was (a drain is not turned
        into a fault, nor the other way: the first reason stays), but for an admin's drain of
        a node a check marked: the drain replaces it, so the node stays out once it passes;
        and a ``disk`` mark, which every other mark replaces (a fault found on a node out of
        placement for its disk still moves its running jobs)."""
        with self._lock:
            held = self.marks.get(node)
            replaces = (
                (source == "admin" and held.source in ("check", "disk"))
                or (held.source == "disk" and source != "disk")
                if held is not None
                else True
            )
            if not replaces:
                return False
            self.marks[node] = Mark(status, reason, source)
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

    def clear_checked(self, node: str) -> Mark | None:
        """Clear ``node``'s mark if a node check set it (it passes again); the mark cleared, or
        None (no mark, or one an admin or a heartbeat set: those stay)."""
        with self._lock:
            mark = self.marks.get(node)
            if mark is None or mark.source not in ("check", "disk"):
                return None
            del self.marks[node]
            self.statuses.pop(node, None)
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
