"""A job as a notebook: the seed's "create a development environment from a job" (4.3).

:func:`devenv_notebook` turns a job into an nbformat 4 notebook whose run submits the same job
again (``GET /api/v1/jobs/{id}/devenv``; ``ma-jupyter devenv JOB``; ``%ma_devenv JOB``).  It is
pure: the service hands it the job and the algorithm's Python files as its backend read them
(:meth:`~ma_jupyter.backends.base.Backend.code_sources`), and it writes nothing.

The notebook, in order:

1. A markdown cell naming the job (name, id, creator, status, spec) and what the code cell does.
2. A code cell tagged ``parameters``: ``%load_ext ma_jupyter`` and, when the job has secret
   variables, one ``SECRET_<NAME> = ""`` per secret, with a comment telling the user to fill
   them in (their values are never shown; papermill fills them with ``-p SECRET_<NAME> VALUE``).
3. The job's code cell:

   * a job made from a ``%%ma_train`` cell (its command is ``python
     /workspace/algorithm/<name>.py`` and that file is in its algorithm folder): ``%%ma_train``
     with the job's options, and that file as the body; ``--code-dir`` names the algorithm
     folder unless it is that cell's own snapshot (``<name>-<date>-<time>-<hex>`` holding only
     ``<name>.py`` as Python file);
   * any other regular job: ``%ma_train`` with the options, ``--code-dir`` (the algorithm
     folder) and ``--command`` (IPython refuses a cell magic without a body);
   * a batch job: ``%ma_train`` with one ``--task ALGO::COMMAND`` per task.

Rules of the option line:

1. Every option of ``%%ma_train`` whose field differs from the spec's default is given, and
   ``--name`` and ``--spec`` always; submitting the line gives the job's spec again, but for
   the name's creation fields (creator, and the algorithm, which becomes a fresh snapshot of the
   same code).
2. Values are quoted as a shell would (``shlex``), then escaped for IPython, which expands
   ``$name`` and ``{expression}`` in a magic's line (:func:`_escape`), so ``${MASTER_PORT}``
   and ``$HOME`` reach the job as written.  A value with a line break cannot be carried (400).
3. A secret is ``--secret-env {shlex.quote("NAME=" + SECRET_NAME)}``: the one expansion IPython
   is meant to make, from the parameters cell.
4. ``--grace`` sets both the stop grace period and, with ``--resume``, the checkpoint's: when
   a job has two different ones, the checkpoint's is given and the markdown cell says so.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from decimal import Decimal
from typing import Any

from ..errors import InvalidSpec
from ..models import (
    Access,
    CheckpointResume,
    Convention,
    Job,
    JobSpec,
    JobType,
    Mode,
    PerfPolicy,
    Priority,
)
from ..workspace_paths import script_command

#: the folder name of a cell's code snapshot (``client/snapshot.py``'s ``new_snapshot``)
_SNAPSHOT = r"-\d{8}-\d{6}-[0-9a-f]{6}$"
#: a ``$`` IPython would read as the start of ``$name`` (or of its ``$$`` escape)
_DOLLAR_NAME = re.compile(r"\$(?=[\w.$])")
_DEFAULT = JobSpec(name="default", command="true")
_DEFAULT_RESUME = CheckpointResume()


def file_name(job: Job) -> str:
    """The notebook's file name: ``<job name>-devenv.ipynb``."""
    return f"{job.spec.name}-devenv.ipynb"


def cell_script(spec: JobSpec) -> str | None:
    """The algorithm file a ``%%ma_train`` cell of this job became (``<name>.py``), judged from
    the command the magic gives such a job; None for any other job."""
    if spec.type is JobType.regular and spec.command == script_command(spec.name):
        return f"{spec.name}.py"
    return None


