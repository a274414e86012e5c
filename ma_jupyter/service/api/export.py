"""A job elsewhere: ``POST /export`` and ``GET /jobs/{id}/export`` (a spec not submitted, or a
job, as another platform's manifests: ``format=k8s``, :mod:`ma_jupyter.export`), and ``GET
/jobs/{id}/devenv`` (the job as a notebook that submits it again,
:mod:`ma_jupyter.export.notebook`).  Nothing is placed, reserved or started."""

from __future__ import annotations

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from ... import config
from ...commands import parse_command
from ...jobdir import PLACEHOLDER
from ...models import API_PREFIX, JobSpec, parse_spec
from ...modes.base import splits_nodes
from .. import access
from ..access import Op
from .deps import CallerDep, JobId, Services, ServicesDep
from .schema import SPEC_BODY

router = APIRouter(prefix=API_PREFIX)


def _export(
    services: Services,
    spec: JobSpec,
    job_id: str | None,
    chosen: str | None,
    outputs: str,
    fmt: str,
    image: str | None,
    mounts_as: str | None,
) -> Response:
    # What the job would be elsewhere, with the spec it ran with (else its first) and the
    # resources a parameter server takes here.
    # imported on use: the exporters (and YAML) cost the service's every start otherwise
    from ... import export

    media = export.FORMATS.get(export.check_format(fmt))
    scheduler = services.scheduler
    known = {s.name for s in scheduler.cluster.specs}
    flavor = scheduler.cluster.spec(chosen if chosen in known else spec.specs[0])
    text = export.render(
        fmt,
        spec,
        job_id=job_id,
        flavor_of=lambda role: scheduler.task_flavor(flavor, role, beside=splits_nodes(spec)),
        outputs=outputs,
        image=image,
        mounts_as=mounts_as,
    )
    return Response(text, media_type=media)


@router.post("/export", openapi_extra=SPEC_BODY)
def export_spec(
    services: ServicesDep,
    user: CallerDep,
    body: dict = Body(...),
    fmt: str = Query(default="k8s", alias="format", max_length=40),
    image: str | None = Query(default=None, max_length=300),
    mounts_as: str | None = Query(default=None, max_length=40),
) -> Response:
    # the dry run of a submit, exported: the same edge rules as POST /plan (and the secret
    # values shown as ***, as there)
    spec = access.new_job_spec(parse_spec(body), user, access.load_rules()).masked()
    access.check_priority(user, spec.priority)
    if spec.type.value != "batch":
        parse_command(spec.command or "")
    outputs = spec.outputs or str(PLACEHOLDER.outputs)
    return _export(services, spec, None, None, outputs, fmt, image, mounts_as)


@router.get("/jobs/{job_id}/export")
def export_job(
    services: ServicesDep,
    user: CallerDep,
    job_id: str = JobId,
    fmt: str = Query(default="k8s", alias="format", max_length=40),
    image: str | None = Query(default=None, max_length=300),
    mounts_as: str | None = Query(default=None, max_length=40),
) -> Response:
    # exporting shows the job's spec, as cloning does: viewing is enough
    job = access.check(services.store.get(job_id), user, Op.view)
    outputs = job.outputs_folder or config.outputs_folder(job.id, job.spec.outputs)
    return _export(services, job.spec, job.id, job.chosen_spec, outputs, fmt, image, mounts_as)


@router.get("/jobs/{job_id}/devenv")
def devenv(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> dict:
    # the seed's "create a development environment": it shows the job's spec and code, as
    # cloning does, so viewing is enough; the code comes through the backend, never opened here
    from ...export import notebook as devenv_notebook  # on use, as the exporters above

    job = access.check(services.store.get(job_id), user, Op.view)
    sources = None
    if devenv_notebook.cell_script(job.spec) and job.spec.algorithm:
        try:
            sources = services.backend.code_sources(job.spec)
        except Exception:  # unreadable code: the notebook runs the job's command instead
            sources = None
    return {
        "name": devenv_notebook.file_name(job),
        "notebook": devenv_notebook.devenv_notebook(job, sources),
    }
