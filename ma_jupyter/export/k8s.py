"""The Kubernetes export: a job as the manifests that would run it on a Kubernetes cluster (pure).

:func:`manifests` gives the documents, :func:`to_yaml` the multi-document YAML that ``kubectl
apply -f`` takes.  Nothing needs an API server: the tests validate every document against the
Kubernetes schemas offline (``kubernetes-validate``, strict).

Documents, in apply order:

0. PriorityClass ``ma-jupyter-<priority>`` (cluster-wide, the same for every export, so applying
   it again changes nothing): the job's queue priority as a pod priority (:data:`PRIORITY_VALUES`;
   ``preemptionPolicy: Never``, since this platform never preempts a running job either).
1. ConfigMap ``<base>-files``: the files the mode writes (DeepSpeed's ``/job/hostfile``, MPI
   hostfiles, Ascend rank tables), each mounted read-only at its path (``subPath``).
2. ConfigMap ``<base>-nodeside``: the platform's node-side helpers (standard library only, and
   the torch that ``torch_run`` launches with), when
   a command runs one (``python -m ma_jupyter.nodeside.torch_run`` starts torch's launcher on
   each PyTorch node, ``rank_log`` wraps each rank, ``ascend_launch`` starts MindSpore's), mounted at ``/opt/ma_jupyter`` and put on
   ``PYTHONPATH`` after the job's own: any image with Python runs them, ma_jupyter installed or not.
3. Service ``<base>``: headless (``clusterIP: None``, ``publishNotReadyAddresses``) over every
   pod of the job.  Each pod names it as its ``subdomain``, so pod ``<base>-<role>-<index>`` is
   reachable as ``<base>-<role>-<index>.<base>`` in the namespace before any pod is ready.
4. One ``batch/v1`` Job per role (``worker``, ``ps``, ``chief``; ``task`` for a batch job), in
   launch order: ``completionMode: Indexed`` with one completion per node, so Kubernetes gives
   pod ``i`` the hostname ``<base>-<role>-<i>``.

How the job is planned (the same planners as every backend):

1. **Placement.** Every task's hostname and address are its pod's name in the Service,
   ``<base>-<role>-<index>.<base>``, with the ports :data:`PORTS` (each pod has its own address,
   so every task takes the same ports).  :func:`ma_jupyter.modes.plan_job` plans that placement:
   ``MASTER_ADDR``, ``TF_CONFIG``, hostfiles and rank tables name the pods.
2. **Per-index values.** The pods of one Indexed Job share one template, so a value that differs
   between nodes must come from the pod's own index.  The first variable of every container is
   ``MA_TASK_INDEX`` (the platform's own variable for the node's index) read from the pod's
   ``batch.kubernetes.io/job-completion-index`` annotation, and every value that differs
   between nodes only by their index is written with ``$(MA_TASK_INDEX)`` in its place
   (``RANK``, ``NODE_RANK``, the ``index`` in ``TF_CONFIG``, torchrun's ``--node_rank``);
   kubelet expands it in ``env`` and ``command``.  Chosen over one env set per index picked by
   an entrypoint or an init container because the manifest stays plain Kubernetes: no wrapper
   program in the image, no shell, the container's command is the planner's argv, and
   ``kubectl describe`` shows every variable.  The export checks that rendering the template
   for each index gives exactly the planner's values for that node.
3. **Nodes that differ otherwise** (a batch job's tasks, each with its own command; a
   multi-node MindSpore job, whose nodes list their peers): that role becomes one Job per node,
   ``<base>-<role>-<index>`` with its pod's ``hostname`` set to that name, so every name above
   stays true.
4. **Variables.** In each container, in this order: ``MA_TASK_INDEX``; the platform's and the
   mode's variables; ``MA_WORKSPACE=/workspace``, ``MA_RANK_LOG_DIR=/job/logs`` (an
   ``emptyDir``), ``PYTHONUNBUFFERED=1`` (so ``kubectl logs`` shows each line at once) and
   ``PYTHONPATH`` when the helpers are shipped; then the job's own ``env`` in its order.  A
   ``${VAR}`` in the job's variables or its command becomes kubelet's ``$(VAR)`` when the
   manifest defines ``VAR`` (before it, for a variable), like ``commands.expand_env``; any other
   reference (``$PATH``, which the image sets) is refused, because Kubernetes would leave it
   as written: give the value in full.  Every other ``$`` is doubled, so kubelet keeps it; the
   arguments of ``bash -c`` are left for that shell, as everywhere.
5. **Folders** (:mod:`ma_jupyter.workspace`): each one a volume at its ``/workspace`` target,
   read-only where the spec says.  ``mounts_as="pvc"`` (default): a ``persistentVolumeClaim``
   placeholder per folder (``<base>-algorithm``, ``<base>-outputs``, ``dataset-<source>-<name>
   [-<version>]``, ``model-...``, ``annotation-<name>``, ``volume-<name>``) that the cluster's
   administrator creates; the ``ma-jupyter/claims`` annotation maps each claim to the host
   folder it stands for.  ``mounts_as="hostpath"``: ``hostPath`` volumes of the host folders
   themselves (a one-machine cluster such as kind or minikube).  A batch task writes into its
   ``<name>-<N>`` subfolder of the outputs (``subPath``).
6. **Resources** of the job's spec (the one it ran with, else its first), as requests and
   limits: ``cpu``, ``memory``, and the cards as ``nvidia.com/gpu``, ``huawei.com/Ascend910`` or
   ``cambricon.com/mlu`` (emulated cards are requested too: the cluster has real ones); a
   parameter server takes the catalog's ``cpu.ps``.
7. **Life.** The container's ``command`` is the planned argv; ``restartPolicy: Never``;
   ``backoffLimit`` is ``fault_restart.max_restarts`` (or ``checkpoint_resume.max_resumes``),
   else 0: the first failed pod fails its Job and Kubernetes stops the others;
   ``activeDeadlineSeconds`` is the duration; ``terminationGracePeriodSeconds`` the grace
   period (TERM, then KILL, as on stop); ``lifecycle.on_start`` is an init container,
   ``on_stop`` a ``preStop`` hook (it runs when a pod is stopped, not after the command ends by
   itself: Kubernetes has no hook for that).
8. **Image.** ``image``, else :data:`MODE_IMAGES` for the mode, else :data:`DEFAULT_IMAGE`.
   ``python`` in a command is the image's; the spec's Python environment (``image`` of the
   spec) names folders of this machine and is not exported.
9. **Priority** is the pod's ``priorityClassName`` (document 0): the Kubernetes scheduler
   places pending pods of a higher class first, as this platform's queue starts jobs.
10. **Node choice** is a ``nodeSelector``: ``node_name`` selects ``kubernetes.io/hostname``;
    ``pool`` and ``driver_version`` select the node labels :data:`POOL_LABEL` and
    :data:`DRIVER_LABEL`, which the cluster's administrator puts on the nodes of a pool and on
    nodes by their accelerator driver.
11. **Data preparation** (``data_preparation``): each dataset is copied, before the job's
    command, by an init container ``prepare-<n>`` (``cp -a``, the image's) from its volume into
    an ``emptyDir`` on the pod's node, which the job then sees read-only at the dataset's path,
    as the platform copies datasets to a node before a job starts.  Datasets must be folders
    here (a claim always is; a ``hostPath`` single-file dataset is mounted as it is, unprepared).
12. **Who.** The creator and the others' access (``access``) are the annotations
    ``ma-jupyter/creator`` and ``ma-jupyter/access``: Kubernetes access is the namespace's RBAC,
    which the administrator grants; the annotations say what the platform allowed.

What Kubernetes does not do here: Jobs of different roles are not a gang (a failed worker Job
leaves the parameter servers running, and they serve until deleted: ``kubectl delete -f``, as
the ``ma-jupyter/primary: "false"`` annotation says), the queue is the Kubernetes scheduler's
(priorities, no backfill reservation), others' access is the namespace's RBAC, and the debug
terminal is this platform's and is not exported.  The horovod mode is refused:
mpirun reaches the other nodes through a remote shell, which an Indexed Job does not provide.

Why one module (over 600 lines): it turns one job into one set of documents, numbered above,
that must agree with each other (names, labels, volumes, ports, the Service the pods name); the
planning is the shared planners' (:mod:`ma_jupyter.modes`), only the rendering is here.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..commands import is_shell_wrapper, parse_command, substitute
from ..errors import InvalidSpec
from ..jobdir import RANK_LOG_ENV, RANK_LOG_VIEW
from ..models import JobSpec, Mode, Priority, Spec
from ..modes import NodePlan, Placement, TaskSlot, plan_job, task_roles
from ..workspace import VIEW_ROOT, folders, workdir_for

MEDIA_TYPE = "application/yaml"
#: the ports of every task: each pod has its own address (the first is torch's default port)
PORTS = (29500, 29501)
#: the variable holding the pod's index, read from the annotation the Job controller sets
INDEX_VAR = "MA_TASK_INDEX"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: where the node-side helpers are mounted (the parent of their ``ma_jupyter`` package)
NODESIDE_ROOT = "/opt/ma_jupyter"
DEFAULT_IMAGE = "python:3.12-slim"
MODE_IMAGES = {
    Mode.pytorch: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    Mode.pytorch_deepspeed: "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    Mode.tensorflow: "tensorflow/tensorflow:2.18.0",
}
#: a spec's card type -> the extended resource its device plugin offers
CARD_RESOURCES = {"gpu": "nvidia.com/gpu", "npu": "huawei.com/Ascend910", "mlu": "cambricon.com/mlu"}
MOUNTS_AS = ("pvc", "hostpath")
SERVES_UNTIL_DELETED = (
    "serves until deleted: Kubernetes does not stop it when the other roles finish "
    "(kubectl delete -f the export once they did)"
)
#: the pod priority of each queue priority (PriorityClass ``ma-jupyter-<priority>``)
PRIORITY_VALUES = {Priority.normal: 1000, Priority.urgent: 2000, Priority.very_urgent: 3000}
#: node labels the administrator sets: the node's dedicated pool, its accelerator driver version
POOL_LABEL = "ma-jupyter/pool"
DRIVER_LABEL = "ma-jupyter/driver-version"
#: where a prepared dataset's source volume is mounted in its init container
PREPARE_SOURCE = "/prepare/source"
LABEL_JOB = "ma-jupyter/job"
LABEL_ROLE = "ma-jupyter/role"
_LABELS = {"app.kubernetes.io/name": "ma-jupyter", "app.kubernetes.io/managed-by": "ma-jupyter"}
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_DIGITS = re.compile(r"(\d+)")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_KEY = re.compile(r"[^-._a-zA-Z0-9]+")
#: the longest DNS label: a pod's hostname, a Service's name
DNS_LABEL = 63
#: the node-side helpers' package (they import nothing of it outside ``nodeside/``)
_PACKAGE = Path(__file__).resolve().parents[1]
_HELPER_INIT = '"""The node-side helpers of ma_jupyter, shipped by its Kubernetes export."""\n'


class _Index:
    """The place of the pod's index in a per-index value."""

    def __repr__(self) -> str:
        return "<index>"


