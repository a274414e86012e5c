"""The backend contract for logs and failure reports (docs: issue #7, rules 7 and 10).

``Backend.open_log`` gives a ``LogSource`` read by byte offset; the service's long-poll
(``service/logs.read_chunk``) and the supervisor's tail only go through it.  The local backend's
sources are the job folder's files, opened as untrusted: a FIFO or a symlink the job planted is
refused, never waited on or followed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time

import pytest

from ma_jupyter import config
from ma_jupyter.backends.base import Attempt
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.errors import InvalidSpec, RefusedFile
from ma_jupyter.models import Job, JobSpec, JobStatus, LogFile, LogStream, NodeRun
from ma_jupyter.service import logs


def no_block(fn, *args, timeout: float = 10.0):
    """``fn(*args)`` on a thread; fails the test if it does not return within ``timeout``."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result(timeout=timeout)


@pytest.fixture
def job_dir(ma_home):
    jd = config.jobdir("j-1")
    jd.logs.mkdir(parents=True)
    return jd


def append(path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_a_stream_reads_exactly_from_the_offset_and_only_grows(job_dir):
    backend = LocalBackend()
    assert backend.open_log("j-1", "worker-0", None) is None  # not written yet
    append(job_dir.node_log("worker-0"), b"hello\nw\xc3\xb6rld\n")
    source = backend.open_log("j-1", "worker-0", None)
    assert source is not None
    try:
        assert source.size() == 13
        assert source.read(0, 1 << 20) == (b"hello\nw\xc3\xb6rld\n", 13)
        # exactly the bytes after the offset, even inside a character (trimming is the reader's)
        assert source.read(8, 1 << 20) == (b"\xb6rld\n", 13)
        assert source.read(6, 3) == (b"w\xc3\xb6", 13)
        assert source.read(13, 10) == (b"", 13)
        assert source.read(50, 10) == (b"", 13)
        append(job_dir.node_log("worker-0"), b"more\n")
        assert source.size() == 18  # the open source sees the stream grow
        assert source.read(13, 1 << 20) == (b"more\n", 18)
    finally:
        source.close()
    source.close()  # idempotent
    with pytest.raises(OSError):
        source.read(0, 1)


def test_rank_streams_are_listed_and_read(job_dir):
    backend = LocalBackend()
    append(job_dir.node_log("worker-0"), b"node\n")
    job_dir.rank_dir("worker-0").mkdir()
    append(job_dir.rank_log("worker-0", 1), b"rank one\n")
    append(job_dir.rank_log("worker-0", 0), b"r0\n")
    job = Job(id="j-1", spec=JobSpec(name="j", command="python x.py"), status=JobStatus.running)
    # each with the file a reader on this machine may open itself, below the job folder
    root = str(job_dir.root)
    assert backend.log_streams(job) == [
        LogStream(node="worker-0", rank=None, size=5, file=LogFile(root=root, path="logs/worker-0.log")),
        LogStream(node="worker-0", rank=0, size=3, file=LogFile(root=root, path="logs/worker-0/rank-0.log")),
        LogStream(node="worker-0", rank=1, size=9, file=LogFile(root=root, path="logs/worker-0/rank-1.log")),
    ]
    source = backend.open_log("j-1", "worker-0", 1)
    try:
        assert source.read(5, 100) == (b"one\n", 9)
    finally:
        source.close()
    assert backend.open_log("j-1", "worker-0", 7) is None
    with pytest.raises(InvalidSpec):
        backend.open_log("j-1", "../worker-0", None)
    with pytest.raises(InvalidSpec):
        backend.open_log("j-1", "worker-0", -1)


def test_a_fifo_planted_as_the_node_log_is_refused_without_blocking(job_dir):
    os.mkfifo(job_dir.node_log("worker-0"))
    backend = LocalBackend()
    with pytest.raises(RefusedFile, match="worker-0 left a FIFO at .*worker-0.log"):
        no_block(backend.open_log, "j-1", "worker-0", None)
    job = Job(id="j-1", spec=JobSpec(name="j", command="python x.py"), status=JobStatus.running)
    # listed where the node writes it; a reader opening it there is refused as the service is
    file = LogFile(root=str(job_dir.root), path="logs/worker-0.log")
    assert no_block(backend.log_streams, job) == [LogStream(node="worker-0", rank=None, size=0, file=file)]


def test_a_symlink_planted_as_a_rank_log_or_its_folder_is_refused(job_dir, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the service's token")
    job_dir.rank_dir("worker-0").mkdir()
    job_dir.rank_log("worker-0", 0).symlink_to(secret)
    backend = LocalBackend()
    with pytest.raises(RefusedFile, match="worker-0 left a symbolic link at /job/logs/rank-0.log"):
        no_block(backend.open_log, "j-1", "worker-0", 0)
    # the whole rank folder replaced by a symlink to a folder holding a readable rank-0.log
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.log").write_text("not the job's\n")
    os.rename(job_dir.rank_dir("worker-0"), tmp_path / "old")
    job_dir.rank_dir("worker-0").symlink_to(elsewhere)
    with pytest.raises(RefusedFile, match="in place of the folder worker-0"):
        no_block(backend.open_log, "j-1", "worker-0", 0)


def test_the_failure_report(ma_home, tmp_path):
    jd = config.jobdir("j-1")
    folder = jd.node("worker-0").root
    folder.mkdir(parents=True)
    attempt = Attempt("j-1", JobSpec(name="j", command="python x.py"), 0, jd.root, ())
    backend = LocalBackend()
    run = NodeRun(name="worker-0")
    assert backend.failure(attempt, run) is None
    jd.node("worker-0").failure.write_text(json.dumps({"rank": 3, "exit_code": 9}))
    assert backend.failure(attempt, run) == (3, 9)
    jd.node("worker-0").failure.write_text(json.dumps({"refused": "worker-0 left a FIFO at /job/logs/x"}))
    assert backend.failure(attempt, run) == "worker-0 left a FIFO at /job/logs/x"
    jd.node("worker-0").failure.write_text("not json")
    assert backend.failure(attempt, run) is None
    jd.node("worker-0").failure.unlink()
    jd.node("worker-0").failure.symlink_to(tmp_path)
    found = no_block(backend.failure, attempt, run)
    assert isinstance(found, str) and "worker-0 left a symbolic link" in found


def test_the_not_distributed_report_counts_only_when_it_names_several_nodes(ma_home, tmp_path):
    jd = config.jobdir("j-1")
    report = jd.node("worker-0").not_distributed
    report.parent.mkdir(parents=True)
    attempt = Attempt("j-1", JobSpec(name="j", command="python x.py"), 0, jd.root, ())
    backend = LocalBackend()
    run = NodeRun(name="worker-0")
    assert backend.not_distributed(attempt, run) is None
    report.write_text(json.dumps({"nodes": 2}))
    assert backend.not_distributed(attempt, run) == 2
    # a refusal, one node, a wrong type, no JSON: nothing is said
    for text in (
        '{"refused": "worker-0 left a FIFO"}',
        '{"nodes": 1}',
        '{"nodes": "2"}',
        '{"nodes": true}',
        "x",
    ):
        report.write_text(text)
        assert backend.not_distributed(attempt, run) is None, text
    report.unlink()
    report.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"nodes": 2}))
    assert no_block(backend.not_distributed, attempt, run) is None


