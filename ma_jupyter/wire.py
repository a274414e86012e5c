"""The wire model's plain parts: the REST API's names, the enumerations, durations and clone names.

Standard library only (no pydantic), so that a command line can read the service's answers
without importing :mod:`ma_jupyter.models` (which builds every pydantic model at import).
:mod:`ma_jupyter.models` imports each of these and re-exports it: there is one definition, and
``models.JobStatus is wire.JobStatus``.
"""

from __future__ import annotations

import math
import re
from enum import Enum

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any

#: the REST API's path prefix and the header naming the user a forwarding proxy acts for: the
#: wire's names, shared by the service and its clients
API_PREFIX = "/api/v1"
FORWARDED_USER_HEADER = "X-MA-Forwarded-User"


#: a job's (and a mount's, an image's) name: a letter or digit, then up to 62 more of them or
#: ``_.-`` (a file name too: ``%%ma_train`` saves the cell as ``<name>.py``)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


#: the longest run duration: ten years (a larger number is a typo, and would overflow dates)
MAX_DURATION = 10 * 366 * 86400.0


_COPY_SUFFIX = re.compile(r"-copy(?:-(\d+))?$")


def clone_name(name: str) -> str:
    """The name a clone of job ``name`` gets: ``x`` -> ``x-copy`` -> ``x-copy-2`` -> ``x-copy-3``
    (never ``x-copy-copy``), within the 63 characters of :data:`NAME_PATTERN`."""
    match = _COPY_SUFFIX.search(name)
    if match is None:
        base, number = name, 1
    else:
        base, number = name[: match.start()], int(match.group(1) or 1) + 1
    suffix = "-copy" if number == 1 else f"-copy-{number}"
    return base[: 63 - len(suffix)] + suffix


_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?\s*(?:(\d+(?:\.\d+)?)\s*s?)?\s*$"
)


class JobSort(str, Enum):
    """How a job listing is ordered: a column, ``-`` first for descending (ties: newest first)."""

    oldest = "created"
    newest = "-created"
    name_asc = "name"
    name_desc = "-name"
    id_asc = "id"
    id_desc = "-id"
    status_asc = "status"
    status_desc = "-status"
    creator_asc = "creator"
    creator_desc = "-creator"
    outputs_asc = "outputs"
    outputs_desc = "-outputs"
    priority_asc = "priority"
    priority_desc = "-priority"
    mode_asc = "mode"
    mode_desc = "-mode"
    spec_asc = "spec"
    spec_desc = "-spec"
    elapsed_asc = "elapsed"
    elapsed_desc = "-elapsed"


class JobType(str, Enum):
    regular = "regular"
    batch = "batch"


class Priority(str, Enum):
    """Queue order: very-urgent first, then urgent, then normal; FIFO within one priority."""

    normal = "normal"
    urgent = "urgent"
    very_urgent = "very-urgent"

    @property
    def rank(self) -> int:
        return {"normal": 0, "urgent": 1, "very-urgent": 2}[self.value]


class Access(str, Enum):
    """What other users may do with the job: read-write, read-only, or nothing."""

    rw = "rw"
    ro = "ro"
    none = "none"


class Mode(str, Enum):
    """How a job's nodes run its command (``docs/jobs.md``; ``docs/variables.md`` per mode).

    ``distributed`` gives every node the platform's distributed variables and runs the command
    as written (no launcher around it), for any framework.
    """

    single = "single"
    distributed = "distributed"
    pytorch = "pytorch"
    pytorch_deepspeed = "pytorch-deepspeed"
    tensorflow = "tensorflow"
    horovod = "horovod"
    mindspore_ascend = "mindspore-ascend"


class Convention(str, Enum):
    """Which platform's launch conventions the modes follow (extra args and variables)."""

    platform = "platform"
    modelarts = "modelarts"


class JobStatus(str, Enum):
    """The platform's statuses.  ``expired``: the job ran past its duration."""

    queued = "queued"
    running = "running"
    error = "error"
    stopped = "stopped"
    expired = "expired"
    succeeded = "succeeded"

    def is_terminal(self) -> bool:
        """True once the job can change no more."""
        return self in TERMINAL_STATUSES

    def can_become(self, other: JobStatus) -> bool:
        """Whether the transition table allows ``self -> other``."""
        return other in TRANSITIONS[self]


TERMINAL_STATUSES = frozenset({JobStatus.error, JobStatus.stopped, JobStatus.expired, JobStatus.succeeded})

# The one table of allowed status changes.  running -> queued is a fault restart or a
# checkpoint resume that puts the job back in the queue to be scheduled again.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.queued: frozenset({JobStatus.running, JobStatus.stopped, JobStatus.error}),
    JobStatus.running: frozenset(
        {JobStatus.queued, JobStatus.succeeded, JobStatus.error, JobStatus.stopped, JobStatus.expired}
    ),
    JobStatus.error: frozenset(),
    JobStatus.stopped: frozenset(),
    JobStatus.expired: frozenset(),
    JobStatus.succeeded: frozenset(),
}


def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a text like ``90``, ``30s``, ``15m``, ``2h``, ``1d2h``; None = no limit."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a text like 30m, 2h, 1d")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match or not any(match.groups()):
            raise ValueError(f"{value!r} is not a duration: use seconds or a text like 30m, 2h, 1d12h")
        d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = d * 86400 + h * 3600 + m * 60 + s
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("a duration must be positive")
    if seconds > MAX_DURATION:
        raise ValueError("a duration is at most ten years (315 m seconds)")
    return seconds


class DatasetSource(str, Enum):
    private = "private"
    favorite = "favorite"


class ModelSource(str, Enum):
    pretrained = "pretrained"
    private = "private"
    favorite = "favorite"


class PerfPolicy(str, Enum):
    alert = "alert"
    reschedule = "reschedule"


class HangPolicy(str, Enum):
    """What the supervisor does with a job that looks hung (no log output, almost no CPU for
    ``[limits] hang_minutes``): tell it in the job's events, or also stop it."""

    alert = "alert"
    stop = "stop"


#: The URI schemes of object storage a dataset, model or outputs path may name instead of a
#: host path (``ma_jupyter/objectstore.py`` reads and writes them).
OBJECT_SCHEMES = ("s3://", "obs://")


def is_object_uri(path: str | None) -> bool:
    """Whether a dataset's, model's or outputs' path names object storage (``s3://``, ``obs://``)."""
    return bool(path) and str(path).startswith(OBJECT_SCHEMES)
