"""Hostile jobs against the node limits a shared machine relies on (issue 24, items 5 and 6), on a
real root service whose jobs run as ``nobody`` in bubblewrap:

* a job holding its memory in ``/tmp`` and ``/dev/shm`` rather than in its processes is ended
  with the memory reason (before, a 1 GB job held 1.47 GB there and succeeded);
* a job cannot make a user namespace of its own (where it would be root and could mount a tmpfs
  the watchdog never counts);
* a job starting processes without end meets its node's own process limit, while another user's
  job, running as the same ``nobody``, still starts its processes;
* a job flooding its log past ``[limits] max_log_mb`` is ended with that reason, while another
  user's job keeps running and submits are accepted;
* a job flooding its outputs on a nearly full disk is ended for the disk reserve, naming the
  disk, while another user's job keeps running and submits are accepted.

The limits are small so that each test costs little on a shared machine; the disk is a small
tmpfs, never the real one.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time

import pytest

from tests.fixtures.service_api import full_log, job_of, wait_status
from tests.fixtures.service_process import module_home, start_service, stop_services
from tests.helpers import small_tmpfs, wait_for

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a root service runs jobs as nobody"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.timeout(300),
]

PY = sys.executable
QUARTER = """
[[spec]]
name = "cpu.quarter"
cpus = 1
memory_gb = 0.25
"""
ENDED = {"error", "succeeded", "stopped"}


def limits(home, **values) -> None:
    """Add a ``[limits]`` table (and the small spec) to the home's cluster.toml."""
    table = "\n[limits]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
    cluster = home / "cluster.toml"
    cluster.write_text(cluster.read_text() + QUARTER + table)


def submit_as(svc, user: str, code: str, **fields) -> dict:
    """Submit ``python -c code`` as ``user`` (a non-admin without a Unix account: ``nobody``)."""
    body = {
        "name": user,
        "command": shlex.join([PY, "-c", code]),
        "grace_period": 1,
        "specs": ["cpu.quarter"],
    }
    body.update(fields)
    reply = svc.user_session(user).post(f"{svc.api}/jobs", json=body, timeout=30)
    assert reply.status_code == 201, reply.text
    return reply.json()


def stop(svc, job_id: str) -> None:
    svc.session().post(f"{svc.api}/jobs/{job_id}/stop", timeout=10)
    wait_status(svc, job_id, ENDED, timeout=60)


# ------------------------------------------------------------------------------- memory

# 150 MiB in /tmp and 150 MiB in /dev/shm, each under the tmpfs cap, together past 0.25 GB
TMPFS_HOG = r"""
import os, time
print("tmp size", os.statvfs("/tmp").f_blocks * os.statvfs("/tmp").f_frsize, flush=True)
print("shm size", os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize, flush=True)
for folder in ("/tmp", "/dev/shm"):
    with open(folder + "/hog", "wb") as fh:
        for _ in range(150):
            fh.write(b"x" * (1 << 20))
    print("filled", folder, flush=True)
time.sleep(60)
print("still here", flush=True)
"""


@pytest.fixture(scope="module")
def quarter(tmp_path_factory):
    """One service for the module's tests with these limits: each test ends its own jobs (users
    run on the default cluster's nodes), so the next finds them free."""
    home = module_home(tmp_path_factory)
    limits(home, max_node_processes=64, max_log_mb=4)
    services = [start_service(home, env={"MA_JUPYTER_CARDS": "none"})]
    yield services[0]
    stop_services(services)


def test_memory_held_in_tmp_and_dev_shm_counts_in_the_node_memory(quarter):
    job = submit_as(quarter, "alice", TMPFS_HOG)
    final = wait_status(quarter, job["id"], ENDED, timeout=120)
    log = full_log(quarter, job["id"])
    assert final["status"] == "error", (final, log)
    assert "exceeded its memory limit of 0.25 GB on worker-0" in final["reason"], final["reason"]
    assert "in /tmp, /dev/shm and /run" in final["reason"], final["reason"]
    assert "still here" not in log
    # each folder is no larger than the node's memory (it was half the host's)
    sizes = [int(n) for n in re.findall(r"(?:tmp|shm) size (\d+)", log)]
    assert len(sizes) == 2 and all(0 < s <= 0.25 * (1 << 30) for s in sizes), log


