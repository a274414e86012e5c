"""The spec's memory per node is enforced on real processes: a node past it is killed and its
job ends in error saying which limit on which node; a job within it runs to its end."""

from __future__ import annotations

import os
import re
import shlex
import sys

import pytest

from ma_jupyter.nodehost import cgroup
from tests.fixtures.service_api import full_log, submit, wait_for, wait_status
from tests.fixtures.service_process import module_home, start_service, stop_services

PY = sys.executable
SMALL_MEMORY = """
[[spec]]
name = "cpu.quarter"
cpus = 1
memory_gb = 0.25

[[node]]
name = "only"
cpus = 2
memory_gb = 4
"""
# 400 MiB, every page written (a zero-filled allocation would not be resident)
GREEDY = "import time; block = b'x' * (400 << 20); print('allocated', flush=True); time.sleep(30)"
# the limit counts the node's whole process tree, not just its first process
GREEDY_CHILD = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {GREEDY!r}]))"


@pytest.fixture(scope="module")
def quarter(tmp_path_factory):
    """One service for the module's tests, on the one-node cluster of ``SMALL_MEMORY``: each
    test waits for its own job's end, so the next finds the node free."""
    services = [start_service(module_home(tmp_path_factory, SMALL_MEMORY), env={"MA_JUPYTER_CARDS": "none"})]
    yield services[0]
    stop_services(services)


@pytest.mark.parametrize("code", [GREEDY, GREEDY_CHILD], ids=["process", "child"])
def test_a_node_past_its_memory_limit_ends_the_job_in_error(quarter, code):
    job = submit(quarter, command=shlex.join([PY, "-c", code]), specs=["cpu.quarter"])
    final = wait_status(quarter, job["id"], {"error", "succeeded", "stopped"})
    assert final["status"] == "error", final
    assert "exceeded its memory limit of 0.25 GB on worker-0" in final["reason"], final["reason"]
    assert "exceeded its memory limit" in full_log(quarter, job["id"])


def test_a_job_within_its_memory_limit_succeeds(quarter):
    code = "block = b'x' * (50 << 20); print('fine', flush=True)"
    job = submit(quarter, command=shlex.join([PY, "-c", code]), specs=["cpu.quarter"])
    final = wait_status(quarter, job["id"], {"error", "succeeded", "stopped"})
    assert final["status"] == "succeeded", final["reason"]


# --- memory a job holds without mapping it: bounded only by the node's own cgroup -------------

_WHERE, _WHY = cgroup.detect()
needs_cgroup = pytest.mark.skipif(
    _WHERE is None, reason=f"no writable memory cgroup here ({_WHY}): the watchdog is the only bound"
)
# three times the 0.25 GB limit, written into a memfd without ever mapping it
MEMFD = (
    "import os, time\n"
    "fd = os.memfd_create('hoard')\n"
    "chunk = b'x' * (1 << 20)\n"
    "for _ in range(768): os.write(fd, chunk)\n"
    "print('hoarded', flush=True); time.sleep(30)\n"
)
# the same in System V shared memory: twelve 64 MiB segments, each attached, filled and detached
# (the segments stay): never more than one is mapped, none is in a folder
SYSV = (
    "import ctypes, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
    "size = 64 << 20\n"
    "for _ in range(12):\n"
    "    sid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)\n"
    "    assert sid >= 0, ctypes.get_errno()\n"
    "    addr = libc.shmat(sid, None, 0)\n"
    "    ctypes.memset(addr, 120, size)\n"
    "    libc.shmdt(ctypes.c_void_p(addr))\n"
    "print('hoarded', flush=True); time.sleep(30)\n"
)
# /dev/shm (a tmpfs) through multiprocessing's shared memory, then closed (unmapped)
POSIX_SHM = (
    "import time\n"
    "from multiprocessing import shared_memory\n"
    "shm = shared_memory.SharedMemory(create=True, size=768 << 20)\n"
    "for off in range(0, shm.size, 1 << 20): shm.buf[off : off + (1 << 20)] = b'x' * (1 << 20)\n"
    "shm.close()\n"
    "print('hoarded', flush=True); time.sleep(30)\n"
)


def _node_cgroups(job_id):
    return [n for n in os.listdir(_WHERE["memory"]) if n.startswith(cgroup.PREFIX) and f".{job_id}." in n]


@needs_cgroup
@pytest.mark.parametrize("code", [MEMFD, SYSV, POSIX_SHM], ids=["memfd", "sysv-shm", "posix-shm"])
def test_memory_held_unmapped_counts_in_the_limit(quarter, code):
    job = submit(quarter, command=shlex.join([PY, "-c", code]), specs=["cpu.quarter"])
    final = wait_status(quarter, job["id"], {"error", "succeeded", "stopped"}, timeout=90)
    assert final["status"] == "error", final
    assert "exceeded its memory limit of 0.25 GB on worker-0" in final["reason"], final["reason"]
    assert "hoarded" not in full_log(quarter, job["id"])
    assert wait_for(lambda: not _node_cgroups(job["id"]), timeout=30), _node_cgroups(job["id"])


@needs_cgroup
def test_a_job_within_its_limit_runs_in_its_own_cgroup_gone_after(quarter):
    # the job reads its own cgroup: the node's, below the service's
    code = "print(open('/proc/self/cgroup').read(), flush=True); block = b'x' * (50 << 20)"
    job = submit(quarter, command=shlex.join([PY, "-c", code]), specs=["cpu.quarter"])
    final = wait_status(quarter, job["id"], {"error", "succeeded", "stopped"})
    assert final["status"] == "succeeded", final["reason"]
    assert re.search(
        rf"{re.escape(cgroup.PREFIX)}\w+\.{job['id']}\.0\.worker-0", full_log(quarter, job["id"])
    )
    assert wait_for(lambda: not _node_cgroups(job["id"]), timeout=30), _node_cgroups(job["id"])


@needs_cgroup
def test_a_killed_runners_cgroup_is_removed_by_the_stop_that_follows(ma_home):
    import signal

    from ma_jupyter.backends.local import LocalBackend
    from tests.fixtures.local_backend import log_of, make_attempt, start

    attempt = make_attempt(ma_home, "cg-lost-1", "import time; print('up', flush=True); time.sleep(600)")
    backend = LocalBackend()
    [run] = start(backend, attempt)
    wait_for(lambda: "up" in log_of(attempt), timeout=30)
    assert _node_cgroups("cg-lost-1"), "the node runs in a cgroup of its own"
    os.kill(run.pid, signal.SIGKILL)  # the runner cannot remove it
    wait_for(lambda: backend.poll(attempt, run).state == "lost", timeout=10)
    backend.stop(attempt, [run], 0)
    assert not _node_cgroups("cg-lost-1")
