"""Shipping a job's algorithm folder to the Ray nodes, so code needs no shared filesystem.

The service packs the folder once per attempt (:func:`pack`: a gzipped tar of its contents),
puts the archive in Ray's object store, and each node agent unpacks it (:func:`unpack`) into the
node's own folder on its Ray node, which the node's sandbox then shows at
``/workspace/algorithm`` as it would show the folder itself.  This is what Ray's
``runtime_env.working_dir`` does, kept inside the platform so the same sandbox, mounts and
modes apply.  Datasets, models, outputs and volumes are not shipped: their paths must be the
same on every Ray node (shared storage).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from ... import foldersize
from ...errors import InvalidSpec

#: the largest algorithm folder shipped with a job; bigger data belongs in a dataset on storage
#: every Ray node mounts
MAX_BYTES = 256 * 1024 * 1024
#: where, below a node's own folder, its copy of the algorithm folder goes
FOLDER = "algorithm"


def folder_size(folder: str | Path, limit: int = MAX_BYTES) -> int:
    """The bytes of the regular files below ``folder`` (symlinks not followed).

    Raises:
        InvalidSpec: the folder is bigger than ``limit``: it is not shipped.
        FolderRefused: the walk refuses it (a chain of folders too deep, too many entries):
            nor is it then (tarfile's walk recurses once per level).
    """
    total = foldersize.folder_size([folder], limit=limit).bytes
    if total > limit:
        raise InvalidSpec(
            f"the algorithm folder {folder} holds more than {limit // (1024 * 1024)} MB: the "
            "Ray backend ships it to every node; keep code there and put data in a dataset "
            "on storage every Ray node mounts",
            field="algorithm",
        )
    return total


def pack(folder: str | Path) -> bytes:
    """The contents of ``folder`` as a gzipped tar (symlinks kept as links, never followed)."""
    folder_size(folder)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for entry in sorted(os.listdir(folder)):
            tar.add(os.path.join(folder, entry), arcname=entry, recursive=True)
    return buffer.getvalue()


def unpack(archive: bytes, target: str | Path) -> None:
    """Replace ``target`` with the archive's contents, made beside it and renamed when complete.

    Extracted with tarfile's ``data`` filter: no absolute path, no member or link leaving the
    folder, no device file, no set-id bit.
    """
    target = Path(target)
    partial = target.with_name(target.name + ".partial")
    foldersize.remove_tree(partial)
    partial.mkdir(parents=True)
    os.chmod(partial, 0o755)  # the node's account reads it through the sandbox's bind
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            tar.extractall(partial, filter="data")
    except BaseException:
        foldersize.remove_tree(partial)
        raise
    foldersize.remove_tree(target)
    os.replace(partial, target)
