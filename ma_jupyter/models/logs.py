"""A job's logs on the wire: its streams (per node, per rank), a chunk of one read by byte
offsets, and where a reader on the service's machine may read a stream's file itself."""

from __future__ import annotations

from pydantic import Field

from .common import Strict


class LogFile(Strict):
    """Where a reader on the service's machine may read a log stream itself: the file its node
    writes, whose bytes at each offset are the ones ``GET /jobs/{id}/logs/read`` answers."""

    root: str = Field(
        description="A folder the job cannot replace (its job folder): open the file from here, "
        "following no symbolic link on the way (the job controls everything below it)."
    )
    path: str = Field(description="The stream's file, relative to root.")


class LogStream(Strict):
    """One log file of a job: per node, and per rank where the launcher allows."""

    node: str
    rank: int | None = None
    size: int = 0
    file: LogFile | None = Field(
        default=None,
        description="Where a client on the service's machine may read this stream directly "
        "(only the backend knows); None: through the service only (the file is on another machine).",
    )


class LogChunk(Strict):
    """Bytes of one log stream from ``offset`` to ``next_offset`` (decoded as UTF-8, replaced)."""

    job_id: str
    node: str
    rank: int | None = None
    offset: int
    next_offset: int
    data: str
    eof: bool = Field(description="True when the job is terminal and nothing more will be written.")
    file: LogFile | None = Field(
        default=None,
        description="On a read from offset 0: where a reader on the service's machine may read the "
        "stream's file itself (as GET /jobs/{id}/logs describes it), so it need not ask apart.",
    )
