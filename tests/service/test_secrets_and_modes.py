"""Files and secrets (issue 13, item 5), on a real service: the service's home is 0700, its
runtime file, database and logs 0600; a secret variable reaches the job's process and nothing
that shows the job (its JSON, the plan, the jobs table, the events, the log).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import stat
import uuid

from tests.fixtures.service_api import full_log, pycmd, submit, wait_status


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_home_is_0700_and_its_runtime_file_database_and_logs_0600(ma_service, ma_home):
    job = submit(ma_service, name="modes", command=pycmd("print('hello')"))
    wait_status(ma_service, job["id"], {"succeeded"})
    assert _mode(ma_home) == 0o700
    assert _mode(ma_home / "service.json") == 0o600
    assert _mode(ma_home / "service.lock") == 0o600
    databases = [p for p in ma_home.iterdir() if p.name.startswith("jobs.db")]
    assert databases and all(_mode(p) == 0o600 for p in databases), {p.name: oct(_mode(p)) for p in databases}
    logs = [p for p in (ma_home / "jobs" / job["id"]).rglob("*.log") if p.is_file()]
    assert logs and all(_mode(p) == 0o600 for p in logs), {str(p): oct(_mode(p)) for p in logs}


def test_a_secret_reaches_the_job_and_nothing_that_shows_it(ma_service, ma_home):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    prefixed = f"p4ss-{uuid.uuid4().hex}"
    digest = hashlib.sha256((secret + prefixed).encode()).hexdigest()
    # the job proves it sees both values without printing them: their digest goes to the log
    command = pycmd(
        "import hashlib, os; "
        "print('digest', hashlib.sha256((os.environ['API_KEY'] + os.environ['DB_PASS']).encode()).hexdigest())"
    )
    body = {
        "name": "secretive",
        "command": command,
        "env": {"PLAIN": "visible", "DB_PASS": f"secret:{prefixed}"},
        "secret_env": {"API_KEY": secret},
    }
    s = ma_service.session()
    plan = s.post(f"{ma_service.api}/plan", json=body, timeout=30)
    assert plan.status_code == 200, plan.text
    assert plan.json()["nodes"][0]["env"]["API_KEY"] == "***"
    assert plan.json()["nodes"][0]["env"]["DB_PASS"] == "***"
    r = s.post(f"{ma_service.api}/jobs", json=body, timeout=30)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["secret_env"] == {"API_KEY": "***", "DB_PASS": "***"}
    assert job["spec"]["env"] == {"PLAIN": "visible"}
    wait_status(ma_service, job["id"], {"succeeded"})
    assert f"digest {digest}" in full_log(ma_service, job["id"])
    exported = s.post(f"{ma_service.api}/export", json=body, timeout=30)
    assert exported.status_code == 200 and "API_KEY" in exported.text, exported.text
    shown = [
        exported.text,
        plan.text,
        r.text,
        s.get(f"{ma_service.api}/jobs/{job['id']}", timeout=10).text,
        s.get(f"{ma_service.api}/jobs", timeout=10).text,
        s.get(f"{ma_service.api}/jobs/{job['id']}/events", timeout=10).text,
        s.get(f"{ma_service.api}/jobs/{job['id']}/export", timeout=10).text,
        full_log(ma_service, job["id"]),
        (ma_home / "service.log").read_text(),
    ]
    with sqlite3.connect(ma_home / "jobs.db") as db:
        shown += [json.dumps(row) for row in db.execute("SELECT * FROM jobs")]
        shown += [json.dumps(row) for row in db.execute("SELECT * FROM events")]
        kept = json.loads(db.execute("SELECT env FROM secrets WHERE job_id = ?", (job["id"],)).fetchone()[0])
    for text in shown:
        assert secret not in text and prefixed not in text
    assert kept == {"API_KEY": secret, "DB_PASS": prefixed}  # apart, in the 0600 database
    # a copy of the job (its spec as shown) must give the secrets again, and says so
    clone = s.post(f"{ma_service.api}/jobs", json={**job["spec"], "name": "copy"}, timeout=30)
    assert clone.status_code == 400 and clone.json()["field"] == "secret_env", clone.text
    assert "give the secret's value again" in clone.json()["message"]
    # the dry run says the same (a form checking a clone as you type shows it at the field)
    planned = s.post(f"{ma_service.api}/plan", json={**job["spec"], "name": "copy"}, timeout=30)
    assert planned.status_code == 400 and planned.json()["field"] == "secret_env", planned.text
    # deleting the job deletes its secrets
    assert s.delete(f"{ma_service.api}/jobs/{job['id']}", timeout=30).status_code == 204
    with sqlite3.connect(ma_home / "jobs.db") as db:
        assert db.execute("SELECT COUNT(*) FROM secrets").fetchone()[0] == 0
