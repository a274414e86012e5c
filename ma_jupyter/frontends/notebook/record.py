"""Which jobs a notebook started, and how far their logs were shown, kept across kernel restarts.

A kernel restart loses every variable, but a notebook's jobs keep running.  Each follower
records, per notebook, the job ids it showed and the per-stream byte offsets it reached, in
``$MA_JUPYTER_HOME/notebooks/<hash>.json``; ``%ma_attach`` reads it back and continues each
job's log from there, so nothing is shown twice.  The notebook is named by the Jupyter session
(``JPY_SESSION_NAME``, the notebook's path), else by the kernel's connection file (which keeps
its name across restarts), else ``default``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ... import statehome

_lock = threading.Lock()


def notebook_key() -> str:
    """The name this kernel's notebook is recorded under."""
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        return session
    if "ipykernel" not in sys.modules:
        # not inside a Jupyter kernel (which has imported ipykernel long before any cell): no
        # connection file, and importing ipykernel here would only cost a plain IPython's first
        # submit its time
        return "default"
    try:
        from ipykernel.connect import get_connection_file

        return "kernel:" + Path(get_connection_file()).name
    except Exception:  # not inside a Jupyter kernel (plain IPython, tests)
        return "default"


def notebook_path() -> Path | None:
    """The notebook file of this kernel, when Jupyter tells (``JPY_SESSION_NAME``) and it exists."""
    session = os.environ.get("JPY_SESSION_NAME")
    if not session or not session.endswith(".ipynb"):
        return None
    # Jupyter may give the path relative to its root while the kernel runs in the notebook's folder
    for candidate in (Path(session), Path(Path(session).name)):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _path(key: str) -> Path:
    folder = statehome.home() / "notebooks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


def _load(key: str) -> dict[str, Any]:
    try:
        data = json.loads(_path(key).read_text())
        if isinstance(data, dict) and isinstance(data.get("jobs"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"key": key, "jobs": {}}


def _save(key: str, data: dict[str, Any]) -> None:
    path = _path(key)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def remember(
    job_id: str, name: str = "", offsets: dict[str, int] | None = None, key: str | None = None
) -> None:
    """Record that this notebook shows ``job_id``; ``offsets`` only ever move forward."""
    key = key or notebook_key()
    with _lock:
        data = _load(key)
        entry = data["jobs"].setdefault(
            job_id, {"name": name, "offsets": {}, "added": datetime.now(UTC).isoformat(timespec="seconds")}
        )
        if name:
            entry["name"] = name
        for stream, offset in (offsets or {}).items():
            entry["offsets"][stream] = max(int(offset), int(entry["offsets"].get(stream, 0)))
        _save(key, data)


def offsets(job_id: str, key: str | None = None) -> dict[str, int]:
    """How far this notebook has shown each log stream of ``job_id`` (empty if never).

    Both the record and, when Jupyter names it, the saved notebook's output metadata count:
    the furthest offset of each stream wins.
    """
    found = dict(_load(key or notebook_key())["jobs"].get(job_id, {}).get("offsets", {}))
    path = notebook_path() if key is None else None
    if path is not None:
        for stream, offset in _notebook_outputs(path).get(job_id, {}).items():
            found[stream] = max(int(offset), int(found.get(stream, 0)))
    return found


def jobs(key: str | None = None) -> list[str]:
    """Ids of the jobs this notebook started or showed, oldest first (record and notebook file)."""
    ids = list(_load(key or notebook_key())["jobs"])
    path = notebook_path() if key is None else None
    if path is not None:
        for job_id in jobs_in_notebook(path):
            if job_id not in ids:
                ids.append(job_id)
    return ids


def jobs_in_notebook(path: Path) -> list[str]:
    """Job ids found in a saved notebook's output metadata (``{"ma_jupyter": {"job_id"}}``)."""
    return list(_notebook_outputs(path))


def _notebook_outputs(path: Path) -> dict[str, dict[str, int]]:
    """Job id → furthest per-stream offsets shown, from a saved notebook's output metadata."""
    try:
        nb = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    found: dict[str, dict[str, int]] = {}
    for cell in nb.get("cells", []) if isinstance(nb, dict) else []:
        for output in cell.get("outputs", []) or []:
            meta = (output.get("metadata") or {}).get("ma_jupyter") or {}
            job_id = meta.get("job_id")
            if not isinstance(job_id, str):
                continue
            seen = found.setdefault(job_id, {})
            for stream, offset in (meta.get("offsets") or {}).items():
                if isinstance(offset, int):
                    seen[stream] = max(offset, seen.get(stream, 0))
    return found


def forget(job_id: str, key: str | None = None) -> None:
    """Drop a job from this notebook's record (it was deleted)."""
    key = key or notebook_key()
    with _lock:
        data = _load(key)
        if data["jobs"].pop(job_id, None) is not None:
            _save(key, data)
