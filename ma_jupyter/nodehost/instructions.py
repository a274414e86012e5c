"""The runner's instructions: what one node's runner (:mod:`.noderun`) is told to do, as a typed,
versioned record, written by the backend as ``nodes/<node>/node-run.json``.

Contract:

1. :class:`RunnerInstructions` is built in one place, where the backend launches a node (the
   local backend's ``_launch_node``, which the Ray agent runs on its node too), and read as
   attributes by the runner, its watchdog and the backend's later looks (the stop's relay, the
   debug terminal, the Ray agent's leftovers).
2. :meth:`~RunnerInstructions.to_json` writes every field and ``"version": VERSION``;
   :meth:`~RunnerInstructions.from_json` refuses, with a :class:`ValueError` that names the file's
   problem, anything but an object of this exact version holding every field with a value of its
   type and no other key: a runner never guesses at instructions it was not made for.
3. :meth:`~RunnerInstructions.write` makes the file readable by the service's user alone (it holds
   the job's variables and secret), following no symlink; :meth:`~RunnerInstructions.read` reads
   it back.  Raise :data:`VERSION` whenever a field is added, removed or changes its meaning.

Standard library only (the runner imports it, and so does its fork server, once for all the
runners it forks).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

#: the version of the record; a file of another version is refused (rule 2)
VERSION = 1

#: what a JSON value of each field's type may be (``bool`` is no ``int`` here, JSON's ints are
#: floats too); every field's annotation is one of these (checked when the module loads)
_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "str | None": (str, type(None)),
    "int": (int,),
    "float": (int, float),
    "float | None": (int, float, type(None)),
    "bool": (bool,),
    "list[str]": (list,),
    "list[str] | None": (list, type(None)),
    "list[int]": (list,),
    "list[list[int]] | None": (list, type(None)),
    "dict[str, str]": (dict,),
    "dict[str, str] | None": (dict, type(None)),
    "dict | None": (dict, type(None)),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerInstructions:
    """One node's runner instructions (``node-run.json``); :mod:`.noderun` states what it does
    with each (its rule in brackets).

    Attributes:
        node: the node's name (``worker-0``), as messages say it.
        node_dir: the node's folder on the host (``<job_dir>/nodes/<node>``).
        rank_log_dir: where the job writes its per-rank logs and a launcher its failure report
            (rule 6).
        sandbox: ``bubblewrap`` or ``symlink``.
        argv: the node's command, already wrapped in its sandbox (rule 3).
        env: the environment each phase starts with: the job's own in the symlink mode; in
            bubblewrap a fixed one (the job's variables are applied inside the sandbox).
        job_env: bubblewrap: the job's variables, handed to the sandbox as a file (never argv).
        cwd: the folder each phase starts in (made when missing).
        cpus: the cores the runner pins itself to (rule 1); empty: all.
        memory_gb: the node's memory limit (its tmpfs included); None or 0: none (rule 1a).
        max_processes: the bound on the node's processes and threads (rule 1b); 0: none.
        cgroup: where the runner makes the node's own cgroup (:class:`.cgroup.NodeCgroup`);
            None: the watchdog bounds its memory.
        own_user_namespace: the node runs in a user namespace of its own (rule 1b).
        account_uid: the account the node's processes run as (the kernel's process limit
            spares root).
        max_log_bytes: the cap on the job's logs on this machine (rule 1c); 0: none.
        logs_dir: the job's logs folder.
        disk_reserve_bytes: the jobs folder's disk reserve (rule 1c).
        disk_flood_rate: bytes per second of logs that count as a flood near the reserve.
        on_start: the lifecycle command run before the command, wrapped; None: none.
        on_stop: the lifecycle command run after it, wrapped; None: none.
        copy: symlink mode: the arguments of the working copy's fill (rule 2); None: no copy.
        export: the command keeping what the job wrote in its working copy; None: none.
        workdir: the working copy's folder on the host; None without one.
        shell_agent: the command runs under the debug terminal's agent (:mod:`.shell_agent`).
        end_with: the process hosting the node (:func:`.hostwatch.host_process`, rule 8).
        keep_failed_seconds: how long a failed command keeps its sandbox for the debug terminal.
        cache_lease: the user's cache lease file, held while the runner lives (rule 9).
        netns: the node's network namespace file (:mod:`.network`); None: the host's network.
        switch: its job network's switch file, held open for the runner's life.
        deny_tcp: the fence's port ranges ``[low, high]`` the node may not connect to; None:
            no fence.
    """

    node: str
    node_dir: str
    rank_log_dir: str
    sandbox: str
    argv: list[str]
    env: dict[str, str]
    job_env: dict[str, str] | None = None
    cwd: str | None = None
    cpus: list[int] = dataclasses.field(default_factory=list)
    memory_gb: float | None = None
    max_processes: int = 0
    cgroup: dict | None = None
    own_user_namespace: bool = False
    account_uid: int = 0
    max_log_bytes: int = 0
    logs_dir: str | None = None
    disk_reserve_bytes: int = 0
    disk_flood_rate: float = 0.0
    on_start: list[str] | None = None
    on_stop: list[str] | None = None
    copy: list[str] | None = None
    export: list[str] | None = None
    workdir: str | None = None
    shell_agent: bool = False
    end_with: dict | None = None
    keep_failed_seconds: float = 0.0
    cache_lease: str | None = None
    netns: str | None = None
    switch: str | None = None
    deny_tcp: list[list[int]] | None = None

    def to_json(self) -> str:
        """The record as the file holds it (rule 2)."""
        return json.dumps({"version": VERSION, **dataclasses.asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes, *, unversioned: bool = False) -> RunnerInstructions:
        """The record ``text`` holds (rule 2).  ``unversioned``: also the plain object the runner
        was given before the record had a version (the same keys), which the service still reads
        for nodes an earlier ma_jupyter launched and that outlive its upgrade (their stop relay,
        debug terminal and leftover sweep); the runner itself never runs one.

        Raises:
            ValueError: not JSON, not an object, another version, a missing or unknown key, or a
                value of the wrong type; the message says which.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"the runner's instructions are not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("the runner's instructions are not a JSON object")
        version = data.pop("version", None)
        if version is None and unversioned:
            version = VERSION
            if data.get("shell_agent") is None:  # the plain object's "no agent"
                data["shell_agent"] = False
        if version != VERSION:
            raise ValueError(
                f"the runner's instructions are of version {version!r}, this runner reads version "
                f"{VERSION}: a node launched by another version of ma_jupyter cannot be run by this one"
            )
        unknown = sorted(set(data) - _FIELDS.keys())
        if unknown:
            raise ValueError(f"unknown key(s) in the runner's instructions: {', '.join(unknown)}")
        missing = sorted(_FIELDS.keys() - set(data))
        if missing:
            raise ValueError(f"the runner's instructions lack {', '.join(missing)}")
        for name, value in data.items():
            kinds = _JSON_KINDS[_FIELDS[name]]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ValueError(
                    f"{name} of the runner's instructions must be {_FIELDS[name]}, not {type(value).__name__}"
                )
        return cls(**data)

    def write(self, path: Path) -> None:
        """Write the record to ``path``, readable and writable by this account alone (rule 3)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)  # also when an earlier attempt left the file
        with os.fdopen(fd, "w") as fh:
            fh.write(self.to_json())

    @classmethod
    def read(cls, path: str | os.PathLike) -> RunnerInstructions:
        """The record in the file ``path``.

        Raises:
            OSError: it cannot be read.
            ValueError: from :meth:`from_json`, with the file's name.
        """
        try:
            return cls.from_json(Path(path).read_bytes())
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


#: each field's annotation, by name
_FIELDS: dict[str, str] = {f.name: str(f.type) for f in dataclasses.fields(RunnerInstructions)}
_untyped = sorted(name for name, kind in _FIELDS.items() if kind not in _JSON_KINDS)
if _untyped:  # a field added without saying what its JSON value may be
    raise TypeError(f"RunnerInstructions fields of no known JSON kind: {_untyped}")
