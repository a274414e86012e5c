"""The Ray backend's parts that need no cluster: the inventory from Ray's node records,
shipping the algorithm folder, a node's fence deny list, and the failure report of a node whose
Ray node left."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from types import SimpleNamespace

import pytest

from ma_jupyter.backends.ray import fence, logs, ship
from ma_jupyter.backends.ray.inventory import inventory, node_name, ray_nodes
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.jobdir import JobDir

RECORDS = [
    {
        "NodeID": "09672a71811266e36453365e12ab7c8cc9121db7b7e18b03bf7513ca",
        "Alive": True,
        "NodeManagerAddress": "10.0.0.5",
        "NodeManagerHostname": "head",
        "Resources": {"CPU": 8.0, "memory": 32 * 2**30, "GPU": 2.0, "node:10.0.0.5": 1.0},
    },
    {
        "NodeID": "98e7cb04d00c1fe43527733e7e9e3e7540c15e57ae487bd16f18cc1f",
        "Alive": True,
        "NodeManagerAddress": "10.0.0.6",
        "NodeManagerHostname": "npu-box",
        "Resources": {"CPU": 4.0, "memory": 8 * 2**30, "NPU": 8.0},
    },
    {
        "NodeID": "5e5e5e5e00000000000000000000000000000000000000000000000",
        "Alive": False,
        "NodeManagerAddress": "10.0.0.7",
        "Resources": {"CPU": 4.0, "memory": 2**30},
    },
]


def test_live_ray_nodes_become_inventory_nodes_with_their_cards():
    nodes = inventory(RECORDS)
    assert [n.name for n in nodes] == ["ray-09672a71", "ray-98e7cb04"]
    head, npu = nodes
    assert (head.cpus, head.memory_gb, head.accelerators, head.accelerator_type) == (8.0, 32.0, 2, "gpu")
    assert (npu.cpus, npu.memory_gb, npu.accelerators, npu.accelerator_type) == (4.0, 8.0, 8, "npu")
    assert head.pools == ["default"]


def test_every_ray_node_is_known_with_its_address_even_once_dead():
    found = {n.name: n for n in ray_nodes(RECORDS)}
    assert found[node_name(RECORDS[2]["NodeID"])].alive is False
    assert (found["ray-98e7cb04"].address, found["ray-98e7cb04"].accelerator) == ("10.0.0.6", "NPU")
    assert found["ray-09672a71"].accelerator == "GPU"


def test_the_algorithm_folder_is_shipped_whole_and_replaces_an_earlier_copy(tmp_path):
    source = tmp_path / "algo"
    (source / "pkg").mkdir(parents=True)
    (source / "train.py").write_text("print('hi')\n")
    (source / "pkg" / "util.py").write_text("X = 1\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    os.symlink("train.py", source / "link.py")
    target = tmp_path / "node" / "algorithm"
    target.mkdir(parents=True)
    (target / "stale.py").write_text("old attempt\n")
    ship.unpack(ship.pack(source), target)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "link.py",
        "pkg",
        "pkg/util.py",
        "run.sh",
        "train.py",
    ]
    assert (target / "link.py").read_text() == "print('hi')\n"
    assert os.access(target / "run.sh", os.X_OK)
    assert not (tmp_path / "node" / "algorithm.partial").exists()


def test_an_archive_reaching_out_of_its_folder_is_refused(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        data = b"out"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.TarError):
        ship.unpack(buffer.getvalue(), tmp_path / "node" / "algorithm")
    assert not (tmp_path / "node" / "escape.txt").exists()
    assert not (tmp_path / "node" / "algorithm.partial").exists()


def test_a_folder_too_big_to_ship_is_refused_naming_the_field(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * 2048)
    assert ship.folder_size(tmp_path, limit=4096) == 2048
    with pytest.raises(InvalidSpec) as caught:
        ship.folder_size(tmp_path, limit=1024)
    assert caught.value.field == "algorithm" and "dataset" in caught.value.message


def _denied(ranges: list[list[int]], port: int) -> bool:
    return any(low <= port <= high for low, high in ranges)


def test_a_jobs_own_port_leaves_the_deny_list_only_where_it_is_no_cluster_port():
    """The fence's rule is by port on every address: a job's own (reserved) port that is also a
    port of the cluster (some other machine's raylet, say) stays denied; one that only this
    machine's listeners hold is the job's to reach."""
    with socket.socket() as listener:  # listening here now: denied unless it is the job's own
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        local = listener.getsockname()[1]
        cluster_port = 6379 if local != 6379 else 6380
        task = SimpleNamespace(ports=[local, cluster_port])
        attempt = SimpleNamespace(job_id="fence-test", number=0, plans=[SimpleNamespace(task=task)])
        ranges = fence.node_deny_list([cluster_port, 8265], attempt)
    assert _denied(ranges, cluster_port) and _denied(ranges, 8265)
    assert not _denied(ranges, local)
    assert _denied(ranges, 10002) and _denied(ranges, 19999)  # Ray's default worker ports


def test_every_raylet_of_the_machine_gives_its_worker_range_to_the_deny_list(tmp_path):
    """Two raylets on one machine (``ray.cluster_utils`` runs them so): a worker either starts
    later listens in its raylet's range, so a node's fence denies both ranges, not only its own
    raylet's."""
    raylet = tmp_path / "raylet"  # a process the kernel names "raylet", with a raylet's flags
    raylet.symlink_to(sys.executable)  # the kernel names a process after the path it ran
    code = "import time; print('ready', flush=True); time.sleep(60)"
    args = ["-c", code, "--min_worker_port=30100", "--max_worker_port=30199"]
    proc = subprocess.Popen([str(raylet), *args], stdout=subprocess.PIPE)
    try:
        # its own first line, not Popen's return, proves the exec is complete: until then the
        # kernel may still show the child under its parent's name (seen under load)
        assert proc.stdout.readline() == b"ready\n"
        attempt = SimpleNamespace(job_id="fence-test", number=0, plans=[])
        ranges = fence.node_deny_list([], attempt)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert _denied(ranges, 30100) and _denied(ranges, 30150) and _denied(ranges, 30199)


def _node_dir(tmp_path):
    jd = JobDir(tmp_path / "job")
    node = jd.node("worker-0")
    node.root.mkdir(parents=True)
    node.heartbeat.touch()
    return jd, node


class _Runner(threading.Thread):
    """A runner still beating (its heartbeat's time moves every 0.2 s), which writes its
    failure report after ``report_after`` seconds (never: None)."""

    def __init__(self, node, report_after: float | None):
        super().__init__(daemon=True)
        self.node, self.report_after, self.done = node, report_after, threading.Event()

    def run(self) -> None:
        began, beats = time.monotonic(), 0
        while not self.done.wait(0.2):
            beats += 1
            os.utime(self.node.heartbeat, (1_000_000 + beats, 1_000_000 + beats))  # another clock
            if self.report_after is not None and time.monotonic() - began >= self.report_after:
                self.node.failure.write_text('{"reason": "the raylet ended: x ended with it"}')
                return


def test_a_report_a_still_beating_runner_writes_after_its_ray_node_left_is_waited_for(tmp_path):
    # the cluster told the service first; the runner saw its raylet end a moment later
    jd, node = _node_dir(tmp_path)
    runner = _Runner(node, report_after=0.5)
    runner.start()
    try:
        assert logs.runner_failure(jd, "worker-0") == "the raylet ended: x ended with it"
    finally:
        runner.done.set()


def test_a_runner_that_stopped_beating_is_not_waited_for(tmp_path):
    jd, node = _node_dir(tmp_path)
    # its report, written after the look, is not seen: the look ended on no beat
    later = threading.Timer(
        logs.RUNNER_BEAT_LOOK + 1.0, lambda: node.failure.write_text('{"reason": "late"}')
    )
    later.start()
    try:
        assert logs.runner_failure(jd, "worker-0") is None
    finally:
        later.cancel()


def test_a_beating_runner_that_writes_nothing_is_waited_for_a_bounded_time(tmp_path):
    jd, node = _node_dir(tmp_path)
    runner = _Runner(node, report_after=None)
    runner.start()
    try:
        assert logs.runner_failure(jd, "worker-0") is None  # it returns: the wait is bounded
    finally:
        runner.done.set()
