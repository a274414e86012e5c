"""A node's own user namespace: the kernel's bound on its processes (:mod:`.noderun` rule 1b).

As root, in bubblewrap, where the backend found it works (:func:`check_user_namespace`), the
runner makes the node a user namespace of its own and starts each phase in it with the node's
``RLIMIT_NPROC``; the kernel counts that limit per (user namespace, uid) since Linux 5.14, so the
node's count is its own, not that of every job running as the same account (``nobody``).

Contract:

1. :func:`node_user_namespace` makes the namespace (every uid and gid mapped to itself: files
   keep their owners) and closes it to further user namespaces; it forks a helper, so it is
   called before the runner starts any thread.  None where none can be made, or where it could
   not be closed: then the watchdog (:mod:`.watchdog`) is the node's bound.
2. :func:`enter_node` is what each phase's first process runs before its program: die with the
   runner, then (with a namespace) enter it with the node's process limit.  Everything it needs
   is looked up before the fork.
3. :func:`check_user_namespace` is the backend's one-time probe (in a process the runners'
   fork server forks, :mod:`.forkserver` rule 6, else ``python -m
   ma_jupyter.nodehost.noderun --check-user-namespace ARGV...``): 0 when a sandbox can start in
   such a namespace here.

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
from collections.abc import Callable

CLONE_NEWUSER = 0x10000000
#: the user namespaces a process's own user namespace may still hold (a per-namespace count)
USERNS_LIMIT = "/proc/sys/user/max_user_namespaces"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: the argument that asks the runner's ``main`` whether nodes can have user namespaces of their own
CHECK_USER_NAMESPACE = "--check-user-namespace"


def prctl(option: int, value: int) -> None:
    """``prctl(option, value)`` for this process; nothing where the call does not exist."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the runner still works, with less cleanup
        pass


def node_user_namespace() -> int | None:
    """A new user namespace mapping every uid and gid to itself, as a descriptor to ``setns``
    into; None where none can be made (not root, or the kernel refuses).

    A helper process unshares it and waits while this (privileged) process writes its maps; the
    namespace outlives the helper through the descriptor.  Ids mapped to themselves keep every
    file's owner and the account's permissions as they are; only the kernel's per-user counts
    (``RLIMIT_NPROC``) start from zero in it.

    Once the maps are written the helper (root of the new namespace, with every capability in
    it) sets the namespace's own ``/proc/sys/user/max_user_namespaces`` to 0: no process of the
    node can then make a user namespace (``unshare -U`` fails with ENOSPC), in which it would be
    root and could mount a tmpfs the node's memory watchdog never sees
    (:func:`.watchdog.tmpfs_held`).  No one in the node can raise it again: that takes
    CAP_SYS_RESOURCE in the namespace, which ``--cap-drop ALL`` and ``setpriv`` take from every
    process there.  A namespace whose limit cannot be set is not used (None).
    """
    if os.geteuid() != 0:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the helper: unshare, say so, wait until the maps are written, close the door
        try:
            os.close(ready_r)
            os.close(done_w)
            os.write(ready_w, b"1" if libc.unshare(CLONE_NEWUSER) == 0 else b"0")
            if os.read(done_r, 1) == b"1":
                # the sysctl a process reads and writes is its own user namespace's; root of the
                # host (mapped now) passes /proc/sys's owner check, the namespace's caps the rest
                with open(USERNS_LIMIT, "w") as fh:
                    fh.write("0\n")
                os.write(ready_w, b"1")
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    fd = None
    try:
        if os.read(ready_r, 1) == b"1":
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as fh:
                    fh.write("0 0 4294967295\n")
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            os.write(done_w, b"1")
            if os.read(ready_r, 1) != b"1":  # the limit is not set: the namespace is no barrier
                os.close(fd)
                fd = None
    except OSError:
        if fd is not None:
            os.close(fd)
        fd = None
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
    return fd


def enter_node(userns: int | None, max_processes: int) -> Callable[[], None]:
    """What each phase's first process runs before its program (rule 2): die with the runner
    (SIGKILL when it dies: no orphaned node), and (with the node's user namespace) enter it with
    the node's process limit.

    Any namespace the host owns (one made outside the node) must be joined before that
    ``setns``: inside the node's user namespace no process can join one."""

    # looked up here, not in the forked child (where another thread may have held a lock)
    setns = ctypes.CDLL(None, use_errno=True).setns if userns is not None else None

    def enter() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if setns is None:
            return
        if setns(userns, CLONE_NEWUSER) != 0:
            os.write(2, b"[ma_jupyter] cannot enter the node's user namespace\n")
            os._exit(126)
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))

    return enter


def check_user_namespace(argv: list[str]) -> int:
    """0 when a sandbox can start in a user namespace of its own here (rule 3): one is made and
    the sandbox ``argv`` (:func:`.bwrap.user_namespace_probe_argv`: a fresh ``/proc`` and
    ``/dev``) starts in it (a host whose ``/proc`` has covered paths, as some containers have,
    refuses that in a user namespace); 1 otherwise."""
    userns = node_user_namespace()
    if userns is None:
        return 1
    try:
        done = subprocess.run(argv, preexec_fn=enter_node(userns, 64), capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 1
    return 0 if done.returncode == 0 else 1
