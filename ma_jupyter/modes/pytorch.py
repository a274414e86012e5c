"""PyTorch mode: the platform's variables on every node and the distributed launcher around ``python``.

Every node gets (seed 002) ``MASTER_ADDR`` and ``MASTER_PORT`` (worker-0's address and first
reserved port), ``WORLD_SIZE`` (the number of nodes), ``RANK`` (this node's index) and
``SLOTS`` (cards per node, 1 for a CPU spec); the launcher then sets the per-process values.
It also gets what launchers read by themselves: ``NODE_RANK`` and ``GROUP_RANK`` (the node's
index: Lightning, accelerate) and torchrun's ``PET_*`` defaults (nodes, processes per node,
node rank, master address and port, static rendezvous), so a bare ``torchrun train.py`` joins
the job (:func:`ma_jupyter.modes.common.distributed_env`; ``docs/variables.md`` has the table).

The command:

* starts with the word ``python`` or ``python3`` (seed 002's literal rule,
  :func:`starts_with_python`; ``/usr/bin/python3`` or ``python3.11`` is a command that does not)
  and is not ``python -m`` one of :data:`LAUNCHER_MODULES`:
  wrapped in torch's launcher with ``--nnodes=N --nproc_per_node=SLOTS --node_rank=RANK
  --master_addr=... --master_port=... --rdzv_backend=static``, started through
  :mod:`ma_jupyter.nodeside.torch_run` (``python -m torch.distributed.run`` whose nodes other
  than 0 join once node 0's store listens, so no node waits out the store client's backoff,
  and that ends as soon as it succeeded).
  The static rendezvous keys nodes by rank, not by (hostname, pid), so simulated nodes with
  private pid namespaces never wait on each other forever.  Each rank runs the user's command verbatim
  (interpreter flags included) through :mod:`ma_jupyter.nodeside.rank_log`, which writes
  ``$MA_RANK_LOG_DIR/rank-<global rank>.log`` and a ``[rank r]``-prefixed copy into the node log.
  torchrun exits non-zero as soon as any rank fails (it stops the other ranks), so the node's
  exit code reports the failure.
* is already a launcher (``torchrun``, ``python -m`` one of :data:`LAUNCHER_MODULES`) or does not
  start with ``python``/``python3`` (an interpreter named by its path or its version is the
  user's deliberate choice, as in the seed): runs untouched on every node; ``${VAR}`` in it is expanded from the node's
  env at launch, so the seed's ``torchrun --nnodes ${WORLD_SIZE} --nproc_per_node ${SLOTS}
  --node_rank ${RANK} --master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} train.py`` runs
  as written.  A launcher told to make a one-node job of its own (``--standalone``,
  ``--nnodes 1``, ``--nnodes=1:1``) on a job of several nodes is refused
  (:func:`single_node_option`): each node would start a job of its own and wait for the others
  forever, since the platform's ``PET_NNODES`` counts them all.

With the ModelArts convention (seed 004, PyTorch-GPU) the platform starts no launcher: the boot
file runs once per node and gets ``--init_method tcp://<master>:<port>``, plus ``--rank <node
index> --world_size <nodes>`` when there is more than one node; the script spawns its processes.
"""

from __future__ import annotations

from ..errors import InvalidSpec
from ..models import Convention, JobSpec
from .base import NodePlan, Placement, TaskSlot
from .common import distributed_env, master, program, python_module, with_rank_log

