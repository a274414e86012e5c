"""The runtime helpers of the modes, as real processes: rank log splitter, rsh agent, Ascend launcher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ma_jupyter.nodeside import rank_table

from ..helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_tmpdir(tmp_path, monkeypatch):
    """The helpers run here on the host, not in a node's sandbox: their temporary files (torch
    elastic's ``torchelastic_*`` folders) go under the test's folder, not the machine's /tmp."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def _env(**extra) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


def _module(name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", name, *args], capture_output=True, timeout=60, **kwargs)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------ rank_log


def test_rank_log_writes_the_rank_file_prefixes_the_node_log_and_keeps_the_exit_code(tmp_path):
    code = "import sys; print('out line'); print('err line', file=sys.stderr); sys.exit(3)"
    result = _module(
        "ma_jupyter.nodeside.rank_log",
        "--rank-var=MY_RANK",
        "python",
        "-c",
        code,
        env=_env(MA_RANK_LOG_DIR=str(tmp_path), MY_RANK="5"),
    )
    assert result.returncode == 3
    assert (tmp_path / "rank-5.log").read_text().splitlines() == ["out line", "err line"]
    assert result.stdout.decode().splitlines() == ["[rank 5] out line", "[rank 5] err line"]
    # the node's first failed rank is reported for the job's error event; later ones do not replace it
    assert json.loads((tmp_path / "failure.json").read_text()) == {"rank": 5, "exit_code": 3}
    _module("ma_jupyter.nodeside.rank_log", "--rank=6", "false", env=_env(MA_RANK_LOG_DIR=str(tmp_path)))
    assert json.loads((tmp_path / "failure.json").read_text()) == {"rank": 5, "exit_code": 3}


def test_rank_log_without_a_log_dir_just_runs_the_command(tmp_path):
    env = _env(RANK="1")
    env.pop("MA_RANK_LOG_DIR", None)
    result = _module("ma_jupyter.nodeside.rank_log", "python", "-c", "print('plain')", env=env)
    assert result.returncode == 0
    assert result.stdout.decode() == "plain\n"
    assert not list(tmp_path.iterdir())


def test_rank_log_forwards_sigterm_and_reports_the_signal(tmp_path):
    ready = tmp_path / "ready"
    code = f"import time, pathlib; pathlib.Path({str(ready)!r}).write_text('x'); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ma_jupyter.nodeside.rank_log", "--rank=0", "python", "-c", code],
        env=_env(MA_RANK_LOG_DIR=str(tmp_path)),
    )
    wait_for(ready.exists, timeout=20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    # stopped from outside: not a failure of this rank
    assert not (tmp_path / "failure.json").exists()


def _running_with(argument: str) -> list[int]:
    """Pids of the live processes with ``argument`` on their command line."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and argument.encode() in Path(f"/proc/{entry}/cmdline").read_bytes().split(
                b"\0"
            ):
                found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.06, 0.1])
def test_rank_log_stopped_while_it_starts_ends_with_its_rank(tmp_path, delay):
    """A TERM at any moment of the splitter's start (before the rank exists, while it is being
    spawned, once it runs) ends the splitter and leaves no rank behind: killed by the TERM
    itself before it handles signals (the rank does not exist yet), else with the rank's
    128+15."""
    tag = f"{uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 10**6}"  # a sleep length no one else uses
    proc = subprocess.Popen(
        [sys.executable, "-m", "ma_jupyter.nodeside.rank_log", "--rank=0", "sleep", tag],
        env=_env(MA_RANK_LOG_DIR=str(tmp_path)),
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) in (-signal.SIGTERM, 128 + signal.SIGTERM)
    wait_for(lambda: not _running_with(tag), timeout=20)


# Two ranks that share one node log: rank 0 prints half a line, rank 1 prints a whole line while
# rank 0's line is unfinished, then rank 0 ends its line.  Each step waits for the previous one
# to reach the rank's own file (which gets every byte at once).
RANK_STEPS = """
import os, pathlib, sys, time
rank = int(sys.argv[1])
folder = pathlib.Path(os.environ["MA_RANK_LOG_DIR"])
def wait(name, text):
    while text not in (folder / name).read_text() if (folder / name).exists() else True:
        time.sleep(0.005)
