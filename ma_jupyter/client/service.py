"""The job service of this home seen from a client: its runtime file, starting it on first use
(under a lock, so concurrent clients start one service), and stopping it."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ma_jupyter

from .. import statehome
from ..errors import BackendUnavailable
from ..procstat import STARTTIME, STATE, stat_fields

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    import subprocess
    from typing import Any

START_TIMEOUT = 30.0  # seconds a fresh service gets to answer /health
AUTOSTART_LOCK = "autostart.lock"

# Services this process started, by pid: whoever shuts one down reaps it (no zombie is left).
STARTED: dict[int, subprocess.Popen] = {}
STARTED_LOCK = threading.Lock()


def read_runtime() -> dict[str, Any] | None:
    try:
        data = json.loads(statehome.runtime_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not data.get("url") or not data.get("token"):
        return None
    return data


def runtime_alive(runtime: dict[str, Any]) -> bool:
    """Whether the process the runtime file names still runs, that very process: its pid with
    its recorded start (``started``: clock ticks since boot).  A file without them: False."""
    pid, started = runtime.get("pid"), runtime.get("started")
    if not isinstance(pid, int) or not isinstance(started, int):
        return False
    fields = stat_fields(pid)
    return bool(fields) and fields[STATE] != b"Z" and int(fields[STARTTIME]) == started


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    with STARTED_LOCK:
        proc = STARTED.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    return not fields or fields[STATE] != b"Z"  # unreadable: it exists (the signal reached it)


def start_service(
    probe: Callable[[str, str], dict[str, Any] | None], args: Sequence[str] = ()
) -> dict[str, Any]:
    """Start the service under the autostart lock (or find the one another client started).

    Args:
        probe: ``probe(url, token)``, the service's /health answer or None.
        args: options of ``python -m ma_jupyter.service`` (e.g. ``--backend ray --ray-address A``).

    Returns:
        The runtime record of the answering service (url, token, pid).
    """
    home = statehome.home()
    deadline = time.monotonic() + START_TIMEOUT
    with open(home / AUTOSTART_LOCK, "w") as lock:
        # Blocking is right here: whoever holds the lock is starting the very service we need.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            runtime = read_runtime()
            if runtime and probe(runtime["url"], runtime["token"]):
                return runtime
            log_path = statehome.service_log()
            env = {**os.environ, statehome.ENV_HOME: str(home)}
            # the folder the service is started for: its jobs may mount from it by default
            env.setdefault(statehome.ENV_PROJECT_DIR, os.getcwd())
            # The service must import this very package, also when it is used from a source
            # tree that is not installed and the caller's directory is elsewhere.
            package_root = str(Path(ma_jupyter.__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
            # the service's log may quote jobs' specs: the owner's alone, like the rest of the home
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            import subprocess  # only to start a service, not in every call of the client

            with os.fdopen(log_fd, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ma_jupyter.service", *args],
                    env=env,
                    cwd=str(home),  # never pin (or depend on) the caller's working directory
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # jobs and the service outlive this kernel
                    close_fds=True,
                )
            with STARTED_LOCK:
                STARTED[proc.pid] = proc
            exited_at = None
            while time.monotonic() < deadline:
                runtime = read_runtime()
                if runtime and (runtime.get("pid") == proc.pid or exited_at is not None):
                    # ours, or ours gave way to a service started outside this lock
                    if probe(runtime["url"], runtime["token"]):
                        return runtime
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.monotonic()
                if exited_at is not None and time.monotonic() - exited_at > 3.0:
                    break
                time.sleep(0.02)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            last = tail(log_path)
            raise BackendUnavailable(
                f"the job service did not start within {START_TIMEOUT:.0f} s (exit code {proc.poll()}); "
                f"see its log {log_path}" + (f": {last}" if last else "")
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stop_service_process(pid: int, timeout: float) -> None:
    """SIGTERM the service, SIGKILL it after ``timeout``, and reap it if this process started it."""
    import signal  # here: only stopping a service needs it, not every command line's import

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with STARTED_LOCK:
        proc = STARTED.pop(pid, None)
    if proc is not None:
        proc.wait(timeout=10)
    else:
        end = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.02)


def tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])
