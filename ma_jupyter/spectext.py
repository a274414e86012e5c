"""The text formats of the job fields people type on one line: a batch task, an image, a mount.

One owner for the three formats every front end reads and writes: the job options of
``ma-jupyter submit`` and ``%%ma_train`` (:mod:`ma_jupyter.frontends.options`), the notebook's
job form (:mod:`ma_jupyter.frontends.notebook.widgets.form`) and JupyterLab's create form, which
uses the patterns and examples :mod:`ma_jupyter.tsgen` exports into
``labextension/src/models.ts``.  This module splits and joins text; making a host path
absolute and checking that it exists are the front end's.

1. A task: ``ALGO_DIR::COMMAND`` (:data:`TASK_SEPARATOR`); the folder may be empty
   (``::COMMAND``).  A form's task field, one task per line, also takes a bare ``COMMAND``.
2. An image: ``conda:ENV`` (:data:`CONDA_PREFIX`), a virtualenv folder, an interpreter path, or a
   registered image's name (a bare word, :data:`IMAGE_NAME`).
3. A mount: ``[SOURCE/]NAME[@VERSION]=PATH`` (:data:`MOUNT_LINE`); a dataset's path may end
   in ``:rw`` (writable) or ``:ro`` (the default).  Source and version are for datasets and
   models only; models are always read-only, volumes always writable.
"""

from __future__ import annotations

import re
from collections.abc import Callable

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any

# ------------------------------------------------------------------------------ 1. tasks

#: between a task's algorithm folder and its command
TASK_SEPARATOR = "::"
#: a task as typed, for help texts and placeholders
TASK_EXAMPLE = "./algo::python train.py"


def split_task(text: str) -> tuple[str | None, str] | None:
    """``(algorithm folder or None, command)`` of a task line, both stripped; None without the
    separator."""
    algorithm, sep, command = text.partition(TASK_SEPARATOR)
    if not sep:
        return None
    return algorithm.strip() or None, command.strip()


def task_text(algorithm: str | None, command: str) -> str:
    """The line :func:`split_task` reads back."""
    return f"{algorithm or ''}{TASK_SEPARATOR}{command}"


# ------------------------------------------------------------------------------ 2. images

#: an image naming a conda environment: ``conda:<env>``
CONDA_PREFIX = "conda:"


#: a registered image's name (the wire model's ``NAME_PATTERN``): a bare word, no path
IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def image_from_text(text: str, is_dir: Callable[[str], bool]) -> dict[str, str]:
    """The ``image`` field a text means: ``{"conda_env": ...}``, ``{"venv": ...}`` when
    ``is_dir(text)``, ``{"name": ...}`` for a bare name that is no folder (a registered image,
    :data:`IMAGE_NAME`: no ``/``), else ``{"python": ...}``; ``{}`` for an empty text.  The env
    name may be empty: the caller refuses it in its own words."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith(CONDA_PREFIX):
        return {"conda_env": text[len(CONDA_PREFIX) :]}
    if is_dir(text):
        return {"venv": text}
    return {"name": text} if IMAGE_NAME.match(text) else {"python": text}


def image_text(image: dict[str, Any]) -> str:
    """The text :func:`image_from_text` reads back (``""``: the service's interpreter)."""
    if image.get("name"):
        return image["name"]
    if image.get("conda_env"):
        return CONDA_PREFIX + image["conda_env"]
    return image.get("venv") or image.get("python") or ""


# ------------------------------------------------------------------------------ 3. mounts

#: ``[SOURCE/]NAME[@VERSION]=PATH``; named groups source, name, version, path
MOUNT_LINE = re.compile(
    r"^(?:(?P<source>[A-Za-z]+)/)?(?P<name>[^=/@]+)(?:@(?P<version>[^=/]+))?=(?P<path>.+)$"
)
#: the format of a mount line, as help texts spell it
MOUNT_FORMAT = "[SOURCE/]NAME[@VERSION]=PATH"
#: a dataset's path suffixes: writable, read-only (the default)
READ_WRITE, READ_ONLY = ":rw", ":ro"


def split_mount(text: str) -> re.Match[str] | None:
    """The parts of a mount line (:data:`MOUNT_LINE`), None when it is not one."""
    return MOUNT_LINE.match(text or "")


def mount_text(mount: dict[str, Any], *, dataset: bool = False) -> str:
    """The line :func:`split_mount` reads back; a writable dataset's path ends in ``:rw``."""
    source = f"{mount['source']}/" if mount.get("source") else ""
    version = f"@{mount['version']}" if mount.get("version") else ""
    suffix = READ_WRITE if dataset and mount.get("read_only") is False else ""
    return f"{source}{mount['name']}{version}={mount['path']}{suffix}"
