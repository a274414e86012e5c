"""A Ray cluster whose machines share no disk: two simulated hosts (``two_hosts.py`` with
``private_a``), each in a network namespace and a mount namespace of its own, where each has its
own ``node_root`` (a tmpfs of its own at the same path) and neither sees the service's home (a
tmpfs over it on both); an S3-compatible server (moto's, a process of its own on host A's
address, reached from both hosts).

One 2-node PyTorch (gloo) job reads an ``s3://`` dataset, writes a checkpoint and TensorBoard
event files to ``s3://``, fails after its first attempt's checkpoint and is resumed (its one
requeue) with both hosts again: the rank whose host did not write the checkpoint can only find
it through the bucket.  The service's outputs folder (TensorBoard, the Outputs tab) gets what
the nodes wrote, copied back by their agents, and its TensorBoard shows the scalars of both
attempts.  Before it, a job naming a host path that only the service's machine has is refused
at its launch, naming the Ray node and the path.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import events_text, node_logs
from tests.helpers import wait_for, writable_dir
from tests.ray.two_hosts import A, _free_port

pytestmark = [pytest.mark.ray]

KEY_ID = "AKIDRAYNODISK"
SECRET = "r4y-n0-d1sk-Secret"

TRAIN = """
import os, torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), int(os.environ.get("MA_ATTEMPT", "0"))
numbers = [int(x) for x in open("/workspace/dataset/private/d/numbers.txt").read().split()]
ckpt = "/workspace/outputs/ckpt/model.pt"
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    start = state["step"]
    print(f"rank {rank} attempt {attempt} resumed at step {start} weight {state['w'].item():g}", flush=True)
w = torch.tensor([float(sum(numbers))])
dist.all_reduce(w)
end = start + 5
if rank == 0:
    writer = SummaryWriter("/workspace/outputs/tb")
    for step in range(start, end):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.close()
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    torch.save({"step": end, "w": w}, ckpt + ".tmp")
    os.replace(ckpt + ".tmp", ckpt)
