"""``%%ma_train`` and ``%ma_clone``: a job from a cell or from another job, submitted and followed.

Both parse the job options of ``ma-jupyter submit`` plus the notebook's own
(:func:`.parsing.spec_parser`) and end in :func:`submit`: ``--dry-run`` prints the plan,
``--no-follow`` returns at once, else the job's log is followed live in the cell.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ....errors import InvalidSpec, MaJupyterError
from ....wire import NAME_PATTERN
from ....workspace_paths import script_command
from .follow import follow
from .parsing import parse_spec_line, resolve_job, spec_parser

if TYPE_CHECKING:
    from IPython.core.magic import Magics


def bind(magics: Magics, var: str | None, value: Any) -> None:
    """``--out VAR``: bind ``value`` to the kernel variable ``var`` (nothing when None)."""
    if var:
        magics.shell.user_ns[var] = value


def submit(
    magics: Magics, spec: dict, args: argparse.Namespace, *, magic: str | None = None, made: str | None = None
) -> Any:
    """Submit ``spec`` as ``args`` say: ``--dry-run`` prints the plan (None), ``--no-follow``
    returns the handle at once, else the job is followed live in the cell; returns the handle.

    Rules (a fresh kernel's first submit loads neither pydantic nor the models):

    1. The spec goes out with the home's plain client (:func:`..session.get_client`), as the
       CLI's does: the service validates it.
    2. The service's refusal of a spec breaking a rule of the wire model is, with ``magic``
       (the magic's name), the one-line ``UsageError: <magic>: <message>`` a bad option gives:
       the client-side check runs then, on the refusal only.  Any other refusal (an unknown
       spec, a missing folder) is the service's typed error, one line too.
    3. ``made``: the snapshot folder the cell made; a dry run's and a refused job's are removed
       (nothing will run them); no other folder is (a clone's algorithm is its source job's).
    4. The handle's client is the home's ordinary one; the submit's plain answer is its
       ``summary`` (as a listed handle's: name and status, read without pydantic), and its
       :attr:`~ma_jupyter.client.JobHandle.info` is always the model (fetched on first use).
    5. A spec is checked by the service once the cell's snapshot was made: a bad option with a
       large ``--code-dir`` costs that copy (removed again, rule 3) before its ``UsageError``.
    """
    import shutil

    from ... import render
    from .. import record as notebook_record
    from ..session import get_client

    if args.out and not args.out.isidentifier():
        raise UsageError(f"--out {args.out}: not a Python variable name")
    client = get_client(plain=True)
    try:
        if getattr(args, "dry_run", False):
            try:
                plan = client.plan(spec)
            finally:
                if made is not None:  # nothing will run it (a clone's is its source job's: kept)
                    shutil.rmtree(made, ignore_errors=True)
            print(render.plan_summary(plan))
            return None
        handle = client.submit(spec)
    except InvalidSpec:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)  # rule 3
        usage = _broken_rule(spec, magic) if magic else None
        if usage is None:
            raise
        raise usage from None
    # rule 4: the plain answer serves as the handle's summary (its name and status, as a listed
    # handle's); its first ``info`` is the model, fetched through the ordinary client
    handle.client, handle.summary, handle._info = get_client(), handle._info, None
    if handle.shipped:
        print(handle.shipped)
    notebook_record.remember(handle.id, handle.name)
    bind(magics, args.out, handle)
    if args.no_follow:
        from IPython.display import display

        if getattr(args, "wait", False):
            handle.wait()

        display(
            {"text/plain": f"submitted job {handle.id} ({handle.name}): {_status(handle)}"},
            raw=True,
            metadata={"ma_jupyter": {"job_id": handle.id, "offsets": {}}},
        )
        return handle
    follow_node = getattr(args, "follow_node", None)
    return follow(
        magics,
        handle,
        lines=args.lines,
        stop_on_interrupt=args.stop_on_interrupt,
        kernel_hint=True,
        stream=(follow_node, None) if follow_node else None,
    )


def _status(handle: Any) -> str:
    """The status the handle last saw (after ``--wait``, the model's; else the submit's answer)."""
    return (handle._info or handle.summary).status.value


def _broken_rule(spec: dict, magic: str) -> UsageError | None:
    """Rule 2 of :func:`submit`: the ``UsageError`` of a refused ``spec`` that breaks a rule
    of the wire model (the check's message, the service's too, naming the field), else None."""
    from ....client.spec import check  # pydantic: only once the service refused the spec

    try:
        check(spec)
    except InvalidSpec as exc:
        return UsageError(f"{magic}: {exc.message}")
    return None


def ma_train(magics: Magics, line: str, cell: str | None = None):
    """Run the cell body as a training job: ``%%ma_train --name NAME --spec cpu.small ...``.

    The body is saved as ``/workspace/algorithm/<name>.py`` and run with
    ``python /workspace/algorithm/<name>.py`` unless ``--command`` says otherwise; with
    ``--code-dir`` the folder is shipped too.  IPython refuses a cell magic with an empty
    body, so a job made of a command alone is the line form ``%ma_train --command "..."``
    (with ``--code-dir DIR``, or else the current folder when the command names a file in
    it, as ``ma-jupyter submit`` does).  ``--dry-run`` prints the per-node plan.

    A body that is a shell command rather than Python is refused with the ``--command`` to
    use, and a job that fails on a NameError of a kernel variable says how to pass values
    in (:mod:`~ma_jupyter.frontends.notebook.hints`).  Returns the JobHandle.
    """
    from ... import options
    from .. import hints
    from ..snapshot import default_name, snapshot_algorithm

    parser = spec_parser("%%ma_train")
    args = parse_spec_line(parser, line)
    if args is None:
        return None
    body = cell if cell and cell.strip() else None
    name = args.name or default_name()
    if not re.match(NAME_PATTERN, name):
        raise UsageError(f"--name {name!r}: use letters, digits, '-', '_' and '.' (at most 63)")
    args.name = name
    command = args.command
    code_dir = getattr(args, "code_dir", None)
    if getattr(args, "task", None) and body is None and command is None:
        # a batch job: each --task names its own folder and command, as with `ma-jupyter submit`
        try:
            spec = options.spec_from_args(args, validate=False)  # the service checks it
        except MaJupyterError as exc:
            raise UsageError(f"%%ma_train: {exc.message}") from None
        return submit(magics, spec, args, magic="%%ma_train")
    if command is None:
        if body is None:
            raise UsageError("%ma_train --code-dir without a cell body needs --command (what to run)")
        # a body that is a shell command fails in the job with a bare SyntaxError: say it now
        hint = hints.shell_command_hint(body)
        if hint:
            raise UsageError(hint)
        command = script_command(name)
    try:
        spec = options.spec_from_args(args, command=command, validate=False)  # the service checks it
    except MaJupyterError as exc:
        raise UsageError(f"%%ma_train: {exc.message}") from None
    if body is None and not code_dir:
        # `%ma_train --command "python train.py"`: as with `ma-jupyter submit`, the client
        # ships the current folder when the command names a file in it
        return submit(magics, spec, args, magic="%%ma_train")
    spec["algorithm"] = made = str(snapshot_algorithm(name, body, code_dir))
    if code_dir:  # the folder the job's code comes from: search by algorithm finds it there
        spec["algorithm_origin"] = os.path.normpath(os.path.abspath(code_dir))
    return submit(magics, spec, args, magic="%%ma_train", made=made)


def ma_clone(magics: Magics, line: str):
    """Submit a copy of a job, with options overriding its fields: ``%ma_clone JOB --spec cpu.medium``."""
    from ....models import clone_name
    from ... import options
    from ..session import get_client

    parser = spec_parser("%ma_clone", clone=True)
    args = parse_spec_line(parser, line)
    if args is None:
        return None
    client = get_client()
    source = resolve_job(client, args.job).info
    base = source.spec.model_dump(mode="json", exclude={"creator"})
    if not args.name:
        args.name = clone_name(source.spec.name)
    try:
        spec = options.spec_from_args(args, base=base)
    except MaJupyterError as exc:
        raise UsageError(f"%ma_clone: {exc.message}") from None
    return submit(magics, spec, args)
