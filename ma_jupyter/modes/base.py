"""The contract every distributed mode implements.

A mode is a pure function ``plan(job, placement) -> list[NodePlan]``: from the job's spec and
where the scheduler put its tasks (hostnames, addresses, ports, slots, cores, cards) to what
each node runs (argv before ``${VAR}`` expansion, env, files to write inside the node's view).
No mode starts a process, opens a socket or reads the clock: the same plan is shown by
``--dry-run`` and launched by every backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models import JobSpec, Spec


@dataclass(frozen=True)
class TaskSlot:
    """Where one task (node) of a job runs, as decided by the scheduler.

    Attributes:
        role: ``worker`` for every mode; TensorFlow adds ``ps`` and ``chief``.
        index: index within the role (VC_TASK_INDEX / TF task index).
        hostname: the name the node sees as its own and that its peers resolve.
        address: the address peers reach it on (a loopback address for simulated nodes).
        ports: ports the service reserved for this task (the first is the main one).
        slots: processes per node: the spec's card count, or 1 for a CPU spec.
        host: the inventory node it is placed on.
        cpus: cores it may use (CPU affinity); empty = no pinning.
        devices: card indices (CUDA_VISIBLE_DEVICES / ASCEND_VISIBLE_DEVICES) when the spec has cards.
    """

    role: str
    index: int
    hostname: str
    address: str
    ports: tuple[int, ...]
    slots: int = 1
    host: str = ""
    cpus: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def port(self) -> int:
        return self.ports[0]


@dataclass(frozen=True)
class Placement:
    """All tasks of one attempt of a job, in launch order, and the spec they run with."""

    job_id: str
    spec: Spec
    tasks: tuple[TaskSlot, ...]

    def role(self, role: str) -> list[TaskSlot]:
        """The tasks of one role, by index."""
        return sorted((t for t in self.tasks if t.role == role), key=lambda t: t.index)

    @property
    def workers(self) -> list[TaskSlot]:
        return self.role("worker")


@dataclass
class NodePlan:
    """What one node runs.

    Attributes:
        task: the slot it runs in.
        argv: the command; ``${VAR}`` is expanded from ``env`` by the backend at launch.
        env: variables the mode sets (the backend adds the job's own env under them).
        files: path inside the node's view -> content, written before launch (hostfiles,
            rank tables); paths under ``/job``, ``/etc/mpi`` or ``/user/config``.
        primary: whether the job's status follows this node.  Parameter servers are not
            primary: they are stopped once the primary nodes finish.
        rank_logs: where the launcher can split output per rank, the argv already asks it to
            write ``rank-<r>.log`` files into ``$MA_RANK_LOG_DIR``.
        notes: human-readable remarks shown by ``--dry-run`` (e.g. "command wrapped in torchrun").
        algorithm: a batch task's own algorithm folder (default: the job's).
        outputs_subdir: a batch task's subfolder of the outputs folder (``<name>-<N>``).
    """

    task: TaskSlot
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    primary: bool = True
    rank_logs: bool = False
    notes: list[str] = field(default_factory=list)
    algorithm: str | None = None
    outputs_subdir: str | None = None

    @property
    def name(self) -> str:
        return self.task.name


def task_roles(spec: JobSpec) -> list[tuple[str, int]]:
    """The (role, index) of every task a job needs, in launch order.

    TensorFlow with parameter servers starts its ps tasks first, then the chief (if asked),
    then the workers; every other mode has ``nodes`` workers.  A batch job runs each of its
    tasks as one node ``task-<N>``, side by side.
    """
    if spec.type.value == "batch":
        return [("task", i) for i in range(len(spec.tasks))]
    roles: list[tuple[str, int]] = []
    if spec.mode.value == "tensorflow":
        roles += [("ps", i) for i in range(spec.ps)]
        if spec.chief:
            roles.append(("chief", 0))
    roles += [("worker", i) for i in range(spec.nodes)]
    return roles
