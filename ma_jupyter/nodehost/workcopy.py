"""A node's working copy of the algorithm folder (``/workspace/algorithm``).

Contract:

1. The copy is made once per node, by the node's runner in its sandbox as the job's account, at
   its first launch (:func:`copy_needed`: the first phase fills it; :func:`copy_args` in the
   symlink mode); the runner records its end (``NodeDir.workdir_record``), and only a recorded
   copy counts as made (:func:`working_copy_made`).
2. A later attempt keeps a complete copy as the earlier one left it; an incomplete one, or one
   whose folder a job replaced, is removed without following symlinks and made again
   (:func:`prepare_working_copy`).
3. After the node's last phase, :func:`export_argv` keeps what the job wrote there in
   ``workdir/`` of its outputs (:mod:`ma_jupyter.nodeside.workdir`), in the node's sandbox.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..foldersize import remove_tree
from ..nodeside.workdir import write_record
from ..untrusted import make_dirs
from .bwrap import bwrap_argv
from .mounts import Mount
from .view import PACKAGE_DIR, NodeView, to_host

#: the helper that makes a node's working copy and keeps what the job wrote there
WORKDIR_HELPER = str(Path(PACKAGE_DIR) / "nodeside" / "workdir.py")


def working_copy_made(view: NodeView) -> bool:
    """Whether the node's working copy is complete (the runner recorded it)."""
    return view.nd.workdir_record.exists()


def prepare_working_copy(view: NodeView, mount: Mount, job_dir: Path, owner: tuple[int, int] | None) -> None:
    """Keep a complete working copy as the earlier attempt left it; otherwise (first launch, or a
    copy that did not finish) start from an empty folder for the runner to fill.  An empty
    working folder (no algorithm) is complete as soon as it exists."""
    source = Path(mount.source)
    if working_copy_made(view):
        if source.is_dir() and not source.is_symlink():
            return
        view.nd.workdir_record.unlink()  # recorded, but gone since: made again
    if os.path.lexists(source):
        done = remove_tree(source)  # follows no symlink, any depth
        if not done.complete:
            raise OSError(f"cannot remove the earlier working copy {source}: {done.failed[:3]}")
    make_dirs(source, trusted=job_dir, owner="a job", chown=owner)
    if mount.copy_of is None:
        # complete as it is: what changes in it from now on is the job's
        write_record(view.nd.workdir_record, time.time_ns())


def copy_needed(view: NodeView) -> bool:
    """Whether the node's working copy must be filled before its first phase (its first launch,
    or a copy that did not finish)."""
    mount = view.working_copy
    return mount is not None and mount.copy_of is not None and not working_copy_made(view)


def copy_args(view: NodeView) -> list[str]:
    """Symlink mode: ``[original, working copy, limit]`` for the node runner, which copies itself
    (it runs as the job's account there: the service's own)."""
    mount = view.working_copy
    assert mount is not None and mount.copy_of is not None
    return [mount.copy_of, mount.source, str(view.copy_limit)]


def export_argv(view: NodeView) -> list[str] | None:
    """The phase that keeps what the job wrote in its working copy in :attr:`NodeView.export_to`
    (run by the node runner after the node's last phase, in its sandbox); the runner appends the
    time the copy was complete.  None without a working copy."""
    mount = view.working_copy
    if mount is None or view.export_to is None:
        return None
    helper = [view.image.python, "-I", "-S", WORKDIR_HELPER, "export", mount.target, view.export_to]
    if view.sandbox == "bubblewrap":
        return bwrap_argv(view, helper)
    return [to_host(view, a) for a in helper[:-2]] + [mount.source, to_host(view, view.export_to)]
