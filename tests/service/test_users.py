"""Real users against a real service: tokens, the seed's access matrix, priorities, sharing.

Two users, ``alice`` (who creates the jobs) and ``bob`` (another user), each with a token of
their own from the owner (an admin), act through the :class:`~ma_jupyter.client.Client` and
through the ``ma-jupyter`` console script (a subprocess with ``MA_JUPYTER_TOKEN``).  The
matrix jobs wait in the queue behind a blocker that fills the node they are pinned to, so
no cell starts a process of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from ma_jupyter.client import Client
from ma_jupyter.errors import Forbidden, LimitReached, NotFound, Unauthorized
from ma_jupyter.models import Job, JobStatus, clone_name
from tests.conftest import SMALL_CLUSTER_TOML
from tests.fixtures.service_process import ServiceProcess, start_service
from tests.helpers import wait_for, writable_dir

PY = sys.executable
REPO = str(Path(__file__).resolve().parents[2])
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "ma-jupyter")
OWNER = pwd.getpwuid(os.geteuid()).pw_name
SLEEPER = f'{PY} -c "import time; time.sleep(600)"'

OPS = ("view", "list", "clone", "tensorboard", "priority", "duration", "stop", "delete")
#: the seed's matrix: what another user may do, by the job's others' access
ALLOWED = {"rw": set(OPS), "ro": {"view", "list", "clone", "tensorboard"}, "none": set()}


def run_cli(
    home: Path, token: str | None, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``ma-jupyter ARGS`` as the user of ``token`` (None: the owner, from the runtime file)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MA_JUPYTER_TOKEN", "MA_JUPYTER_URL")}
    env.update(MA_JUPYTER_HOME=str(home), PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    if token is not None:
        env["MA_JUPYTER_TOKEN"] = token
    return subprocess.run(
        [CONSOLE_SCRIPT, *args], env=env, cwd=cwd or home, capture_output=True, text=True, timeout=120
    )


@dataclass
class Team:
    """A service with its owner (an admin) and two users, each with a client of their own."""

    svc: ServiceProcess
    tmp: Path
    admin: Client
    alice: Client
    bob: Client

    def cli(self, user: str, *args: str) -> subprocess.CompletedProcess:
        return run_cli(self.svc.home, self.svc.tokens[user], *args)

    def queued_job(self, access: str, **fields) -> Job:
        """A job of alice's that waits in the queue (its node is full), with a secret in its env."""
        job = self.alice.submit(
            name=f"m-{access}-{uuid.uuid4().hex[:6]}",
            command=f"{PY} -c pass",
            access=access,
            node_name="tiny",
            env={"SECRET": "s3cr3t"},
            **fields,
        ).info
        assert job.status is JobStatus.queued and job.spec.creator == "alice"
        return job


def _client(svc: ServiceProcess, token: str) -> Client:
    return Client(url=svc.url, token=token, timeout=30, local_logs=False)


def _stop_live_jobs(svc: ServiceProcess) -> None:
    s = svc.session()

    def live() -> list[dict]:
        reply = s.get(f"{svc.api}/jobs", params={"status": ["running", "queued"], "limit": 500}, timeout=10)
        return reply.json()["items"]

    for job in live():
        s.post(f"{svc.api}/jobs/{job['id']}/stop", timeout=10)
    wait_for(lambda: not live(), timeout=60)