INDEX = _Index()
Parts = list[str | _Index]


# ------------------------------------------------------------------------------ names


def base_name(job_name: str, longest_suffix: int) -> str:
    """The name of the job's Service and the stem of every other name: the job's name as a DNS
    label (lower case, ``-`` for anything else, starting with a letter), short enough that
    ``<base><suffix>`` stays a label for the longest ``-<role>-<index>`` suffix."""
    base = re.sub(r"-{2,}", "-", _NOT_DNS.sub("-", job_name.lower())).strip("-")
    if not base[:1].isalpha():
        base = f"ma-{base}".rstrip("-")
    return base[: DNS_LABEL - longest_suffix].rstrip("-")


def _dns(text: str) -> str:
    """``text`` as a DNS subdomain (claim names): lower case, ``-`` for anything else."""
    return re.sub(r"-{2,}", "-", _NOT_DNS.sub("-", text.lower())).strip("-")[:253].strip("-")


def _labels(base: str, role: str | None = None) -> dict[str, str]:
    labels = {**_LABELS, LABEL_JOB: base}
    if role:
        labels[LABEL_ROLE] = role
    return labels


# ------------------------------------------------------------------------ the placement


def placement(spec: JobSpec, job_id: str, base: str, flavor_of: Callable[[str], Spec]) -> Placement:
    """The job's tasks as pods: hostname and address ``<base>-<role>-<index>.<base>``, the ports
    :data:`PORTS`, the slots of the job's spec (one for a parameter server, as the scheduler
    places them)."""
    flavor = flavor_of("worker")
    tasks = []
    for role, index in task_roles(spec):
        host = f"{base}-{role}-{index}.{base}"
        tasks.append(
            TaskSlot(
                role=role,
                index=index,
                hostname=host,
                address=host,
                ports=PORTS,
                slots=flavor.slots if role != "ps" else 1,
                cpu_request=flavor_of(role).cpus,
            )
        )
    return Placement(job_id=job_id, spec=flavor, tasks=tuple(tasks))


