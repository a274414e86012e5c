"""The administrator's notification hook (service/notify.py), with real commands."""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time

from ma_jupyter.service.notify import Notifier
from ma_jupyter.service.store import Store

#: appends its stdin and a few facts of its environment to the file named by its argument
RECORDER = (
    "import json, os, sys; event = json.loads(sys.stdin.read()); "
    "event['_env'] = sorted(os.environ); event['_cwd'] = os.getcwd(); event['_argv'] = sys.argv[1:]; "
    "open(sys.argv[1], 'a').write(json.dumps(event) + '\\n')"
)


def _command(code: str, *args: str) -> str:
    return shlex.join([sys.executable, "-c", code, *args])


def _lines(path, count: int, deadline: float = 30.0) -> list[dict]:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= count:
                return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"{count} events not delivered to {path}")


def test_events_reach_the_command_in_order_as_json_with_a_clean_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MA_JUPYTER_TOKEN", "secret-token")  # the service's own secret
    out = tmp_path / "events.jsonl"
    notifier = Notifier(_command(RECORDER, str(out), "a;b"), str(tmp_path))
    notifier.notify(
        "alert", job="j-1", name="j", user="alice", status="running", reason="slow", node="node-0"
    )
    notifier.notify("ended", job="j-1", name="j", user="alice", status="failed", reason="exit 1")
    first, second = _lines(out, 2)
    notifier.close()
    assert (first["kind"], first["node"], first["reason"]) == ("alert", "node-0", "slow")
    assert (second["kind"], second["status"], second["node"]) == ("ended", "failed", None)
    assert first["time"].endswith("+00:00")
    assert "MA_JUPYTER_TOKEN" not in first["_env"] and "MA_JUPYTER_HOME" in first["_env"]
    assert first["_cwd"] == str(tmp_path)
    assert first["_argv"] == [str(out), "a;b"]  # argv, never a shell


def test_a_hanging_command_is_killed_and_a_failing_one_logged(tmp_path, caplog):
    out = tmp_path / "events.jsonl"
    hang = Notifier(_command("import time; time.sleep(600)"), str(tmp_path), timeout=0.5)
    with caplog.at_level(logging.WARNING, logger="ma_jupyter.service.notify"):
        hang.notify("ended", job="j-1", name="j", user=None, status="failed")
        hang.close(timeout=30)
        assert "ran past 0.5 s and was killed" in caplog.text
        failing = Notifier(_command("import sys; sys.exit('no mail server')"), str(tmp_path))
        failing.notify("ended", job="j-2", name="j", user=None, status="failed")
        failing.close(timeout=30)
        assert "exited 1: no mail server" in caplog.text
        missing = Notifier("/nonexistent/notify-me", str(tmp_path))
        missing.notify("ended", job="j-3", name="j", user=None, status="failed")
        missing.close(timeout=30)
        assert "cannot run /nonexistent/notify-me" in caplog.text
    # after failures the next event is still delivered
    later = Notifier(_command(RECORDER, str(out)), str(tmp_path))
    later.notify("ended", job="j-4", name="j", user=None, status="completed")
    assert _lines(out, 1)[0]["job"] == "j-4"
    later.close()


def test_without_a_command_nothing_runs(tmp_path):
    notifier = Notifier(None, str(tmp_path))
    notifier.notify("ended", job="j-1", name="j", user=None, status="failed")
    assert notifier._thread is None


def test_each_event_carries_the_address_its_user_named_as_delivered(tmp_path):
    """Seed 002 mails the user: the administrator's command (the site's mailer) gets, in each
    event, the address the job's user named (``PUT /users/me/notify``), as it is when the event
    is delivered; an event of no user, or of a user who named none, carries null."""
    store = Store(tmp_path / "jobs.db")
    store.ensure_user("alice")
    store.ensure_user("bob")
    store.set_notify_address("alice", "alice@example.org")
    out = tmp_path / "events.jsonl"
    notifier = Notifier(_command(RECORDER, str(out)), str(tmp_path), address_of=store.notify_address)
    notifier.notify("alert", job="j-1", name="j", user="alice", status="running", reason="slow")
    notifier.notify("ended", job="j-2", name="k", user="bob", status="failed")
    notifier.notify("alert", job="", name="", user=None, status="faulty", node="n1")
    events = {e["job"] or e["node"]: e for e in _lines(out, 3)}
    assert events["j-1"]["address"] == "alice@example.org" and events["j-1"]["user"] == "alice"
    assert events["j-2"]["address"] is None and events["n1"]["address"] is None
    store.set_notify_address("alice", None)  # forgotten: the next event carries none
    notifier.notify("ended", job="j-3", name="j", user="alice", status="succeeded")
    assert _lines(out, 4)[3]["address"] is None
    notifier.close()
