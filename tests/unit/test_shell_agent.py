"""The debug terminal's agent, driven through a real PTY: a shell, its answers, resize, exit code,
and refusal without the attempt's secret."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from ma_jupyter.nodehost import shell_agent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def agent(tmp_path):
    job = f"job-{secrets.token_hex(4)}"
    secret = secrets.token_hex(16)
    env = {
        **os.environ,
        "MA_JOB_SECRET": secret,
        "PYTHONPATH": str(ROOT),
        "MA_JOB_ID": job,
        "SHELL": "/bin/sh",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ma_jupyter.nodehost.shell_agent",
            "--serve",
            "--job",
            job,
            "--node",
            "worker-0",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "agent.stderr", "w"),  # what the agent says (no traceback)
        text=True,
    )
    assert "debug terminal ready" in proc.stdout.readline()
    yield job, secret, tmp_path
    proc.terminate()
    proc.wait(timeout=60)


def _attach(job, secret, extra_env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MA_JOB_SECRET": secret, **(extra_env or {})}
    return pexpect.spawn(
        sys.executable,
        ["-m", "ma_jupyter.nodehost.shell_agent", "--attach", "--job", job, "--node", "worker-0"],
        env=env,
        timeout=120,
        dimensions=(30, 100),
    )


def test_shell_answers_resizes_and_returns_exit_code(agent):
    job, secret, workdir = agent
    (workdir / "left-by-job.txt").write_text("x")
    child = _attach(job, secret)
    child.sendline("pwd; echo MARK-$MA_JOB_ID; ls; stty size")
    child.expect(str(workdir.resolve()))  # the shell starts where the agent runs
    child.expect(f"MARK-{job}")
    child.expect("left-by-job.txt")
    child.expect("30 100")
    child.setwinsize(40, 120)  # SIGWINCH on the client's terminal is relayed to the shell's PTY
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        child.sendline("stty size")
        if child.expect(["40 120", pexpect.TIMEOUT], timeout=5) == 0:
            break
    else:
        pytest.fail("the resize never reached the shell")
    child.sendline("exit 7")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 7


def test_wrong_secret_is_refused(agent):
    job, _secret, _ = agent
    child = _attach(job, "not-the-secret")
    child.expect("refused")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 255


def test_find_shell_prefers_executable_shell_env(tmp_path):
    assert shell_agent.find_shell({"SHELL": "/bin/sh"}) == "/bin/sh"
    assert shell_agent.find_shell({"SHELL": str(tmp_path / "missing")}) in shell_agent.SHELLS


def test_the_agents_frames_are_the_backend_contracts():
    from ma_jupyter.backends import base
    from ma_jupyter.nodehost import agent_wire, shell_agent

    assert (shell_agent.DATA, shell_agent.EXIT, shell_agent.RESIZE) == (
        base.SHELL_DATA,
        base.SHELL_EXIT,
        base.SHELL_RESIZE,
    )
    assert agent_wire.HEADER.format == base.SHELL_FRAME_HEADER
    assert agent_wire.MAX_FRAME == base.SHELL_MAX_FRAME
    assert agent_wire.JOB_SECRET_ENV == base.JOB_SECRET_ENV


def test_keystrokes_sent_with_the_request_are_not_lost(agent):
    from ma_jupyter.nodehost.agent_wire import recv_frame, send_frame

    job, secret, _ = agent
    conn = shell_agent.connect(job, "worker-0", secret, 24, 80)
    # the first keystrokes right behind the request, in one go (a fast client, a paste)
    send_frame(conn, shell_agent.DATA, b"echo TYPED-$((6*7)); exit 7\n")
    seen, code = b"", None
    with conn:
        while code is None:
            channel, payload = recv_frame(conn)
            if channel == shell_agent.DATA:
                seen += payload
            elif channel == shell_agent.EXIT:
                code = int(payload)
    assert b"TYPED-42" in seen and code == 7


def test_an_unknown_terminal_size_becomes_24_by_80():
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    try:

        def size() -> tuple[int, int]:
            rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(slave, termios.TIOCGWINSZ, bytes(8)))
            return rows, cols

        shell_agent.set_winsize(master, 0, 0)
        assert size() == (24, 80)
        shell_agent.set_winsize(master, 50, 0)
        assert size() == (50, 80)
        shell_agent.set_winsize(master, -1, 132)
        assert size() == (24, 132)
        shell_agent.set_winsize(master, 5000, 5000)
        assert size() == (1000, 1000)
    finally:
        os.close(master)
        os.close(slave)


def test_resizes_of_any_shape_are_refused_on_the_terminal_and_the_shell_goes_on(agent):
    import json

    from ma_jupyter.nodehost.agent_wire import HEADER, recv_frame, send_frame

    job, secret, folder = agent
    conn = shell_agent.connect(job, "worker-0", secret, 24, 80)
    conn.settimeout(60)  # a dead shell fails the test, never hangs it
    hostile = [
        b'{"rows": 1e400, "cols": 5}',
        b"[" * 5000 + b"]" * 5000,
        b'{"rows": "a", "cols": 80}',
        b"[]",
        b"\xff",
    ]
    for payload in hostile:
        send_frame(conn, shell_agent.RESIZE, payload)
    send_frame(conn, shell_agent.RESIZE, json.dumps({"rows": 33, "cols": 77}).encode())
    send_frame(conn, shell_agent.DATA, b"stty size; exit 6\n")
    seen, code = b"", None
    with conn:
        while code is None:
            channel, payload = recv_frame(conn)
            if channel == shell_agent.DATA:
                seen += payload
            elif channel == shell_agent.EXIT:
                code = int(payload)
    assert code == 6 and b"33 77" in seen, seen
    assert seen.count(b"shell_agent: refused: a resize") == len(hostile), seen
    assert "Traceback" not in (folder / "agent.stderr").read_text()
    # a frame declaring more than a frame may carry ends that terminal only, not the agent
    conn = shell_agent.connect(job, "worker-0", secret, 24, 80)
    conn.settimeout(60)
    with conn:
        conn.sendall(HEADER.pack(shell_agent.DATA, 0xFFFFFFFF))
        while True:  # the shell is hung up: its end comes back
            channel, payload = recv_frame(conn)
            if channel == shell_agent.EXIT:
                break
    # the agent still serves a new terminal
    conn = shell_agent.connect(job, "worker-0", secret, 24, 80, command=["sh", "-c", "exit 9"])
    conn.settimeout(60)
    with conn:
        while (frame := recv_frame(conn))[0] != shell_agent.EXIT:
            pass
    assert frame[1] == b"9"


def test_requests_of_any_shape_are_refused_without_killing_the_agent(agent):
    import socket

    from ma_jupyter.nodehost.agent_wire import recv_frame

    job, secret, folder = agent
    for request in (
        f'{{"secret": "{secret}", "rows": 1e400, "cols": 5}}\n'.encode(),
        b"[" * 2000 + b"\n",
        f'{{"secret": "{secret}", "rows": true, "cols": [1]}}\n'.encode(),
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(60)
            conn.connect(shell_agent.socket_name(job, "worker-0"))
            conn.sendall(request)
            assert conn.recv(100) == b""  # closed, having served nothing
    assert "Traceback" not in (folder / "agent.stderr").read_text()
    conn = shell_agent.connect(job, "worker-0", secret, 24, 80, command=["sh", "-c", "exit 9"])
    conn.settimeout(60)
    with conn:
        while (frame := recv_frame(conn))[0] != shell_agent.EXIT:
            pass
    assert frame[1] == b"9"


def test_a_client_that_typed_after_the_command_ended_still_reads_the_exit_status():
    """The command of a terminal ended (a script) while the client still sent its end of input:
    the service's write of those keystrokes to an agent that closed made asyncio drop the
    connection with the exit frame unread, and the CLI printed nothing and exited 255.  The
    agent closes after its peer (:func:`close_after_peer`): the exit status gets through."""
    import asyncio
    import json
    import socket
    import threading

    from ma_jupyter.nodehost.agent_wire import close_after_peer
    from ma_jupyter.service.shell import _HEADER, EXIT, bridge

    class TypingClient:
        """A WebSocket whose user keeps typing until the terminal ends."""

        def __init__(self):
            self.sent: list = []

        async def send_text(self, text: str) -> None:
            self.sent.append(json.loads(text))

        async def receive(self) -> dict:
            await asyncio.sleep(0)
            return {"type": "websocket.receive", "text": json.dumps(["stdin", "x" * 4096])}

        async def close(self) -> None:
            pass

    def terminal(close) -> list:
        def agent(sock: socket.socket) -> None:
            sock.recv(1)  # the command ends as the first keystroke arrives, the rest unread
            sock.sendall(_HEADER.pack(EXIT, 1) + b"0")
            close(sock)

        ours, agents = socket.socketpair()
        threading.Thread(target=agent, args=(agents,), daemon=True).start()
        client = TypingClient()
        asyncio.run(asyncio.wait_for(bridge(client, ours), 30))
        return client.sent

    # (the plain close this replaces lost the exit status in some of these runs, depending on
    # the scheduling of the two threads: shown when the fix came in, not asserted here, since a
    # run where the race happens not to fire would fail the test)
    assert all(["exit", 0] in terminal(close_after_peer) for _ in range(10))
