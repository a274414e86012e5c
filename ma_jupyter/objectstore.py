"""Object storage (S3, and Huawei OBS through its S3-compatible API) for datasets, models and
outputs: listing a prefix, downloading it into a folder, uploading a folder to it.

It runs on the service's machine only, in data preparation and the outputs' upload (jobs have
no network: see docs/network.md), with the credentials the user submitted (the job's storage
secrets, ``JobSpec.storage_credentials``), never the service's own.  The client library is
`obstore` (Rust's ``object_store``: no third-party Python dependency, releases the GIL); its
clients, kept a minute for reuse (rule 6), live only in the service process, whose children
execute a program at once (the nodes are forked by the fork server, a process of its own); it
is imported on first use, so nothing that only names a URI pays for it.

Rules, in order:

1. :func:`listing` lists every object below the prefix (with size, ETag and version), bounded
   by :data:`MAX_OBJECTS` and a timeout per request; :func:`check_readable` is its submit-time
   form: one page, the bucket and the reason in the error.
1a. A prefix that fits in that page is complete in the submit's listing: it is remembered for
   :data:`LISTING_REUSE` seconds (keyed by the URI, the endpoint and a digest of the
   credentials, at most :data:`RECENT_LISTINGS` of them), and ``listing(..., reuse=True)`` (data
   preparation, when the job starts) takes it instead of listing again.  The bounded staleness:
   a job starting within those seconds of a submit's listing (its own, or an earlier submit's
   of the same prefix with the same credentials) gets the prefix as that listing saw it.
1b. A prefix listed with the same credentials within :data:`KNOWN_KEPT` seconds is checked at
   the submit by a ``HEAD`` of the first object that listing found (the object is there and
   readable, so the prefix is), while the listing runs on its own thread: the submit does not
   wait for it; the start takes a listing as rule 1a says, and when none stands, waits for a
   submit's listing still running (started within :data:`LISTING_REUSE` seconds) and takes it.  A ``HEAD`` that fails lets the listing decide, as
   without rule 1b; a listing that fails (or finds the prefix empty) after a ``HEAD`` passed
   fails the start (data preparation), with the bucket and the reason, and the prefix is no
   longer known: the next submit waits for its listing.
2. :func:`state_key` is the key of a prefix's state: the URI, the endpoint, the credentials'
   access key id and every object's key, size, ETag and version, so a changed object gives a
   new key (a fresh download), and so do other credentials.
3. :func:`download` fetches the listed objects into a folder, :data:`PARALLEL` at a time.  Each
   object is written to ``<name>.part`` and renamed once its bytes are all there, so a failed
   download leaves no partial object that could be taken as complete; a later download into the
   same folder keeps the complete objects whose size matches and fetches the rest again.
   ``progress`` is told (bytes, objects) as objects complete; ``cancel`` ends it between chunks.
4. :func:`upload` puts the files of a folder that changed since the last upload (size and
   modification time) below the prefix; links, FIFOs and devices are skipped (the folder is
   the job's: it may have made them).
5. A client of an endpoint the user named (``AWS_ENDPOINT_URL``) makes every connection through
   :mod:`ma_jupyter.endpoint_guard`, which resolves the name once per connection, refuses a
   loopback, link-local, private or reserved answer and connects to the address it checked (a
   name whose answers change after :func:`check_endpoint` never reaches a refused address),
   unless the administrator trusts the endpoint (:func:`trust_endpoints`: ``[storage]
   allow_endpoints`` and ``obs_endpoint``), or the call says it is trusted (``trusted=True``:
   a Ray node's agent, told by the service with each request as ``cluster.toml`` says it
   then; ``trusted=False`` guards the endpoint whatever this process trusts).
6. A client of a bucket is reused for :data:`STORE_REUSE` seconds by the calls with the same
   endpoint, timeout and credentials (keyed by a digest of all of them, at most
   :data:`KEPT_STORES` kept): a user's submits, checks and downloads within that time make one
   client (about 15 ms to make), and its connections stay open between them.

Why one module (over 600 lines): listing, checking, downloading and uploading a prefix share the
numbered rules above (bounds, reuse of a listing, the endpoint guard, the clients kept for
reuse) and one client library; its service side is ``service/storage.py``, its endpoint guard
``endpoint_guard.py``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from . import endpoint_guard, foldersize, untrusted
from .errors import FolderRefused, InvalidSpec, RefusedFile, StorageError

#: the URI schemes of object storage
SCHEMES = ("s3", "obs")
#: objects fetched or put at the same time
PARALLEL = 16
#: the most objects one prefix may hold (a listing past it is refused: memory stays bounded)
MAX_OBJECTS = 200_000
#: seconds one request may take before it fails (the submit's check and every transfer)
REQUEST_TIMEOUT = 30.0
#: seconds the submit-time check may take in all
CHECK_TIMEOUT = 15.0
#: the credential variables a job's storage secrets may hold
CREDENTIAL_NAMES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
_CHUNK = 8 << 20
#: seconds a submit's complete listing of a prefix stands for the job's start (rule 1a)
LISTING_REUSE = 5.0
#: the most listings remembered for rule 1a (each at most one page: memory stays bounded)
RECENT_LISTINGS = 64
#: objects in the submit's one page (S3's page size): a prefix of fewer is remembered (the
#: listing stops at the page's last object, so it never asks for a second page)
_PAGE = 1000
_recent: dict[tuple[str, str, str], tuple[float, list[Obj]]] = {}
#: the submits' listings still running, by the same key (rule 1b)
_running: dict[tuple[str, str, str], tuple[float, threading.Event, list[object]]] = {}
#: seconds the first object of a prefix's listing is remembered for rule 1b
KNOWN_KEPT = 3600.0
#: the first object's key of each prefix listed lately, by the same key (rule 1b)
_known: dict[tuple[str, str, str], tuple[float, str]] = {}
_recent_lock = threading.Lock()
#: seconds a client (an ``S3Store``: its HTTP connections, about 15 ms to make) is reused (rule 6)
STORE_REUSE = 60.0
#: the most clients kept for rule 6
KEPT_STORES = 16
_stores: dict[tuple[str, str, float, str, bool], tuple[float, object]] = {}
#: the endpoints the administrator trusts (``normal_endpoint`` forms): no guard (rule 5)
_trusted: dict[str, set[str]] = {"configured": set(), "added": set()}
_trusted_lock = threading.Lock()
_stores_lock = threading.Lock()


@dataclass(frozen=True)
class ObjectURI:
    """``s3://bucket/prefix`` (or ``obs://``) split into its parts; ``prefix`` has no leading '/'."""

    scheme: str
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, text: str, what: str = "object storage") -> ObjectURI:
        """Raises InvalidSpec: not ``s3://BUCKET[/PREFIX]`` or ``obs://BUCKET[/PREFIX]``."""
        scheme, sep, rest = text.partition("://")
        bucket, _, prefix = rest.partition("/")
        if not sep or scheme not in SCHEMES or not bucket or ".." in prefix.split("/"):
            raise InvalidSpec(f"{what}: {text!r} is not s3://BUCKET/PREFIX or obs://BUCKET/PREFIX")
        return cls(scheme, bucket, prefix.strip("/"))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, relative: str) -> str:
        """The object key of ``relative`` below the prefix."""
        return f"{self.prefix}/{relative}" if self.prefix else relative


