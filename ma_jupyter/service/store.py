"""Durable job state: SQLite in WAL mode through SQLAlchemy Core.

One row per job holds the whole :class:`~ma_jupyter.models.Job` as JSON plus the columns the
listing filters and the queue order need; one row per event.  Every write is its own
transaction, so a ``kill -9`` of the service loses nothing that was acknowledged: queued jobs
stay queued, running jobs keep their node records (pid + start time) for re-attachment.

Every update of a job wakes the coroutines waiting in :meth:`Store.wait_status` (the status
long-poll of the REST API), whichever thread wrote it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.exc import IntegrityError, OperationalError

from ..errors import DiskFull, NotFound
from ..models import Event, Job, JobStatus
from .disk import free_bytes, full_folder

RESERVE_NAME = "disk-reserve"
RESERVE_BYTES = 1 << 20

# Seconds between re-reads of a job's status while a long-poll waits: a safety net only (and
# how soon a waiter learns that its job was deleted), since every update wakes the waiters.
STATUS_RECHECK = 1.0

metadata = MetaData()

jobs_table = Table(
    "jobs",
    metadata,
    Column("id", String, primary_key=True),
    Column("name", String, nullable=False, index=True),
    Column("status", String, nullable=False, index=True),
    Column("priority", Integer, nullable=False),
    Column("creator", String),
    Column("created", Float, nullable=False),
    Column("specs", String, nullable=False),  # space-separated, for the spec filter
    Column("outputs", String),
    Column("desired", String),  # a pending "stop" the supervisor must carry out, survives restarts
    Column("placement", Text),  # JSON of the current attempt's placement
    Column("job", Text, nullable=False),
)

events_table = Table(
    "events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String, nullable=False, index=True),
    Column("event", Text, nullable=False),
)


idempotency_table = Table(
    "idempotency",
    metadata,
    Column("key", String, primary_key=True),  # "<user>\0<client's Idempotency-Key>"
    Column("job_id", String, nullable=False, index=True),
)


class Store:
    """Thread-safe access to jobs and events.  All methods are short transactions."""

    def __init__(self, path: Path):
        self.path = path
        self.changes = ChangeSignal()  # woken by every job update (see wait_status)
        self.engine = create_engine(
            f"sqlite:///{path}", future=True, connect_args={"check_same_thread": False}
        )

        @event.listens_for(self.engine, "connect")
        def _pragmas(dbapi_conn, _record):  # WAL: readers never block the writer; fsync on commit
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

        metadata.create_all(self.engine)
        # SQLite allows one writer; serialising in-process writers avoids "database is locked".
        self._write_lock = threading.RLock()
        self.reserve = path.parent / RESERVE_NAME
        self.keep_reserve()

    def keep_reserve(self) -> None:
        """Make sure the disk reserve exists (when there is room for it).

        The reserve is a file of ``RESERVE_BYTES`` beside the database, given up the moment a
        write finds the disk full: the service can then still record why jobs ended (with
        "disk full under <path>") instead of leaving them running until someone frees space.
        """
        if self.reserve.exists():
            return
        free = free_bytes(self.path.parent)
        if free is None or free < 4 * RESERVE_BYTES:
            return
        tmp = self.reserve.with_name(RESERVE_NAME + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.reserve)
        except OSError:
            tmp.unlink(missing_ok=True)

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        """One write transaction; a full disk becomes :class:`DiskFull` naming the store's folder."""
        try:
            with self._write_lock, self.engine.begin() as conn:
                yield conn
        except OperationalError as exc:
            if "disk is full" in str(exc) or full_folder([self.path.parent]) is not None:
                self.reserve.unlink(missing_ok=True)  # room for the next try (see keep_reserve)
                raise DiskFull(
                    f"disk full under {self.path.parent}: the job service cannot record anything "
                    "until space is freed there"
                ) from exc
            raise

    # ------------------------------------------------------------------------------ jobs

    @staticmethod
    def _row(job: Job) -> dict[str, Any]:
        return {
            "id": job.id,
            "name": job.spec.name,
            "status": job.status.value,
            "priority": job.spec.priority.rank,
            "creator": job.spec.creator,
            "created": job.created_at.timestamp(),
            "specs": " ".join(job.spec.specs),
            "outputs": job.spec.outputs,
            "job": job.model_dump_json(),
        }

    def insert(
        self,
        job: Job,
        first_event: Event,
        idempotency_key: str | None = None,
        *,
        notices: Sequence[Event] = (),
    ) -> str:
        """Create a job and its first event in one transaction (no half-created job).

        With ``idempotency_key``, the key is stored in the same transaction; when the key is
        already taken nothing is created.  ``notices`` (warnings about the job) follow the first
        event in the same transaction.

        Returns:
            The id of the job stored under the key: ``job.id``, or the earlier job's id.
        """
        try:
            with self._writing() as conn:
                conn.execute(jobs_table.insert().values(**self._row(job)))
                if idempotency_key is not None:
                    conn.execute(idempotency_table.insert().values(key=idempotency_key, job_id=job.id))
                self._add_event(conn, first_event)
                for notice in notices:
                    self._add_event(conn, notice)
                return job.id
        except IntegrityError:
            earlier = self.job_for_key(idempotency_key) if idempotency_key is not None else None
            if earlier is None:
                raise
            return earlier

    def job_for_key(self, idempotency_key: str) -> str | None:
        """The id of the job a submit with this idempotency key created, if any (and not deleted)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(idempotency_table.c.job_id).where(idempotency_table.c.key == idempotency_key)
            ).first()
        return row[0] if row else None

    def save(self, job: Job, event: Event | None = None) -> Event | None:
        """Persist the job (and an event with it, atomically)."""
        with self._writing() as conn:
            conn.execute(jobs_table.update().where(jobs_table.c.id == job.id).values(**self._row(job)))
            stored = self._add_event(conn, event) if event else None
        self.changes.notify()
        return stored

    def add_event(self, event: Event) -> Event:
        """Record an event that comes without a status change; returns it with its sequence number."""
        with self._writing() as conn:
            return self._add_event(conn, event)

    @staticmethod
    def _add_event(conn, event: Event) -> Event:
        result = conn.execute(
            events_table.insert().values(job_id=event.job_id, event=event.model_dump_json())
        )
        stored = event.model_copy(update={"seq": int(result.inserted_primary_key[0])})
        conn.execute(
            events_table.update()
            .where(events_table.c.seq == stored.seq)
            .values(event=stored.model_dump_json())
        )
        return stored

    def get(self, job_id: str) -> Job:
        """The job ``job_id``; NotFound (saying how to list jobs) when there is none."""
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_table.c.job).where(jobs_table.c.id == job_id)).first()
        if row is None:
            raise NotFound(f"no job {job_id!r}: list jobs with `ma-jupyter jobs` or %ma_jobs")
        return Job.model_validate_json(row[0])

    def status(self, job_id: str) -> JobStatus:
        """Only the status of a job (cheap: followers poll it)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_table.c.status).where(jobs_table.c.id == job_id)).first()
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return JobStatus(row[0])

    async def wait_status(self, job_id: str, since: JobStatus | None, wait: float) -> JobStatus:
        """The job's status once it differs from ``since`` or is terminal, or when ``wait`` is over.

        Without ``since`` only a terminal status (or the end of the wait) ends the wait.  It
        sleeps on :attr:`changes` (no thread is held while it waits; each read of the status runs
        on a worker thread, so the event loop is never blocked) and re-reads the status every
        :data:`STATUS_RECHECK` seconds as a safety net.

        Raises:
            NotFound: no such job (also when it is deleted during the wait).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait, 0.0)
        while True:
            changed = self.changes.subscribe()
            try:
                # SQLite may wait on a writer's lock: read on a thread, never in the event loop
                status = await asyncio.to_thread(self.status, job_id)
                remaining = deadline - loop.time()
                if status.is_terminal() or (since is not None and status is not since) or remaining <= 0:
                    return status
                await asyncio.wait([changed], timeout=min(remaining, STATUS_RECHECK))
            finally:
                self.changes.unsubscribe(changed)

    def delete(self, job_id: str) -> None:
        """Remove a job and its events in one transaction."""
        with self._writing() as conn:
            conn.execute(jobs_table.delete().where(jobs_table.c.id == job_id))
            conn.execute(events_table.delete().where(events_table.c.job_id == job_id))
            conn.execute(idempotency_table.delete().where(idempotency_table.c.job_id == job_id))

    def list(
        self,
        *,
        name: str | None = None,
        statuses: Iterable[str] | None = None,
        creator: str | None = None,
        spec: str | None = None,
        outputs: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[list[Job], int]:
        """Jobs newest first, filtered; returns (page, total matching)."""
        query = select(jobs_table.c.job)
        count = select(func.count()).select_from(jobs_table)
        conditions = []
        if name:
            conditions.append(jobs_table.c.name.contains(name, autoescape=True))
        statuses = [s for s in (statuses or []) if s]
        if statuses:
            conditions.append(jobs_table.c.status.in_(statuses))
        if creator:
            conditions.append(jobs_table.c.creator == creator)
        if spec:
            conditions.append((" " + jobs_table.c.specs + " ").contains(f" {spec} ", autoescape=True))
        if outputs:
            conditions.append(jobs_table.c.outputs.contains(outputs, autoescape=True))
        for cond in conditions:
            query = query.where(cond)
            count = count.where(cond)
        query = query.order_by(jobs_table.c.created.desc()).offset(offset).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
            total = conn.execute(count).scalar_one()
        return [Job.model_validate_json(r[0]) for r in rows], int(total)

    def by_status(self, *statuses: JobStatus) -> list[Job]:
        """Jobs in these statuses, in queue order (priority high first, then oldest first)."""
        query = (
            select(jobs_table.c.job)
            .where(jobs_table.c.status.in_([s.value for s in statuses]))
            .order_by(jobs_table.c.priority.desc(), jobs_table.c.created.asc())
        )
        with self.engine.connect() as conn:
            return [Job.model_validate_json(r[0]) for r in conn.execute(query).all()]

    # ------------------------------------------------------------------ supervisor state

    def set_desired(self, job_id: str, desired: str | None) -> None:
        """Record (or clear, with None) a request the supervisor must carry out, e.g. ``"stop"``."""
        with self._writing() as conn:
            conn.execute(jobs_table.update().where(jobs_table.c.id == job_id).values(desired=desired))

    def desired(self, job_id: str) -> str | None:
        """The pending request for a job, if any."""
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_table.c.desired).where(jobs_table.c.id == job_id)).first()
        return row[0] if row else None

    def set_placement(self, job_id: str, placement: dict | None) -> None:
        """Store (or clear) the placement of the job's current attempt."""
        with self._writing() as conn:
            conn.execute(
                jobs_table.update()
                .where(jobs_table.c.id == job_id)
                .values(placement=json.dumps(placement) if placement is not None else None)
            )

    def placement(self, job_id: str) -> dict | None:
        """The stored placement of the job's current attempt, if it has one."""
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_table.c.placement).where(jobs_table.c.id == job_id)).first()
        return json.loads(row[0]) if row and row[0] else None

    # ---------------------------------------------------------------------------- events

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        """A job's events with a sequence number above ``after``, oldest first."""
        query = (
            select(events_table.c.event)
            .where(events_table.c.job_id == job_id, events_table.c.seq > after)
            .order_by(events_table.c.seq)
        )
        with self.engine.connect() as conn:
            return [Event.model_validate_json(r[0]) for r in conn.execute(query).all()]


class ChangeSignal:
    """Wakes coroutines (on any event loop) when a job changes; writers notify from any thread.

    A waiter subscribes *before* it reads the state it waits on, so a change that lands
    between its read and its wait still wakes it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []

    def subscribe(self) -> asyncio.Future[None]:
        """A future of the running loop, done at the next :meth:`notify`."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.append(future)
        return future

    def unsubscribe(self, future: asyncio.Future[None]) -> None:
        """Forget a waiter (after it woke or gave up)."""
        with self._lock:
            try:
                self._waiters.remove(future)
            except ValueError:
                pass

    def notify(self) -> None:
        """Wake every current waiter (thread-safe)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for future in waiters:
            try:
                future.get_loop().call_soon_threadsafe(_wake, future)
            except RuntimeError:  # its event loop is closed: nobody waits any more
                pass


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
