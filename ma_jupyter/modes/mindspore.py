"""MindSpore-Ascend mode: the boot file once per card, with the rank table of seed 000.

Every node runs :mod:`ma_jupyter.nodeside.ascend_launch`, which starts the user's command SLOTS
times (one process per card) with ``ASCEND_DEVICE_ID`` and ``DEVICE_ID`` (the card's logical
index on the node, 0..SLOTS-1), ``RANK_ID`` (its index in the whole job: node index x SLOTS +
card), ``RANK_SIZE`` (cards in the job) and ``RANK_TABLE_FILE=/user/config``, the folder
holding ``jobstart_hccl.json`` in template 2:

* one instance per node, ``server_id`` = the node's address, ``pod_name`` = ``<job>-<hostname>``,
* its devices ``{"device_id": <physical card index>, "device_ip": <emulated address>}``,
* ``status`` ``initializing`` in the plan; each node's launcher flips it to ``completed`` once
  the launchers of all nodes reached each other (over every node's first reserved port).

The launcher writes ``rank-<RANK_ID>.log`` per process and exits with the first failing
process's code.  The command itself is never rewritten: single-node and distributed commands are
the same (seed 000).
"""

from __future__ import annotations

import json

from ..models import JobSpec
from ..nodeside import rank_table
from .base import NodePlan, Placement, TaskSlot
from .common import first_rank, master, ports_env, total_slots

TABLE_DIR = "/user/config"
TABLE_PATH = f"{TABLE_DIR}/{rank_table.FILE_NAME}"
LAUNCHER_MODULE = "ma_jupyter.nodeside.ascend_launch"


def instance(placement: Placement, node_index: int, task: TaskSlot) -> dict:
    """One node's entry in the template-2 instance list."""
    cards = list(task.devices) or list(range(task.slots))
    return {
        "devices": [
            {"device_id": str(card), "device_ip": rank_table.device_ip(node_index, card)}
            for card in cards[: task.slots]
        ],
        "pod_name": f"{placement.job_id}-{task.hostname}",
        "server_id": task.address,
    }


def table(spec: JobSpec, placement: Placement) -> dict:
    """The job's template-2 rank table, status ``initializing``."""
    instances = [instance(placement, i, t) for i, t in enumerate(placement.workers)]
    return rank_table.template2(spec.name, instances)


def dynamic_cluster_env(placement: Placement, task: TaskSlot, size: int) -> dict[str, str]:
    """MindSpore's dynamic cluster variables for a node without cards (a CPU spec).

    ``MS_ROLE=MS_WORKER``, ``MS_SCHED_HOST`` and ``MS_SCHED_PORT`` (worker-0's address and its
    second reserved port: the first is the launchers' own, ``--listen``), ``MS_WORKER_NUM`` (the
    job's processes) and, one process per node, ``MS_NODE_ID`` (the process's rank).  The
    scheduler process is the job's to start, on worker-0 with ``MS_ROLE=MS_SCHED`` (MindSpore's
    dynamic networking runs one scheduler and ``MS_WORKER_NUM`` workers).
    """
    head = master(placement)
    env = {
        "MS_ROLE": "MS_WORKER",
        "MS_SCHED_HOST": head.address,
        "MS_SCHED_PORT": str(head.ports[1] if len(head.ports) > 1 else head.port),
        "MS_WORKER_NUM": str(size),
    }
    if task.slots == 1:
        env["MS_NODE_ID"] = str(first_rank(placement.workers, task))
    return env


def endpoint(task: TaskSlot) -> str:
    return f"{task.address}:{task.port}"


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-node plans of a MindSpore-Ascend job (see the module docstring)."""
    workers = placement.workers
    text = json.dumps(table(spec, placement), indent=2) + "\n"
    size = total_slots(workers)
    plans = []
    for task in workers:
        peers = ",".join(endpoint(t) for t in workers if t != task)
        command = [
            "python",
            "-m",
            LAUNCHER_MODULE,
            f"--slots={task.slots}",
            f"--first-rank={first_rank(workers, task)}",
            f"--rank-size={size}",
            f"--listen={endpoint(task)}",
            f"--peers={peers}",
            "--",
            *argv,
        ]
        plans.append(
            NodePlan(
                task=task,
                argv=command,
                env={
                    "RANK_TABLE_FILE": TABLE_DIR,
                    "RANK_SIZE": str(size),
                    "SLOTS": str(task.slots),
                    **ports_env(placement, task),
                    **({} if task.devices else dynamic_cluster_env(placement, task, size)),
                },
                files={TABLE_PATH: text},
                rank_logs=True,
                notes=[f"boot file runs once per card ({task.slots} process(es))"],
            )
        )
    return plans
