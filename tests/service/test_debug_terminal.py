"""The debug terminal of a running node: a shell inside the node's own sandbox, driven through a
real PTY (the agent's attach client on a pexpect terminal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.nodehost import cgroup
from tests.fixtures.local_backend import log_of, make_attempt, marked, start
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")


def _secret(attempt, node: str = "worker-0") -> str:
    spec = json.loads(attempt.jobdir.node(node).runner_spec.read_text())
    return (spec.get("job_env") or spec["env"])["MA_JOB_SECRET"]


def _agents(job_id: str) -> list:
    """The live shell agents (and the bwrap wrapping them) of one job."""
    return [p for p in marked(job_id) if "ma_jupyter.nodehost.shell_agent" in p.cmdline()]


def _attach(job_id: str, secret: str, runner: int, node: str = "worker-0") -> pexpect.spawn:
    """The attach client, run in the network namespace of the node's runner ``runner`` (where
    the node's abstract socket names are)."""
    return pexpect.spawn(
        "nsenter",
        [f"--net=/proc/{runner}/ns/net", sys.executable]
        + ["-m", "ma_jupyter.nodehost.shell_agent", "--attach", "--job", job_id, "--node", node],
        env={**os.environ, "PYTHONPATH": str(ROOT), "MA_JOB_SECRET": secret},
        timeout=120,
        dimensions=(30, 100),
    )


def test_shell_inside_a_running_node(ma_home, ma_root_jobs, tmp_path):
    host_only = tmp_path / f"host-only-{time.time_ns()}"
    host_only.write_text("the host's own file")
    script = """
        import os, time
        open('left-by-job.txt', 'w').write('x')
        print('job running', flush=True)
        time.sleep(600)
    """
    job_id = f"dbg-{os.getpid()}-{time.time_ns() % 100000}"
    attempt = make_attempt(ma_home, job_id, script, debug_terminal=True)
    backend = LocalBackend(sandbox="bubblewrap")
    runs = start(backend, attempt)
    try:
        wait_for(
            lambda: "job running" in log_of(attempt) and "debug terminal ready" in log_of(attempt),
            timeout=120,
        )
        child = _attach(job_id, _secret(attempt), runs[0].pid)
        child.expect(r"[#$] ")  # the shell's prompt: it reads the terminal now
        child.sendline(
            f"pwd; id -u; ls /workspace; ls; echo JOB-$MA_JOB_ID; "
            f"ls {host_only} 2>/dev/null || echo HOST-FILE-$((1+1))-ABSENT; echo END-$((2+3))"
        )
        child.expect("END-5")  # typed as END-$((2+3)): never matches the echoed command line
        answers = child.before.decode(errors="replace")
        child.sendline("exit 3")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 3  # the shell's exit status is the client's
        assert f"JOB-{job_id}" in answers  # the node's environment
        assert "HOST-FILE-2-ABSENT" in answers  # the sandbox's filesystem, not the host's
        assert "left-by-job.txt" in answers  # the files the job wrote, in its working directory
        assert "\n/workspace/" in answers.replace("\r", "")  # pwd: inside the node's view
        refused = _attach(job_id, "wrong", runs[0].pid)
        refused.expect("refused")
        refused.expect(pexpect.EOF)
        refused.close()
        assert refused.exitstatus == 255
        assert _agents(job_id)  # the agent runs while the node does
    finally:
        backend.stop(attempt, runs, 2.0)
    # the node's end ends its debug terminal: no agent, no shell left
    wait_for(lambda: not _agents(job_id) and not marked(job_id), timeout=60)


def test_no_debug_terminal_without_a_sandbox(ma_home, ma_root_jobs):
    job_id = f"dbg-sym-{os.getpid()}-{time.time_ns() % 100000}"
    attempt = make_attempt(ma_home, job_id, "print('done', flush=True)", debug_terminal=True)
    backend = LocalBackend(sandbox="symlink")
    runs = start(backend, attempt)
    wait_for(lambda: all(backend.poll(attempt, r).state != "running" for r in runs), timeout=120)
    spec = json.loads(attempt.jobdir.node("worker-0").runner_spec.read_text())
    assert spec["shell_agent"] is False
    assert "debug terminal ready" not in log_of(attempt)


# ------------------------------------------------------- through the service: /jobs/{id}/shell

WAITS_FOR_A_SHELL = (
    "import time; open('left-by-job.txt', 'w').write('x'); print('job running', flush=True); time.sleep(600)"
)