# ------------------------------------------------------------------ per-index templates


def _render(parts: Parts, index: int) -> str:
    return "".join(str(index) if isinstance(p, _Index) else p for p in parts)


def template(values: list[str]) -> Parts | None:
    """Parts that give ``values[i]`` for index ``i`` when :data:`INDEX` becomes ``i``, or None.

    Equal values are one literal.  Otherwise the first two values must have the same runs of
    digits and text, differing only where the first has ``0`` and the second ``1`` (the index);
    every value is then checked against the template.
    """
    if all(v == values[0] for v in values):
        return [values[0]]
    first, second = _DIGITS.split(values[0]), _DIGITS.split(values[1])
    if len(first) != len(second):
        return None
    parts: Parts = []
    for a, b in zip(first, second, strict=True):
        if a == b:
            parts.append(a)
        elif (a, b) == ("0", "1"):
            parts.append(INDEX)
        else:
            return None
    merged: Parts = []
    for part in parts:  # adjacent text as one run (a ${VAR} is never cut in two)
        if merged and isinstance(part, str) and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    if any(_render(merged, i) != v for i, v in enumerate(values)):
        return None
    return merged


class _Container:
    """What one pod template runs: the plan of its first node and the per-index templates of
    its argv and env (one literal each for a Job of one node)."""

    def __init__(self, plan: NodePlan, argv: list[Parts], env: dict[str, Parts], indexed: bool):
        self.plan = plan
        self.argv = argv
        self.env = env
        self.indexed = indexed


