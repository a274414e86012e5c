"""The store's schema: every table of the service's database, and its numbered migrations.

The one place a table, a column or an index of ``jobs.db`` is defined (:mod:`.store` reads
and writes jobs, events and users through it, :mod:`.algorithms` its favourites).

1. The database's version is SQLite's ``user_version`` pragma: the number of the last
   migration applied.  :data:`SCHEMA_VERSION` is the version this code reads and writes.
2. A new database gets every table and index as defined here at once, and the version
   :data:`SCHEMA_VERSION`.
3. An older database is upgraded in place when the store opens it: each migration after its
   version runs in turn, in order, and the version is set to that migration's number as it
   ends, so an upgrade cut short resumes at the first step not done.
4. A database of a version above :data:`SCHEMA_VERSION` (made by a newer ma_jupyter) is
   refused with :class:`~ma_jupyter.errors.StoreTooNew`, naming the file and both versions;
   nothing of it is changed.
5. Every migration checks what it adds and fills only what is still empty: SQLite's
   ``ALTER TABLE`` is not undone with the transaction it ran in, so an upgrade cut short after
   one may have left the column without its values, and the next start completes it.  Migrations
   1 to 6 also rebuild the history from before the version was kept (a database of version 0
   that holds tables, made by any earlier ma_jupyter, may have any prefix of them).
6. A change of the schema is a table or column here plus one migration appended to
   :data:`MIGRATIONS` (the next number): never an edit of a migration already released.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine

from ..errors import StoreTooNew
from ..models import Job
from . import algorithm_folders

metadata = MetaData()

jobs_table = Table(
    "jobs",
    metadata,
    Column("id", String, primary_key=True),
    Column("name", String, nullable=False, index=True),
    Column("status", String, nullable=False, index=True),
    Column("priority", Integer, nullable=False),
    Column("creator", String),
    Column("access", String),  # others' access (spec.access), for the listing's visibility rule
    Column("created", Float, nullable=False),
    Column("specs", String, nullable=False),  # space-separated, for the spec filter
    Column("outputs", String),
    Column("algorithms", Text),  # the job's algorithm folders, for its filter (algorithm_folders.py)
    Column("desired", String),  # a pending "stop" the supervisor must carry out, survives restarts
    Column("placement", Text),  # JSON of the current attempt's placement
    # JSON of the end the supervisor began to carry out and has not recorded yet (written ahead
    # of stopping the nodes, so that a service restarted meanwhile records the same end)
    Column("ending", Text),
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


#: The values of a job's ``secret_env``, apart from its JSON (whose spec shows them as ``***``):
#: read only to launch the job's nodes, deleted with the job.  The database file is 0600.
secrets_table = Table(
    "secrets",
    metadata,
    Column("job_id", String, primary_key=True),
    Column("env", Text, nullable=False),  # JSON object: name -> value
)


#: Resource samples of running jobs (``service/resources.py`` takes and thins them), deleted
#: with the job.
samples_table = Table(
    "resource_samples",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String, nullable=False, index=True),
    Column("node", String, nullable=False),
    Column("t", Float, nullable=False),
    Column("cpu", Float, nullable=False),
    Column("memory_mb", Float, nullable=False),
    Column("card", Float),
    Column("card_memory_mb", Float),
)


users_table = Table(
    "users",
    metadata,
    Column("name", String, primary_key=True),
    Column("admin", Boolean, nullable=False, default=False),
    Column("created", Float, nullable=False),
    # sha256 (hex) of the user's token; NULL for a user known only from a forwarding proxy
    Column("token_hash", String, unique=True),
    Column("notify_webhook", String),  # the user's own webhook (webhooks.py); NULL: none
    Column("notify_address", String),  # in the events the admin's [notify] command gets; NULL: none
)


# The indexes the store's queries need (migration 6 made them for older databases):
# the queue order of one status (by_status), the listing newest first (unfiltered, by status,
# by creator).  Each ends with the id so the listing finds a page's rows from the index alone.
QUERY_INDEXES = (
    "CREATE INDEX IF NOT EXISTS ix_jobs_queue ON jobs (status, priority DESC, created, id)",
    "CREATE INDEX IF NOT EXISTS ix_jobs_created ON jobs (created, id)",
    "CREATE INDEX IF NOT EXISTS ix_jobs_status_created ON jobs (status, created, id)",
    "CREATE INDEX IF NOT EXISTS ix_jobs_creator_created ON jobs (creator, created, id)",
)


#: Each user's favourite algorithm folders (``service/algorithms.py``, its rule 3).
favourites_table = Table(
    "favourite_algorithms",
    metadata,
    Column("user", String, primary_key=True),
    Column("path", String, primary_key=True),
    Column("added", Float, nullable=False),
)


# ------------------------------------------------------------------------------ migrations


def _has_column(conn: Connection, table: str, column: str) -> bool:
    return column in {c["name"] for c in inspect(conn).get_columns(table)}


def _m1_tables(conn: Connection) -> None:
    """The tables (those an earlier version made are kept as they are)."""
    metadata.create_all(conn, checkfirst=True)


def _m2_sample_card_memory(conn: Connection) -> None:
    """``resource_samples.card_memory_mb``: the cards' memory of a sample."""
    if not _has_column(conn, "resource_samples", "card_memory_mb"):
        conn.execute(text("ALTER TABLE resource_samples ADD COLUMN card_memory_mb FLOAT"))