# ------------------------------------------------------------ the service over any LogSource


class MemorySource:
    """A stream held in memory: what a backend whose nodes run elsewhere could hand out."""

    def __init__(self, data: bytearray):
        self.data = data
        self.closed = False

    def read(self, offset: int, limit: int) -> tuple[bytes, int]:
        return bytes(self.data[offset : offset + limit]), len(self.data)

    def size(self) -> int:
        return len(self.data)

    def close(self) -> None:
        self.closed = True


class MemoryBackend:
    """Only what the log reader uses of a backend."""

    def __init__(self):
        self.streams: dict[tuple[str, int | None], bytearray] = {}
        self.opened: list[MemorySource] = []

    def open_log(self, job_id: str, node: str, rank: int | None) -> MemorySource | None:
        data = self.streams.get((node, rank))
        if data is None:
            return None
        self.opened.append(MemorySource(data))
        return self.opened[-1]


def test_read_chunk_long_polls_over_a_log_source_and_cuts_whole_characters():
    backend = MemoryBackend()
    backend.streams[("worker-0", None)] = bytearray(b"abc w\xc3")

    def read(offset: int, wait: float = 0.0, terminal: bool = False):
        return asyncio.run(
            logs.read_chunk(backend, "j", "worker-0", None, offset, 1 << 20, wait, lambda: terminal)
        )

    first = read(0)
    assert (first.data, first.offset, first.next_offset, first.eof) == ("abc w", 0, 5, False)
    assert read(5).data == ""  # half a character waits for the rest

    def grow() -> None:
        time.sleep(0.3)
        backend.streams[("worker-0", None)] += b"\xb6rld\n"

    threading.Thread(target=grow).start()
    started = time.monotonic()
    chunk = read(5, wait=10)
    assert time.monotonic() - started < 5  # answered when the bytes came, not at the deadline
    assert (chunk.data, chunk.next_offset) == ("\u00f6rld\n", 11)
    done = read(11, terminal=True)
    assert done.eof and done.data == ""
    assert all(s.closed for s in backend.opened)
    # a stream that does not exist yet reads as empty until the job ends
    missing = asyncio.run(logs.read_chunk(backend, "j", "ps-0", None, 0, 10, 0.0, lambda: True))
    assert missing.eof and missing.next_offset == 0
    with pytest.raises(InvalidSpec):
        asyncio.run(logs.read_chunk(backend, "j", "../x", None, 0, 10, 0.0, lambda: True))


def test_tail_reads_the_end_of_a_source():
    source = MemorySource(bytearray(b"".join(f"line {i}\n".encode() for i in range(100))))
    assert logs.tail(source, 3) == ["line 97", "line 98", "line 99"]
    assert logs.tail(source, 3, max_bytes=15) == ["ine 98", "line 99"]
    assert logs.tail(MemorySource(bytearray()), 3) == []