def _role_container(plans: list[NodePlan]) -> _Container | None:
    """One template for every node of a role (by index), or None when they differ otherwise."""
    first = plans[0]
    for plan in plans[1:]:
        if (
            list(plan.env) != list(first.env)
            or len(plan.argv) != len(first.argv)
            or plan.files != first.files
            or plan.primary != first.primary
            or plan.job_env != first.job_env
            or plan.algorithm != first.algorithm
            or plan.outputs_subdir != first.outputs_subdir
        ):
            return None
    argv: list[Parts] = []
    for k in range(len(first.argv)):
        parts = template([p.argv[k] for p in plans])
        if parts is None:
            return None
        argv.append(parts)
    env: dict[str, Parts] = {}
    for name in first.env:
        parts = template([p.env[name] for p in plans])
        if parts is None:
            return None
        env[name] = parts
    return _Container(first, argv, env, indexed=True)


def _node_container(plan: NodePlan) -> _Container:
    return _Container(plan, [[a] for a in plan.argv], {k: [v] for k, v in plan.env.items()}, indexed=False)


# ---------------------------------------------------------------- kubelet's $(VAR) syntax


def _escape(text: str) -> str:
    """Literal text for kubelet: ``$$`` is its escape for ``$``."""
    return text.replace("$", "$$")


def _k8s_text(parts: Parts, *, defined: set[str] | None, where: str) -> str:
    """A value in kubelet's syntax: the index as ``$(MA_TASK_INDEX)``, literal text escaped.

    ``defined``: None keeps ``${VAR}`` literal (the platform's values; ``bash -c``); a set turns
    each reference to one of its names into ``$(VAR)`` and refuses any other.
    """

    def reference(name: str) -> str:
        assert defined is not None
        if name not in defined:
            raise InvalidSpec(
                f"{where} refers to ${{{name}}}, which this export does not define before it (the image "
                "or the node sets it, or nothing does): Kubernetes expands only the variables a manifest "
                f"defines, so give the value in full for the Kubernetes export",
                field="command" if where == "the command" else "env",
            )
        return f"$({name})"

    out = []
    for part in parts:
        if isinstance(part, _Index):
            out.append(f"$({INDEX_VAR})")
        elif defined is None:
            out.append(_escape(part))
        else:
            out.append(substitute(part, reference, _escape))
    return "".join(out)


# ---------------------------------------------------------------------------- documents


