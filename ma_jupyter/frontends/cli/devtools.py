"""``ma-jupyter devenv``, ``shell``, ``tensorboard``, ``export``: working with a job's environment
(a notebook or kernel from it, its debug terminal, its TensorBoard, its Kubernetes form)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ...client import Client
from ...client.resolve import resolve_job
from ...errors import Conflict, InvalidSpec
from .output import (
    EXIT_OK,
)


def _shell(args: argparse.Namespace) -> int:
    from ...client.shell import interact

    handle = resolve_job(Client(plain=True), args.job)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and not sys.stdin.isatty():
        # no terminal to type on: what comes on stdin is a script for the node's sh, as with ssh
        command = ["sh", "-c", sys.stdin.read()]
    try:
        size = os.get_terminal_size(sys.stdin.fileno())
        rows, cols = size.lines, size.columns
    except OSError:
        rows, cols = 24, 80
    # the shell's exit status is the command's, as with ssh or docker exec
    return interact(handle.client.shell(handle.id, args.node, rows=rows, cols=cols, command=command or None))


def _devenv(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    if args.kernel:
        return _devenv_kernel(client, handle.id, args.node)
    if args.node:
        raise InvalidSpec("--node chooses the node of a dev environment's kernel: add --kernel")
    made = client.devenv(handle.id)
    text = json.dumps(made["notebook"], indent=1, ensure_ascii=False) + "\n"
    if args.output == "-":
        # escaped (the same JSON): nothing of the job's text reaches a terminal raw
        sys.stdout.write(json.dumps(made["notebook"], indent=1) + "\n")
        return EXIT_OK
    path = Path(args.output or made["name"])
    if path.exists():
        raise Conflict(f"{path} exists: remove it, or write elsewhere with -o FILE")
    path.write_text(text)
    print(f"wrote {path}: a notebook that submits job {handle.id} ({handle.name}) again; open it in Jupyter")
    return EXIT_OK


def _devenv_kernel(client: Client, job_id: str, node: str | None) -> int:
    from ...client.kernelspec import start_devenv_kernel  # jupyter_core: only this command needs it

    started = start_devenv_kernel(client, job_id, node)
    made = started.devenv
    print(
        f"started dev environment {made.id} ({made.name}, {made.info.status.value}): job {job_id}'s "
        f"{started.node} with a Jupyter kernel\ninstalled kernel {started.kernel_name!r} ({started.folder}): "
        f"open a notebook with it ({started.display_name!r}) to run code there; stop it with "
        f"`ma-jupyter stop {made.id}`"
    )
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    print(client.export(handle.id, args.format, image=args.container_image, mounts_as=args.mounts_as), end="")
    return EXIT_OK


def _tensorboard(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    if args.stop:
        client.stop_tensorboard(handle.id)
        print(f"stopped the TensorBoard of {handle.id}")
    else:
        print(client.tensorboard(handle.id))
    return EXIT_OK


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {"devenv": _devenv, "shell": _shell, "tensorboard": _tensorboard, "export": _export}
