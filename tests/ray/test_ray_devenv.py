"""A dev environment on the Ray backend: a notebook kernel in a 2-node job's ``worker-1``.

The Ray nodes of the test cluster are this machine, so the bridge finds the node's kernel
folder through the service's log stream description (the only place that knows where a node's
files are) and relays Jupyter's ports to the kernel's sockets there.
"""

from __future__ import annotations

import time

import pytest
from jupyter_client import KernelManager

from ma_jupyter.client import Client
from ma_jupyter.client.kernelspec import install_devenv_kernel
from tests.helpers import writable_dir

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


def test_a_kernel_runs_in_the_ray_jobs_node(ray_service, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    client = Client(autostart=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "only-here.txt").write_text("ray dataset")
    outputs = writable_dir(tmp_path / "out")
    source = client.submit(
        name="raytrain",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        command="sleep 600",
        datasets=[{"name": "corpus", "path": str(data)}],
        outputs=str(outputs),
        env={"GREETING": "hi-ray"},
    )
    made = client.create_devenv(source.id, 1)
    name, _ = install_devenv_kernel(client.get(source.id), "worker-1", made.info)
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    kernel = manager.client()
    kernel.start_channels()
    try:
        kernel.wait_for_ready(timeout=300)
        out: list[str] = []
        reply = kernel.execute_interactive(
            "import os\n"
            "print(open('/workspace/dataset/private/corpus/only-here.txt').read(), os.environ['GREETING'], os.environ['RANK'])\n"
            "open('/workspace/outputs/ray-kernel.txt', 'w').write('ok')\n",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok", out
        assert "".join(out) == "ray dataset hi-ray 1\n"
        assert (outputs / "ray-kernel.txt").read_text() == "ok"
        assert client.get(made.id).backend == "ray"
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel()
    deadline = time.monotonic() + 120
    while not client.get(made.id).status.is_terminal():
        assert time.monotonic() < deadline, "the dev environment still runs after its kernel shut down"
        time.sleep(0.5)
