"""Data preparation for the backends that copy on the service's machine (local and Ray): the
job's account and mount rules from the host policy, the look and the copy from :mod:`.datacopy`.

The supervisor checked the job's mount rules on each dataset's path when it reserved the job's
nodes; the look and the copy come later, on another thread, and the path may lead elsewhere by
then.  So both check the rules again on the root they actually opened (datacopy rule 1).

Each answers a :class:`DataState`, which the backend makes the contract's ``DatasetState`` (the
node machinery knows nothing of the contract)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import NamedTuple

from . import datacopy
from .host_policy import load_policy


class DataState(NamedTuple):
    """A dataset's state as :mod:`.datacopy` reads it (the fields of ``DatasetState``)."""

    key: str
    bytes: int
    files: int


def _account(user: str | None) -> datacopy.Account | None:
    """The account ``user``'s jobs run as (None: the service's own, no switch)."""
    run_as = load_policy().run_as(user)
    return None if run_as is None else datacopy.Account(run_as.uid, run_as.gid)


def _mount_rules(user: str | None, source: str) -> datacopy.Check:
    """The mount rules of ``user``'s jobs, for the root data preparation opened of ``source``."""
    policy = load_policy()

    def check(opened: str) -> None:
        policy.check_source(opened, f"the dataset {source}", "datasets", user)

    return check


def look_at_dataset(user: str | None, source: str) -> DataState:
    """:meth:`ma_jupyter.backends.base.Backend.look_at_dataset` on this machine."""
    return DataState(*datacopy.look(source, _account(user), _mount_rules(user, source)))


def copy_dataset(
    user: str | None, source: str, into: Path, cancel: threading.Event | None = None
) -> DataState:
    """:meth:`ma_jupyter.backends.base.Backend.copy_dataset` on this machine."""
    return DataState(*datacopy.copy(source, _account(user), into, cancel, _mount_rules(user, source)))