def _running_debug_job(client, **fields):
    handle = client.submit(
        name="dbg",
        command=f'{sys.executable} -c "{WAITS_FOR_A_SHELL}"',
        debug_terminal=True,
        grace_period=1,
        **fields,
    )
    wait_for(
        lambda: (
            "job running" in client.read_log(handle.id).data
            and "debug terminal ready" in client.read_log(handle.id).data
        ),
        timeout=120,
    )
    return handle


def test_a_terminal_of_unknown_size_is_24_by_80(ma_module_service):
    """A client that reports 0 rows and 0 columns (no tty, a browser terminal not laid out yet)
    gets a usable terminal, not a refusal or a 1 x 1 one."""
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    handle = _running_debug_job(client)
    session = client.shell(handle.id, rows=0, cols=0, command=["stty", "size"])
    out, code = run_command(session, timeout=60)
    assert code == 0, out
    assert out.split() == ["24", "80"], out
    client.stop(handle.id)


def test_a_command_runs_on_the_nodes_terminal_and_the_opening_is_an_event(ma_module_service):
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    handle = _running_debug_job(client)
    session = client.shell(handle.id, command=["sh", "-c", "echo IN-$MA_JOB_ID; ls; id -u; exit 3"])
    out, code = run_command(session, timeout=60)
    assert code == 3, out
    assert f"IN-{handle.id}" in out  # the node's own environment
    assert "left-by-job.txt" in out  # its working directory, with what the job wrote
    if os.geteuid() == 0:  # root's jobs run as the job account: so does the terminal
        assert "\n0\n" not in f"\n{out}"
    opened = [e for e in client.events(handle.id) if "opened on worker-0" in e.reason]
    assert opened and opened[0].by == "root" if os.geteuid() == 0 else opened, client.events(handle.id)
    client.stop(handle.id)  # the module's service outlives the test


