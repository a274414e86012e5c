"""The store's schema and its versions (ma_jupyter/service/store_schema.py): a new database
gets the current version, an old one is upgraded in place keeping its jobs, a newer one is
refused naming the file and both versions."""

from __future__ import annotations

import sqlite3

import pytest

from ma_jupyter.errors import StoreTooNew
from ma_jupyter.models import Event, Job, JobSpec, JobStatus, ResourceSample, utcnow
from ma_jupyter.service import algorithm_folders
from ma_jupyter.service.algorithms import Favourites
from ma_jupyter.service.store import Store
from ma_jupyter.service.store_schema import SCHEMA_VERSION

#: the database ma_jupyter made before the store kept a version (user_version 0), as SQLite
#: shows it: the jobs, events and users tables of its first layout (no others' access, no
#: algorithm folders, no webhook, no card memory, no favourites, no query indexes)
FIRST_LAYOUT = """
CREATE TABLE jobs (
    id VARCHAR NOT NULL, name VARCHAR NOT NULL, status VARCHAR NOT NULL,
    priority INTEGER NOT NULL, creator VARCHAR, created FLOAT NOT NULL, specs VARCHAR NOT NULL,
    outputs VARCHAR, desired VARCHAR, placement TEXT, job TEXT NOT NULL, PRIMARY KEY (id)
);
CREATE INDEX ix_jobs_status ON jobs (status);
CREATE INDEX ix_jobs_name ON jobs (name);
CREATE TABLE events (
    seq INTEGER NOT NULL, job_id VARCHAR NOT NULL, event TEXT NOT NULL, PRIMARY KEY (seq)
);
CREATE INDEX ix_events_job_id ON events (job_id);
CREATE TABLE idempotency ("key" VARCHAR NOT NULL, job_id VARCHAR NOT NULL, PRIMARY KEY ("key"));
CREATE INDEX ix_idempotency_job_id ON idempotency (job_id);
CREATE TABLE secrets (job_id VARCHAR NOT NULL, env TEXT NOT NULL, PRIMARY KEY (job_id));
CREATE TABLE resource_samples (
    seq INTEGER NOT NULL, job_id VARCHAR NOT NULL, node VARCHAR NOT NULL, t FLOAT NOT NULL,
    cpu FLOAT NOT NULL, memory_mb FLOAT NOT NULL, card FLOAT, PRIMARY KEY (seq)
);
CREATE INDEX ix_resource_samples_job_id ON resource_samples (job_id);
CREATE TABLE users (
    name VARCHAR NOT NULL, admin BOOLEAN NOT NULL, created FLOAT NOT NULL, token_hash VARCHAR,
    PRIMARY KEY (name), UNIQUE (token_hash)
);
"""

#: what the layout had become by the last version before the store kept one: every column and
#: index the code makes, and the favourites table its first use made
LAST_UNVERSIONED = (
    FIRST_LAYOUT.replace("creator VARCHAR, created", "creator VARCHAR, access VARCHAR, created")
    .replace("outputs VARCHAR, desired", "outputs VARCHAR, algorithms TEXT, desired")
    .replace("card FLOAT, PRIMARY", "card FLOAT, card_memory_mb FLOAT, PRIMARY")
    .replace("token_hash VARCHAR,\n", "token_hash VARCHAR, notify_webhook VARCHAR,\n")
    + """
CREATE INDEX ix_jobs_queue ON jobs (status, priority DESC, created, id);
CREATE INDEX ix_jobs_created ON jobs (created, id);
CREATE INDEX ix_jobs_status_created ON jobs (status, created, id);
CREATE INDEX ix_jobs_creator_created ON jobs (creator, created, id);
CREATE TABLE favourite_algorithms (
    user VARCHAR NOT NULL, path VARCHAR NOT NULL, added FLOAT NOT NULL, PRIMARY KEY (user, path)
);
"""
)


