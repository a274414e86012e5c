"""TensorFlow mode: ``TF_CONFIG`` per task in the seed's shape; the command runs as written.

Architectures (seed 002, chosen by the parameter-server count):

* **PS-worker** (``ps > 0``): ``{"cluster": {"ps": [...], "worker": [...]}, "task": {"type":
  "ps"|"worker", "index": i}, "environment": "cloud"}`` on every task.  Parameter servers run
  on the small ``cpu.ps`` spec (1 core, 1 GB; the scheduler's choice).
* **AllReduce** (``ps == 0``): ``{"cluster": {"worker": [...]}, "task": {"type": "worker",
  "index": i}, "environment": "cloud"}``.
* ``chief``: a ``chief`` list with one task is added to the cluster; with parameter servers
  this is TF2's ``ParameterServerStrategy`` coordinator.

Addresses are ``<task address>:<task first port>``.  ``index`` is a JSON number: the seed's
template shows a quoted placeholder, but TensorFlow's cluster resolver compares task ids as
integers.

Which tasks the job's status follows (``primary``), per TensorFlow's semantics:

* parameter servers only serve (``server.join()``) and never exit: never primary;
* with a chief and parameter servers (``ParameterServerStrategy``) the workers serve too, and
  only the chief runs the training program: the chief alone is primary;
* otherwise (PS-worker without chief, AllReduce with or without chief) every worker and the
  chief run the training program to its end: they are primary.

The supervisor stops the non-primary tasks once every primary one has finished.

A task pinned to a single core gets ``TF_NUM_INTEROP_THREADS=2`` (unless the job sets it):
TensorFlow sizes its inter-op pool from the CPU affinity, and with one thread the
``ParameterServerStrategy`` coordinator and its workers deadlock (remote functions wait for ops
queued behind them).

With the ModelArts convention (seed 001/004, TensorFlow-GPU) the layout is the seed's
(:func:`~.base.ps_beside_workers`): on more than one node one ps beside each worker, splitting
the node's cores and memory (the worker keeps the cards), ports in 5000-10000
(:data:`~.base.MODELARTS_TF_PORTS`); each task of such a job also gets ``VC_TASK_INDEX``,
``TF_PS_HOSTS`` and ``TF_WORKER_HOSTS`` (comma-separated ``host:port``) and the boot file gets
``--task_index --ps_hosts --worker_hosts --job_name`` appended (the seed writes them before the
boot file, where python itself would take them; they belong to the script).  A single-node job
runs its command as written, with nothing appended.
"""

from __future__ import annotations

import json

from ..models import Convention, JobSpec
from .base import NodePlan, Placement, TaskSlot


def endpoint(task: TaskSlot) -> str:
    """``address:port`` of one task, as TF_CONFIG lists it."""
    return f"{task.address}:{task.port}"


def cluster_spec(placement: Placement) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG: role -> endpoints by index (empty roles left out)."""
    cluster: dict[str, list[str]] = {}
    for role in ("chief", "ps", "worker"):
        tasks = placement.role(role)
        if tasks:
            cluster[role] = [endpoint(t) for t in tasks]
    return cluster


def tf_config(placement: Placement, task: TaskSlot) -> dict:
    """The TF_CONFIG of one task (as a dict; the env holds its JSON text)."""
    return {
        "cluster": cluster_spec(placement),
        "task": {"type": task.role, "index": task.index},
        "environment": "cloud",
    }


def is_primary(placement: Placement, task: TaskSlot) -> bool:
    """Whether the job's status follows this task (see the module docstring)."""
    if task.role == "ps":
        return False
    if placement.role("chief") and placement.role("ps"):
        return task.role == "chief"
    return True


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-task plans of a TensorFlow job, in the placement's order (ps, chief, workers)."""
    ps_hosts = ",".join(endpoint(t) for t in placement.role("ps"))
    worker_hosts = ",".join(endpoint(t) for t in placement.workers)
    plans = []
    for task in placement.tasks:
        env = {"TF_CONFIG": json.dumps(tf_config(placement, task))}
        if len(task.cpus) == 1 and "TF_NUM_INTEROP_THREADS" not in spec.env:
            env["TF_NUM_INTEROP_THREADS"] = "2"
        command = list(argv)
        notes = []
        # seed 001: a single-node job is `python <boot file> <args>` only
        if spec.convention is Convention.modelarts and len(placement.tasks) > 1:
            env.update(
                {"VC_TASK_INDEX": str(task.index), "TF_PS_HOSTS": ps_hosts, "TF_WORKER_HOSTS": worker_hosts}
            )
            command += [
                "--task_index",
                str(task.index),
                "--ps_hosts",
                ps_hosts,
                "--worker_hosts",
                worker_hosts,
                "--job_name",
                task.role,
            ]
            notes.append("ModelArts convention: --task_index --ps_hosts --worker_hosts --job_name appended")
        primary = is_primary(placement, task)
        if not primary:
            notes.append("serves until the primary tasks finish, then is stopped")
        plans.append(NodePlan(task=task, argv=command, env=env, primary=primary, notes=notes))
    return plans
