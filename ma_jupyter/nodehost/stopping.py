"""A stop's SIGTERM reaches a node's own processes exactly once: from its runner, or else from
the backend.

A stop (the job cancelled, preempted, moved off a drained or faulty node) TERMs the node's
runner, which relays the signal to the node's processes so training code can save a checkpoint
(:mod:`.noderun` rule 4).  A runner that does not answer (frozen: the very reason a node is
found faulty) relays nothing; the backend then delivers the signal itself.

Rules, in order:

1. Who relays is decided by a claim: the node's ``stop-claim`` file (:attr:`NodeDir.stop_claim
   <ma_jupyter.jobdir.NodeDir.stop_claim>`), created exclusively (``O_EXCL``) by the first of the
   runner (in its signal handler) and the backend (:func:`claim`), holding who made it.  Only the
   maker of the claim sends SIGTERM to the node's processes; the other sends nothing, so no
   process gets the stop's SIGTERM twice.  The claim is removed before each attempt (it is one of
   :attr:`NodeDir.STALE <ma_jupyter.jobdir.NodeDir.STALE>`).
2. The backend TERMs the runner's process group, then waits up to :data:`RELAY_WAIT` seconds (half
   the grace period when that is shorter) for the runner's claim (or the runner's end); past
   that it claims the stop itself and TERMs
   :func:`targets`, then waits the grace period as usual (ending early once none of them is
   left), then KILLs everything of the node as before.
3. :func:`targets`: every process below the runner but, in a bubblewrap node, the sandbox's own
   processes: the runner's children (bubblewrap outside, a helper entering the node's
   namespaces) and their children (bubblewrap as the pid namespace's first process: signalling
   it would end the node at once, without a grace period).  In the symlink mode every process
   below the runner is the node's.

Standard library only (the runner imports it).
"""

from __future__ import annotations

import os
from pathlib import Path

from .procfs import descendants

#: seconds the backend gives a runner to relay a stop before it delivers it itself (the runner
#: relays within milliseconds; a runner that lets this pass is frozen or overloaded, and the
#: training processes need the rest of the grace period to save)
RELAY_WAIT = 2.0

RUNNER, BACKEND = "runner", "backend"


def claim(path: Path, who: str) -> bool:
    """Claim the stop's relay for ``who`` (:data:`RUNNER` or :data:`BACKEND`): True when this
    call made the claim, or ``who`` made it before (a repeated signal to the runner); False
    when the other side holds it.  On an error (a full disk, an unreadable claim) the runner
    relays as it always did and the backend leaves the relay to it.

    The claim appears whole: written to a file of the caller's own first, then linked to its
    name, which fails when the name exists (never an empty claim the other side could misread).
    """
    # a fresh name, made only if it does not exist (O_EXCL): nothing planted there is written
    own = path.with_name(f"{path.name}.{who}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, who.encode())
        finally:
            os.close(fd)
        os.link(own, path)
    except FileExistsError:
        held = holder(path)
        # a claim that cannot be read (not a regular file of ours) leaves the relay to the
        # runner, as before there were claims
        return held == who or (held is None and who == RUNNER)
    except OSError:
        return who == RUNNER
    finally:
        try:
            os.unlink(own)
        except OSError:
            pass
    return True


def holder(path: Path) -> str | None:
    """Who claimed the stop (:data:`RUNNER`, :data:`BACKEND`), or None: no claim (or one this
    cannot read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, 16).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if data in (RUNNER, BACKEND) else None


def targets(runner: int, sandbox: str) -> list[int]:
    """The node's processes a stop signal is meant for (rule 3), below the runner ``runner``."""
    below = descendants(runner)
    if sandbox != "bubblewrap":
        return [pid for pid, _, state in below if state != "Z"]
    outer = {pid for pid, parent, _ in below if parent == runner}
    first = {pid for pid, parent, _ in below if parent in outer}
    return [pid for pid, _, state in below if state != "Z" and pid not in outer and pid not in first]
