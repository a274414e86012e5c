"""A node's own cgroup (:mod:`ma_jupyter.nodehost.cgroup`) on this machine's kernel: a process that
moves in before exec is bounded there, memory it holds unmapped included, and the cgroup goes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ma_jupyter.nodehost import cgroup

WHERE, WHY = cgroup.detect()
needs_cgroup = pytest.mark.skipif(WHERE is None, reason=f"no writable memory cgroup here ({WHY})")

# 192 MiB into a memfd never mapped
HOARD = "import os\nfd = os.memfd_create('x')\nfor _ in range(192): os.write(fd, b'x' * (1 << 20))\n"


def test_a_cgroup_path_below_a_mount_whose_root_is_not_the_hierarchys():
    assert cgroup._folder(("/", "/sys/fs/cgroup/memory"), "/a/b") == "/sys/fs/cgroup/memory/a/b"
    # a cgroup namespace's mount shows its root: the path is relative to it
    assert cgroup._folder(("/a", "/sys/fs/cgroup"), "/a/b") == "/sys/fs/cgroup/b"


def test_names_are_unique_per_node_and_keep_no_path_character():
    name = cgroup.node_name("t-1", 2, "worker/0..")
    assert name.startswith(cgroup.PREFIX) and "/" not in name
    assert name != cgroup.node_name("t-1", 2, "worker-1")


@needs_cgroup
def test_a_process_moved_in_before_exec_is_killed_past_the_limit_and_the_cgroup_goes():
    node = cgroup.NodeCgroup({**WHERE, "name": cgroup.node_name("unit", os.getpid(), "n0")})
    node.create(64 << 20, 64)
    try:
        done = subprocess.run([sys.executable, "-c", HOARD], preexec_fn=node.enter, timeout=120)
        assert done.returncode == -9, done  # the kernel's OOM kill
        assert node.oom_kills() >= 1
        # within the limit: runs to its end, the runner (this process) never moved in
        small = HOARD.replace("192", "8")
        assert (
            subprocess.run([sys.executable, "-c", small], preexec_fn=node.enter, timeout=60).returncode == 0
        )
        assert os.getpid() not in node.pids_in()
    finally:
        assert node.remove()
    assert not os.path.exists(node.memory)


@needs_cgroup
def test_the_sweep_removes_an_old_empty_cgroup_never_one_holding_a_process():
    busy = cgroup.NodeCgroup({**WHERE, "name": cgroup.node_name("unit-sweep", os.getpid(), "busy")})
    left = cgroup.NodeCgroup({**WHERE, "name": cgroup.node_name("unit-sweep", os.getpid(), "left")})
    busy.create(64 << 20, 0)
    left.create(64 << 20, 0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=busy.enter)
    try:
        old = os.stat(busy.memory).st_mtime - 2 * cgroup.SWEEP_AGE
        for folder in (*busy.folders(), *left.folders()):
            os.utime(folder, (old, old))  # as a crashed runner's would be
        removed = cgroup.sweep(WHERE)
        assert os.path.basename(left.memory) in removed and not os.path.exists(left.memory)
        assert os.path.basename(busy.memory) not in removed and os.path.isdir(busy.memory)
    finally:
        child.kill()
        child.wait()
        assert busy.remove()
        left.remove()


def test_without_a_memory_cgroup_the_service_says_why_once_and_nodes_get_none(monkeypatch, capsys):
    from ma_jupyter.nodehost import node_cgroups

    monkeypatch.setattr(cgroup, "_DETECTED", (None, "cannot make a cgroup in /x: Permission denied"))
    monkeypatch.setattr(node_cgroups, "_CGROUP_SAID", False)
    assert node_cgroups.node_cgroup("t-1", 1, "worker-0") is None
    assert node_cgroups.node_cgroup("t-1", 1, "worker-1") is None
    said = capsys.readouterr().err
    assert said.count("no memory cgroup for the nodes here") == 1, said
    assert "Permission denied" in said and "watchdog" in said, said


@needs_cgroup
def test_where_one_can_be_made_each_node_is_told_its_own(monkeypatch):
    from ma_jupyter.nodehost import node_cgroups

    monkeypatch.setattr(node_cgroups, "_CGROUP_SAID", True)  # no sweep from a unit test
    one = node_cgroups.node_cgroup("t-1", 1, "worker-0")
    assert one is not None and one["memory"] == WHERE["memory"]
    assert one["name"] != node_cgroups.node_cgroup("t-1", 2, "worker-0")["name"]
