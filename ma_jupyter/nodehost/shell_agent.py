"""The debug terminal's agent: an interactive shell on a PTY, served from inside a node's sandbox.

``python -m ma_jupyter.nodehost.shell_agent --serve --job JOB --node NODE --status FD
--release FD -- COMMAND...`` is the node's command phase itself, as the node runner starts it
for a ``--debug-terminal`` job (wrapped like any phase: the node's sandbox, account, limits and
variables).  It starts COMMAND as its child and listens on the abstract Unix socket
``ma_jupyter-shell/<JOB>/<NODE>``; every accepted connection gets one shell on a fresh PTY.  The
shells are therefore in the node's own namespaces, the very ones its command runs in: its
processes (``ps``), its ``/tmp``, ``/dev/shm`` and System V IPC, its hostname, its network and
mounts, as its account and with its variables, never more.  Without ``--status ... -- COMMAND``
the agent only serves, until SIGTERM, SIGINT or SIGHUP.

The node's command (rules, in order):

a. COMMAND is looked up on the job's ``PATH`` and started with this process's variables, working
   folder and standard streams (the node's log); 127 when it is not found, 126 when it cannot
   start.
b. While it runs, SIGTERM and SIGINT are not the agent's: a stop delivers them to the node's
   processes, COMMAND's among them (:mod:`.stopping`), and the agent must outlive COMMAND to
   report its end; they are ignored until then.
c. When COMMAND ends, its exit code (128+N for signal N) is written as one line to the
   ``--status`` descriptor, which is then closed; the runner records it as the node's.  Before
   that, when it failed (the sandbox may be kept, while the node's resources go to other jobs),
   the sandbox is emptied (:func:`empty_sandbox`): every other process of the node's pid
   namespace is killed (what COMMAND left running in the background), but the agent, its
   ancestors and the terminal's shells; ``/tmp``, ``/dev/shm`` and ``/run`` (memory) are
   emptied and the System V shared memory segments removed; the files on disk (the working
   folder, the outputs) stay for the terminal.
d. The agent then serves on until the runner closes the ``--release`` descriptor's other end:
   at once for a success or a stop, at the end of the keep period (``[limits]
   debug_keep_hours``) for a failed command, so the failed node's sandbox, with the files on
   disk its command left, stays for the terminal; deleting the job or its next attempt
   ends it sooner (the runner is then ended, which also closes the descriptor).  Then every
   shell is hung up and the agent exits with COMMAND's code (which ends the sandbox).
e. After COMMAND's end, SIGTERM, SIGINT and SIGHUP end the agent as in (d).

Wire protocol (rules, in order):

1. The client sends one JSON line ``{"secret": S, "rows": R, "cols": C}``, optionally with
   ``"command": [argv...]``.  ``S`` must equal the attempt's secret (``$MA_JOB_SECRET``,
   backends.base) and the peer's uid (``SO_PEERCRED``) must be the agent's own or root's (the
   service, which may run the node as another account); otherwise the agent sends an ``EXIT``
   frame with ``255`` and closes.  Without ``command`` the PTY runs an interactive shell,
   with it that argv (looked up on the sandbox's ``PATH``), as the shell would.
2. Then both sides exchange frames ``!BI`` (channel, length) + payload: ``DATA`` (1) carries PTY
   bytes in both directions; ``RESIZE`` (4, client to agent) carries JSON ``{"rows", "cols"}``,
   two whole numbers (0: unknown; at most 1000 is used); ``EXIT`` (3, agent to client) carries
   the shell's exit status as ASCII and is the last frame.  A frame declaring more than
   ``agent_wire.MAX_FRAME`` bytes ends the connection (as the client closing it, rule 3); a
   ``RESIZE`` that is not that JSON is refused with one line on the terminal saying why, and
   the shell goes on.
3. The client closing the connection hangs the shell up (its process group gets SIGHUP, then
   SIGKILL): no shell outlives its terminal.

``python -m ma_jupyter.nodehost.shell_agent --attach --job JOB --node NODE`` (secret in
``$MA_JOB_SECRET``) connects the calling terminal to such a shell (``attach``), from the node's
network namespace where it has one (``nsenter --net=/proc/<runner pid>/ns/net ...``: abstract
socket names are per namespace); the service opens its connections with :func:`connect` (the
``/jobs/{id}/shell`` route bridges them to a WebSocket), from inside that namespace.

``find_shell`` picks the shell: ``$SHELL`` if it is an executable file in this view, else the
first of ``/bin/bash``, ``/usr/bin/bash``, ``/bin/sh``, ``/usr/bin/sh``.

Why one module (over 600 lines): it is one program run inside a node (standard library only,
under the job's own interpreter): the node's command (rules a-e), the shells on PTYs and the
wire protocol share its one process and serving loop, and it must stay a single file a node's
interpreter runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

from ..nodeside.exec_env import which
from .agent_wire import (
    IO_TIMEOUT,
    JOB_SECRET_ENV,
    RELEASE_FD,
    STATUS_FD,
    AgentServer,
    abstract_name,
    peer_credentials,
    recv_frame,
    send_frame,
)
from .procfs import stat_fields

# backends.base's SHELL_DATA, SHELL_EXIT, SHELL_RESIZE (kept import-free: runs in a node;
# tests/unit/test_shell_agent.py checks they agree, and agent_wire's HEADER with its header)
DATA, EXIT, RESIZE = 1, 3, 4
MAX_REQUEST = 4096
SHELLS = ("/bin/bash", "/usr/bin/bash", "/bin/sh", "/usr/bin/sh")


def socket_name(job_id: str, node: str) -> bytes:
    """The abstract socket address of one node's shell agent."""
    return abstract_name("shell", job_id, node)


