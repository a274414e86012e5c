"""A user's jobs against the stale-lock look of their cache (:mod:`ma_jupyter.nodehost.caches`
rule 6): what a job leaves in the cache it writes must never stall a launch, make the service
remove a file outside the cache, or remove a lock a living process holds."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from ma_jupyter.nodehost import caches
from tests.helpers import wait_for

#: a node of the user's jobs: holds the cache's lease shared (as a node runner does) and, like
#: torch's FileBaton, keeps its build lock's descriptor open while it builds
NODE = textwrap.dedent(
    """
    import fcntl, os, sys
    lease = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(lease, fcntl.LOCK_SH)
    held = os.open(sys.argv[2], os.O_RDONLY)
    print("in", flush=True)
    sys.stdin.read()
    """
)


def _in_thread(call):
    """``call()`` on a thread, waited for at most two minutes: (finished, its result)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(timeout=120)
    return not thread.is_alive(), (out[0] if out else None)


def test_a_running_node_and_a_planted_cache_never_stall_the_launch_look_or_reach_outside(
    tmp_path, monkeypatch
):
    cache = tmp_path / "caches" / "alice"
    building = cache / "torch_extensions" / "py311" / "fused_adam"
    building.mkdir(parents=True)
    live, stale = building / "lock", cache / "torch_extensions" / "py311" / "old.lock"
    live.write_text("")
    stale.write_text("")
    # what the job planted: a link named like a lock to a file outside the cache, a fifo and a
    # folder named like locks (a look that opened the fifo would wait for a writer forever)
    outside = tmp_path / "precious.lock"
    outside.write_text("keep")
    (cache / "evil.lock").symlink_to(outside)
    os.mkfifo(cache / "fifo.lock")
    (cache / "dir.lock").mkdir()
    caches.lease_file(cache).parent.mkdir(mode=0o700, exist_ok=True)
    node = subprocess.Popen(
        [sys.executable, "-c", NODE, str(caches.lease_file(cache)), str(live)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert node.stdout.readline() == "in\n"
        # the launch's look (under the supervisor's lock) while a node of the user runs: it
        # must not wait out the settling look, however long that is
        monkeypatch.setattr(caches, "LOCK_SETTLE_SECONDS", 3600.0)
        finished, released = _in_thread(lambda: caches.release_stale_locks(cache))
        assert finished, "the launch's look waited on the node host's settling look"
        assert released is None and stale.exists() and live.exists()

        # the node host's own look, on its thread: the unheld lock goes, the held one stays
        monkeypatch.setattr(caches, "LOCK_SETTLE_SECONDS", 0.05)
        finished, released = _in_thread(lambda: caches.release_stale_locks(cache, unheld=True))
        assert finished
        assert released == ["torch_extensions/py311/old.lock"], released
        assert live.exists() and not stale.exists()
        assert outside.read_text() == "keep" and (cache / "evil.lock").is_symlink()
        assert (cache / "fifo.lock").exists() and (cache / "dir.lock").is_dir()
    finally:
        node.stdin.close()
        node.wait(timeout=60)
    # no node runs: every lock file goes, and still nothing the links lead to
    finished, released = _in_thread(lambda: caches.release_stale_locks(cache))
    assert finished and released == ["torch_extensions/py311/fused_adam/lock"], released
    assert outside.read_text() == "keep"


def test_a_job_holding_many_descriptors_cannot_stretch_the_look_for_holders(tmp_path, monkeypatch):
    """A process of the user with thousands of open descriptors: the look through them stops at
    its bound (:data:`caches.LOCK_HOLDERS_SECONDS`) within that one process, not after it."""
    uid = 3_000_000 + os.getpid() % 100_000  # an account of this test alone
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, uid, uid)
    system_python = shutil.which("python3", path="/usr/bin:/bin")  # one any account may run
    if system_python is None:
        pytest.skip("no python3 in /usr/bin or /bin for another account to run")
    hoarder = subprocess.Popen(
        [
            system_python,
            "-c",
            "import os, resource, sys; fd = os.open('/dev/null', os.O_RDONLY)\n"
            "_, most = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))\n"
            "kept = [os.dup(fd) for _ in range(min(20000, most - 100))]\n"
            "print('in', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
    )
    try:
        assert hoarder.stdout.readline() == "in\n"
        looked = [0]

        class CountingOs:  # the descriptors looked at, one clock tick (1 ms) each
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def stat(path, *args, **kwargs):
                if "/fd/" in str(path):
                    looked[0] += 1
                return os.stat(path, *args, **kwargs)

        class Clock:
            @staticmethod
            def monotonic():
                return looked[0] / 1000

        monkeypatch.setattr(caches, "os", CountingOs())
        monkeypatch.setattr(caches, "time", Clock())
        monkeypatch.setattr(caches, "LOCK_HOLDERS_SECONDS", 0.1)  # 100 descriptors
        assert caches._open_anywhere({(0, 0)}, uid) is None  # gave up: every lock is held
        assert looked[0] < 1000, f"{looked[0]} descriptors looked at past a bound of 100"
    finally:
        hoarder.stdin.close()
        hoarder.wait(timeout=60)


#: a job of the user that removes a lock it takes as stale and takes it itself at once, as
#: torch's FileBaton does (the new file may get the old one's inode number: ext4 reuses it)
RETAKER = textwrap.dedent(
    """
    import os, sys
    sys.stdin.readline()
    os.remove(sys.argv[1])
    held = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_RDONLY)
    print(os.fstat(held).st_ino, flush=True)
    sys.stdin.read()
    """
)


def test_a_lock_taken_again_between_the_looks_is_never_removed_though_its_inode_is_the_old_ones(
    tmp_path, monkeypatch
):
    cache = tmp_path / "caches" / "alice"
    cache.mkdir(parents=True)
    lock = cache / "lock"
    lock.write_text("")
    first_inode = lock.stat().st_ino
    caches.lease_file(cache).parent.mkdir(mode=0o700, exist_ok=True)
    lease = os.open(caches.lease_file(cache), os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(lease, fcntl.LOCK_SH)  # a node of the user runs
    retaker = subprocess.Popen(
        [sys.executable, "-c", RETAKER, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    looks = [0]
    real_look = caches._open_anywhere
    inode = []

    def look_then_retake(wanted, uid):
        held = real_look(wanted, uid)
        looks[0] += 1
        if looks[0] == 2:  # the second look saw the old lock unheld: the job takes it again now
            retaker.stdin.write("go\n")
            retaker.stdin.flush()
            inode.append(int(retaker.stdout.readline()))
        return held

    monkeypatch.setattr(caches, "_open_anywhere", look_then_retake)
    monkeypatch.setattr(caches, "LOCK_SETTLE_SECONDS", 0.05)
    try:
        finished, released = _in_thread(lambda: caches.release_stale_locks(cache, unheld=True))
        assert finished and inode, (finished, inode)
        if inode[0] != first_inode:
            pytest.skip("this file system gave the new lock a new inode number")
        assert released == [] and lock.exists(), "the lock a living job holds was removed"
    finally:
        retaker.stdin.close()
        retaker.wait(timeout=60)
        os.close(lease)


#: a job's build that holds its lock open until it is killed
HOLDER = "import os, sys; held = os.open(sys.argv[1], os.O_RDONLY); print('in', flush=True); sys.stdin.read()"


def test_a_node_that_ends_while_the_look_runs_gets_a_look_of_its_own(ma_home, monkeypatch):
    """The node host looks at a cache once at a time: a node of the user killed while its lock
    was being looked at (seen held) still has its lock removed, by one more look."""
    from ma_jupyter.nodehost.host import NodeHost

    cache = caches.cache_dir("alice")
    cache.mkdir(parents=True)
    lock = cache / "lock"
    lock.write_text("")
    caches.lease_file(cache).parent.mkdir(mode=0o700, exist_ok=True)
    lease = os.open(caches.lease_file(cache), os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(lease, fcntl.LOCK_SH)  # another node of the user runs on
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    host = NodeHost()
    real_look = caches._open_anywhere
    looks = [0]

    def killed_during_the_first_look(wanted, uid):
        held = real_look(wanted, uid)
        looks[0] += 1
        if looks[0] == 1:  # seen held; its node is killed now, and its end is seen at once
            holder.kill()
            holder.wait(timeout=60)
            host._release_locks_of("alice")
        return held

    monkeypatch.setattr(caches, "_open_anywhere", killed_during_the_first_look)
    monkeypatch.setattr(caches, "LOCK_SETTLE_SECONDS", 0.05)
    try:
        assert holder.stdout.readline() == "in\n"
        host._release_locks_of("alice")
        wait_for(lambda: not lock.exists(), timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=60)
        os.close(lease)


#: a job's build holding its lock in a process that made itself not dumpable (ssh-agent, a
#: sandboxing library): its /proc entries are then root's, not its account's
UNDUMPABLE_HOLDER = textwrap.dedent(
    """
    import ctypes, os, sys
    held = int(sys.argv[1])  # the lock, opened for it (its folder may be closed to it)
    assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    print("in", flush=True)
    sys.stdin.read()
    """
)


def test_a_lock_held_by_a_process_that_is_not_dumpable_is_kept(tmp_path, monkeypatch):
    uid = 3_100_000 + os.getpid() % 100_000  # an account of this test alone
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no python3 in /usr/bin or /bin for another account to run")
    cache = tmp_path / "caches" / "bob"
    cache.mkdir(parents=True)
    lock = cache / "lock"
    lock.write_text("")
    for path in (cache, lock):
        os.chown(path, uid, uid)
    caches.lease_file(cache).parent.mkdir(mode=0o700, exist_ok=True)
    lease = os.open(caches.lease_file(cache), os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(lease, fcntl.LOCK_SH)  # a node of the user runs
    held = os.open(lock, os.O_RDONLY)
    holder = subprocess.Popen(
        [system_python, "-c", UNDUMPABLE_HOLDER, str(held)],
        pass_fds=[held],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
    )
    os.close(held)  # the holder's only
    monkeypatch.setattr(caches, "LOCK_SETTLE_SECONDS", 0.05)
    try:
        assert holder.stdout.readline() == "in\n"
        finished, released = _in_thread(lambda: caches.release_stale_locks(cache, unheld=True))
        assert finished and released == [] and lock.exists(), released
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        os.close(lease)


#: an account no process of this machine runs as: the look through /proc skips every process
#: quickly (a loaded machine cannot push it past its bound)
NO_ONE = 2**31 - 7


@pytest.fixture
def busy_cache(tmp_path, monkeypatch):
    """A cache whose lease a running node of its user holds (shared), with a lock file no
    process holds open."""
    monkeypatch.setattr(caches, "LOCK_SETTLE_SECONDS", 0.0)
    cache = tmp_path / "caches" / "u"
    (cache / "hub").mkdir(parents=True)
    lock = cache / "hub" / "model.lock"
    lock.write_bytes(b"")
    os.chown(cache, NO_ONE, NO_ONE)
    caches.lease_file(cache).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lease = os.open(caches.lease_file(cache), os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(lease, fcntl.LOCK_SH)  # the running node's lease
    yield cache, lock
    os.close(lease)


def test_an_unheld_lock_goes_and_one_taken_after_the_looks_stays(busy_cache, monkeypatch):
    cache, lock = busy_cache
    stale = cache / "torch_extensions" / "op" / "lock"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"")
    looks = []
    real_look = caches._open_anywhere
    acquirer = []

    def look(wanted, uid):
        held = real_look(wanted, uid)
        looks.append(held)
        if len(looks) == 2:  # a filelock acquirer comes right after the second look
            fd = os.open(lock, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            acquirer.append(fd)
        return held

    monkeypatch.setattr(caches, "_open_anywhere", look)
    try:
        assert caches.release_stale_locks(cache) is None  # a launch: not beside other jobs
        released = caches.release_stale_locks(cache, unheld=True)
        assert len(looks) == 2, looks
        assert released == ["torch_extensions/op/lock"]
        assert not stale.exists()
        # the acquirer's lock is still the file every later acquirer opens: one holder at a time
        assert os.fstat(acquirer[0]).st_nlink == 1
        assert lock.exists()
    finally:
        for fd in acquirer:
            os.close(fd)


def test_the_look_for_holders_stops_at_its_bound_inside_one_process_too(monkeypatch):
    """A job's process with many descriptors open: the look through them stops at
    LOCK_HOLDERS_SECONDS however many one process holds (None: every lock taken as held), not
    only between processes.  The clock here moves one second per descriptor looked at."""
    opened = [os.open("/dev/null", os.O_RDONLY) for _ in range(20)]
    clock = [0.0]
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if str(path).startswith(f"/proc/{os.getpid()}/fd/"):
            clock[0] += 1.0
        return real_stat(path, *args, **kwargs)

    real_listdir = os.listdir
    monkeypatch.setattr(caches.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(caches.os, "stat", stat)
    monkeypatch.setattr(
        caches.os, "listdir", lambda path: [str(os.getpid())] if path == "/proc" else real_listdir(path)
    )
    try:
        wanted = {(real_stat(f"/proc/self/fd/{opened[-1]}").st_dev, real_stat("/dev/null").st_ino)}
        assert caches._open_anywhere(wanted, os.getuid()) is None
        assert clock[0] <= caches.LOCK_HOLDERS_SECONDS + 1
    finally:
        for fd in opened:
            os.close(fd)
