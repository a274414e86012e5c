"""Notifications are fair: one user's flood of events neither drops nor delays another's.

The administrator's ``[notify]`` command is a real one that blocks until the test opens a gate
(a file), as a slow mail gateway would.  While it blocks, bob's job ends, a node is marked
faulty, and alice's 2,200 short jobs end.  Once the gate opens, bob's terminal event and the
faulty-node alert reach the command among its first few runs, and alice's events beyond her
queue's bound arrive as one ``coalesced`` event with their count, so none is lost silently.
"""

from __future__ import annotations

import json
import shlex
import time

from ma_jupyter.service.notify import MAX_PENDING_PER_USER, Notifier

FLOOD = 2200


def _events(path, predicate, timeout: float = 120.0) -> list[dict]:
    """The events the command recorded, once ``predicate`` holds for them (bounded wait)."""
    end = time.monotonic() + timeout
    events: list[dict] = []
    while time.monotonic() < end:
        if path.exists():
            events = [json.loads(line) for line in path.read_text().splitlines() if line]
            if predicate(events):
                return events
        time.sleep(0.05)
    raise AssertionError(f"the command's events never satisfied the test: {events[-5:]}")


def test_a_flood_of_one_user_neither_drops_nor_delays_another_users_end_or_a_node_alert(tmp_path):
    out, gate = tmp_path / "events.jsonl", tmp_path / "gate"
    # records its event, then waits for the gate (a blocked notification gateway)
    script = f"cat >> {shlex.quote(str(out))}; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"
    notifier = Notifier(shlex.join(["/bin/sh", "-c", script]), str(tmp_path), timeout=300)
    try:
        notifier.notify("ended", job="alice-0", name="short", user="alice", status="succeeded")
        _events(out, lambda events: len(events) == 1)  # the command now blocks on alice's first
        notifier.notify("ended", job="bob-1", name="long", user="bob", status="failed", reason="exit 1")
        notifier.notify(
            "alert", job="", name="", user=None, status="faulty", reason="card lost", node="node-3"
        )
        for i in range(1, FLOOD + 1):
            notifier.notify("ended", job=f"alice-{i}", name="short", user="alice", status="succeeded")
        gate.touch()

        def alice_all_told(events: list[dict]) -> bool:
            folded = sum(e.get("count", 0) for e in events if e["kind"] == "coalesced")
            return folded + sum(e["kind"] == "ended" and e["user"] == "alice" for e in events) == FLOOD + 1

        events = _events(out, alice_all_told)
    finally:
        gate.touch()
        notifier.close(timeout=60)
    kinds = [(e["kind"], e["user"], e["job"], e["node"]) for e in events]
    bob = kinds.index(("ended", "bob", "bob-1", None))
    node = kinds.index(("alert", None, "", "node-3"))
    # the node's alert goes first, bob's end in the first round: neither waits behind alice's flood
    assert node == 1 and bob <= 3, kinds[:6]
    (coalesced,) = [e for e in events if e["kind"] == "coalesced"]
    assert coalesced["user"] == "alice"
    assert coalesced["count"] == FLOOD - MAX_PENDING_PER_USER
    assert coalesced["statuses"] == {"succeeded": FLOOD - MAX_PENDING_PER_USER}
    # the oldest were folded (and listed, up to the cap); the newest were told one by one
    assert coalesced["jobs"][:2] == ["alice-1", "alice-2"]
    assert len(coalesced["jobs"]) + coalesced["jobs_omitted"] == coalesced["count"]
    told = [e["job"] for e in events if e["kind"] == "ended" and e["user"] == "alice"]
    assert told == ["alice-0"] + [f"alice-{i}" for i in range(FLOOD - MAX_PENDING_PER_USER + 1, FLOOD + 1)]
    assert "folded" in coalesced["reason"] and str(MAX_PENDING_PER_USER) in coalesced["reason"]


def test_users_take_turns_and_each_users_events_keep_their_order(tmp_path):
    out, gate = tmp_path / "events.jsonl", tmp_path / "gate"
    script = f"cat >> {shlex.quote(str(out))}; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"
    notifier = Notifier(shlex.join(["/bin/sh", "-c", script]), str(tmp_path), timeout=300)
    try:
        notifier.notify("ended", job="a0", name="j", user="alice", status="succeeded")
        _events(out, lambda events: len(events) == 1)
        for i in range(1, 4):
            notifier.notify("ended", job=f"a{i}", name="j", user="alice", status="succeeded")
        for i in range(2):
            notifier.notify("ended", job=f"b{i}", name="j", user="bob", status="succeeded")
        notifier.notify("ended", job="s0", name="j", user=None, status="succeeded")  # the service's own
        gate.touch()
        events = _events(out, lambda events: len(events) == 7)
    finally:
        gate.touch()
        notifier.close(timeout=60)
    assert [e["job"] for e in events] == ["a0", "a1", "b0", "s0", "a2", "b1", "a3"]
    assert not any(e["kind"] == "coalesced" for e in events)