@dataclass(frozen=True)
class Obj:
    """One object below a prefix: its path relative to the prefix, size, ETag and version."""

    relative: str
    size: int
    etag: str
    version: str
    key: str


def endpoint_of(uri: ObjectURI, credentials: dict[str, str], obs_endpoint: str | None) -> str | None:
    """The endpoint a URI is reached at: the user's ``AWS_ENDPOINT_URL``; for ``obs://``, else
    the cluster's ``[storage] obs_endpoint``; None: AWS itself."""
    if credentials.get("AWS_ENDPOINT_URL"):
        return credentials["AWS_ENDPOINT_URL"]
    if uri.scheme == "obs":
        if not obs_endpoint:
            raise InvalidSpec(
                f"{uri}: obs:// needs an endpoint: set AWS_ENDPOINT_URL, or ask the administrator "
                "for [storage] obs_endpoint in cluster.toml"
            )
        return obs_endpoint
    return None


def trust_endpoints(urls, *, replace: bool = False) -> None:
    """Rule 5: the endpoints ``urls`` are the administrator's (``[storage] allow_endpoints``,
    ``obs_endpoint``): their clients connect without the guard.  ``replace``: the service's
    ``cluster.toml`` as it is now (an endpoint the administrator took out is guarded again);
    else added for the process's life (an endpoint of the process's own, a test's server: a Ray
    node's agent is told with each call instead, ``trusted=``)."""
    with _trusted_lock:
        if replace:
            _trusted["configured"] = {normal_endpoint(u) for u in urls if u}
        else:
            _trusted["added"].update(normal_endpoint(u) for u in urls if u)


