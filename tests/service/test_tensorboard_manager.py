"""The per-job TensorBoard manager: a real TensorBoard over real event files, started by the
local backend in its sandbox, stopped for good."""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil
import pytest
import requests
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.errors import InvalidSpec, RefusedFile
from ma_jupyter.models import Job, JobSpec
from ma_jupyter.service.tensorboard import TensorBoardManager
from tests.helpers import wait_for


def write_scalars(folder, tag="loss", steps=3):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"events.out.tfevents.{int(time.time())}.test", "wb") as fh:
        writer = RecordWriter(fh)
        writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        for step in range(steps):
            value = summary_pb2.Summary.Value(tag=tag, simple_value=1.0 / (step + 1))
            event = event_pb2.Event(
                wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])
            )
            writer.write(event.SerializeToString())
        writer.flush()


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
