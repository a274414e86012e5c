"""Holds on a Ray node's object storage cache (``backends/ray/objects.py`` rule 4) where the
``node_root`` is shared storage, so every Ray node's agent sweeps the same cache: the sweep runs
for real on a cache folder and job folders laid out as the agents lay them out."""

from __future__ import annotations

import os
import subprocess
import time

from ma_jupyter.backends.ray import objects
from ma_jupyter.models import NodeRun


def test_a_copy_held_by_a_job_running_on_another_ray_node_of_a_shared_node_root_stays(tmp_path):
    """Machine A sweeps the shared cache while job B's node runs on machine B: B's runner is no
    process of A's, yet its copy is neither released nor removed; once B's node wrote its exit
    code the hold goes and the retention counts from then.  A record A itself wrote, naming a
    runner that is gone without an exit code (a crashed node), holds nothing."""
    root = tmp_path / "node_root"  # the same folder on every machine
    entry = root / objects.CACHE / "k1"
    (entry / "data").mkdir(parents=True)
    (entry / "data" / "x.bin").write_bytes(b"job b's data")
    hold = entry / objects.HOLDS / "job-b"
    hold.parent.mkdir()
    hold.touch()
    gone = subprocess.Popen(["true"])  # a pid that ran and no longer does
    gone.wait()
    for job, node, host in (("job-b", "worker-0", "ray-bbbbbbbb"), ("job-c", "worker-0", "ray-aaaaaaaa")):
        folder = root / job / "nodes" / node
        folder.mkdir(parents=True)
        run = NodeRun(name=node, host=host, pid=gone.pid, start_time=1.0, state="running")
        (folder / "run.json").write_text(run.model_dump_json())
    crashed = entry.parent / "k2"  # job C's copy: its node ran on A and crashed
    (crashed / "data").mkdir(parents=True)
    (crashed / objects.HOLDS).mkdir()
    (crashed / objects.HOLDS / "job-c").touch()
    old = time.time() - objects.LAUNCH_GRACE - 8 * 86400
    for path in (hold, entry, crashed / objects.HOLDS / "job-c", crashed):
        os.utime(path, (old, old))

    objects._sweep(root, 60.0, "ray-aaaaaaaa")
    assert hold.exists() and (entry / "data" / "x.bin").read_bytes() == b"job b's data", "removed under B"
    assert not (crashed / objects.HOLDS / "job-c").exists() and crashed.exists()  # retention from now

    (root / "job-b" / "nodes" / "worker-0" / "exit_code").write_text("0")
    objects._sweep(root, 60.0, "ray-aaaaaaaa")
    assert not hold.exists() and entry.exists()
    os.utime(entry, (old, old))
    objects._sweep(root, 60.0, "ray-aaaaaaaa")
    assert not entry.exists()


def test_another_agents_fetch_of_a_key_keeps_this_agents_sweep_off_its_entry(tmp_path):
    """Two agents share one cache (Ray nodes of one machine, or a ``node_root`` on shared
    storage): while the other agent's fetch has the key (it resumes an old download there, or
    reuses an old copy before it holds it), this agent's sweep leaves the entry alone; once it is
    free, an unheld copy past the retention goes, its lock file with it."""
    import sys

    root = tmp_path / "node_root"
    cache = root / objects.CACHE
    entry = cache / "k1"
    (entry / objects.DOWNLOADING).mkdir(parents=True)
    (entry / objects.DOWNLOADING / "part-of-it").write_bytes(b"resumed")
    old = time.time() - 8 * 86400
    os.utime(entry, (old, old))
    other = subprocess.Popen(  # the other agent: the key's lock, as its fetch takes it
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
            str(cache / "k1.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "locked\n"
        objects._sweep(root, 60.0, "ray-aaaaaaaa")
        assert (entry / objects.DOWNLOADING / "part-of-it").read_bytes() == b"resumed", "swept mid-download"
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    objects._sweep(root, 60.0, "ray-aaaaaaaa")
    assert sorted(p.name for p in cache.iterdir()) == []
