"""The Ray backend's first steps: the inventory is the Ray cluster, and a one-node job runs on it."""

from __future__ import annotations

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.helpers import writable_dir

pytestmark = [pytest.mark.ray]


def test_nodes_are_the_ray_nodes_and_a_job_runs_on_one(ray_service, tmp_path):
    client = Client(autostart=False)
    nodes = client.nodes()
    assert len(nodes) == 2 and all(n.name.startswith("ray-") for n in nodes), nodes
    assert all(n.cpus == 2 for n in nodes)
    code = writable_dir(tmp_path / "code")
    (code / "hello.py").write_text("import socket\nprint('hello from', socket.gethostname(), flush=True)\n")
    job = client.submit(name="hello", command="python hello.py", algorithm=str(code), specs=["cpu.small"])
    done = job.wait(timeout=120, check=False)
    text = client.read_log(done.id, node="worker-0").data
    assert done.status is JobStatus.succeeded, (done.reason, text)
    assert done.backend == "ray"
    assert done.nodes[0].host in {n.name for n in nodes}
    assert "hello from worker-0" in text