def _old_database(path, layout: str) -> Job:
    """A database of ``layout`` holding one job (its row as that layout kept it) and a user."""
    job = Job(
        id="j-old",
        spec=JobSpec(name="old", command="true", algorithm="/srv/algo", access="ro", creator="ann"),
        status=JobStatus.queued,
        created_at=utcnow(),
    )
    event = Event(job_id=job.id, status=JobStatus.queued, reason="submitted")
    with sqlite3.connect(path) as conn:
        conn.executescript(layout)
        conn.execute(
            "INSERT INTO jobs (id, name, status, priority, creator, created, specs, job) "
            "VALUES (?, 'old', 'queued', 1, 'ann', 1.0, 'cpu.small', ?)",
            (job.id, job.model_dump_json()),
        )
        if "algorithms TEXT" in layout:  # what the code of that layout wrote in its columns
            conn.execute(
                "UPDATE jobs SET access = 'ro', algorithms = ?", (algorithm_folders.column(job.spec),)
            )
        conn.execute("INSERT INTO events (job_id, event) VALUES (?, ?)", (job.id, event.model_dump_json()))
        conn.execute("INSERT INTO users (name, admin, created, token_hash) VALUES ('ann', 0, 1.0, 'h')")
    return job


def _version(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


def test_a_new_database_gets_the_current_version(tmp_path):
    Store(tmp_path / "jobs.db").engine.dispose()
    assert _version(tmp_path / "jobs.db") == SCHEMA_VERSION >= 6


@pytest.mark.parametrize("layout", [FIRST_LAYOUT, LAST_UNVERSIONED], ids=["first", "last-unversioned"])
def test_an_unversioned_database_is_upgraded_in_place_keeping_its_jobs(tmp_path, layout):
    path = tmp_path / "jobs.db"
    job = _old_database(path, layout)
    store = Store(path)
    assert _version(path) == SCHEMA_VERSION
    assert store.get(job.id).spec.name == "old" and [e.reason for e in store.events(job.id)] == ["submitted"]
    # the columns added since were filled from the jobs' JSON
    assert [j.id for j in store.list(algorithms_in=["/srv/algo"])[0]] == [job.id]
    assert [j.id for j in store.list(viewer="bob")[0]] == [job.id]  # others may read it: ro
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT access FROM jobs").fetchone() == ("ro",)
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {
        "ix_jobs_queue",
        "ix_jobs_created",
        "ix_jobs_status_created",
        "ix_jobs_creator_created",
    } <= indexes
    # and the tables and columns added since work
    store.set_notify_webhook("ann", "https://hooks.example/ann")
    assert store.notify_webhook("ann") == "https://hooks.example/ann"
    store.add_samples(
        job.id, [ResourceSample(node="worker-0", t=1.0, cpu_percent=50, memory_mb=1.0, card_memory_mb=2.0)]
    )
    assert store.samples(job.id)[0].card_memory_mb == 2.0
    assert Favourites(store).add("ann", "/srv/algo") == "/srv/algo"
    store.engine.dispose()
    Store(path).engine.dispose()  # opening it again changes nothing
    assert _version(path) == SCHEMA_VERSION


def test_a_database_of_a_newer_version_is_refused_untouched(tmp_path):
    path = tmp_path / "jobs.db"
    Store(path).engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(StoreTooNew) as refused:
        Store(path)
    message = refused.value.message
    assert str(path) in message and f"version {SCHEMA_VERSION + 1}" in message
    assert f"up to {SCHEMA_VERSION}" in message and "upgrade ma_jupyter" in message
    assert path.read_bytes() == before and _version(path) == SCHEMA_VERSION + 1


def test_an_upgrade_cut_short_after_its_column_was_added_is_completed_at_the_next_start(tmp_path):
    """SQLite keeps an ALTER TABLE when the transaction it ran in fails: a database whose new
    columns came in but whose backfill did not (version still 0) gets its values at the next start."""
    path = tmp_path / "jobs.db"
    job = _old_database(path, LAST_UNVERSIONED)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET access = NULL, algorithms = NULL")
    store = Store(path)
    assert [j.id for j in store.list(algorithms_in=["/srv/algo"])[0]] == [job.id]
    assert [j.id for j in store.list(viewer="bob")[0]] == [job.id]
    store.engine.dispose()
