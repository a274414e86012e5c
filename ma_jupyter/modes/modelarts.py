"""ModelArts boot conventions for custom images (seed 000), shared by every mode (single too).

Each mode adds its own ModelArts arguments and variables (``--init_method`` for PyTorch-GPU,
``--task_index ...`` for TensorFlow-GPU, ``-x`` forwarding for MPI).  What all of them share is
how a custom image's conda env starts the boot file: a training job runs without a shell, so
``conda activate`` cannot be used.  Of the seed's four ways, the platform applies the first one
for the user: when the job's env sets ``ANACONDA_DIR`` and ``DEFAULT_CONDA_ENV_NAME``, a command
starting with ``python`` runs ``$ANACONDA_DIR/envs/$DEFAULT_CONDA_ENV_NAME/bin/python`` (the
second way, spelled out), and that env's ``lib`` folder is put on ``LD_LIBRARY_PATH`` (the
seed's fix for missing ``.so`` files).  The other ways need nothing from the platform: an
absolute interpreter path, ``--env PATH=...`` or ``conda run -n <env> python ...`` as the
command all run as written.

The working directory is the job's ``workdir``, else the seed's
``/home/ma-user/modelarts/user-job-dir/<code folder>`` (the backend shows the container
layout, :func:`ma_jupyter.workspace.workdir_for`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..models import Convention, JobSpec
from .base import NodePlan, Placement
from .common import is_python

PlanFunction = Callable[[JobSpec, Placement, list[str]], list[NodePlan]]


def conda_python(spec: JobSpec) -> str | None:
    """The conda env interpreter the job's env selects, or None."""
    anaconda = spec.env.get("ANACONDA_DIR", "").rstrip("/")
    name = spec.env.get("DEFAULT_CONDA_ENV_NAME", "")
    if not anaconda or not name:
        return None
    return f"{anaconda}/envs/{name}/bin/python"


def boot_command(spec: JobSpec, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command and extra env under the ModelArts convention's conda rule (see the module docstring)."""
    python = conda_python(spec)
    if spec.convention is not Convention.modelarts or python is None or not is_python(argv):
        return list(argv), {}
    lib = python.rsplit("/bin/", 1)[0] + "/lib"
    current = spec.env.get("LD_LIBRARY_PATH", "")
    return [python, *argv[1:]], {"LD_LIBRARY_PATH": f"{lib}:{current}" if current else lib}


def with_conventions(planner: PlanFunction) -> PlanFunction:
    """``planner`` with the conda rule applied to the command first (ModelArts convention only).

    The planner sees the variables the rule adds as part of the job's ``env`` (the MPI prefix
    forwards ``LD_LIBRARY_PATH`` only when the node has it).
    """

    @functools.wraps(planner)
    def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
        command, env = boot_command(spec, argv)
        seen = spec.model_copy(update={"env": {**spec.env, **env}}) if env else spec
        plans = planner(seen, placement, command)
        if env:
            for node in plans:
                node.env = {**env, **node.env}
                node.notes.append(f"ModelArts convention: conda env {spec.env['DEFAULT_CONDA_ENV_NAME']}")
        return plans

    return plan