def guarded(endpoint: str | None) -> bool:
    """Rule 5: whether a client of ``endpoint`` connects through the guard (None: AWS itself,
    whose names AWS answers: no)."""
    if not endpoint:
        return False
    with _trusted_lock:
        return all(normal_endpoint(endpoint) not in urls for urls in _trusted.values())


def _store(
    uri: ObjectURI,
    credentials: dict[str, str],
    endpoint: str | None,
    timeout: float,
    trusted: bool | None = None,
):
    """The client of ``uri``'s bucket (rule 6): one made within :data:`STORE_REUSE` seconds for
    the same bucket, endpoint, timeout and credentials (and guard), else a new one.  ``trusted``:
    the caller's word on the endpoint (rule 5), None: this process's :func:`guarded`."""
    guard = bool(endpoint) and (guarded(endpoint) if trusted is None else not trusted)
    key = (uri.bucket, endpoint or "", timeout, _digest(credentials), guard)
    now = time.monotonic()
    with _stores_lock:
        for old in [k for k, (at, _) in _stores.items() if now - at > STORE_REUSE]:
            del _stores[old]
        kept = _stores.get(key)
        if kept is not None:
            return kept[1]
    store = _new_store(uri, credentials, endpoint, timeout, key[-1])
    with _stores_lock:
        _stores.setdefault(key, (now, store))
        while len(_stores) > KEPT_STORES:
            del _stores[min(_stores, key=lambda k: _stores[k][0])]
    return store


def _digest(credentials: dict[str, str]) -> str:
    """A digest of every credential variable: what one user's credentials made (a listing, a
    client) never stands for another's."""
    return hashlib.sha256(repr(sorted(credentials.items())).encode()).hexdigest()


def _new_store(
    uri: ObjectURI, credentials: dict[str, str], endpoint: str | None, timeout: float, guard: bool
):
    from obstore.store import S3Store  # first use only: a client that names a URI never loads it

    config: dict[str, object] = {
        "access_key_id": credentials.get("AWS_ACCESS_KEY_ID", ""),
        "secret_access_key": credentials.get("AWS_SECRET_ACCESS_KEY", ""),
        "region": credentials.get("AWS_REGION") or credentials.get("AWS_DEFAULT_REGION") or "us-east-1",
    }
    if credentials.get("AWS_SESSION_TOKEN"):
        config["session_token"] = credentials["AWS_SESSION_TOKEN"]
    if not config["access_key_id"]:
        config["skip_signature"] = True  # a public bucket
    if endpoint:
        config["endpoint"] = endpoint
    client = {"timeout": timedelta(seconds=timeout), "connect_timeout": timedelta(seconds=min(timeout, 10))}
    if endpoint and endpoint.startswith("http://"):
        client["allow_http"] = True
    if endpoint and guard:  # rule 5: every connection through the guard, none of its own
        parts = urlsplit(endpoint)
        client["proxy_url"] = endpoint_guard.route(
            parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        )
    retry = {"max_retries": 3, "retry_timeout": timedelta(seconds=timeout)}
    return S3Store(uri.bucket, config=config, client_options=client, retry_config=retry)


