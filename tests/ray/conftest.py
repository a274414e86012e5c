"""The Ray tests' fixtures: a job service on the Ray backend for each test.

Every test of this folder runs inside a private network namespace, on the one Ray cluster of the
session (``ray_cluster``): see ``tests/fixtures/ray_netns.py``, which ``tests/conftest.py``
registers for every folder (the contract suite ``tests/backends/`` runs there too).
"""

from __future__ import annotations

import pytest

from tests.fixtures.ray_service import ray_cluster_toml, serve
from tests.ray.two_hosts import (  # noqa: F401 (fixtures of this folder)
    service_on,
    service_on_private,
    two_hosts,
    two_private_hosts,
)


@pytest.fixture
def ray_driver(ray_cluster):
    """Inside: this test process connected to the session's cluster (to look at placement
    groups), connected on first use and left connected for the next test (the contract suite's
    Ray backend, ``tests/backends/conftest.py``, leaves the cluster before it connects itself:
    one process holds one Ray connection)."""
    if ray_cluster is None:
        return None
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_cluster.address, namespace="tests", log_to_driver=False)
    return ray


@pytest.fixture
def ray_home(ma_home, ray_cluster):
    """Inside: ``ma_home`` whose ``cluster.toml`` points the service at the session's cluster."""
    if ray_cluster is not None:
        toml = ma_home / "cluster.toml"
        toml.write_text(toml.read_text() + ray_cluster_toml(ray_cluster))
    return ma_home


@pytest.fixture
def ray_service(ray_home):
    """Inside: a job service on ``ray_home`` (so on the Ray backend); its jobs are stopped and it
    is shut down after the test.  ``restart()`` starts another one on the same home."""
    yield from serve(ray_home)
