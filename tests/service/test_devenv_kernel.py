"""A dev environment as a Jupyter kernel: the job's own node, reached from a notebook.

A real service runs a 2-node PyTorch job's dev environment for its ``worker-1``; Jupyter starts
the kernelspec the client installed (``KernelManager``, in the test's own ``JUPYTER_DATA_DIR``),
and the code it runs sees the job's dataset, its env, secret env and node 1's ``RANK``, and
writes the job's outputs folder.  Shutting the kernel down ends the dev environment.
"""

from __future__ import annotations

import time

import pytest
from jupyter_client import KernelManager

from ma_jupyter.client import Client
from ma_jupyter.client.kernelspec import install_devenv_kernel, kernel_name
from ma_jupyter.errors import Forbidden
from ma_jupyter.models import JobStatus
from tests.fixtures.zmtp import zmtp_greeting, zmtp_ready
from tests.helpers import writable_dir

pytestmark = pytest.mark.timeout(400)

CODE = """
import os
print('data:', open('/workspace/dataset/private/corpus/only-here.txt').read())
print('env:', os.environ['GREETING'], os.environ['TOKEN'], 'rank', os.environ['RANK'], os.environ['WORLD_SIZE'])
print('of:', os.environ['MA_DEVENV_OF'])
open('/workspace/outputs/from-kernel.txt', 'w').write('written in the node')
"""


def _source_job(client: Client, tmp_path, access: str = "ro"):
    data = tmp_path / "data"
    data.mkdir()
    (data / "only-here.txt").write_text("only in the dataset")
    outputs = writable_dir(tmp_path / "out")
    return client.submit(
        name="trainer",
        mode="pytorch",
        nodes=2,
        command="sleep 600",
        access=access,
        datasets=[{"name": "corpus", "path": str(data)}],
        outputs=str(outputs),
        env={"GREETING": "hello", "TOKEN": "secret:s3cret"},
    )


def _wait_terminal(client: Client, job_id: str, within: float = 120) -> JobStatus:
    deadline = time.monotonic() + within
    job = client.get(job_id)
    while not job.status.is_terminal():
        assert time.monotonic() < deadline, f"dev environment {job_id} still {job.status.value}"
        job = client.wait_status(job_id, since=job.status, wait=10)
    return job.status


