"""The per-job TensorBoard manager: a real TensorBoard over real event files, started by the
local backend in its sandbox, stopped for good."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import psutil
import pytest
import requests
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.errors import Conflict, InvalidSpec, LimitReached, RefusedFile
from ma_jupyter.models import Job, JobSpec
from ma_jupyter.service.tensorboard import TensorBoardManager
from tests.fixtures.tensorboard import write_scalars
from tests.helpers import wait_for


def live_group_members(pgid):
    """Processes of the group that are still alive (zombies waiting for a reaper are dead)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return members


def job_over(outputs, job_id="job1", creator="alice") -> Job:
    """A job whose spec names ``outputs`` as its outputs folder (as a submit records it)."""
    spec = JobSpec(name=job_id, command="true", outputs=str(outputs), creator=creator)
    return Job(id=job_id, spec=spec, outputs_folder=str(outputs))


@pytest.fixture
def ma_manager(ma_home, tmp_path):
    """A manager whose boards the local backend starts (bubblewrap where it works: the job's
    account, only its outputs in view)."""
    manager = TensorBoardManager(LocalBackend().start_outputs_reader, idle_timeout=None, log_dir=tmp_path)
    yield manager
    manager.shutdown()


def test_start_serves_runs_under_prefix_and_stop_ends_group(tmp_path, ma_manager):
    outputs = tmp_path / "outputs"
    write_scalars(outputs / "train")
    url = ma_manager.start(job_over(outputs))
    assert url.startswith("http://127.0.0.1:") and "/tb/job1/" in url
    assert requests.get(url + "data/runs", timeout=10).json() == ["train"]
    # without the path's secret the board serves nothing, whatever the path
    board = url.split("/tb/")[0]
    for guess in ("/", "/tb/job1/", "/tb/job1/data/runs", "/data/runs"):
        assert requests.get(board + guess, timeout=10).status_code == 404, guess
    # and the secret is on no command line (every local user reads those)
    secret = url.rstrip("/").rsplit("/", 1)[1]
    assert len(secret) >= 24
    processes = ma_manager._boards["job1"].processes()
    assert len(processes) >= 2  # the sandbox's and TensorBoard's
    for process in processes:
        assert secret not in " ".join(process.cmdline())
    tags = requests.get(url + "data/plugin/scalars/tags", timeout=10).json()
    assert "loss" in tags["train"]
    points = requests.get(
        url + "data/plugin/scalars/scalars", params={"run": "train", "tag": "loss"}, timeout=10
    ).json()
    assert [p[1] for p in points] == [0, 1, 2]  # (wall time, step, value) per point
    # a second start reuses the same TensorBoard
    assert ma_manager.start(job_over(outputs)) == url
    pid = ma_manager._boards["job1"].proc.pid
    assert len(live_group_members(pid)) >= 1
    assert ma_manager.stop("job1") is True
    assert live_group_members(pid) == []
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "data/runs", timeout=5)
    assert ma_manager.stop("job1") is False


def test_stop_idle_stops_unused_only(tmp_path, ma_manager):
    outputs = tmp_path / "outputs"
    write_scalars(outputs / "run")
    ma_manager.start(job_over(outputs, "a"))
    ma_manager.start(job_over(outputs, "b"))
    ma_manager._boards["a"].last_used -= 100
    assert ma_manager.stop_idle(50) == ["a"]
    assert set(ma_manager.running()) == {"b"}
    # an open connection (a browser's) counts as use: it is held by TensorBoard inside the
    # sandbox, not by the sandbox's leader the manager started
    board = ma_manager._boards["b"]
    with socket.create_connection(("127.0.0.1", board.port), timeout=10):
        wait_for(board.has_clients, timeout=30)
        board.last_used -= 100
        assert ma_manager.stop_idle(50) == []
    assert ma_manager.stop_idle(0) == ["b"]


def test_missing_logdir_is_a_typed_error(tmp_path, ma_manager):
    with pytest.raises(InvalidSpec, match="not a folder"):
        ma_manager.start(job_over(tmp_path / "nope", "x"))