for step in range(20):
    if rank == 0:
        sys.stdout.write(f"r0-{step}-start "); sys.stdout.flush()
        wait("rank-1.log", f"r1-{step}-whole")
        sys.stdout.write(f"r0-{step}-end\\n"); sys.stdout.flush()
    else:
        wait("rank-0.log", f"r0-{step}-start")
        sys.stdout.write(f"r1-{step}-whole\\n"); sys.stdout.flush()
"""


def _two_ranks(tmp_path, code: str, **env: str) -> str:
    """Run ranks 0 and 1 of ``code`` (argv[1] is the rank) through rank_log into one node log."""
    script = tmp_path / "rank.py"
    script.write_text(code)
    logs = tmp_path / "logs"
    logs.mkdir()
    node_log = tmp_path / "node.log"
    with open(node_log, "ab") as out:  # as the backend opens it: appended to by every rank
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ma_jupyter.nodeside.rank_log",
                    f"--rank={r}",
                    "python",
                    str(script),
                    str(r),
                ],
                env=_env(MA_RANK_LOG_DIR=str(logs), **env),
                stdout=out,
            )
            for r in (0, 1)
        ]
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
    return node_log.read_bytes().decode()  # bytes: read_text would turn each \r into \n


def test_two_ranks_printing_half_lines_never_share_a_line_of_the_node_log(tmp_path):
    text = _two_ranks(tmp_path, RANK_STEPS)
    assert text.endswith("\n")
    rank0, rank1 = [], []
    for line in text.splitlines():
        # every line is one rank's, and holds only that rank's words
        assert line.startswith(("[rank 0] ", "[rank 1] ")), line
        words = line[len("[rank 0] ") :].split()
        assert all(w.startswith(f"r{line[6]}-") for w in words), line
        (rank0 if line[6] == "0" else rank1).extend(words)
    assert rank1 == [f"r1-{s}-whole" for s in range(20)]
    # rank 0's words all arrive, in order (a line held past HOLD may have been sent in two parts)
    assert rank0 == [w for s in range(20) for w in (f"r0-{s}-start", f"r0-{s}-end")]
    # the rank files keep exactly what each rank wrote
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "".join(
        f"r0-{s}-start r0-{s}-end\n" for s in range(20)
    )


def test_an_unfinished_line_goes_out_alone_after_a_while_and_a_progress_bar_keeps_its_label(tmp_path):
    code = """
import os, pathlib, sys, time
if sys.argv[1] == "1":
    sys.exit(0)
node_log = pathlib.Path(os.environ["NODE_LOG"])
sys.stdout.write("waiting for data"); sys.stdout.flush()
while "waiting for data" not in node_log.read_text():  # held back, then sent on its own
    time.sleep(0.01)
