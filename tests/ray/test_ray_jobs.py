"""Jobs on a real Ray cluster of two nodes: the same semantics as the local backend.

Every test runs inside a private network namespace (see ``conftest.py``), with a real Ray
cluster, a real job service on the Ray backend, and real node processes on the Ray nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import PS_WORKER, events_text, job_processes, node_logs
from tests.fixtures.real_jobs import writable_algorithm as _algorithm
from tests.helpers import wait_for, writable_dir

pytestmark = [pytest.mark.ray]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DDP = """
import json, os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ["MA_ATTEMPT"])
ckpt = "/workspace/outputs/ckpt.txt"
if attempt == 0 and rank == 0:
    open(ckpt, "w").write("step 7")
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
info = {"rank": rank, "world": world, "sum": value.item(), "host": socket.gethostname(),
        "master": os.environ["MASTER_ADDR"], "carried": open(ckpt).read() if attempt else ""}
with open(f"/workspace/outputs/rank-{rank}.json", "w") as fh:
    json.dump(info, fh)
print(f"rank {rank}/{world} sum={value.item()}", flush=True)
# the result is written: never depend on gloo's teardown (it may abort at exit); a fault after
# the first attempt's checkpoint
os._exit(3 if attempt == 0 else 0)
"""

FAIL = """
import sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1 gives up", flush=True)
    sys.exit(3)