def test_cli_shell_is_a_real_terminal_that_follows_resizes(ma_module_service):
    from ma_jupyter.client import Client

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    handle = _running_debug_job(client)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "ma_jupyter.frontends.cli", "shell", handle.id],
        env={**os.environ, "PYTHONPATH": str(ROOT), "MA_JUPYTER_HOME": str(ma_module_service.home)},
        timeout=120,
        dimensions=(30, 100),
    )
    try:
        child.expect(r"[#$] ")  # the prompt of a shell that reads a terminal
        child.sendline("stty size; tty; echo END-$((2+3))")
        child.expect("END-5")  # typed as END-$((2+3)): never matches the echoed command line
        first = child.before.decode(errors="replace")
        child.setwinsize(40, 120)  # the CLI gets SIGWINCH and passes the new size on
        wait_for(lambda: _size_seen(child, "40 120"), timeout=60)
        child.sendline("exit 4")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "30 100" in first, first
    assert "/dev/pts/" in first  # a real PTY inside the sandbox
    assert child.exitstatus == 4  # the shell's exit status is the CLI's
    # options after the job, then the command after `--`
    ran = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", "shell", handle.id, "--node", "worker-0", "--"]
        + ["sh", "-c", "echo ON-$HOSTNAME; exit 5"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "MA_JUPYTER_HOME": str(ma_module_service.home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 5 and "ON-worker-0" in ran.stdout, ran.stderr
    client.stop(handle.id)  # the module's service outlives the test


def _size_seen(child, size: str) -> bool:
    child.sendline("echo SIZE-$(stty size | tr ' ' x)-END")
    child.expect(r"SIZE-(\d+x\d+)-END")
    return child.match.group(1).decode() == size.replace(" ", "x")


def test_the_terminal_is_refused_clearly(ma_module_service):
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command
    from ma_jupyter.errors import Conflict, Forbidden, NotFound

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    bob = Client(url=ma_module_service.url, token=ma_module_service.user_token("bob"), timeout=30)
    handle = _running_debug_job(client, access="rw")  # others may stop it, never open its shell
    with pytest.raises(Forbidden, match="ask its owner to open a debug terminal on it"):
        run_command(bob.shell(handle.id, command=["true"]), timeout=60)
    with pytest.raises(NotFound, match="no node 'worker-9'"):
        run_command(client.shell(handle.id, "worker-9"), timeout=60)
    plain = client.submit(
        name="plain", command=f'{sys.executable} -c "import time; time.sleep(600)"', grace_period=1
    )
    wait_for(lambda: plain.status.value == "running", timeout=120)
    with pytest.raises(Conflict, match="--debug-terminal"):
        run_command(client.shell(plain.id), timeout=60)
    handle.stop()
    handle.wait(timeout=120)
    with pytest.raises(Conflict, match="a debug terminal is open while the job runs"):
        run_command(client.shell(handle.id), timeout=60)
    assert not [e for e in client.events(handle.id) if e.by == "bob"]  # a refusal changes nothing
    plain.stop()  # the module's service outlives the test


def test_ma_shell_runs_a_command_or_offers_the_terminal(ma_shell):
    from ma_jupyter.frontends.notebook import session
    from ma_jupyter.frontends.notebook.magics import SHELL_MIME
    from tests.magic_shell import Run

    client = session.get_client()
    handle = _running_debug_job(client)
    run = Run(ma_shell, f"%ma_shell {handle.id} -- sh -c 'ls; echo FROM-$MA_JOB_ID; exit 2'")
    assert run.error is None, run.stderr
    assert "left-by-job.txt" in run.stdout and f"FROM-{handle.id}" in run.stdout
    assert "[exit status 2]" in run.stdout
    run = Run(ma_shell, f"%ma_shell {handle.id}")
    assert run.error is None, run.stderr
    offered = [o.data for o in run.outputs if SHELL_MIME in o.data]
    assert offered and offered[0][SHELL_MIME] == {"job": handle.id, "node": "worker-0"}
    assert f"ma-jupyter shell {handle.id} --node worker-0" in offered[0]["text/plain"]
    handle.stop()


def test_a_failed_node_keeps_its_sandbox_for_the_terminal_until_the_job_is_deleted(ma_module_service):
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command
    from ma_jupyter.errors import NotFound
    from tests.fixtures.real_jobs import job_processes

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    fails = "open('state.txt', 'w').write('what the job left'); raise SystemExit(3)"
    handle = client.submit(
        name="dbg-fail", command=f'{sys.executable} -c "{fails}"', debug_terminal=True, grace_period=1
    )
    job = handle.wait(timeout=180, check=False)
    assert job.status.value == "error" and job.exit_code == 3, job.reason
    events = client.events(handle.id)
    kept = [e for e in events if "is kept for the debug terminal until" in e.reason]
    assert kept and kept[0].node == "worker-0", [e.reason for e in client.events(handle.id)]
    # recorded before the end: a client that waited for the end (as above) always finds it
    assert events[-1].reason.startswith("node worker-0 exited with code 3"), [e.reason for e in events]
    assert kept[0].seq < events[-1].seq
    assert f"ma-jupyter shell {handle.id} --node worker-0" in kept[0].reason
    # the default retention is 4 hours: the sandbox is still there, its files with it
    out, code = run_command(client.shell(handle.id, command=["cat", "state.txt"]), timeout=60)
    assert (out.strip(), code) == ("what the job left", 0)
    assert job_processes(handle.id)  # the agent (and its sandbox) run on
    client.delete(handle.id)
    wait_for(lambda: not job_processes(handle.id), timeout=60)  # deleting ends it sooner
    with pytest.raises(NotFound):
        client.get(handle.id)


def test_an_admin_sets_the_retention_and_a_stopped_job_keeps_nothing(ma_home):
    from ma_jupyter.client import Client
    from tests.fixtures.real_jobs import job_processes
    from tests.fixtures.service_process import start_service

    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + "[limits]\ndebug_keep_hours = 0.001\n")  # 3.6 s
    svc = start_service(ma_home)
    try:
        client = Client(url=svc.url, token=svc.token, timeout=30)
        failed = client.submit(
            name="f", command=f'{sys.executable} -c "raise SystemExit(1)"', debug_terminal=True
        ).wait(timeout=180, check=False)
        assert failed.status.value == "error"
        # the event follows the job's end, recorded just after it
        wait_for(
            lambda: any("kept for the debug terminal until" in e.reason for e in client.events(failed.id)),
            timeout=30,
        )
        wait_for(lambda: not job_processes(failed.id), timeout=60)  # its retention ran out
        handle = _running_debug_job(client)
        handle.stop()
        assert handle.wait(timeout=120).status.value == "stopped"
        assert not any("kept" in e.reason for e in client.events(handle.id))
        wait_for(lambda: not job_processes(handle.id), timeout=60)
    finally:
        svc.proc.terminate()
        svc.proc.wait(30)


@pytest.mark.small_cluster
def test_a_process_squatting_the_terminals_name_on_the_host_is_never_reached(ma_service):
    import socket
    import threading

    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command
    from ma_jupyter.nodehost.shell_agent import socket_name

    client = Client(url=ma_service.url, token=ma_service.token, timeout=30)
    sleeper = f'{sys.executable} -c "import time; time.sleep(600)"'
    blocker = client.submit(
        name="blocker", command=sleeper, specs=["cpu.medium"], node_name="tiny", grace_period=1
    )
    wait_for(lambda: blocker.status.value == "running", timeout=120)
    victim = client.submit(
        name="victim",
        command=sleeper,
        specs=["cpu.medium"],
        node_name="tiny",
        debug_terminal=True,
        grace_period=1,
    )
    assert victim.status.value == "queued"
    # another process of the host takes the victim's terminal name before its node starts
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(socket_name(victim.id, "worker-0"))
    squatter.listen(4)
    heard = []

    def listen() -> None:
        try:
            conn, _ = squatter.accept()
        except OSError:
            return  # closed at the test's end: nobody came
        with conn:
            conn.settimeout(20)
            try:
                heard.append(conn.recv(4096))
            except OSError:
                heard.append(b"")

    threading.Thread(target=listen, daemon=True).start()
    try:
        blocker.stop()
        wait_for(lambda: victim.status.value == "running", timeout=120)
        # the node's abstract names are its own network namespace's: the host's squatter holds
        # a name nobody looks up, and the terminal reaches the node's real agent
        output, code = run_command(client.shell(victim.id, command=["echo", "in-the-node"]), timeout=60)
        assert code == 0 and "in-the-node" in output
        assert heard == []  # never reached: no secret
    finally:
        squatter.close()
        victim.stop()


# ------------------------------------------ the terminal is in the node's own namespaces

SCRATCH = (
    "import time; open('/tmp/scratch.txt', 'w').write('scratch of the job'); "
    "open('/dev/shm/shm.txt', 'w').write('shm of the job'); "
    "print('job running', flush=True); time.sleep(600)"
)
LOOK = ["sh", "-c", "cat /tmp/scratch.txt; echo; cat /dev/shm/shm.txt; echo; ps -e -o pid=,args=; hostname"]


def test_the_terminal_joins_the_running_nodes_processes_tmp_and_shm(ma_module_service):
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    handle = client.submit(
        name="dbg-ns", command=f'{sys.executable} -c "{SCRATCH}"', debug_terminal=True, grace_period=1
    )
    try:
        wait_for(
            lambda: (
                "job running" in (log := client.read_log(handle.id).data) and "debug terminal ready" in log
            ),
            timeout=120,
        )
        out, code = run_command(client.shell(handle.id, command=LOOK), timeout=60)
        assert code == 0, out
        lines = out.replace("\r", "").splitlines()
        assert "scratch of the job" in lines and "shm of the job" in lines, out  # its /tmp, /dev/shm
        # its processes: the job's command runs beside the shell, in the same pid namespace
        # (small numbers: the namespace's own), and no process of the host is seen
        job_lines = [
            line
            for line in lines
            if "/tmp/scratch.txt" in line and "ps -e" not in line and "shell_agent" not in line
        ]
        assert job_lines, out
        assert int(job_lines[0].split()[0]) < 100, out
        assert not any("pytest" in line for line in lines), out
        assert lines[-1] == client.get(handle.id).nodes[0].hostname, out  # its hostname
        # never more rights than the job: no capability (as the job's account when root runs it)
        out, code = run_command(
            client.shell(
                handle.id,
                command=["sh", "-c", "id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status"],
            ),
            timeout=60,
        )
        assert code == 0, out
        said = out.replace("\r", "").split("\n")
        assert [line.split()[1] for line in said if line.startswith("Cap")] == ["0000000000000000"] * 2, out
        assert "NoNewPrivs:\t1" in said, out  # no setuid program gives any back
        if os.geteuid() == 0:
            assert said[0] != "0", out
    finally:
        client.stop(handle.id)


def test_a_failed_nodes_terminal_is_in_the_nodes_own_sandbox(ma_module_service, tmp_path):
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command
    from tests.fixtures.real_jobs import job_processes

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    # the job's working folder holds modules named as the agent's own: they shadow nothing of it
    code = tmp_path / "code"
    code.mkdir()
    for name in ("socket", "signal", "subprocess", "threading", "json"):
        (code / f"{name}.py").write_text("raise SystemExit('shadowed by the job')\n")
    fails = "open('scratch.txt', 'w').write('left on disk'); raise SystemExit(5)"
    handle = client.submit(
        name="dbg-ns-fail",
        command=f'{sys.executable} -I -c "{fails}"',
        algorithm=str(code),
        debug_terminal=True,
        grace_period=1,
    )
    job = handle.wait(timeout=180, check=False)
    assert job.status.value == "error" and job.exit_code == 5, job.reason
    out, code = run_command(client.shell(handle.id, command=["cat", "scratch.txt"]), timeout=60)
    assert (out.strip(), code) == ("left on disk", 0)
    where, _ = cgroup.detect()
    mine = f".{handle.id}.0.worker-0"
    if where is not None:  # the terminal's shell is in the node's cgroup, bounded as the node is
        out, code = run_command(client.shell(handle.id, command=["cat", "/proc/self/cgroup"]), timeout=60)
        assert code == 0 and mine in out, out
    client.delete(handle.id)
    wait_for(lambda: not job_processes(handle.id), timeout=60)  # deleting ends the kept sandbox
    if where is not None:  # and the node's cgroup with it
        wait_for(lambda: not [n for n in os.listdir(where["memory"]) if n.endswith(mine)], timeout=30)


def test_a_frozen_runners_stop_reaches_the_command_under_the_terminals_agent(ma_home, ma_root_jobs):
    import signal

    script = """
        import signal, sys, time
        def save(signum, frame):
            print('checkpoint saved', flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, save)
        print('job running', flush=True)
        time.sleep(600)
    """
    job_id = f"dbg-frozen-{os.getpid()}-{time.time_ns() % 100000}"
    attempt = make_attempt(ma_home, job_id, script, debug_terminal=True)
    backend = LocalBackend(sandbox="bubblewrap")
    runs = start(backend, attempt)
    wait_for(
        lambda: "job running" in log_of(attempt) and "debug terminal ready" in log_of(attempt), timeout=120
    )
    os.kill(runs[0].pid, signal.SIGSTOP)  # its runner relays nothing now
    began = time.monotonic()
    backend.stop(attempt, runs, 60.0)
    took = time.monotonic() - began
    log = log_of(attempt)
    assert log.count("checkpoint saved") == 1, log  # the command got the stop, once
    assert "the platform sent SIGTERM to the node's" in log, log
    # the agent ignores the signal (it reports the command's end): once the command has saved,
    # nothing is left to wait for, far from the 60 s grace period
    assert took < 30, took
    wait_for(lambda: not marked(job_id), timeout=60)


def _host_processes_with(token: str) -> list[int]:
    """The host's processes whose command line holds ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found


def test_a_failed_nodes_kept_sandbox_holds_no_process_and_no_memory_of_the_job(ma_module_service):
    """The issue's reproduction: a failed ``--debug-terminal`` job that left a busy loop running
    in the background and a big file in ``/dev/shm``.  The node's resources go back to other jobs
    when it fails, so its kept sandbox must hold nothing of them: the busy loop is ended and
    ``/dev/shm`` emptied before the failure is recorded, the files on disk stay, and the debug
    terminal still opens."""
    from ma_jupyter.client import Client
    from ma_jupyter.client.shell import run_command

    client = Client(url=ma_module_service.url, token=ma_module_service.token, timeout=30)
    tail = f"{os.getpid()}-{time.time_ns()}"
    token = f"busy-{tail}"  # joined in the job: only the busy loop's command line holds it
    fails = (
        "import subprocess, sys; "
        f"subprocess.Popen([sys.executable, '-c', 'while True: pass  # busy' + '-{tail}'], start_new_session=True); "
        "open('/dev/shm/big', 'wb').write(bytes(200 << 20)); "
        "open('left.txt', 'w').write('on disk'); "
        "raise SystemExit(3)"
    )
    handle = client.submit(
        name="dbg-busy", command=f'{sys.executable} -c "{fails}"', debug_terminal=True, grace_period=1
    )
    try:
        job = handle.wait(timeout=180, check=False)
        assert job.status.value == "error" and job.exit_code == 3, job.reason
        wait_for(
            lambda: any("kept for the debug terminal until" in e.reason for e in client.events(handle.id)),
            timeout=60,
        )
        assert _host_processes_with(token) == []  # ended before the failure was recorded
        out, code = run_command(client.shell(handle.id, command=["ls", "-A", "/dev/shm"]), timeout=60)
        assert (out.strip(), code) == ("", 0)
        out, code = run_command(client.shell(handle.id, command=["cat", "left.txt"]), timeout=60)
        assert (out.strip(), code) == ("on disk", 0)
        log = "\n".join(handle.logs())
        assert "process(es) it left were ended" in log and "the files on disk stay" in log, log[-2000:]
    finally:
        client.delete(handle.id)
        wait_for(lambda: not _host_processes_with(token), timeout=60)
