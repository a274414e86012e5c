"""The client against a real, autostarted job service: submit, follow, errors, auth, autostart races."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import requests

from ma_jupyter.client import Client, JobHandle
from ma_jupyter.client.service import pid_alive
from ma_jupyter.errors import (
    BackendUnavailable,
    Conflict,
    Forbidden,
    InvalidSpec,
    JobFailed,
    NotFound,
    Unauthorized,
)
from ma_jupyter.models import JobSpec, JobStatus
from ma_jupyter.untrusted import open_file
from tests.helpers import wait_for, writable_dir

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def py_command(code: str) -> str:
    """A run command executing ``code`` with this interpreter (no shell involved)."""
    return f"{PY} -c {shlex.quote(textwrap.dedent(code))}"


def test_submit_runs_to_success_with_logs(ma_module_client):
    job = ma_module_client.submit(
        name="hello", command=py_command("print('hello from the job')\nprint('second line')")
    )
    assert isinstance(job, JobHandle)
    assert job.name == "hello" and job.id.startswith("hello-")
    assert job.info.status in (JobStatus.queued, JobStatus.running)
    final = job.wait(timeout=60)
    assert final.status is JobStatus.succeeded and final.exit_code == 0
    assert job.status is JobStatus.succeeded
    assert list(job.logs()) == ["hello from the job", "second line"]
    assert repr(job) == f"<JobHandle id={job.id} name=hello status=succeeded>"
    events = job.events()
    assert [e.status for e in events][0] is JobStatus.queued and events[-1].status is JobStatus.succeeded
    assert job.events(after=events[-2].seq) == events[-1:]
    streams = ma_module_client.log_streams(job.id)
    assert streams[0].node == "worker-0" and streams[0].size == len("hello from the job\nsecond line\n")
    chunk = ma_module_client.read_log(job.id, offset=6)
    assert chunk.data.startswith("from the job") and chunk.eof
    # the same job through the listing and by id
    assert [h.id for h in ma_module_client.jobs(name="hell", status="succeeded")] == [job.id]
    assert ma_module_client.jobs(name="hell", status=["queued", "running"]) == []
    assert ma_module_client.job(job.id).info.spec.command == job.info.spec.command
    assert ma_module_client.specs()[0].name == "cpu.small"
    assert ma_module_client.nodes() and all(n.cpus > 0 for n in ma_module_client.nodes())
    job.delete()
    with pytest.raises(NotFound):
        ma_module_client.job(job.id)


@pytest.mark.parametrize("local_logs", [True, False], ids=["file-fast-path", "service-only"])
def test_follow_sees_every_line_exactly_once(ma_module_service, ma_module_client, local_logs, monkeypatch):
    # 2000 lines written in bursts and fragments (lines split across writes and flushes),
    # while the client follows; the log ends without a final newline.
    # the module's client, restored after; its service is this home's, whose files it may read
    monkeypatch.setattr(ma_module_client, "local_logs", local_logs)
    monkeypatch.setenv("MA_JUPYTER_HOME", str(ma_module_service.home))
    assert ma_module_client.reads_local_files() is local_logs
    code = """
        import sys, time
        out = sys.stdout
        for i in range(2000):
            if i % 3 == 0:
                out.write(f"line {i:04d} "); out.flush(); out.write("end\\n")
            else:
                out.write(f"line {i:04d} end\\n")
            if i % 50 == 0:
                out.flush(); time.sleep(0.01)
        out.write("last without newline")
    """
    job = ma_module_client.submit(name="many", command=py_command(code))
    lines = list(job.logs(follow=True))
    assert lines == [f"line {i:04d} end" for i in range(2000)] + ["last without newline"]
    assert job.info.status is JobStatus.succeeded or job.wait(timeout=30).status is JobStatus.succeeded


@pytest.mark.parametrize("local_logs", [True, False], ids=["file-fast-path", "service-only"])
def test_follow_from_an_offset_continues_without_replay(
    ma_module_service, ma_module_client, local_logs, monkeypatch
):
    # ASCII lines, lines with carriage returns and multi-byte characters: offsets are bytes
    code = """
        import sys, time
        for i in range(40):
            text = f"tick {i}" + (" \u00e9t\u00e9 \u2713" if i % 3 == 0 else "") + ("\\r" if i % 4 == 0 else "")
            sys.stdout.buffer.write(text.encode() + b"\\n"); sys.stdout.flush()
            time.sleep(0.01)
    """
    expected = [f"tick {i}" + (" \u00e9t\u00e9 \u2713" if i % 3 == 0 else "") for i in range(40)]
    # the module's client, restored after; its service is this home's, whose files it may read
    monkeypatch.setattr(ma_module_client, "local_logs", local_logs)
    monkeypatch.setenv("MA_JUPYTER_HOME", str(ma_module_service.home))
    assert ma_module_client.reads_local_files() is local_logs
    job = ma_module_client.submit(name="ticks", command=py_command(code))
    first = job.logs(follow=True)
    assert first.offset == 0
    seen = [next(first) for _ in range(10)]
    assert seen == expected[:10]
    assert first.offset == len("".join(expected[:10]).encode()) + 10 + 3  # newlines and 3 CRs
    first.close()
    # a second reader (a re-attached kernel) continues where the first one stopped
    second = job.logs(follow=True, offset=first.offset)
    assert list(second) == expected[10:]
    assert first.node == second.node == "worker-0"
    assert second.offset == ma_module_client.log_streams(job.id)[0].size


def test_a_follower_reads_the_file_the_service_describes_from_each_offset(
    ma_module_service, ma_module_client, monkeypatch
):
    monkeypatch.setenv("MA_JUPYTER_HOME", str(ma_module_service.home))  # the files of this home's service
    # about 3 MB of log: through the service alone that takes 3 answers of at most 1 MB
    code = """
        import sys
        for i in range(60000):
            sys.stdout.write(f"{i:08d} " + "x" * 41 + "\\n")
    """
    expected = [f"{i:08d} " + "x" * 41 for i in range(60000)]
    job = ma_module_client.submit(name="big", command=py_command(code))
    assert job.wait(timeout=60).status is JobStatus.succeeded
    [stream] = ma_module_client.log_streams(job.id)
    # only the backend knows where the log lives: the service's description says it, and the
    # file there holds the bytes the service's reads answer
    assert stream.size == 60000 * 51 and stream.file is not None
    assert ma_module_client.local_log_file(job.id, "worker-0") == stream.file
    with os.fdopen(open_file(Path(stream.file.root), stream.file.path), "rb") as fh:
        assert fh.read(1000).decode() == ma_module_client.read_log(job.id, limit=1000).data
    asked: list[int] = []
    through_service = ma_module_client.read_log

    def counted(*args, **kwargs):
        asked.append(kwargs["offset"])
        return through_service(*args, **kwargs)

    monkeypatch.setattr(ma_module_client, "read_log", counted)
    listed: list[str] = []
    listing = ma_module_client.log_streams
    monkeypatch.setattr(
        ma_module_client, "log_streams", lambda job_id: listed.append(job_id) or listing(job_id)
    )
    first_read = ma_module_client.read_log(job.id, offset=0, limit=10)
    assert first_read.file == stream.file  # a first read says where
    asked.clear()
    reader = job.logs(follow=True)
    assert list(reader) == expected and reader.offset == stream.size
    # the service answered the first read (it names the node, and where the file is: no request
    # apart for it) and the last (the end of the job's log); every byte between came from the
    # file, each read from where the last stopped
    assert asked == [0, stream.size] and listed == []
    assert ma_module_client.read_log(job.id, offset=10, limit=10).file is None  # only the first read
    asked.clear()
    monkeypatch.setattr(ma_module_client, "local_logs", False)
    assert list(job.logs(follow=True)) == expected
    assert asked == [0, 1 << 20, 2 << 20]  # answers of 1 MB, the last with the end


def test_wait_times_out_and_stop_ends_the_job(ma_module_client):
    job = ma_module_client.submit(
        name="sleeper", command=py_command("import time\nprint('up', flush=True)\ntime.sleep(300)")
    )
    wait_for(lambda: job.status is JobStatus.running, timeout=30)
    with pytest.raises(TimeoutError, match="still running"):
        job.wait(timeout=0.3)
    with pytest.raises(Conflict, match="stop it first"):
        job.delete()
    job.stop()
    assert job.wait(timeout=30).status is JobStatus.stopped
    assert job.info.finished_at is not None
    job.delete()


def test_failure_is_reported_with_exit_code(ma_module_client):
    job = ma_module_client.submit(name="fails", command=py_command("import sys\nprint('boom')\nsys.exit(3)"))
    final = job.wait(timeout=60, check=False)
    assert final.status is JobStatus.error and final.exit_code == 3
    assert list(job.logs()) == ["boom"]


def test_wait_raises_when_the_job_fails(ma_client):
    """A script that waits for its job and goes on fails with it, as ``estimator.fit()`` does:
    the error names the job, its status and reason, and carries the ended job."""
    job = ma_client.submit(name="fails", command=py_command("import sys\nsys.exit(3)"))
    with pytest.raises(
        JobFailed, match=rf"job {job.id} \(fails\) ended error: .*exited with code 3"
    ) as failed:
        job.wait(timeout=60)
    assert failed.value.job.status is JobStatus.error and failed.value.job.exit_code == 3
    # a pasted script ends with a traceback and a failing exit status, not 0
    script = f"from ma_jupyter import Client\nClient().job({job.id!r}).wait(timeout=60)\n"
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 1 and "JobFailed" in ran.stderr, ran.stderr
    # a stopped job is what someone asked for: it returns
    # (a stop in the node's first instants may find no handler yet: it then waits out the grace)
    sleeper = ma_client.submit(
        name="sleeper", command=py_command("import time\ntime.sleep(600)"), grace_period=1
    )
    sleeper.stop()
    assert sleeper.wait(timeout=60).status is JobStatus.stopped


def test_errors_are_typed_and_say_what_to_do(ma_module_client):
    # local validation: instant, the same message the service would give
    with pytest.raises(InvalidSpec, match="bash -c") as local:
        ma_module_client.submit(name="typed-bad", command="KEY=VALUE python train.py")
    server = requests.post(
        f"{ma_module_client.url}/api/v1/jobs",
        json={"name": "typed-bad", "command": "KEY=VALUE python train.py"},
        headers={"Authorization": f"Bearer {ma_module_client._token}"},
        timeout=10,
    )
    assert server.status_code == 400 and server.json()["message"] == local.value.message
    with pytest.raises(InvalidSpec, match="exclude each other"):
        ma_module_client.submit(
            {"name": "typed-x", "command": "python x.py"}, fault_restart={}, checkpoint_resume={}
        )
    with pytest.raises(InvalidSpec, match="unknown field"):
        ma_module_client.submit(name="typed-x", command="python x.py", epochs=3)
    # checks only the service can make come back as the same typed error
    with pytest.raises(InvalidSpec, match="unknown spec 'nope'") as remote:
        ma_module_client.submit(name="typed-x", command="python x.py", specs=["nope"])
    assert remote.value.field == "specs"
    with pytest.raises(NotFound, match="no job"):
        ma_module_client.job("no-such-job")
    with pytest.raises(NotFound):
        ma_module_client.read_log("no-such-job")
    with pytest.raises(InvalidSpec, match="priority"):
        ma_module_client.update("no-such-job")
    assert ma_module_client.jobs(name="typed-") == []  # the module's service is shared: this test's names


def test_plan_resolves_nodes_and_creates_nothing(ma_module_client):
    spec = JobSpec(name="planned", command="python train.py --lr ${LR}", env={"LR": "0.1"})
    plan = ma_module_client.plan(spec)
    assert [n.name for n in plan.nodes] == ["worker-0"]
    assert plan.nodes[0].argv[:2] == ["python", "train.py"]
    assert plan.nodes[0].env["LR"] == "0.1"
    assert ma_module_client.jobs(name="planned") == []


def test_unauthenticated_requests_get_401(ma_client):
    url = ma_client.url
    assert requests.get(f"{url}/api/v1/jobs", timeout=5).status_code == 401
    wrong = Client(url, token="not-the-token")
    with pytest.raises(Unauthorized, match="token"):
        wrong.jobs()
    right = Client(url)  # the token comes from the runtime file of this home
    assert right.jobs() == []


def test_runtime_file_is_private_and_service_status(ma_client, ma_home):
    assert not ma_client.service_status()["running"]
    ma_client.connect()
    status = ma_client.service_status()
    assert (
        status["running"] and status["url"].startswith("http://127.0.0.1:") and status["home"] == str(ma_home)
    )
    assert (ma_home / "service.json").stat().st_mode & 0o777 == 0o600
    assert Client(autostart=False).service_status()["pid"] == status["pid"]


def test_no_autostart_means_a_clear_error(ma_home):
    with pytest.raises(BackendUnavailable, match="ma-jupyter service start"):
        Client(autostart=False).jobs()


def test_a_restarted_service_is_found_again(ma_client):
    job = ma_client.submit(name="before", command=py_command("print(1)"))
    job.wait(timeout=60)
    old_pid = ma_client.service_status()["pid"]
    assert ma_client.shutdown_service()
    assert not pid_alive(old_pid)
    # the next call starts a new service (new port, new token) and the job is still there
    assert job.refresh().status is JobStatus.succeeded
    assert ma_client.service_status()["pid"] != old_pid


def test_concurrent_clients_autostart_one_service(ma_home, tmp_path):
    # Two "kernels" (separate processes, elsewhere than the source tree and without PYTHONPATH,
    # so the service they start must find the package by itself) and two threads here start at once.
    script = (
        f"import sys; sys.path.insert(0, {REPO!r})\n"
        "from ma_jupyter.client import Client; c = Client(); c.connect(); print(c.pid)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MA_JUPYTER_HOME"] = str(ma_home)
    procs = [
        subprocess.Popen(
            [PY, "-c", script],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    pids: list[int] = []
    errors: list[Exception] = []

    def connect():
        try:
            c = Client()
            c.connect()
            pids.append(c.pid)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=connect) for _ in range(2)]
    for t in threads:
        t.start()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        pids.append(int(out.strip()))
    for t in threads:
        t.join(60)
    assert not errors
    assert len(set(pids)) == 1, pids
    log = (ma_home / "service.log").read_text()
    # every service start that lost the race would say so in the log; none may have run
    assert pid_alive(pids[0])
    assert log.count("already runs") == 0, log
    client = Client(autostart=False)
    assert client.shutdown_service()
    assert not pid_alive(pids[0])


@pytest.mark.small_cluster
def test_update_priority_of_a_queued_job(ma_client):
    # a cpu.medium job fills the node "tiny", so the next job pinned there queues
    sleep = py_command("import time\ntime.sleep(300)")
    blocker = ma_client.submit(
        name="blocker", command=sleep, specs=["cpu.medium"], node_name="tiny", grace_period=1
    )
    wait_for(lambda: blocker.status is JobStatus.running, timeout=30)
    queued = ma_client.submit(name="waiting", command=py_command("print(1)"), node_name="tiny")
    assert queued.status is JobStatus.queued and queued.info.queue_position == 0
    updated = ma_client.update(queued.id, priority="urgent")
    assert updated.spec.priority.value == "urgent"
    with pytest.raises(Conflict):
        ma_client.update(blocker.id, priority="urgent")
    assert ma_client.update(blocker.id, duration="1h").spec.duration == 3600
    assert queued.stop().status is JobStatus.stopped
    blocker.stop()
    assert blocker.wait(timeout=30).status is JobStatus.stopped


def test_relative_host_paths_mean_the_callers_directory(ma_module_client, tmp_path, monkeypatch):
    writable_dir(tmp_path / "out")
    monkeypatch.chdir(tmp_path)
    job = ma_module_client.submit(
        name="writes",
        outputs="out",
        command=py_command("open('/workspace/outputs/done.txt', 'w').write('ok')"),
    )
    assert job.info.spec.outputs == str(tmp_path / "out")
    assert job.wait(timeout=60).status is JobStatus.succeeded
    assert (tmp_path / "out" / "done.txt").read_text() == "ok"


def test_other_users_are_held_back_by_the_jobs_access(ma_client):
    private = ma_client.submit(name="mine", access="none", command=py_command("print(1)"))
    shared = ma_client.submit(name="shared", access="ro", command=py_command("print(2)"))
    other = Client(token=ma_client.add_user("someone-else").token)
    with pytest.raises(NotFound):  # a job others may not see does not exist for them
        other.job(private.id)
    assert [h.id for h in other.jobs()] == [shared.id]  # hidden from the listing too
    assert other.job(shared.id).wait(timeout=60).status is JobStatus.succeeded
    assert list(other.job(shared.id).logs()) == ["2"]
    with pytest.raises(Forbidden, match="ask its owner to stop"):
        other.stop(shared.id)


def test_a_name_means_my_newest_job_of_that_name(ma_module_client, capsys):
    """Running a notebook twice leaves two jobs of one name: the name means the newer one, and
    a note says which id was meant; an id still means its job."""
    from ma_jupyter.client.resolve import resolve_job

    first = ma_module_client.submit(name="twin", command=py_command("print(1)"))
    second = ma_module_client.submit(name="twin", command=py_command("print(2)"))
    single = ma_module_client.submit(name="single", command=py_command("print(3)"))
    assert resolve_job(ma_module_client, first.id).id == first.id
    assert capsys.readouterr().err == ""
    assert resolve_job(ma_module_client, "single").id == single.id
    assert capsys.readouterr().err == ""  # one job of the name: nothing to say
    assert resolve_job(ma_module_client, "twin").id == second.id
    note = capsys.readouterr().err
    assert f"your newest job of that name, {second.id}" in note and "1 older" in note
    assert ma_module_client.get("twin").id == second.id  # Client.get takes what the CLI takes
    assert ma_module_client.job("single").id == single.id
    with pytest.raises(NotFound, match="see `%ma_jobs`"):
        resolve_job(ma_module_client, "nobody", hint="`%ma_jobs`")
    with pytest.raises(NotFound, match="no job has the id or name 'nobody'"):
        ma_module_client.get("nobody")
    for handle in (first, second, single):
        handle.wait(timeout=60, check=False)


def test_other_users_jobs_never_make_my_name_ambiguous(ma_client):
    from ma_jupyter.client.resolve import resolve_job

    other = Client(token=ma_client.add_user("someone-else").token)
    theirs = other.submit(name="hello", command=py_command("print('theirs')"))
    # one job of the name, another user's: the name means it (`clone hello` of a shared job)
    assert resolve_job(ma_client, "hello").id == theirs.id
    mine = ma_client.submit(name="hello", command=py_command("print('mine')"))
    assert resolve_job(ma_client, "hello").id == mine.id
    assert resolve_job(other, "hello").id == theirs.id  # and theirs for them
    assert ma_client.get("hello").id == mine.id
    # two of theirs and none of mine: which one is theirs to pick, by id
    again = other.submit(name="shared", command=py_command("print(1)"))
    older = other.submit(name="shared", command=py_command("print(2)"))
    with pytest.raises(InvalidSpec) as info:
        resolve_job(ma_client, "shared")
    assert "2 jobs of other users are called 'shared'" in info.value.message
    assert info.value.message.index(older.id) < info.value.message.index(again.id)  # newest first
    for handle in (theirs, mine, again, older):
        handle.wait(timeout=60, check=False)
