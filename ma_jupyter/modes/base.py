"""The contract every distributed mode implements.

A mode is a pure function ``plan(job, placement) -> list[NodePlan]``: from the job's spec and a
*bound* placement (the scheduler chose the inventory node, slots and cards of each task; the
backend then bound it: hostnames, addresses, ports, cores and the remote shell MPI uses) to what
each node runs (argv before ``${VAR}`` expansion, env, files to write inside the node's view).
No mode starts a process, opens a socket, reads the clock or names a backend's program: the
same plan is shown by ``--dry-run`` and launched by every backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..models import JobSpec, Spec


@dataclass(frozen=True)
class TaskSlot:
    """Where one task (node) of a job runs.

    The scheduler fills ``role``, ``index``, ``slots``, ``host``, ``devices`` and
    ``cpu_request``; the backend's ``bind`` fills ``hostname``, ``address``, ``ports`` and
    ``cpus`` (it alone knows how its nodes are reached).

    Attributes:
        role: ``worker`` for every mode; TensorFlow adds ``ps`` and ``chief``.
        index: index within the role (VC_TASK_INDEX / TF task index).
        hostname: the name the node sees as its own and that its peers resolve.
        address: the address peers reach it on.
        ports: ports reserved for this task (the first is the main one); 0 when not reserved
            (a dry run).
        slots: processes per node: the spec's card count, or 1 for a CPU spec.
        host: the inventory node it is placed on.
        cpus: cores it may use (CPU affinity); empty = no pinning.
        devices: the machine's indices of its cards when the spec has cards (the backend makes
            CUDA_VISIBLE_DEVICES / ASCEND_VISIBLE_DEVICES from them).
        card_type: the cards' type (``gpu``, ``npu``) when they are real cards of the node's
            machine, whose device nodes the backend binds into the node; "" when emulated or none.
        cpu_request: the cores its spec asks for (the backend sizes the pinning from it).
        memory_gb: the memory its spec gives it (the backend enforces it; 0: no limit).
    """

    role: str
    index: int
    hostname: str = ""
    address: str = ""
    ports: tuple[int, ...] = ()
    slots: int = 1
    host: str = ""
    cpus: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    card_type: str = ""
    cpu_request: float = 0.0
    memory_gb: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def port(self) -> int:
        return self.ports[0]


@dataclass(frozen=True)
class RemoteShell:
    """How MPI's launcher on one node starts processes on the others (its ``ssh``), as the
    backend provides it.

    Attributes:
        agent: the command line mpirun runs instead of ssh (``plm_rsh_agent``).
        serve: argv a waiting node runs so the agent can reach it; ``{job}`` and ``{host}`` are
            filled in with the job id and the node's hostname.
        interface: the network interface MPICH's hydra uses (``HYDRA_IFACE``), if any.
        sshd: the nodes run OpenSSH's sshd and the agent is ``ssh`` (:mod:`.ssh`): every node
            gets ``SSHD_PORT`` and its sshd; ``serve`` is not used.
    """

    agent: str
    serve: tuple[str, ...]
    interface: str | None = None
    sshd: bool = False

    def serve_argv(self, job_id: str, host: str) -> list[str]:
        """The argv a waiting node ``host`` of job ``job_id`` runs."""
        return [part.replace("{job}", job_id).replace("{host}", host) for part in self.serve]


@dataclass(frozen=True)
class Placement:
    """All tasks of one attempt of a job, in launch order, and the spec they run with.

    ``remote_shell`` is set by the backend's ``bind`` (None: the backend offers none, and MPI
    modes refuse the job).  ``reservation`` is the backend's name for what its ``bind`` reserved
    for the attempt (the Ray backend: its placement group), stored with the placement so that a
    restarted service finds it again; empty when nothing was reserved.  ``port_range``
    (``[low, high)``) is where the backend's ``bind`` takes the tasks' ports from when the job's
    convention names one (the ModelArts TensorFlow layout: 5000-10000); None: the backend's own.
    ``creator`` is the job's submitting user: whose account the nodes run as decides the backend's
    remote shell (OpenSSH's sshd cannot run as root in a sandbox, see ``LocalBackend.bind``).
    """

    job_id: str
    spec: Spec
    tasks: tuple[TaskSlot, ...]
    remote_shell: RemoteShell | None = None
    reservation: str = ""
    port_range: tuple[int, int] | None = None
    creator: str | None = None

    @property
    def bound(self) -> bool:
        """Whether a backend bound it: every task has an address to be reached on."""
        return all(t.address for t in self.tasks)

    def to_json(self) -> dict:
        """The placement as stored with the job (a restarted service rebuilds use from it)."""
        return {
            "job_id": self.job_id,
            "spec": self.spec.model_dump(),
            "tasks": [asdict(t) for t in self.tasks],
            "remote_shell": asdict(self.remote_shell) if self.remote_shell else None,
            "reservation": self.reservation,
            "port_range": list(self.port_range) if self.port_range else None,
            "creator": self.creator,
        }

    @classmethod
    def from_json(cls, data: dict) -> Placement:
        """The placement :meth:`to_json` stored (also one stored before a field was added)."""
        tasks = tuple(
            TaskSlot(
                **{
                    **t,
                    "ports": tuple(t.get("ports", ())),
                    "cpus": tuple(t.get("cpus", ())),
                    "devices": tuple(t.get("devices", ())),
                }
            )
            for t in data["tasks"]
        )
        shell = data.get("remote_shell")
        return cls(
            job_id=data["job_id"],
            spec=Spec.model_validate(data["spec"]),
            tasks=tasks,
            remote_shell=RemoteShell(**{**shell, "serve": tuple(shell["serve"])}) if shell else None,
            reservation=data.get("reservation", ""),
            port_range=tuple(data["port_range"]) if data.get("port_range") else None,
            creator=data.get("creator"),
        )

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
        env: the node's variables: the job's own env, then the platform's and the mode's,
            which win over the job's (the launch depends on them).
        job_env: the names in ``env`` whose values are the job's own (``--env``), in the
            job's order; the backend expands ``${VAR}`` in them
            (:func:`ma_jupyter.commands.expand_env`), never in the platform's values.
        files: path inside the node's view -> content, written before launch (hostfiles,
            rank tables); paths under ``/job``, ``/etc/mpi`` or ``/user/config``.
        primary: whether the job's status follows this node.  Parameter servers are not
            primary: they are stopped once the primary nodes finish.
        rank_logs: where the launcher can split output per rank, the argv already asks it to
            write ``rank-<r>.log`` files into ``$MA_RANK_LOG_DIR``.
        notes: human-readable remarks shown by ``--dry-run`` (e.g. "command wrapped in torchrun").
        algorithm: a batch task's own algorithm folder (default: the job's).
        outputs_subdir: a batch task's subfolder of the outputs folder (``<name>-<N>``).
        needs_modules: Python modules the image must have for what the platform put around the
            command (``torch`` for torch's launcher); the backend checks them before the launch.
    """

    task: TaskSlot
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    job_env: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    primary: bool = True
    rank_logs: bool = False
    notes: list[str] = field(default_factory=list)
    algorithm: str | None = None
    outputs_subdir: str | None = None
    needs_modules: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.task.name


#: the spec a parameter server runs with (the catalog's spec of this name, else the scheduler's
#: 1 core, 1 GB), whatever spec the job's workers run with: the ps node's ``MA_SPEC``
PS_SPEC_NAME = "cpu.ps"


def task_roles(spec: JobSpec) -> list[tuple[str, int]]:
    """The (role, index) of every task a job needs, in launch order.

    TensorFlow with parameter servers starts its ps tasks first (:func:`ps_count` of them),
    then the chief (if asked), then the workers; every other mode has ``nodes`` workers.  A batch job runs each of its
    tasks as one node ``task-<N>``, side by side.
    """
    if spec.type.value == "batch":
        return [("task", i) for i in range(len(spec.tasks))]
    roles: list[tuple[str, int]] = []
    if spec.mode.value == "tensorflow":
        roles += [("ps", i) for i in range(ps_count(spec))]
        if spec.chief:
            roles.append(("chief", 0))
    roles += [("worker", i) for i in range(spec.nodes)]
    return roles


#: where the ModelArts TensorFlow layout's ports come from (seeds 001/004: a random port in
#: 5000-10000), as ``[low, high)``
MODELARTS_TF_PORTS = (5000, 10001)


def ps_beside_workers(spec: JobSpec) -> bool:
    """Whether a job has the ModelArts TensorFlow layout (seeds 001/004): a TensorFlow job under
    the ModelArts convention.  On more than one node it runs one parameter server beside each
    worker (1:1, on the worker's node), the ps taking half the node's cores and memory and the
    worker the rest and the cards; on one node it runs one worker alone with the whole node."""
    return (
        spec.mode.value == "tensorflow"
        and spec.convention.value == "modelarts"
        and spec.type.value != "batch"
    )


def splits_nodes(spec: JobSpec) -> bool:
    """Whether a job's workers share their nodes with a parameter server each (the ModelArts
    layout on more than one node: :func:`ps_beside_workers` with a ps); a single-node job of
    that layout runs its worker with the whole node."""
    return ps_beside_workers(spec) and ps_count(spec) > 0


def ps_count(spec: JobSpec) -> int:
    """How many parameter servers a TensorFlow job runs: one per worker on more than one node
    in the ModelArts layout (:func:`ps_beside_workers`), none on one; else the job's ``ps``."""
    if ps_beside_workers(spec):
        return spec.nodes if spec.nodes > 1 else 0
    return spec.ps
