"""Prepared data: the copies data preparation makes of datasets, kept and shared between jobs.

A job with ``data_preparation`` reads its (read-only) datasets from copies on the service's
machine instead of their sources.  The copies live in one store, ``<home>/prepared/``, an entry
per source state::

    <home>/prepared/<key>/data        the copy (a folder or a single file), read-only to jobs
    <home>/prepared/<key>/entry.json  its source, size, file count, creation and last use
    <home>/prepared/<key>/holds/<id>  one empty file per queued or running job that uses it

**The key** is a SHA-256 over the source's resolved path and its manifest: every file's relative
path, size, modification time (ns) and mode.  For trees of at most ``CONTENT_HASH_LIMIT`` bytes
the files' contents go in too, since a small file rewritten within one mtime tick at the same
size would otherwise keep its old key; larger trees are keyed by metadata only, because reading
gigabytes to learn that nothing changed would cost what the copy saves.  A change to the source
(a file added, removed, resized or touched) so gives a new key and a fresh copy.

**Access.**  The source path is part of the key: two jobs share a copy only when they name the
same source, and every job's own mount rules are checked on that source before it gets the
copy (the supervisor dry-runs the job's spec as given, so ``host_policy`` decides for each user
as if the source itself were mounted).  The copy keeps the files' mode bits and belongs to the
service's account, so a job's account reads from it at most what "others" may read of the
source: nothing one user may not read reaches another's job through a shared copy.

Rules, in order:

1. :meth:`PreparedStore.acquire` computes the key, holds the entry for the job, and copies only
   when no complete entry exists (the copy is made beside its place and renamed when complete,
   so a crash never leaves a half copy that would be taken for a prepared one);
2. :meth:`PreparedStore.release` drops a job's holds when it ends; the retention counts from
   then (``last_used``);
3. :meth:`PreparedStore.sweep` removes the entries that nobody holds and that were last used
   more than the retention ago (``[data] retention`` in ``cluster.toml``, seconds or a text like
   ``7d``; default 7 days); a hold whose job is no longer queued or running (the service
   stopped before releasing it) is dropped first;
4. :meth:`PreparedStore.remove` removes an entry early, refused while a job holds it.

The copy is made on the service's machine, which is where the local backend's nodes run; the
Ray backend mounts the same path, so it reuses copies only while its nodes share that file
system (it never copies to a remote node).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..errors import Conflict, InvalidSpec, NotFound
from ..models import PreparedData, parse_duration

#: trees up to this size are keyed by their contents too (see the module docstring)
CONTENT_HASH_LIMIT = 64 << 20
DEFAULT_RETENTION = 7 * 86400.0


def retention(path: Path | None = None) -> float:
    """Seconds an unused copy is kept: ``[data] retention`` of ``cluster.toml`` (re-read on each
    call, so an admin's edit applies without a restart).

    Raises:
        InvalidSpec: the value is not a duration (the message names the file and the key).
    """
    path = path or config.home() / "cluster.toml"
    try:
        table = tomllib.loads(path.read_text()).get("data", {}) if path.exists() else {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidSpec(f"{path} is not a valid cluster file: {exc}") from exc
    unknown = set(table) - {"retention"}
    if unknown:
        raise InvalidSpec(f"{path}: [data] has no key {sorted(unknown)[0]!r}: use retention")
    if "retention" not in table:
        return DEFAULT_RETENTION
    try:
        return parse_duration(table["retention"]) or DEFAULT_RETENTION
    except ValueError as exc:
        raise InvalidSpec(f"{path}: [data] retention: {exc}") from None


def source_key(source: str) -> tuple[str, int, int]:
    """The store key of a source as it is now, with its size in bytes and its file count."""
    root = Path(source).resolve(strict=True)
    # Links inside the tree are never followed (the copy keeps them as links): a link's key
    # is its target's text, so data behind it is neither read with the service's rights nor
    # hashed.
    files: list[tuple[str, os.stat_result, Path]] = []
    links: list[tuple[str, str]] = []
    if root.is_dir():
        for folder, dirs, names in os.walk(root):  # does not descend into linked folders
            dirs.sort()
            for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
                p = Path(folder, name)
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode):
                    links.append((str(p.relative_to(root)), os.readlink(p)))
                elif stat.S_ISREG(st.st_mode):
                    files.append((str(p.relative_to(root)), st, p))
    else:
        files.append(("", root.stat(), root))
    total = sum(st.st_size for _, st, _ in files)
    digest = hashlib.sha256(str(root).encode())
    for rel, st, _ in files:
        digest.update(f"\0{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}".encode())
    for rel, target in links:
        digest.update(f"\0{rel}\0->{target}".encode())
    if total <= CONTENT_HASH_LIMIT:
        for _, _, p in files:
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:32], total, len(files)


@dataclass(frozen=True)
class Acquired:
    """What :meth:`PreparedStore.acquire` gave a job: the copy's path and how it came about."""

    path: Path
    bytes: int
    reused: bool
    seconds: float


class PreparedStore:
    """The store of prepared copies (see the module docstring for its rules)."""

    def __init__(self, root: Path | None = None):
        self.root = root or config.home() / "prepared"
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------ jobs

    def acquire(self, job_id: str, source: str, user: str | None) -> Acquired:
        """Hold the copy of ``source``'s current state for ``job_id`` (submitted by ``user``),
        copying it first when no complete copy exists (rule 1)."""
        started = time.monotonic()
        root = Path(source).resolve(strict=True)  # resolved once: the key and the copy read it
        key, total, count = source_key(str(root))
        entry = self.root / key
        with self._lock:  # one copy per key, and no sweep between the hold and the check
            (entry / "holds").mkdir(parents=True, exist_ok=True)
            (entry / "holds" / job_id).touch()
            reused = (entry / "data").exists()
            if not reused:
                partial = entry / "data.partial"
                shutil.rmtree(partial, ignore_errors=True)
                if root.is_dir():
                    # links stay links: what they point to is the job's to reach, in its sandbox
                    shutil.copytree(root, partial, symlinks=True)
                else:
                    shutil.copy2(root, partial)
                os.replace(partial, entry / "data")
                meta = {
                    "source": str(root),
                    "bytes": total,
                    "files": count,
                    "created": time.time(),
                }
            else:
                meta = self._meta(entry)
            meta["last_used"] = time.time()
            meta["users"] = sorted(set(meta.get("users", [])) | {user or ""})
            self._write_meta(entry, meta)
        return Acquired(entry / "data", total, reused, time.monotonic() - started)

    def release(self, job_id: str) -> None:
        """Drop ``job_id``'s holds; the retention of what it held counts from now (rule 2)."""
        if not self.root.is_dir():
            return
        with self._lock:
            for hold in self.root.glob(f"*/holds/{job_id}"):
                entry = hold.parent.parent
                hold.unlink(missing_ok=True)
                meta = self._meta(entry)
                if meta:
                    meta["last_used"] = time.time()
                    self._write_meta(entry, meta)

    # ------------------------------------------------------------------------ admin

    def entries(self, live: Callable[[str], bool], user: str | None = None) -> list[PreparedData]:
        """The complete entries, oldest use first (stale holds, see rule 3, are not counted):
        every one, or with ``user`` those a job of that user took (the others' sources stay
        unnamed to them)."""
        out = []
        if not self.root.is_dir():
            return out
        for entry in sorted(self.root.iterdir()):
            meta = self._meta(entry)
            if not meta or not (entry / "data").exists():
                continue
            if user is not None and user not in meta.get("users", []):
                continue
            holders = sorted(h.name for h in (entry / "holds").glob("*") if live(h.name))
            out.append(
                PreparedData(
                    key=entry.name,
                    source=meta.get("source", ""),
                    path=str(entry / "data"),
                    bytes=int(meta.get("bytes", 0)),
                    files=int(meta.get("files", 0)),
                    created=meta.get("created", 0.0),
                    last_used=meta.get("last_used", 0.0),
                    jobs=holders,
                )
            )
        return sorted(out, key=lambda e: e.last_used)

    def sweep(
        self, live: Callable[[str], bool], keep: float | None = None, now: float | None = None
    ) -> list[str]:
        """Remove the unheld entries last used more than ``keep`` seconds (default: the
        retention) ago (rule 3); the keys removed."""
        keep = retention() if keep is None else keep
        now = time.time() if now is None else now
        removed = []
        if not self.root.is_dir():
            return removed
        with self._lock:
            for entry in self.root.iterdir():
                holds = entry / "holds"
                for hold in list(holds.glob("*")) if holds.is_dir() else []:
                    if not live(hold.name):  # the job ended while no one could release it
                        hold.unlink(missing_ok=True)
                meta = self._meta(entry)
                if holds.is_dir() and any(holds.iterdir()):
                    continue
                if meta and now - meta.get("last_used", 0.0) <= keep:
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        return removed

    def remove(self, key: str, live: Callable[[str], bool], user: str | None = None) -> PreparedData:
        """Remove one entry now (rule 4); what it was.  ``user``: only one a job of theirs took
        (None: an admin, any entry).

        Raises:
            NotFound: no entry has that key.
            Conflict: a queued or running job holds it (the message names them).
        """
        with self._lock:  # no job takes a hold between the check and the removal
            found = next((e for e in self.entries(live, user) if e.key == key), None)
            if found is None:
                raise NotFound(f"no prepared data {key!r}; `ma-jupyter data list` shows the keys")
            if found.jobs:
                raise Conflict(
                    f"prepared data {key} is in use by job(s) {', '.join(found.jobs)}; "
                    "remove it once they have ended"
                )
            shutil.rmtree(self.root / key, ignore_errors=True)
        return found

    # ------------------------------------------------------------------------ files

    @staticmethod
    def _meta(entry: Path) -> dict:
        try:
            return json.loads((entry / "entry.json").read_text())
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _write_meta(entry: Path, meta: dict) -> None:
        tmp = entry / "entry.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, entry / "entry.json")
