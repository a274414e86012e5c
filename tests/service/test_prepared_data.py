"""Prepared data with real processes: a second job naming an unchanged source reuses the first
one's copy (no copy again), a changed source gets a fresh copy, an unused copy expires after
the admin's retention but never while a job uses it, and it can be removed early."""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import stat
import subprocess
import threading
import time

import pytest

from ma_jupyter import config
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JobSpec, JobStatus
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.supervisor import Supervisor
from tests.fixtures.service_api import full_log, pycmd, submit, wait_status
from tests.helpers import stop_every_job, wait_for

READ = "print('read', open('/workspace/dataset/private/d/x.txt').read(), flush=True)"


def _events(svc, job_id) -> list[str]:
    return [e["reason"] for e in svc.session().get(f"{svc.api}/jobs/{job_id}/events", timeout=10).json()]


def _data(svc) -> list[dict]:
    r = svc.session().get(f"{svc.api}/data", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _run(svc, data, script=READ, **extra) -> dict:
    job = submit(
        svc,
        command=pycmd(script),
        data_preparation=True,
        datasets=[{"name": "d", "path": str(data)}],
        **extra,
    )
    return job


def _dataset(tmp_path, size=1_500_000):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("hello")
    (data / "blob.bin").write_bytes(os.urandom(size))
    return data


def test_second_job_reuses_the_copy_and_a_change_makes_a_new_one(ma_service, ma_cli, tmp_path):
    data = _dataset(tmp_path)
    first = _run(ma_service, data)
    final = wait_status(ma_service, first["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    assert "read hello" in full_log(ma_service, first["id"])
    assert any("dataset d: prepared 1.5 MB in" in r for r in _events(ma_service, first["id"]))
    [entry] = _data(ma_service)
    assert entry["bytes"] == 1_500_005 and entry["files"] == 2 and entry["source"] == str(data.resolve())
    assert entry["jobs"] == []  # the job ended: nobody holds it
    copy = entry["path"]
    before = os.stat(os.path.join(copy, "blob.bin"))

    second = _run(ma_service, data)
    final = wait_status(ma_service, second["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    assert "read hello" in full_log(ma_service, second["id"])
    reasons = _events(ma_service, second["id"])
    assert any("dataset d: prepared data reused (1.5 MB)" in r for r in reasons), reasons
    assert not any("prepared 1.5 MB in" in r for r in reasons)
    after = os.stat(os.path.join(copy, "blob.bin"))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not copied again
    assert [e["key"] for e in _data(ma_service)] == [entry["key"]]

    # a job cannot name a copy itself to skip the rules on its source: the copy is in the home
    direct = ma_service.session().post(
        f"{ma_service.api}/jobs",
        json={"name": "peek", "command": "true", "datasets": [{"name": "d", "path": copy}]},
        timeout=10,
    )
    assert direct.status_code == 400 and "home" in direct.text, direct.text

    # the CLI lists it with its size
    listed = ma_cli("data", "list").stdout
    assert entry["key"] in listed and "1.5 MB" in listed and str(data.resolve()) in listed

    # a changed source is a new state: copied afresh, the old copy stays until it expires
    (data / "x.txt").write_text("changed")
    third = _run(ma_service, data)
    final = wait_status(ma_service, third["id"], {"succeeded", "error"}, timeout=120)
    assert "read changed" in full_log(ma_service, third["id"])
    assert any("dataset d: prepared 1.5 MB in" in r for r in _events(ma_service, third["id"]))
    assert len(_data(ma_service)) == 2

    # removed early by its key
    gone = json.loads(ma_cli("data", "rm", entry["key"], "--json").stdout)
    assert gone["key"] == entry["key"] and not os.path.exists(copy)
    assert entry["key"] not in [e["key"] for e in _data(ma_service)]
    missing = ma_service.session().delete(f"{ma_service.api}/data/{entry['key']}", timeout=10)
    assert missing.status_code == 404 and "data list" in missing.text


def test_retention_expires_unused_copies_but_never_one_in_use(ma_home, ma_service, tmp_path):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + "\n[data]\nretention = 2\n")  # re-read on each sweep
    data = _dataset(tmp_path, size=1000)
    # a job that keeps using the copy well past the retention
    slow = _run(ma_service, data, script=READ + "; import time; time.sleep(8)")
    wait_for(lambda: _data(ma_service) and _data(ma_service)[0]["jobs"] == [slow["id"]], timeout=120)
    [entry] = _data(ma_service)
    time.sleep(4)  # longer than the retention
    assert [e["key"] for e in _data(ma_service)] == [entry["key"]]  # held: kept
    busy = ma_service.session().delete(f"{ma_service.api}/data/{entry['key']}", timeout=10)
    assert busy.status_code == 409 and slow["id"] in busy.text
    final = wait_status(ma_service, slow["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    assert os.path.isdir(entry["path"])
    # unused now: gone once the retention has passed since its last use
    wait_for(lambda: _data(ma_service) == [], timeout=30, interval=0.5)
    assert not os.path.exists(entry["path"])


def test_a_bad_retention_is_named(ma_home, ma_service, tmp_path):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + '\n[data]\nretention = "soon"\n')
    r = ma_service.session().get(f"{ma_service.api}/data", timeout=10)
    assert r.status_code == 400 and "[data] retention" in r.text


def test_a_link_inside_a_dataset_is_copied_as_a_link_never_followed(ma_home, tmp_path):
    from ma_jupyter.nodehost import prepare
    from ma_jupyter.service.prepared import PreparedStore

    secret = tmp_path / "private" / "notes.txt"
    secret.parent.mkdir()
    secret.write_text("not for the job")
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.bin").write_bytes(b"a" * 10)
    (data / "x").symlink_to(secret)
    (data / "linked-dir").symlink_to(secret.parent)
    store = PreparedStore(tmp_path / "store")
    got = store.acquire("job-1", str(data), "bob", prepare)
    copy = got.path
    assert (copy / "sub" / "a.bin").read_bytes() == b"a" * 10
    # the links are links in the copy: nothing behind them was read with the service's rights
    assert (copy / "x").is_symlink() and os.readlink(copy / "x") == str(secret)
    assert (copy / "linked-dir").is_symlink()
    assert got.bytes == 10

    # what a link points to changes the key; what lies behind it does not
    def key() -> str:
        return prepare.look_at_dataset("bob", str(data)).key

    before = key()
    secret.write_text("changed behind the link")
    assert key() == before
    (data / "x").unlink()
    (data / "x").symlink_to(tmp_path / "elsewhere")
    assert key() != before


# ------------------------------------------------------------------ hostile datasets
#
# A dataset may hold what a job wrote (any job can fill a writable volume): data preparation
# reads it as the job's account, by the untrusted-file rules, off every lock.


def _quick(call, what: str, limit: float = 10.0):
    """``call()``'s result, asserting it answered within ``limit`` seconds (a stalled service
    makes the request time out, which fails the test as well)."""
    started = time.monotonic()
    result = call()
    assert time.monotonic() - started < limit, f"{what} took {time.monotonic() - started:.1f} s"
    return result


def test_a_fifo_socket_or_device_dataset_is_refused_by_name_and_blocks_nobody(ma_service, tmp_path):
    import socket

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # the reproduction: a dataset that is a FIFO nobody writes to
    inner = tmp_path / "vol"
    (inner / "sub").mkdir(parents=True)
    (inner / "ok.txt").write_text("fine")
    os.mkfifo(inner / "sub" / "wait.fifo")
    sock_dir = tmp_path / "sockvol"
    sock_dir.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_dir / "agent.sock"))
    dev_dir = tmp_path / "devvol"
    dev_dir.mkdir()
    os.mknod(dev_dir / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    mallory = ma_service.user_session("mallory")
    bob = ma_service.user_session("bob")
    hostile = {}
    for name, path, shown in [
        ("fifo", fifo, f"{fifo} is a FIFO"),
        ("inner", inner, f"{inner}/sub/wait.fifo is a FIFO"),
        ("socket", sock_dir, f"{sock_dir}/agent.sock is a socket"),
        ("device", dev_dir, f"{dev_dir}/null is a device file"),
    ]:
        body = {
            "name": name,
            "command": pycmd("print('ran')"),
            "data_preparation": True,
            "datasets": [{"name": "d", "path": str(path)}],
        }
        r = _quick(
            lambda body=body: mallory.post(f"{ma_service.api}/jobs", json=body, timeout=30), "a submit"
        )
        if r.status_code == 201:
            hostile[r.json()["id"]] = shown
        else:  # refused at once is as good, if it names what it refused
            assert r.status_code == 400 and shown in r.text, r.text

    # meanwhile another user's submit and the admin's stop answer at once
    queued = {"name": "other", "command": pycmd("import time; time.sleep(60)")}
    other = _quick(lambda: bob.post(f"{ma_service.api}/jobs", json=queued, timeout=30), "bob's submit")
    assert other.status_code == 201, other.text
    stop = _quick(
        lambda: ma_service.session().post(f"{ma_service.api}/jobs/{other.json()['id']}/stop", timeout=30),
        "the admin's stop",
    )
    assert stop.status_code == 200, stop.text

    for job_id, shown in hostile.items():
        final = wait_status(ma_service, job_id, {"succeeded", "error"}, timeout=60)
        assert final["status"] == "error" and shown in final["reason"], (shown, final["reason"])
        assert "dataset d:" in final["reason"] and "ran" not in full_log(ma_service, job_id)
    # nothing half made: no complete copy, and no copy in progress left behind
    assert _data(ma_service) == []
    store = ma_service.home / "prepared"
    assert not list(store.glob("*/data")) and not list(store.glob("*/copying-*"))
    listener.close()


def test_a_setuid_file_arrives_without_its_bits_owned_by_the_job_account(ma_service, tmp_path):
    data = tmp_path / "data"
    (data / "shared").mkdir(parents=True)
    tool = data / "tool"
    tool.write_text("#!/bin/sh\nid\n")
    tool.chmod(0o4755)  # what a job's `chmod 4755` left in a writable volume
    (data / "group-tool").write_text("x")
    (data / "group-tool").chmod(0o2755)
    (data / "shared").chmod(0o3777)  # setgid and sticky folder
    secret = tmp_path / "secret.txt"
    secret.write_text("the service's secret")
    secret.chmod(0o600)
    (data / "escape").symlink_to(secret)  # a link out of the dataset
    (data / "unreadable.txt").write_text("root only")
    (data / "unreadable.txt").chmod(0o600)

    script = (
        "import os, stat\n"
        "base = '/workspace/dataset/private/d/'\n"
        "st = os.stat(base + 'tool')\n"
        "print('mode', oct(stat.S_IMODE(st.st_mode)), 'uid', st.st_uid, 'me', os.getuid(), flush=True)\n"
        "try:\n"
        "    print('escaped', open(base + 'escape').read(), flush=True)\n"
        "except OSError as exc:\n"
        "    print('no escape', type(exc).__name__, flush=True)\n"
    )
    # the file the account cannot read is refused with a message saying so
    refused = _run(ma_service, data, script=script)
    final = wait_status(ma_service, refused["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "error" and "unreadable.txt" in final["reason"], final["reason"]
    assert "cannot be read by the account the job runs as" in final["reason"], final["reason"]
    (data / "unreadable.txt").unlink()

    job = _run(ma_service, data, script=script)
    final = wait_status(ma_service, job["id"], {"succeeded", "error"}, timeout=120)
    assert final["status"] == "succeeded", final["reason"]
    log = full_log(ma_service, job["id"])
    assert "mode 0o755" in log and "no escape" in log and "the service's secret" not in log, log
    [entry] = _data(ma_service)
    copy = entry["path"]
    nobody = pwd.getpwnam("nobody").pw_uid
    for name, mode in [("tool", 0o755), ("group-tool", 0o755), ("shared", 0o777)]:
        st = os.lstat(os.path.join(copy, name))
        assert stat.S_IMODE(st.st_mode) == mode, (name, oct(st.st_mode))
        assert st.st_uid == nobody != 0, (name, st.st_uid)  # the job's account made it, not root
    assert os.readlink(os.path.join(copy, "escape")) == str(secret)  # a link, never followed


class GatedCopyBackend(LocalBackend):
    """The local backend whose dataset copies wait for the test's ``gate`` first: a copy that
    takes as long as the test wants (a huge dataset, a slow disk)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.copying = threading.Event()

    def copy_dataset(self, user, source, into, cancel=None):
        self.copying.set()
        while not self.gate.wait(0.05):
            if cancel is not None and cancel.is_set():
                break
        return super().copy_dataset(user, source, into, cancel)


def test_a_copy_in_progress_holds_no_lock_and_a_stop_cancels_it(ma_home, tmp_path):
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), GatedCopyBackend())
    data = _dataset(tmp_path, size=1000)

    def spec(name, script, **extra):
        return JobSpec.model_validate(
            {"name": name, "command": pycmd(script), "specs": ["cpu.small"], **extra}
        )

    try:
        prep_spec = spec("prep", READ, data_preparation=True, datasets=[{"name": "d", "path": str(data)}])
        slow = sup.submit(prep_spec, "mallory")
        _quick(sup.tick, "the tick that starts the copy")
        wait_for(sup.backend.copying.is_set, timeout=30)
        assert sup.store.get(slow.id).status is JobStatus.queued  # preparing: queued, nodes reserved
        # while it copies, another user's job is submitted and started, and the admin stops it
        other = _quick(lambda: sup.submit(spec("other", "import time; time.sleep(60)"), "bob"), "a submit")
        _quick(sup.tick, "a tick")
        assert sup.store.get(other.id).status is JobStatus.running
        _quick(lambda: sup.request_stop(slow.id, by="admin"), "the stop of the copying job")
        assert sup.store.get(slow.id).status is JobStatus.stopped
        # the copy is cancelled: no copy in progress left, none taken for complete
        store = sup.preparation.copies.root
        wait_for(lambda: not sup.preparation.is_preparing(slow.id), timeout=30)
        assert not list(store.glob("*/data")) and not list(store.glob("*/copying-*"))
        assert not (config.jobdir(slow.id).logs / "worker-0.log").exists()  # it never ran

        # the same data again, the gate open: copied, then launched by the copying thread
        sup.backend.gate.set()
        again = sup.submit(prep_spec, "mallory")
        sup.tick()
        wait_for(lambda: sup.store.get(again.id).status is JobStatus.running, timeout=60)
        [entry] = sup.preparation.copies.entries(lambda _id: True)
        assert entry.jobs == [again.id] and os.path.isdir(entry.path)
    finally:
        sup.backend.gate.set()
        stop_every_job(sup)


def test_a_copy_cut_short_by_a_crash_is_never_taken_for_a_prepared_one(ma_home, tmp_path):
    from ma_jupyter.nodehost import prepare
    from ma_jupyter.service.prepared import COPYING_PREFIX, PreparedStore

    data = _dataset(tmp_path, size=100)
    store = PreparedStore(tmp_path / "store")
    key = prepare.look_at_dataset("bob", str(data.resolve())).key
    # what a service killed mid-copy leaves: the entry, a hold, a partial copy
    half = store.root / key / f"{COPYING_PREFIX}dead" / "data"
    half.mkdir(parents=True)
    (half / "x.txt").write_text("hel")
    (store.root / key / "holds").mkdir()
    (store.root / key / "holds" / "job-gone").touch()
    assert store.entries(lambda _id: True) == []  # not listed: there is no complete copy
    got = store.acquire("job-2", str(data), "bob", prepare)  # the next job copies afresh
    assert not got.reused and (got.path / "x.txt").read_text() == "hello"
    assert got.path == store.root / key / "data"
    store.release("job-2")
    store.sweep(lambda _id: False, keep=3600)  # the partial copy goes; the kept one stays
    assert not list(store.root.glob(f"*/{COPYING_PREFIX}*")) and not list(store.root.glob(".removed-*"))
    assert (got.path / "x.txt").read_text() == "hello"


def _tree_text(root) -> str:
    """Every regular file's content below ``root`` (links not followed), for a leak check."""
    out = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                out.append(open(path, errors="replace").read())
    return "\n".join(out)


def test_a_dataset_folder_swapped_for_a_link_into_another_job_after_the_check_is_refused(ma_home, tmp_path):
    """The hostile user submits a dataset of their own, and once the mount rules were checked
    (under the lock) and while the copy is pending, replaces a folder on its path by a symlink
    into another job's outputs (an ``--access none`` job's files, the shared nobody account's):
    the copy checks the root it opened, refuses it by name, and nothing of the victim's lands in
    the store."""
    nobody = pwd.getpwnam("nobody")
    victim = config.jobs_root() / "victim-job" / "outputs"
    (victim / "inner").mkdir(parents=True)
    (victim / "inner" / "results.txt").write_text("the victim's results")
    for path in (victim, victim / "inner", victim / "inner" / "results.txt"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    mine = tmp_path / "mine"
    (mine / "d" / "inner").mkdir(parents=True)
    (mine / "d" / "inner" / "x.txt").write_text("mine")
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), GatedCopyBackend())
    try:
        spec = JobSpec.model_validate(
            {
                "name": "swap",
                "command": pycmd("print('ran', flush=True)"),
                "specs": ["cpu.small"],
                "data_preparation": True,
                "datasets": [{"name": "d", "path": str(mine / "d" / "inner")}],
            }
        )
        job = sup.submit(spec, "mallory")
        sup.tick()  # checks the rules on the path as given, then copies on its own thread
        wait_for(sup.backend.copying.is_set, timeout=30)
        os.rename(mine / "d", mine / "d.mine")
        os.symlink(victim, mine / "d")
        sup.backend.gate.set()
        wait_for(lambda: sup.store.get(job.id).status is not JobStatus.queued, timeout=60)
        done = sup.store.get(job.id)
        reasons = " ".join(e.reason for e in sup.store.events(job.id))
        assert done.status is JobStatus.error, (done.status, reasons)
        assert "dataset d" in reasons and "job service's home" in reasons, reasons
        assert "the victim's results" not in _tree_text(sup.preparation.copies.root)
        assert not (config.jobdir(job.id).logs / "worker-0.log").exists()  # it never ran
    finally:
        sup.backend.gate.set()
        stop_every_job(sup)


def test_a_copy_that_fills_the_disk_waits_for_space_and_then_starts(ma_home, tmp_path):
    """The store's disk (a 2 MB tmpfs here) fills while the copy runs: the job keeps its place
    in the queue and says it waits for space, its nodes are freed, admission does not prepare it
    again at once; once there is space it is copied and starts."""
    from ma_jupyter.service.prepared import PreparedStore

    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), GatedCopyBackend())
    try:
        sup.preparation.copies = PreparedStore(small / "prepared")
        data = _dataset(tmp_path, size=1_000_000)
        spec = JobSpec.model_validate(
            {
                "name": "full",
                "command": pycmd(READ),
                "specs": ["cpu.small"],
                "data_preparation": True,
                "datasets": [{"name": "d", "path": str(data)}],
            }
        )
        job = sup.submit(spec, "mallory")
        sup.tick()
        wait_for(sup.backend.copying.is_set, timeout=30)  # room was found for it, then
        (small / "ballast").write_bytes(b"x" * 1_500_000)  # something else fills the disk
        sup.backend.gate.set()
        wait_for(lambda: not sup.preparation.is_preparing(job.id), timeout=60)
        with sup.ledger.lock:  # the thread's last step, which took it out of preparation, is over
            pass
        reasons = " ".join(e.reason for e in sup.store.events(job.id))
        assert sup.store.get(job.id).status is JobStatus.queued, reasons
        assert "waiting: dataset d: disk full under" in reasons, reasons
        assert (
            job.id in sup.ledger.retry_at and sup.ledger.admit_retry is not None
        )  # tried again later, not now
        assert not sup.backend.ports._reserved_ports  # its nodes were freed
        assert not list(sup.preparation.copies.root.glob("*/copying-*"))  # nothing half copied is left
        sup.tick()  # before the retry time: not prepared again in a loop
        assert not sup.preparation.is_preparing(job.id)
        (small / "ballast").unlink()  # space again
        wait_for(lambda: sup.tick() or sup.store.get(job.id).status is JobStatus.running, timeout=90)
    finally:
        sup.backend.gate.set()
        stop_every_job(sup)
        subprocess.run(["umount", "-l", str(small)], check=False)


class StoreFailingOnce(Store):
    """A store whose read of one job fails once on the data-preparation thread (a database
    that cannot be read for a moment)."""

    failing: str | None = None

    def get(self, job_id):
        if job_id == self.failing and threading.current_thread().name.startswith("ma-prepare-"):
            self.failing = None
            raise sqlite3.OperationalError("disk I/O error")
        return super().get(job_id)


def test_a_store_error_after_the_copy_frees_the_nodes_and_the_job_is_tried_again(ma_home, tmp_path):
    store = StoreFailingOnce(config.db_path())
    sup = Supervisor(store, Scheduler(config.load_cluster()), LocalBackend())
    try:
        data = _dataset(tmp_path, size=1000)
        spec = JobSpec.model_validate(
            {
                "name": "flaky",
                "command": pycmd(READ),
                "specs": ["cpu.small"],
                "data_preparation": True,
                "datasets": [{"name": "d", "path": str(data)}],
            }
        )
        job = sup.submit(spec, "mallory")
        store.failing = job.id
        sup.tick()
        wait_for(lambda: not sup.preparation.is_preparing(job.id), timeout=60)
        with sup.ledger.lock:  # the thread's last step, which took it out of preparation, is over
            pass
        assert store.failing is None  # the failure happened
        assert sup.store.get(job.id).status is JobStatus.queued
        assert not sup.backend.ports._reserved_ports  # its nodes were freed
        assert job.id in sup.ledger.retry_at
        wait_for(lambda: sup.tick() or sup.store.get(job.id).status is JobStatus.running, timeout=60)
    finally:
        stop_every_job(sup)


def test_a_copy_that_would_cross_the_disk_reserve_waits_and_one_too_big_is_refused(ma_home, tmp_path):
    """The home (its jobs folder and the store) on a 24 MB disk keeping a 6 MB reserve: a copy
    of 8 MB while 12 MB are taken would leave less than the reserve, which the reserve's watch
    would take out on a running job: it waits instead, saying so, and is copied and started once
    there is room.  A dataset larger than the disk could ever take is refused by name."""
    cluster = (ma_home / "cluster.toml").read_text()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(ma_home)], check=True)
    try:
        (ma_home / "cluster.toml").write_text(cluster + "[limits]\ndisk_reserve_mb = 6\n")
        (ma_home / "ballast").write_bytes(b"x" * (12 << 20))
        sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
        try:
            big = tmp_path / "big"
            big.mkdir()
            (big / "blob.bin").write_bytes(os.urandom(8 << 20))
            (big / "x.txt").write_text("hello")
            huge = tmp_path / "huge"
            huge.mkdir()
            (huge / "blob.bin").write_bytes(b"\0" * (30 << 20))

            def spec(data):
                return JobSpec.model_validate(
                    {
                        "name": "reserve",
                        "command": pycmd(
                            "print('read', open('/workspace/dataset/d/x.txt').read(), flush=True)"
                        ),
                        "specs": ["cpu.small"],
                        "data_preparation": True,
                        "datasets": [{"name": "d", "path": str(data)}],
                    }
                )

            job = sup.submit(spec(big), "mallory")
            sup.tick()
            wait_for(lambda: not sup.preparation.is_preparing(job.id), timeout=60)
            with sup.ledger.lock:  # the preparing thread's last step is over
                pass
            reasons = " ".join(e.reason for e in sup.store.events(job.id))
            assert sup.store.get(job.id).status is JobStatus.queued, reasons
            assert "would leave less than the disk reserve (6 MB" in reasons, reasons
            assert not list(sup.preparation.copies.root.glob("*/data"))  # nothing was copied
            (ma_home / "ballast").unlink()
            wait_for(lambda: sup.tick() or sup.store.get(job.id).status is not JobStatus.queued, timeout=90)
            assert sup.store.get(job.id).status in (JobStatus.running, JobStatus.succeeded)

            too_big = sup.submit(spec(huge), "mallory")
            wait_for(
                lambda: sup.tick() or sup.store.get(too_big.id).status is not JobStatus.queued, timeout=60
            )
            reasons = " ".join(e.reason for e in sup.store.events(too_big.id))
            assert sup.store.get(too_big.id).status is JobStatus.error, reasons
            assert "run the job without data_preparation" in reasons, reasons
        finally:
            stop_every_job(sup)
    finally:
        subprocess.run(["umount", "-l", str(ma_home)], check=False)


def test_the_look_refuses_a_path_that_now_leads_into_the_service_home_or_elsewhere(ma_home, tmp_path):
    """The look (which gives the key and the size) checks the root it opened as the copy does:
    a folder on the resolved path swapped for a symlink into the jobs folder is refused by the
    mount rules, one swapped to another allowed folder is refused as changed."""
    from ma_jupyter.errors import InvalidSpec, RefusedFile
    from ma_jupyter.nodehost import prepare

    victim = config.jobs_root() / "victim-job" / "outputs" / "inner"
    victim.mkdir(parents=True)
    (victim / "results.txt").write_text("the victim's results")
    (tmp_path / "mine" / "d" / "inner").mkdir(parents=True)
    (tmp_path / "other" / "inner").mkdir(parents=True)
    source = str((tmp_path / "mine" / "d" / "inner").resolve())
    assert prepare.look_at_dataset("mallory", source).files == 0  # as submitted: allowed
    os.rename(tmp_path / "mine" / "d", tmp_path / "mine" / "d.mine")
    os.symlink(victim.parent, tmp_path / "mine" / "d")
    with pytest.raises(InvalidSpec, match="job service's home"):
        prepare.look_at_dataset("mallory", source)
    os.unlink(tmp_path / "mine" / "d")
    os.symlink(tmp_path / "other", tmp_path / "mine" / "d")
    with pytest.raises(RefusedFile, match="now leads to .*other/inner"):
        prepare.look_at_dataset("mallory", source)


def test_data_root_in_cluster_toml_sets_where_prepared_copies_live(ma_home, tmp_path):
    """``[data] root``: the admin's fast storage holds the copies, and a job reads its dataset
    from there; a relative root is refused naming the key."""
    cluster = ma_home / "cluster.toml"
    base = cluster.read_text() if cluster.exists() else ""
    cluster.write_text(base + '\n[data]\nroot = "relative/prepared"\n')
    with pytest.raises(InvalidSpec, match=r"\[data\] root 'relative/prepared': give an absolute folder"):
        config.prepared_root()
    fast = tmp_path / "fast"
    cluster.write_text(base + f"\n[data]\nroot = {str(fast)!r}\n")
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
    try:
        data = _dataset(tmp_path, size=1000)
        spec = JobSpec.model_validate(
            {
                "name": "fast",
                "command": pycmd(READ),
                "specs": ["cpu.small"],
                "data_preparation": True,
                "datasets": [{"name": "d", "path": str(data)}],
            }
        )
        job = sup.submit(spec, "me")

        def ended():
            sup.tick()
            sup.wait_idle()
            return sup.store.status(job.id).is_terminal()

        wait_for(ended, timeout=120)
        final = sup.store.get(job.id)
        log = (config.jobdir(job.id).logs / "worker-0.log").read_text()
        assert final.status is JobStatus.succeeded, (final.reason, log)
        assert "read hello" in log
        [entry] = sup.preparation.copies.entries(lambda _id: True)
        assert os.path.commonpath([entry.path, str(fast)]) == str(fast), entry.path
        assert not (ma_home / "prepared").exists() or not any((ma_home / "prepared").iterdir())
    finally:
        stop_every_job(sup)
