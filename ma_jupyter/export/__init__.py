"""Exports: what a job would be on another platform, as text to hand to that platform's tools.

``ma-jupyter export JOB --format k8s`` (``GET /api/v1/jobs/{id}/export``) and ``ma-jupyter submit
--dry-run --format k8s`` (``POST /api/v1/export``) reach :func:`render` through the service,
which knows the job, the spec catalog and the resources a parameter server takes.  An export
starts nothing and writes nothing.

Formats (one module each):

* ``k8s``: Kubernetes manifests, multi-document YAML (:mod:`ma_jupyter.export.k8s`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidSpec
from ..models import JobSpec, Spec
from . import k8s

#: format name -> what the service answers with (its media type)
FORMATS = {"k8s": k8s.MEDIA_TYPE}


def check_format(name: str | None) -> str:
    """``name`` when it is a known export format.

    Raises:
        InvalidSpec: naming the formats there are (field ``format``).
    """
    if name not in FORMATS:
        known = ", ".join(sorted(FORMATS))
        raise InvalidSpec(
            f"unknown export format {name!r}: choose one of {known} (e.g. --format k8s)", field="format"
        )
    return name


def render(
    name: str,
    spec: JobSpec,
    *,
    job_id: str | None,
    flavor_of: Callable[[str], Spec],
    outputs: str | None,
    image: str | None = None,
    mounts_as: str | None = None,
) -> str:
    """The export of a job in format ``name`` (see :func:`ma_jupyter.export.k8s.manifests` for
    the arguments).

    Raises:
        InvalidSpec: an unknown format, or a job the format cannot express (the message says why).
    """
    check_format(name)
    documents = k8s.manifests(
        spec, job_id=job_id, flavor_of=flavor_of, outputs=outputs, image=image, mounts_as=mounts_as
    )
    return k8s.to_yaml(documents, k8s.header(spec, job_id, flavor_of("worker"), documents))
