"""What the service decides of a Ray attempt's overlay (docs/network.md): each node's address,
each machine's segment, and the remote shell MPI gets over it.

Pure: the backend asks Ray and the agents, then hands the answers to these functions.

1. **addresses** (:func:`task_addresses`): task k of the attempt (launch order) is at
   ``10.253.0.<k+1>`` (:func:`~ma_jupyter.nodehost.overlay.overlay_address`), whatever Ray
   node holds it: every node is a machine of its own, two nodes of one Ray node included;
2. **segments** (:func:`segments`): per Ray node of the attempt, its address (the underlay),
   the first port its agent reserved for the attempt's first node there, a VXLAN id drawn for
   this attempt, and the addresses of the attempt's nodes there; each machine gets its own and
   every other one's;
3. **remote shell** (:func:`remote_shell`): on an overlay every node has an address of its own
   that only the job's nodes reach, so MPI gets what the local backend gives on its job
   network: OpenSSH's sshd in each node (``SSHD_PORT`` at the node's own address) where every
   agent of the attempt runs its nodes in bubblewrap and has ``/usr/sbin/sshd``, and the
   nodes do not run as root; else the platform's agent over TCP at the node's address (the
   local backend's too: :data:`.remote_shells.AGENT_ON_JOB_NETWORK`).  Fenced attempts get none (the nodes
   share their machines' networks, where a node's sshd would be reachable by anything there):
   the MPI modes refuse them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from ...modes.base import RemoteShell, TaskSlot
from ...nodehost import overlay as job_overlay
from ...nodehost import remote_shells
from ...nodehost.overlay import Overlay, Segment


def task_addresses(count: int) -> list[str]:
    """Rule 1: the overlay address of each of ``count`` tasks, in launch order.

    Raises:
        ValueError: more tasks than the overlay holds.
    """
    return [job_overlay.overlay_address(k) for k in range(count)]


def segments(tasks: list[TaskSlot], underlay: Callable[[str], str]) -> dict[str, Overlay] | None:
    """Rule 2: each Ray node's part of the attempt's overlay, by inventory name; None where the
    tasks were not bound to overlay addresses (the attempt is fenced).

    ``underlay(host)`` is the Ray node's own address; a machine whose own address lies in the
    overlay's range never gets one (the backend fences such a cluster), so the choice reads back
    unambiguously from the addresses."""
    by_host: dict[str, list[TaskSlot]] = {}
    for task in tasks:
        by_host.setdefault(task.host, []).append(task)
    if not all(
        job_overlay.is_overlay_address(task.address) and not job_overlay.is_overlay_address(underlay(host))
        for host, here in by_host.items()
        for task in here
    ):
        return None
    vnis: list[int] = []
    while len(vnis) < len(by_host):
        vni = 1 + secrets.randbelow((1 << 24) - 1)
        if vni not in vnis:
            vnis.append(vni)
    own = {
        host: Segment(underlay(host), here[0].ports[0], vni, tuple(t.address for t in here))
        for (host, here), vni in zip(by_host.items(), vnis, strict=True)
    }
    return {
        host: Overlay(segment, tuple(peer for other, peer in own.items() if other != host))
        for host, segment in own.items()
    }


def remote_shell(infos: list[dict], runs_as_root: bool) -> RemoteShell:
    """Rule 3 for an attempt on an overlay: ``infos`` are the agents' ``info()`` answers of its
    Ray nodes, ``runs_as_root`` whether its nodes run as root (an admin's ``allow_root``)."""
    sshd = all(info.get("isolation") == "bubblewrap" and info.get("sshd") for info in infos)
    if sshd and infos and not runs_as_root:
        return remote_shells.SSH_ON_JOB_NETWORK
    return remote_shells.AGENT_ON_JOB_NETWORK