def find_shell(environ: dict | None = None) -> str:
    """The shell to run in this filesystem view (see the module docstring).

    Raises:
        FileNotFoundError: the view has no shell at all.
    """
    environ = os.environ if environ is None else environ
    candidates = [environ.get("SHELL", ""), *SHELLS]
    for path in candidates:
        if path and os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError("no shell in this image: install bash or sh")


#: the size a terminal gets when its client reports none (0 or less: "unknown"), as xterm's
DEFAULT_ROWS, DEFAULT_COLS = 24, 80


def parse_size(payload: bytes) -> tuple[int, int]:
    """A ``RESIZE`` frame's (rows, cols) (wire rule 2).

    Raises:
        ValueError: not a JSON object of two whole numbers ``rows`` and ``cols`` (what is
            wrong, in words fit for the terminal).
    """
    try:
        size = json.loads(payload)
    except (ValueError, RecursionError):
        raise ValueError('a resize must be JSON {"rows": R, "cols": C}') from None
    if not isinstance(size, dict):
        raise ValueError('a resize must be JSON {"rows": R, "cols": C}')
    rows, cols = size.get("rows"), size.get("cols")
    for value in (rows, cols):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 16:
            raise ValueError("a resize's rows and cols must be whole numbers from 0 to 65536")
    return rows, cols


