"""The kernel bridge and the Ray node's kernel relay trust nothing in the kernel folder (the job's
processes write there): rules 1 to 3 of ``kernel_access.py``, which both use, as a hostile job
would plant files, on real files and sockets."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
import zmq

from ma_jupyter import kernel_access
from ma_jupyter.jobdir import CONNECTION_FILE

KEY = "k3y"


def test_a_planted_link_is_never_written_through(tmp_path):
    folder = tmp_path / "kernel"
    folder.mkdir()
    target = tmp_path / "precious"
    target.write_text("the user's file\n")
    (folder / CONNECTION_FILE).symlink_to(target)  # the job's link where the file goes
    fd = kernel_access.open_folder(folder)
    try:
        assert kernel_access.write_connection(fd, KEY) is False  # refused, as an existing file
    finally:
        os.close(fd)
    assert target.read_text() == "the user's file\n"
    assert sorted(p.name for p in folder.iterdir()) == [CONNECTION_FILE]  # no temporary left
    # a folder swapped for a link is not entered
    (tmp_path / "linked").symlink_to(folder)
    with pytest.raises(OSError):
        kernel_access.open_folder(tmp_path / "linked")


def test_the_connection_file_is_written_whole_once(tmp_path):
    fd = kernel_access.open_folder(tmp_path)
    try:
        assert kernel_access.write_connection(fd, KEY) is True
        assert kernel_access.write_connection(fd, "other") is False  # never replaced
    finally:
        os.close(fd)
    written = json.loads((tmp_path / CONNECTION_FILE).read_text())
    assert written["key"] == "k3y" and written["transport"] == "ipc"


def test_sockets_are_reached_as_the_inodes_they_are_never_through_a_planted_link(tmp_path):
    folder = tmp_path / "kernel"
    folder.mkdir()
    elsewhere = tmp_path / "someone-elses.sock"
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(elsewhere))
    (folder / "k-1").symlink_to(elsewhere)  # the job points the bridge at another socket
    (folder / "k-2").write_text("not a socket")
    ctx = zmq.Context()
    kernel = ctx.socket(zmq.REP)
    kernel.bind(f"ipc://{folder}/k-3")  # the kernel's own socket
    fd = kernel_access.open_folder(folder)
    deadline = time.monotonic() + 5
    opened = []
    try:
        for name in ("k-1", "k-2"):
            with pytest.raises(LookupError, match="not the kernel's socket"):
                kernel_access.open_socket(fd, name, deadline)
        with pytest.raises(LookupError, match="did not make its socket k-4"):
            kernel_access.open_socket(fd, "k-4", time.monotonic() + 0.2)
        for name in ("k-9", "../kernel/k-3", "/tmp/k-3"):  # only the kernel's own names
            with pytest.raises(LookupError, match="not one of the kernel's sockets"):
                kernel_access.open_socket(fd, name, deadline)
        opened.append(kernel_access.open_socket(fd, "k-3", deadline))
        endpoint = f"ipc://{kernel_access.socket_path(opened[0])}"
        assert endpoint.startswith("ipc:///proc/self/fd/")
        client = ctx.socket(zmq.REQ)
        client.connect(endpoint)
        client.send(b"ping")
        assert kernel.poll(10_000) and kernel.recv() == b"ping"
        kernel.send(b"pong")
        assert client.recv() == b"pong"
        client.close(0)
    finally:
        for each in [fd, *opened]:
            os.close(each)
        kernel.close(0)
        ctx.term()
        other.close()


def test_a_hard_link_to_another_accounts_socket_is_refused(tmp_path):
    """Where ``fs.protected_hardlinks`` is 0 a job may hard-link a socket it does not own into
    its kernel folder (no link to follow, and a socket): it is still not the job's."""
    job = 65534  # the job's account (nobody): the platform gives it the kernel folder
    folder = tmp_path / "kernel"
    folder.mkdir()
    os.chown(folder, job, job)
    elsewhere = tmp_path / "roots.sock"
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(elsewhere))  # this process's account's socket (root, as the relay runs)
    os.link(elsewhere, folder / "k-1")  # the job's hard link to it
    own = socket.socket(socket.AF_UNIX)
    own.bind(str(folder / "k-2"))
    os.chown(folder / "k-2", job, job)  # the kernel's own socket, made by the job's account
    fd = kernel_access.open_folder(folder)
    opened = []
    try:
        with pytest.raises(LookupError, match="not the kernel's socket"):
            kernel_access.open_socket(fd, "k-1", time.monotonic() + 5)
        with pytest.raises(LookupError, match="not the kernel's socket"):  # a stated owner too
            kernel_access.open_socket(fd, "k-1", time.monotonic() + 5, owner=job)
        opened.append(kernel_access.open_socket(fd, "k-2", time.monotonic() + 5))
        with pytest.raises(LookupError, match="not the kernel's socket"):  # not the stated owner
            kernel_access.open_socket(fd, "k-2", time.monotonic() + 5, owner=job + 1)
    finally:
        for each in [fd, *opened]:
            os.close(each)
        other.close()
        own.close()