sys.stdout.write(" done\\n\\r 10%|#   |\\r 100%|####|\\r\\n")
sys.stdout.write("no newline at the end")
"""
    text = _two_ranks(tmp_path, code, NODE_LOG=str(tmp_path / "node.log"))
    assert text == (
        "[rank 0] waiting for data\n"
        "[rank 0]  done\n"
        "[rank 0] \r[rank 0]  10%|#   |\r[rank 0]  100%|####|\r\n"
        "[rank 0] no newline at the end\n"
    )
    assert (tmp_path / "logs" / "rank-0.log").read_bytes().decode() == (
        "waiting for data done\n\r 10%|#   |\r 100%|####|\r\nno newline at the end"
    )


def test_a_progress_bar_is_one_line_of_the_node_log_however_long_it_is_redrawn(tmp_path):
    """Rule 4 of the Copier: states redrawn with \\r are never cut into a line each at the hold
    (here none: a plain unfinished line would go out at once); the rank file has each state as
    it comes, for the live followers."""
    from ma_jupyter.nodeside.rank_log import Copier

    read_end, write_end = os.pipe()
    node_read, node_write = os.pipe()
    rank_path = tmp_path / "rank-0.log"
    with open(rank_path, "ab") as rank_file:
        copier = Copier(read_end, rank_file, b"[rank 0] ", out=node_write, hold=0.0)
        thread = threading.Thread(target=copier.run, daemon=True)
        thread.start()
        for i in range(1, 4):
            os.write(write_end, f"\rstep {i}/3".encode())
            wait_for(lambda i=i: f"step {i}/3" in rank_path.read_text(), timeout=30)
        os.write(write_end, b" done\n")
        os.close(write_end)
        thread.join(timeout=30)
        copier.finish()
    os.close(node_write)
    with os.fdopen(node_read, "rb") as node_log:
        text = node_log.read().decode()
    os.close(read_end)
    assert text == "[rank 0] \r[rank 0] step 1/3\r[rank 0] step 2/3\r[rank 0] step 3/3 done\n"
    assert rank_path.read_bytes().decode() == "\rstep 1/3\rstep 2/3\rstep 3/3 done\n"


# ------------------------------------------------------------------------------ rsh_agent


SECRET = "attempt-secret"  # what the backend gives every node of one attempt


@pytest.fixture
def ma_rsh_server(tmp_path):
    """An agent server for a fresh job id, as a waiting node runs it; stopped afterwards."""
    job = f"test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ma_jupyter.nodehost.rsh_agent",
            "--serve",
            "--job",
            job,
            "--host",
            "worker-1",
        ],
        env=_env(NODE_MARK="on-worker-1", MA_JOB_SECRET=SECRET),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
    )
    yield job, proc
    proc.terminate()
    proc.wait(timeout=10)


def test_rsh_agent_runs_the_command_on_the_named_node_and_returns_its_status(ma_rsh_server):
    job, _server = ma_rsh_server
    # ssh options before the host are skipped, the command words are joined like ssh does
    result = _module(
        "ma_jupyter.nodehost.rsh_agent",
        "-x",
        "-p",
        "22",
        "worker-1",
        'echo "$NODE_MARK"; echo oops >&2; exit 7',
        env=_env(MA_JOB_ID=job, MA_JOB_SECRET=SECRET),
    )
    assert result.returncode == 7
    assert result.stdout.decode() == "on-worker-1\n"
    assert result.stderr.decode() == "oops\n"


def test_rsh_agent_refuses_a_caller_without_the_jobs_secret(ma_rsh_server, tmp_path):
    job, _server = ma_rsh_server
    marker = tmp_path / "ran"
    for secret in ("wrong", ""):
        result = _module(
            "ma_jupyter.nodehost.rsh_agent",
            "worker-1",
            f"touch {marker}",
            env=_env(MA_JOB_ID=job, MA_JOB_SECRET=secret),
        )
        assert result.returncode == 255
        assert b"not a node of this job" in result.stderr
    assert not marker.exists()


def test_rsh_agent_runs_commands_for_its_own_node_in_place():
    result = _module(
        "ma_jupyter.nodehost.rsh_agent",
        "worker-0",
        "echo",
        "here",
        env=_env(MA_JOB_ID="none", HOSTNAME="worker-0"),
    )
    assert result.returncode == 0
    assert result.stdout.decode() == "here\n"


def test_rsh_agent_waits_for_a_node_that_is_not_up_yet(tmp_path):
    job = f"test-{uuid.uuid4().hex[:8]}"
    agent = subprocess.Popen(
        [sys.executable, "-m", "ma_jupyter.nodehost.rsh_agent", "worker-2", "echo", "late"],
        env=_env(MA_JOB_ID=job, MA_JOB_SECRET=SECRET),
        stdout=subprocess.PIPE,
    )
    time.sleep(0.5)  # the agent must be retrying by now
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ma_jupyter.nodehost.rsh_agent",
            "--serve",
            "--job",
            job,
            "--host",
            "worker-2",
        ],
        env=_env(MA_JOB_SECRET=SECRET),
        stdout=subprocess.DEVNULL,
    )
    try:
        out, _ = agent.communicate(timeout=30)
        assert agent.returncode == 0
        assert out.decode() == "late\n"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_rsh_agent_gives_up_on_a_node_that_never_comes(tmp_path):
    result = _module(
        "ma_jupyter.nodehost.rsh_agent",
        "nowhere",
        "true",
        env=_env(MA_JOB_ID=f"test-{uuid.uuid4().hex[:8]}", MA_RSH_CONNECT_TIMEOUT="0.5"),
    )
    assert result.returncode == 255
    assert b"did not come up" in result.stderr


def test_killing_the_agent_kills_the_remote_command(ma_rsh_server, tmp_path):
    job, _server = ma_rsh_server
    pid_file = tmp_path / "remote.pid"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ma_jupyter.nodehost.rsh_agent",
            "worker-1",
            f"echo $$ > {pid_file}; exec sleep 60",
        ],
        env=_env(MA_JOB_ID=job, MA_JOB_SECRET=SECRET),
    )
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=20))
    agent.kill()
    agent.wait(timeout=10)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), timeout=10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# -------------------------------------------------------------------------- ascend_launch

BOOT = """
import json, os, sys, time
from ma_jupyter.nodeside import rank_table
if os.environ.get("FAIL_RANK") == os.environ["RANK_ID"]:
    sys.exit(4)