def set_winsize(fd: int, rows: int, cols: int) -> None:
    """Give the terminal ``fd`` a size (the shell gets SIGWINCH from the kernel).

    A dimension of 0 or less means the client does not know it (a terminal that is not a tty, a
    browser terminal not laid out yet): it becomes 24 rows or 80 columns, never a 1-wide
    terminal that wraps every character.
    """
    rows = min(int(rows), 1000) if int(rows) > 0 else DEFAULT_ROWS
    cols = min(int(cols), 1000) if int(cols) > 0 else DEFAULT_COLS
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Server(AgentServer):
    """Serves shells for one node (see the module docstring); the serving loop is
    :class:`.agent_wire.AgentServer`'s."""

    KIND = "shell"
    READY = "[shell_agent] debug terminal ready on {address}"
    MAX_REQUEST = MAX_REQUEST
    # byte by byte: the client's first frames may follow its request at once, and must stay in
    # the socket for the frame reader
    REQUEST_CHUNK = 1
    # the service (root) opens the terminal for a node that runs as the job's account
    ROOT_TOO = True
    REFUSAL_CHANNEL = DATA
    EXIT_CHANNEL = EXIT
    REFUSED_PEER = REFUSED_SECRET = b"shell_agent: refused: not this job's service\r\n"
    STOP_SIGNALS = (signal.SIGHUP,)

    def __init__(self, job_id: str, node: str):
        super().__init__(job_id, node)
        self.shells: set[int] = set()  # pids of the running shells (their process groups)

    def parse(self, request: dict) -> tuple[int, int, list[str] | None]:
        rows, cols = request.get("rows", 24), request.get("cols", 80)
        for value in (rows, cols):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 16:
                raise ValueError("rows and cols: whole numbers from 0 to 65536")
        command = request.get("command") or None
        if command is not None and not (
            isinstance(command, list) and all(isinstance(a, str) and "\0" not in a for a in command)
        ):
            raise ValueError("command: not a list of strings")
        return rows, cols, command

    def serve_one(
        self, conn: socket.socket, parsed: tuple[int, int, list[str] | None], lock: threading.Lock
    ) -> None:
        rows, cols, command = parsed
        try:
            argv = command or [find_shell()]
        except FileNotFoundError as exc:
            send_frame(conn, DATA, f"shell_agent: {exc}\r\n".encode(), lock)
            send_frame(conn, EXIT, b"127", lock)
            return
        # fork-then-exec at once: the child touches no lock the other threads may hold
        pid, master = pty.fork()
        if pid == 0:  # the child: a session leader whose controlling terminal is the PTY
            try:
                os.execvp(argv[0], argv)
            except OSError as exc:
                os.write(2, f"{argv[0]}: {exc.strerror}\r\n".encode())
            finally:
                os._exit(127)
        with self.lock:
            self.shells.add(pid)
        _await_session(pid)
        try:
            set_winsize(master, rows, cols)
            threading.Thread(target=self._pump_in, args=(conn, master, pid, lock), daemon=True).start()
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the shell and everything on its terminal ended
                    break
                if not data:
                    break
                send_frame(conn, DATA, data, lock)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            send_frame(conn, EXIT, str(code if code >= 0 else 128 - code).encode(), lock)
        except OSError:
            _hang_up(pid)
        finally:
            os.close(master)
            with self.lock:
                self.shells.discard(pid)

    @staticmethod
    def _pump_in(conn: socket.socket, master: int, pid: int, lock: threading.Lock) -> None:
        """Client to shell: keystrokes and resizes; the client gone hangs the shell up (rule 3),
        as does a frame over ``MAX_FRAME``; a bad resize is refused on the terminal (rule 2)."""
        try:
            while True:
                channel, payload = recv_frame(conn)
                if channel == DATA:
                    os.write(master, payload)
                elif channel == RESIZE:
                    try:
                        rows, cols = parse_size(payload)
                    except ValueError as exc:
                        send_frame(conn, DATA, f"\r\nshell_agent: refused: {exc}\r\n".encode(), lock)
                        continue
                    set_winsize(master, rows, cols)
        except (EOFError, OSError, ValueError):
            pass
        _hang_up(pid)

    def stop(self) -> None:
        """Hang up every shell (the node is being stopped)."""
        with self.lock:
            pids = list(self.shells)
        for pid in pids:
            _hang_up(pid)


