"""The per-job TensorBoard manager: a real TensorBoard over real event files, stopped for good."""

from __future__ import annotations

import os
import time

import psutil
import pytest
import requests
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.service.tensorboard import TensorBoardManager


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


@pytest.fixture
def ma_manager(tmp_path):
    manager = TensorBoardManager(idle_timeout=None, log_dir=tmp_path)
    yield manager
    manager.shutdown()


def test_start_serves_runs_under_prefix_and_stop_ends_group(tmp_path, ma_manager):
    outputs = tmp_path / "outputs"
    write_scalars(outputs / "train")
    url = ma_manager.start("job1", str(outputs))
    assert url.startswith("http://127.0.0.1:") and "/tb/job1/" in url
    assert requests.get(url + "data/runs", timeout=10).json() == ["train"]
    # without the path's secret the board serves nothing, whatever the path
    board = url.split("/tb/")[0]
    for guess in ("/", "/tb/job1/", "/tb/job1/data/runs", "/data/runs"):
        assert requests.get(board + guess, timeout=10).status_code == 404, guess
    # and the secret is on no command line (every local user reads those)
    secret = url.rstrip("/").rsplit("/", 1)[1]
    assert len(secret) >= 24
    assert secret not in " ".join(psutil.Process(ma_manager._boards["job1"].proc.pid).cmdline())
    tags = requests.get(url + "data/plugin/scalars/tags", timeout=10).json()
    assert "loss" in tags["train"]
    points = requests.get(
        url + "data/plugin/scalars/scalars", params={"run": "train", "tag": "loss"}, timeout=10
    ).json()
    assert [p[1] for p in points] == [0, 1, 2]  # (wall time, step, value) per point
    # a second start reuses the same TensorBoard
    assert ma_manager.start("job1", str(outputs)) == url
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
    ma_manager.start("a", str(outputs))
    ma_manager.start("b", str(outputs))
    ma_manager._boards["a"].last_used -= 100
    assert ma_manager.stop_idle(50) == ["a"]
    assert set(ma_manager.running()) == {"b"}


def test_missing_logdir_is_a_typed_error(tmp_path, ma_manager):
    with pytest.raises(InvalidSpec, match="not a folder"):
        ma_manager.start("x", str(tmp_path / "nope"))
