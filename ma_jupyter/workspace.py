"""The ``/workspace`` layout of a job's node: where each folder of a spec appears (pure).

Every node of a job sees the platform's layout (seed 002), whatever runs it::

    /workspace/algorithm                                   the code (read-only unless asked otherwise)
    /workspace/anno_dataset/<name>/annotation              annotation sets (read-only)
    /workspace/dataset/{private,favorite}/<name>[/<ver>]   datasets (read-only unless read_only=False)
    /workspace/model/{pretrained,private,favorite}/<name>[/<ver>]   models (always read-only)
    /workspace/outputs                                     writable; batch task N: <outputs>/<name>-<N>/
    /workspace/volume/<name>                               writable storage volumes

:func:`folders` lists a spec's folders in that order (the order they are bound: parents before
children) with the host path the spec names; it reads no file.  A backend checks and resolves
the host paths (the local backend: ``nodehost/mounts.py``, which shows each node its own
writable copy of the algorithm folder there, its working directory); the Kubernetes export turns
each folder into a volume (``export/k8s.py``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from .errors import InvalidSpec
from .models import JobSpec
from .workspace_paths import VIEW_ROOT

_SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Folder:
    """One folder of a node's ``/workspace`` as the spec names it.

    Attributes:
        kind: ``algorithm``, ``annotation``, ``dataset``, ``model``, ``outputs`` or ``volume``.
        target: where it appears, always below ``/workspace``.
        read_only: whether the job may write to it.
        path: the host path the spec gives; None for the outputs folder of a spec that names
            none (the platform makes one for the job).
        name: the mount's name (the kind itself for the algorithm and outputs folders).
        what: how messages name it (``dataset mnist``).
        field: the spec field it comes from.
    """

    kind: str
    target: str
    read_only: bool
    path: str | None
    name: str
    what: str
    field: str


def target(*parts: str) -> str:
    """An in-view path below /workspace; refuses anything that would leave it."""
    for part in parts:
        if not _SAFE_PART.match(part) or part in (".", ".."):
            raise InvalidSpec(f"{part!r} cannot be used as a folder name inside /workspace")
    path = posixpath.normpath(posixpath.join(VIEW_ROOT, *parts))
    if not path.startswith(VIEW_ROOT + "/"):
        raise InvalidSpec(f"{path} escapes {VIEW_ROOT}")
    return path


def folders(spec: JobSpec, *, algorithm: str | None = None) -> list[Folder]:
    """The folders of a node's ``/workspace``, in bind order (see the module docstring).

    Args:
        spec: the job.
        algorithm: a batch task's own algorithm folder instead of ``spec.algorithm``.

    Raises:
        InvalidSpec: a name or version cannot be a folder name inside ``/workspace``.
    """
    found: list[Folder] = []
    algo = algorithm if algorithm is not None else spec.algorithm
    if algo:
        found.append(
            Folder(
                "algorithm",
                target("algorithm"),
                spec.algorithm_read_only,
                algo,
                "algorithm",
                "algorithm",
                "algorithm",
            )
        )
    for a in spec.annotations:
        found.append(
            Folder(
                "annotation",
                target("anno_dataset", a.name, "annotation"),
                True,
                a.path,
                a.name,
                f"annotation {a.name}",
                "annotations",
            )
        )
    for d in spec.datasets:
        parts = ["dataset", d.source.value, d.name] + ([d.version] if d.version else [])
        found.append(
            Folder("dataset", target(*parts), d.read_only, d.path, d.name, f"dataset {d.name}", "datasets")
        )
    for m in spec.models:
        parts = ["model", m.source.value, m.name] + ([m.version] if m.version else [])
        found.append(Folder("model", target(*parts), True, m.path, m.name, f"model {m.name}", "models"))
    found.append(Folder("outputs", target("outputs"), False, spec.outputs, "outputs", "outputs", "outputs"))
    for v in spec.volumes:
        found.append(
            Folder("volume", target("volume", v.name), False, v.path, v.name, f"volume {v.name}", "volumes")
        )
    return found


def check_subfolder(name: str) -> str:
    """``name`` when it can be a subfolder of the outputs folder (a batch task's ``<name>-<N>``)."""
    if not _SAFE_PART.match(name):
        raise InvalidSpec(f"{name!r} cannot be an outputs subfolder", field="outputs")
    return name


#: the ModelArts container layout (seed 000 table 2, seed 001): the user's writable folder, the
#: code folder inside it, the node-local disk
MODELARTS_HOME = "/home/ma-user/modelarts"
MODELARTS_CACHE = "/cache"


def modelarts_code_dir(algorithm: str, origin: str | None = None) -> str:
    """Where the ModelArts layout shows the algorithm folder: ``user-job-dir/<its name>``, the
    name of the folder it was shipped from (``origin``) when it is a snapshot: the name its
    user knows and writes in commands (``python /home/ma-user/modelarts/user-job-dir/mnist/train.py``)."""
    name = posixpath.basename((origin or algorithm).rstrip("/")) or "code"
    if not _SAFE_PART.match(name):
        name = "code"
    return f"{MODELARTS_HOME}/user-job-dir/{name}"


def origin_of(spec: JobSpec, algorithm: str | None = None) -> str | None:
    """The folder ``algorithm`` (default: the job's own) was shipped from, when it is the job's
    snapshot (``algorithm_origin``); None for a batch task's folder or a folder used as is."""
    if not spec.algorithm_origin or not spec.algorithm:
        return None
    if algorithm and posixpath.normpath(algorithm) != posixpath.normpath(spec.algorithm):
        return None
    return spec.algorithm_origin


def modelarts_layout(spec: JobSpec) -> bool:
    """Whether a node of this job gets the ModelArts container layout (``--convention modelarts``)."""
    return spec.convention.value == "modelarts"


def workdir_for(spec: JobSpec, algorithm: str | None = None) -> str:
    """The node's working directory: ``spec.workdir``, else (ModelArts layout) the code folder
    under ``user-job-dir``, else /workspace/algorithm, else /workspace."""
    if spec.workdir:
        if not posixpath.isabs(spec.workdir):
            raise InvalidSpec(
                f"workdir {spec.workdir!r} must be an absolute path inside the node, e.g. /workspace/algorithm",
                field="workdir",
            )
        return posixpath.normpath(spec.workdir)
    if modelarts_layout(spec) and (algorithm or spec.algorithm):
        return modelarts_code_dir(algorithm or spec.algorithm or "", origin_of(spec, algorithm))
    return target("algorithm") if (algorithm or spec.algorithm) else VIEW_ROOT