print(f"rank {rank} attempt {attempt} trained to step {end} weight {w.item():g}", flush=True)
dist.barrier()
os._exit(4 if attempt == 0 else 0)  # a fault after the first attempt's checkpoint
"""


@pytest.fixture(scope="module")
def s3_on_a(two_private_hosts):
    """moto's S3 server on host A's address (both hosts reach it), for this module."""
    if two_private_hosts is None:
        yield None
        return
    here = Path(sys.executable).parent / "moto_server"
    found = str(here) if here.exists() else shutil.which("moto_server")
    if found is None:
        pytest.fail("moto_server is missing: ./dev setup installs it (the test extra's moto[server])")
    port = _free_port()
    log = open(Path(two_private_hosts.temp) / "moto.log", "wb")
    proc = subprocess.Popen([found, "-H", A, "-p", str(port)], stdout=log, stderr=log, start_new_session=True)
    url = f"http://{A}:{port}"

    def up():
        try:
            return requests.get(f"{url}/moto-api/", timeout=2).status_code == 200
        except requests.RequestException:
            return proc.poll() is not None and pytest.fail("moto_server exited")

    try:
        wait_for(up, timeout=90)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _bucket(endpoint: str, name: str):
    from obstore.store import S3Store

    requests.put(f"{endpoint}/{name}", timeout=10).raise_for_status()
    return S3Store(
        name,
        config={
            "access_key_id": KEY_ID,
            "secret_access_key": SECRET,
            "endpoint": endpoint,
            "region": "us-east-1",
        },
        client_options={"allow_http": True},
    )


def test_a_resumed_s3_job_on_hosts_that_share_no_disk(
    service_on_private, two_private_hosts, s3_on_a, ma_home, tmp_path
):
    import obstore

    hosts = two_private_hosts
    node_root = f"{hosts.private}/nodes"
    (ma_home / "cluster.toml").write_text(
        (ma_home / "cluster.toml").read_text()
        + f'\n[storage]\nallow_endpoints = ["{s3_on_a}"]\nupload_interval = 1\n'
    )
    hosts.hide(str(ma_home))  # neither Ray node sees the service's home (jobs, prepared data)
    svc = service_on_private(node_root)
    client = Client(autostart=False)
    session = svc.session()
    data = _bucket(s3_on_a, "data")
    obstore.put(data, "set/numbers.txt", b"1 2 3 4")
    out = _bucket(s3_on_a, "ckpt")
    creds = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": s3_on_a}
    algo = writable_dir(tmp_path / "algo")
    (algo / "train.py").write_text(textwrap.dedent(TRAIN))

    # a host path only the service's machine has (the Ray nodes see an empty folder above it)
    only_here = writable_dir(tmp_path / "service-only" / "data", parents=True)
    (only_here / "x").write_text("x")
    hosts.hide(str(only_here.parent))
    refused = client.submit(
        name="lacks", specs=["cpu.small"], datasets=[{"name": "d", "path": str(only_here)}], command="true"
    ).wait(timeout=180, check=False)
    said = events_text(client, refused.id)
    assert refused.status is not JobStatus.succeeded, said
    assert f"has no dataset {only_here}" in said and "Ray node ray-" in said, said

    posted = session.post(
        f"{svc.api}/jobs",
        json={
            "name": "nodisk",
            "mode": "pytorch",
            "nodes": 2,
            "specs": ["cpu.small"],
            "algorithm": str(algo),
            "command": "python /workspace/algorithm/train.py",
            "datasets": [{"name": "d", "path": "s3://data/set"}],
            "outputs": "s3://ckpt/run",
            "checkpoint_resume": {"max_resumes": 1, "grace_period": 5},
            "storage_credentials": creds,
        },
        timeout=60,
    )
    assert posted.status_code == 201, posted.text
    job_id = posted.json()["id"]
    job = client.job(job_id).wait(timeout=480, check=False)
    logs = node_logs(client, job_id)
    told = events_text(client, job_id)
    assert job.status is JobStatus.succeeded and job.attempt == 1, told + logs
    assert len({n.host for n in job.nodes}) == 2, job.nodes
    # both ranks of the resumed attempt found the checkpoint: at least one on the host that did
    # not write it, whose node_root never held it
    for rank in (0, 1):
        assert f"rank {rank} attempt 1 resumed at step 5 weight 20" in logs, logs
    assert "rank 0 attempt 1 trained to step 10" in logs, logs
    assert "on Ray node ray-" in told and "downloaded" in told, told  # downloaded on the nodes
    # each node's download progress (bytes, objects, rate) in the job's events, as on the service
    progress = re.findall(
        r"datasets d: downloading s3://data/set: [\d.]+ of [\d.]+ MB, 1 of 1 objects, [\d.]+ MB/s "
        r"on Ray node (ray-\S+)",
        told,
    )
    assert len(set(progress)) == 2, told
    assert SECRET not in told + logs

    # in the bucket: the last checkpoint and both attempts' event files
    keys = {o["path"] for page in obstore.list(out, prefix="run/") for o in page}
    assert "run/ckpt/model.pt" in keys, keys
    assert len([k for k in keys if k.startswith("run/tb/events.out.tfevents.")]) == 2, keys
    # on the service's machine, copied back by the agents: what TensorBoard and the Outputs tab read
    here = ma_home / "jobs" / job_id / "outputs"
    assert (here / "ckpt" / "model.pt").is_file()
    assert len(list((here / "tb").glob("events.out.tfevents.*"))) == 2
    shown = session.post(f"{svc.api}/jobs/{job_id}/tensorboard", timeout=120)
    assert shown.status_code == 200, shown.text
    url = shown.json()["url"]

    def scalars() -> list | None:
        got = requests.get(
            f"{url}data/plugin/scalars/scalars", params={"run": "tb", "tag": "loss"}, timeout=10
        )
        steps = [int(point[1]) for point in got.json()] if got.status_code == 200 else []
        return steps if len(steps) >= 10 else None

    assert sorted(wait_for(scalars, timeout=120, interval=0.5)) == list(range(10))
