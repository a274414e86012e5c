"""Reading job logs by byte offset, with a long-poll for followers.

Nodes write their log files themselves; the service only reads them.  A reader asks for bytes
from an offset and gets them with the next offset, so a follower that reconnects (a restarted
kernel, a new browser tab) continues exactly where it stopped: nothing is replayed, nothing is
skipped.  A chunk never ends inside a UTF-8 character.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from ..backends.base import node_log
from ..errors import InvalidSpec, NotFound
from ..models import Job, LogChunk, LogStream

FOLLOW_POLL = 0.005  # seconds between size checks while a follower waits
MAX_WAIT = 60.0


def log_dir(job_dir: Path) -> Path:
    """The folder of a job's log files."""
    return job_dir / "logs"


def streams(job: Job, job_dir: Path) -> list[LogStream]:
    """Every log stream of a job: each node's combined log, then its per-rank logs."""
    found: list[LogStream] = []
    names = [n.name for n in job.nodes]
    folder = log_dir(job_dir)
    for extra in sorted(folder.glob("*.log")) if folder.is_dir() else []:
        if extra.stem not in names:
            names.append(extra.stem)
    for name in names:
        path = node_log(folder, name)
        found.append(LogStream(node=name, rank=None, size=path.stat().st_size if path.exists() else 0))
        rank_dir = folder / name
        if rank_dir.is_dir():
            ranks = []
            for rank_file in rank_dir.glob("rank-*.log"):
                try:
                    ranks.append((int(rank_file.stem.split("-", 1)[1]), rank_file))
                except ValueError:
                    continue
            for rank, rank_file in sorted(ranks):
                found.append(LogStream(node=name, rank=rank, size=rank_file.stat().st_size))
    return found


def default_node(job: Job) -> str:
    """The stream a reader gets without naming a node: the first primary node (worker-0)."""
    for run in job.nodes:
        if run.primary:
            return run.name
    return "worker-0"


def stream_path(job_dir: Path, node: str, rank: int | None) -> Path:
    """The file of one stream; names that could leave the job's log folder are refused."""
    if not node or "/" in node or node.startswith("."):
        raise InvalidSpec(f"{node!r} is not a node name", field="node")
    folder = log_dir(job_dir)
    if rank is None:
        return node_log(folder, node)
    if rank < 0:
        raise InvalidSpec("rank must be 0 or more", field="rank")
    return folder / node / f"rank-{rank}.log"


def read_bytes(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """Bytes from ``offset`` (at most ``limit``), trimmed to whole UTF-8 characters; (data, size now)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            if offset >= size:
                return b"", size
            fh.seek(offset)
            data = fh.read(limit)
    except FileNotFoundError:
        return b"", 0
    # Do not split a multi-byte character: keep its start for the next read.
    cut = len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte & 0x80:  # lead byte of a multi-byte character
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
            if back < need:
                cut = len(data) - back
        break
    return data[:cut], size


async def read_chunk(
    job_id: str,
    job_dir: Path,
    node: str,
    rank: int | None,
    offset: int,
    limit: int,
    wait: float,
    is_terminal: Callable[[], bool],
) -> LogChunk:
    """Read one chunk; with ``wait`` > 0, wait until there are new bytes, the job ends, or time is up.

    ``eof`` is set only when the job is terminal and the reader has everything: the status is
    read *before* the file, so bytes written just before the job ended are never missed.
    """
    if offset < 0 or limit <= 0:
        raise InvalidSpec("offset must be >= 0 and limit > 0")
    path = stream_path(job_dir, node, rank)
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
    while True:
        terminal = is_terminal()
        data, size = read_bytes(path, offset, limit)
        if data or terminal or time.monotonic() >= deadline:
            break
        await asyncio.sleep(FOLLOW_POLL)
    next_offset = offset + len(data)
    return LogChunk(
        job_id=job_id,
        node=node,
        rank=rank,
        offset=offset,
        next_offset=next_offset,
        data=data.decode("utf-8", "replace"),
        eof=terminal and next_offset >= size,
    )


def ensure_stream(job: Job, job_dir: Path, node: str, rank: int | None) -> None:
    """NotFound for a node the job does not have (a queued job's worker-0 is allowed: it will come)."""
    known = {n.name for n in job.nodes} | {s.node for s in streams(job, job_dir)}
    if job.nodes and node not in known:
        raise NotFound(f"job {job.id} has no node {node!r}: its nodes are {', '.join(sorted(known))}")