def _await_session(pid: int, wait: float = 5.0) -> None:
    """Return once the forked shell ``pid`` leads its own session (it makes it just after the
    fork): hanging up its process group before that would reach nothing, and leave it running."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return
        time.sleep(0.001)


def _hang_up(pid: int) -> None:
    for sig in (signal.SIGHUP, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


#: this module, as ``python -m`` names it (the name stands in the agent's command line)
MODULE = "ma_jupyter.nodehost.shell_agent"


def command_argv(python: str, helpers: str, job_id: str, node: str, command: list[str]) -> list[str]:
    """The argv running the node's ``command`` under this agent (rules a to e), with the node's
    interpreter ``python`` and this package found in ``helpers`` (the folder holding a link to
    it); the runner puts descriptors in place of :data:`STATUS_FD` and :data:`RELEASE_FD`.

    Isolated (``-I -S``): neither the job's ``PYTHONPATH``, its working folder nor its site
    packages can shadow a module the agent imports, so a job's own ``signal.py`` or
    ``socket.py`` never keeps its command from starting; the variables still reach the command
    and the shells unchanged."""
    boot = (
        f"import runpy, sys; sys.path.insert(0, {helpers!r}); "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    )
    node_args = ["--job", job_id, "--node", node, "--status", STATUS_FD, "--release", RELEASE_FD]
    return [python, "-I", "-S", "-c", boot, MODULE, "--serve", *node_args, "--", *command]


def serve(job_id: str, node: str) -> int:
    """Run the server until SIGTERM/SIGINT/SIGHUP; returns 0."""
    return Server(job_id, node).run()


def _start_command(command: list[str]) -> subprocess.Popen | int:
    """Rule (a): COMMAND started as this process's child; its exit code when it cannot start."""
    path = os.environ.get("PATH", os.defpath)
    program = command[0] if "/" in command[0] else which(command[0], path)
    if program is None:
        print(
            f"[ma_jupyter] cannot start {command[0]}: not found on the job's PATH",
            file=sys.stderr,
            flush=True,
        )
        return 127
    try:
        # a session of its own, as the command has without a terminal (bubblewrap's
        # --new-session): what it does to its process group never reaches the agent
        return subprocess.Popen(
            command, executable=program, stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True
        )
    except OSError as exc:
        print(f"[ma_jupyter] cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126


#: the memory-backed folders of a node's sandbox, emptied when a failed one is kept (rule c)
MEMORY_FOLDERS = ("/tmp", "/dev/shm", "/run")
#: seconds the emptying of the memory folders may take (the exit code waits for it)
EMPTY_SECONDS = 20.0
#: kill passes over the pid namespace (a process forking while it is killed needs a few)
KILL_PASSES = 100


def _stat(pid: str) -> list[str] | None:
    """``/proc/<pid>/stat`` after "pid (comm)": state, ppid, pgrp, session, ...; None if gone."""
    fields = stat_fields(pid)
    return None if fields is None else [field.decode("ascii", "replace") for field in fields]


def _others(spared_sessions: set[int]) -> list[int]:
    """The live processes of this pid namespace but this one, its ancestors and the sessions
    ``spared_sessions`` (the terminal's shells)."""
    keep, pid = set(), os.getpid()
    while pid > 1:  # this process and its ancestors (up to bubblewrap's init, pid 1)
        keep.add(pid)
        fields = _stat(str(pid))
        pid = int(fields[1]) if fields else 0
    keep.add(1)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        fields = _stat(name)
        if fields is None or fields[0] in ("Z", "X") or int(fields[3]) in spared_sessions:
            continue
        found.append(int(name))
    return found


def _remove_shm_segments() -> int:
    """Remove every System V shared memory segment of the node's IPC namespace (its own:
    bubblewrap's ``--unshare-ipc``); how many."""
    import ctypes

    try:
        with open("/proc/sysvipc/shm") as fh:
            ids = [int(line.split()[1]) for line in fh.readlines()[1:] if line.strip()]
        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ValueError, IndexError):
        return 0
    return sum(1 for shmid in ids if libc.shmctl(shmid, 0, None) == 0)  # IPC_RMID


