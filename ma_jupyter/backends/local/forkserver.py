"""The node runners' fork server: a process that has already imported the node runner and forks
one for each node the local backend starts.

Started as ``python -m ma_jupyter.backends.local.noderun``, every node runner paid for an
interpreter and its imports (about 60 ms of CPU and of the node's start, on every node of every
job); a fork of a process that has them costs about a millisecond.  This is what Ray does with
its prestarted workers, and :mod:`multiprocessing`'s forkserver for its children.

The contract between :class:`RunnerForkServer` (in the service, or a Ray node's agent) and the
server process (``python -m ma_jupyter.backends.local.forkserver FD``):

1. the backend starts the server with one end of a ``SOCK_SEQPACKET`` socket pair as descriptor
   FD, with the environment a runner needs (the package importable, its bytecode cache); the
   server imports the node runner, says ``ready``, then answers requests one at a time; a
   server that cannot start or be reached forks nothing, and the backend starts the runner as
   a process of its own (``python -m ma_jupyter.backends.local.noderun``) instead;
2. a request is one message: JSON ``{"spec": <node-run.json>, "cwd": <node folder>}`` with the
   node's log descriptor attached (``SCM_RIGHTS``); the answer is one message, JSON ``{"pid": N,
   "start": <its start time>}``, or ``{"error": "..."}`` when no runner was forked;
3. the forked runner is what ``Popen`` started before: its own session, stdin ``/dev/null``,
   stdout and stderr the log, the node folder as working directory, no other descriptor, every
   signal at its default and none blocked, named :data:`RUNNER_NAME`; it runs
   :func:`noderun.main` and ends with its exit code without the interpreter's teardown
   (``os._exit``);
4. the server reaps each runner as soon as it ends (``SIGCHLD``), so an ended runner never
   lingers as a zombie; the start time in the answer is read before the runner can be reaped
   (``SIGCHLD`` is blocked meanwhile), so it names that process even if it ended already;
5. the server ends when the backend's end of the socket closes (the service or the agent ended,
   or closed it); the runners it forked go on, each in its own session, as they did before.

A runner is found again by its pid and start time (the run record), and its phases by the marker
in their environment; the runner's own environment is the server's (see ``LocalBackend``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable

#: bytes a request or an answer may take (both are a few hundred)
MESSAGE_LIMIT = 1 << 16
#: seconds to wait for the server's answer before giving the launch up
ANSWER_TIMEOUT = 30.0
#: seconds a starting server may take to import the node runner and say it is ready
START_TIMEOUT = 60.0
#: the name of a forked runner (its command line stays the server's)
RUNNER_NAME = "ma-noderun"
#: the server's first message: its imports are done
READY = b"ready"


class ServerUnavailable(OSError):
    """The fork server cannot be started or reached; no runner was forked (the caller may start
    one the slow way)."""


class RunnerForkServer:
    """The backend's side: starts the server on first use, forks runners through it.

    Args:
        env: makes the environment of the server (and so of every runner it forks), at each
            start of the server.
    """

    def __init__(self, env: Callable[[], dict[str, str]]):
        self._env = env
        self._lock = threading.Lock()  # one request at a time: an answer belongs to its request
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=self._env(),
                cwd="/",
            )
        except OSError as exc:
            ours.close()
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
            self._shut()
            raise ServerUnavailable("the node runners' fork server did not start (its error is in this log)")
        ours.settimeout(ANSWER_TIMEOUT)
        return ours

    def fork_runner(self, spec_file: str, cwd: str, log_fd: int) -> tuple[int, float | None]:
        """Fork a runner for the node described by ``spec_file``; its pid and start time.

        A server that ended since the last request is started again, once.

        Raises:
            ServerUnavailable: the server cannot be started or reached; no runner was forked.
            OSError: the server took the request and gave no answer: a runner may have been
                forked (the caller stops the node by its marker).
            RuntimeError: the server answered that it could not fork.
        """
        request = json.dumps({"spec": spec_file, "cwd": cwd}).encode()
        with self._lock:
            for last in (False, True):
                sock = self._ensure()
                try:
                    socket.send_fds(sock, [request], [log_fd])
                except (BrokenPipeError, ConnectionResetError) as exc:
                    self._shut()  # it ended before it took the request: nothing was forked
                    if last:
                        raise ServerUnavailable(f"the node runners' fork server is gone: {exc}") from exc
                    continue
                try:
                    answer = sock.recv(MESSAGE_LIMIT)
                except OSError:
                    self._shut()
                    raise
                if not answer:
                    self._shut()
                    raise ConnectionResetError("the node runners' fork server ended before it answered")
                reply = json.loads(answer)
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return int(reply["pid"]), reply.get("start")
        raise AssertionError("unreachable")

    def _shut(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the server reads the end of its socket and ends
            self._sock = None
        if self._proc is not None:
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


def _name(name: str) -> None:
    """Give this process the name ``ps``, ``top`` and psutil show (a fork keeps the server's
    command line)."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name)
    except OSError:
        pass


def _reap(_signum=None, _frame=None) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _runner(request: dict, log_fd: int, sock: socket.socket) -> None:
    """The forked child (rule 3); never returns."""
    code = 1
    try:
        sock.close()
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)
        os.chdir(request["cwd"])
        _name(RUNNER_NAME)
        code = noderun.main([request["spec"]])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(fd: int) -> None:
    """Answer requests on descriptor ``fd`` until the backend closes its end (rules 2, 4, 5)."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, _reap)
    # a Ctrl-C meant for a service in a terminal: the server ends with its socket instead
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
        try:
            request = json.loads(data)
            if (
                len(fds) != 1
                or not isinstance(request.get("spec"), str)
                or not isinstance(request.get("cwd"), str)
            ):
                raise ValueError("a request names a spec file and a folder and brings one log descriptor")
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            try:
                pid = os.fork()
                if pid == 0:
                    _runner(request, fds[0], sock)
                reply = {"pid": pid, "start": process_start_time(pid)}
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        except (OSError, ValueError) as exc:
            reply = {"error": f"cannot start the node runner: {exc}"}
        finally:
            for extra in fds:
                os.close(extra)
        sock.send(json.dumps(reply).encode())


if __name__ == "__main__":
    # imported here, not above: the backend's side needs neither, the server forks runners that do
    from . import noderun
    from .processes import process_start_time

    serve(int(sys.argv[1]))
