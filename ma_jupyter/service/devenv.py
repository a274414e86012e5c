"""A dev environment: a job of its own that is one node of another job, with a Jupyter kernel as
its command (``POST /jobs/{id}/devenv``; ``ma-jupyter devenv JOB --kernel``; ``%ma_devenv JOB
--kernel``; the job page's "Create dev environment").

Contract:

1. Only the source job's owner (or an admin) may create one (:func:`check_may_create`): it runs
   with the job's secret variables, as a debug terminal does; a viewer clones the job instead.
2. :func:`devenv_spec` derives it from the source job and one of its nodes (default the first
   node that is not a parameter server): the same image, mounts (datasets, annotations, models,
   volumes, outputs folder, with their read-only flags), working copy of the algorithm (a batch
   task's own), env and secret env, spec (the one the job ran with, else its list) and cards,
   workdir, pool, node or driver choice; never others' access (it is ``none``: the kernel holds
   the owner's secrets, so nobody else may see, attach to or stop it) nor the job's priority
   (it is ``normal``: an interactive session takes no urgent slot); that node's platform
   variables as the job's plan gives them (``RANK``, ``WORLD_SIZE``, ``MA_TASK_INDEX``...) in
   ``devenv_of.variables``, which win over the dev environment's own (:func:`ma_jupyter.modes.plan_job`).
   It is a single-node regular job named ``<job name>-devenv``, with no restart policy, no
   lifecycle hooks and no duration; its command is :mod:`ma_jupyter.nodeside.devenv_kernel`.
3. It is then submitted like any job by the same caller: it queues when the cluster is full,
   counts against the caller's quota, and stopping it frees what it holds.  A job with no
   outputs folder of its own (``--output``) has its outputs in the platform's home, where no
   job may mount: its dev environment writes to its own outputs folder then.
"""

from __future__ import annotations

from ..errors import Forbidden, InvalidSpec
from ..models import Access, DevEnvOrigin, Job, JobSpec, JobType, Lifecycle, Mode, Plan, Priority
from ..modes import task_roles
from .users import Caller

#: the dev environment's command (``python`` is the job's interpreter at launch)
KERNEL_COMMAND = "python -m ma_jupyter.nodeside.devenv_kernel"

#: variables of a node's launch that are the view's or the launch's, not the node's place in
#: its job: the dev environment has its own (its image and view are the same; its identity and
#: cards are its own)
_OWN_VARIABLES = frozenset(
    {
        "PATH",
        "HOME",
        "SHELL",
        "LANG",
        "LC_ALL",
        "PYTHONUNBUFFERED",
        "PYTHONPATH",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "TORCH_EXTENSIONS_DIR",
        "MA_WORKSPACE",
        "MA_RANK_LOG_DIR",
        "HOSTNAME",
        "MA_JOB_ID",
        "MA_JOB_NAME",
        "MA_NODE_RUN",
        "MA_JOB_SECRET",
    }
)

_SUFFIX = "-devenv"


def devenv_name(name: str) -> str:
    """``<job name>-devenv``, the job name shortened to fit the name rule's 63 characters."""
    return name[: 63 - len(_SUFFIX)] + _SUFFIX


def check_may_create(job: Job, caller: Caller) -> None:
    """Rule 1.

    Raises:
        Forbidden: the caller is not the job's owner nor an admin; the message says what to do.
    """
    if caller.admin or (job.spec.creator is not None and job.spec.creator == caller.name):
        return  # a job with no creator (from before users existed) is no one's to copy secrets from
    raise Forbidden(
        f"job {job.id} belongs to {job.spec.creator or 'no user (it predates users)'}: a dev "
        "environment runs with the job's secret "
        "variables, so only its owner (or an admin) may create one; clone the job instead "
        "(`ma-jupyter devenv JOB` without --kernel writes a notebook that submits it as your own job)"
    )


def node_names(spec: JobSpec) -> list[str]:
    """The job's nodes in launch order."""
    return [f"{role}-{index}" for role, index in task_roles(spec)]


def pick_node(spec: JobSpec, node: str | int | None) -> str:
    """The source node: a name (``worker-1``), an index of the first node's role (``1``:
    ``worker-1``), or None for the first node that is not a parameter server.

    Raises:
        InvalidSpec: no such node; the message lists the job's nodes.
    """
    names = node_names(spec)
    first = next((n for n in names if not n.startswith("ps-")), names[0])
    if node is None or node == "":
        return first
    text = str(node).strip()
    wanted = f"{first.rsplit('-', 1)[0]}-{text}" if text.isdigit() else text
    if wanted not in names:
        raise InvalidSpec(f"job has no node {text!r}: its nodes are {', '.join(names)}", field="node")
    return wanted


def node_variables(plan: Plan, spec: JobSpec, node: str) -> dict[str, str]:
    """The platform's variables of ``node`` in the job's plan: its launch's environment but the
    job's own variables, the image's, the view's and the launch's (see ``_OWN_VARIABLES``)."""
    launch = next((n for n in plan.nodes if n.name == node), None)
    if launch is None:
        raise InvalidSpec(f"the job's plan has no node {node!r}", field="node")
    skip = set(_OWN_VARIABLES) | set(spec.env) | set(spec.secret_env)
    if launch.image is not None:
        skip |= set(launch.image.env)
    return {
        key: value
        for key, value in launch.env.items()
        if key not in skip and not key.endswith("_VISIBLE_DEVICES") and not key.startswith("MA_CARD")
    }


def devenv_spec(
    job: Job,
    node: str,
    variables: dict[str, str],
    secrets: dict[str, str],
    storage_credentials: dict[str, str] | None = None,
) -> JobSpec:
    """Rule 2: the dev environment of ``job``'s ``node``, with the job's real ``secrets``.

    Raises:
        InvalidSpec: ``job`` is itself a dev environment.
    """
    source = job.spec
    if source.devenv_of is not None:
        raise InvalidSpec(
            f"job {job.id} is itself a dev environment (of job {source.devenv_of.job_id}): "
            f"create one from job {source.devenv_of.job_id}",
            field="devenv_of",
        )
    algorithm = source.algorithm
    if source.type is JobType.batch:
        index = int(node.rsplit("-", 1)[1])
        algorithm = source.tasks[index].algorithm or algorithm
    specs = [job.chosen_spec] if job.chosen_spec in source.specs else list(source.specs)
    data = source.model_dump(exclude={"creator"})
    data.update(
        name=devenv_name(source.name),
        type=JobType.regular,
        mode=Mode.single,
        nodes=1,
        ps=0,
        chief=False,
        tasks=[],
        algorithm=algorithm,
        specs=specs,
        command=KERNEL_COMMAND,
        fault_restart=None,
        checkpoint_resume=None,
        duration=None,
        lifecycle=Lifecycle(),
        secret_env=dict(secrets),
        storage_credentials=dict(storage_credentials or {}),  # its s3:// data, downloaded again
        access=Access.none,
        priority=Priority.normal,
        devenv_of=DevEnvOrigin(job_id=job.id, node=node, variables=variables),
    )
    return JobSpec.model_validate(data)