def manifests(
    spec: JobSpec,
    *,
    job_id: str | None,
    flavor_of: Callable[[str], Spec],
    outputs: str | None,
    image: str | None = None,
    mounts_as: str | None = None,
) -> list[dict[str, Any]]:
    """The Kubernetes documents of a job (see the module docstring), in apply order.

    Args:
        spec: the job.
        job_id: its id (``MA_JOB_ID``); None for a job not submitted (the base name stands in).
        flavor_of: the spec a task of a role runs with (the job's spec; ``cpu.ps`` for ``ps``).
        outputs: the host folder of ``/workspace/outputs`` when the spec names none (the one
            the platform made for the job); used by ``mounts_as="hostpath"``.
        image: the container image; default :data:`MODE_IMAGES` / :data:`DEFAULT_IMAGE`.
        mounts_as: ``pvc`` (default) or ``hostpath``.

    Raises:
        InvalidSpec: the horovod mode, a bad image name or ``mounts_as``, or a ``${VAR}`` the
            manifest cannot define (the message says what to do).
    """
    mounts_as = mounts_as or "pvc"
    if mounts_as not in MOUNTS_AS:
        raise InvalidSpec(
            f"mounts_as {mounts_as!r}: choose pvc (claims the cluster provides) or hostpath (the host "
            "folders themselves)",
            field="mounts_as",
        )
    if image is not None and not _IMAGE.match(image):
        raise InvalidSpec(
            f"{image!r} is not a container image name (e.g. pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime)",
            field="image",
        )
    if spec.mode is Mode.horovod:
        raise InvalidSpec(
            "the horovod mode cannot be exported to Kubernetes: mpirun starts the ranks of the other "
            "nodes through a remote shell, which an Indexed Job does not provide (use the pytorch mode, "
            "or the MPI Operator's MPIJob)",
            field="mode",
        )
    roles = task_roles(spec)
    longest = max(len(f"-{role}-{index}") for role, index in roles)
    base = base_name(spec.name, longest)
    plans = plan_job(spec, placement(spec, job_id or base, base, flavor_of))
    image = image or MODE_IMAGES.get(spec.mode, DEFAULT_IMAGE)

    containers: list[tuple[str, list[_Container]]] = []
    for role in dict.fromkeys(p.task.role for p in plans):
        of_role = sorted((p for p in plans if p.task.role == role), key=lambda p: p.task.index)
        shared = _role_container(of_role)
        containers.append((role, [shared] if shared else [_node_container(p) for p in of_role]))

    helpers = any("ma_jupyter.nodeside." in arg for p in plans for arg in p.argv)
    files = _FileKeys()
    jobs = []
    claims: dict[str, str] = {}
    for role, group in containers:
        for container in group:
            jobs.append(
                _job(
                    spec,
                    base,
                    role,
                    container,
                    count=sum(1 for p in plans if p.task.role == role),
                    flavor=flavor_of(role),
                    image=image,
                    helpers=helpers,
                    files=files,
                    volumes=_Volumes(spec, base, container.plan, mounts_as, outputs, claims),
                )
            )
    if claims:
        for job in jobs:
            job["metadata"]["annotations"]["ma-jupyter/claims"] = json.dumps(claims, sort_keys=True)
    documents: list[dict[str, Any]] = [_priority_class(spec.priority)]
    if files.data:
        documents.append(_config_map(f"{base}-files", base, files.data))
    if helpers:
        documents.append(_config_map(f"{base}-nodeside", base, _helper_files()))
    documents.append(_service(base))
    return documents + jobs


def _priority_class(priority: Priority) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": f"ma-jupyter-{priority.value}", "labels": dict(_LABELS)},
        "value": PRIORITY_VALUES[priority],
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": f"ma_jupyter training jobs of priority {priority.value}",
    }


def _node_selector(spec: JobSpec) -> dict[str, str]:
    selector = {}
    if spec.node_name:
        selector["kubernetes.io/hostname"] = spec.node_name
    if spec.pool:
        selector[POOL_LABEL] = spec.pool
    if spec.driver_version:
        selector[DRIVER_LABEL] = spec.driver_version
    return selector


def _config_map(name: str, base: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": _labels(base)},
        "data": data,
    }


def _service(base: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": base, "labels": _labels(base)},
        "spec": {
            "clusterIP": "None",
            # peers resolve each other while they start (rendezvous), before any is ready
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: base},
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in zip(("main", "aux"), PORTS, strict=True)
            ],
        },
    }


def _helper_files() -> dict[str, str]:
    """The node-side helpers as ConfigMap data: key -> source (see :func:`_helper_items`)."""
    data = {"ma_jupyter.__init__.py": _HELPER_INIT}
    for path in sorted((_PACKAGE / "nodeside").glob("*.py")):
        data[f"ma_jupyter.nodeside.{path.name}"] = path.read_text(encoding="utf-8")
    return data


