"""How long a job without a duration will probably run, from the history of similar jobs: what
the start prediction (the dry run's "can it start now, and when") uses for running jobs that
have no ``--duration`` (the default), instead of "start time unknown".

Rules, in order:

1. Similar jobs are the succeeded jobs of the same name and creator (an experiment run again),
   the :data:`SAMPLES` newest (:meth:`..store.Store.runtimes`); a job's runtime is its last
   attempt's start to its end.
2. The typical runtime is their median.  The confidence says how far to trust it: ``high`` with
   at least 5 runs whose middle 80 % spread by at most half the median, ``medium`` with at
   least 3 runs spreading by at most the median, ``low`` otherwise.
3. A running job is estimated to end at its start plus the typical runtime; one that has run
   longer than that already is estimated to end now, with ``low`` confidence.
4. These estimates only ever inform the prediction shown to users.  Admission and backfill
   keep using durations alone: a guessed end must never let a job jump the queue.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..models import Job
from .store import Store

#: how many of the newest similar runs are looked at (rule 1)
SAMPLES = 20
#: confidences, least to most (rule 2)
CONFIDENCES = ("low", "medium", "high")


@dataclass(frozen=True)
class Runtime:
    """The typical runtime of a job's similar jobs (rule 2)."""

    seconds: float
    samples: int
    confidence: str

    def text(self) -> str:
        """As people read it: ``12m (median of 6 runs)``."""
        return f"{_duration(self.seconds)} (median of {self.samples} run{'s' if self.samples != 1 else ''})"


def typical_runtime(store: Store, job: Job) -> Runtime | None:
    """Rules 1 and 2 for ``job``; None without a similar succeeded job."""
    runs = store.runtimes(job.spec.name, job.spec.creator, skip=job.id, limit=SAMPLES)
    if not runs:
        return None
    median = statistics.median(runs)
    spread = _spread(runs) / median if median > 0 else float("inf")
    if len(runs) >= 5 and spread <= 0.5:
        confidence = "high"
    elif len(runs) >= 3 and spread <= 1.0:
        confidence = "medium"
    else:
        confidence = "low"
    return Runtime(median, len(runs), confidence)


def estimated_end(store: Store, job: Job, now: float) -> tuple[float, Runtime] | None:
    """Rule 3: when the running ``job`` (without a duration) will probably end, and the runtime
    it rests on; None without history or a start."""
    if job.started_at is None:
        return None
    typical = typical_runtime(store, job)
    if typical is None:
        return None
    end = job.started_at.timestamp() + typical.seconds
    if end < now:  # already past its typical runtime: it may end any moment, or much later
        return now, Runtime(typical.seconds, typical.samples, "low")
    return end, typical


def weakest(confidences: list[str]) -> str:
    """The least of several confidences (``high`` for none: nothing was guessed)."""
    return min(confidences, key=CONFIDENCES.index, default="high")


def _spread(runs: list[float]) -> float:
    """The width of the middle 80 % of the runs (all of them when fewer than 10)."""
    ordered = sorted(runs)
    cut = len(ordered) // 10
    middle = ordered[cut : len(ordered) - cut] if cut else ordered
    return middle[-1] - middle[0]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
