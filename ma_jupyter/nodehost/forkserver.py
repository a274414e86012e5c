"""The node runners' fork server: a process that has already imported the node runner and forks
one for each node the local backend starts.

Started as ``python -m ma_jupyter.nodehost.noderun``, every node runner paid for an
interpreter and its imports (about 60 ms of CPU and of the node's start, on every node of every
job); a fork of a process that has them costs about a millisecond.  This is what Ray does with
its prestarted workers, and :mod:`multiprocessing`'s forkserver for its children.

The contract between :class:`RunnerForkServer` (in the service, or a Ray node's agent) and the
server process (``python -m ma_jupyter.nodehost.forkserver FD NICE``):

1. the backend starts the server in a session of its own with one end of a ``SOCK_SEQPACKET``
   socket pair as descriptor FD, the environment a runner needs (the package importable, its
   bytecode cache, the backend's boot time: start times counted as the backend counts them,
   :func:`.procfs.boot_time`) and :data:`MARKER_ROOM` bytes reserved for the node marker; the server takes
   the niceness NICE (the backend's), imports the node runner, checks that it can write a
   marker into a process's own environment, says ``ready``, and answers requests one at a time;
   a server that cannot start or be reached forks nothing, and the backend starts the runner as
   a process of its own (``python -m ma_jupyter.nodehost.noderun``) instead;
2. a request is one message: JSON ``{"spec": <node-run.json>, "cwd": <node folder>, "marker":
   <the node's marker>}`` with the node's log descriptor attached (``SCM_RIGHTS``); the answer
   is one message, JSON ``{"pid": N, "start": <its start time>}``, or ``{"error": "..."}`` when
   no runner was forked (a marker too long for the room);
3. the forked runner first writes its node's marker into its own initial environment (what
   ``/proc/<pid>/environ`` shows, so stop and re-attach find it among the node's processes as
   they find a runner started as a process of its own), and the server answers only once it
   has; then the runner is what ``Popen`` made of it before: its own session, stdin
   ``/dev/null``, stdout and stderr the log, the node folder as working directory, no other
   descriptor, nothing blocked and the two signals the server changes (``SIGCHLD``,
   ``SIGINT``) back at their defaults, named :data:`RUNNER_NAME`; it runs :func:`noderun.main`
   and ends with its exit code without the interpreter's teardown (``os._exit``);
4. the server reaps each runner as soon as it ends (``SIGCHLD``); the start time in the answer
   is read while ``SIGCHLD`` is blocked, so it names that process even if it ended already;
5. the server ends when the backend's end of the socket closes (the service or the agent ended,
   or closed it); the runners it forked go on, each in its own session, as they did before;
6. a request ``{"check": "user-namespace", "argv": [<the probe's sandbox argv>]}`` (built by
   :func:`.bwrap.user_namespace_probe_argv`) with the write end of a pipe
   attached asks whether nodes can have user namespaces of their own here
   (:func:`.userns.check_user_namespace`, the runner's own code, as ``python -m
   ma_jupyter.nodehost.noderun --check-user-namespace`` runs it): the server forks a checker
   (its own session, SIGCHLD and SIGINT back at their defaults, no descriptor but the pipe and
   stdin/stdout/stderr on ``/dev/null``), answers ``{"pid": N}`` at once and goes on serving;
   the checker writes its exit code (0: it works) as one line to the pipe and ends.  The
   backend waits for that line at most its own timeout (:meth:`RunnerForkServer.check_user_namespace`);
   this spares each service an interpreter and the runner's imports (about 0.14 s of CPU).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

from ..errors import ServerUnavailable
from .procfs import NODE_MARKER

#: bytes a request or an answer may take (both are a few hundred)
MESSAGE_LIMIT = 1 << 16
#: seconds to wait for the server's answer before giving the launch up
ANSWER_TIMEOUT = 30.0
#: seconds a starting server may take to import the node runner and say it is ready
START_TIMEOUT = 60.0
#: seconds after a server failed to start before the next try (runners start the slow way)
RETRY_AFTER = 60.0
#: the server's first message: its imports are done
READY = b"ready"
#: the name of a forked runner (its command line stays the server's)
RUNNER_NAME = "ma-noderun"
#: bytes of the server's environment kept for a runner's marker (job id, attempt, node, nonce)
MARKER_ROOM = 200


class RunnerForkServer:
    """The backend's side: starts the server on first use, forks runners through it.

    Args:
        env: makes the environment of the server (and so of every runner it forks), at each
            start of the server.
    """

    def __init__(self, env: Callable[[], dict[str, str]]):
        self._env = env
        # the niceness of the thread that made the backend (on Linux each thread has its own):
        # a server started later from another thread still gives it to its runners
        self._nice = os.getpriority(os.PRIO_PROCESS, 0)
        self._lock = threading.Lock()  # one request at a time: an answer belongs to its request
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._failed_at: float | None = None

    def start(self) -> None:
        """Start the server now, if it is not running (its imports then happen off the launch path).

        Raises:
            ServerUnavailable: it cannot be started.
        """
        with self._lock:
            self._ensure()

    def _ensure(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._shut()
        if self._failed_at is not None and time.monotonic() < self._failed_at + RETRY_AFTER:
            raise ServerUnavailable("the node runners' fork server failed to start a moment ago")
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            raise ServerUnavailable(f"cannot start the node runners' fork server: {exc}") from exc
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), str(self._nice)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env={**self._env(), NODE_MARKER: "_" * MARKER_ROOM},
                cwd="/",
                start_new_session=True,  # a Ctrl-C or Ctrl-Z meant for the service is not for it
            )
        except OSError as exc:
            ours.close()
            self._failed_at = time.monotonic()
            raise ServerUnavailable(f"cannot start the node runners' fork server: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        ours.settimeout(START_TIMEOUT)
        try:
            ready = ours.recv(MESSAGE_LIMIT)
        except OSError:
            ready = b""
        if ready != READY:
            self._shut(kill=True)
            self._failed_at = time.monotonic()
            raise ServerUnavailable("the node runners' fork server did not start (its error is in this log)")
        self._failed_at = None
        ours.settimeout(ANSWER_TIMEOUT)
        return ours

    def fork_runner(self, spec_file: str, cwd: str, marker: str, log_fd: int) -> tuple[int, float | None]:
        """Fork a runner for the node described by ``spec_file``; its pid and start time.

        A server that ended since the last request is started again, once.

        Raises:
            ServerUnavailable: no runner was forked (see the class).
            OSError: the server took the request and gave no answer; it is killed, so nothing
                forks later, but a runner may have been forked: the caller ends the processes
                carrying the node's marker.
        """
        request = json.dumps({"spec": spec_file, "cwd": cwd, "marker": marker}).encode()
        with self._lock:
            reply = self._ask(request, log_fd)
        return int(reply["pid"]), reply.get("start")

    def check_user_namespace(self, argv: list[str], timeout: float) -> int:
        """Rule 6: the exit code of :func:`.userns.check_user_namespace` run in a process forked
        by the server (0: nodes can have user namespaces of their own here; a checker that ended
        without saying counts as 1).

        Raises:
            ServerUnavailable: the server cannot be started or reached, or forked nothing (the
                caller checks the slow way).
            OSError: the server took the request and gave no answer (it is killed).
            TimeoutError: the checker, once forked, gave no answer within ``timeout`` seconds (a
                loaded machine); its session is killed.  (The request itself waits for the
                server as :meth:`fork_runner` does: its start and answer are bounded there.)
        """
        request = json.dumps({"check": "user-namespace", "argv": argv}).encode()
        result_r, result_w = os.pipe()
        checker = None
        try:
            with self._lock:
                try:
                    pid = int(self._ask(request, result_w)["pid"])
                finally:
                    os.close(result_w)  # the checker holds the only write end: EOF once it ends
            try:  # a handle on the checker that no reuse of its pid can redirect
                checker = os.pidfd_open(pid)
            except OSError:
                checker = None  # it ended already (its answer is in the pipe) or no pidfds here
            deadline = time.monotonic() + timeout
            poller = select.poll()  # not select(): a busy service's descriptors pass 1024
            poller.register(result_r, select.POLLIN)
            data = b""
            while not data.endswith(b"\n") and len(data) < 16:
                left = deadline - time.monotonic()
                if left <= 0 or not poller.poll(left * 1000):
                    if checker is not None:  # its own session: the sandbox it started goes too
                        _kill_session(checker, pid)
                    raise TimeoutError(f"the user namespace check gave no answer in {timeout:.0f} s")
                chunk = os.read(result_r, 16)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(result_r)
            if checker is not None:
                os.close(checker)
        try:
            return int(data) if data.endswith(b"\n") else 1
        except ValueError:
            return 1

    def _ask(self, request: bytes, fd: int) -> dict:
        """Send ``request`` with ``fd`` attached and return the answer (the lock is held); a
        server that ended since the last request is started again, once (see :meth:`fork_runner`)."""
        for last in (False, True):
            sock = self._ensure()
            try:
                socket.send_fds(sock, [request], [fd])
            except (BrokenPipeError, ConnectionResetError) as exc:
                self._shut()  # it ended before it took the request: nothing was forked
                if last:
                    raise ServerUnavailable(f"the node runners' fork server is gone: {exc}") from exc
                continue
            try:
                answer = sock.recv(MESSAGE_LIMIT)
                if not answer:
                    raise ConnectionResetError("the node runners' fork server ended before it answered")
                reply = json.loads(answer)
                if "error" in reply:
                    raise ServerUnavailable(reply["error"])
                int(reply["pid"])
                return reply
            except ServerUnavailable:
                raise
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._shut(kill=True)
                raise OSError(f"the node runners' fork server gave no answer: {exc}") from exc
        raise AssertionError("unreachable")

    def _shut(self, kill: bool = False) -> None:
        if self._sock is not None:
            self._sock.close()  # the server reads the end of its socket and ends
            self._sock = None
        if self._proc is not None:
            if kill:
                self._proc.kill()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """End the server (the runners it forked go on)."""
        with self._lock:
            self._shut()


# ------------------------------------------------------------------------ the server


def write_marker(marker: str) -> bool:
    """Write ``marker`` into this process's initial environment, in place of the value
    :class:`RunnerForkServer` reserved for it; whether it fits and was written.

    ``/proc/<pid>/environ`` shows the environment a process started with, a block of memory in
    the process itself (``os.environ`` is a copy): only writing there, as ``setproctitle`` does
    for the command line, makes a forked process show its own marker.  The block keeps its
    size: the marker's entry ends early, and the rest of the room becomes an entry without
    ``=``, which readers of that file skip.
    """
    import ctypes

    data = marker.encode()
    if len(data) > MARKER_ROOM - 2:
        return False
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_void_p
    getenv.argtypes = [ctypes.c_char_p]
    address = getenv(NODE_MARKER.encode())
    if not address:
        return False
    ctypes.memmove(address, data + b"\0" + b"_" * (MARKER_ROOM - len(data) - 1), MARKER_ROOM)
    return True


def _marker_shows(marker: str) -> bool:
    with open("/proc/self/environ", "rb") as fh:
        return f"{NODE_MARKER}={marker}".encode() in fh.read().split(b"\0")


def _name(name: str) -> None:
    """Give this process the name ``ps``, ``top`` and psutil show (a fork keeps the server's
    command line)."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name)
    except OSError:
        pass


