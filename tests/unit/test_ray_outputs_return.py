"""The Ray backend's copy of a node's outputs back to the service's machine
(``backends/ray/outputs_return.py``) and its look for the host paths a job names
(``backends/ray/node_paths.py``), played by a hostile job: the agent's side runs for real on a
folder the "job" wrote, reached through a call adapter in place of Ray's actor call."""

from __future__ import annotations

import gc
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


# ------------------------------------------------ a named outputs host path (rule 5)

NOBODY = 65534  # the job's account of these tests: never the service's (root's) rights


class _NamedAgent(_Agent):
    """The agent's calls for a named folder, counted (a probe that finds the very folder copies
    nothing: no listing)."""

    def __init__(self):
        super().__init__()
        self.listings = 0

        def listing(outputs, owner=None):
            self.listings += 1
            return outputs_return.listing(outputs, owner)

        self.outputs_listing = _Call(listing)
        self.outputs_seen = _Call(outputs_return.seen)


def _owned(*paths: Path) -> None:
    for path in paths:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def _named_watch(node: Path, here: Path, check=lambda opened: None, reserve: int = 0):
    from ma_jupyter.models import RunAs

    returns, _ = _returns()
    agent = _NamedAgent()
    key = ("j5", 0, "worker-0")

    def start():
        return outputs_return.NamedFolder(
            str(here), RunAs(name="nobody", uid=NOBODY, gid=NOBODY), check, reserve
        )

    returns.watch(key, agent, str(node), here, here, named=start)
    assert returns.settled(key, wait=120)
    return agent