def test_a_notebook_kernel_runs_in_the_jobs_node(ma_client, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    source = _source_job(ma_client, tmp_path)
    made = ma_client.create_devenv(source.id, 1)
    origin = made.info.spec.devenv_of
    assert origin is not None and origin.job_id == source.id and origin.node == "worker-1"
    assert made.info.spec.name == "trainer-devenv" and made.info.spec.nodes == 1
    assert made.info.spec.secret_env == {"TOKEN": "***"}  # masked as every job's
    # it holds the owner's secrets: nobody else sees it, and it takes no urgent slot
    assert made.info.spec.access.value == "none" and made.info.spec.priority.value == "normal"

    name, _ = install_devenv_kernel(ma_client.get(source.id), "worker-1", made.info)
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    kernel = manager.client()
    kernel.start_channels()
    try:
        kernel.wait_for_ready(timeout=240)
        out: list[str] = []

        def collect(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = kernel.execute_interactive(CODE, timeout=60, output_hook=collect)
        text = "".join(out)
        assert reply["content"]["status"] == "ok", text
        assert "data: only in the dataset" in text
        assert "env: hello s3cret rank 1 2" in text
        assert f"of: {source.id}" in text
        assert (tmp_path / "out" / "from-kernel.txt").read_text() == "written in the node"
        assert ma_client.get(made.id).status is JobStatus.running
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel()
    assert _wait_terminal(ma_client, made.id) in (JobStatus.succeeded, JobStatus.stopped)


def test_a_viewer_may_not_open_the_owners_environment(ma_module_client, tmp_path):
    source = _source_job(ma_module_client, tmp_path, access="ro")  # its dataset allows others ro
    token = ma_module_client.add_user("viewer").token
    viewer = Client(url=ma_module_client.url, token=token)
    try:
        assert viewer.get(source.id).id == source.id  # the viewer sees it...
        with pytest.raises(Forbidden, match="only its owner"):
            viewer.create_devenv(source.id, 1)  # ...but never runs with its secrets
        # nothing half-made (the module's service is shared: a dev environment of this source)
        made = [j for j in ma_module_client.jobs() if j.info.spec.devenv_of is not None]
        assert all(j.info.spec.devenv_of.job_id != source.id for j in made)
    finally:
        viewer.close()
        source.stop()  # the module's service outlives the test


def test_only_the_owner_learns_the_way_to_the_kernel(ma_module_client, tmp_path):
    """``POST /jobs/{id}/kernel``: the way to a running dev environment's kernel (its folder on
    this machine, on the local backend) is the owner's alone, as a debug terminal is."""
    from ma_jupyter.errors import Conflict, NotFound

    source = _source_job(ma_module_client, tmp_path)
    made = ma_module_client.create_devenv(source.id, 0)
    token = ma_module_client.add_user("stranger").token
    stranger = Client(url=ma_module_client.url, token=token)
    try:
        job = made.info
        deadline = time.monotonic() + 120
        while job.status is not JobStatus.running:
            assert time.monotonic() < deadline and not job.status.is_terminal(), job.reason
            job = ma_module_client.wait_status(made.id, since=job.status, wait=10)
        route = ma_module_client.kernel_route(made.id)
        assert route.relay is None and route.node == "worker-0"
        assert route.folder is not None and route.folder.endswith(f"/{made.id}/nodes/worker-0/kernel")
        with pytest.raises(NotFound):
            stranger.kernel_route(made.id)  # its access is none: it does not exist for others
        with pytest.raises(Conflict, match="no dev environment"):
            ma_module_client.kernel_route(source.id)
        ma_module_client.stop(made.id)
        _wait_terminal(ma_module_client, made.id)
        with pytest.raises(Conflict, match="while it runs"):
            ma_module_client.kernel_route(made.id)
    finally:
        stranger.close()
        source.stop()  # the module's service outlives the test


def test_a_submit_may_not_claim_to_be_a_dev_environment(ma_module_client):
    from ma_jupyter.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match="set by the service"):
        ma_module_client.submit(name="fake", command="sleep 1", devenv_of={"job_id": "x", "node": "worker-0"})


@pytest.fixture
def jupyter_data(tmp_path, monkeypatch):
    """A kernelspec folder of the test's own (set before the CLI's environment is taken)."""
    folder = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(folder))
    return folder


def test_the_cli_installs_the_kernel_and_papermill_runs_a_notebook_there(
    jupyter_data, ma_cli, ma_client, tmp_path
):
    import json

    import nbformat
    import papermill

    source = _source_job(ma_client, tmp_path)
    done = ma_cli("devenv", source.id, "--kernel", "--node", "1")
    assert done.returncode == 0, done.stderr
    name = kernel_name(ma_client.job(source.id).info, "worker-1")
    assert name == f"ma_jupyter-{source.id}-worker-1".lower()  # by id: two jobs named alike differ
    assert f"installed kernel '{name}'" in done.stdout
    spec = json.loads((jupyter_data / "kernels" / name / "kernel.json").read_text())
    assert spec["display_name"] == "ma_jupyter: trainer (worker-1)"
    assert spec["interrupt_mode"] == "message"
    assert not any("token" in key.lower() for key in spec["env"])  # no credential on disk
    devenv = next(j.info for j in ma_client.jobs() if j.info.spec.devenv_of is not None)
    shown = ma_cli("get", devenv.id)
    assert f"devenv of: job {source.id}, node worker-1" in shown.stdout, shown.stderr

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("import os\nrank = os.environ['RANK']\nprint('rank', rank)"),
        nbformat.v4.new_code_cell("print(open('/workspace/dataset/private/corpus/only-here.txt').read())"),
    ]
    written = tmp_path / "in.ipynb"
    nbformat.write(notebook, written)
    ran = papermill.execute_notebook(
        str(written),
        str(tmp_path / "out.ipynb"),
        kernel_name=name,
        progress_bar=False,
    )
    texts = ["".join(o.get("text", "")) for cell in ran["cells"] for o in cell["outputs"]]
    assert texts == ["rank 1\n", "only in the dataset\n"]
    # papermill shut the kernel down: the dev environment it attached to ended
    assert _wait_terminal(ma_client, devenv.id) in (JobStatus.succeeded, JobStatus.stopped)