def devenv_notebook(job: Job, sources: dict[str, str] | None) -> dict[str, Any]:
    """The notebook (nbformat 4, as JSON) whose code cell submits ``job`` again.

    Args:
        job: the job, its secrets masked (only their names are used).
        sources: the Python files of its algorithm folder (path below it → text), or None when
            they could not be read; a cell job's body comes from them.
    """
    spec = job.spec
    notes: list[str] = []
    words = _options(spec, notes)
    script = cell_script(spec)
    body = (sources or {}).get(script) if script else None
    if body is not None:
        folder = posixpath.basename(posixpath.normpath(spec.algorithm or "/"))
        own_snapshot = re.fullmatch(re.escape(spec.name) + _SNAPSHOT, folder) and set(sources or {}) == {
            script
        }
        if not own_snapshot and spec.algorithm:
            words += ["--code-dir", spec.algorithm]
        source = "%%ma_train " + _line(words, spec) + "\n" + body.rstrip("\n")
    else:
        if spec.algorithm:
            words += ["--code-dir", spec.algorithm]
        if spec.type is JobType.batch:
            for task in spec.tasks:
                words += ["--task", f"{task.algorithm or ''}::{task.command}"]
        else:
            words += ["--command", spec.command or ""]
        source = "%ma_train " + _line(words, spec)
        if script:
            notes.append(
                f"The cell this job was made from ({script}) could not be read from its algorithm folder, so "
                "the cell runs the job's command with that folder instead."
            )
    cells = [_markdown(job, body is not None, notes), _setup_cell(spec), _code(source, "train")]
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "ma_jupyter": {"devenv_of": job.id},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _options(spec: JobSpec, notes: list[str]) -> list[str]:
    """The option words (unquoted) for every field the job set but the code and algorithm."""
    words = ["--name", spec.name]
    if spec.mode is not Mode.single:
        words += ["--mode", spec.mode.value]
    words += ["--spec", ",".join(spec.specs)]
    if spec.nodes != _DEFAULT.nodes:
        words += ["--nodes", str(spec.nodes)]
    if spec.ps:
        words += ["--ps", str(spec.ps)]
    if spec.chief:
        words.append("--chief")
    if spec.priority is not Priority.normal:
        words += ["--priority", spec.priority.value]
    if spec.access is not Access.ro:
        words += ["--access", spec.access.value]
    if spec.convention is not Convention.platform:
        words += ["--convention", spec.convention.value]
    if spec.duration is not None:
        words += ["--duration", _number(spec.duration)]
    if spec.fault_restart is not None:
        words += ["--restart", str(spec.fault_restart.max_restarts)]
    resume = spec.checkpoint_resume
    if resume is not None:
        words += ["--resume", str(resume.max_resumes)]
        if resume.elastic_min_nodes is not None:
            words += ["--elastic-min-nodes", str(resume.elastic_min_nodes)]
        if resume.allow_scale_up:
            words.append("--allow-scale-up")
        if resume.perf_threshold is not None:
            words += ["--perf-threshold", _number(resume.perf_threshold)]
        if resume.perf_policy is not PerfPolicy.alert:
            words += ["--perf-policy", resume.perf_policy.value]
    words += _grace(spec, notes)
    for mount in spec.datasets:
        text = _mount_name(mount.source.value, "private", mount.name, mount.version)
        words += ["--dataset", f"{text}={mount.path}{_suffix(mount.path, not mount.read_only)}"]
    for mount in spec.annotations:
        words += ["--annotation", f"{mount.name}={mount.path}"]
    for mount in spec.models:
        text = _mount_name(mount.source.value, "private", mount.name, mount.version)
        words += ["--model", f"{text}={mount.path}{_suffix(mount.path, False)}"]
    for mount in spec.volumes:
        words += ["--volume", f"{mount.name}={mount.path}"]
    if not spec.algorithm_read_only:
        words.append("--code-writable")
    if spec.outputs:
        words += ["--output", spec.outputs]
    if spec.workdir:
        words += ["--workdir", spec.workdir]
    if spec.data_preparation:
        words.append("--data-preparation")
    for key, value in spec.env.items():
        words += ["--env", f"{key}={value}"]
    image = spec.image
    if image.name:  # a registered image: named again, as it is when the notebook runs
        words += ["--image", image.name]
    elif image.python or image.venv or image.conda_env:
        words += ["--image", image.python or image.venv or f"conda:{image.conda_env}"]
    for option, value in (
        ("--node-name", spec.node_name),
        ("--driver-version", spec.driver_version),
        ("--pool", spec.pool),
        ("--on-start", spec.lifecycle.on_start),
        ("--on-stop", spec.lifecycle.on_stop),
    ):
        if value is not None:
            words += [option, value]
    if spec.debug_terminal:
        words.append("--debug-terminal")
    return words


def _grace(spec: JobSpec, notes: list[str]) -> list[str]:
    """``--grace`` (rule 4 of the module)."""
    stop, resume = spec.grace_period, spec.checkpoint_resume
    if resume is None:
        return [] if stop == _DEFAULT.grace_period else ["--grace", _number(stop)]
    if resume.grace_period == stop:
        return ["--grace", _number(stop)]
    if stop == _DEFAULT.grace_period and resume.grace_period == _DEFAULT_RESUME.grace_period:
        return []
    notes.append(
        f"The job's stop grace period was {_number(stop)} s and its checkpoint's {_number(resume.grace_period)} s; "
        "--grace sets both, so the cell gives the checkpoint's."
    )
    return ["--grace", _number(resume.grace_period)]