def _close_descriptors_from(low: int) -> None:
    """Close every descriptor from ``low`` up, as ``Popen(close_fds=True)`` does: the ones open
    (listed in ``/proc/self/fd``), not every number below the limit (Ray raises it past 10^6)."""
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd >= low:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already


def _reap(_signum=None, _frame=None) -> None:
    noderun.reap_ended()


def _runner(request: dict, log_fd: int, marked_fd: int) -> None:
    """The forked child (rule 3); never returns.  It closes ``marked_fd`` once its marker is
    written, which the server waits for before it answers."""
    code = 1
    try:
        write_marker(request["marker"])  # first: from here on, a stop by marker finds it
        os.write(marked_fd, b"m")
        os.close(marked_fd)
        os.setsid()  # before the signals: a Ctrl-C for the server's old group no longer reaches it
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        _close_descriptors_from(3)
        os.chdir(request["cwd"])
        _name(RUNNER_NAME)
        code = noderun.main([request["spec"]])
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _kill_session(pidfd: int, pid: int) -> None:
    """SIGKILL to the session of a checker that did not answer (rule 6): its group, while the
    pidfd says the checker itself has not ended (its pid, and so its group's, is still its own)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)  # raises once it ended: its pid may be another's
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _checker(argv: list[str], result_fd: int) -> None:
    """The forked user namespace checker (rule 6); never returns."""
    code = 1
    try:
        os.setsid()
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)  # its own children are its to wait for
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(null, std)
        os.dup2(result_fd, 3)
        _close_descriptors_from(4)
        os.chdir("/")
        code = noderun.check_user_namespace(argv)
        os.write(3, f"{code}\n".encode())
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _start_checker(request: dict, result_fd: int, sock: socket.socket) -> dict:
    """Rule 6: fork the checker; the answer (its pid)."""
    argv = request.get("argv")
    if request.get("check") != "user-namespace" or not (
        isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
    ):
        raise ValueError("a check request names the user-namespace check and the sandbox's argv")
    pid = os.fork()
    if pid == 0:
        sock.close()
        _checker(argv, result_fd)
    return {"pid": pid}


def _start_runner(request: dict, fds: list[int], sock: socket.socket) -> dict:
    """Rules 2-4: fork the runner of a request; the answer (its pid and start time)."""
    if len(fds) != 1 or not all(isinstance(request.get(k), str) for k in ("spec", "cwd", "marker")):
        raise ValueError("a request names a spec file, a folder and a marker and brings one log descriptor")
    if len(request["marker"].encode()) > MARKER_ROOM - 2:
        raise ValueError(f"the node's marker is longer than the {MARKER_ROOM - 2} bytes kept for it")
    marked_r, marked_w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        try:
            pid = os.fork()
        except OSError:
            os.close(marked_r)  # no runner: the pipe would stay open in the server
            os.close(marked_w)
            raise
        if pid == 0:
            sock.close()
            os.close(marked_r)
            _runner(request, fds[0], marked_w)
        os.close(marked_w)
        # the answer waits for the marker: a stop by marker right after it finds the runner
        os.read(marked_r, 1)  # empty if the runner ended first
        os.close(marked_r)
        reply = {"pid": pid, "start": process_start_time(pid, ended=True)}
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return reply


def serve(fd: int) -> None:
    """Answer requests on descriptor ``fd`` until the backend closes its end (rules 2, 4-6)."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # it ends with its socket
    sock.send(READY)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_LIMIT, 1)
        except ConnectionResetError:
            return
        if not data:
            for extra in fds:
                os.close(extra)
            return
        checking = False
        try:
            request = json.loads(data)
            checking = isinstance(request, dict) and "check" in request
            if checking:  # rule 6
                if len(fds) != 1:
                    raise ValueError("a check request brings one descriptor, the pipe for its answer")
                reply = _start_checker(request, fds[0], sock)
            else:
                reply = _start_runner(request, fds, sock)
        except (OSError, ValueError) as exc:
            what = "the user namespace check" if checking else "the node runner"
            reply = {"error": f"cannot fork {what}: {exc}"}
        finally:
            for extra in fds:
                os.close(extra)
        sock.send(json.dumps(reply).encode())


def main(argv: list[str]) -> int:
    """Rule 1: take the niceness, import, check the marker can be written, serve."""
    fd, nice = int(argv[0]), int(argv[1])
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass  # lowering it needs a privilege: keep what the process got
    probe = "probe"
    if not write_marker(probe) or not _marker_shows(probe) or not write_marker("_" * (MARKER_ROOM - 2)):
        print(
            "[ma_jupyter] the node runners' fork server cannot write a marker into its environment",
            file=sys.stderr,
            flush=True,
        )
        return 1
    import gc

    gc.freeze()  # what the server holds stays shared with its runners (no collection copies it)
    serve(fd)
    return 0


if __name__ == "__main__":
    # imported here, not above: the backend's side needs neither, the runners the server forks do
    from . import noderun
    from .procfs import process_start_time

    sys.exit(main(sys.argv[1:]))