def test_a_tmpfs_write_past_the_memory_fails_in_the_job(quarter):
    """One folder alone cannot take more than the node's memory: the write fails at the cap
    (and the watchdog ends the node for what it holds)."""
    code = (
        "import errno\n"
        "try:\n"
        "    with open('/dev/shm/big', 'wb') as fh:\n"
        "        for _ in range(400): fh.write(b'x' * (1 << 20))\n"
        "except OSError as exc: print('refused', errno.errorcode[exc.errno], flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    job = submit_as(quarter, "alice", code)
    final = wait_status(quarter, job["id"], ENDED, timeout=120)
    assert final["status"] == "error"
    assert "exceeded its memory limit of 0.25 GB" in final["reason"], final["reason"]


# A job that makes a user namespace of its own is root there and may mount a tmpfs anywhere:
# the watchdog reads only the sandbox's /tmp, /run and /dev/shm, so 10 GB there would be the
# host's memory, not the node's.  Both ways in are tried: the system call and unshare(1).
NESTED_NAMESPACE = r"""
import ctypes, errno, os, subprocess
print("uid", os.getuid(), flush=True)
script = "mkdir -p /tmp/big && mount -t tmpfs -o size=10g none /tmp/big && echo MOUNTED"
done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True)
print("unshare -Urm:", done.returncode, done.stdout.strip(), done.stderr.strip(), flush=True)
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    print("unshare refused", errno.errorcode[ctypes.get_errno()], flush=True)
else:
    print("unshare allowed", flush=True)
"""


def test_a_job_cannot_make_a_user_namespace_to_mount_a_tmpfs_outside_its_memory(quarter):
    job = submit_as(quarter, "alice", NESTED_NAMESPACE)
    final = wait_status(quarter, job["id"], ENDED, timeout=120)
    log = full_log(quarter, job["id"])
    assert final["status"] == "succeeded", (final, log)
    assert "uid 65534" in log, log  # the job runs as nobody
    assert re.search(r"unshare refused (ENOSPC|EPERM)", log), log
    assert "unshare -Urm: 1 " in log, log
    assert "MOUNTED" not in log, log


# ---------------------------------------------------------------------------- processes

FORK_BOMB = r"""
import errno, os, time
started = 0
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as exc:
        print(f"started {started}, then {errno.errorcode[exc.errno]}", flush=True)
        break
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", "120"])
    started += 1
else:
    print(f"started {started}, then nothing stopped it", flush=True)
time.sleep(120)
"""
NEIGHBOUR = r"""
import os, time
pids = []
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", "2"])
    pids.append(pid)
print(f"neighbour started {len(pids)}", flush=True)
for pid in pids:
    os.waitpid(pid, 0)
"""


def test_a_fork_bomb_meets_its_node_limit_while_another_users_job_starts_processes(quarter):
    bomb = submit_as(quarter, "alice", FORK_BOMB)
    wait_status(quarter, bomb["id"], {"running"}, timeout=60)
    said = wait_for(lambda: re.search(r"started (\d+), then (\w+)", full_log(quarter, bomb["id"])), 60)
    print(said.group(0))
    assert said.group(2) == "EAGAIN", said.group(0)
    assert int(said.group(1)) < 64, said.group(0)
    # the bomb still holds its processes: another user's job, the same account, starts its own
    assert job_of(quarter, bomb["id"])["status"] == "running"
    other = submit_as(quarter, "bob", NEIGHBOUR)
    final = wait_status(quarter, other["id"], ENDED, timeout=120)
    assert final["status"] == "succeeded", (final["reason"], full_log(quarter, other["id"]))
    assert "neighbour started 40" in full_log(quarter, other["id"])
    assert job_of(quarter, bomb["id"])["status"] == "running", job_of(quarter, bomb["id"])["reason"]
    assert "reached its limit of 64 processes and threads" in full_log(quarter, bomb["id"])
    stop(quarter, bomb["id"])


# --------------------------------------------------------------------------------- logs

# 1 MiB of text every 20 ms, 300 MiB at most (it never gets there)
LOG_FLOOD = r"""
import sys, time
line = "flood " * 170 + "\n"
chunk = line * ((1 << 20) // len(line))
for _ in range(300):
    sys.stdout.write(chunk)
    sys.stdout.flush()
    time.sleep(0.02)
print("flood done", flush=True)
"""
PRINTER = "import time\nfor i in range(3000):\n    print('line', i, flush=True); time.sleep(0.1)\n"


def test_a_log_flood_ends_that_job_while_another_users_job_runs_on(quarter):
    other = submit_as(quarter, "bob", PRINTER)
    wait_status(quarter, other["id"], {"running"}, timeout=60)
    # its on_stop floods too: the phases after the kill are held to the cap as well
    flood_again = {"on_stop": shlex.join([PY, "-c", LOG_FLOOD])}
    flood = submit_as(quarter, "alice", LOG_FLOOD, lifecycle=flood_again)
    final = wait_status(quarter, flood["id"], ENDED, timeout=120)
    assert final["status"] == "error", final
    assert "logs exceeded [limits] max_log_mb of 4 MB" in final["reason"], final["reason"]
    log = quarter.home / "jobs" / flood["id"] / "logs" / "worker-0.log"
    size = log.stat().st_size
    print(f"the flood's log ended at {size / (1 << 20):.1f} MB (max_log_mb 4)")
    assert size < 100 << 20
    with open(log, "rb") as fh:
        fh.seek(-min(size, 1 << 16), os.SEEK_END)
        end = fh.read()
    assert b"flood done" not in end and b"lifecycle on_stop exited with code 137" in end, end[-500:]
    assert job_of(quarter, other["id"])["status"] == "running"
    after = submit_as(quarter, "carol", "print('accepted')")
    assert wait_status(quarter, after["id"], ENDED)["status"] == "succeeded"
    assert job_of(quarter, other["id"])["status"] == "running"
    stop(quarter, other["id"])


def test_a_job_making_files_without_end_in_its_logs_folder_is_ended(quarter):
    """Counting the logs reads every entry of the folder: a job cannot make that slow without end."""
    code = (
        "import os, time\n"
        "for i in range(12000): open(f'/job/logs/f{i}', 'w').close()\n"
        "print('made them all', flush=True); time.sleep(60)\n"
    )
    job = submit_as(quarter, "alice", code)
    final = wait_status(quarter, job["id"], ENDED, timeout=120)
    assert final["status"] == "error", final
    assert "logs folder holds more than 10000 files and folders" in final["reason"], final["reason"]


# --------------------------------------------------------------------------------- disk

# 1 MiB every 250 ms into the outputs (on the jobs folder's disk), 200 MiB at most
DISK_FLOOD = r"""
import time
with open("/workspace/outputs/flood.bin", "wb") as fh:
    for i in range(200):
        fh.write(b"x" * (1 << 20))
        fh.flush()
        time.sleep(0.25)
print("disk flood done", flush=True)
"""


@pytest.fixture
def small_jobs_disk(ma_home):
    """A 64 MiB tmpfs at ``<home>/jobs`` with a 24 MB reserve; unmounted afterwards."""
    limits(ma_home, disk_reserve_mb=24)
    folder = ma_home / "jobs"
    with small_tmpfs(folder, "64m"):
        yield folder


# the flood: its log, 1 MiB every 100 ms, 200 MiB at most (past the 64 MiB disk)
LOG_DISK_FLOOD = r"""
import sys, time
chunk = ("flood " * 170 + "\n") * 1028
for i in range(200):
    sys.stdout.write(chunk)
    sys.stdout.flush()
    time.sleep(0.1)
print("disk flood done", flush=True)
"""


@pytest.mark.parametrize("flood", [DISK_FLOOD, LOG_DISK_FLOOD], ids=["outputs", "log"])
def test_a_disk_flood_ends_that_job_for_the_reserve_while_others_run_and_submit(
    small_jobs_disk, request, flood
):
    """Before, the flood filled the disk: another user's job ended "disk full" and every submit
    was refused until the flooding job was deleted (max_log_mb is left at its default here)."""
    svc = request.getfixturevalue("ma_service")
    other = submit_as(svc, "bob", PRINTER)
    wait_status(svc, other["id"], {"running"}, timeout=60)
    flood = submit_as(svc, "alice", flood)
    final = wait_status(svc, flood["id"], ENDED, timeout=180)
    assert final["status"] == "error", final
    print(final["reason"].splitlines()[0])
    assert f"disk nearly full under {small_jobs_disk}" in final["reason"], final["reason"]
    assert "under the reserve of 24 MB ([limits] disk_reserve_mb)" in final["reason"], final["reason"]
    free = os.statvfs(small_jobs_disk).f_bavail * os.statvfs(small_jobs_disk).f_frsize
    print(f"free after the flood ended: {free / (1 << 20):.1f} MB of 64 (reserve 24)")
    assert job_of(svc, other["id"])["status"] == "running"
    after = submit_as(svc, "carol", "print('accepted')")
    assert wait_status(svc, after["id"], ENDED)["status"] == "succeeded"
    time.sleep(3)  # a few more looks at the disk: the printer is not the one writing the most
    assert job_of(svc, other["id"])["status"] == "running"
    stop(svc, other["id"])


def test_without_a_sandbox_the_watchdog_ends_a_node_past_its_process_limit(
    ma_home, ma_root_jobs, monkeypatch
):
    """The symlink mode makes no user namespace (nothing bounds the count in the kernel there):
    the runner's watchdog is the bound, and the job ends with the reason."""
    monkeypatch.setenv("MA_JUPYTER_SANDBOX", "none")
    limits(ma_home, max_node_processes=32)
    svc = start_service(ma_home)
    try:
        body = {"name": "bomb", "command": shlex.join([PY, "-c", FORK_BOMB]), "specs": ["cpu.quarter"]}
        reply = svc.session().post(f"{svc.api}/jobs", json={**body, "grace_period": 1}, timeout=30)
        assert reply.status_code == 201, reply.text
        final = wait_status(svc, reply.json()["id"], ENDED, timeout=120)
        assert final["status"] == "error", final
        assert "exceeded its limit of 32 processes and threads on worker-0" in final["reason"], final[
            "reason"
        ]
    finally:
        svc.proc.terminate()
        svc.proc.wait(30)


# ---------------------------------------------------------------- a chain of folders too deep

# a chain of folders deeper than Python's recursion (each made relative to its parent's
# descriptor: no path is longer than a name) in the job's outputs, its cache and its logs, a
# file at the bottom of each; then a log flood past max_log_mb
DEEP_CHAINS = r"""
import os, sys, time
def chain(at, depth=1100):
    fd = os.open(at, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    bottom = os.open("hidden", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(bottom, b"x" * 4096)
    os.close(bottom)
    os.close(fd)
    print("chain made in", at, flush=True)
for at in ("/workspace/outputs", os.path.expanduser("~/.cache")):
    os.makedirs(at, exist_ok=True)
    chain(at)
chain(os.environ["MA_RANK_LOG_DIR"])
line = "flood " * 170 + "\n"
chunk = line * ((1 << 20) // len(line))
for _ in range(60):
    sys.stdout.write(chunk)
    sys.stdout.flush()
    time.sleep(0.05)
print("flood done", flush=True)
"""


def test_deep_folder_chains_keep_the_log_cap_the_cache_listing_and_deletion(quarter):
    """A job's 1,100-deep chains (os.fwalk and shutil.rmtree raise RecursionError on them) in
    its logs, outputs and cache: the watchdog still ends it for its logs (before, its thread
    died and a job flooding 62.9 MB past max_log_mb 4 succeeded), GET /cache answers 200 to its
    owner and the admin with the refusal marked (it answered 500), and deleting the job and
    clearing the cache remove every file, the ones below the chains too."""
    alice = quarter.user_session("alice")
    job = submit_as(quarter, "alice", DEEP_CHAINS)
    final = wait_status(quarter, job["id"], ENDED, timeout=180)
    log = full_log(quarter, job["id"])
    assert final["status"] == "error", (final, log[-2000:])
    assert "[limits] max_log_mb" in final["reason"] and "deep" in final["reason"], final["reason"]
    assert "chain made in /workspace/outputs" in log and "flood done" not in log
    size = (quarter.home / "jobs" / job["id"] / "logs" / "worker-0.log").stat().st_size
    print(f"the job's log ended at {size / (1 << 20):.1f} MB (max_log_mb 4): {final['reason']}")
    assert size < 40 << 20
    for session, query in ((alice, ""), (quarter.session(), "?all=true")):
        reply = session.get(f"{quarter.api}/cache{query}", timeout=60)
        assert reply.status_code == 200, reply.text
        mine = [c for c in reply.json() if c["user"] == "alice"]
        assert mine and "deep" in (mine[0]["refused"] or ""), reply.json()
    cache = quarter.home / "caches" / "alice"
    assert cache.is_dir()
    folder = quarter.home / "jobs" / job["id"]
    reply = alice.delete(f"{quarter.api}/jobs/{job['id']}", timeout=60)
    assert reply.status_code == 204, reply.text
    reply = alice.delete(f"{quarter.api}/cache", timeout=60)
    assert reply.status_code == 200, reply.text
    # removed on threads of their own: every entry, the files below the chains too
    wait_for(lambda: not folder.exists() and not any((quarter.home / "jobs").glob(".deleted-*")), timeout=60)
    wait_for(lambda: not any((quarter.home / "caches").glob(".deleted-*")), timeout=60)
    assert not cache.exists() or not any(cache.iterdir())
