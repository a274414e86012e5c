"""The build locks of a user's cache while a node of theirs runs (nodehost/caches.py rule 6):
a lock no process holds is removed, and one an acquirer takes after the service's looks is
never removed from under it (two holders)."""

from __future__ import annotations

import fcntl
import os

import pytest

from ma_jupyter.nodehost import caches

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
        released = caches.release_stale_locks(cache, beside_others=True)
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
