"""The processes of a node on this host: exit-code files, the processes carrying a node's marker,
and the watcher that notices a runner's end (a process's start time and marker: :mod:`.procfs`)."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from ..errors import RefusedFile
from ..untrusted import read_small
from .procfs import is_marked


def read_exit_code(path: Path) -> int | None:
    """The integer in an exit-code file, or None while it does not exist (or is not a small
    regular file: it is read as untrusted, never blocking on a FIFO or following a symlink)."""
    try:
        return int(read_small(path.parent, path.name, limit=64).strip())
    except (OSError, ValueError, RefusedFile):
        return None


def marked_processes(marker: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``MA_NODE_RUN=<marker>``."""
    found = []
    for pid in psutil.pids():
        if pid == os.getpid() or not is_marked(pid, marker):
            continue
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def process_fd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` ends (``pidfd_open``); None when
    there is no such process, or no pidfds here (Linux before 5.3).  The caller closes it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class ExitWatcher:
    """Calls ``wake`` (on its own thread) when a watched process ends.

    One thread waits on a pidfd per process (``epoll``), so a node's end reaches the service in
    a millisecond instead of at its next poll, at no cost while nothing ends.  Where pidfds are
    missing (Linux before 5.3) it watches nothing: the service's own polling still sees every end.
    """

    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._watched: dict[int, int] = {}  # pidfd -> pid
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ma-exit-watcher", daemon=True)
        self._thread.start()

    def add(self, pid: int) -> None:
        """Watch ``pid`` (a process that already ended wakes at once)."""
        fd = process_fd(pid)
        if fd is None:  # gone already (the poll sees it), or no pidfds here
            self._wake()
            return
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            self._watched[fd] = pid
            self._epoll.register(fd, select.EPOLLIN)

    def close(self) -> None:
        """Stop watching; the thread ends within its poll timeout."""
        with self._lock:
            self._closed = True

    def _run(self) -> None:
        while True:
            events = self._epoll.poll(0.5)  # the timeout only lets close() end the thread
            with self._lock:
                for fd, _ in events:
                    self._epoll.unregister(fd)
                    self._watched.pop(fd, None)
                    os.close(fd)
                if self._closed:
                    for fd in self._watched:
                        os.close(fd)
                    self._watched.clear()
                    self._epoll.close()
                    return
            if events:
                self._wake()
