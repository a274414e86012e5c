"""Durable job state: SQLite in WAL mode through SQLAlchemy Core.

One row per job holds the whole :class:`~ma_jupyter.models.Job` as JSON plus the columns the
listing filters, the access rules and the queue order need; one row per event; one row per
user, with the sha256 of its token (never the token).  Every write is its own
transaction, so a ``kill -9`` of the service loses nothing that was acknowledged: queued jobs
stay queued, running jobs keep their node records (pid + start time) for re-attachment.

Every update of a job wakes the coroutines waiting in :meth:`Store.wait_status` (the status
long-poll of the REST API), whichever thread wrote it.

Why one module (over 600 lines): it is the one owner of ``jobs.db``: the table definitions,
their migrations and every query must agree on one schema and one transaction rule (every write
its own transaction); :class:`ChangeSignal` is the store's wake-up of the status long-poll.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, create_engine, event, func, or_, select
from sqlalchemy.exc import IntegrityError, OperationalError

from ..errors import Conflict, DiskFull, NotFound
from ..models import Access, Event, Job, JobStatus, ResourceSample, User
from . import algorithm_folders, store_schema
from .disk import free_bytes, full_folder

# the tables, defined by the one schema module (re-exported: callers name them from here)
from .store_schema import (  # noqa: F401
    QUERY_INDEXES,
    events_table,
    idempotency_table,
    jobs_table,
    metadata,
    samples_table,
    secrets_table,
    users_table,
)

#: the names a job's storage credentials are kept under in its secrets row (no variable name
#: holds ':', so they never mix with ``secret_env``)
STORAGE_SECRET = "storage:"

RESERVE_NAME = "disk-reserve"
RESERVE_BYTES = 1 << 20

# Seconds between re-reads of a job's status while a long-poll waits: a safety net only (and
# how soon a waiter learns that its job was deleted), since every update wakes the waiters.
STATUS_RECHECK = 1.0
#: the listed jobs whose parsed form :meth:`Store.list` keeps, keyed by their stored JSON (the
#: most one page may hold, so a page listed again parses only the jobs that changed), and the
#: most characters of JSON they may come to (specs may be large: the memory stays bounded)
LISTED_KEPT = 500
LISTED_KEPT_CHARS = 8 << 20


#: what a listing may be sorted by (``GET /jobs?sort=``): the job table's own columns, then
#: the jobs table view's other columns, read from the job's JSON (no column, no migration;
#: a full scan of the matching rows, which only a listing sorted by them pays)
SORT_KEYS = ("created", "name", "id", "status", "creator", "outputs", "priority", "mode", "spec", "elapsed")


def _from_json(path: str):
    return func.json_extract(jobs_table.c.job, path)


def _sort_columns(key: str) -> tuple:
    """What ``key`` orders by, most significant first."""
    if key == "mode":  # mode, then nodes
        return (_from_json("$.spec.mode"), _from_json("$.spec.nodes"))
    if key == "spec":  # the spec the job runs on, else the ones it asked for
        return (func.coalesce(_from_json("$.chosen_spec"), jobs_table.c.specs),)
    if key == "elapsed":  # ran so far, or in all; a job that never started sorts as 0
        ended = func.coalesce(func.julianday(_from_json("$.finished_at")), func.julianday("now"))
        return (func.coalesce(ended - func.julianday(_from_json("$.started_at")), 0),)
    return (jobs_table.c[key],)


def _order(sort: str) -> tuple:
    """The ORDER BY of a listing: ``sort`` (a :data:`SORT_KEYS` name, ``-`` for descending),
    then newest first and by id, so pages never overlap."""
    key = sort.removeprefix("-")
    if key not in SORT_KEYS:
        raise ValueError(f"unknown sort key {sort!r}")
    columns = _sort_columns(key)
    first = tuple(c.desc() if sort.startswith("-") else c.asc() for c in columns)
    return (*first, jobs_table.c.created.desc(), jobs_table.c.id.desc())


def _user(row: Any) -> User:
    return User(name=row.name, admin=bool(row.admin), created_at=datetime.fromtimestamp(row.created, UTC))


# The reads the supervisor makes on every tick, built once: building a statement costs more
# than SQLite takes to run it.
_ID = bindparam("job_id")
_JOB_BY_ID = select(jobs_table.c.job).where(jobs_table.c.id == _ID)
_STATUS_BY_ID = select(jobs_table.c.status).where(jobs_table.c.id == _ID)
_DESIRED_BY_ID = select(jobs_table.c.desired).where(jobs_table.c.id == _ID)
_ENDING_BY_ID = select(jobs_table.c.ending).where(jobs_table.c.id == _ID)
_PLACEMENT_BY_ID = select(jobs_table.c.placement).where(jobs_table.c.id == _ID)
_JOBS_IN_QUEUE_ORDER = (
    select(jobs_table.c.job)
    .where(jobs_table.c.status.in_(bindparam("statuses", expanding=True)))
    .order_by(jobs_table.c.priority.desc(), jobs_table.c.created.asc())
)


class Store:
    """Thread-safe access to jobs and events.  All methods are short transactions."""

    # (``builtins.list`` in the annotations below: :meth:`list` shadows it in the class body)

    def __init__(self, path: Path):
        self.path = path
        self.changes = ChangeSignal()  # woken by every job update (see wait_status)
        #: write transactions this store has ended (committed or rolled back), counted once each
        #: has ended (:meth:`writing` rule 4)
        self.writes = 0
        # The database holds every user's token hash and every job's env: the service's user
        # alone may read it (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        os.chmod(path, 0o600)
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

        # the schema, created or upgraded in place (store_schema.py: versions, migrations)
        store_schema.upgrade(self.engine, path)
        # SQLite allows one writer; serialising in-process writers avoids "database is locked".
        self._write_lock = threading.RLock()
        # stored JSON -> the job it parses to, for listings (see list); least recently used first
        self._listed: OrderedDict[str, Job] = OrderedDict()
        self._listed_chars = 0
        self._listed_lock = threading.Lock()
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
    def writing(self) -> Iterator[Any]:
        """One write transaction on the store's database, the one way to write to it.

        1. Writers in this process take turns (SQLite allows one writer; waiting here avoids
           "database is locked").
        2. The transaction commits when the block ends, and rolls back if it raises.
        3. A full disk becomes :class:`DiskFull` naming the store's folder, after giving up the
           disk reserve (see :meth:`keep_reserve`).
        4. :attr:`writes` counts it once it has ended, so a reader that reads the count, then
           the rows, and later finds the count unchanged knows the rows are still those it read
           (the service is its database's one writer).

        Tables kept beside the jobs (favourite algorithms) write through it too, so they share
        these rules.
        """
        try:
            with self._write_lock:
                try:
                    with self.engine.begin() as conn:
                        yield conn
                finally:
                    self.writes += 1  # rule 4: after the commit (or the rollback)
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
            "access": job.spec.access.value,
            "created": job.created_at.timestamp(),
            "specs": " ".join(job.spec.specs),
            "outputs": job.spec.outputs,
            "algorithms": algorithm_folders.column(job.spec),
            "job": job.model_dump_json(),
        }

    def insert(
        self,
        job: Job,
        first_event: Event,
        idempotency_key: str | None = None,
        *,
        notices: Sequence[Event] = (),
        secrets: dict[str, str] | None = None,
    ) -> str | None:
        """Create a job and its first event in one transaction (no half-created job).

        With ``idempotency_key``, the key is stored in the same transaction; when the key is
        already taken nothing is created.  ``notices`` (warnings about the job) follow the first
        event in the same transaction, and so do ``secrets`` (the values of the spec's
        ``secret_env``, which ``job`` must show masked: see :meth:`secrets`).

        Returns:
            The id of the job stored under the key: ``job.id``, or the earlier job's id; None
            when another job already has ``job.id`` (nothing is created: choose another id).
        """
        try:
            with self.writing() as conn:
                conn.execute(jobs_table.insert().values(**self._row(job)))
                if idempotency_key is not None:
                    conn.execute(idempotency_table.insert().values(key=idempotency_key, job_id=job.id))
                if secrets:
                    conn.execute(secrets_table.insert().values(job_id=job.id, env=json.dumps(secrets)))
                self._add_event(conn, first_event)
                for notice in notices:
                    self._add_event(conn, notice)
                return job.id
        except IntegrityError:
            earlier = self.job_for_key(idempotency_key) if idempotency_key is not None else None
            if earlier is not None:
                return earlier
            with self.engine.connect() as conn:
                if conn.execute(_STATUS_BY_ID, {"job_id": job.id}).first() is not None:
                    return None
            raise

    def secrets(self, job_id: str) -> dict[str, str]:
        """The secret variables of a job (name -> value), for its launch only; {} when none."""
        return {k: v for k, v in self._secret_row(job_id).items() if not k.startswith(STORAGE_SECRET)}

    def storage_secrets(self, job_id: str) -> dict[str, str]:
        """A job's object storage credentials (``JobSpec.storage_credentials``: name -> value),
        kept in the same row as its secret variables under :data:`STORAGE_SECRET` names (which
        no variable can have), for its data steps only; {} when none."""
        row = self._secret_row(job_id)
        return {k.removeprefix(STORAGE_SECRET): v for k, v in row.items() if k.startswith(STORAGE_SECRET)}

    def _secret_row(self, job_id: str) -> dict[str, str]:
        with self.engine.connect() as conn:
            row = conn.execute(select(secrets_table.c.env).where(secrets_table.c.job_id == job_id)).first()
        return json.loads(row[0]) if row is not None else {}

    def job_for_key(self, idempotency_key: str) -> str | None:
        """The id of the job a submit with this idempotency key created, if any (and not deleted)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(idempotency_table.c.job_id).where(idempotency_table.c.key == idempotency_key)
            ).first()
        return row[0] if row else None

    #: the supervisor's notes on a job's current attempt, which :meth:`save` can clear
    ATTEMPT_NOTES = ("placement", "desired", "ending")

    def save(self, job: Job, event: Event | None = None, *, clear: tuple[str, ...] = ()) -> Event | None:
        """Persist the job (and an event with it, atomically); ``clear``: notes of
        :data:`ATTEMPT_NOTES` emptied in the same write (an attempt's end is recorded whole or
        not at all: a full disk leaves neither the end without its notes cleared nor the notes
        cleared without the end)."""
        unknown = set(clear) - set(self.ATTEMPT_NOTES)
        if unknown:
            raise ValueError(f"not a note of an attempt: {sorted(unknown)}")
        row = {**self._row(job), **dict.fromkeys(clear)}
        with self.writing() as conn:
            conn.execute(jobs_table.update().where(jobs_table.c.id == job.id).values(**row))
            stored = self._add_event(conn, event) if event else None
        self.changes.notify()
        return stored

    def add_event(self, event: Event) -> Event:
        """Record an event that comes without a status change; returns it with its sequence number."""
        with self.writing() as conn:
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
            row = conn.execute(_JOB_BY_ID, {"job_id": job_id}).first()
        if row is None:
            raise NotFound(f"no job {job_id!r}: list jobs with `ma-jupyter jobs` or %ma_jobs")
        return Job.model_validate_json(row[0])

    def runtimes(
        self, name: str, creator: str | None, *, skip: str | None = None, limit: int = 20
    ) -> list[float]:
        """How long (seconds, start to end of the last attempt) the ``limit`` newest succeeded
        jobs of this name and creator ran, newest first; ``skip``: a job id left out (the one
        asking).  Read from the jobs' own records, a cheap indexed query (the name column)."""
        started = func.json_extract(jobs_table.c.job, "$.started_at")
        finished = func.json_extract(jobs_table.c.job, "$.finished_at")
        query = (
            select(started, finished)
            .where(
                jobs_table.c.name == name,
                jobs_table.c.status == JobStatus.succeeded.value,
                jobs_table.c.creator.is_(None) if creator is None else jobs_table.c.creator == creator,
                jobs_table.c.id != (skip or ""),
            )
            .order_by(jobs_table.c.created.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        out = []
        for start, end in rows:
            if start and end:
                seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
                if seconds >= 0:
                    out.append(seconds)
        return out

    def status(self, job_id: str) -> JobStatus:
        """Only the status of a job (cheap: followers poll it)."""
        with self.engine.connect() as conn:
            row = conn.execute(_STATUS_BY_ID, {"job_id": job_id}).first()
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
        with self.writing() as conn:
            conn.execute(jobs_table.delete().where(jobs_table.c.id == job_id))
            conn.execute(events_table.delete().where(events_table.c.job_id == job_id))
            conn.execute(idempotency_table.delete().where(idempotency_table.c.job_id == job_id))
            conn.execute(secrets_table.delete().where(secrets_table.c.job_id == job_id))
            conn.execute(samples_table.delete().where(samples_table.c.job_id == job_id))

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
        viewer: str | None = None,
        algorithms_in: Sequence[str] | None = None,
        type: str | None = None,
        sort: str = "-created",
        each: Callable[[Job], Any] | None = None,
    ) -> tuple[list[Any], int]:
        """Jobs in ``sort`` order (default newest first), filtered; returns (page, total matching).

        ``sort``: one of :data:`SORT_KEYS`, ``-`` first for descending; ties go newest first.

        ``algorithms_in``: only jobs with one of these algorithm folders (normalised absolute
        paths) or contents (``sha256:...``), :mod:`.algorithm_folders`; an empty list matches
        nothing, None does not filter.

        The page's ids come from an index (newest first, then by id), and only those rows'
        JSON is read: a page costs the same however many jobs match.  ``viewer``: only the jobs
        this user may see (its own, the service's, and others' whose access is not ``none``);
        None: every job (an admin's view).

        ``each``: the page holds ``each(job)`` for each job instead of the job, made as the rows
        are read one at a time from one query (a listing's summaries: only one whole job, and
        one row's JSON, is held at a time, however large the page and its specs).  The job
        given to ``each`` may be one an earlier listing parsed from the same stored JSON (the
        last :data:`LISTED_KEPT`, up to :data:`LISTED_KEPT_CHARS` of JSON, are kept: parsing
        whole jobs was most of a listing's time), so
        ``each`` must not change it.
        """
        page = select(jobs_table.c.id)
        count = select(func.count()).select_from(jobs_table)
        conditions = []
        if viewer is not None:
            conditions.append(
                or_(
                    jobs_table.c.creator == viewer,
                    jobs_table.c.creator.is_(None),
                    jobs_table.c.access != Access.none.value,
                )
            )
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
        if algorithms_in is not None:
            conditions.append(algorithm_folders.matches(jobs_table.c.algorithms, algorithms_in))
        if type:  # read from the job's JSON: no column (and no migration) for a rare filter
            conditions.append(
                func.coalesce(func.json_extract(jobs_table.c.job, "$.spec.type"), "regular") == type
            )
        for cond in conditions:
            page = page.where(cond)
            count = count.where(cond)
        order = _order(sort)
        page = page.order_by(*order).offset(offset).limit(limit)
        query = select(jobs_table.c.job).where(jobs_table.c.id.in_(page.scalar_subquery())).order_by(*order)
        with self.engine.connect() as conn:
            if each is not None:
                items = [each(self._listed_job(r[0])) for r in conn.execute(query)]
            else:
                items = [Job.model_validate_json(r[0]) for r in conn.execute(query).all()]
            total = conn.execute(count).scalar_one()
        return items, int(total)

    def _listed_job(self, stored: str) -> Job:
        """The job ``stored`` (its JSON as stored) parses to, parsed again only when the JSON
        differs from every kept one (any change of the job changes its JSON)."""
        with self._listed_lock:
            job = self._listed.get(stored)
            if job is not None:
                self._listed.move_to_end(stored)
                return job
        job = Job.model_validate_json(stored)
        with self._listed_lock:
            # a large spec is parsed on each listing rather than crowding out the rest
            if stored not in self._listed and len(stored) <= LISTED_KEPT_CHARS // LISTED_KEPT:
                self._listed[stored] = job
                self._listed_chars += len(stored)
            while len(self._listed) > LISTED_KEPT or self._listed_chars > LISTED_KEPT_CHARS:
                self._listed_chars -= len(self._listed.popitem(last=False)[0])
        return job

    def by_status(self, *statuses: JobStatus) -> builtins.list[Job]:
        """Jobs in these statuses, in queue order (priority high first, then oldest first)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_JOBS_IN_QUEUE_ORDER, {"statuses": [s.value for s in statuses]}).all()
        return [Job.model_validate_json(r[0]) for r in rows]

    def placed(self, status: JobStatus) -> builtins.list[Job]:
        """Jobs in ``status`` that have a stored placement (a queued one was being launched when
        the service stopped)."""
        query = select(jobs_table.c.job).where(
            jobs_table.c.status == status.value, jobs_table.c.placement.is_not(None)
        )
        with self.engine.connect() as conn:
            return [Job.model_validate_json(r[0]) for r in conn.execute(query).all()]

    def count_jobs(self, creator: str, statuses: Iterable[JobStatus], priority: int | None) -> int:
        """How many of ``creator``'s jobs are in these statuses with this priority rank (None:
        any priority)."""
        conditions = [jobs_table.c.creator == creator, jobs_table.c.status.in_([s.value for s in statuses])]
        if priority is not None:
            conditions.append(jobs_table.c.priority == priority)
        query = select(func.count()).select_from(jobs_table).where(*conditions)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    # ------------------------------------------------------------------ supervisor state

    def set_desired(self, job_id: str, desired: str | None) -> None:
        """Record (or clear, with None) a request the supervisor must carry out, e.g. ``"stop"``."""
        with self.writing() as conn:
            conn.execute(jobs_table.update().where(jobs_table.c.id == job_id).values(desired=desired))

    def desired(self, job_id: str) -> str | None:
        """The pending request for a job, if any."""
        with self.engine.connect() as conn:
            row = conn.execute(_DESIRED_BY_ID, {"job_id": job_id}).first()
        return row[0] if row else None

    def set_ending(self, job_id: str, ending: dict | None) -> None:
        """Record (or clear, with None) the end of the job's current attempt that the supervisor
        is carrying out, ahead of its wind-down (see ``policies.end_record``)."""
        value = json.dumps(ending) if ending is not None else None
        with self.writing() as conn:
            conn.execute(jobs_table.update().where(jobs_table.c.id == job_id).values(ending=value))

    def ending(self, job_id: str) -> dict | None:
        """The end recorded by :meth:`set_ending` and not cleared yet, if any."""
        with self.engine.connect() as conn:
            row = conn.execute(_ENDING_BY_ID, {"job_id": job_id}).first()
        return json.loads(row[0]) if row and row[0] else None

    def set_placement(self, job_id: str, placement: dict | None) -> None:
        """Store (or clear) the placement of the job's current attempt."""
        with self.writing() as conn:
            conn.execute(
                jobs_table.update()
                .where(jobs_table.c.id == job_id)
                .values(placement=json.dumps(placement) if placement is not None else None)
            )

    def placement(self, job_id: str) -> dict | None:
        """The stored placement of the job's current attempt, if it has one."""
        with self.engine.connect() as conn:
            row = conn.execute(_PLACEMENT_BY_ID, {"job_id": job_id}).first()
        return json.loads(row[0]) if row and row[0] else None

    # ---------------------------------------------------------------------------- events

    def events(self, job_id: str, after: int = 0) -> builtins.list[Event]:
        """A job's events with a sequence number above ``after``, oldest first."""
        query = (
            select(events_table.c.event)
            .where(events_table.c.job_id == job_id, events_table.c.seq > after)
            .order_by(events_table.c.seq)
        )
        with self.engine.connect() as conn:
            return [Event.model_validate_json(r[0]) for r in conn.execute(query).all()]

    # ------------------------------------------------------------------ resource samples

    def add_samples(self, job_id: str, samples: Iterable[ResourceSample]) -> None:
        """Keep samples of a job (one transaction)."""
        rows = [
            {
                "job_id": job_id,
                "node": s.node,
                "t": s.t,
                "cpu": s.cpu_percent,
                "memory_mb": s.memory_mb,
                "card": s.card_percent,
                "card_memory_mb": s.card_memory_mb,
            }
            for s in samples
        ]
        if rows:
            with self.writing() as conn:
                conn.execute(samples_table.insert(), rows)

    def samples(self, job_id: str, since: float | None = None) -> builtins.list[ResourceSample]:
        """A job's samples taken after ``since`` (all without it), oldest first."""
        c = samples_table.c
        query = select(c.t, c.node, c.cpu, c.memory_mb, c.card, c.card_memory_mb).where(c.job_id == job_id)
        if since is not None:
            query = query.where(c.t > since)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(c.seq)).all()
        return [
            ResourceSample(
                t=t, node=node, cpu_percent=cpu, memory_mb=mem, card_percent=card, card_memory_mb=card_mem
            )
            for t, node, cpu, mem, card, card_mem in rows
        ]

    def thin_samples(self, job_id: str, node: str, keep: int) -> None:
        """When a node of a job has more than ``keep`` samples, drop every other one of its
        older half (the newest half keeps its full resolution)."""
        c = samples_table.c
        mine = (c.job_id == job_id) & (c.node == node)
        with self.writing() as conn:
            seqs = [r[0] for r in conn.execute(select(c.seq).where(mine).order_by(c.seq)).all()]
            if len(seqs) <= keep:
                return
            doomed = seqs[: len(seqs) // 2][1::2]
            conn.execute(samples_table.delete().where(c.seq.in_(doomed)))

    # ----------------------------------------------------------------------------- users

    def add_user(self, name: str, admin: bool, token_hash: str) -> User:
        """Create a user with its token's hash.

        Raises:
            Conflict: a user of that name exists.
        """
        try:
            with self.writing() as conn:
                conn.execute(
                    users_table.insert().values(
                        name=name, admin=admin, created=time.time(), token_hash=token_hash
                    )
                )
        except IntegrityError:
            raise Conflict(
                f"a user {name!r} exists already: `ma-jupyter users token {name}` gives it a new token"
            ) from None
        return self.user(name)

    def ensure_user(self, name: str) -> User:
        """The user ``name``, created as a non-admin without a token if it does not exist."""
        with self.writing() as conn:
            conn.execute(
                users_table.insert()
                .prefix_with("OR IGNORE")
                .values(name=name, admin=False, created=time.time(), token_hash=None)
            )
        return self.user(name)

    def set_owner(self, name: str, token_hash: str) -> User:
        """Make ``name`` an admin whose token is now ``token_hash`` (the service owner at each start)."""
        with self.writing() as conn:
            conn.execute(
                users_table.insert()
                .prefix_with("OR IGNORE")
                .values(name=name, admin=True, created=time.time(), token_hash=None)
            )
            conn.execute(
                users_table.update()
                .where(users_table.c.name == name)
                .values(admin=True, token_hash=token_hash)
            )
        return self.user(name)

    def set_token(self, name: str, token_hash: str) -> User:
        """Replace the token of ``name`` (the old one stops working).

        Raises:
            NotFound: no such user.
        """
        self._update_user(name, token_hash=token_hash)
        return self.user(name)

    def _update_user(self, name: str, **values: Any) -> None:
        """Set ``values`` (columns of the users table) of user ``name``.

        Raises:
            NotFound: no such user.
        """
        with self.writing() as conn:
            done = conn.execute(
                users_table.update().where(users_table.c.name == name).values(**values)
            ).rowcount
        if not done:
            raise NotFound(f"no user {name!r}: `ma-jupyter users list` shows them")

    def remove_user(self, name: str) -> None:
        """Forget a user and its token (its jobs stay).

        Raises:
            NotFound: no such user.
        """
        with self.writing() as conn:
            done = conn.execute(users_table.delete().where(users_table.c.name == name)).rowcount
        if not done:
            raise NotFound(f"no user {name!r}: `ma-jupyter users list` shows them")

    def user(self, name: str) -> User:
        """The user ``name``; NotFound when there is none."""
        with self.engine.connect() as conn:
            row = conn.execute(select(users_table).where(users_table.c.name == name)).first()
        if row is None:
            raise NotFound(f"no user {name!r}: `ma-jupyter users list` shows them")
        return _user(row)

    def user_for_token(self, token_hash: str) -> User | None:
        """The user whose token has this hash, if any."""
        with self.engine.connect() as conn:
            row = conn.execute(select(users_table).where(users_table.c.token_hash == token_hash)).first()
        return _user(row) if row is not None else None

    def set_notify_webhook(self, name: str, url: str | None) -> None:
        """Name (None: forget) the webhook ``name``'s events go to (:mod:`.webhooks`).

        Raises:
            NotFound: no such user.
        """
        self._update_user(name, notify_webhook=url)

    def set_notify_address(self, name: str, address: str | None) -> None:
        """Name (None: forget) the address the administrator's ``[notify]`` command is given
        with each event of ``name``'s jobs (:mod:`.notify` rule 3).

        Raises:
            NotFound: no such user.
        """
        self._update_user(name, notify_address=address)

    def notify_address(self, name: str) -> str | None:
        """The address ``name`` named for the administrator's command; None: none (or no such user)."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(users_table.c.notify_address).where(users_table.c.name == name)
            ).scalar_one_or_none()

    def notify_webhook(self, name: str) -> str | None:
        """The webhook ``name``'s events go to; None: none (or no such user)."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(users_table.c.notify_webhook).where(users_table.c.name == name)
            ).scalar_one_or_none()

    def users(self) -> builtins.list[User]:
        """Every user, by name."""
        with self.engine.connect() as conn:
            return [_user(r) for r in conn.execute(select(users_table).order_by(users_table.c.name)).all()]


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
