"""The commands the CLI and the magics share: actions on several jobs, every node's log, the
listing's filters.  A front end parses its line, calls one of these, and only prints.

1. :func:`each_job` acts on the jobs a list of JOB arguments names, each once, in the order
   given.  One job: its refusal is raised as it is (the usual one-line error).  Several (the
   seed's batch delete): each on its own, so a refusal is that job's :class:`Outcome` and the
   others are still acted on; the front end says which failed and then fails itself.
   :func:`delete_jobs` and :func:`stop_jobs` are the two uses.
2. :func:`every_node` names the logs that "a job's log" means without ``--node``: the job's
   nodes in launch order, else the nodes with a log on disk, else the node the service names
   before any started (:attr:`~ma_jupyter.models.Job.log_node`).  :func:`node_logs` reads what
   each holds now, a stream whose log is gone with its node's machine given as its reason, the
   other nodes still read.  Following a log live is the client's
   :class:`~ma_jupyter.client.logs.JobFollower`.
3. :func:`add_list_filters` puts the listing's filters on a parser (``ma-jupyter jobs``,
   ``%ma_jobs``); :func:`list_filters` turns the parsed options into the keyword arguments of
   :meth:`Client.jobs <ma_jupyter.client.Client.jobs>` and ``job_page``.  A listing searched by
   algorithm has a column :func:`code_version`: ``current`` for a job that ran the folder's
   current content (wherever that code lay), ``older`` for one that ran another version, ``-``
   where either content is not known.

The JupyterLab sidebar sends these requests itself, through the server extension's proxy: the
service's REST API is its command layer.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence

from ..client import Client, JobHandle
from ..client.logs import stream_label
from ..client.resolve import resolve_job
from ..errors import MaJupyterError, NodeLost
from ..wire import JobStatus, JobType

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from typing import Any

    from ..models import JobPage, JobSummary

# ------------------------------------------------------------------------- several jobs


class Outcome:
    """What acting on one JOB argument came to: ``handle`` and ``result`` (what the action
    returned), or ``error`` (the job could not be resolved or refused the action).

    Not a dataclass: importing ``dataclasses`` (with ``inspect``) cost every command line ~10 ms."""

    __slots__ = ("ref", "handle", "result", "error")

    def __init__(
        self,
        ref: str,
        handle: JobHandle | None = None,
        result: Any = None,
        error: MaJupyterError | None = None,
    ):
        self.ref = ref
        self.handle = handle
        self.result = result
        self.error = error


def each_job(
    client: Client, refs: Sequence[str], action: Callable[[JobHandle], Any], *, hint: str
) -> Iterator[Outcome]:
    """Rule 1: resolve each of ``refs`` (``hint``: where the user lists jobs) and act on it.

    Yields one :class:`Outcome` per distinct ref as its action ends, so a front end prints each
    as it happens.

    Raises:
        MaJupyterError: with a single ref, that job's error.
    """
    refs = list(dict.fromkeys(refs))  # a job named twice is acted on once
    if len(refs) == 1:
        handle = resolve_job(client, refs[0], hint=hint)
        yield Outcome(refs[0], handle, action(handle))
        return
    for ref in refs:
        try:
            handle = resolve_job(client, ref, hint=hint)
            result = action(handle)
        except MaJupyterError as exc:
            yield Outcome(ref, error=exc)
            continue
        yield Outcome(ref, handle, result)


def delete_jobs(client: Client, refs: Sequence[str], *, force: bool, hint: str) -> Iterator[Outcome]:
    """Delete each job (``force``: stop a running one first); see :func:`each_job`."""
    return each_job(client, refs, lambda handle: client.delete(handle.id, force=force), hint=hint)


def stop_jobs(client: Client, refs: Sequence[str], *, hint: str) -> Iterator[Outcome]:
    """Ask each job to stop; an outcome's ``result`` is the job as the service answered."""
    return each_job(client, refs, lambda handle: client.stop(handle.id), hint=hint)


def not_done(outcomes: Sequence[Outcome]) -> list[str]:
    """The refs whose action failed."""
    return [o.ref for o in outcomes if o.error is not None]


# ------------------------------------------------------------------------- every node's log


def every_node(handle: JobHandle) -> list[str]:
    """Rule 2: the nodes whose logs a job's log means."""
    return (
        [n.name for n in handle.info.nodes]
        or sorted({s.node for s in handle.client.log_streams(handle.id) if s.rank is None})
        or [handle.info.log_node]
    )


class NodeLog:
    """One node's log as it is now: iterate its lines (without the newline); once they end,
    ``lost`` says why the rest cannot be read when the log went with its node's machine (what
    could be read was given first)."""

    def __init__(self, handle: JobHandle, node: str, rank: int | None):
        self.node, self.rank = node, rank
        self.label = stream_label((node, rank))
        self.lost: str | None = None
        self._handle = handle

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._handle.logs(follow=False, node=self.node, rank=self.rank)
        except NodeLost as exc:
            self.lost = exc.message


def node_logs(handle: JobHandle, nodes: Sequence[str], rank: int | None = None) -> list[NodeLog]:
    """Each of ``nodes``' log (``rank``: that rank's log on each), to read node after node; a
    lost one does not keep the others from being read."""
    return [NodeLog(handle, node, rank) for node in nodes]


# ------------------------------------------------------------------------- the listing's filters


def add_list_filters(parser: argparse.ArgumentParser) -> None:
    """Rule 3: the filters of a job listing, as options of ``parser``."""
    parser.add_argument(
        "--status", action="append", choices=[s.value for s in JobStatus], help="status (repeatable)"
    )
    parser.add_argument("--name", help="name contains")
    parser.add_argument("--spec", help="asked for this spec")
    parser.add_argument("--creator", help="submitted by")
    parser.add_argument("--outputs", help="outputs folder contains")
    parser.add_argument(
        "--algorithm",
        metavar="FOLDER",
        help="running this algorithm folder: shipped from it, using it, or a copy of its current "
        "content anywhere (the CODE column says which ran its current content)",
    )
    parser.add_argument("--favourites", action="store_true", help="running one of your favourite algorithms")
    parser.add_argument("--type", choices=[t.value for t in JobType], help="regular or batch jobs only")
    parser.add_argument("--limit", type=int, default=50)


def list_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``Client.jobs``/``Client.job_page`` for the parsed filters."""
    return {
        "name": args.name,
        "status": args.status,
        "creator": args.creator,
        "spec": args.spec,
        "outputs": args.outputs,
        "limit": args.limit,
        "algorithm": args.algorithm,
        "favourites": args.favourites,
        "type": args.type,
    }


def code_version(job: JobSummary, page: JobPage) -> str:
    """Rule 3: ``current`` when ``job`` (a listed one) ran the content the listing was searched
    by (the folder's current content), ``older`` when it ran another, ``-`` when either is
    unknown."""
    ran = set(job.algorithm_digests)
    if page.algorithm_digest is None or not ran:
        return "-"
    return "current" if page.algorithm_digest in ran else "older"


def short_digest(value: str | None) -> str:
    """How a listing shows a content digest: its first 12 hex digits (``-`` for none)."""
    return value.removeprefix("sha256:")[:12] if value else "-"
