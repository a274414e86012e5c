"""Shared test helpers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Call ``predicate`` until it returns something truthy and return that; AssertionError on timeout.

    Exceptions raised by the predicate count as "not yet" until the timeout, then propagate.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # not ready yet (e.g. a file that does not exist yet)
            last_error = exc
        if time.monotonic() >= deadline:
            if last_error is not None:
                raise AssertionError(f"condition not met within {timeout} s") from last_error
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def writable_dir(path, *, parents: bool = False):
    """Make ``path`` a folder any job may write to, as a user gives a folder to the account
    their jobs run as (a root service runs root's jobs as ``nobody``); returns ``path``."""
    path.mkdir(parents=parents, exist_ok=True)
    path.chmod(0o777)
    return path


def stop_every_job(supervisor, timeout: float = 60.0) -> None:
    """Teardown of a supervisor whose loop a test drives itself: stop its queued and running jobs
    and tick until every one has ended (or ``timeout`` seconds have passed)."""
    from ma_jupyter.models import JobStatus

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = supervisor.store.by_status(JobStatus.running, JobStatus.queued)
        if not live:
            return
        for job in live:
            supervisor.request_stop(job.id)
        supervisor.tick()
        supervisor.wait_idle()


# A tqdm-style bar: one line of 400 redraws (about 14,000 characters) ended by the result.
PROGRESS_BAR = (
    "import sys\n"
    "for i in range(1, 401):\n"
    "    sys.stderr.write(f'\\rtraining {i:3d}/400 |' + '#' * (i // 20) + ' ' * (20 - i // 20) + '|')\n"
    "    sys.stderr.flush()\n"
    "sys.stderr.write(' loss=0.0123\\n')\n"
    "print('after the bar', flush=True)\n"
)
BAR_FINAL = "training 400/400 |####################| loss=0.0123"


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``16m``) mounted at ``folder`` (made if missing), as a small disk the
    test fills; unmounted at the end, once what used it (a service stopped first) let go of it,
    lazily after 10 s.  Needs root (the callers skip without it)."""
    folder.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(folder)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            subprocess.run(["umount", "-l", str(folder)])


#: what a command line of ours never needs to start (tests/unit/test_cli_imports.py,
#: tests/service/test_cli.py) (the notebook side, Jupyter, the service)
CLI_HEAVY_MODULES = (
    "IPython",
    "ipywidgets",
    "ipykernel",
    "jupyter_core",
    "jupyter_client",
    "jupyter_server",
    "fastapi",
    "starlette",
    "uvicorn",
    "ray",
    "ma_jupyter.service",
    "ma_jupyter.backends",
    "ma_jupyter.nodehost",
    "ma_jupyter.frontends.notebook",
    "ma_jupyter.client.kernelspec",
    # the client's HTTP is the standard library's (client/transport.py)
    "requests",
    "urllib3",
    "http.client",  # with ssl and the email package: the transport reads HTTP itself
    "ssl",
    "email",
    # a plain client reads answers without the pydantic models (client/plain.py)
    "pydantic",
    "pydantic_core",
    "ma_jupyter.models",
    # standard-library modules only some commands need, imported where they are used: starting
    # a service or probing accelerators (subprocess), digesting a tree (hashlib)
    "subprocess",
    "hashlib",
    # the service's configuration (its dataclasses import inspect, ast, dis...) and the card
    # probes: a client finds its service through ma_jupyter.statehome
    "ma_jupyter.config",
    "ma_jupyter.accelerators",
    "dataclasses",
    "inspect",
    # argparse sizes its help with shutil (and its bz2, lzma) at each option added: the CLI's
    # formatter finds the width itself (options.HelpFormatter)
    "shutil",
    # typing (~5 ms): the modules on a command line's path test `TYPE_CHECKING = False` instead
    "typing",
    # the job folder's layout and the untrusted-file reader: only a local log read needs them
    "ma_jupyter.untrusted",
    "ma_jupyter.jobdir",
)


def imported_heavy(modules: Iterable[str], heavy: Iterable[str] = CLI_HEAVY_MODULES) -> list[str]:
    """The modules among ``modules`` that are ``heavy`` or inside one of them (sorted)."""
    heavy = tuple(heavy)
    return sorted(m for m in modules if m in heavy or m.startswith(tuple(f"{h}." for h in heavy)))