def _helper_items() -> list[dict[str, str]]:
    """Each helper's ConfigMap key at its path below :data:`NODESIDE_ROOT`."""
    items = []
    for key in _helper_files():
        *package, module, suffix = key.split(".")
        items.append({"key": key, "path": "/".join([*package, f"{module}.{suffix}"])})
    return items


class _FileKeys:
    """The mode's files of every node as one ConfigMap: one key per distinct (path, content)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self._keys: dict[tuple[str, str], str] = {}

    def key(self, path: str, content: str) -> str:
        found = self._keys.get((path, content))
        if found is None:
            stem = _NOT_KEY.sub("-", path.strip("/")).strip("-.") or "file"
            found = stem if stem not in self.data else f"{stem}-{len(self.data)}"
            self._keys[(path, content)] = found
            self.data[found] = content
        return found


class _Volumes:
    """The volumes and mounts of one pod template: its ``/workspace`` folders, the rank-log
    folder, the mode's files and the helpers."""

    def __init__(
        self,
        spec: JobSpec,
        base: str,
        plan: NodePlan,
        mounts_as: str,
        outputs: str | None,
        claims: dict[str, str],
    ):
        self.volumes: list[dict[str, Any]] = []
        self.mounts: list[dict[str, Any]] = []
        #: per prepared dataset: its source's mount and its copy's mount, in the init container
        self.prepare: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for n, folder in enumerate(folders(spec, algorithm=plan.algorithm)):
            name = f"ws-{n}-{folder.kind}"
            host = folder.path if folder.path is not None else outputs
            mount: dict[str, Any] = {"name": name, "mountPath": folder.target, "readOnly": folder.read_only}
            if folder.kind == "outputs" and plan.outputs_subdir:
                mount["subPath"] = plan.outputs_subdir
            if spec.data_preparation and folder.kind == "dataset":
                # the job reads the node's copy; the source is mounted only in the init container
                prepared = f"prepared-{n}"
                self.volumes.append({"name": prepared, "emptyDir": {}})
                self.mounts.append({"name": prepared, "mountPath": folder.target, "readOnly": True})
                self.prepare.append(
                    (
                        {"name": name, "mountPath": f"{PREPARE_SOURCE}-{n}", "readOnly": True},
                        {"name": prepared, "mountPath": folder.target},
                    )
                )
            else:
                self.mounts.append(mount)
            if mounts_as == "hostpath":
                if not host:
                    raise InvalidSpec(
                        "the job's outputs folder is not known: name one with --output", field="outputs"
                    )
                source: dict[str, Any] = {"path": host}
                if folder.kind in ("outputs", "volume"):
                    source["type"] = "DirectoryOrCreate"
                elif folder.kind == "algorithm":
                    source["type"] = "Directory"
                self.volumes.append({"name": name, "hostPath": source})
            else:
                claim = _claim(base, folder.kind, folder.target, plan)
                if host:
                    claims[claim] = host
                self.volumes.append(
                    {
                        "name": name,
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": folder.read_only},
                    }
                )
        self.volumes.append({"name": "rank-logs", "emptyDir": {}})
        self.mounts.append({"name": "rank-logs", "mountPath": RANK_LOG_VIEW})

    def add_files(self, files: dict[str, str], keys: _FileKeys, base: str) -> None:
        if not files:
            return
        self.volumes.append({"name": "files", "configMap": {"name": f"{base}-files"}})
        for path, content in files.items():
            self.mounts.append(
                {"name": "files", "mountPath": path, "subPath": keys.key(path, content), "readOnly": True}
            )

    def add_helpers(self, base: str) -> None:
        self.volumes.append(
            {"name": "nodeside", "configMap": {"name": f"{base}-nodeside", "items": _helper_items()}}
        )
        self.mounts.append({"name": "nodeside", "mountPath": NODESIDE_ROOT, "readOnly": True})


