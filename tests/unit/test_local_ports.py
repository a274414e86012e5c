"""The local backend's ports: ``bind`` hands out only ports free on every address of the host."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.backends.local.backend import task_address
from ma_jupyter.config import default_specs
from ma_jupyter.modes.base import Placement, TaskSlot


def _placement(tasks: int = 1) -> Placement:
    spec = next(s for s in default_specs() if s.name == "cpu.small")
    slots = tuple(TaskSlot(role="worker", index=i, host="node-0", cpu_request=1) for i in range(tasks))
    return Placement(job_id="job-ports", spec=spec, tasks=slots)


def _bindable_everywhere(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _free_run(length: int) -> int:
    """The first port of ``length`` consecutive ports free on every address now (found by trying
    them, never fixed), below the kernel's ephemeral range."""
    for _ in range(200):
        first = random.randrange(20000, 32000 - length)
        if all(_bindable_everywhere(p) for p in range(first, first + length)):
            return first
    raise AssertionError("no run of free ports found")


def _hold_as_connection(stack: ExitStack, port: int) -> None:
    """Hold ``port`` on 127.0.0.1 the way an outgoing connection holds its local end."""
    server = stack.enter_context(socket.socket())
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = stack.enter_context(socket.socket())
    client.bind(("127.0.0.1", port))
    client.connect(server.getsockname())
    stack.enter_context(server.accept()[0])


def test_bind_never_hands_out_a_port_busy_on_another_address():
    first = _free_run(6)
    pool = list(range(first, first + 6))
    with ExitStack() as stack:
        # four of the six are held on 127.0.0.1 only: free on the task's 127.0.1.1, busy on 0.0.0.0
        for port in pool[:2]:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", port))
            listener.listen()
        for port in pool[2:4]:
            _hold_as_connection(stack, port)
        backend = LocalBackend(sandbox="symlink", inventory=["node-0"], port_range=(first, first + 6))
        bound = backend.bind(_placement(), reserve=True)
        assert sorted(bound.tasks[0].ports) == pool[4:]
        assert bound.tasks[0].address == task_address(0)
        # the range is used up (two busy, two reserved): the kernel picks, still free everywhere
        again = backend.bind(_placement(), reserve=True).tasks[0].ports
        assert not set(again) & set(pool)
        assert all(_bindable_everywhere(p) for p in again)
        # released ports come back
        backend.release(bound)
        assert sorted(backend.bind(_placement(), reserve=True).tasks[0].ports) == pool[4:]


def test_default_ports_stay_out_of_the_ephemeral_range():
    first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    backend = LocalBackend(sandbox="symlink", inventory=["node-0"])
    bound = backend.bind(_placement(3), reserve=True)
    ports = [p for t in bound.tasks for p in t.ports]
    assert len(set(ports)) == 6
    if first > 21000:  # room below the ephemeral range
        assert all(20000 <= p < first for p in ports), ports
    # a dry run reserves nothing
    assert {p for t in backend.bind(_placement(), reserve=False).tasks for p in t.ports} == {0}
