"""What the service keeps between jobs: each user's persistent cache and the prepared
copies of dataset sources."""

from __future__ import annotations

from pydantic import Field

from .common import Strict


class CacheInfo(Strict):
    """One user's persistent cache (``~/.cache`` in their jobs' nodes) and what it holds."""

    user: str
    path: str = Field(description="Its host folder.")
    bytes: int = 0
    files: int = 0
    refused: str | None = Field(
        None,
        description="Why its size could not be measured whole (a chain of folders too deep, too "
        "many entries: what to remove); bytes and files are then what was counted before.",
    )


class PreparedData(Strict):
    """One prepared copy of a dataset source, shared by the jobs that name that source."""

    key: str = Field(description="Its store key (source path and contents, see service/prepared.py).")
    source: str
    path: str = Field(description="The copy on the service's machine.")
    bytes: int = 0
    files: int = 0
    created: float = 0.0
    last_used: float = Field(default=0.0, description="When a job last took or gave it back (epoch s).")
    jobs: list[str] = Field(default=[], description="The queued or running jobs that use it.")