time.sleep(600)  # only the failure of rank 1 can end this job quickly
"""


def _cli(home, *args, timeout=120):
    env = {**os.environ, "MA_JUPYTER_HOME": str(home), "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _placement_groups(part, states=("PENDING", "CREATED", "RESCHEDULING")):
    """The platform's placement groups whose name holds ``part`` (``-<job id>-``) in one of
    ``states`` (seen by the test's driver); only a ``CREATED`` group holds resources."""
    import ray.util

    return [
        pg
        for pg in ray.util.placement_group_table().values()
        if pg["name"].startswith("ma-") and part in pg["name"] and pg["state"] in states
    ]


def test_two_node_gloo_ddp_has_one_job_node_on_each_ray_node(ray_service, ray_home, ray_driver, tmp_path):
    # the job folders on the Ray nodes lie apart from the service's: logs are read through the agents
    node_root = tmp_path / "on-ray-nodes"
    toml = ray_home / "cluster.toml"
    toml.write_text(toml.read_text() + f'node_root = "{node_root}"\n')
    ray_service.proc.terminate()
    ray_service.proc.wait(30)
    svc = ray_service.restart()
    client = Client(autostart=False)
    handle = client.submit(
        name="ddp",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", ddp=DDP),
        command="python /workspace/algorithm/ddp.py",
        fault_restart={"max_restarts": 1},
    )
    job = handle.wait(timeout=240, check=False)
    told = events_text(client, job.id)
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + told
    assert (job.attempt, job.restarts) == (1, 1)
    # the job's own outputs folder, copied back to the service's job folder by the agents
    outputs = ray_home / "jobs" / job.id / "outputs"
    shown = json.loads(_cli(ray_home, "get", job.id, "--json").stdout)
    ray_nodes = {n.name for n in client.nodes()}
    hosts = [n["host"] for n in shown["nodes"]]
    assert shown["backend"] == "ray"
    assert len(set(hosts)) == 2 and set(hosts) == ray_nodes, hosts
    results = [json.loads((outputs / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [(r["world"], r["sum"], r["host"], r["carried"]) for r in results] == [
        (2, 3.0, "worker-0", "step 7"),
        (2, 3.0, "worker-1", "step 7"),
    ]
    # the restarted attempt's nodes got the service's copy of the outputs folder before they
    # started (contract rule 30: node_root is not the service's folder), with its modification
    # time, and the copy back did not bring it back
    assert "file(s) of the service's copy" in told and "on Ray node ray-" in told, told
    carried = node_root / job.id / "outputs" / "ckpt.txt"
    assert carried.stat().st_mtime_ns == (outputs / "ckpt.txt").stat().st_mtime_ns
    assert results[0]["master"] == "10.253.0.1"  # its machine on the job's overlay (docs/network.md)
    for rank, node in ((0, "worker-0"), (1, "worker-1")):
        assert f"rank {rank}/2 sum=3.0" in client.read_log(job.id, node=node, rank=rank).data
        assert f"rank {rank}/2" in client.read_log(job.id, node=node).data
    # the code was shipped into each node's own folder on its Ray node, and the logs live there
    for node in ("worker-0", "worker-1"):
        assert (node_root / job.id / "nodes" / node / "algorithm" / "ddp.py").is_file()
        assert (node_root / job.id / "logs" / f"{node}.log").is_file()
        assert not (ray_home / "jobs" / job.id / "logs" / f"{node}.log").exists()
    # the attempt's placement group is gone with it
    assert _placement_groups(f"-{job.id}-") == []
    # deleting the job removes its folders on the Ray nodes too
    client.delete(job.id)
    wait_for(lambda: not (node_root / job.id).exists(), timeout=30)
    assert node_root.is_dir()  # only the job's own folder went
    assert svc.proc.poll() is None


def test_a_live_log_is_followed_through_the_service_and_stop_leaves_no_process(
    ray_service, ray_driver, tmp_path
):
    code = """
    import os, subprocess, sys, time
    # a child in its own session that ignores TERM: stop must still leave nothing
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
                     start_new_session=True)
    for i in range(600):
        print(f"tick {i}", flush=True)
        time.sleep(0.2)
    """
    client = Client(autostart=False)
    handle = client.submit(
        name="live",
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", live=code),
        command="python live.py",
        grace_period=2,
    )
    session = ray_service.session()
    offset, seen = 0, ""
    while "tick 3" not in seen:
        chunk = session.get(
            f"{ray_service.api}/jobs/{handle.id}/logs/read",
            params={"node": "worker-0", "offset": offset, "wait": 10},
            timeout=30,
        ).json()
        assert not chunk["eof"], seen
        assert chunk["offset"] == offset
        seen += chunk["data"]
        offset = chunk["next_offset"]
    assert client.get(handle.id).status is JobStatus.running  # followed while it runs
    assert [line for line in seen.splitlines() if line.startswith("tick")][:4] == [
        f"tick {i}" for i in range(4)
    ]
    assert job_processes(handle.id)
    assert _placement_groups(f"-{handle.id}-", states=("CREATED",))  # held while it runs
    handle.stop()
    job = handle.wait(timeout=120, check=False)
    assert job.status is JobStatus.stopped
    assert job_processes(handle.id) == []
    wait_for(lambda: _placement_groups(f"-{handle.id}-") == [], timeout=30)


def test_tensorflow_ps_worker_ends_with_the_parameter_server_stopped(ray_service, tmp_path):
    """Also: the parameter server shares a Ray node with a worker, and each is still a machine of
    its own on the job's overlay (issue 38 item 1): its own address on its own interface, named
    by TF_CONFIG, reached by the worker beside it."""
    outputs = writable_dir(tmp_path / "out")
    client = Client(autostart=False)
    handle = client.submit(
        name="ps-worker",
        mode="tensorflow",
        nodes=2,
        ps=1,
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", train=PS_WORKER),
        outputs=str(outputs),
        command=(
            'sh -c \'hostname -I > /workspace/outputs/addr-$(hostname).txt && echo "$TF_CONFIG" '
            "> /workspace/outputs/tf-$(hostname).json && exec python /workspace/algorithm/train.py'"
        ),
    )
    job = handle.wait(timeout=300, check=False)
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
    for index in range(2):
        result = json.loads((outputs / f"ps-worker-{index}.json").read_text())
        assert result["device"] == "/job:ps/replica:0/task:0/device:CPU:0"
    workers = {n.host for n in job.nodes if n.role == "worker"}
    assert len(workers) == 2  # workers spread, one per Ray node
    ps = next(n for n in job.nodes if n.role == "ps")
    assert ps.host in workers  # beside a worker, on one Ray node
    addresses = {n.name: n.address for n in job.nodes}
    assert len(set(addresses.values())) == 3, addresses  # each its own
    for name, address in addresses.items():
        # `hostname -I` prints the node's own address, and only it
        assert (outputs / f"addr-{name}.txt").read_text().split() == [address], name
        cluster = json.loads((outputs / f"tf-{name}.json").read_text())["cluster"]
        # TF_CONFIG names those addresses
        assert {h.rsplit(":", 1)[0] for h in cluster["ps"] + cluster["worker"]} == set(addresses.values())
    # the parameter server never ends by itself: the service stopped it (TERM: exit code 143)
    assert (ps.state, ps.exit_code) == ("exited", 143), ps
    assert "ps serving" in client.read_log(job.id, node="ps-0").data
    assert job_processes(job.id) == []


def test_a_failed_rank_ends_the_job_in_error_with_no_process_left(ray_service, tmp_path):
    client = Client(autostart=False)
    handle = client.submit(
        name="fail",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", fail=FAIL),
        command="python /workspace/algorithm/fail.py",
    )
    job = handle.wait(timeout=240, check=False)
    assert job.status is JobStatus.error, node_logs(client, job.id)
    assert "rank 1 gives up" in client.read_log(job.id, node="worker-1", rank=1).data
    assert "rank 1 exited with code 3" in events_text(client, job.id)
    wait_for(lambda: job_processes(job.id) == [], timeout=30)


def test_a_write_above_the_working_directory_on_a_ray_node_names_the_mount_and_the_fix(ray_service, tmp_path):
    client = Client(autostart=False)
    handle = client.submit(
        name="mnist-data",
        algorithm=_algorithm(tmp_path / "algo", train="import os\nos.makedirs('../data', exist_ok=True)\n"),
        command="python train.py",
    )
    job = handle.wait(timeout=240, check=False)
    assert job.status is JobStatus.error, node_logs(client, job.id)
    first = job.reason.splitlines()[0]
    assert "/workspace/data (written ../data) is in /workspace itself" in first, first
    assert "/workspace/outputs" in first and "--volume NAME=PATH" in first


def test_kill_9_of_the_service_mid_job_then_a_restart_ends_the_job_with_every_line(ray_service, tmp_path):
    code = """
    import time
    for i in range(80):
        print(f"line {i}", flush=True)
        time.sleep(0.25)
    """
    client = Client(autostart=False)
    handle = client.submit(
        name="survive",
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", count=code),
        command="python count.py",
    )
    wait_for(lambda: "line 2" in client.read_log(handle.id, node="worker-0").data, timeout=120)
    ray_service.proc.send_signal(signal.SIGKILL)
    ray_service.proc.wait()
    time.sleep(2)  # lines keep being written on the Ray node while no service runs
    again = ray_service.restart()
    client = Client(autostart=False)
    job = client.get(handle.id)
    assert job.status in (JobStatus.running, JobStatus.succeeded)
    job = client.job(handle.id).wait(timeout=120, check=False)
    assert job.status is JobStatus.succeeded, events_text(client, job.id)
    lines = client.read_log(job.id, node="worker-0").data.splitlines()
    assert [line for line in lines if line.startswith("line ")] == [f"line {i}" for i in range(80)]
    assert "service restarted: re-attached to 1 running node(s) worker-0" in events_text(client, job.id)
    assert again.proc.poll() is None


def test_a_job_that_does_not_fit_waits_holding_nothing(ray_service, ray_driver, ray_cluster, tmp_path):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    client = Client(autostart=False)
    algo = _algorithm(tmp_path / "algo", wait="import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    # another user of the cluster holds every CPU of one node: our scheduler cannot see that
    node = client.nodes()[0]
    node_id = next(n["NodeID"] for n in ray.nodes() if n["NodeID"].startswith(node.name[4:]))
    theirs = placement_group(
        [{"CPU": 2}], name="someone-else", bundle_label_selector=[{"ray.io/node-id": node_id}]
    )
    assert theirs.wait(30)
    try:
        first = client.submit(
            name="gang",
            mode="pytorch",
            nodes=2,
            specs=["cpu.medium"],
            algorithm=algo,
            command="python wait.py",
        )
        try:
            wait_for(lambda: "waiting for resources" in events_text(client, first.id), timeout=60)
        except AssertionError:
            raise AssertionError(events_text(client, first.id) + str(client.get(first.id))) from None
        time.sleep(3)  # several tries: each one gives its placement group back
        assert client.get(first.id).status is JobStatus.queued
        assert _placement_groups(f"-{first.id}-", states=("CREATED",)) == []  # it holds no node
        # a second job of the same size queues behind it
        second = client.submit(
            name="gang2",
            mode="pytorch",
            nodes=2,
            specs=["cpu.medium"],
            algorithm=algo,
            command="python wait.py",
        )
    finally:
        remove_placement_group(theirs)
    wait_for(lambda: client.get(first.id).status is JobStatus.running, timeout=60)
    (group,) = _placement_groups(f"-{first.id}-")
    # each bundle holds the spec's cores and memory (cpu.medium: 2 cores, 4 GB)
    bundles = list(group["bundles"].values())
    assert [(b["CPU"], b.get("memory")) for b in bundles] == [(2.0, 4.0 * 2**30)] * 2, bundles
    assert group["strategy"] == "STRICT_SPREAD", group  # its two workers never share a Ray node
    time.sleep(2)
    assert client.get(second.id).status is JobStatus.queued  # the first holds both nodes
    assert _placement_groups(f"-{second.id}-", states=("CREATED",)) == []
    client.stop(first.id)
    wait_for(lambda: client.get(second.id).status is JobStatus.running, timeout=90)
    client.stop(second.id)
    assert client.wait_status(second.id, since="running", wait=60).status is JobStatus.stopped


def test_the_inventory_follows_nodes_joining_and_leaving(ray_service, ray_cluster, tmp_path):
    client = Client(autostart=False)
    assert len(client.nodes()) == 2
    # a spec no Ray node can hold is refused at submit, saying why
    refused = ray_service.session().post(
        f"{ray_service.api}/jobs",
        json={"name": "huge", "command": "true", "nodes": 3, "mode": "pytorch", "specs": ["cpu.small"]},
        timeout=30,
    )
    assert refused.status_code == 400 and "2 node(s) can hold it, 3 needed" in refused.json()["message"]
    horovod = ray_service.session().post(
        f"{ray_service.api}/jobs",
        json={"name": "mpi", "command": "python x.py", "nodes": 2, "mode": "horovod", "specs": ["cpu.small"]},
        timeout=30,
    )
    # MPI gets its remote shell over the overlay (each node's sshd): accepted, then stopped
    assert horovod.status_code == 201, horovod.text
    stopped = ray_service.session().post(f"{ray_service.api}/jobs/{horovod.json()['id']}/stop", timeout=30)
    assert stopped.status_code == 200, stopped.text
    extra = ray_cluster.add_node(num_cpus=4)
    try:
        nodes = wait_for(lambda: [n for n in client.nodes() if n.cpus == 4], timeout=60)
        assert len(client.nodes()) == 3 and nodes[0].name.startswith("ray-")
        shown = _cli(ray_service.home, "nodes")
        assert shown.returncode == 0 and nodes[0].name in shown.stdout
    finally:
        ray_cluster.remove_node(extra)
    wait_for(lambda: len(client.nodes()) == 2, timeout=90)


def test_service_start_with_backend_options(ma_home, ray_cluster):
    started = _cli(
        ma_home, "service", "start", "--backend", "ray", "--ray-address", ray_cluster.address, timeout=180
    )
    assert started.returncode == 0, started.stderr
    assert "ray backend" in started.stdout
    status = json.loads(_cli(ma_home, "service", "status", "--json").stdout)
    assert status["backend"] == "ray"
    conflict = _cli(ma_home, "service", "start", "--backend", "local")
    assert conflict.returncode != 0 and "already runs" in conflict.stderr
    assert _cli(ma_home, "service", "stop").returncode == 0
    try:
        requests.get(status["url"], timeout=2)
        raise AssertionError("the service still answers")
    except requests.ConnectionError:
        pass


def test_a_job_node_whose_ray_node_leaves_is_lost_and_the_job_ends_in_error(
    ray_service, ray_cluster, tmp_path
):
    client = Client(autostart=False)
    before = {n.name for n in client.nodes()}
    extra = ray_cluster.add_node(num_cpus=2)
    removed = False
    try:
        name = wait_for(lambda: ({n.name for n in client.nodes()} - before) or None, timeout=60).pop()
        handle = client.submit(
            name="doomed",
            specs=["cpu.small"],
            node_name=name,
            algorithm=_algorithm(
                tmp_path / "algo", wait="import time\nprint('up', flush=True)\ntime.sleep(600)\n"
            ),
            command="python wait.py",
        )
        wait_for(lambda: "up" in client.read_log(handle.id, node="worker-0").data, timeout=120)
        pids = job_processes(handle.id)
        assert client.get(handle.id).nodes[0].host == name
        ray_cluster.remove_node(extra)
        removed = True
        job = handle.wait(timeout=120, check=False)
        assert job.status is JobStatus.error
        assert job.nodes[0].state == "lost", events_text(client, job.id)
        assert "node worker-0 was lost" in events_text(client, job.id)
        assert "left the cluster" in events_text(client, job.id)
        wait_for(lambda: name not in {n.name for n in client.nodes()}, timeout=60)
        # the machine of the removed Ray node lives on: its runner ended the node with its raylet
        wait_for(lambda: job_processes(handle.id) == [], timeout=30)
        assert "ended with it" in events_text(client, job.id)
    finally:
        if not removed:
            ray_cluster.remove_node(extra)
        for pid in job_processes(handle.id) if "handle" in locals() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert pids


TENSORBOARD = """
import os
from torch.utils.tensorboard import SummaryWriter

print(f"nice {os.nice(0)}", flush=True)

writer = SummaryWriter("/workspace/outputs/train")
for step in range(3):
    writer.add_scalar("loss", 1.0 / (step + 1), step)
writer.close()
print("scalars written", flush=True)
"""


def test_tensorboard_serves_what_a_job_on_a_ray_node_wrote(ray_service, tmp_path):
    # the outputs folder is at the same path on every Ray node (the docs' rule for outputs)
    outputs = writable_dir(tmp_path / "out")
    client = Client(autostart=False)
    handle = client.submit(
        name="tb",
        specs=["cpu.small"],
        algorithm=_algorithm(tmp_path / "algo", tb=TENSORBOARD),
        outputs=str(outputs),
        command="python /workspace/algorithm/tb.py",
    )
    job = handle.wait(timeout=180, check=False)
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
    assert client.get(job.id).backend == "ray"
    # Ray runs its workers at nice 15; the job's node runs at normal priority, as locally
    assert "nice 0" in client.read_log(job.id, node="worker-0").data
    url = client.tensorboard(job.id)
    try:
        wait_for(lambda: requests.get(url + "data/runs", timeout=10).json() == ["train"], timeout=60)
        points = requests.get(
            url + "data/plugin/scalars/scalars", params={"run": "train", "tag": "loss"}, timeout=10
        ).json()
        assert [p[1] for p in points] == [0, 1, 2]
    finally:
        client.stop_tensorboard(job.id)


def test_caches_on_the_ray_nodes_and_the_single_copy_warning(ray_service, tmp_path):
    client = Client(autostart=False)
    algo = _algorithm(
        tmp_path / "algo",
        fill="import os\n"
        "folder = os.path.expanduser('~/.cache/models')\n"
        "os.makedirs(folder, exist_ok=True)\n"
        "open(os.path.join(folder, 'weights.bin'), 'wb').write(b'x' * 100_000)\n"
        "print('cached', flush=True)\n",
    )
    # two nodes of a script that knows nothing of distribution: the warning reads the code here
    plan = client.plan(
        name="fill", mode="pytorch", nodes=2, specs=["cpu.small"], algorithm=algo, command="python fill.py"
    )
    assert any("its own copy of the whole training" in note for note in plan.notes), plan.notes
    job = client.submit(
        name="fill", mode="pytorch", nodes=2, specs=["cpu.small"], algorithm=algo, command="python fill.py"
    ).wait(timeout=180, check=False)
    assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
    assert "its own copy of the whole training" in events_text(client, job.id)
    # each machine keeps its copy of the user's ~/.cache (here both Ray nodes share one)
    (held,) = client.cache()
    assert held.bytes == 100_000 and held.files == 1, held
    assert held.path.endswith("on 1 machine(s)")
    cleared = client.clear_cache()
    assert cleared.bytes == 100_000
    assert all(c.bytes == 0 for c in client.cache())
