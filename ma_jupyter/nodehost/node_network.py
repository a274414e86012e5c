"""An attempt's nodes on this machine's job network: their addresses, what each runner's
instructions say of its namespace, and the wait for every runner to enter it (the namespaces
themselves: :mod:`.network`, :mod:`.overlay`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import BackendUnavailable
from ..models import NodeRun
from . import network as network_ns

#: seconds an attempt's runners may take to enter its network namespace
NAMESPACE_JOIN_WAIT = 60.0


def task_address(index: int) -> str:
    """The address of an attempt's task ``index`` (launch order) on this backend: its own on the
    attempt's job network (:func:`.network.node_address`), or, where this service may not make
    namespaces and the nodes share the host's network, the loopback address ``127.0.1.<k+1>``."""
    if network_ns.namespaces_supported():
        return network_ns.node_address(index)
    return f"127.0.1.{index + 1}"


def network_spec(made: network_ns.JobNetwork, node: str) -> dict:
    """What node ``node``'s runner spec says of its network: its namespace's file, and (on a
    job network) its switch's, which the runner holds open."""
    spec = {"netns": str(made.nodes[node][0])}
    if made.switch is not None:
        spec["switch"] = str(made.switch)
    return spec


def await_joined(runs: list[NodeRun], inodes: dict[str, int], alive: Callable[[NodeRun], bool]) -> None:
    """Return once every runner of ``runs`` is in its namespace (``inodes``, by node name: the
    first thing a runner does) or has ended (one that could not enter ends at once, saying
    why).

    Raises:
        BackendUnavailable: a runner neither entered nor ended in :data:`NAMESPACE_JOIN_WAIT`.
    """
    deadline = time.monotonic() + NAMESPACE_JOIN_WAIT
    waiting = [run for run in runs if run.pid is not None]
    while True:
        waiting = [r for r in waiting if network_ns.namespace_of(r.pid) != inodes[r.name] and alive(r)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            names = ", ".join(r.name for r in waiting)
            raise BackendUnavailable(f"the runners of {names} did not enter the job's network namespace")
        time.sleep(0.005)
