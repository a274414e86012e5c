"""The network check of a Ray node (contract rule 28 in ``backends/base.py``): whether its
machine can give an attempt its part of the overlay, and reach its peers over it.

1. **on the node** (:class:`OverlayCheck`, the agent's): every probe makes two parts of one
   overlay on the machine, as two machines of an attempt would, their VXLAN devices on two
   ports the agent reserves and on the Ray node's own address, and crosses from one part's
   node to the other's (:func:`ma_jupyter.nodehost.overlay.probe`): the frames travel UDP
   through the machine's own network as a peer machine's would.  The rules of
   :mod:`ma_jupyter.nodehost.netcheck` around it: an answer at once, the next probe on a thread
   once it is 10 s old, a fault said after 2 failed in a row.  A machine whose jobs are fenced
   (its agent cannot make overlays: jobs share its network) has nothing to check: None;
2. **in the service** (:class:`AgentAnswers`): the node inspection's look at a node
   (``RayBackend.network_fault``, :meth:`.networks.Networks.fault`) answers the agent's last
   answer, never waiting for a call: each look sends the next call when none is out.  An agent that does not answer (gone,
   restarting) leaves the last answer standing: a node that is gone is found by its runners'
   ends, not by this check.

Not probed: the path between two machines of the cluster (a firewall between two Ray nodes),
which only an attempt on both would cross; each machine's own end of it is.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...nodehost import network, overlay
from ...nodehost.netcheck import NetworkCheck

if TYPE_CHECKING:
    from ...nodehost.ports import PortPool


class OverlayCheck:
    """Rule 1 on the agent of one Ray node.

    Args:
        ports: the agent's port pool (it hands out the probe's UDP ports, never a task's).
        folder: where the probes' namespaces wait (swept before each probe).
        problem: why this node cannot make overlays (None: it can).
    """

    def __init__(self, ports: PortPool, folder: Path, problem: str | None):
        self._ports = ports
        self._folder = folder
        self._problem = problem
        self._underlay = ""
        self.check = NetworkCheck(self._probe)

    def fault(self, underlay: str) -> str | None:
        """Why this machine's overlay fails (``underlay``: the Ray node's address), else None."""
        if self._problem is not None:
            return None
        self._underlay = underlay
        return self.check.answer()

    def _probe(self) -> str | None:
        ports = self._ports.reserve_ports(2)
        try:
            network.private_folder(self._folder)
            network.sweep(self._folder)  # what a killed agent's probe left
            return overlay.probe(self._folder, f"probe-{os.getpid()}", self._underlay, (ports[0], ports[1]))
        except OSError as exc:
            return f"the job's overlay cannot be made: {exc}"
        finally:
            self._ports.release_ports(ports)


class AgentAnswers:
    """Rule 2 in the service: per inventory node, the agent's last answer and the call out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[str, str | None] = {}
        self._out: dict[str, concurrent.futures.Future] = {}

    def fault(self, host: str, ask: Callable[[], concurrent.futures.Future]) -> str | None:
        """The last answer of ``host``'s agent (None before one came); ``ask()`` sends the next
        call (its future) when none is out."""
        with self._lock:
            out = self._out.get(host)
            if out is not None and out.done():
                del self._out[host]
                if not out.cancelled() and out.exception() is None:
                    self._answers[host] = out.result()
                out = None
            if out is None:
                try:
                    self._out[host] = ask()
                except Exception:  # the node left or its agent cannot be reached now: next look
                    pass
            return self._answers.get(host)