def test_an_outputs_folder_that_now_leads_elsewhere_is_refused(ma_home, tmp_path, ma_manager):
    # a spec's folder replaced by a symlink into the service's home (every job's folder)
    planted = tmp_path / "planted"
    planted.symlink_to(ma_home / "jobs")
    (ma_home / "jobs").mkdir(exist_ok=True)
    with pytest.raises(InvalidSpec, match="job service's home"):
        ma_manager.start(job_over(planted, "p"))
    # the default folder of a job (in its job folder) is never reached through a symlink
    job_dir = ma_home / "jobs" / "d"
    job_dir.mkdir(parents=True)
    (job_dir / "outputs").symlink_to(tmp_path)
    spec = JobSpec(name="d", command="true", creator="alice")
    with pytest.raises(RefusedFile, match="not a folder"):
        ma_manager.start(Job(id="d", spec=spec, outputs_folder=str(job_dir / "outputs")))
    assert ma_manager.running() == {}


def test_without_a_sandbox_a_board_runs_only_as_the_services_own_account(ma_root_jobs, tmp_path):
    """The symlink mode (no bubblewrap): the job's nodes run unsandboxed as the service's own
    account, and so does its board, over the host's view; a job of another account is refused
    its board, as its nodes are."""
    manager = TensorBoardManager(LocalBackend(sandbox="symlink").start_outputs_reader, idle_timeout=None)
    outputs = tmp_path / "outputs"
    write_scalars(outputs / "run")
    try:
        if os.geteuid() == 0:
            with pytest.raises(InvalidSpec, match="install bubblewrap"):
                manager.start(job_over(outputs, "other", creator="alice"))  # would run as nobody
        own = "root" if os.geteuid() == 0 else None  # root's jobs run as root here (allow_root)
        url = manager.start(job_over(outputs, "own", creator=own))
        assert requests.get(url + "data/runs", timeout=10).json() == ["run"]
        board = manager._boards["own"]
        assert board.processes()[0].uids().real == os.geteuid()
        assert board.processes()[0].exe() != "/usr/bin/bwrap"
    finally:
        manager.shutdown()


def test_a_board_outlives_the_request_thread_that_asked_for_it(tmp_path, ma_manager):
    """Boards end with the thread that started them (bubblewrap's --die-with-parent): the
    manager starts them from a thread of its own, never from the request's, which ends."""
    outputs = tmp_path / "outputs"
    write_scalars(outputs / "run")
    urls = []
    request = threading.Thread(target=lambda: urls.append(ma_manager.start(job_over(outputs))))
    request.start()
    request.join(120)
    assert urls, "the board did not start"
    for _ in range(3):  # the parent-death signal comes at once when it comes
        assert requests.get(urls[0] + "data/runs", timeout=10).json() == ["run"]
        assert ma_manager._boards["job1"].alive()
        time.sleep(0.3)


