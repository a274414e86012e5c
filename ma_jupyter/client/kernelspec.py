"""The kernelspec of a dev environment, installed for the caller (``ma-jupyter devenv JOB
--kernel``, ``%ma_devenv JOB --kernel``): a notebook opened with it runs its code in the job's
node, through :mod:`.kernel_bridge`.

It lies in the user's kernelspec folder (``$JUPYTER_DATA_DIR/kernels``, by default
``~/.local/share/jupyter/kernels``), named after the job's id and node (:func:`kernel_name`), shown
as ``ma_jupyter: <job name> (<node>)``.  Its argv is this interpreter running the bridge, so
nothing needs installing into an environment; its ``env`` names this machine's service (its
home folder, and the service's URL when one was given), never a token: the bridge finds the
token as every client of this account does.  ``interrupt_mode`` is ``message``: the bridge's
process is not the kernel's, so a signal to it would interrupt nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

from jupyter_core.paths import jupyter_data_dir

from .. import config
from ..errors import InvalidSpec
from ..models import Job
from .http import ENV_URL, Client, JobHandle


def kernel_name(job: Job, node: str) -> str:
    """``ma_jupyter-<job id>-<node>``, in the characters a kernelspec name allows: by the job's
    id, never its name alone (two jobs of one name must not share a kernelspec, or a notebook
    saved with one would open the other job's node)."""
    raw = f"ma_jupyter-{job.id}-{node}".lower()
    return re.sub(r"[^a-z0-9._-]", "-", raw)


def install_devenv_kernel(job: Job, node: str, devenv: Job | None = None) -> tuple[str, Path]:
    """Install (or replace) the kernelspec of ``job``'s ``node`` for this account; ``devenv``: the
    dev environment already started, which the kernel attaches to while it lives.

    Returns:
        The kernelspec's name and its folder.
    """
    name = kernel_name(job, node)
    folder = Path(jupyter_data_dir()) / "kernels" / name
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ma_jupyter.client.kernel_bridge", "--job", job.id, "--node", node]
    if devenv is not None:
        argv += ["--devenv", devenv.id]
    env = {config.ENV_HOME: str(config.home())}
    if os.environ.get(ENV_URL):
        env[ENV_URL] = os.environ[ENV_URL]
    spec = {
        "argv": [*argv, "-f", "{connection_file}"],
        "display_name": display_name(job, node),
        "language": "python",
        "interrupt_mode": "message",
        "env": env,
        "metadata": {"ma_jupyter": {"job": job.id, "node": node}},
    }
    temporary = folder / "kernel.json.tmp"
    temporary.write_text(json.dumps(spec, indent=1))
    os.replace(temporary, folder / "kernel.json")
    return name, folder


def display_name(job: Job, node: str) -> str:
    """What Jupyter's launcher shows for the kernel of ``job``'s ``node``."""
    return f"ma_jupyter: {job.name} ({node})"


class DevEnvKernel(NamedTuple):
    """A dev environment started and its kernelspec installed (:func:`start_devenv_kernel`)."""

    devenv: JobHandle
    source: Job
    node: str
    kernel_name: str
    folder: Path

    @property
    def display_name(self) -> str:
        return display_name(self.source, self.node)


def start_devenv_kernel(client: Client, job_id: str, node: str | int | None) -> DevEnvKernel:
    """Start the dev environment of ``job_id``'s ``node`` (default its first) and install its
    kernelspec for this account: what ``ma-jupyter devenv JOB --kernel``, ``%ma_devenv JOB
    --kernel`` and JupyterLab's "Create dev environment" do.

    Raises:
        Forbidden: the caller is not the job's owner nor an admin (the service says so).
        InvalidSpec: no such node.
    """
    made = client.create_devenv(job_id, node)
    origin = made.info.spec.devenv_of
    if origin is None:  # the service always fills it in; a different answer is not ours to use
        raise InvalidSpec(f"the service answered with job {made.id}, which is no dev environment")
    source = client.get(job_id)
    name, folder = install_devenv_kernel(source, origin.node, made.info)
    return DevEnvKernel(made, source, origin.node, name, folder)
