"""The cluster view (:mod:`..cluster`): ``GET /cluster``, the nodes and their use, how many more
of each spec could start now, the queue and card demand per board model; the jobs the caller
may not see are masked."""

from __future__ import annotations

from fastapi import APIRouter, Query

from ...errors import NotFound
from ...models import API_PREFIX, ClusterView, Job
from .. import access
from .. import cluster as cluster_view
from .deps import MAX_ID, CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/cluster", response_model=ClusterView)
def cluster(
    services: ServicesDep,
    user: CallerDep,
    spec: list[str] = Query(default=[], max_length=MAX_ID, description="Only nodes that fit these specs."),
    model: list[str] = Query(default=[], max_length=MAX_ID, description="Only these board models."),
) -> ClusterView:
    store = services.store

    def visible(job_id: str) -> Job | None:
        try:
            job = store.get(job_id)
        except NotFound:
            return None
        return job if access.can_see(job, user) else None

    queued = cluster_view.queued_jobs(services.queue.ids(), store.get)
    usage = services.supervisor.usage()
    return cluster_view.view(services.scheduler, usage, queued, visible, spec, model)