def _claim(base: str, kind: str, target: str, plan: NodePlan) -> str:
    """The claim standing for one folder: per job for its code and outputs (a batch task's own
    code: per task), by name for datasets, models, annotations and volumes (shared by jobs)."""
    if kind == "algorithm":
        return (
            f"{base}-{plan.task.role}-{plan.task.index}-algorithm" if plan.algorithm else f"{base}-algorithm"
        )
    if kind == "outputs":
        return f"{base}-outputs"
    parts = target.removeprefix(VIEW_ROOT + "/").split("/")
    if kind == "annotation":
        parts = ["annotation", parts[1]]
    name = _dns("-".join(parts))
    if len(name) > 253:  # keep it a name, and still its own
        name = name[:240].rstrip("-") + "-" + hashlib.sha256(target.encode()).hexdigest()[:12]
    return name


def _quantity_cpu(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def _quantity_memory(gb: float) -> str:
    return f"{int(gb)}Gi" if float(gb).is_integer() else f"{round(gb * 1024)}Mi"


def _resources(flavor: Spec) -> dict[str, Any]:
    amounts: dict[str, Any] = {
        "cpu": _quantity_cpu(flavor.cpus),
        "memory": _quantity_memory(flavor.memory_gb),
    }
    if flavor.accelerators and flavor.accelerator_type in CARD_RESOURCES:
        amounts[CARD_RESOURCES[flavor.accelerator_type]] = str(flavor.accelerators)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _env(spec: JobSpec, container: _Container, helpers: bool) -> tuple[list[dict[str, Any]], set[str]]:
    """The container's variables in order (module docstring, rule 4) and their names."""
    plan = container.plan
    own = [k for k in plan.job_env if k not in (RANK_LOG_ENV, "MA_WORKSPACE")]
    entries: list[dict[str, Any]] = []
    defined: set[str] = set()

    def add(name: str, value: str) -> None:
        entries.append({"name": name, "value": value})
        defined.add(name)

    if container.indexed:
        entries.append(
            {
                "name": INDEX_VAR,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
            }
        )
        defined.add(INDEX_VAR)
    else:
        add(INDEX_VAR, _k8s_text(container.env[INDEX_VAR], defined=None, where=INDEX_VAR))
    for name, parts in container.env.items():
        if name not in own and name != INDEX_VAR:
            add(name, _k8s_text(parts, defined=None, where=f"env {name}"))
    add("MA_WORKSPACE", VIEW_ROOT)
    add(RANK_LOG_ENV, RANK_LOG_VIEW)
    if "PYTHONUNBUFFERED" not in container.env:
        add("PYTHONUNBUFFERED", "1")
    if helpers and "PYTHONPATH" not in own:
        add("PYTHONPATH", NODESIDE_ROOT)
    for name in own:
        value = _k8s_text(container.env[name], defined=set(defined), where=f"env {name}")
        if helpers and name == "PYTHONPATH":  # the job's modules first, as on every backend
            value = f"{value}:{NODESIDE_ROOT}" if value else NODESIDE_ROOT
        add(name, value)
    return entries, defined


def _command(parts: list[Parts], defined: set[str]) -> list[str]:
    """The argv in kubelet's syntax (``bash -c`` arguments left to that shell)."""
    literal = [_render(p, 0) for p in parts]
    keep = is_shell_wrapper(literal)
    return [_k8s_text(p, defined=None if keep else defined, where="the command") for p in parts]


def _lifecycle_argv(text: str, defined: set[str]) -> list[str]:
    return _command([[a] for a in parse_command(text, field="lifecycle")], defined)


def _job(
    spec: JobSpec,
    base: str,
    role: str,
    container: _Container,
    *,
    count: int,
    flavor: Spec,
    image: str,
    helpers: bool,
    files: _FileKeys,
    volumes: _Volumes,
) -> dict[str, Any]:
    plan = container.plan
    env, defined = _env(spec, container, helpers)
    volumes.add_files(plan.files, files, base)
    if helpers:
        volumes.add_helpers(base)
    main: dict[str, Any] = {
        "name": role,
        "image": image,
        "command": _command(container.argv, defined),
        "workingDir": workdir_for(spec, plan.algorithm),
        "env": env,
        "resources": _resources(flavor),
        "ports": [
            {"name": name, "containerPort": port, "protocol": "TCP"}
            for name, port in zip(("main", "aux"), PORTS, strict=True)
        ],
        "volumeMounts": volumes.mounts,
    }
    if spec.lifecycle.on_stop:
        main["lifecycle"] = {
            "preStop": {"exec": {"command": _lifecycle_argv(spec.lifecycle.on_stop, defined)}}
        }
    resume = spec.checkpoint_resume
    grace = resume.grace_period if resume else spec.grace_period
    pod: dict[str, Any] = {
        "subdomain": base,
        "restartPolicy": "Never",
        # only the variables planned: no Docker-link variables of the namespace's Services
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": math.ceil(grace),
        "containers": [main],
        "volumes": volumes.volumes,
    }
    init: list[dict[str, Any]] = []
    for n, (source, copy) in enumerate(volumes.prepare):
        init.append(
            {
                "name": f"prepare-{n}",
                "image": image,
                # argv, no shell: "<source>/." copies the folder's content, hidden files too
                "command": ["cp", "-a", f"{source['mountPath']}/.", copy["mountPath"]],
                "volumeMounts": [source, copy],
            }
        )
    if spec.lifecycle.on_start:
        init.append(
            {
                "name": "on-start",
                "image": image,
                "command": _lifecycle_argv(spec.lifecycle.on_start, defined),
                "workingDir": main["workingDir"],
                "env": env,
                "volumeMounts": volumes.mounts,
            }
        )
    if init:
        pod["initContainers"] = init
    pod["priorityClassName"] = f"ma-jupyter-{spec.priority.value}"
    selector = _node_selector(spec)
    if selector:
        pod["nodeSelector"] = selector
    job_spec: dict[str, Any] = {}
    if container.indexed:
        name = f"{base}-{role}"
        job_spec.update({"completionMode": "Indexed", "completions": count, "parallelism": count})
    else:
        name = f"{base}-{role}-{plan.task.index}"
        pod["hostname"] = name  # the name an Indexed Job would have given it
        job_spec.update({"completions": 1, "parallelism": 1})
    restarts = spec.fault_restart.max_restarts if spec.fault_restart else resume.max_resumes if resume else 0
    job_spec["backoffLimit"] = restarts
    if spec.duration:
        job_spec["activeDeadlineSeconds"] = max(1, math.ceil(spec.duration))
    job_spec["template"] = {"metadata": {"labels": _labels(base, role)}, "spec": pod}
    annotations = {
        "ma-jupyter/job-id": plan.env.get("MA_JOB_ID", ""),
        "ma-jupyter/job-name": spec.name,
        "ma-jupyter/mode": spec.mode.value,
        "ma-jupyter/spec": flavor.name,
        "ma-jupyter/primary": "true" if plan.primary else "false",
        "ma-jupyter/creator": spec.creator or "",
        "ma-jupyter/access": spec.access.value,
    }
    # the supervisor stops a job's serving tasks once the others finished; nothing does here
    notes = plan.notes if plan.primary else [SERVES_UNTIL_DELETED]
    if notes:
        annotations["ma-jupyter/notes"] = "; ".join(notes)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": _labels(base, role), "annotations": annotations},
        "spec": job_spec,
    }