def _stop_service(svc: ServiceProcess) -> None:
    if svc.proc.poll() is None:
        svc.proc.send_signal(signal.SIGTERM)
        try:
            svc.proc.wait(10)
        except subprocess.TimeoutExpired:
            svc.proc.kill()


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("users")
    home = tmp / "home"
    home.mkdir()
    (home / "cluster.toml").write_text(
        f'[mounts]\nallowed_roots = ["{tmp}"]\n[users]\nurgent_quota = 100\n' + SMALL_CLUSTER_TOML
    )
    patch = pytest.MonkeyPatch()
    patch.setenv("MA_JUPYTER_HOME", str(home))  # whatever a client looks up stays in this home
    svc = start_service(home)
    try:
        svc.user_token("alice")
        svc.user_token("bob")
        team = Team(
            svc,
            tmp,
            _client(svc, svc.token),
            _client(svc, svc.tokens["alice"]),
            _client(svc, svc.tokens["bob"]),
        )
        # the owner's private blocker fills the node the matrix jobs are pinned to
        blocker = team.admin.submit(
            name="blocker",
            command=f'{PY} -c "import time; time.sleep(600)"',
            specs=["cpu.medium"],
            node_name="tiny",
            access="none",
            grace_period=1,
        )
        wait_for(lambda: blocker.status is JobStatus.running, timeout=60)
        team.blocker = blocker.id  # type: ignore[attr-defined]
        yield team
        _stop_live_jobs(svc)
    finally:
        _stop_service(svc)
        patch.undo()


def _refusal(access: str) -> type[Exception]:
    return NotFound if access == "none" else Forbidden


