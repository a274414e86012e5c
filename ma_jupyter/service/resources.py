"""Resource sampling: what each node of a running job uses, over time.

A :class:`ResourceSampler` thread of the service:

1. every ``interval`` seconds (``[resources] sample_interval`` in ``cluster.toml``, default
   ``DEFAULT_INTERVAL``) asks the backend (:meth:`Backend.usage`) what each node of every running
   job uses: cumulative CPU seconds and resident memory, and the use and memory of the node's
   real cards where the backend reads them (NVML);
2. turns two consecutive readings of a node into its CPU percentage over that interval (100 is
   one core busy), so a node's first sample comes one interval after it is first seen;
3. keeps the samples in the store, with the job, deleted with it;
4. keeps them bounded: once a node has more than ``KEEP`` samples, every other one of its older
   half is dropped, so old stretches of a long job lose resolution, never the newest.

It never touches a job's state, and a failure to sample one job is logged, never raised.
"""

from __future__ import annotations

import logging
import threading
import time

from .. import config
from ..backends.base import Backend
from ..errors import InvalidSpec
from ..models import Job, JobStatus, NodeLimits, ResourceSample, ResourceUsage
from ..modes.base import splits_nodes
from .scheduler import Scheduler
from .store import Store

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 2.0
#: samples per node kept at full resolution before the older half is thinned
KEEP = 1000
MIN_INTERVAL, MAX_INTERVAL = 0.2, 3600.0


def load_interval() -> float:
    """``[resources] sample_interval`` of ``cluster.toml`` (seconds), bounded; the default when
    the file or the key is missing.

    Raises:
        InvalidSpec: the file breaks the schema (e.g. an interval that is not a positive number).
    """
    data = config.read_cluster_file()
    value = float(data.get("resources", {}).get("sample_interval", DEFAULT_INTERVAL))
    return min(max(value, MIN_INTERVAL), MAX_INTERVAL)


class ResourceSampler:
    """Samples the running jobs of ``store`` through ``backend`` on its own thread."""

    def __init__(self, store: Store, backend: Backend, interval: float | None = None):
        self.store = store
        self.backend = backend
        self.interval = interval if interval is not None else load_interval()
        # (job id, node) -> (monotonic time, cpu seconds) of the previous reading
        self._last: dict[tuple[str, str], tuple[float, float]] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._cannot_sample = False  # the backend said so (see sample_once)
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ma-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                self.sample_once()
            except Exception:  # the sampler must never take anything else down
                log.exception("resource sampling failed")

    def sample_once(self) -> int:
        """Read every running job's nodes once; returns how many samples were kept.

        A backend that answers None cannot sample at all (:meth:`Backend.usage`, rule 4): from
        then on the running jobs are not even listed, which would cost the service CPU every
        interval for nothing."""
        kept = 0
        seen: set[tuple[str, str]] = set()
        if self._cannot_sample:
            return kept
        for job in self.store.by_status(JobStatus.running):
            try:
                usage = self.backend.usage(job.id, job.nodes)
            except Exception:
                log.exception("job %s: resource sampling failed", job.id)
                continue
            if usage is None:
                self._cannot_sample = True
                return kept
            if not usage:
                continue
            now, wall = time.monotonic(), time.time()
            samples = []
            for node in usage:
                key = (job.id, node.node)
                seen.add(key)
                previous = self._last.get(key)
                self._last[key] = (now, node.cpu_seconds)
                if previous is None or now <= previous[0]:
                    continue  # the first reading only sets the base of the next percentage
                cpu = max(0.0, (node.cpu_seconds - previous[1]) / (now - previous[0]) * 100.0)
                samples.append(
                    ResourceSample(
                        t=wall,
                        node=node.node,
                        cpu_percent=round(cpu, 1),
                        memory_mb=round(node.memory_bytes / (1 << 20), 1),
                        card_percent=node.card_percent,
                        card_memory_mb=node.card_memory_mb,
                    )
                )
            self.store.add_samples(job.id, samples)
            kept += len(samples)
            for sample in samples:
                key = (job.id, sample.node)
                self._counts[key] = self._counts.get(key, 0) + 1
                if self._counts[key] > KEEP // 4:  # thin now and then, not at every sample
                    self._counts[key] = 0
                    self.store.thin_samples(job.id, sample.node, KEEP)
        for key in set(self._last) - seen:  # the node ended (or its job did)
            self._last.pop(key, None)
            self._counts.pop(key, None)
        return kept

    def report(self, job: Job, scheduler: Scheduler, since: float | None = None) -> ResourceUsage:
        """The job's samples after ``since`` with each node's limits from the spec it runs with."""
        nodes = []
        try:
            flavor = scheduler.cluster.spec(job.chosen_spec) if job.chosen_spec else None
        except InvalidSpec:  # a spec the admin removed since: no limits to show
            flavor = None
        for run in job.nodes:
            limits = NodeLimits(node=run.name)
            if flavor is not None:
                task = scheduler.task_flavor(flavor, run.role, beside=splits_nodes(job.spec))
                limits = NodeLimits(
                    node=run.name,
                    cpus=task.cpus,
                    memory_mb=task.memory_gb * 1024,
                    cards=task.accelerators,
                )
            nodes.append(limits)
        return ResourceUsage(
            job_id=job.id,
            interval=self.interval,
            nodes=nodes,
            samples=self.store.samples(job.id, since),
        )