def _reason(exc: BaseException) -> str:
    """The error's kind and HTTP status (and S3's error code), never its text: that may hold
    the response's body, which the endpoint chose (the submit's 400 answer shows this)."""
    text = str(exc)
    parts = [type(exc).__name__]
    status = re.search(r"status:? (\d{3})", text)
    if status:
        parts.append(f"HTTP {status.group(1)}")
    code = re.search(r"<Code>([A-Za-z0-9.]{1,64})</Code>", text)
    if code:
        parts.append(code.group(1))
    lowered = text.lower()
    for phrase in ("timed out", "dns error", "connection refused", "error sending request"):
        if phrase in lowered:
            parts.append(phrase)
            break
    host = re.search(r"https?://([A-Za-z0-9.-]{1,253})[:/]", text)
    refused = endpoint_guard.refusal(host.group(1)) if host else None
    if refused:  # the guard's own words (rule 5), not the endpoint's
        parts.append(refused)
    return ", ".join(parts)


#: the form of a region, which becomes part of AWS's host name (``s3.<region>.amazonaws.com``)
_REGION = re.compile(r"[a-z0-9-]{1,40}")


def check_endpoint(credentials: dict[str, str], allowed: tuple[str, ...] = ()) -> None:
    """The user's ``AWS_ENDPOINT_URL`` and region are where the service (from its own network)
    sends requests: the region must look like one, and the endpoint's host must resolve only to
    public addresses (not loopback, link-local such as 169.254.169.254, private or reserved ones)
    unless the administrator's ``[storage] allow_endpoints`` (``allowed``) names the endpoint.

    Raises:
        InvalidSpec: naming the variable, the address and what to do.
    """
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        region = credentials.get(name)
        if region and not _REGION.fullmatch(region):
            raise InvalidSpec(f"{name}: {region[:60]!r} is not a region (lowercase letters, digits and -)")
    endpoint = credentials.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise InvalidSpec(f"AWS_ENDPOINT_URL: {endpoint[:200]!r} is not an http:// or https:// URL")
    if normal_endpoint(endpoint) in {normal_endpoint(a) for a in allowed}:
        return
    try:  # the transfers' connections are checked again, each by itself (rule 5)
        endpoint_guard.checked_addresses(parts.hostname, port or 443)
    except endpoint_guard.Refused as exc:
        raise InvalidSpec(f"AWS_ENDPOINT_URL: {exc}") from None
    except (OSError, UnicodeError):
        raise InvalidSpec(
            f"AWS_ENDPOINT_URL: cannot resolve {parts.hostname[:200]}: check the endpoint"
        ) from None