# --------------------------------------------------------------------------------- text


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml's emitter where installed
    """Block style for text of several lines (the helpers' sources, rank tables); every value
    written out where it is used (no ``&anchor``/``*alias``: the init container's variables
    read like the main container's)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def header(spec: JobSpec, job_id: str | None, flavor: Spec, documents: list[dict[str, Any]]) -> list[str]:
    """Comment lines for the top of the YAML: what it is, how to apply it, what to provide."""
    jobs = [d for d in documents if d["kind"] == "Job"]
    lines = [
        f"Kubernetes export of ma_jupyter job {job_id or spec.name} ({spec.mode.value} mode, "
        f"spec {flavor.name}), from `ma-jupyter export`.",
        "Apply with: kubectl apply -f <this file>; remove with: kubectl delete -f <this file>.",
    ]
    claims = jobs[0]["metadata"]["annotations"].get("ma-jupyter/claims")
    if claims:
        lines.append("Create these PersistentVolumeClaims first (claim: the host folder it stands for):")
        lines += [f"  {claim}: {path}" for claim, path in json.loads(claims).items()]
    if any(j["metadata"]["annotations"]["ma-jupyter/primary"] == "false" for j in jobs):
        lines.append(
            "The parameter servers serve until deleted: delete them once the workers' Job completes."
        )
    return lines


def to_yaml(documents: list[dict[str, Any]], comments: Sequence[str] = ()) -> str:
    """Multi-document YAML of ``documents``, ``comments`` as ``#`` lines on top."""
    top = "".join(f"# {line}\n" for line in comments)
    return top + yaml.dump_all(
        documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100
    )
