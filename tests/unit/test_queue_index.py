"""The queue index (service/queue.py), the scheduler's shapes it groups by, and the store's indexes."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

from ma_jupyter.config import Cluster
from ma_jupyter.models import Event, Job, JobSpec, JobStatus, Node, Priority, Spec, utcnow
from ma_jupyter.service.queue import QueueIndex, queue_key
from ma_jupyter.service.scheduler import NodeUse, Scheduler
from ma_jupyter.service.store import QUERY_INDEXES, Store

T0 = utcnow()


def job(job_id: str, priority: str = "normal", age: int = 0, **spec) -> Job:
    """A queued job submitted ``age`` seconds after T0."""
    return Job(
        id=job_id,
        spec=JobSpec(name="j", command="true", priority=priority, **spec),
        status=JobStatus.queued,
        created_at=T0 + timedelta(seconds=age),
    )


def by_node(spec: JobSpec):
    return spec.node_name


def test_the_order_is_priority_then_submit_time_then_id():
    index = QueueIndex(by_node)
    jobs = [
        job("n1", "normal", 1),
        job("u2", "urgent", 2),
        job("n0", "normal", 0),
        job("v3", "very-urgent", 3),
        job("u1", "urgent", 1),
        job("b1", "normal", 1),  # same time as n1: the id decides
    ]
    for j in jobs:
        index.put(j)
    order = ["v3", "u1", "u2", "n0", "b1", "n1"]
    assert index.ids() == order
    assert [index.position(i) for i in order] == list(range(6))
    assert index.ids() == [k[-1] for k in sorted(queue_key(j) for j in jobs)]
    assert index.position("nope") is None and len(index) == 6 and "u1" in index


def test_a_new_job_has_every_job_of_its_priority_or_higher_ahead():
    index = QueueIndex(by_node)
    assert index.ahead(Priority.normal) == 0
    for j in [job("a", "normal"), job("b", "urgent"), job("c", "very-urgent"), job("d", "normal")]:
        index.put(j)
    assert index.ahead(Priority.normal) == 4
    assert index.ahead(Priority.urgent) == 2
    assert index.ahead(Priority.very_urgent) == 1


def test_a_priority_change_moves_a_job_and_leaving_removes_it():
    index = QueueIndex(by_node)
    for j in [job("a", age=0), job("b", age=1), job("c", age=2)]:
        index.put(j)
    index.put(job("c", "urgent", age=2))  # PATCH priority: the same job moves
    assert index.ids() == ["c", "a", "b"] and len(index) == 3
    assert index.discard("a") is True and index.discard("a") is False
    assert index.ids() == ["c", "b"] and index.position("b") == 1


def test_heads_give_the_first_job_of_each_shape_and_next_of_walks_a_shape():
    index = QueueIndex(by_node)
    for j in [
        job("t0", age=0, node_name="tiny"),
        job("b1", age=1, node_name="big"),
        job("t2", age=2, node_name="tiny"),
        job("b3", "urgent", age=3, node_name="big"),
    ]:
        index.put(j)
    heads = index.heads()
    assert [(key[-1], shape) for key, shape in heads] == [("b3", "big"), ("t0", "tiny")]
    first_tiny = heads[1][0]
    assert index.next_of("tiny", first_tiny)[-1] == "t2"
    index.discard("t0")  # the job left the queue (started): its successor is still found
    assert index.next_of("tiny", first_tiny)[-1] == "t2"
    assert index.next_of("tiny", index.heads()[1][0]) is None
    index.discard("t2")
    assert [shape for _, shape in index.heads()] == ["big"] and index.next_of("tiny", first_tiny) is None


def test_load_replaces_the_contents():
    index = QueueIndex(by_node)
    index.put(job("old"))
    index.load([job("x", age=2), job("y", "urgent", age=5)])
    assert index.ids() == ["y", "x"] and "old" not in index


# ------------------------------------------------------------------------------ shapes

CLUSTER = Cluster(
    specs=[Spec(name="cpu.small", cpus=1, memory_gb=1), Spec(name="cpu.medium", cpus=2, memory_gb=2)],
    nodes=[Node(name="big", cpus=8, memory_gb=16), Node(name="tiny", cpus=2, memory_gb=2)],
)


def test_jobs_of_one_shape_are_placed_alike_whatever_else_differs():
    scheduler = Scheduler(CLUSTER)
    one = JobSpec(name="a", command="true", mode="pytorch", specs=["cpu.medium"], nodes=2)
    other = JobSpec(
        name="b",
        command="python -c pass",
        mode="pytorch",
        specs=["cpu.medium"],
        nodes=2,
        priority="urgent",
        env={"X": "1"},
    )
    assert scheduler.shape(one) == scheduler.shape(other)
    for big_used in range(0, 9):
        use = {"big": NodeUse(cpus=big_used, memory_gb=big_used), "tiny": NodeUse()}
        a, b = scheduler.place("a", one, use), scheduler.place("b", other, use)
        assert (a is None) == (b is None)
        assert a is None or [t.host for t in a.tasks] == [t.host for t in b.tasks]


def test_every_field_placement_reads_changes_the_shape():
    scheduler = Scheduler(CLUSTER)
    base = JobSpec(name="a", command="true", mode="pytorch")
    variants = [
        {"specs": ["cpu.medium"]},
        {"node_name": "tiny"},
        {"driver_version": "1"},
        {"pool": "p"},
        {"nodes": 2},
        {"mode": "tensorflow", "ps": 1},
        {"mode": "tensorflow", "chief": True},
        {"convention": "modelarts"},  # the ModelArts TensorFlow layout places a ps beside each worker
        {"checkpoint_resume": {"elastic_min_nodes": 1}},
        {"type": "batch", "mode": "single", "command": None, "tasks": [{"command": "true"}]},
    ]
    shapes = {scheduler.shape(base)}
    for change in variants:
        spec = JobSpec.model_validate({**base.model_dump(), **change})
        shapes.add(scheduler.shape(spec))
    assert len(shapes) == len(variants) + 1


# ------------------------------------------------------------------------ store indexes


def test_the_store_creates_its_query_indexes_on_an_existing_database(tmp_path):
    path = tmp_path / "jobs.db"
    Store(path).engine.dispose()
    names = [ddl.split()[5] for ddl in QUERY_INDEXES]
    with sqlite3.connect(path) as conn:  # a database made before these indexes existed
        for name in names:
            conn.execute(f"DROP INDEX {name}")
        conn.execute("PRAGMA user_version = 0")  # (and before the store kept its version)
    Store(path).engine.dispose()
    with sqlite3.connect(path) as conn:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        plan = " ".join(
            str(row)
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT job FROM jobs WHERE status = 'queued' "
                "ORDER BY priority DESC, created"
            )
        )
    assert set(names) <= present
    assert "ix_jobs_queue" in plan and "TEMP B-TREE" not in plan


def test_an_insert_under_a_taken_id_creates_nothing_and_says_so(tmp_path):
    store = Store(tmp_path / "jobs.db")
    one, other = job("j-1"), job("j-1", "urgent", age=5)
    assert store.insert(one, Event(job_id="j-1", status=JobStatus.queued, reason="first")) == "j-1"
    assert store.insert(other, Event(job_id="j-1", status=JobStatus.queued, reason="second"), "k") is None
    assert store.get("j-1").spec.priority is Priority.normal
    assert [e.reason for e in store.events("j-1")] == ["first"] and store.job_for_key("k") is None


def test_a_job_avoiding_nodes_is_a_shape_of_its_own():
    """A job rescheduled away from a node may wait while jobs of its spec's shape fit there: it
    must not hold them back in an admission pass."""
    index = QueueIndex(by_node)
    avoiding = job("a0", age=0, node_name="big").model_copy(update={"excluded_nodes": ["n1"]})
    index.load([avoiding, job("b1", age=1, node_name="big")])
    shapes = [shape for _, shape in index.heads()]
    assert len(shapes) == 2 and "big" in shapes and ("big", "excluding", ("n1",)) in shapes


def test_within_a_priority_users_take_turns_counting_their_running_jobs():
    index = QueueIndex(by_node)
    for i in range(4):
        index.put(job(f"a{i}", age=i, creator="alice"))
    index.put(job("b0", age=10, creator="bob"))
    index.put(job("c0", age=11, creator="carol"))
    index.put(job("b1", age=12, creator="bob"))
    index.put(job("s0", age=13))  # the service's own (no creator): a user of its own
    assert index.ids() == ["a0", "b0", "c0", "s0", "a1", "b1", "a2", "a3"]
    assert index.ahead(Priority.normal, "dave") == 4  # after every user's first job
    assert index.ahead(Priority.normal, "bob") == 7  # after every second job, and alice's older third
    assert index.ahead(Priority.normal, "alice") == 8
    assert index.ahead(Priority.urgent, "alice") == 0
    # alice's first starts: one more running, one fewer ahead; served now, her jobs go after
    # those of the same share whose users were not
    index.starting(job("a0", age=0, creator="alice"))
    assert index.discard("a0")
    assert index.ids() == ["b0", "c0", "s0", "b1", "a1", "a2", "a3"]
    assert [index.position(i) for i in index.ids()] == list(range(7))
    assert index.running() == {"a0": "alice"} and index.ahead(Priority.normal, "dave") == 3
    # a queued job that stops leaves its user's later jobs one share up
    assert index.discard("b0")
    assert index.ids() == ["c0", "b1", "s0", "a1", "a2", "a3"]
    # alice's job ended (back to share 0, but served last), bob has two running
    index.set_running({"x1": "bob", "x2": "bob"})
    assert index.ids() == ["c0", "s0", "a1", "a2", "a3", "b1"]
    index.put(job("a2", "urgent", age=2, creator="alice"))  # a priority change: its group changes
    assert index.ids() == ["a2", "c0", "s0", "a1", "a3", "b1"]
    assert [key[-1] for key, _ in index.heads()] == ["a2"]
    # after a restart the shares are the same once the index knows what runs; the turns start afresh
    again = QueueIndex(by_node)
    again.load(
        [job("a1", age=1, creator="alice"), job("a3", age=3, creator="alice")]
        + [job("a2", "urgent", age=2, creator="alice"), job("b1", age=12, creator="bob")]
        + [job("c0", age=11, creator="carol"), job("s0", age=13)]
    )
    again.set_running({"x1": "bob", "x2": "bob"})
    assert again.ids() == ["a2", "a1", "c0", "s0", "a3", "b1"]
    assert [again.next_of(None, key)[-1] for key, _ in again.heads()] == ["a1"]


def test_a_user_whose_job_just_ended_waits_for_the_others_turn():
    """One node, alice's flood and bob's one job: each time alice's job ends she is back to
    the share of bob, who waits; bob goes first, having been served longest ago."""
    index = QueueIndex(by_node)
    for i in range(3):
        index.put(job(f"a{i}", age=i, creator="alice"))
    index.starting(job("a0", age=0, creator="alice"))
    index.discard("a0")
    index.put(job("b0", age=10, creator="bob"))
    assert index.ids() == ["b0", "a1", "a2"]
    index.set_running({})  # a0 ended: alice and bob both have nothing running
    assert index.ids() == ["b0", "a1", "a2"]


def test_many_jobs_moved_at_once_keep_the_order_and_the_shapes_exact():
    """A user's turn moves all of their queued jobs (re-sorted at once past a few dozen)."""
    index = QueueIndex(by_node)
    alice = [job(f"a{i:02}", age=i, creator="alice", node_name="big" if i % 2 else "tiny") for i in range(60)]
    for j in alice:
        index.put(j)
    index.put(job("b0", age=100, creator="bob", node_name="tiny"))
    assert index.ids()[:2] == ["a00", "b0"]
    index.starting(alice[0])  # alice served: every one of her jobs moves behind bob's at share 0
    assert index.discard("a00")
    assert index.ids() == ["b0"] + [j.id for j in alice[1:]]
    assert [index.position(i) for i in index.ids()] == list(range(60))
    heads = index.heads()
    assert [key[-1] for key, _ in heads] == ["b0", "a01"]
    assert index.next_of("tiny", heads[0][0])[-1] == "a02"