def normal_endpoint(url: str) -> str:
    """An endpoint URL as ``[storage] allow_endpoints`` compares it: scheme and host lowercase,
    no trailing '/'."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


def listing(
    uri: ObjectURI,
    credentials: dict[str, str],
    endpoint: str | None,
    *,
    limit: int = MAX_OBJECTS,
    timeout: float = REQUEST_TIMEOUT,
    reuse: bool = False,
    trusted: bool | None = None,
) -> list[Obj]:
    """Every object below ``uri`` (rule 1), sorted by path; ``reuse``: a complete listing of
    the submit's check at most :data:`LISTING_REUSE` seconds old stands for it (rule 1a);
    ``trusted``: whether the endpoint is the administrator's, for this call (rule 5; None: as
    this process trusts it).

    Raises:
        StorageError: the listing failed (the bucket and the reason), or holds more than ``limit``.
    """
    if reuse:
        seen = _recent_listing(uri, credentials, endpoint, limit)
        if seen is None:
            with _recent_lock:
                running = _running.get(_recent_key(uri, credentials, endpoint))
            if running is not None and time.monotonic() - running[0] <= LISTING_REUSE:
                running[1].wait(CHECK_TIMEOUT + 5)  # rule 1b: the submit's, still running
                seen = _recent_listing(uri, credentials, endpoint, limit)
        if seen is not None:
            return seen
    import obstore

    store = _store(uri, credentials, endpoint, timeout, trusted)
    prefix = uri.prefix + "/" if uri.prefix else None
    out: list[Obj] = []
    try:
        for page in obstore.list(store, prefix, chunk_size=1000):
            for meta in page:
                if len(meta["path"]) > MAX_KEY:  # S3's own bound: an endpoint's longer key is hostile
                    raise StorageError(f"{uri}: the endpoint listed a key longer than {MAX_KEY} characters")
                rel = meta["path"][len(prefix) :] if prefix else meta["path"]
                if not rel or rel.endswith("/") or ".." in rel.split("/"):
                    continue  # a folder marker, or a key that would leave the download folder
                out.append(
                    Obj(
                        rel,
                        int(meta["size"]),
                        meta.get("e_tag") or "",
                        meta.get("version") or "",
                        meta["path"],
                    )
                )
                if len(out) > limit:
                    raise StorageError(f"{uri} holds more than {limit} objects: name a narrower prefix")
    except StorageError:
        raise
    except Exception as exc:
        raise StorageError(f"bucket {uri.bucket}: cannot list {uri}: {_reason(exc)}") from None
    if not out:  # a single object named by the URI itself
        try:
            meta = obstore.head(store, uri.prefix) if uri.prefix else None
        except Exception:
            meta = None
        if meta is not None:
            out.append(Obj(Path(uri.prefix).name, int(meta["size"]), meta.get("e_tag") or "", "", uri.prefix))
    return sorted(out, key=lambda o: o.relative)


def _recent_listing(
    uri: ObjectURI, credentials: dict[str, str], endpoint: str | None, limit: int
) -> list[Obj] | None:
    """Rule 1a: the complete listing at most :data:`LISTING_REUSE` seconds old, if any."""
    with _recent_lock:
        seen = _recent.get(_recent_key(uri, credentials, endpoint))
    if seen is not None and time.monotonic() - seen[0] <= LISTING_REUSE and len(seen[1]) <= limit:
        return list(seen[1])
    return None


def _recent_key(uri: ObjectURI, credentials: dict[str, str], endpoint: str | None) -> tuple[str, str, str]:
    # the credentials' digest: a listing one user's credentials made never stands for another's
    return (str(uri), endpoint or "", _digest(credentials))


def _remember(
    uri: ObjectURI, credentials: dict[str, str], endpoint: str | None, objects: list[Obj] | None
) -> None:
    """Rule 1a: keep a complete listing (None: the check got none, and an older one is dropped:
    it no longer stands), dropping the expired ones and the oldest past the bound."""
    now = time.monotonic()
    with _recent_lock:
        for key in [k for k, (at, _) in _recent.items() if now - at > LISTING_REUSE]:
            del _recent[key]
        if objects is None:
            _recent.pop(_recent_key(uri, credentials, endpoint), None)
            # nor does its first object stand for the prefix: the next submit waits for a listing
            _known.pop(_recent_key(uri, credentials, endpoint), None)
            return
        _recent[_recent_key(uri, credentials, endpoint)] = (now, objects)
        while len(_recent) > RECENT_LISTINGS:
            del _recent[min(_recent, key=lambda k: _recent[k][0])]
        if objects:  # rule 1b: its first object, for a later submit's quick check
            _known[_recent_key(uri, credentials, endpoint)] = (now, objects[0].key)
            for old in [k for k, (at, _) in _known.items() if now - at > KNOWN_KEPT]:
                del _known[old]
            while len(_known) > RECENT_LISTINGS:
                del _known[min(_known, key=lambda k: _known[k][0])]


def check_readable(uri: ObjectURI, credentials: dict[str, str], endpoint: str | None, what: str) -> None:
    """The submit-time check (rule 1): the prefix exists and can be listed and read with these
    credentials, within :data:`CHECK_TIMEOUT`.  The listing (one page) runs on a thread of its
    own; a prefix whose first object is known from an earlier listing with these credentials
    (rule 1b) passes once that object's ``HEAD`` answers, while the listing goes on for the
    start (:func:`listing` with ``reuse``).  One listing of a prefix with the same credentials
    runs at a time: submits made while it runs share it and its verdict.

    Raises:
        InvalidSpec: naming ``what``, the bucket and the reason.
    """
    key = _recent_key(uri, credentials, endpoint)

    def run(done: threading.Event, result: list[object]) -> None:
        try:
            # one page either way; a prefix it holds whole is remembered for the start (rule 1a)
            objects = listing(uri, credentials, endpoint, limit=_PAGE - 1, timeout=CHECK_TIMEOUT)
            _remember(uri, credentials, endpoint, objects or None)
            result.append(objects)
        except StorageError as exc:
            _remember(uri, credentials, endpoint, None)
            result.append(exc)
        except Exception as exc:  # noqa: BLE001 (the message is what the user gets)
            result.append(StorageError(f"bucket {uri.bucket}: {_reason(exc)}"))
        finally:
            done.set()
            with _recent_lock:
                if _running.get(key, (0.0, None))[1] is done:
                    del _running[key]

    with _recent_lock:
        running = _running.get(key)
        # one listing of a prefix with the same credentials at a time: the submits of a user
        # submitting in a loop (which rule 1b answers before their listing ends) share it, so
        # they never pile up threads waiting on a slow endpoint
        start = running is None or running[1].is_set()
        if start:
            running = _running[key] = (time.monotonic(), threading.Event(), [])
            while len(_running) > RECENT_LISTINGS:  # the oldest, which its own thread ends anyway
                del _running[min(_running, key=lambda k: _running[k][0])]
        known = _known.get(key)
    assert running is not None
    _, done, result = running
    if start:
        threading.Thread(target=run, args=(done, result), name="ma-storage-check", daemon=True).start()
    if (
        known is not None
        and time.monotonic() - known[0] <= KNOWN_KEPT
        and _exists(uri, credentials, endpoint, known[1])
    ):
        return  # rule 1b: that object is there and readable, so the prefix is
    done.wait(CHECK_TIMEOUT + 5)
    if not result:
        raise InvalidSpec(f"{what}: bucket {uri.bucket}: no answer within {CHECK_TIMEOUT:.0f} s from {uri}")
    got = result[0]
    if isinstance(got, StorageError) and "more than" not in str(got):
        raise InvalidSpec(f"{what}: {got}")
    if isinstance(got, list) and not got:
        raise InvalidSpec(
            f"{what}: bucket {uri.bucket}: {uri} does not exist or holds no object readable with "
            "your credentials: check the prefix and AWS_* (or AWS_PROFILE)"
        )


def _exists(uri: ObjectURI, credentials: dict[str, str], endpoint: str | None, key: str) -> bool:
    """Whether ``HEAD`` of the object ``key`` answers with these credentials (rule 1b); any
    failure is a no: the listing's verdict is then waited for."""
    import obstore

    try:
        obstore.head(_store(uri, credentials, endpoint, CHECK_TIMEOUT), key)
        return True
    except Exception:  # noqa: BLE001 (the listing says why)
        return False


