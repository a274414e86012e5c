"""A resumed or restarted attempt on a Ray machine that does not share the service's outputs
folder starts with the service's copy of it (``backends/ray/outputs_seed.py``), played by a
hostile job: the agent's side runs for real on a Ray node's folder laid out as the agents lay it
out, reached through a call adapter in place of Ray's actor call."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from ma_jupyter.backends.ray import outputs_return, outputs_seed
from ma_jupyter.errors import Conflict, DiskFull, InvalidSpec, RefusedFile
from ma_jupyter.models import RunAs

ACCOUNT = RunAs(name="nobody", uid=65534, gid=65534)


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _Agent:
    """The agent's methods of the copy, called in this process (``.remote`` returns the answer);
    the bytes of each write call are kept."""

    def __init__(self):
        self.calls: list[int] = []
        self.outputs_seen = _Call(outputs_return.seen)
        self.outputs_seed_listing = _Call(outputs_seed.node_listing)
        self.outputs_seed_room = _Call(outputs_seed.room)
        self.outputs_seed_write = _Call(self._write)

    def _write(self, node_root, job_id, pieces, account, reserve):
        self.calls.append(sum(len(p[3]) for p in pieces))
        outputs_seed.write(node_root, job_id, pieces, account, reserve)


def _service(tmp_path: Path, job: str = "j1") -> tuple[Path, Path]:
    root = tmp_path / "service" / "jobs" / job
    (root / "outputs").mkdir(parents=True)
    return root, root / "outputs"


def _seed(agent, node_root: Path, root: Path, *, reserve: int = 0, cancel=None, said=None, account=ACCOUNT):
    return outputs_seed.seed(
        lambda answer: answer,
        agent,
        str(node_root),
        root.name,
        root / "outputs",
        root,
        account,
        reserve,
        cancel or threading.Event(),
        (said if said is not None else []).append,
        "ray-bbbbbbbb",
    )


def test_an_attempt_on_another_machine_starts_with_the_services_copy_and_keeps_its_own_files(
    tmp_path, monkeypatch
):
    """The fixed-name checkpoint of step 1000 the service holds replaces the stale one of step 100
    that an earlier attempt left on this machine, in pieces no bigger than a batch, owned by the
    job's account with the service's modification time; a file only the node has stays; a
    second copy sends nothing, and what the node holds then is what its copy back has."""
    monkeypatch.setattr(outputs_return, "CHUNK", 5)
    monkeypatch.setattr(outputs_seed, "BATCH", 5)
    root, here = _service(tmp_path)
    (here / "tb").mkdir()
    (here / "checkpoint.pt").write_bytes(b"step 1000 weights")
    (here / "tb" / "events.out.tfevents.1").write_bytes(b"scalars")
    (here / "empty").write_bytes(b"")
    node_root = tmp_path / "node_b"
    (node_root / "j1" / "outputs").mkdir(parents=True)
    (node_root / "j1" / "outputs" / "checkpoint.pt").write_bytes(b"step 100")
    older = (here / "checkpoint.pt").stat().st_mtime_ns - 60 * 10**9  # before the service's copy
    os.utime(node_root / "j1" / "outputs" / "checkpoint.pt", ns=(older, older))
    (node_root / "j1" / "outputs" / "mine.txt").write_text("written on b only")
    # written on the node after the service's copy of it (its copy back never came): kept
    (here / "last.pt").write_bytes(b"step 1")
    (node_root / "j1" / "outputs" / "last.pt").write_bytes(b"step 2")
    newer = (here / "last.pt").stat().st_mtime_ns + 60 * 10**9
    os.utime(node_root / "j1" / "outputs" / "last.pt", ns=(newer, newer))
    agent, said = _Agent(), []
    holds = _seed(agent, node_root, root, said=said)
    node = node_root / "j1" / "outputs"
    assert (node / "checkpoint.pt").read_bytes() == b"step 1000 weights"
    assert (node / "tb" / "events.out.tfevents.1").read_bytes() == b"scalars"
    assert (node / "empty").read_bytes() == b""
    assert (node / "mine.txt").read_text() == "written on b only"
    assert (node / "last.pt").read_bytes() == b"step 2"
    assert max(agent.calls) <= 5 and sum(agent.calls) == len(b"step 1000 weights") + len(b"scalars")
    for name in ("checkpoint.pt", "tb", "tb/events.out.tfevents.1", "empty"):
        assert (node / name).stat().st_uid == ACCOUNT.uid, name
    assert (node / "checkpoint.pt").stat().st_mtime_ns == (here / "checkpoint.pt").stat().st_mtime_ns
    assert not [p for p in node.rglob("*.part")]
    # what the node holds as the service's copy; its own file is still to be copied back
    assert holds == {
        r: v for r, v in outputs_return.listing(str(node)).items() if r not in ("mine.txt", "last.pt")
    }
    assert any("3 file(s)" in line and "ray-bbbbbbbb" in line for line in said)
    again = _Agent()
    assert _seed(again, node_root, root) == holds
    assert again.calls == []
    # a machine the job never ran on: the job's folder is the agent's, as a launch makes it
    # (it later writes the nodes' files there), only the outputs folder the job's account's
    fresh = tmp_path / "node_c"
    _seed(_Agent(), fresh, root)
    assert (fresh / "j1").stat().st_uid == os.geteuid()
    assert (fresh / "j1" / "outputs").stat().st_uid == ACCOUNT.uid


def test_the_services_very_folder_is_not_copied_onto_itself(tmp_path):
    """The Ray node's folder is the service's own (the same machine and node_root, or shared
    storage): the probe finds it, nothing is written, and the probe is gone."""
    root, here = _service(tmp_path)
    (here / "checkpoint.pt").write_bytes(b"w")
    agent = _Agent()
    assert _seed(agent, root.parent, root) == {}
    assert agent.calls == []
    assert sorted(p.name for p in here.iterdir()) == ["checkpoint.pt"]


def test_the_first_attempt_costs_nothing(tmp_path):
    """No service copy yet (the first attempt): no call reaches the agent."""
    root = tmp_path / "service" / "jobs" / "j1"
    root.mkdir(parents=True)
    assert _seed(object(), tmp_path / "node_b", root) == {}


def test_a_link_planted_in_the_nodes_folder_is_never_written_through(tmp_path):
    """The job left, on the Ray node, a link where the service's copy has a file (replaced, its
    target untouched), a link where it has a folder, and its outputs folder swapped for a link:
    nothing is written outside the folder, and the attempt fails naming the link."""
    root, here = _service(tmp_path)
    (here / "tb").mkdir()
    (here / "tb" / "x").write_text("from the service")
    (here / "ckpt").write_text("from the service")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    node = tmp_path / "node_b" / "j1" / "outputs"
    node.mkdir(parents=True)
    (node / "ckpt").symlink_to(secret)
    (node / "tb").symlink_to(elsewhere)
    with pytest.raises(RefusedFile, match="ray-bbbbbbbb.*tb is a link or not a folder"):
        _seed(_Agent(), tmp_path / "node_b", root)
    assert list(elsewhere.iterdir()) == []
    assert secret.read_text() == "host secret"
    (node / "tb").unlink()
    _seed(_Agent(), tmp_path / "node_b", root)
    assert not (node / "ckpt").is_symlink() and (node / "ckpt").read_text() == "from the service"
    assert secret.read_text() == "host secret"
    shutil.rmtree(node)
    node.symlink_to(elsewhere)  # the whole outputs folder
    with pytest.raises(RefusedFile, match="outputs is a link or not a folder"):
        _seed(_Agent(), tmp_path / "node_b", root)
    assert list(elsewhere.iterdir()) == []


def test_a_copy_the_nodes_disk_cannot_take_beside_the_reserve_fails_before_a_byte_is_sent(tmp_path):
    """A sparse file larger than the Ray node's disk fails the attempt (InvalidSpec); one that
    fits the disk but not beside the reserve keeps the job queued (DiskFull); neither reads
    nor writes anything of it."""
    root, here = _service(tmp_path)
    usage = shutil.disk_usage(tmp_path)
    with open(here / "huge.pt", "wb") as fh:
        fh.truncate(usage.total + (1 << 30))  # a hole: no block of it on the service's disk
    agent = _Agent()
    with pytest.raises(InvalidSpec, match=r"ray-bbbbbbbb.*disk_reserve_mb"):
        _seed(agent, tmp_path / "node_b", root)
    (here / "huge.pt").unlink()
    (here / "ckpt.pt").write_bytes(b"x" * 4096)
    with pytest.raises(DiskFull, match=r"ray-bbbbbbbb.*disk reserve"):
        _seed(agent, tmp_path / "node_b", root, reserve=shutil.disk_usage(tmp_path).free)
    assert agent.calls == []
    assert list((tmp_path / "node_b" / "j1" / "outputs").iterdir()) == []


def test_a_piece_past_the_reserve_is_not_written(tmp_path):
    """The agent checks each piece again: one that would leave less than the reserve free leaves
    nothing of its file."""
    node_root = tmp_path / "node_b"
    pieces = [("ckpt.pt", "0" * 16, 0, b"abc", 6, 0)]
    with pytest.raises(DiskFull, match="disk reserve"):
        outputs_seed.write(str(node_root), "j1", pieces, None, shutil.disk_usage(tmp_path).free)
    assert list((node_root / "j1" / "outputs").iterdir()) == []


def test_too_many_files_and_a_stopped_job_fail_the_copy(tmp_path, monkeypatch):
    """A service copy over the listing's bound of files fails with the bound; a job stopped
    meanwhile ends the copy (Conflict)."""
    root, here = _service(tmp_path)
    for n in range(6):
        (here / f"f{n}").write_text("x")
    monkeypatch.setattr(outputs_return, "MAX_FILES", 5)
    with pytest.raises(RefusedFile, match="more than 5 files"):
        _seed(_Agent(), tmp_path / "node_b", root)
    monkeypatch.setattr(outputs_return, "MAX_FILES", 100)
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(Conflict, match="ended while its outputs were copied"):
        _seed(_Agent(), tmp_path / "node_b", root, cancel=stopped)


def test_a_path_that_is_not_plain_is_refused_by_the_agent(tmp_path):
    """The agent refuses what no service would send: a path leaving the folder, or a bad token."""
    node_root = tmp_path / "node_b"
    for relative, token in (("../escape", "0" * 16), ("a/../../b", "0" * 16), ("ok", "../x")):
        with pytest.raises(RefusedFile):
            outputs_seed.write(str(node_root), "j1", [(relative, token, 0, b"x", 1, 0)], None, 0)
    assert not (node_root / "j1" / "escape").exists() and not (tmp_path / "b").exists()
    assert os.listdir(node_root / "j1" / "outputs") == []


def test_what_was_carried_to_the_node_is_not_copied_back_until_it_changes(tmp_path):
    """Rule 6 (``outputs_return`` rule 6): the copy back of the attempt starts knowing what the
    node's folder got from the service, so a carried checkpoint is not read back through the
    agent; one the attempt writes anew is."""
    root, here = _service(tmp_path)
    (here / "checkpoint.pt").write_bytes(b"step 1000 weights")
    node_root = tmp_path / "node_b"
    holds = _seed(_Agent(), node_root, root, account=None)
    read: list[str] = []

    class Back(_Agent):
        def __init__(self):
            super().__init__()
            self.outputs_listing = _Call(outputs_return.listing)
            self.outputs_read = _Call(lambda o, r, *a: read.append(r) or outputs_return.read_piece(o, r, *a))

    returns = outputs_return.OutputsReturn(lambda answer: answer, lambda: None)
    node = node_root / "j1" / "outputs"
    (node / "events.1").write_bytes(b"new scalars")
    key = ("j1", 1, "worker-0")
    returns.watch(key, Back(), str(node), here, root, copied=holds)
    assert returns.settled(key, wait=60)
    assert read == ["events.1"]
    assert (here / "events.1").read_bytes() == b"new scalars"


def test_which_attempts_are_carried(ma_home):
    """Contract rule 30's cheap look: not the first attempt, not a named or object storage
    outputs folder, and only when the service's copy holds something."""
    from types import SimpleNamespace

    from ma_jupyter import config

    def job(attempt: int, outputs: str | None = None):
        return SimpleNamespace(id="j9", attempt=attempt, spec=SimpleNamespace(outputs=outputs))

    seeds = outputs_seed.SeedsOutputs()
    assert not seeds.seeds_outputs(job(1))  # no copy here yet
    config.jobdir("j9").outputs.mkdir(parents=True)
    assert not seeds.seeds_outputs(job(1))  # an empty one
    (config.jobdir("j9").outputs / "checkpoint.pt").write_bytes(b"w")
    assert seeds.seeds_outputs(job(1))
    assert not seeds.seeds_outputs(job(0))
    assert not seeds.seeds_outputs(job(1, "/data/out")) and not seeds.seeds_outputs(job(1, "s3://b/p"))
