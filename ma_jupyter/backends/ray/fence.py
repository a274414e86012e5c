"""The ports a job node on a Ray node may not connect to (see :func:`ma_jupyter.nodehost.fence.fence`).

A Ray cluster accepts any client that reaches its ports (most run without Ray's own token
authentication), and its tasks run with the account of its raylets, outside every sandbox: a job
that reaches the GCS can run code as that account.  Job nodes on Ray share their machine's
network (their peers on other machines must reach them, on ports gloo, NCCL or TensorFlow pick
as they go), so each node is fenced instead of isolated: the deny list is

1. every port the cluster's node table names for any node (raylet, object manager, metrics,
   agents...: each ``*Port`` field of ``ray.nodes()``), the GCS's, and Ray's fixed defaults
   (dashboard 8265, client server 10001, dashboard agent 52365) -- :func:`cluster_ports`, on
   the service's side;
2. the ports and worker port range of each raylet on this machine (read from their command
   lines; Ray's default 10002-19999 where one cannot be read, or where a raylet picks workers'
   ports at random, ``--min-worker-port 0`` as ``ray.cluster_utils`` does unless told a range:
   then a worker started after the node listens where the fence does not know; a cluster must
   pin its worker ports, ``ray start --min-worker-port/--max-worker-port``) and every port something other than this attempt's own
   nodes listens on on this machine when the node starts (the service, other jobs, any daemon)
   -- :func:`node_deny_list`, on the node's agent;
3. minus the attempt's own reserved ports (its nodes' rendezvous ports may be listening already)
   from the ports of rule 2 only: a port of rule 1 stays denied even where it is one of the
   job's own numbers, since the rule holds on every address and a cluster port of another
   machine with that number must stay out of reach (the job's peer on such a port is refused
   too: a rendezvous must not be planned on a cluster port).

The rule is by port, on every address: a peer of the job on another machine that happens to
listen on a port of the list cannot be reached either (its rendezvous ports are reserved apart
from the list; a launcher's kernel-chosen ports come from the ephemeral range, where Ray's own
ports rarely are).
"""

from __future__ import annotations

import os
from typing import Any

from ...nodehost import procfs
from ...nodehost.fence import as_ranges, listening_ports
from ..base import Attempt

#: Ray's fixed default ports: dashboard, client server, dashboard agent's HTTP server
RAY_DEFAULT_PORTS = (8265, 10001, 52365)
#: Ray's default worker port range (``--min-worker-port``/``--max-worker-port``)
RAY_WORKER_PORTS = (10002, 19999)
#: raylet flags naming a port or the ends of the worker port range
RAYLET_PORT_FLAGS = (
    "--node_manager_port",
    "--object_manager_port",
    "--metrics_agent_port",
    "--metrics-agent-port",
    "--metrics_export_port",
    "--runtime_env_agent_port",
    "--dashboard_agent_listen_port",
    "--gcs-address",
    "--gcs_address",
)


def cluster_ports(ray: Any) -> list[int]:
    """Rule 1: the ports of the whole cluster, from the driver's view (``ray`` is the module)."""
    ports: set[int] = set(RAY_DEFAULT_PORTS)
    for record in ray.nodes():
        for key, value in record.items():
            if key.endswith("Port") and isinstance(value, int) and 0 < value < 65536:
                ports.add(value)
    try:
        gcs = ray.get_runtime_context().gcs_address
        ports.add(int(str(gcs).rsplit(":", 1)[1]))
    except (AttributeError, IndexError, ValueError):
        pass
    return sorted(ports)


def raylet_ports() -> tuple[set[int], list[tuple[int, int]]]:
    """The ports the raylets on this machine were started with and their worker port ranges,
    read from their command lines: this process's parent (a Ray worker's is its raylet) and every
    other process named ``raylet`` (a machine may run several, as ``ray.cluster_utils`` does, and
    a later worker of any of them listens in its range); Ray's default range where a raylet picks
    its workers' ports at random or none can be read."""
    pids = {os.getppid()}
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and procfs.command_name(int(entry.name)) == "raylet":
                pids.add(int(entry.name))  # ("?" for one that ended meanwhile)
    except OSError:
        pass
    ports: set[int] = set()
    ranges: list[tuple[int, int]] = []
    for pid in sorted(pids):
        args = procfs.command_line(pid)
        if args is None:
            continue
        low, high = RAY_WORKER_PORTS
        for arg in args:
            flag, _, value = arg.partition("=")
            value = value.rsplit(":", 1)[-1]
            if not value.isdigit():
                continue
            if flag in ("--min_worker_port", "--min-worker-port") and int(value):
                low = int(value)
            elif flag in ("--max_worker_port", "--max-worker-port") and int(value):
                high = int(value)
            elif flag in RAYLET_PORT_FLAGS:
                ports.add(int(value))
        ranges.append((low, high))
    return ports, ranges or [RAY_WORKER_PORTS]


def node_deny_list(cluster: list[int], attempt: Attempt) -> list[list[int]]:
    """Rules 1-3 for a node of ``attempt`` starting on this machine, as ``[low, high]`` ranges:
    ``(this machine's ports - the attempt's own) | the cluster's ports``."""
    own_ports = {p for plan in attempt.plans for p in plan.task.ports if p}
    raylet, ranges = raylet_ports()
    local = raylet.union(*(range(low, high + 1) for low, high in ranges))
    local |= listening_ports(except_marker=f"{attempt.job_id}/{attempt.number}/")
    return as_ranges((local - own_ports) | set(cluster))
