"""The Ray backend's copy of a node's outputs back to the service's machine
(``backends/ray/outputs_return.py``) and its look for the host paths a job names
(``backends/ray/node_paths.py``), played by a hostile job: the agent's side runs for real on a
folder the "job" wrote, reached through a call adapter in place of Ray's actor call."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ma_jupyter.backends.ray import node_paths, outputs_return
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import ImageInfo, Mount, NodeLaunch


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _Agent:
    """The agent's two methods, called in this process (``.remote`` returns the answer)."""

    def __init__(self):
        self.outputs_listing = _Call(outputs_return.listing)
        self.outputs_read = _Call(outputs_return.read_piece)


def _returns():
    woken = threading.Event()
    return outputs_return.OutputsReturn(lambda answer: answer, lambda: woken.set), woken


def test_a_nodes_outputs_come_back_whole_and_nothing_the_job_planted_is_followed(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs_return, "CHUNK", 7)  # several pieces per file
    node = tmp_path / "node" / "outputs"  # the node's outputs folder on its Ray node
    (node / "tb").mkdir(parents=True)
    (node / "tb" / "events.out.tfevents.1").write_bytes(b"0123456789" * 5)
    (node / "ckpt.pt").write_bytes(b"weights")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (node / "link").symlink_to(secret)  # a link to a file of the Ray node's machine
    os.link(secret, node / "hard")  # a second name of it
    os.mkfifo(node / "fifo")  # a read would block
    job = tmp_path / "service" / "jobs" / "j1"
    here = job / "outputs"
    job.mkdir(parents=True)
    returns, woken = _returns()
    key = ("j1", 0, "worker-0")
    returns.watch(key, _Agent(), str(node), here, job)
    assert returns.settled(key, wait=60)  # the node ended: the last copy is made, then the wake
    assert woken.is_set()
    assert (here / "tb" / "events.out.tfevents.1").read_bytes() == b"0123456789" * 5
    assert (here / "ckpt.pt").read_bytes() == b"weights"
    assert sorted(p.name for p in here.rglob("*")) == ["ckpt.pt", "events.out.tfevents.1", "tb"]


def test_a_link_planted_in_the_services_outputs_folder_is_never_written_through(tmp_path):
    node = tmp_path / "node" / "outputs"
    (node / "tb").mkdir(parents=True)
    (node / "tb" / "x").write_text("from the job")
    (node / "y").write_text("plain")
    job = tmp_path / "jobs" / "j2"
    here = job / "outputs"
    here.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (here / "tb").symlink_to(elsewhere)  # the folder the copy would enter
    returns, _ = _returns()
    key = ("j2", 0, "worker-0")
    returns.watch(key, _Agent(), str(node), here, job)
    assert returns.settled(key, wait=60)
    assert list(elsewhere.iterdir()) == []
    assert (here / "y").read_text() == "plain"


def test_only_plain_relative_paths_are_copied():
    assert outputs_return.plain("a/b.txt")
    for bad in ("", "../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\0b"):
        assert not outputs_return.plain(bad), bad


def test_a_ray_node_lacking_a_named_host_path_is_refused_naming_both(tmp_path):
    have = tmp_path / "have"
    have.mkdir()
    job_dir = tmp_path / "nodes" / "j3"
    launch = NodeLaunch(
        name="worker-0",
        role="worker",
        index=0,
        primary=True,
        host="h",
        hostname="worker-0",
        address="127.0.0.1",
        argv=["true"],
        env={},
        mounts=[
            Mount(source=str(have), target="/workspace/dataset/private/a", read_only=True, kind="dataset"),
            Mount(
                source=str(tmp_path / "gone"), target="/workspace/volume/v", read_only=False, kind="volume"
            ),
            Mount(
                source=str(tmp_path / "made"),
                target="/workspace/volume/w",
                read_only=False,
                kind="volume",
                create=True,
            ),
            Mount(
                source=str(job_dir / "prepared" / "x"),
                target="/workspace/model/m",
                read_only=True,
                kind="model",
            ),
        ],
        image=ImageInfo(python=str(tmp_path / "venv" / "bin" / "python"), bin_dir="", roots=[], env={}),
    )
    with pytest.raises(InvalidSpec) as refused:
        node_paths.check([launch], str(job_dir), "ray-1234abcd")
    said = str(refused.value)
    assert "Ray node ray-1234abcd has no volume " + str(tmp_path / "gone") in said
    assert f"the image's interpreter {tmp_path}/venv/bin/python" in said
    assert str(have) not in said and "made" not in said and "prepared" not in said
    node_paths.check(
        [launch.model_copy(update={"mounts": launch.mounts[:1], "image": None})], str(job_dir), "r"
    )


def test_the_listing_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs_return, "MAX_FILES", 3)
    for i in range(5):
        (tmp_path / f"f{i}").write_text("x")
    from ma_jupyter.errors import RefusedFile

    with pytest.raises(RefusedFile, match="more than 3 files"):
        outputs_return.listing(str(tmp_path))
    assert outputs_return.listing(str(tmp_path / "none")) == {}
    assert Path(tmp_path).is_dir()
