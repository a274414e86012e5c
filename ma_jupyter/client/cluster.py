"""The client's calls on the cluster: the spec catalog, the nodes (drain, undrain) and the
cluster view.

A mixin of :class:`~ma_jupyter.client.Client` over its :class:`~.session.ServiceSession`;
every method is documented as ``Client``'s.
"""

from __future__ import annotations

from .session import ServiceSession, segment

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from ..models import ClusterView, Node, Spec


class ClusterCalls(ServiceSession):
    """The catalog, the nodes and the cluster view (``/specs``, ``/nodes``, ``/cluster``)."""

    def specs(self) -> list[Spec]:
        """The spec catalog (compute flavors)."""
        return [self._answer("Spec", s) for s in self._request("GET", "/specs")]

    def nodes(self, spec: str | None = None) -> list[Node]:
        """The node inventory with what is in use now; ``spec``: only nodes that fit it."""
        return [self._answer("Node", n) for n in self._request("GET", "/nodes", params={"spec": spec})]

    def drain_node(self, name: str, reason: str | None = None) -> Node:
        """Take a node out of placement (admins only): no new job goes there, and jobs with
        checkpoint resume running there checkpoint and resume elsewhere."""
        body = {"reason": reason} if reason else None
        return self._answer("Node", self._request("POST", f"/nodes/{segment(name)}/drain", json_body=body))

    def undrain_node(self, name: str) -> Node:
        """Put a drained or faulty node back into placement (admins only)."""
        return self._answer("Node", self._request("POST", f"/nodes/{segment(name)}/undrain"))

    def cluster(self, specs: list[str] | None = None, models: list[str] | None = None) -> ClusterView:
        """The cluster view: nodes and their use (cards as ``1(0):job``), how many more of each
        spec could start now, the queue and card demand per board model; ``specs``/``models``
        filter it."""
        params = {"spec": list(specs or []), "model": list(models or [])}
        return self._answer("ClusterView", self._request("GET", "/cluster", params=params))
