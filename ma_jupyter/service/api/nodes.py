"""The compute catalog and the nodes: ``GET /specs``, ``GET /nodes`` (with what is in use now
and the health marks; the jobs a non-admin may not see are masked), ``POST
/nodes/{name}/drain`` and ``POST /nodes/{name}/undrain`` (admins only)."""

from __future__ import annotations

from fastapi import APIRouter, Body, Path, Query

from ...errors import NotFound
from ...models import API_PREFIX, Node, NodeDrain, Spec
from .. import access
from .. import cluster as cluster_view
from ..users import Caller
from .deps import AUTH, MAX_ID, CallerDep, Services, ServicesDep

router = APIRouter(prefix=API_PREFIX)


def _views(services: Services, spec: str | None = None) -> list[Node]:
    """Every node as an admin sees it: its use now and its health marks."""
    usage = services.supervisor.usage()
    return services.health.annotate(services.scheduler.node_views(usage, spec=spec))


def _masked(services: Services, node: Node, user: Caller) -> Node:
    return cluster_view.masked(node, lambda job_id: services.can_see(job_id, user))


def _node_view(services: Services, name: str) -> Node:
    view = next((v for v in _views(services) if v.name == name), None)
    if view is None:  # it left the inventory meanwhile (a Ray node)
        raise NotFound(f"no node {name!r} (any more): see `ma-jupyter nodes`")
    return view


@router.get("/specs", response_model=list[Spec], dependencies=AUTH)
def specs(services: ServicesDep) -> list[Spec]:
    return services.scheduler.cluster.specs


@router.get("/nodes", response_model=list[Node])
def nodes(
    services: ServicesDep, user: CallerDep, spec: str | None = Query(default=None, max_length=MAX_ID)
) -> list[Node]:
    views = _views(services, spec)
    return views if user.admin else [_masked(services, view, user) for view in views]


@router.post("/nodes/{name}/drain", response_model=Node)
def drain_node(
    services: ServicesDep,
    user: CallerDep,
    name: str = Path(max_length=MAX_ID),
    body: NodeDrain | None = Body(default=None),
) -> Node:
    # no new placement there; jobs with checkpoint resume are moved away (admins only)
    access.check_node_admin(user, "drain")
    services.supervisor.drain(name, body.reason if body else None, by=user.name)
    return _node_view(services, name)


@router.post("/nodes/{name}/undrain", response_model=Node)
def undrain_node(services: ServicesDep, user: CallerDep, name: str = Path(max_length=MAX_ID)) -> Node:
    access.check_node_admin(user, "undrain")
    services.supervisor.undrain(name)
    return _node_view(services, name)
