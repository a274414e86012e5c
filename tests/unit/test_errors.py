"""The wire errors: each kind comes back as its own class, and only a backend that may come
back is one a reader retries."""

from __future__ import annotations

from ma_jupyter.errors import BackendUnavailable, NodeLost, error_from_body


def test_a_lost_node_is_its_own_error_never_a_restarting_service():
    lost = NodeLost(
        "the logs of worker-1 are unavailable: the Ray node ray-3f2a1c0e that ran it left the cluster"
    )
    body = lost.to_body()
    assert (body["error"], lost.status) == ("node_lost", 410)
    again = error_from_body(lost.status, body)
    assert type(again) is NodeLost and again.message == lost.message
    # readers retry BackendUnavailable (a service or backend that comes back): never this one
    assert not isinstance(again, BackendUnavailable)
    assert type(error_from_body(503, BackendUnavailable("restarting").to_body())) is BackendUnavailable