def _mount_name(source: str, default: str, name: str, version: str | None) -> str:
    return ("" if source == default else f"{source}/") + name + (f"@{version}" if version else "")


def _suffix(path: str, writable: bool) -> str:
    """``:rw`` for a writable mount; ``:ro`` when the path itself ends like a suffix (kept whole)."""
    if writable:
        return ":rw"
    return ":ro" if path.endswith((":rw", ":ro")) else ""


def _number(value: float) -> str:
    """A number as the options read it: no exponent (``parse_duration`` takes digits only)."""
    if float(value).is_integer():
        return str(int(value))
    return format(Decimal(repr(float(value))), "f")  # the shortest exact digits, never 1e-07


def _escape(text: str) -> str:
    """Rule 2: a quoted word as IPython must see it to hand the magic that word.

    IPython formats a magic's line with ``str.format`` (``{expression}``) and its own ``$name``
    (``$$`` is its escape, but not inside single quotes, where ``$name`` is left alone): a brace
    is doubled, and a ``$`` that could start a ``$name`` becomes the expression ``{"$"}``, which
    is the same everywhere.  ``${VAR}`` needs only its braces doubled: ``${{VAR}}``.
    """
    doubled = text.replace("{", "{{").replace("}", "}}")
    return _DOLLAR_NAME.sub('{"$"}', doubled)


def _line(words: list[str], spec: JobSpec) -> str:
    """The option line: each word quoted and escaped (rule 2), then the secrets (rule 3).

    Raises:
        InvalidSpec: a value holds a line break, which a magic's line cannot carry.
    """
    for word in words:
        if "\n" in word or "\r" in word:
            raise InvalidSpec(
                f"the job's {word.splitlines()[0][:60]!r}... spans several lines, which a notebook cell's option "
                "line cannot carry: clone the job instead (ma-jupyter clone JOB)"
            )
    line = " ".join(_escape(shlex.quote(w)) for w in words)
    for name in spec.secret_env:
        line += f' --secret-env {{shlex.quote("{name}=" + {_secret_variable(name)})}}'
    return line


def _secret_variable(name: str) -> str:
    return f"SECRET_{name}"


def _setup_cell(spec: JobSpec) -> dict[str, Any]:
    """Loads the magics; defines the secrets' variables (rule 3) when the job has any."""
    lines = ["%load_ext ma_jupyter"]
    if spec.secret_env:
        lines += [
            "",
            "# This job's secret variables: their values are never shown. Fill each in before running the",
            "# next cell (papermill: -p SECRET_<NAME> VALUE).",
            "import shlex",
            "",
        ]
        lines += [f'{_secret_variable(name)} = ""  # fill in' for name in spec.secret_env]
    cell = _code("\n".join(lines), "setup")
    cell["metadata"]["tags"] = ["parameters"]
    return cell


def _markdown(job: Job, from_cell: bool, notes: list[str]) -> dict[str, Any]:
    spec = job.spec
    lines = [
        f"# Development environment of job `{spec.name}`",
        "",
        f"Made from job `{job.id}` ({job.status.value}"
        + (f", by {spec.creator}" if spec.creator else "")
        + f", created {job.created_at.strftime('%Y-%m-%d %H:%M:%S %Z').strip()}"
        + (f", ran on `{job.chosen_spec}`" if job.chosen_spec else "")
        + ").",
        "",
        (
            "The next cell is the `%%ma_train` cell it was made from, with its options: change what you need "
            "and run it to submit the job again."
            if from_cell
            else "The next cell submits the job again with its options and command: change what you need "
            "and run it."
        ),
    ]
    if spec.algorithm:
        lines += ["", f"Its algorithm folder: `{spec.algorithm}`."]
    if spec.secret_env:
        names = ", ".join(f"`{name}`" for name in spec.secret_env)
        lines += [
            "",
            f"Its secret variables ({names}) are never shown: fill them in in the cell tagged `parameters`.",
        ]
    for note in notes:
        lines += ["", note]
    return {"cell_type": "markdown", "id": "job", "metadata": {}, "source": "\n".join(lines)}


def _code(source: str, cell_id: str) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": cell_id,
        "metadata": {},
        "outputs": [],
        "source": source,
    }
