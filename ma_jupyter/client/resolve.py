"""Which job a name means: the one meaning every front end gives to a JOB argument."""

from __future__ import annotations

from ..errors import InvalidSpec, NotFound
from .http import Client, JobHandle


def resolve_job(client: Client, ref: str, *, hint: str = "`ma-jupyter jobs`") -> JobHandle:
    """REF: a job id, or the exact name of exactly one job visible to this user.

    Args:
        hint: where the user lists the jobs (named in the NotFound message).

    Raises:
        NotFound: neither an id nor the name of a job.
        InvalidSpec: several jobs share the name (the message lists their ids, newest first).
    """
    try:
        return client.job(ref)
    except NotFound:
        matches = [h for h in client.jobs(name=ref, limit=500) if h.name == ref]
        if len(matches) == 1:
            return client.job(matches[0].id)  # the job's own read: a listing row has no estimate
        if matches:
            matches.sort(key=lambda h: (h.summary or h.info).created_at, reverse=True)
            ids = ", ".join(h.id for h in matches[:10])
            raise InvalidSpec(
                f"{len(matches)} jobs are called {ref!r}: give one of their ids ({ids})"
            ) from None
        raise NotFound(f"no job has the id or name {ref!r}: see {hint}") from None