@pytest.mark.skipif(os.geteuid() != 0, reason="writes as another account: needs root, as the service")
def test_a_named_outputs_folder_comes_back_as_the_jobs_account_and_nothing_planted_is_followed(tmp_path):
    """A hostile job on the Ray node (its named folder holds links, a second name of a host
    file, a root-owned file and folder) and a hostile user on the service's machine (links
    planted at the places the copy writes): what comes back is the job account's own files,
    written by that account (never root) with their times, and nothing outside the folder is
    read or written."""
    node = tmp_path / "ray-node" / "out"  # the named path on the Ray node's machine
    (node / "tb").mkdir(parents=True)
    (node / "tb" / "events.out.tfevents.1").write_bytes(b"scalars" * 1000)
    (node / "ckpt.pt").write_bytes(b"weights")
    os.utime(node / "ckpt.pt", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    secret = tmp_path / "ray-node" / "secret"
    secret.write_text("the Ray machine's secret")
    (node / "link").symlink_to(secret)
    os.link(secret, node / "hard")
    (node / "roots").write_text("root's file in the job's folder")  # not the account's
    (node / "rootdir").mkdir()
    (node / "rootdir" / "x").write_text("below a folder of root's")
    _owned(node, node / "tb", node / "tb" / "events.out.tfevents.1", node / "ckpt.pt", node / "rootdir" / "x")
    here = tmp_path / "service" / "out"  # the same path on the service's machine
    here.mkdir(parents=True)
    elsewhere = tmp_path / "service" / "elsewhere"
    elsewhere.mkdir()
    victim = tmp_path / "service" / "victim"
    victim.write_text("the service machine's file")
    (here / "tb").symlink_to(elsewhere)  # the folder the copy would enter
    (here / "ckpt.pt").symlink_to(victim)  # the file the copy would replace
    _owned(here)

    _named_watch(node, here)
    assert victim.read_text() == "the service machine's file" and list(elsewhere.iterdir()) == []
    got = here / "ckpt.pt"
    assert not got.is_symlink() and got.read_bytes() == b"weights"  # the link replaced, not followed
    assert got.stat().st_uid == NOBODY and got.stat().st_mtime_ns == 1_600_000_000_000_000_000
    assert (here / "tb").is_symlink()  # the events below it are refused, never written through
    names = sorted(p.name for p in here.iterdir())
    assert names == ["ckpt.pt", "tb"], names  # no link, second name, root's file or folder, probe, part


@pytest.mark.skipif(os.geteuid() != 0, reason="writes as another account: needs root, as the service")
def test_a_named_folder_that_is_the_nodes_own_or_not_the_accounts_gets_nothing(tmp_path):
    """The probe finds the very folder (the Ray node on this machine, or shared storage): nothing
    is listed or copied; a folder the account may not write, or one the mount rules refuse where
    it leads now, gets nothing either (the service never writes it with its own rights)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "a.txt").write_text("written by the node itself")
    _owned(shared, shared / "a.txt")
    agent = _named_watch(shared, shared)
    assert agent.listings == 0 and sorted(p.name for p in shared.iterdir()) == ["a.txt"]

    node = tmp_path / "node"
    node.mkdir()
    (node / "a.txt").write_text("x")
    _owned(node, node / "a.txt")
    roots = tmp_path / "roots"  # root's, 0755: the account may not write it
    roots.mkdir(mode=0o755)
    _named_watch(node, roots)
    assert list(roots.iterdir()) == []

    def refuse(opened: str) -> None:
        raise InvalidSpec(f"outputs: {opened} is outside the allowed roots")

    mine = tmp_path / "mine"
    mine.mkdir()
    _owned(mine)
    agent = _named_watch(node, mine, check=refuse)
    assert list(mine.iterdir()) == [] and agent.listings == 0


def test_the_named_folders_writer_keeps_its_bounds_against_a_hostile_stream(tmp_path):
    """The writer itself (``outputs_writer.py``): names that are not plain relative paths, too
    deep, past its count of files, or past the disk reserve are refused, each leaving nothing;
    the stream stays in step after each refusal."""
    import io
    import json
    import struct

    from ma_jupyter.backends.ray import outputs_writer

    def stream(*files) -> io.BytesIO:
        """The service's side: a file's pieces follow only where the writer opened its place
        (the third item: whether it does)."""
        out = b""
        for path, data, opens in files:
            out += (json.dumps({"op": "file", "path": path, "mtime_ns": 0}) + "\n").encode()
            if opens:
                out += struct.pack(">Q", len(data)) + data + struct.pack(">Q", 0)
        return io.BytesIO(out)

    def answered(answers: io.StringIO) -> list[dict]:
        return [json.loads(line) for line in answers.getvalue().splitlines()]

    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        answers = io.StringIO()
        writer = outputs_writer.Writer(top, max_files=2, max_depth=3, reserve=0)
        outputs_writer.serve(
            writer,
            stream(
                ("../escape", b"x", False),
                ("a/../../escape", b"x", False),
                ("/abs", b"x", False),
                ("a/b/c/d/e", b"too deep", False),
                ("a/b/c/d", b"deep enough", True),
                ("one", b"1", True),
                ("two", b"2", False),  # the third file: past max_files
                ("one", b"1 again", True),  # a name written before still may be
            ),
            answers,
        )
        said = answered(answers)
        # one answer per refused file; two (open, then written) per file written
        assert [("ok" in a) for a in said] == [False] * 4 + [True] * 4 + [False] + [True] * 2, said
        assert "more than 3 folders deep" in said[3]["refused"] and "more than 2 files" in said[8]["refused"]
        assert (tmp_path / "a" / "b" / "c" / "d").read_bytes() == b"deep enough"
        assert (tmp_path / "one").read_bytes() == b"1 again" and not (tmp_path / "two").exists()
        assert not (tmp_path.parent / "escape").exists() and not (tmp_path / "abs").exists()

        huge = outputs_writer.Writer(top, max_files=10, max_depth=3, reserve=1 << 62)
        answers = io.StringIO()
        outputs_writer.serve(huge, stream(("big", b"x" * 1000, True), ("after", b"", True)), answers)
        said = answered(answers)
        assert said[0] == {"ok": True} and "disk reserve" in said[1]["refused"], said
        assert said[2:] == [{"ok": True}, {"ok": True}], said
        assert not (tmp_path / "big").exists()
        cut = stream(("cut", b"half of it", True)).getvalue()[:-12]  # the service went mid-file
        outputs_writer.serve(huge, io.BytesIO(cut), io.StringIO())
        assert not (tmp_path / "cut").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
        # a line longer than any request: out of step, the writer ends at once
        answers = io.StringIO()
        long = b'{"op": "probe", "name": "' + b"x" * outputs_writer.MAX_LINE + b'"}\n'
        outputs_writer.serve(huge, io.BytesIO(long + b'{"op": "probe", "name": "y"}\n'), answers)
        assert answers.getvalue() == ""
    finally:
        os.close(top)


def test_a_file_the_named_folders_writer_refuses_is_not_read_through_the_agent(tmp_path):
    """A hostile job's large file whose place the writer refuses (a link planted where its folder
    goes, or the disk reserve) is not streamed whole through the agent at every round: a place
    refused at the start reads nothing, a refusal mid-file stops the reads at once."""
    from ma_jupyter.errors import RefusedFile

    here = tmp_path / "here"
    here.mkdir()
    (here / "sub").symlink_to(tmp_path)  # where the file's folder would be
    pieces = 20  # the file's size as listed: 20 pieces
    reads: list[int] = []

    def read(offset: int) -> bytes:
        reads.append(offset)
        return b"x" * outputs_return.CHUNK

    writer = outputs_return.NamedFolder(str(here), None, lambda opened: None, 0)
    try:
        with pytest.raises(RefusedFile, match="link or not a folder"):
            writer.write("sub/big", 0, pieces * outputs_return.CHUNK, read)
        assert reads == []
        assert (
            writer.write("small", 0, 5, lambda offset: b"12345") and (here / "small").read_bytes() == b"12345"
        )
    finally:
        writer.close()
    full = outputs_return.NamedFolder(str(here), None, lambda opened: None, 1 << 62)
    try:
        with pytest.raises(RefusedFile, match="disk reserve"):
            full.write("big", 0, pieces * outputs_return.CHUNK, read)
        # the writer says so after the first piece; the second one sent completes only once
        # it read past its answer
        assert len(reads) <= 2, len(reads)
        assert full.write("empty", 0, 0, read)  # in step: the next file is answered for itself
    finally:
        full.close()
    assert sorted(p.name for p in here.iterdir()) == ["empty", "small", "sub"]


def test_a_path_too_long_for_the_writers_request_is_refused_and_the_stream_stays_in_step(tmp_path):
    """A hostile job's tree of long names, within the walk's depth, gives a relative path longer
    than one request line of the writer: it is refused naming the limit, and the files after it
    are answered for themselves (never another file's answer)."""
    from ma_jupyter.backends.ray import outputs_writer
    from ma_jupyter.errors import RefusedFile

    here = tmp_path / "here"
    here.mkdir()
    deep = "/".join(["d" * 250] * 300) + "/f"  # 75 kB, 300 folders: within the walk's 512
    assert len(deep) > outputs_writer.MAX_LINE
    writer = outputs_return.NamedFolder(str(here), None, lambda opened: None, 0)
    try:
        with pytest.raises(RefusedFile, match="longer than"):
            writer.write(deep, 0, 1, lambda offset: b"x")
        assert writer.write("after", 0, 2, lambda offset: b"ok")
        assert (here / "after").read_bytes() == b"ok"
    finally:
        writer.close()


def test_a_long_name_in_another_script_comes_back(tmp_path):
    """A name of 255 bytes in a script of 3-byte characters (85 of them, as ext4 allows) comes
    back, by the job folder's copy and by a named folder's writer alike (the new file beside its
    place has a name the disk takes)."""
    name = "数" * 85
    assert len(name.encode()) == 255
    node = tmp_path / "node" / "outputs"
    node.mkdir(parents=True)
    (node / name).write_bytes(b"scalars")
    job = tmp_path / "jobs" / "j6"
    here = job / "outputs"
    job.mkdir(parents=True)
    returns, _ = _returns()
    key = ("j6", 0, "worker-0")
    returns.watch(key, _Agent(), str(node), here, job)
    assert returns.settled(key, wait=60)
    assert (here / name).read_bytes() == b"scalars"
    named = tmp_path / "named"
    named.mkdir()
    writer = outputs_return.NamedFolder(str(named), None, lambda opened: None, 0)
    try:
        assert writer.write(name, 0, 7, lambda offset: b"scalars")
    finally:
        writer.close()
    assert (named / name).read_bytes() == b"scalars"


def test_a_refused_file_is_not_read_again_every_round_until_it_changes(tmp_path):
    """A hostile job's file that the service's disk cannot take (a sparse one of any size, say):
    once refused, the rounds while the node runs do not read it again through the agent while it
    is unchanged; a changed one, and the node's last copy, try again."""
    from ma_jupyter.backends.ray.outputs_return import _Node

    node_out = tmp_path / "node"
    node_out.mkdir()
    big = node_out / "big.bin"
    with open(big, "wb") as f:
        f.truncate(3 * outputs_return.CHUNK)  # sparse: nothing on the Ray node's disk
    here = tmp_path / "here"
    here.mkdir()
    agent = _Agent()
    reads: list[int] = []

    def read(outputs, relative, offset, limit, owner=None):
        reads.append(offset)
        return outputs_return.read_piece(outputs, relative, offset, limit, owner)

    agent.outputs_read = _Call(read)
    returns, _ = _returns()
    node = _Node(agent, str(node_out), here, here)
    node.writer = outputs_return.NamedFolder(str(here), None, lambda opened: None, 1 << 62)
    try:
        returns._copy(node)
        first = len(reads)
        assert 1 <= first <= 2 and not (here / "big.bin").exists()
        returns._copy(node)
        assert len(reads) == first, "read again while unchanged"
        os.utime(big, ns=(1, 1))
        returns._copy(node)
        assert len(reads) > first
        second = len(reads)
        returns._copy(node, last=True)
        assert len(reads) > second
    finally:
        node.writer.close()


def test_what_the_service_keeps_of_a_nodes_files_is_one_listings_worth(tmp_path):
    """A hostile job renaming its outputs every round: what the service keeps per node (the
    files copied, the files refused) is no more than the files there now, whatever names came
    and went before."""
    from ma_jupyter.backends.ray.outputs_return import _Node

    node_out = tmp_path / "node"
    node_out.mkdir()
    job = tmp_path / "jobs" / "j7"
    here = job / "outputs"
    here.mkdir(parents=True)
    returns, _ = _returns()
    node = _Node(_Agent(), str(node_out), here, job)
    for round_ in range(3):
        for old in node_out.iterdir():
            old.unlink()
        for i in range(4):
            (node_out / f"r{round_}-{i}").write_text("x")
        returns._copy(node)
    assert sorted(node.copied) == [f"r2-{i}" for i in range(4)]
    assert len(list(here.iterdir())) == 12  # a file the job removed stays here (rule 4)


def test_the_job_folders_copy_keeps_the_disk_reserve_free(tmp_path):
    """A hostile job's sparse file, as large as it likes, in its own outputs folder: its copy
    back into the service's job folder writes nothing past the disk reserve (``[limits]
    disk_reserve_mb``; here the whole disk, so nothing fits whatever others on this machine
    write meanwhile), stops reading at its first piece, and leaves no part file."""
    import shutil

    node_out = tmp_path / "node" / "outputs"
    node_out.mkdir(parents=True)
    with open(node_out / "huge.bin", "wb") as f:
        f.truncate(3 * outputs_return.CHUNK)
    job = tmp_path / "jobs" / "j8"
    here = job / "outputs"
    job.mkdir(parents=True)
    agent = _Agent()
    reads: list[int] = []

    def read(outputs, relative, offset, limit, owner=None):
        reads.append(offset)
        return outputs_return.read_piece(outputs, relative, offset, limit, owner)

    agent.outputs_read = _Call(read)
    returns, _ = _returns()
    key = ("j8", 0, "worker-0")
    returns.watch(key, agent, str(node_out), here, job, reserve=lambda: shutil.disk_usage(tmp_path).total)
    assert returns.settled(key, wait=60)
    assert not (here / "huge.bin").exists() and reads and set(reads) == {0}, reads  # never a 2nd piece
    assert list(here.iterdir()) == []


def test_a_named_folder_missing_on_the_services_machine_is_refused_as_such(tmp_path):
    from ma_jupyter.errors import RefusedFile

    with pytest.raises(RefusedFile, match="No such file"):
        outputs_return.NamedFolder(str(tmp_path / "gone"), None, lambda opened: None, 0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RefusedFile, match="Not a directory"):
        outputs_return.NamedFolder(str(tmp_path / "file"), None, lambda opened: None, 0)


def test_a_closed_writer_never_closes_a_descriptor_opened_after_it(tmp_path):
    """Closing a named folder's writer ends its input once: a descriptor this process opens
    afterwards under the same number (the jobs database's, in the service) outlives the writer."""
    here = tmp_path / "named"
    here.mkdir()
    writer = outputs_return.NamedFolder(str(here), None, lambda opened: None, 0)
    number = writer._in
    writer.close()
    opened: list[int] = []
    try:
        while number not in opened and len(opened) < 64:  # the lowest free number comes first
            opened.append(os.open(tmp_path / "db", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        assert number in opened
        del writer
        gc.collect()
        os.fstat(number)  # still open
    finally:
        for fd in opened:
            try:
                os.close(fd)
            except OSError:
                pass