def _cli_refused(result: subprocess.CompletedProcess, access: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    if access == "none":
        assert "no job" in result.stderr, result.stderr
    else:
        assert "ask its owner" in result.stderr, result.stderr


# ---------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_view(team, access):
    job = team.queued_job(access)
    if "view" in ALLOWED[access]:
        seen = team.bob.get(job.id)
        assert seen.spec.creator == "alice" and seen.spec.env == {"SECRET": "s3cr3t"}
        # the job says what bob may do with it (front ends disable the rest), the owner may do all
        may = {"view", "tensorboard", "duration", "priority", "stop", "delete"}
        assert set(seen.allowed) == may & ALLOWED[access]
        assert "shell" in team.alice.get(job.id).allowed and "shell" not in seen.allowed
        assert set(team.bob.job_page(name=job.spec.name).items[0].allowed) == set(seen.allowed)
        assert "submitted" in team.bob.events(job.id)[0].reason
        assert team.bob.wait_status(job.id, since="running").status is JobStatus.queued
        shown = team.cli("bob", "get", job.id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["spec"]["env"] == {"SECRET": "s3cr3t"}
    else:
        for call in (team.bob.get, team.bob.events, team.bob.log_streams, team.bob.wait_status):
            with pytest.raises(NotFound):
                call(job.id)
        _cli_refused(team.cli("bob", "get", job.id, "--json"), access)
        _cli_refused(team.cli("bob", "events", job.id), access)


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_list(team, access):
    job = team.queued_job(access)
    page = team.bob.job_page(name=job.spec.name)
    listed = json.loads(team.cli("bob", "jobs", "--name", job.spec.name, "--json").stdout)
    everyone = team.bob.job_page(limit=500)
    if "list" in ALLOWED[access]:
        assert [j.id for j in page.items] == [job.id] and page.total == 1
        assert [j["id"] for j in listed["items"]] == [job.id] and listed["total"] == 1
    else:
        assert page.items == [] and page.total == 0  # hidden, and not counted either
        assert listed["items"] == [] and listed["total"] == 0
        assert job.id not in [j.id for j in everyone.items]
    # the total counts exactly what bob may see, over all pages
    assert everyone.total == len(everyone.items)
    assert team.admin.job_page(name=job.spec.name).total == 1  # an admin sees every job


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_clone(team, access):
    job = team.queued_job(access)
    if "clone" in ALLOWED[access]:
        copy = team.bob.clone(job.id, name=f"{job.spec.name}-c1")
        assert copy.info.spec.creator == "bob" and copy.info.spec.command == job.spec.command
        made = team.cli("bob", "clone", job.id, "--json")
        assert made.returncode == 0, made.stderr
        cli_copy = json.loads(made.stdout)
        assert cli_copy["spec"]["creator"] == "bob" and cli_copy["spec"]["env"] == {"SECRET": "s3cr3t"}
        assert cli_copy["spec"]["name"] == clone_name(job.spec.name)
        # options after the job, then a new command after `--`
        renamed = team.cli("bob", "clone", job.id, "--name", "renamed", "--json", "--", "python", "other.py")
        assert renamed.returncode == 0, renamed.stderr
        spec = json.loads(renamed.stdout)["spec"]
        assert spec["name"] == "renamed" and spec["command"] == "python other.py"
    else:
        with pytest.raises(NotFound):
            team.bob.clone(job.id)
        _cli_refused(team.cli("bob", "clone", job.id, "--json"), access)
        assert team.admin.job_page(name=job.spec.name).total == 1  # no copy was made


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_tensorboard(team, access):
    job = team.queued_job(access, outputs=str(writable_dir(team.tmp / f"out-{uuid.uuid4().hex[:6]}")))
    try:
        if "tensorboard" in ALLOWED[access]:
            url = team.bob.tensorboard(job.id)
            assert url.startswith("http://127.0.0.1:") and f"/tb/{job.id}" in url
            shown = team.cli("bob", "tensorboard", job.id)
            assert shown.returncode == 0 and shown.stdout.strip() == url, shown.stderr
            if access == "ro":
                # a ro user reads the board but never stops it: the owner may be reading it
                with pytest.raises(Forbidden, match="stops a job's TensorBoard"):
                    team.bob.stop_tensorboard(job.id)
                _cli_refused(team.cli("bob", "tensorboard", job.id, "--stop"), "ro")
                state = requests.get(
                    f"{team.svc.api}/jobs/{job.id}/tensorboard",
                    headers={"Authorization": f"Bearer {team.svc.tokens['bob']}"},
                    timeout=30,
                ).json()
                assert state["state"] == "running" and state["url"] == url and state["started_by"] == "bob"
                assert team.alice.tensorboard(job.id) == url  # still the same board
            stopped = team.cli("alice" if access == "ro" else "bob", "tensorboard", job.id, "--stop")
            assert stopped.returncode == 0, stopped.stderr
        else:
            with pytest.raises(NotFound):
                team.bob.tensorboard(job.id)
            _cli_refused(team.cli("bob", "tensorboard", job.id), access)
    finally:
        team.admin.stop_tensorboard(job.id)


def test_a_ro_user_starting_boards_is_held_to_a_cap_of_its_own(team):
    """bob may open the boards of alice's ro jobs, each counted against bob's own
    ``[limits] max_tensorboards_per_user`` (4 by default), never against alice's."""
    jobs = [
        team.queued_job("ro", outputs=str(writable_dir(team.tmp / f"out-{uuid.uuid4().hex[:6]}")))
        for _ in range(5)
    ]
    try:
        for job in jobs[:4]:
            assert f"/tb/{job.id}/" in team.bob.tensorboard(job.id)
        with pytest.raises(LimitReached, match="max_tensorboards_per_user is 4"):
            team.bob.tensorboard(jobs[4].id)
        assert f"/tb/{jobs[4].id}/" in team.alice.tensorboard(jobs[4].id)  # the owner is not held back
    finally:
        for job in jobs:
            team.admin.stop_tensorboard(job.id)


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_patch_priority(team, access):
    first, second = team.queued_job(access), team.queued_job(access)
    if "priority" in ALLOWED[access]:
        assert team.bob.update(first.id, priority="urgent").spec.priority.value == "urgent"
        changed = team.cli("bob", "update", second.id, "--priority", "urgent", "--json")
        assert changed.returncode == 0, changed.stderr
        assert json.loads(changed.stdout)["spec"]["priority"] == "urgent"
    else:
        with pytest.raises(_refusal(access)):
            team.bob.update(first.id, priority="urgent")
        _cli_refused(team.cli("bob", "update", second.id, "--priority", "urgent"), access)
        for job in (first, second):
            assert team.admin.get(job.id).spec.priority.value == "normal"


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_patch_duration(team, access):
    first, second = team.queued_job(access), team.queued_job(access)
    if "duration" in ALLOWED[access]:
        assert team.bob.update(first.id, duration="2h").spec.duration == 7200
        changed = team.cli("bob", "update", second.id, "--duration", "3h", "--json")
        assert changed.returncode == 0, changed.stderr
        assert json.loads(changed.stdout)["spec"]["duration"] == 10800
    else:
        with pytest.raises(_refusal(access)):
            team.bob.update(first.id, duration="2h")
        _cli_refused(team.cli("bob", "update", second.id, "--duration", "3h"), access)
        for job in (first, second):
            assert team.admin.get(job.id).spec.duration == job.spec.duration


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_stop(team, access):
    first, second = team.queued_job(access), team.queued_job(access)
    if "stop" in ALLOWED[access]:
        assert team.bob.stop(first.id).status is JobStatus.stopped
        stopped = team.cli("bob", "stop", second.id)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
        assert team.admin.get(second.id).status is JobStatus.stopped
    else:
        with pytest.raises(_refusal(access)):
            team.bob.stop(first.id)
        _cli_refused(team.cli("bob", "stop", second.id), access)
        for job in (first, second):
            assert team.admin.get(job.id).status is JobStatus.queued


@pytest.mark.parametrize("access", ["rw", "ro", "none"])
def test_delete(team, access):
    first, second = team.queued_job(access), team.queued_job(access)
    for job in (first, second):
        team.alice.stop(job.id)  # a finished job: deleting it needs no force
    if "delete" in ALLOWED[access]:
        team.bob.delete(first.id)
        deleted = team.cli("bob", "delete", second.id)
        assert deleted.returncode == 0, deleted.stderr
        for job in (first, second):
            with pytest.raises(NotFound):
                team.admin.get(job.id)
    else:
        with pytest.raises(_refusal(access)):
            team.bob.delete(first.id)
        _cli_refused(team.cli("bob", "delete", second.id), access)
        for job in (first, second):
            assert team.admin.get(job.id).status is JobStatus.stopped


def test_the_creator_and_admins_may_do_everything_with_a_private_job(team):
    for who in (team.alice, team.admin):
        job = team.queued_job("none")
        assert who.get(job.id).id == job.id
        assert who.job_page(name=job.spec.name).total == 1
        assert who.update(job.id, priority="urgent", duration="1h").spec.duration == 3600
        assert who.stop(job.id).status is JobStatus.stopped
        who.delete(job.id)
        with pytest.raises(NotFound):
            team.admin.get(job.id)


def test_a_hidden_job_on_a_node_shows_as_another_users(team):
    bob_view = {n.name: n.usage for n in team.bob.nodes()}
    admin_view = {n.name: n.usage for n in team.admin.nodes()}
    assert any(team.blocker in entry for entry in admin_view["tiny"])
    assert not any(team.blocker in entry for entry in bob_view["tiny"])
    assert "-:(another user's job)" in bob_view["tiny"]


# ------------------------------------------------------------------------ identity and tokens


def test_a_header_naming_a_user_changes_nothing(team):
    """X-MA-User (gone) and X-MA-Forwarded-User without the proxy token are ignored: bob stays bob."""
    private = team.queued_job("none")
    spoofing = team.svc.session(team.svc.tokens["bob"])
    spoofing.headers.update({"X-MA-User": "alice", "X-MA-Forwarded-User": "alice"})
    assert spoofing.get(f"{team.svc.api}/users/me", timeout=10).json()["name"] == "bob"
    assert spoofing.get(f"{team.svc.api}/jobs/{private.id}", timeout=10).status_code == 404
    listed = spoofing.get(f"{team.svc.api}/jobs", params={"name": private.spec.name}, timeout=10).json()
    assert listed["total"] == 0
    assert spoofing.post(f"{team.svc.api}/jobs/{private.id}/stop", timeout=10).status_code == 404
    # a creator in the body is overwritten by the token's user, for a job and for a plan
    body = {"name": "claims-alice", "command": f"{PY} -c pass", "creator": "alice", "node_name": "tiny"}
    made = spoofing.post(f"{team.svc.api}/jobs", json=body, timeout=30)
    assert made.status_code == 201 and made.json()["spec"]["creator"] == "bob"
    plan = spoofing.post(f"{team.svc.api}/plan", json=body, timeout=30)
    assert plan.status_code == 200
    assert team.admin.get(private.id).status is JobStatus.queued


def test_removing_a_user_revokes_its_token_at_once(team):
    token = team.svc.user_token("carol")
    carol = _client(team.svc, token)
    assert carol.whoami().name == "carol"
    assert run_cli(team.svc.home, token, "whoami").stdout.strip() == "carol"
    removed = run_cli(team.svc.home, None, "users", "remove", "carol")
    assert removed.returncode == 0 and "removed user carol" in removed.stdout, removed.stderr
    with pytest.raises(Unauthorized, match="no longer"):
        carol.whoami()
    refused = run_cli(team.svc.home, token, "jobs")
    assert refused.returncode == 2 and "not (or no longer) valid" in refused.stderr
    # a user given a new token: the old one fails, the new one works
    dave = team.admin.add_user("dave")
    new = team.admin.new_token("dave")
    with pytest.raises(Unauthorized):
        _client(team.svc, dave.token).whoami()
    assert _client(team.svc, new.token).whoami().name == "dave"
    team.admin.remove_user("dave")
    with pytest.raises(Unauthorized):
        _client(team.svc, new.token).whoami()


def test_only_admins_manage_users_and_no_listing_shows_a_token(team):
    with pytest.raises(Forbidden, match="only admins"):
        team.bob.users()
    with pytest.raises(Forbidden, match="only admins"):
        team.bob.add_user("eve")
    with pytest.raises(Forbidden, match="only admins"):
        team.bob.remove_user("alice")
    refused = team.cli("bob", "users", "add", "eve")
    assert refused.returncode == 2 and "only admins" in refused.stderr
    assert team.alice.whoami().name == "alice"  # alice is still there
    made = run_cli(team.svc.home, None, "users", "add", "frank", "--admin")
    assert made.returncode == 0, made.stderr
    frank_token = made.stdout.strip()  # stdout is the token alone
    assert _client(team.svc, frank_token).whoami().admin is True
    listed = run_cli(team.svc.home, frank_token, "users", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    users = {u["name"]: u for u in json.loads(listed.stdout)}
    assert users[OWNER]["admin"] and users["frank"]["admin"] and not users["alice"]["admin"]
    assert all(set(u) == {"name", "admin", "created_at"} for u in users.values())
    table = run_cli(team.svc.home, None, "users", "list").stdout
    assert "frank" in table and frank_token not in table and team.svc.tokens["alice"] not in table
    assert team.cli("alice", "users", "add", "alice").returncode == 2  # not an admin
    again = run_cli(team.svc.home, None, "users", "add", "alice")
    assert again.returncode == 2 and "exists already" in again.stderr
    owner = run_cli(team.svc.home, None, "users", "remove", OWNER)
    assert owner.returncode == 2 and "owns the service" in owner.stderr
    bad = run_cli(team.svc.home, None, "users", "add", "no/slash")
    assert bad.returncode == 2 and "not a user name" in bad.stderr


def test_only_admins_choose_very_urgent(team):
    with pytest.raises(Forbidden, match="only admins may choose very-urgent"):
        team.bob.submit(name="vu", command=f"{PY} -c pass", priority="very-urgent", node_name="tiny")
    refused = team.cli(
        "bob", "submit", "--priority", "very-urgent", "--node-name", "tiny", "--", PY, "-c", "pass"
    )
    assert refused.returncode == 2 and "only admins may choose very-urgent" in refused.stderr
    mine = team.bob.submit(name="mine", command=f"{PY} -c pass", node_name="tiny")
    with pytest.raises(Forbidden, match="very-urgent"):
        team.bob.update(mine.id, priority="very-urgent")
    assert team.bob.job_page(name="vu").total == 0  # nothing was created
    assert team.admin.update(mine.id, priority="very-urgent").spec.priority.value == "very-urgent"
    chosen = team.admin.submit(
        name="vu-admin", command=f"{PY} -c pass", priority="very-urgent", node_name="tiny"
    )
    assert chosen.info.spec.priority.value == "very-urgent"


# --------------------------------------------------------------- rules of the admin's cluster.toml


@pytest.mark.small_cluster
def test_the_urgent_cap_refuses_one_more_urgent_job_naming_the_cap(ma_service, ma_home):
    with open(ma_home / "cluster.toml", "a") as fh:
        fh.write("[users]\nurgent_quota = 1\n")
    bob = _client(ma_service, ma_service.user_token("bob"))
    admin = _client(ma_service, ma_service.token)
    blocker = admin.submit(
        name="blocker",
        command=f'{PY} -c "import time; time.sleep(600)"',
        specs=["cpu.medium"],
        node_name="tiny",
        grace_period=1,
    )
    wait_for(lambda: blocker.status is JobStatus.running, timeout=60)
    queued = {"command": f"{PY} -c pass", "node_name": "tiny"}
    session = ma_service.session(ma_service.tokens["bob"])
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = session.post(
        f"{ma_service.api}/jobs", json={"name": "u1", "priority": "urgent", **queued}, headers=key, timeout=30
    )
    assert first.status_code == 201, first.text
    with pytest.raises(
        Forbidden, match=r"bob has 1 urgent job\(s\) running or queued and the cap is 1"
    ) as refused:
        bob.submit(name="u2", priority="urgent", **queued)
    assert "urgent_quota" in refused.value.message and refused.value.field == "priority"
    cli = run_cli(
        ma_home,
        ma_service.tokens["bob"],
        "submit",
        "--priority",
        "urgent",
        "--node-name",
        "tiny",
        "--",
        PY,
        "-c",
        "pass",
    )
    assert cli.returncode == 2 and "the cap is 1" in cli.stderr, cli.stderr
    normal = bob.submit(name="n1", **queued)
    with pytest.raises(Forbidden, match="the cap is 1"):
        bob.update(normal.id, priority="urgent")
    assert bob.job_page(name="u2").total == 0 and normal.refresh().spec.priority.value == "normal"
    # a retried submit (same idempotency key) gets its job, never the cap's refusal
    retried = session.post(
        f"{ma_service.api}/jobs", json={"name": "u1", "priority": "urgent", **queued}, headers=key, timeout=30
    )
    assert retried.status_code == 201 and retried.json()["id"] == first.json()["id"]
    # admins are not capped
    assert admin.update(normal.id, priority="urgent").spec.priority.value == "urgent"
    # the cap counts bob's urgent jobs, whoever raised them: once they end, bob may have another
    with pytest.raises(Forbidden, match="bob has 2 urgent"):
        bob.submit(name="u3", priority="urgent", **queued)
    bob.stop(first.json()["id"])
    bob.stop(normal.id)
    again = bob.submit(name="u3", priority="urgent", **queued)
    assert again.info.spec.priority.value == "urgent"


@pytest.mark.small_cluster
def test_with_sharing_off_new_jobs_are_private(ma_service, ma_home):
    alice = _client(ma_service, ma_service.user_token("alice"))
    bob = _client(ma_service, ma_service.user_token("bob"))
    before = alice.submit(name="before", command=f"{PY} -c pass", access="rw")
    with open(ma_home / "cluster.toml", "a") as fh:
        fh.write("[users]\nsharing = false\n")
    after = alice.submit(name="after", command=f"{PY} -c pass", access="rw")
    assert after.info.spec.access.value == "none"
    with pytest.raises(NotFound):
        bob.get(after.id)
    assert [j.id for j in bob.jobs()] == [before.id]  # a job made before the switch keeps its access
    made = run_cli(
        ma_home, ma_service.tokens["bob"], "submit", "--access", "ro", "--json", "--", PY, "-c", "pass"
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["spec"]["access"] == "none"


# ------------------------------------------------------------------------- the forwarding proxy


def test_a_forwarded_user_is_accepted_only_with_the_proxy_token(ma_service):
    api = ma_service.api
    alice_token = ma_service.user_token("alice")

    def call(token: str, user: str | None, method: str = "GET", path: str = "/users/me", **kw):
        headers = {"Authorization": f"Bearer {token}"}
        if user is not None:
            headers["X-MA-Forwarded-User"] = user
        return requests.request(method, f"{api}{path}", headers=headers, timeout=30, **kw)

    # with the proxy token: the forwarded user, in the hub's namespace, a non-admin on first sight
    me = call(ma_service.proxy_token, "hub-carol")
    assert me.status_code == 200 and me.json()["name"] == "hub:hub-carol" and me.json()["admin"] is False
    made = call(
        ma_service.proxy_token, "hub-carol", "POST", "/jobs", json={"name": "c", "command": f"{PY} -c pass"}
    )
    assert made.status_code == 201 and made.json()["spec"]["creator"] == "hub:hub-carol"
    # forwarded users act as themselves: the job is theirs
    assert call(ma_service.proxy_token, "hub-carol", path=f"/jobs/{made.json()['id']}").status_code == 200
    assert call(ma_service.proxy_token, "hub-carol", path="/users").status_code == 403
    # a hub user named like the owner is not the owner (see test_forwarded_names_never_reach_...)
    assert call(ma_service.proxy_token, OWNER).json() | {"created_at": None} == {
        "name": f"hub:{OWNER}",
        "admin": False,
        "created_at": None,
    }
    # with any other token the header is ignored; without a user the proxy token is refused
    assert call(alice_token, "hub-carol").json()["name"] == "alice"
    assert call(ma_service.token, "hub-carol").json()["name"] == OWNER
    for token, user in (
        (ma_service.proxy_token, None),
        (ma_service.proxy_token, "bad name"),
        ("nope", "hub-carol"),
    ):
        refused = call(token, user)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized", (user, refused.text)
    users = [u["name"] for u in call(ma_service.token, None, path="/users").json()]
    assert "hub:hub-carol" in users and "hub-carol" not in users and "bad name" not in users
    # a forwarded user gets no token (it acts only through the Jupyter server extension)
    token = call(ma_service.token, None, "POST", "/users/hub:hub-carol/token")
    assert token.status_code == 409 and "JupyterHub user" in token.json()["message"]


def test_forwarded_names_never_reach_the_owner_an_admin_or_a_user(ma_service):
    """Hostile hub users name themselves like the owner, an admin and a user of the service: each
    acts as ``hub:<name>``, a non-admin who cannot see, stop or delete their jobs, nor add users,
    drain nodes or give tokens."""
    api = ma_service.api
    admin_token = ma_service.user_token("dana", admin=True)
    erin_token = ma_service.user_token("erin")
    victims = {}
    for name, token in ((OWNER, ma_service.token), ("dana", admin_token), ("erin", erin_token)):
        made = requests.post(
            f"{api}/jobs",
            headers={"Authorization": f"Bearer {token}"},
            json={"name": f"of-{name}", "command": SLEEPER, "access": "none", "grace_period": 1},
            timeout=30,
        )
        assert made.status_code == 201, made.text
        victims[name] = made.json()["id"]

    for name, job in victims.items():
        hub = {"Authorization": f"Bearer {ma_service.proxy_token}", "X-MA-Forwarded-User": name}

        def call(method: str, path: str, hub=hub, **kw) -> requests.Response:
            return requests.request(method, f"{api}{path}", headers=hub, timeout=30, **kw)

        me = call("GET", "/users/me").json()
        assert (me["name"], me["admin"]) == (f"hub:{name}", False)
        assert call("GET", f"/jobs/{job}").status_code == 404, name
        assert job not in [j["id"] for j in call("GET", "/jobs").json()["items"]], name
        assert call("POST", f"/jobs/{job}/stop").status_code == 404, name
        assert call("DELETE", f"/jobs/{job}").status_code == 404, name
        assert call("GET", "/users").status_code == 403, name
        assert call("POST", "/users", json={"name": f"x{uuid.uuid4().hex[:6]}"}).status_code == 403, name
        assert call("POST", f"/users/{name}/token").status_code == 403, name
        assert call("POST", "/nodes/node-0/drain").status_code == 403, name
    # their jobs are untouched (none stopped), and the real owner still sees them all
    owner = {"Authorization": f"Bearer {ma_service.token}"}
    for job in victims.values():
        seen = requests.get(f"{api}/jobs/{job}", headers=owner, timeout=30)
        assert seen.status_code == 200 and seen.json()["status"] in ("queued", "running"), seen.text
        assert requests.post(f"{api}/jobs/{job}/stop", headers=owner, timeout=30).status_code == 200


# ------------------------------------------------------------------------------------- files


def test_tokens_are_stored_hashed_and_the_files_are_private(ma_service, ma_home):
    alice = _client(ma_service, ma_service.user_token("alice"))
    job = alice.submit(
        name="ranked",
        command=f"{PY} -m ma_jupyter.nodeside.rank_log --rank=0 {PY} -c \"print('hello')\"",
    )
    assert job.wait(timeout=60).status is JobStatus.succeeded
    stored = b"".join(p.read_bytes() for p in ma_home.glob("jobs.db*"))
    for token in (ma_service.token, ma_service.proxy_token, ma_service.tokens["alice"]):
        assert token.encode() not in stored
    assert hashlib.sha256(ma_service.tokens["alice"].encode()).hexdigest().encode() in stored

    def mode(path: Path) -> int:
        return path.stat().st_mode & 0o777

    assert mode(ma_home) == 0o700
    assert mode(ma_home / "jobs.db") == 0o600 and mode(ma_home / "service.json") == 0o600
    logs = ma_home / "jobs" / job.id / "logs"
    node_log, rank_log = logs / "worker-0.log", logs / "worker-0" / "rank-0.log"
    assert "[rank 0] hello" in node_log.read_text() and rank_log.read_text() == "hello\n"
    assert mode(node_log) == 0o600
    assert mode(rank_log) & 0o007 == 0  # the job's account and group only


def test_an_older_database_learns_each_jobs_access(tmp_path):
    """A jobs table made before the access column gets it, filled from each job's spec."""
    from sqlalchemy import create_engine, text

    from ma_jupyter.models import JobSpec
    from ma_jupyter.service.store import Store

    path = tmp_path / "jobs.db"
    engine = create_engine(f"sqlite:///{path}")
    hidden = Job(id="hidden-1", spec=JobSpec(name="hidden", command="true", access="none", creator="alice"))
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE jobs (id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, status VARCHAR NOT NULL, "
                "priority INTEGER NOT NULL, creator VARCHAR, created FLOAT NOT NULL, specs VARCHAR NOT NULL, "
                "outputs VARCHAR, desired VARCHAR, placement TEXT, job TEXT NOT NULL)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO jobs VALUES ('hidden-1', 'hidden', 'queued', 0, 'alice', 1.0, 'cpu.small', NULL, NULL, NULL, :job)"
            ),
            {"job": hidden.model_dump_json()},
        )
    engine.dispose()
    store = Store(path)
    assert store.list(viewer="bob") == ([], 0)
    assert [j.id for j in store.list(viewer="alice")[0]] == ["hidden-1"]
    assert path.stat().st_mode & 0o777 == 0o600