def empty_sandbox(spared_sessions: set[int]) -> tuple[int, int]:
    """Rule c: kill every other process of the node (but ``spared_sessions``), empty its
    memory-backed folders and System V segments; (processes killed, bytes freed)."""

    killed: set[int] = set()
    for _ in range(KILL_PASSES):
        live = _others(spared_sessions)
        if not live:
            break
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    freed = 0
    for folder in MEMORY_FOLDERS:
        try:
            before = os.statvfs(folder)
            entries = list(os.scandir(folder))
        except OSError:
            continue
        _empty_folder(folder, entries, deadline=time.monotonic() + EMPTY_SECONDS)
        try:
            after = os.statvfs(folder)
            freed += max(0, (after.f_bfree - before.f_bfree) * after.f_frsize)
        except OSError:
            pass
    _remove_shm_segments()
    return len(killed), freed


def _empty_folder(folder: str, entries: list[os.DirEntry], deadline: float) -> None:
    """Remove ``entries`` of ``folder`` without recursion (a chain of any depth ends no thread:
    one too deep for a path is left), following no link and entering no other file system (a
    mount below, e.g. one of the platform's own folders under ``/run``, is left whole), until
    ``deadline``."""
    try:
        device = os.lstat(folder).st_dev
    except OSError:
        return
    folders: list[str] = []
    stack = list(entries)
    while stack and time.monotonic() < deadline:
        entry = stack.pop()
        try:
            info = entry.stat(follow_symlinks=False)
            if info.st_dev != device:
                continue  # a mount point: not the job's memory to free
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.path)
                with os.scandir(entry.path) as below:
                    stack.extend(below)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
    for path in reversed(folders):  # the deepest first: each is empty by then
        try:
            os.rmdir(path)
        except OSError:
            pass


def _report(fd: int, code: int) -> None:
    """Rule (c): the exit code on the status descriptor (never fatal: the runner may be gone)."""
    try:
        os.write(fd, f"{code}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def serve_command(job_id: str, node: str, status_fd: int, release_fd: int, command: list[str]) -> int:
    """The node's command with its terminal (the module docstring's rules a to e); its exit code."""
    started = _start_command(command)
    # rule b: set after the start, so the command keeps the default handlers
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    server = Server(job_id, node)
    released = threading.Event()

    def serve() -> None:
        try:
            server.serve_forever()
        except OSError as exc:  # the name is taken: the command runs on, without a terminal
            print(f"[ma_jupyter] the debug terminal cannot listen: {exc}", file=sys.stderr, flush=True)

    threading.Thread(target=serve, daemon=True).start()
    if isinstance(started, int):
        code = started
    else:
        status = started.wait()
        code = status if status >= 0 else 128 - status
    if code != 0:  # rule c: a kept sandbox holds no process and no memory of the job's
        with server.lock:
            shells = set(server.shells)
        try:
            killed, freed = empty_sandbox(shells)
        except Exception as exc:  # whatever the job left, the exit code is reported (rule c)
            print(f"[ma_jupyter] emptying the failed sandbox stopped: {exc!r}", file=sys.stderr, flush=True)
            killed, freed = 0, 0
        print(
            f"[ma_jupyter] the command failed: {killed} process(es) it left were ended and "
            f"{freed / (1 << 20):.1f} MB in /tmp, /dev/shm and /run freed; the files on disk stay "
            "for the debug terminal",
            file=sys.stderr,
            flush=True,
        )
    _report(status_fd, code)
    # rule e: from now on a stop signal ends the agent
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda _s, _f: released.set())

    def wait_release() -> None:
        try:
            while os.read(release_fd, 64):
                pass
        except OSError:
            pass
        released.set()

    threading.Thread(target=wait_release, daemon=True).start()
    while not released.wait(0.5):
        pass
    server.stop()
    return code


