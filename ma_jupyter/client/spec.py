"""A job spec at the edge: host paths made absolute against the caller's folder, then validated
by the wire model before it leaves this process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSpec

if TYPE_CHECKING:  # pydantic is imported where a spec is validated, not with the client
    from ..models import JobSpec


def host_path(text: str, root: Path) -> str:
    """A host path as an absolute, normalised path (relative ones start at ``root``)."""
    if not text:
        raise InvalidSpec("a host path is empty: give a folder, e.g. ./data")
    path = Path(os.path.expanduser(text))
    return os.path.normpath(path if path.is_absolute() else root / path)


def absolute_paths(spec: dict[str, Any], cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A copy of a JobSpec dict whose relative host paths are made absolute against ``cwd``.

    Host paths are the algorithm and outputs folders, every mount's path, batch tasks'
    algorithm folders and the image's interpreter or virtualenv (an interpreter given as a bare
    name such as ``python3`` is left for the ``PATH`` lookup).  The service resolves paths in its
    own working directory, so a caller's relative path must not reach it as such.
    """
    root = Path(cwd) if cwd is not None else Path.cwd()

    def fix(value: Any) -> Any:
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            return host_path(value, root)
        if isinstance(value, str) and value.startswith("~"):
            return os.path.expanduser(value)
        return value

    out = dict(spec)
    for key in ("algorithm", "outputs"):
        if out.get(key):
            out[key] = fix(out[key])
    for key in ("datasets", "annotations", "models", "volumes"):
        if isinstance(out.get(key), list):
            out[key] = [
                {**m, "path": fix(m["path"])} if isinstance(m, dict) and m.get("path") else m
                for m in out[key]
            ]
    if isinstance(out.get("tasks"), list):
        out["tasks"] = [
            {**t, "algorithm": fix(t["algorithm"])} if isinstance(t, dict) and t.get("algorithm") else t
            for t in out["tasks"]
        ]
    image = out.get("image")
    if isinstance(image, dict):
        image = dict(image)
        if image.get("venv"):
            image["venv"] = fix(image["venv"])
        if image.get("python") and "/" in image["python"]:
            image["python"] = fix(image["python"])
        out["image"] = image
    return out


def check(data: JobSpec | dict[str, Any], *, cwd: str | os.PathLike[str] | None = None) -> JobSpec:
    """The validated spec: host paths made absolute against ``cwd`` (default: the current
    folder), then parsed by the wire model. The client-side check every front end uses.

    Raises:
        InvalidSpec: the spec breaks a rule of the wire model (the message names the field).
    """
    from ..models import JobSpec, parse_spec

    if isinstance(data, JobSpec):
        data = data.model_dump(mode="json", exclude_unset=True)
    return parse_spec(absolute_paths(data, cwd))


def spec_body(
    spec: JobSpec | dict[str, Any] | None, fields: dict[str, Any], *, validate: bool = True
) -> dict[str, Any]:
    """The JSON body of a spec (``fields`` override its keys): host paths absolute, validated
    (without ``validate``, a plain client's, only the host paths: the service validates it
    and refuses it with the same message).

    Raises:
        InvalidSpec: the spec breaks a rule of the wire model (the message names the field).
    """
    if hasattr(spec, "model_dump"):  # a JobSpec
        data = {**spec.model_dump(mode="json", exclude_unset=True), **fields}
    else:
        data = {**(spec or {}), **fields}
    # relative host paths mean the caller's directory, not the service's
    if not validate:
        return absolute_paths(data)
    return check(data).model_dump(mode="json", exclude_unset=True)
