"""Which job a name means: the one meaning every front end gives to a JOB argument (the CLI,
the magics, :meth:`Client.get <ma_jupyter.client.http.Client.get>`).

Rules, in order:

1. A job id means that job (yours, or another user's you may view).
2. Else a name means **your newest job** of exactly that name: running a notebook again, or
   re-submitting, never makes your own name ambiguous.  When several of yours share it, a note
   says which id was meant (:func:`resolve_job` prints it on stderr).
3. Else (none of yours has it) the one job of that name you may view (another user's); other
   users' jobs never make your own name ambiguous, but several of theirs do: their ids are listed,
   newest first, to pick one from.
4. Else the name means nothing: a NotFound that says where to list jobs.
"""

from __future__ import annotations

import sys

from ..errors import InvalidSpec, NotFound

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # an annotation's: no class at run time
    from typing import Any, Protocol

    class Client(Protocol):
        """What resolving needs of a client: :class:`ma_jupyter.client.Client` is one (this module
        does not import it: the HTTP client's :meth:`get` builds on this module, not both ways)."""

        def whoami(self) -> Any: ...

        def jobs(
            self, name: str | None = None, *, creator: str | None = None, limit: int = 50
        ) -> list[Any]: ...

        def job_by_id(self, job_id: str) -> Any: ...


#: rows of the listing read per name (newest first: the newest of yours is on the first page)
_LISTED = 500


def named_job(client: Client, ref: str, *, hint: str = "`ma-jupyter jobs`") -> tuple[str, str]:
    """Rules 2 to 4 for a ``ref`` that is no job id: the id of the job the name means, and the
    note to show ("" when the name was unambiguous).

    Raises:
        NotFound: no job you may view has that name (rule 4; ``hint``: where to list jobs).
        InvalidSpec: none of yours has it and several other users' jobs do (rule 3).
    """
    me = client.whoami().name
    # the listing is newest first and filters names by substring: the exact name is kept here
    mine = [h.id for h in client.jobs(name=ref, creator=me, limit=_LISTED) if h.name == ref]
    if mine:
        note = ""
        if len(mine) > 1:
            note = f"{ref!r} means your newest job of that name, {mine[0]} ({len(mine) - 1} older: give an id for one)"
        return mine[0], note
    others = [h.id for h in client.jobs(name=ref, limit=_LISTED) if h.name == ref]
    if len(others) == 1:
        return others[0], ""
    if others:
        ids = ", ".join(others[:10])
        raise InvalidSpec(
            f"{len(others)} jobs of other users are called {ref!r} and none of yours: give one of their ids ({ids})"
        )
    raise NotFound(f"no job has the id or name {ref!r}: see {hint}")


def _say(note: str) -> None:
    print(note, file=sys.stderr)


def resolve_job(client: Client, ref: str, *, hint: str = "`ma-jupyter jobs`", note=_say) -> Any:
    """The :class:`~ma_jupyter.client.JobHandle` of the job ``ref`` means (the module's
    rules): a job id, or a name.

    Args:
        hint: where the user lists the jobs (named in the NotFound message).
        note: called with rule 2's note when several of your jobs share the name (default:
            printed on stderr).

    Raises:
        NotFound: neither an id nor the name of a job (rule 4).
        InvalidSpec: rule 3's ambiguity among other users' jobs.
    """
    try:
        return client.job_by_id(ref)
    except NotFound:
        job_id, said = named_job(client, ref, hint=hint)
        if said and note is not None:
            note(said)
        return client.job_by_id(job_id)  # the job's own read: a listing row has no estimate