def state_key(uri: ObjectURI, endpoint: str | None, objects: list[Obj], identity: str = "") -> str:
    """Rule 2: the key of this state of the prefix; ``identity`` (the credentials' access key
    id): a copy one identity downloaded is never the copy of another's, whose listing alone
    does not prove it may read each object."""
    digest = hashlib.sha256(f"{uri}\0{endpoint or ''}\0{identity}\0".encode())
    for o in objects:
        digest.update(f"{o.relative}\0{o.size}\0{o.etag}\0{o.version}\n".encode())
    return "obj-" + digest.hexdigest()[:28]


@dataclass
class Progress:
    """What a transfer has done so far (read by the ``progress`` callback)."""

    objects: int
    bytes: int
    done_objects: int = 0
    done_bytes: int = 0
    started: float = field(default_factory=time.monotonic)

    def rate(self) -> float:
        """Bytes per second since the start."""
        return self.done_bytes / max(time.monotonic() - self.started, 1e-6)


#: seconds between two progress lines of one download (:class:`ProgressLines`)
PROGRESS_EVERY = 2.0


class ProgressLines:
    """A download's ``progress`` callback that tells ``say`` one line (bytes, objects, rate) at
    most every ``every`` seconds, and always the line of the last object: the job's events show
    a download's progress alike wherever it runs (data preparation on the service's machine, a
    Ray node's agent), never one event per object."""

    def __init__(
        self,
        what: str,
        uri: ObjectURI,
        say: Callable[[str], None],
        every: float = PROGRESS_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._what, self._uri, self._say, self._every, self._clock = what, uri, say, every, clock
        self._at = clock()
        self._lock = threading.Lock()

    def __call__(self, state: Progress) -> None:
        now = self._clock()
        with self._lock:
            if now - self._at < self._every and state.done_objects < state.objects:
                return
            self._at = now
        self._say(
            f"{self._what}: downloading {self._uri}: {state.done_bytes / 1e6:.1f} of "
            f"{state.bytes / 1e6:.1f} MB, {state.done_objects} of {state.objects} objects, "
            f"{state.rate() / 1e6:.1f} MB/s"
        )


#: the longest object key taken from a listing (S3's own bound): an endpoint's longer names are refused
MAX_KEY = 1024


def _open_folder(into_fd: int, parts: list[str], shown: str) -> int:
    """An fd of the folder ``parts`` below ``into_fd``, each component made if missing and opened
    with ``O_NOFOLLOW``: a link the job left in ``outputs/`` (``ln -s /etc d``) is never followed.

    Raises:
        StorageError: a component is a link or not a folder.
    """

    def open_part(fd: int, part: str) -> int:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            return os.open(part, untrusted.DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StorageError(
                    f"{shown}: {part} is a link or not a folder in the download folder: "
                    "the service does not write through it; remove it"
                ) from None
            raise

    return untrusted.descend(os.dup(into_fd), parts, open_part)


async def _fetch(store, uri: ObjectURI, obj: Obj, into_fd: int, cancel: threading.Event | None) -> bool:
    """One object into the folder ``into_fd`` (rule 3); whether it was fetched (False: already
    complete).  Asynchronous: while a chunk is written, the next is already being received.
    Nothing below ``into_fd`` is followed: folders are opened with ``O_NOFOLLOW``, the ``.part``
    file is made anew with ``O_EXCL`` (whatever was there, a link included, is removed first),
    and the rename replaces a link at the object's name rather than writing through it."""
    import obstore

    *folders, name = obj.relative.split("/")
    part = name + ".part"
    dir_fd = _open_folder(into_fd, folders, f"{uri}/{obj.relative}")
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_size == obj.size:
                _unlink(part, dir_fd)  # what an older, failed download left of it
                return False
        except FileNotFoundError:
            pass
        _unlink(part, dir_fd)
        fd = os.open(
            part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
        with os.fdopen(fd, "wb") as out:
            size = 0
            if obj.size:
                result = await obstore.get_async(store, obj.key)
                async for chunk in result.stream(min_chunk_size=_CHUNK):
                    if cancel is not None and cancel.is_set():
                        raise StorageError(f"the download of {uri} was cancelled")
                    if size + len(chunk) > obj.size:  # a hostile endpoint never fills the disk
                        raise StorageError(
                            f"{uri}/{obj.relative}: more than the {obj.size} bytes listed: "
                            "the object changed; submit again"
                        )
                    out.write(chunk)
                    size += len(chunk)
            os.fchmod(out.fileno(), 0o644)
        if size != obj.size:
            raise StorageError(
                f"{uri}/{obj.relative}: got {size} bytes of {obj.size}: the object changed; submit again"
            )
        os.replace(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    finally:
        os.close(dir_fd)


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)  # a link is removed, never followed
    except FileNotFoundError:
        pass


def download(
    uri: ObjectURI,
    objects: list[Obj],
    credentials: dict[str, str],
    endpoint: str | None,
    into: Path,
    *,
    progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
    parallel: int = PARALLEL,
    trusted: bool | None = None,
) -> Progress:
    """Rule 3: fetch ``objects`` (a :func:`listing` of ``uri``) into the folder ``into``, on an
    event loop of the calling thread's own (call it from a thread that runs none); ``trusted``
    as :func:`listing` takes it.

    Raises:
        StorageError: an object could not be fetched (the URI and the reason); the complete
            objects stay, a later download into ``into`` fetches only the rest.
    """
    import asyncio

    store = _store(uri, credentials, endpoint, REQUEST_TIMEOUT, trusted)
    into.mkdir(parents=True, exist_ok=True, mode=0o755)
    into_fd = os.open(into, untrusted.DIR_FLAGS)  # ``into`` is the caller's; nothing below it is followed
    state = Progress(len(objects), sum(o.size for o in objects))

    async def one(obj: Obj, slots: asyncio.Semaphore) -> None:
        async with slots:
            try:
                await _fetch(store, uri, obj, into_fd, cancel)
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"bucket {uri.bucket}: cannot fetch {obj.key}: {_reason(exc)}") from None
        state.done_objects += 1
        state.done_bytes += obj.size
        if progress is not None:
            progress(state)

    async def run() -> None:
        slots = asyncio.Semaphore(max(1, parallel))
        await asyncio.gather(*(one(o, slots) for o in objects))

    try:
        asyncio.run(run())
    finally:
        os.close(into_fd)
    return state


def missing_bytes(objects: list[Obj], into: Path) -> int:
    """The bytes of ``objects`` a :func:`download` into ``into`` would fetch: those not there yet
    as a regular file of their listed size (what an earlier, failed download completed is
    kept), found by the one bounded walk (:func:`_files`).

    Raises:
        StorageError: ``into`` holds more files than a prefix may.
    """
    if not into.is_dir():
        return sum(o.size for o in objects)
    there = _files(into)
    return sum(o.size for o in objects if (st := there.get(o.relative)) is None or st.st_size != o.size)


def _files(folder: Path) -> dict[str, os.stat_result]:
    """The regular files below ``folder`` (the package's one bounded walk, ``foldersize.walk``:
    no link followed, depth, names and time bounded), ``.part`` files left out."""
    found: dict[str, os.stat_result] = {}
    try:
        for path, _fd, entries in foldersize.walk([folder], max_entries=MAX_OBJECTS * 2):
            below = "" if path == "." else path[2:] + "/"
            for name, st in entries:
                if stat.S_ISREG(st.st_mode) and not name.endswith(".part"):
                    found[below + name] = st
                    if len(found) > MAX_OBJECTS:
                        raise StorageError(
                            f"{folder} holds more than {MAX_OBJECTS} files: too many to upload"
                        )
    except FolderRefused as exc:
        raise StorageError(f"cannot upload {folder}: {exc}") from None
    return found


def upload(
    folder: Path,
    uri: ObjectURI,
    credentials: dict[str, str],
    endpoint: str | None,
    sent: dict[str, tuple[int, int]] | None = None,
    *,
    parallel: int = PARALLEL,
    cancel: threading.Event | None = None,
) -> int:
    """Rule 4: put the files of ``folder`` changed since ``sent`` (relative path -> (size,
    mtime ns), updated in place) below ``uri``; the number of files put.  ``cancel`` set: no
    further put starts (those in flight end, each within its own request timeout).

    Raises:
        StorageError: a put failed (the URI and the reason).
    """
    import obstore

    sent = {} if sent is None else sent
    changed = [
        (rel, (st.st_size, st.st_mtime_ns))
        for rel, st in _files(folder).items()
        if sent.get(rel) != (st.st_size, st.st_mtime_ns)
    ]
    if not changed:
        return 0
    store = _store(uri, credentials, endpoint, REQUEST_TIMEOUT)

    def one(item: tuple[str, tuple[int, int]]) -> None:
        rel, seen = item
        if cancel is not None and cancel.is_set():
            return  # a later upload puts it (only the puts already in flight complete)
        try:  # no link followed on the way, not only the last one: the job may swap a folder
            fd = untrusted.open_file(folder, rel)
        except (OSError, RefusedFile):
            return  # gone, or replaced by a link (or made a hard link) since the walk
        try:
            with os.fdopen(fd, "rb") as f:
                obstore.put(store, uri.key(rel), f)
        except Exception as exc:
            raise StorageError(f"bucket {uri.bucket}: cannot upload {uri.key(rel)}: {_reason(exc)}") from None
        sent[rel] = seen

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="ma-put") as pool:
        for future in [pool.submit(one, item) for item in changed]:
            future.result()
    return len(changed)