def test_an_image_without_ipykernel_fails_saying_what_to_install(ma_client, tmp_path):
    import shutil
    import subprocess

    python = shutil.which("python3", path="/usr/bin")
    if (
        python is None
        or subprocess.run([python, "-c", "import ipykernel"], capture_output=True).returncode == 0
    ):
        pytest.skip("no interpreter without ipykernel on this machine")
    data = tmp_path / "data"
    data.mkdir()
    source = ma_client.submit(name="plain", command="sleep 600", image={"python": python})
    made = ma_client.create_devenv(source.id)
    assert _wait_terminal(ma_client, made.id) is JobStatus.error
    reason = ma_client.get(made.id).reason
    assert "has no ipykernel" in reason and "pip install ipykernel" in reason, reason


@pytest.mark.small_cluster
def test_it_queues_while_the_cluster_is_full_and_the_kernel_waits_for_it(ma_client, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    # a 2-node job and three single ones fill both machines (8 + 2 cores) with 2-core nodes
    full = ma_client.submit(name="pair", mode="pytorch", nodes=2, specs=["cpu.medium"], command="sleep 600")
    fillers = [ma_client.submit(name=f"fill{i}", specs=["cpu.medium"], command="sleep 600") for i in range(3)]
    deadline = time.monotonic() + 120
    while any(ma_client.get(j.id).status is not JobStatus.running for j in [full, *fillers]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    made = ma_client.create_devenv(full.id, "worker-1")
    queued = ma_client.get(made.id)
    assert queued.status is JobStatus.queued and queued.queue_position is not None
    assert queued.spec.specs == ["cpu.medium"]  # the spec the job runs with

    name, _ = install_devenv_kernel(ma_client.get(full.id), "worker-1", made.info)
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    kernel = manager.client()
    kernel.start_channels()
    try:
        assert ma_client.get(made.id).status is JobStatus.queued  # the kernel waits for it
        ma_client.stop(fillers[0].id)  # its cores free: the dev environment starts, the kernel with it
        kernel.wait_for_ready(timeout=240)
        out: list[str] = []
        reply = kernel.execute_interactive(
            "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'])",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok"
        assert "".join(out) == "1 2\n"
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel()
    assert _wait_terminal(ma_client, made.id) in (JobStatus.succeeded, JobStatus.stopped)


def test_a_second_notebook_on_the_same_kernel_gets_an_environment_of_its_own(
    ma_client, tmp_path, monkeypatch
):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    source = _source_job(ma_client, tmp_path)
    made = ma_client.create_devenv(source.id)
    name, _ = install_devenv_kernel(ma_client.get(source.id), "worker-0", made.info)
    managers = [KernelManager(kernel_name=name) for _ in range(2)]
    clients = []
    ids: list[str] = []
    try:
        for manager in managers:
            manager.start_kernel()
            kernel = manager.client()
            kernel.start_channels()
            clients.append(kernel)
            kernel.wait_for_ready(timeout=240)
        for kernel in clients:
            out: list[str] = []
            reply = kernel.execute_interactive(
                "import os; print(os.environ['MA_JOB_ID'])",
                timeout=60,
                output_hook=lambda m, out=out: out.append(m["content"].get("text", "")),
            )
            assert reply["content"]["status"] == "ok"
            ids.append("".join(out).strip())
        assert ids[0] == made.id and ids[1] != made.id  # each notebook its own kernel and job
        devenvs = {j.id for j in ma_client.jobs() if j.info.spec.devenv_of is not None}
        assert devenvs == set(ids)
    finally:
        for kernel in clients:
            kernel.stop_channels()
        for manager in managers:
            if manager.has_kernel:
                manager.shutdown_kernel()
    for job_id in ids:
        assert _wait_terminal(ma_client, job_id) in (JobStatus.succeeded, JobStatus.stopped)


def _reply(kernel, msg_id: str) -> dict:
    """The shell reply to ``msg_id`` (the replies to the kernel-info requests Jupyter repeated
    while the dev environment was starting come first)."""
    while True:
        reply = kernel.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_interrupt_and_input_reach_the_kernel_through_the_bridge(ma_client, tmp_path, monkeypatch):
    import queue

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    source = _source_job(ma_client, tmp_path)
    made = ma_client.create_devenv(source.id)
    name, _ = install_devenv_kernel(ma_client.get(source.id), "worker-0", made.info)
    manager = KernelManager(kernel_name=name)
    manager.start_kernel()
    kernel = manager.client()
    kernel.start_channels()
    try:
        kernel.wait_for_ready(timeout=240)
        # input(): the kernel's request comes back on stdin (the shell and stdin identities match)
        msg_id = kernel.execute("answer = input('say: '); print('got', answer)", allow_stdin=True)
        request = kernel.get_stdin_msg(timeout=60)
        assert request["content"]["prompt"] == "say: "
        kernel.input("forty-two")
        assert _reply(kernel, msg_id)["content"]["status"] == "ok"
        # an interrupt is a message on the control channel (interrupt_mode: message)
        msg_id = kernel.execute("import time; print('sleeping', flush=True); time.sleep(600)")
        deadline = time.monotonic() + 60
        while True:  # until the cell's code runs (ipykernel ignores SIGINT outside user code)
            try:
                msg = kernel.get_iopub_msg(timeout=1)
            except queue.Empty:
                msg = None
            if msg and msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
                assert "sleeping" in msg["content"]["text"]
                break
            assert time.monotonic() < deadline
        manager.interrupt_kernel()
        reply = _reply(kernel, msg_id)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel()
    assert _wait_terminal(ma_client, made.id) in (JobStatus.succeeded, JobStatus.stopped)


# --------------------------------------------------- a kernel's peer that declares a huge frame

#: the frame the fake kernel declares (8 GiB), and how much of it it sends at most
DECLARED = 8 << 30
SENDS_AT_MOST = 768 << 20
#: what the bridge may grow by meanwhile: far below what it was sent
GROWS_AT_MOST = 160 << 20


def _rss_peak(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_kernel_peer_declaring_an_8_gib_frame_is_dropped_and_the_bridge_stays_small(tmp_path):
    """The dev environment's code answers on the kernel socket itself, speaking ZMTP, and
    declares an 8 GiB message: the bridge's socket towards the kernel (``kernel_socket``, as the
    bridge makes them) drops the connection instead of allocating and filling it."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers import wait_for

    path = str(tmp_path / "k-1")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(120)
    root = Path(__file__).resolve().parents[2]
    bridge = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, zmq; from ma_jupyter.client.kernel_bridge import kernel_socket; "
            "s = kernel_socket(zmq.Context(), zmq.DEALER); s.connect(sys.argv[1]); "
            "print('connected', flush=True); time.sleep(600)",
            f"ipc://{path}",
        ],
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert bridge.stdout.readline().strip() == "connected"
        peer, _ = listener.accept()
        peer.settimeout(60)
        peer.sendall(zmtp_greeting(as_server=True) + zmtp_ready(b"ROUTER"))
        received = b""
        while b"READY" not in received:  # the bridge's greeting and READY: the handshake is done
            data = peer.recv(4096)
            assert data, "the bridge closed during the handshake"
            received += data
        wait_for(lambda: _rss_peak(bridge.pid) > 0, timeout=30)
        before = _rss_peak(bridge.pid)
        peer.sendall(b"\x02" + DECLARED.to_bytes(8, "big"))  # a long final frame of 8 GiB
        sent, chunk, dropped = 0, b"\0" * (1 << 20), False
        while sent < SENDS_AT_MOST:
            try:
                peer.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                dropped = True
                break
            sent += len(chunk)
        grown = _rss_peak(bridge.pid) - before
        print(f"sent {sent >> 20} MiB of the declared frame; the bridge grew by {grown >> 20} MiB")
        assert dropped, f"the bridge took {sent >> 20} MiB of a declared 8 GiB frame"
        assert grown < GROWS_AT_MOST, grown
    finally:
        bridge.kill()
        bridge.wait(30)
        listener.close()