def connect(
    job_id: str,
    node: str,
    secret: str,
    rows: int,
    cols: int,
    command: list[str] | None = None,
    trust: Callable[[int], bool] | None = None,
    opener: Callable[[bytes], socket.socket] | None = None,
    timeout: float = IO_TIMEOUT,
) -> socket.socket:
    """A connection to one node's shell agent, its request sent (rule 1); frames follow.

    The connection and the request's sending each wait at most ``timeout`` seconds (an agent
    that is stopped, or whose backlog is full, refuses the caller then); the socket returned is
    blocking again.

    ``opener(address)`` makes the connection where the node's abstract names are not this
    process's (a node in a network namespace of its own: :func:`.network.connect_in`).

    ``trust(pid)`` checks the listening process before the secret goes out: an abstract name
    can be taken by any process of the host, and one that took this node's name first would
    otherwise learn the attempt's secret.

    Raises:
        OSError: no agent listens for that node (the node does not run, or has no debug
            terminal); PermissionError: ``trust`` refused the process listening there.
    """
    if opener is not None:
        conn = opener(socket_name(job_id, node))
    else:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout)
        if opener is None:
            conn.connect(socket_name(job_id, node))
        if trust is not None and not trust(peer_credentials(conn)[0]):
            raise PermissionError(f"the process listening as {node}'s debug terminal is not the node's")
        request = {"secret": secret, "rows": rows, "cols": cols}
        if command:
            request["command"] = command
        conn.sendall(json.dumps(request).encode() + b"\n")
        conn.settimeout(None)
    except OSError:
        conn.close()
        raise
    return conn


def attach(job_id: str, node: str, secret: str) -> int:
    """Connect this process's terminal to a node's shell; return the shell's exit status.

    Rules: stdin goes to raw mode while attached (restored after); SIGWINCH sends the new size;
    the return value is the shell's exit status, 255 when the agent refused or is unreachable.
    """
    import select
    import tty

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    is_tty = os.isatty(stdin)
    cols, rows = os.get_terminal_size(stdin) if is_tty else (80, 24)
    try:
        conn = connect(job_id, node, secret, rows, cols)
    except OSError as exc:
        print(f"ma-jupyter shell: no debug terminal on {node} of {job_id}: {exc}", file=sys.stderr)
        return 255
    lock = threading.Lock()

    def resized(_signum, _frame):
        size = os.get_terminal_size(stdin)
        send_frame(conn, RESIZE, json.dumps({"rows": size.lines, "cols": size.columns}).encode(), lock)

    saved = termios.tcgetattr(stdin) if is_tty else None
    code = 255
    try:
        if is_tty:
            tty.setraw(stdin, termios.TCSADRAIN)  # TCSAFLUSH would drop what was typed already
            signal.signal(signal.SIGWINCH, resized)
        while True:
            ready, _, _ = select.select([conn, stdin], [], [])
            if stdin in ready:
                data = os.read(stdin, 65536)
                if data:
                    send_frame(conn, DATA, data, lock)
            if conn in ready:
                try:
                    channel, payload = recv_frame(conn)
                except (EOFError, ValueError):  # ValueError: a frame over MAX_FRAME
                    break
                if channel == DATA:
                    os.write(stdout, payload)
                elif channel == EXIT:
                    code = int(payload) if payload.isdigit() and len(payload) < 4 else 255
                    break
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        conn.close()
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = len(argv) >= 5 and argv[1] == "--job" and argv[3] == "--node"
    if named and argv[0] == "--serve" and len(argv) == 5:
        return serve(argv[2], argv[4])
    if (
        named
        and argv[0] == "--serve"
        and len(argv) > 10
        and argv[5] == "--status"
        and argv[7] == "--release"
        and argv[9] == "--"
        and argv[6].isdigit()
        and argv[8].isdigit()
    ):
        return serve_command(argv[2], argv[4], int(argv[6]), int(argv[8]), argv[10:])
    if named and argv[0] == "--attach" and len(argv) == 5:
        return attach(argv[2], argv[4], os.environ.get(JOB_SECRET_ENV, ""))
    print(
        "usage: python -m ma_jupyter.nodehost.shell_agent --serve --job JOB --node NODE "
        "[--status FD --release FD -- COMMAND...]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