#: torch's launcher, joining node 0's store only once it listens (see its docstring)
TORCH_RUN_MODULE = "ma_jupyter.nodeside.torch_run"
LAUNCHER_MODULES = ("torch.distributed.launch", "torch.distributed.run", TORCH_RUN_MODULE)
LAUNCHER_PROGRAMS = ("torchrun",)
#: torch launcher options that take no value; every other option takes the next word unless
#: written ``--option=value``, and the first other word is the training script
LAUNCHER_FLAGS = frozenset(
    {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
    | {"--virtual-local-rank", "--virtual_local_rank"}
)
#: the words seed 002 wraps: "a command not starting with python or python3 is left alone"
SEED_PYTHONS = ("python", "python3")


def starts_with_python(argv: list[str]) -> bool:
    """Whether the command's first word is ``python`` or ``python3`` (seed 002's rule, literally:
    no path, no version suffix)."""
    return bool(argv) and argv[0] in SEED_PYTHONS


def is_launcher(argv: list[str]) -> bool:
    """Whether the command already starts the distributed launcher itself."""
    return program(argv) in LAUNCHER_PROGRAMS or python_module(argv) in LAUNCHER_MODULES


def launcher_options(argv: list[str]) -> list[tuple[str, str | None]]:
    """The launcher's own options of a launcher command (:func:`is_launcher`), before its training
    script, as ``(option, value)`` (None for a flag); empty for any other command."""
    if program(argv) in LAUNCHER_PROGRAMS:
        rest = argv[1:]
    elif python_module(argv) in LAUNCHER_MODULES:
        module = python_module(argv)
        at = next(i for i, word in enumerate(argv) if word == module or word == f"-m{module}")
        rest = argv[at + 1 :]
    else:
        return []
    found: list[tuple[str, str | None]] = []
    words = iter(rest)
    for word in words:
        if not word.startswith("-") or word == "--":
            break  # the training script (or the end of the launcher's options)
        name, equals, value = word.partition("=")
        if equals:
            found.append((name, value))
        elif word in LAUNCHER_FLAGS:
            found.append((word, None))
        else:
            found.append((word, next(words, None)))
    return found


def single_node_option(argv: list[str]) -> str | None:
    """The option of a launcher command that makes a one-node job of its own (``--standalone``,
    ``--nnodes 1``, ``--nnodes 1:1``), as written; None when it has none."""
    for name, value in launcher_options(argv):
        if name == "--standalone":
            return name
        if name == "--nnodes" and value is not None and value.split(":")[-1].strip() == "1":
            return f"{name} {value}"
    return None


def check_multi_node(placement: Placement, argv: list[str]) -> None:
    """Refuse a launcher command that would make each node of a multi-node job a job of its own.

    Raises:
        InvalidSpec: on ``command``, naming the option and both fixes.
    """
    nodes = len(placement.workers)
    option = single_node_option(argv) if nodes > 1 else None
    if option is None:
        return
    raise InvalidSpec(
        f"the command starts torch's launcher with {option} on a job of {nodes} nodes: each node "
        f"would start a one-node job of its own and wait for the others forever (the platform sets "
        f"PET_NNODES={nodes} on every node). Drop {option.split()[0]}: the platform gives every "
        "node the rendezvous (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT), so a "
        "bare torchrun joins the job; or submit it with --nodes 1",
        field="command",
    )


def launcher_argv(placement: Placement, task: TaskSlot, argv: list[str]) -> list[str]:
    """torch's launcher (static rendezvous, :data:`TORCH_RUN_MODULE`) running ``argv`` once per slot."""
    head = master(placement)
    return [
        "python",
        "-m",
        TORCH_RUN_MODULE,
        f"--nnodes={len(placement.workers)}",
        f"--nproc_per_node={task.slots}",
        f"--node_rank={task.index}",
        f"--master_addr={head.address}",
        f"--master_port={head.port}",
        "--rdzv_backend=static",
        "--max_restarts=0",
        # the splitter is run as a module by the launcher's own interpreter (-u -m ...)
        "-m",
        *with_rank_log(argv, rank_var="RANK")[2:],
    ]


def modelarts_argv(placement: Placement, task: TaskSlot, argv: list[str]) -> list[str]:
    """The boot command with ModelArts' PyTorch-GPU arguments appended."""
    head = master(placement)
    extra = ["--init_method", f"tcp://{head.address}:{head.port}"]
    if len(placement.workers) > 1:
        extra += ["--rank", str(task.index), "--world_size", str(len(placement.workers))]
    return [*argv, *extra]


def plan_node(spec: JobSpec, placement: Placement, task: TaskSlot, argv: list[str]) -> NodePlan:
    """One worker's plan: the platform's env and the (possibly wrapped) command."""
    env = distributed_env(placement, task)
    check_multi_node(placement, argv)
    if spec.convention is Convention.modelarts:
        return NodePlan(
            task=task,
            argv=modelarts_argv(placement, task, argv),
            env=env,
            notes=["ModelArts convention: --init_method (and --rank/--world_size) appended"],
        )
    if starts_with_python(argv) and not is_launcher(argv):
        return NodePlan(
            task=task,
            argv=launcher_argv(placement, task, argv),
            env=env,
            rank_logs=True,
            notes=[
                f"command wrapped in torch.distributed.run ({task.slots} process(es) on this node), "
                f"started by {TORCH_RUN_MODULE}: nodes other than 0 join once node 0's store listens"
            ],
        )
    why = "already a distributed launcher" if is_launcher(argv) else "does not start with python or python3"
    return NodePlan(task=task, argv=list(argv), env=env, notes=[f"command runs as written ({why})"])


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-node plans of a PyTorch job (see the module docstring for the rules)."""
    return [plan_node(spec, placement, task, argv) for task in placement.workers]