table = rank_table.wait_completed(os.environ["RANK_TABLE_FILE"], timeout=float(os.environ.get("TABLE_WAIT", "30")))
names = ("ASCEND_DEVICE_ID", "DEVICE_ID", "RANK_ID", "RANK_SIZE")
print(json.dumps({k: os.environ[k] for k in names}), table["status"])
"""


def _table_dir(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    table = rank_table.template2("job", [{"devices": [], "pod_name": "p", "server_id": "127.0.0.1"}])
    (folder / rank_table.FILE_NAME).write_text(json.dumps(table))
    return folder


def _launch(
    tmp_path: Path, node: str, listen: int, peer: int, first_rank: int, *options: str, **env
) -> subprocess.Popen:
    boot = tmp_path / "boot.py"
    boot.write_text(BOOT)
    logs = tmp_path / f"logs-{node}"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ma_jupyter.nodeside.ascend_launch",
            "--slots=2",
            f"--first-rank={first_rank}",
            "--rank-size=4",
            f"--listen=127.0.0.1:{listen}",
            f"--peers=127.0.0.1:{peer}",
            *options,
            "--",
            "python",
            str(boot),
        ],
        env=_env(RANK_TABLE_FILE=str(_table_dir(tmp_path, node)), MA_RANK_LOG_DIR=str(logs), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the launcher's own errors (its barrier thread's) show in a failure
    )


def test_ascend_launcher_runs_the_boot_file_once_per_card_and_completes_the_table(tmp_path):
    port_a, port_b = _free_port(), _free_port()
    node_a = _launch(tmp_path, "a", port_a, port_b, 0)
    time.sleep(0.5)  # node b comes later: the boot files of node a wait for the table meanwhile
    node_b = _launch(tmp_path, "b", port_b, port_a, 2)
    out_a, _ = node_a.communicate(timeout=60)
    out_b, _ = node_b.communicate(timeout=60)
    # decoded: a failure shows each rank's traceback line by line
    assert node_a.returncode == 0 and node_b.returncode == 0, (out_a + out_b).decode(errors="replace")
    for node, ranks in (("b", (2, 3)), ("a", (0, 1))):
        for local, rank in enumerate(ranks):
            line = (tmp_path / f"logs-{node}" / f"rank-{rank}.log").read_text().strip()
            env, status = line.rsplit(" ", 1)
            card = str(local)
            assert json.loads(env) == {
                "ASCEND_DEVICE_ID": card,
                "DEVICE_ID": card,
                "RANK_ID": str(rank),
                "RANK_SIZE": "4",
            }
            assert status == "completed"
        assert json.loads((tmp_path / node / rank_table.FILE_NAME).read_text())["status"] == "completed"
    assert "[rank 1] " in out_a.decode() and "[rank 3] " in out_b.decode()


def test_a_node_completes_its_table_only_once_every_peer_has_reached_it(tmp_path):
    # The peer here only listens: it hears the node but never connects back.  Completing on
    # "reached every peer" alone would let this node finish and close its listener while the
    # peer still waited to reach it (seen: the peer's boot files waited for the table forever).
    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen(1)
        node = _launch(
            tmp_path, "b", _free_port(), peer.getsockname()[1], 2, "--barrier-timeout=2", TABLE_WAIT="4"
        )
        conn, _ = peer.accept()
        with conn:
            conn.settimeout(10)
            assert conn.recv(64) == b"2\n"  # the node says who it is: its first rank
        out, _ = node.communicate(timeout=60)
    assert node.returncode == 1, out.decode(errors="replace")
    assert "1 peer(s) that never reached this node never came up" in out.decode()
    assert json.loads((tmp_path / "b" / rank_table.FILE_NAME).read_text())["status"] == "initializing"


def test_ascend_launcher_fails_with_the_failing_ranks_code(tmp_path):
    port_a = _free_port()
    node = _launch(tmp_path, "a", port_a, _free_port(), 0, FAIL_RANK="1")
    # the peer never comes, so rank 0 waits for the table; rank 1 fails and rank 0 is stopped
    node.wait(timeout=60)
    assert node.returncode == 4
    assert "rank 1 exited with code 4" in node.stdout.read().decode()
    assert json.loads((tmp_path / "logs-a" / "failure.json").read_text()) == {"rank": 1, "exit_code": 4}


def test_rank_table_cli_converts_once_completed(tmp_path):
    source = tmp_path / "t2.json"
    table = rank_table.template2(
        "job", [{"devices": [{"device_id": "3", "device_ip": "x"}], "pod_name": "p", "server_id": "s"}]
    )
    source.write_text(json.dumps({**table, "status": "completed"}))
    result = _module(
        "ma_jupyter.nodeside.rank_table", "--wait", "5", str(source), str(tmp_path / "t1.json"), env=_env()
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "t1.json").read_text())["server_list"][0]["device"][0]["rank_id"] == "0"


# ------------------------------------------------------------------------------ torch_run


def test_waiting_for_a_listener_gives_up_at_its_deadline_when_nothing_listens():
    from ma_jupyter.nodeside.torch_run import wait_for_listener

    with socket.socket() as bound:  # bound, never listening: every probe is refused
        bound.bind(("127.0.0.1", 0))
        started = time.monotonic()
        assert wait_for_listener("127.0.0.1", bound.getsockname()[1], timeout=0.3) is False
        assert time.monotonic() - started >= 0.25  # it kept probing until about its deadline


def test_waiting_for_a_listener_ends_with_its_first_accepted_probe():
    from ma_jupyter.nodeside.torch_run import wait_for_listener

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        assert wait_for_listener("127.0.0.1", listener.getsockname()[1], timeout=30) is True


@pytest.mark.torch
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.9", "--master_port=29511"],
            ("127.0.0.9", 29511, 60.0),
        ),
        # node 0's own launcher hosts the store
        (["--nnodes=2", "--node_rank=0", "--master_addr=127.0.0.9", "--master_port=29511"], None),
        (["--nnodes=1", "--node_rank=0"], None),
        (["--nnodes=1:2", "--node_rank=1"], ("127.0.0.1", 29500, 60.0)),  # torch's default port
        (["--nnodes=2", "--node_rank=1", "--master_addr=[::1]", "--master_port=29511"], ("::1", 29511, 60.0)),
        # the static rendezvous's endpoint wins over master_addr/port; its timeout caps the wait
        (
            ["--nnodes=2", "--node_rank=1", "--rdzv_endpoint=node0:29600", "--rdzv_conf=timeout=5"],
            ("node0", 29600, 5.0),
        ),
        (["--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400"], None),
        (["--standalone", "--nnodes=2", "--node_rank=1"], None),
        (["--nnodes=2", "--node_rank=1", "--rdzv_conf=timeout=soon"], None),  # the launcher refuses it
        (["--nnodes=2", "--node_rank=1", "--rdzv_conf=timeout=nan"], None),
    ],
)
def test_only_nodes_other_than_0_of_a_static_rendezvous_wait_for_node_0s_store(
    options, expected, monkeypatch
):
    from torch.distributed import run

    from ma_jupyter.nodeside.torch_run import store_to_wait_for

    for name in [n for n in os.environ if n.startswith("PET_")]:  # a platform node sets them
        monkeypatch.delenv(name)

    assert store_to_wait_for(run.parse_args([*options, "train.py"])) == expected


@pytest.mark.torch
def test_pet_variables_alone_say_which_node_waits(monkeypatch):
    from torch.distributed import run

    from ma_jupyter.nodeside.torch_run import store_to_wait_for

    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    for name, value in {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "127.0.0.8",
        "PET_MASTER_PORT": "29512",
        "PET_RDZV_BACKEND": "static",
    }.items():
        monkeypatch.setenv(name, value)
    assert store_to_wait_for(run.parse_args(["train.py"])) == ("127.0.0.8", 29512, 60.0)


@pytest.mark.torch
def test_a_node_other_than_0_probes_node_0s_port_before_its_store_client_connects(tmp_path):
    """By hand, the launcher's store client connects first (and backs off when refused).

    Through ``torch_run`` the first connection node 0's port ever sees is the silent probe;
    the store client's (which speaks at once) only follows it.
    """
    port = _free_port()
    argv = [sys.executable, "-m", "ma_jupyter.nodeside.torch_run", "--nnodes=2", "--nproc_per_node=1"]
    argv += ["--node_rank=1", "--master_addr=127.0.0.1", f"--master_port={port}", "--rdzv_backend=static"]
    node = subprocess.Popen(
        [*argv, "--max_restarts=0", str(tmp_path / "never_runs.py")],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(4)
            listener.settimeout(60)
            first, _ = listener.accept()
            with first:
                first.settimeout(60)
                assert first.recv(64) == b""  # the probe: closed without a word
            second, _ = listener.accept()
            with second:
                second.settimeout(60)
                assert second.recv(64) != b""  # the store client, validating itself
    finally:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()


# a driver whose interpreter teardown shows itself: atexit handlers run only in a normal exit
_TEARDOWN_DRIVER = (
    "import atexit, sys; from ma_jupyter.nodeside import torch_run; "
    "atexit.register(lambda: print('interpreter teardown', flush=True)); torch_run.main(sys.argv[1:])"
)


@pytest.mark.torch
@pytest.mark.parametrize(("script_exit", "expected"), [(0, 0), (3, 1)])
def test_torch_run_skips_the_teardown_only_after_a_success(tmp_path, script_exit, expected):
    """Success ends the process at once (no interpreter teardown); a failure as the launcher's own."""
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nprint('rank says hello', flush=True)\nsys.exit({script_exit})\n")
    argv = ["--nnodes=1", "--nproc_per_node=1", "--node_rank=0", "--master_addr=127.0.0.1"]
    argv += [f"--master_port={_free_port()}", "--rdzv_backend=static", "--max_restarts=0", str(script)]
    result = subprocess.run(
        [sys.executable, "-c", _TEARDOWN_DRIVER, *argv],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == expected, result.stderr
    assert "rank says hello" in result.stdout
    assert ("interpreter teardown" in result.stdout) is bool(expected)
    if expected:
        assert "ChildFailedError" in result.stderr


_CHECKPOINTS_ON_SIGTERM = (
    "import signal, sys, time\n"
    "def save(signum, frame):\n"
    "    print('checkpoint saved', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, save)\n"
    "print('training', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.torch
def test_a_stop_signal_ends_torch_run_with_one_line_and_no_traceback(tmp_path):
    """Rule 7: the platform's SIGTERM (a checkpoint) reaches the worker, and the launcher's
    SignalException becomes status 143 and one line, not a traceback in the job's log."""
    script = tmp_path / "train.py"
    script.write_text(_CHECKPOINTS_ON_SIGTERM)
    argv = [sys.executable, "-m", "ma_jupyter.nodeside.torch_run", "--nnodes=1", "--nproc_per_node=1"]
    argv += ["--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    argv += ["--rdzv_backend=static", "--max_restarts=0", str(script)]
    node = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = iter(node.stdout.readline, "")
        assert any(line == "training\n" for line in lines)  # the worker runs
        node.send_signal(signal.SIGTERM)
        rest = node.communicate(timeout=120)[0]
    finally:
        node.kill()
        node.wait()
    assert node.returncode == 128 + signal.SIGTERM, rest
    assert "checkpoint saved" in rest  # the worker got the signal
    assert "[ma_jupyter] torchrun stopped by SIGTERM: its workers got the signal and ended" in rest
    assert "Traceback" not in rest and "SignalException" not in rest, rest


_ALONE = "import time\nprint('trained alone', flush=True)\n"
_TOGETHER = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.ones(1)\n"
    "dist.all_reduce(t)\n"
    "print('sum', int(t.item()), flush=True)\n"
    "import os; os._exit(0)  # gloo's teardown aborts now and then (machine facts)\n"
)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("script", "reported"),
    [
        (_ALONE, True),  # each node ran on its own
        (_TOGETHER, False),  # a process group formed
        (_ALONE + "import sys; sys.exit(3)\n", False),  # a failure says enough, and the check is unsure
    ],
    ids=["alone", "process-group", "failed"],
)
def test_node_0_reports_a_multi_node_run_whose_ranks_never_joined_a_process_group(tmp_path, script, reported):
    """Rule 5 of torch_run, with two real launchers on loopback, each with its rank-log folder."""
    (tmp_path / "train.py").write_text(script)
    port = _free_port()
    nodes = []
    for rank in (0, 1):
        folder = tmp_path / f"logs-{rank}"
        folder.mkdir()
        argv = [sys.executable, "-m", "ma_jupyter.nodeside.torch_run", "--nnodes=2", "--nproc_per_node=1"]
        argv += [f"--node_rank={rank}", "--master_addr=127.0.0.1", f"--master_port={port}"]
        argv += ["--rdzv_backend=static", "--max_restarts=0", str(tmp_path / "train.py")]
        nodes.append(
            subprocess.Popen(
                argv,
                env=_env(MA_RANK_LOG_DIR=str(folder)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [node.communicate(timeout=180)[0] for node in nodes]
    codes = [node.returncode for node in nodes]
    assert codes == ([1, 1] if "exit(3)" in script else [0, 0]), outputs
    if script is _TOGETHER:
        assert all("sum 2" in out for out in outputs), outputs
    report = tmp_path / "logs-0" / "not-distributed.json"
    assert report.exists() is reported, outputs
    if reported:
        assert json.loads(report.read_text()) == {"nodes": 2}
    assert os.listdir(tmp_path / "logs-1") == []  # only node 0 looks (its launcher hosts the store)


@pytest.mark.torch
def test_a_single_node_run_is_never_reported(tmp_path):
    (tmp_path / "train.py").write_text(_ALONE)
    argv = [sys.executable, "-m", "ma_jupyter.nodeside.torch_run", "--nnodes=1", "--nproc_per_node=2"]
    argv += ["--node_rank=0", "--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    argv += ["--rdzv_backend=static", "--max_restarts=0", str(tmp_path / "train.py")]
    result = subprocess.run(
        argv, env=_env(MA_RANK_LOG_DIR=str(tmp_path)), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("trained alone") == 2
    assert not (tmp_path / "not-distributed.json").exists()


# node 1's launcher preempted between the exit barrier's two store calls, as a loaded machine
# does now and then: it reaches the barrier last, and reads its key 1.5 s later
_PREEMPTED_DRIVER = (
    "import sys, time\n"
    "import torch.distributed.elastic.utils.store as store_util\n"
    "real = store_util._barrier_nonblocking\n"
    "def preempted(*args, **kwargs):\n"
    "    key = real(*args, **kwargs)\n"
    "    time.sleep(1.5)\n"
    "    return key\n"
    "store_util._barrier_nonblocking = preempted\n"
    "from ma_jupyter.nodeside import torch_run\n"
    "torch_run.main(sys.argv[1:])\n"
)


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_node_0_keeps_its_store_until_every_node_has_left_the_exit_barrier(tmp_path):
    """Rule 6: without it node 0's launcher closed its store once its own barrier passed, and
    node 1 logged "Error waiting on exit barrier" with a C++ backtrace though it succeeded."""
    script = tmp_path / "train.py"
    # node 1's worker ends last, so its launcher is the last at the barrier
    script.write_text("import os, time\ntime.sleep(1.0 if os.environ['GROUP_RANK'] == '1' else 0)\n")
    port = _free_port()
    common = ["--nnodes=2", "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}"]
    common += ["--rdzv_backend=static", "--max_restarts=0", str(script)]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "ma_jupyter.nodeside.torch_run", "--node_rank=0", *common],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        subprocess.Popen(
            [sys.executable, "-c", _PREEMPTED_DRIVER, "--node_rank=1", *common],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert "Error waiting on exit barrier" not in outputs[1], outputs[1]
