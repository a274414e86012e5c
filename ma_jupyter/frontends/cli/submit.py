"""``ma-jupyter submit`` and ``clone``: a new job (or its dry run, or its export), then ``--wait`` /
``--follow``."""

from __future__ import annotations

import argparse

from ...client import Client
from ...client.plain import as_json
from ...client.resolve import resolve_job
from ...errors import InvalidSpec
from ...wire import clone_name
from .. import options, render
from .output import (
    EXIT_OK,
    Alerts,
    err,
    finished,
    interrupted,
    out,
    submitted,
)

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any


def _submit(args: argparse.Namespace) -> int:
    if not args.command and not args.task:
        raise InvalidSpec("give the command after `--`, e.g. ma-jupyter submit -- python train.py")
    spec = options.spec_from_args(args, command=args.command or None, validate=False)
    return _run(Client(plain=True), spec, args)


def _run(client: Client, spec: dict[str, Any], args: argparse.Namespace) -> int:
    """Submit (or, with ``--dry-run``, plan or export) ``spec``; then ``--wait`` / ``--follow``."""
    if args.format is None and (args.container_image or args.mounts_as):
        raise InvalidSpec("--container-image and --mounts-as shape an export: add --dry-run --format k8s")
    if args.format is not None:
        if not args.dry_run:
            raise InvalidSpec(
                f"--format {args.format} prints what the job would be elsewhere and submits nothing: add "
                "--dry-run (or export a submitted job with `ma-jupyter export JOB --format k8s`)"
            )
        print(
            client.export_spec(spec, args.format, image=args.container_image, mounts_as=args.mounts_as),
            end="",
        )
        return EXIT_OK
    if args.dry_run:
        plan = client.plan(spec)
        if args.json:
            out(as_json(plan), args)
        else:
            print(render.plan_text(plan), end="")
        return EXIT_OK
    if args.follow_node and not args.follow:
        raise InvalidSpec("--follow-node narrows what --follow prints: add --follow")
    handle = client.submit(spec)
    if handle.shipped:
        err(handle.shipped)
    if not (args.wait or args.follow):
        out(as_json(handle.info) if args.json else submitted(handle), args)
        return EXIT_OK
    if not args.json:
        err(submitted(handle))
    alerts = Alerts(handle)
    try:
        if args.follow and not args.json:
            from .logs import follow_nodes  # the log follower: only --follow needs it

            stream = (args.follow_node, None) if args.follow_node else None
            follow_nodes(handle, stream=stream, alerts=alerts)
        final = handle.wait(check=False)
    except KeyboardInterrupt:
        return interrupted(handle, stop=args.stop_on_interrupt)
    if not args.json:
        alerts.show_new()  # those a follow did not show yet
    return finished(final, args)


def _clone(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    source = resolve_job(client, args.job).info
    if not args.name:
        args.name = clone_name(source.spec.name)
    base = {k: v for k, v in as_json(source.spec).items() if k != "creator"}
    spec = options.spec_from_args(args, command=args.command or None, base=base, validate=False)
    return _run(client, spec, args)


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {"submit": _submit, "clone": _clone}