def write_images(folder, tags: int, megabytes_each: int = 1, steps: int = 10):
    """What a hostile job leaves in its outputs: ``tags`` image summaries of ``steps`` images of
    ``megabytes_each`` MB each (TensorBoard keeps 10 per tag).  The records' data checksums are
    left zero (computing them in pure Python takes ~40 s for 100 MB here); TensorBoard's data
    server loads such records all the same."""
    folder.mkdir(parents=True, exist_ok=True)
    blob = os.urandom(megabytes_each << 20)
    path = folder / f"events.out.tfevents.{time.time_ns()}.images"
    with open(path, "wb") as fh:
        for step in range(steps):
            for tag in range(tags):
                image = summary_pb2.Summary.Image(height=1, width=1, colorspace=3, encoded_image_string=blob)
                value = summary_pb2.Summary.Value(tag=f"image{tag}", image=image)
                data = event_pb2.Event(
                    wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])
                ).SerializeToString()
                header = struct.pack("<Q", len(data))
                fh.write(header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", 0))


def test_a_board_past_its_memory_limit_is_ended_with_the_reason(ma_home, tmp_path):
    """The hostile job: its outputs fill with image summaries while its board runs; the board,
    not the service, ends once it holds more than its limit, and its state says why; another
    job's board runs on."""
    manager = TensorBoardManager(
        LocalBackend().start_outputs_reader, idle_timeout=None, log_dir=tmp_path, memory_limit_mb=150
    )
    try:
        quiet, hostile = tmp_path / "quiet", tmp_path / "hostile"
        write_scalars(quiet / "run")
        write_scalars(hostile / "run")
        quiet_url = manager.start(job_over(quiet, "quiet"), "alice")
        manager.start(job_over(hostile, "hostile"), "mallory")
        pid = manager._boards["hostile"].proc.pid
        assert manager.state("hostile")["state"] == "running"
        write_images(hostile / "images", tags=12)  # ~120 MB, which the board loads
        wait_for(lambda: manager.state("hostile")["state"] == "ended", timeout=180)
        reason = manager.state("hostile")["reason"]
        assert "tensorboard_memory_mb of 150 MB" in reason and "hostile" in reason, reason
        wait_for(lambda: live_group_members(pid) == [], timeout=60)  # TERM, INT, then KILL
        assert manager.running().keys() == {"quiet"}
        assert requests.get(quiet_url + "data/runs", timeout=10).json() == ["run"]
        # it counts no more against its starter
        assert manager._held_by("mallory") == set()
    finally:
        manager.shutdown()


def test_a_user_has_at_most_max_per_user_boards_starting_or_running(ma_home, tmp_path):
    manager = TensorBoardManager(
        LocalBackend().start_outputs_reader, idle_timeout=None, log_dir=tmp_path, max_per_user=2
    )
    try:
        outputs = tmp_path / "outputs"
        write_scalars(outputs / "run")
        jobs = {name: job_over(outputs, name) for name in ("a", "b", "c", "d")}
        url_a = manager.start(jobs["a"], "bob")
        manager.start(jobs["b"], "bob")
        with pytest.raises(LimitReached, match="max_tensorboards_per_user is 2") as refused:
            manager.begin(jobs["c"], "bob")
        assert refused.value.status == 429 and "a, b" in refused.value.message
        assert "c" not in manager.running()
        # another user is not held back by bob's boards, and a running board is reused by anyone
        # without counting for them
        manager.start(jobs["c"], "alice")
        assert manager.start(jobs["a"], "alice") == url_a
        manager.start(jobs["d"], "alice")
        # a board bob's stopped (or that ended) frees his room
        assert manager.stop("a") is True
        assert manager.start(jobs["a"], "bob") != url_a
    finally:
        manager.shutdown()


def test_a_start_waits_on_the_managers_thread_never_the_callers(tmp_path):
    """Boards that never answer (TensorBoard loading for long) hold no caller: ``begin`` returns
    at once for each, they start side by side, and stopping one that starts ends it."""
    started: list[subprocess.Popen] = []

    def silent_reader(job, argv, env, output):  # a board that never answers
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        started.append(proc)
        return proc

    manager = TensorBoardManager(silent_reader, idle_timeout=None, start_timeout=600)
    try:
        futures = [manager.begin(job_over(tmp_path, f"slow{i}"), f"user{i}") for i in range(3)]
        assert not any(f.done() for f in futures)
        wait_for(lambda: len(started) == 3, timeout=60)  # all three launched, none waits for another
        assert [manager.state(f"slow{i}")["state"] for i in range(3)] == ["starting"] * 3
        assert manager.started_by("slow1") == "user1"
        assert manager.begin(job_over(tmp_path, "slow1"), "user9") is futures[1]  # one start per job
        for i in range(3):
            assert manager.stop(f"slow{i}") is True
        for future in futures:
            with pytest.raises(Conflict, match="stopped while it started"):
                future.result(timeout=60)
        for proc in started:
            assert proc.wait(30) is not None
    finally:
        manager.shutdown()
        for proc in started:
            if proc.poll() is None:
                proc.kill()