def _m3_user_webhook(conn: Connection) -> None:
    """``users.notify_webhook``: each user's own webhook."""
    if not _has_column(conn, "users", "notify_webhook"):
        conn.execute(text("ALTER TABLE users ADD COLUMN notify_webhook VARCHAR"))


def _m4_job_access(conn: Connection) -> None:
    """``jobs.access``: others' access, for the listing's visibility rule, from each job's spec."""
    if not _has_column(conn, "jobs", "access"):
        conn.execute(text("ALTER TABLE jobs ADD COLUMN access VARCHAR"))
    # every row still empty (rule 5: an upgrade cut short after the ALTER is completed here)
    conn.execute(text("UPDATE jobs SET access = json_extract(job, '$.spec.access') WHERE access IS NULL"))


def _m5_job_algorithms(conn: Connection) -> None:
    """``jobs.algorithms``: a job's algorithm folders, for its filter, from each job's spec."""
    if not _has_column(conn, "jobs", "algorithms"):
        conn.execute(text("ALTER TABLE jobs ADD COLUMN algorithms TEXT"))
    # every row still empty (rule 5); a job without algorithm folders is computed again, alike
    empty = select(jobs_table.c.id, jobs_table.c.job).where(jobs_table.c.algorithms.is_(None))
    for job_id, data in conn.execute(empty).all():
        value = algorithm_folders.column(Job.model_validate_json(data).spec)
        conn.execute(jobs_table.update().where(jobs_table.c.id == job_id).values(algorithms=value))


def _m6_query_indexes(conn: Connection) -> None:
    """The indexes the store's queries need."""
    for ddl in QUERY_INDEXES:
        conn.execute(text(ddl))


def _m7_user_address(conn: Connection) -> None:
    """``users.notify_address``: the address a user names for the admin's ``[notify]`` events
    (rule 5: it may be there already)."""
    if not _has_column(conn, "users", "notify_address"):
        conn.execute(text("ALTER TABLE users ADD COLUMN notify_address VARCHAR"))


def _m8_job_ending(conn: Connection) -> None:
    """``jobs.ending``: the end of an attempt written ahead of its wind-down (rule 5: it may be
    there already; no job of an older service has one)."""
    if not _has_column(conn, "jobs", "ending"):
        conn.execute(text("ALTER TABLE jobs ADD COLUMN ending TEXT"))


#: the migrations, in order: ``MIGRATIONS[n - 1]`` brings a database of version n - 1 to n
MIGRATIONS: tuple[Callable[[Connection], None], ...] = (
    _m1_tables,
    _m2_sample_card_memory,
    _m3_user_webhook,
    _m4_job_access,
    _m5_job_algorithms,
    _m6_query_indexes,
    _m7_user_address,
    _m8_job_ending,
)
#: the version of the schema defined here (rule 1)
SCHEMA_VERSION = len(MIGRATIONS)


def version(conn: Connection) -> int:
    """The database's ``user_version`` (rule 1)."""
    return int(conn.execute(text("PRAGMA user_version")).scalar_one())


def upgrade(engine: Engine, path: Path | str) -> int:
    """Bring the database of ``engine`` (the file ``path``, for messages) to
    :data:`SCHEMA_VERSION` (rules 2 to 4); the version it had.

    Raises:
        StoreTooNew: the database's version is above :data:`SCHEMA_VERSION`.
    """
    with engine.begin() as conn:
        found = version(conn)
        if found > SCHEMA_VERSION:
            raise StoreTooNew(
                f"{path} was written by a newer ma_jupyter (its store schema is version {found}; "
                f"this one knows versions up to {SCHEMA_VERSION}): upgrade ma_jupyter, or give this "
                "one a home of its own (MA_JUPYTER_HOME)"
            )
        if found == 0 and not inspect(conn).get_table_names():  # a new database (rule 2)
            metadata.create_all(conn)
            _m6_query_indexes(conn)
            conn.execute(text(f"PRAGMA user_version = {SCHEMA_VERSION}"))
            return found
    for number in range(found + 1, SCHEMA_VERSION + 1):  # rule 3
        with engine.begin() as conn:
            MIGRATIONS[number - 1](conn)
            conn.execute(text(f"PRAGMA user_version = {number}"))
    return found
