"""The one job-options parser shared by ``ma-jupyter submit`` and the ``%%ma_train`` magic.

:func:`build_parser` gives an :class:`OptionsParser` (argparse, but errors raise
:class:`~ma_jupyter.errors.InvalidSpec` instead of exiting the interpreter) carrying every job
option; a front end adds its own options to it (or passes its own parser in).
:func:`spec_from_args` turns the parsed namespace into a sparse JobSpec dict: only the fields the
user gave, so it can be laid over a ``base`` (a job being cloned, a form's values) and validated
with :func:`ma_jupyter.models.parse_spec`.

Host paths (``--dataset``, ``--code-dir``, ``--output``...) are made absolute against the current
directory, because the service resolves them in its own working directory, not the caller's.

Why one module (over 600 lines): it is the one options parser the CLI's ``submit`` and
``%%ma_train`` share (one owner of every job option): the options' declarations and their
translation into a spec must change together, option by option.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import spectext
from ..client.spec import check, host_path
from ..errors import InvalidSpec, OptionsExit
from ..wire import (
    Access,
    Convention,
    DatasetSource,
    HangPolicy,
    JobType,
    Mode,
    ModelSource,
    PerfPolicy,
    Priority,
    parse_duration,
)

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from ..models import JobSpec

# Namespace attributes that steer a front end and are not part of the job.

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, as it reckons them: ``$COLUMNS`` when a positive
    number, else the width of standard output's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter, as wide as argparse makes it, without importing :mod:`shutil`
    for the width: argparse makes a formatter at each option added, and ``shutil`` (with its
    ``bz2``, ``lzma`` and ``zlib``) cost every command line ~3 ms."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width=None):
        if width is None:
            width = _terminal_columns() - 2  # what argparse subtracts
        super().__init__(prog, indent_increment, max_help_position, width)


class OptionsParser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of calling :func:`sys.exit`.

    Usage errors raise :class:`InvalidSpec` (the message is argparse's, plus a pointer to
    ``--help``); ``--help`` prints the help and raises :class:`OptionsExit` with status 0.
    Its help is formatted by :class:`HelpFormatter` unless another ``formatter_class`` is given.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise InvalidSpec(f"{message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise InvalidSpec((message or f"{self.prog}: invalid arguments").strip())
        raise OptionsExit(status, message)


def add_job_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every job option (and ``--dry-run``, ``--wait``, ``--json``) to ``parser``.

    Every option defaults to ``None`` so :func:`spec_from_args` can tell what the user gave.

    Args:
        parser: any ArgumentParser (a CLI sub-command, the magic's parser).

    Returns:
        The same parser.
    """
    job = parser.add_argument_group("job")
    job.add_argument("--name", help="job name (letters, digits, '-', '_', '.'); default from the command")
    job.add_argument("--type", choices=[t.value for t in JobType], help="regular (default) or batch")
    job.add_argument(
        "--task",
        action="append",
        metavar="ALGO_DIR::COMMAND",
        help="a batch task: its algorithm folder and command (repeatable; implies --type batch)",
    )
    job.add_argument("--mode", choices=[m.value for m in Mode], help="distributed mode (default single)")
    job.add_argument(
        "--spec",
        action="append",
        metavar="SPEC",
        help="compute spec; repeat (or comma-separate) for equivalent specs, the first that can start wins",
    )
    job.add_argument("--nodes", type=_count("--nodes", 1), help="node count (default 1)")
    job.add_argument("--ps", type=_count("--ps", 0), help="TensorFlow parameter servers (0: AllReduce)")
    job.add_argument("--chief", action="store_true", default=None, help="TensorFlow: add a chief task")
    job.add_argument("--priority", choices=[p.value for p in Priority], help="queue priority")
    job.add_argument(
        "--access", choices=[a.value for a in Access], help="what others may do with the job (default ro)"
    )
    job.add_argument("--convention", choices=[c.value for c in Convention], help="launch conventions")
    job.add_argument("--duration", metavar="TIME", help="run duration: seconds or 30m, 2h, 1d12h")
    job.add_argument(
        "--restart", type=_count("--restart", 1), metavar="N", help="fault restart, at most N times"
    )
    job.add_argument(
        "--resume", type=_count("--resume", 1), metavar="N", help="checkpoint resume, at most N times"
    )
    job.add_argument(
        "--grace",
        metavar="TIME",
        help="time between SIGTERM and SIGKILL on stop (and to save a checkpoint with --resume): seconds or 30s, 2m",
    )
    job.add_argument(
        "--elastic-min-nodes", type=_count("--elastic-min-nodes", 1), metavar="N", help="with --resume"
    )
    job.add_argument(
        "--allow-scale-up",
        action="store_true",
        default=None,
        help="with --elastic-min-nodes: grow back to --nodes when nodes free up",
    )
    job.add_argument("--perf-threshold", metavar="RATIO", help="with --resume: hardware/e2e time limit")
    job.add_argument("--perf-policy", choices=[p.value for p in PerfPolicy], help="with --perf-threshold")
    job.add_argument(
        "--hang-policy",
        choices=[p.value for p in HangPolicy],
        help="a job with no log output and almost no CPU for [limits] hang_minutes: alert (default) or stop it",
    )

    data = parser.add_argument_group("data and workspace")
    data.add_argument(
        "--code-dir", metavar="PATH", help="folder shown at /workspace/algorithm (the algorithm)"
    )
    data.add_argument(
        "--code-writable", action="store_true", default=None, help="mount the algorithm folder writable"
    )
    data.add_argument(
        "--dataset",
        action="append",
        metavar="[SOURCE/]NAME[@VERSION]=PATH[:rw]",
        help="dataset at /workspace/dataset/<source>/<name> (read-only unless :rw; source private|favorite)",
    )
    data.add_argument(
        "--annotation",
        action="append",
        metavar="NAME=PATH",
        help="annotations at /workspace/anno_dataset/<name>",
    )
    data.add_argument(
        "--model",
        action="append",
        metavar="[SOURCE/]NAME[@VERSION]=PATH",
        help="model at /workspace/model/<source>/<name> (read-only; source pretrained|private|favorite)",
    )
    data.add_argument(
        "--volume", action="append", metavar="NAME=PATH", help="writable volume at /workspace/volume/<name>"
    )
    data.add_argument(
        "--output",
        metavar="PATH",
        help="folder shown at /workspace/outputs (writable), or s3://BUCKET/PREFIX (obs://): uploaded while the job runs",
    )
    data.add_argument("--workdir", metavar="PATH", help="working directory inside the node")
    data.add_argument(
        "--data-preparation", action="store_true", default=None, help="prepare data (read-only datasets only)"
    )
    data.add_argument(
        "--storage-env",
        action="store_true",
        default=None,
        help="give your object storage credentials (AWS_*) to the job's own environment too",
    )

    run = parser.add_argument_group("environment and placement")
    run.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="environment variable for every node (repeatable)"
    )
    run.add_argument(
        "--secret-env",
        action="append",
        metavar="KEY=VALUE",
        help="secret environment variable: given to the nodes only, shown as *** (repeatable)",
    )
    run.add_argument(
        "--image",
        metavar="PYTHON|VENV|conda:ENV|NAME",
        help="Python environment: interpreter, venv folder, conda env, or a registered image's name "
        "(ma-jupyter images list)",
    )
    run.add_argument(
        "--node-name", metavar="NODE", help="run on this node (excludes --driver-version, --pool)"
    )
    run.add_argument("--driver-version", metavar="VERSION", help="only nodes with this driver version")
    run.add_argument("--pool", metavar="POOL", help="dedicated resource pool")
    run.add_argument("--on-start", metavar="COMMAND", help="lifecycle script run on every node at start")
    run.add_argument("--on-stop", metavar="COMMAND", help="lifecycle script run on every node at stop")
    run.add_argument("--debug-terminal", action="store_true", default=None, help="keep a debug terminal")

    control = parser.add_argument_group("control")
    control.add_argument(
        "--dry-run",
        action="store_true",
        help="show the resolved per-node plan (argv, env, files, mounts); submit nothing",
    )
    control.add_argument("--wait", action="store_true", help="wait for the job to end")
    control.add_argument("--json", action="store_true", help="print JSON")
    return parser


def build_parser(
    prog: str = "ma-jupyter submit",
    parser: argparse.ArgumentParser | None = None,
    *,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """The job-options parser.

    Args:
        prog: program name shown in usage and errors (e.g. ``%%ma_train``).
        parser: an existing parser to add the job options to; by default a new
            :class:`OptionsParser` (raises :class:`InvalidSpec` / :class:`OptionsExit` instead of
            exiting). Add front-end options to the returned parser with ``add_argument``.
        description: help text for a new parser.

    Returns:
        The parser carrying every job option.
    """
    if parser is None:
        parser = OptionsParser(prog=prog, description=description or "Submit a training job.")
    return add_job_options(parser)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | str) -> argparse.Namespace:
    """Parse ``argv`` (a list, or a command-line string split like a shell would) with ``parser``.

    Raises:
        InvalidSpec: unknown options, bad values, unbalanced quotes.
        OptionsExit: ``--help`` was given (the help has been printed).
    """
    if isinstance(argv, str):
        try:
            argv = shlex.split(argv)
        except ValueError as exc:
            raise InvalidSpec(f"cannot split the options ({exc}): check the quotes") from exc
    return parser.parse_args(list(argv))


def spec_from_args(
    args: argparse.Namespace,
    *,
    command: str | Sequence[str] | None = None,
    base: JobSpec | dict[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    validate: bool = True,
) -> dict[str, Any]:
    """The JobSpec fields the options give, laid over ``base``.

    Args:
        args: a namespace from a parser built by :func:`build_parser`; options that were not
            given (``None``) leave ``base`` alone.
        command: the run command: a string as typed, or an argv list (quoted with
            :func:`shlex.join`; a single element with spaces is taken as the command text).
            ``None`` keeps ``args.command`` if the namespace has one, else ``base``'s.
        base: fields to start from (a cloned job, a form); the options override them. Lists of
            mounts are merged by name, ``--env`` into the base env.
        cwd: folder relative host paths are resolved against (default the current directory).
        validate: check the result with :func:`ma_jupyter.client.spec.check`.

    Returns:
        A dict of JobSpec fields (only those set by ``base`` or the options), ready for
        ``Client.submit`` / ``Client.plan``. A missing ``--name`` is derived from the command.

    Raises:
        InvalidSpec: a value is malformed or the resulting job breaks a rule; the message says
            which option and what is expected.
    """
    root = Path(cwd) if cwd is not None else Path.cwd()
    if hasattr(base, "model_dump"):  # a JobSpec
        spec: dict[str, Any] = base.model_dump(mode="json", exclude_unset=True)
    else:
        spec = dict(base or {})
    spec.pop("creator", None)  # the service fills it in from the caller
    get = lambda name: getattr(args, name, None)  # noqa: E731 - namespaces from extended parsers

    if command is None:
        command = get("command")
    command_text = _command_text(command)
    if command_text is not None:
        spec["command"] = command_text

    simple = {
        "name": "name",
        "type": "type",
        "mode": "mode",
        "nodes": "nodes",
        "ps": "ps",
        "chief": "chief",
        "priority": "priority",
        "access": "access",
        "convention": "convention",
        "node_name": "node_name",
        "driver_version": "driver_version",
        "pool": "pool",
        "workdir": "workdir",
        "data_preparation": "data_preparation",
        "storage_env": "storage_env",
        "debug_terminal": "debug_terminal",
        "hang_policy": "hang_policy",
    }
    for option, field in simple.items():
        value = get(option)
        if value is not None:
            spec[field] = value

    if get("spec"):
        names = [s.strip() for item in get("spec") for s in item.split(",") if s.strip()]
        if not names:
            raise InvalidSpec(
                "--spec needs a spec name, e.g. --spec cpu.small (see `ma-jupyter specs`)", field="specs"
            )
        spec["specs"] = names

    if get("duration") is not None:
        try:
            spec["duration"] = parse_duration(get("duration"))
        except ValueError as exc:
            raise InvalidSpec(f"--duration: {exc}", field="duration") from exc

    try:  # the same forms as --duration: 30, 30s, 2m
        grace = parse_duration(get("grace"))
    except ValueError as exc:
        raise InvalidSpec(f"--grace: {exc}", field="grace_period") from exc
    if grace is not None:
        spec["grace_period"] = grace
    if get("restart") is not None:
        spec["fault_restart"] = {**(spec.get("fault_restart") or {}), "max_restarts": get("restart")}
    resume_fields: dict[str, Any] = {}
    if get("resume") is not None:
        resume_fields["max_resumes"] = get("resume")
    if get("elastic_min_nodes") is not None:
        resume_fields["elastic_min_nodes"] = get("elastic_min_nodes")
    if get("allow_scale_up"):
        resume_fields["allow_scale_up"] = True
    threshold = _positive_float(get("perf_threshold"), "--perf-threshold", "a ratio, e.g. 1.5")
    if threshold is not None:
        resume_fields["perf_threshold"] = threshold
    if get("perf_policy") is not None:
        resume_fields["perf_policy"] = get("perf_policy")
    if resume_fields or (grace is not None and spec.get("checkpoint_resume")):
        if get("resume") is None and not spec.get("checkpoint_resume"):
            raise InvalidSpec(
                "--elastic-min-nodes, --allow-scale-up, --perf-threshold and --perf-policy need --resume N",
                field="checkpoint_resume",
            )
        resume = {**(spec.get("checkpoint_resume") or {}), **resume_fields}
        if grace is not None:
            resume["grace_period"] = grace  # the same SIGTERM-to-SIGKILL window saves the checkpoint
        spec["checkpoint_resume"] = resume

    if get("code_dir") is not None:
        spec["algorithm"] = host_path(get("code_dir"), root)
    if get("code_writable"):
        spec["algorithm_read_only"] = False
    if get("output") is not None:
        spec["outputs"] = host_path(get("output"), root)

    if get("dataset"):
        spec["datasets"] = _merge_mounts(spec.get("datasets"), [_dataset(v, root) for v in get("dataset")])
    if get("annotation"):
        spec["annotations"] = _merge_mounts(
            spec.get("annotations"), [_plain_mount(v, root, "--annotation") for v in get("annotation")]
        )
    if get("model"):
        spec["models"] = _merge_mounts(spec.get("models"), [_model(v, root) for v in get("model")])
    if get("volume"):
        spec["volumes"] = _merge_mounts(
            spec.get("volumes"), [_plain_mount(v, root, "--volume") for v in get("volume")]
        )

    for option, field in (("env", "env"), ("secret_env", "secret_env")):
        if not get(option):
            continue
        env = dict(spec.get(field) or {})
        flag = "--" + option.replace("_", "-")
        for item in get(option):
            key, sep, value = item.partition("=")
            if not sep or not key:
                # the value of a secret is never echoed back
                shown = item if field == "env" else f"{key}=..."
                raise InvalidSpec(f"{flag} {shown!r}: expected KEY=VALUE, e.g. {flag} LR=0.01", field=field)
            env[key] = value
        spec[field] = env

    if get("image") is not None:
        spec["image"] = _image(get("image"), root)

    lifecycle = dict(spec.get("lifecycle") or {})
    for option, field in (("on_start", "on_start"), ("on_stop", "on_stop")):
        if get(option) is not None:
            lifecycle[field] = get(option)
    if lifecycle:
        spec["lifecycle"] = lifecycle

    if get("task"):
        spec["tasks"] = [_task(v, root) for v in get("task")]
        spec.setdefault("type", JobType.batch.value)
        if get("type") is None:
            spec["type"] = JobType.batch.value
        if command_text is None:
            spec.pop("command", None)

    if not spec.get("name"):
        spec["name"] = derive_name(spec)
    if validate:
        check(spec, cwd=root)
    return spec


def derive_name(spec: dict[str, Any]) -> str:
    """A job name from the command: the script's stem (``train.py`` → ``train``), else the executable."""
    text = spec.get("command") or next((t.get("command") for t in spec.get("tasks") or []), None)
    words: list[str] = []
    if text:
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
    stem = next((Path(w).stem for w in words if w.endswith(".py")), None)
    if stem is None and words:
        stem = Path(words[0]).name
    name = _INVALID_NAME_CHARS.sub("-", stem or "job").strip("-._") or "job"
    return name[:63]


# ----------------------------------------------------------------------------- value parsing


def _count(option: str, minimum: int):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    convert.__name__ = option
    return convert


def _positive_float(value: Any, option: str, expected: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidSpec(f"{option} {value!r}: expected {expected}") from None
    if number <= 0:
        raise InvalidSpec(f"{option} must be positive: expected {expected}")
    return number


def _command_text(command: str | Sequence[str] | None) -> str | None:
    if command is None:
        return None
    if isinstance(command, str):
        return command.strip() or None
    parts = [str(p) for p in command]
    if parts and parts[0] == "--":
        parts = parts[1:]
    if not parts:
        return None
    if len(parts) == 1:
        # one argument holding a whole command line: ma-jupyter submit -- "python train.py --lr 1"
        return parts[0]
    return shlex.join(parts)


def _split_mount(text: str, option: str, example: str) -> re.Match[str]:
    match = spectext.split_mount(text)
    if match is None:
        raise InvalidSpec(f"{option} {text!r}: expected {example}", field=option.lstrip("-") + "s")
    return match


def _dataset(text: str, root: Path) -> dict[str, Any]:
    example = (
        f"{spectext.MOUNT_FORMAT}[{spectext.READ_WRITE}], e.g. --dataset mnist=./data or "
        "--dataset favorite/mnist@v2=/data:rw"
    )
    match = _split_mount(text, "--dataset", example)
    path, read_only = match["path"], True
    for suffix, ro in ((spectext.READ_WRITE, False), (spectext.READ_ONLY, True)):
        if path.endswith(suffix):
            path, read_only = path[: -len(suffix)], ro
    mount: dict[str, Any] = {"name": match["name"], "path": host_path(path, root), "read_only": read_only}
    if match["source"]:
        mount["source"] = _choice(match["source"], DatasetSource, "--dataset source")
    if match["version"]:
        mount["version"] = match["version"]
    return mount


def _model(text: str, root: Path) -> dict[str, Any]:
    example = (
        f"{spectext.MOUNT_FORMAT}, e.g. --model resnet=./weights or --model pretrained/bert=/models/bert"
    )
    match = _split_mount(text, "--model", example)
    path = match["path"].removesuffix(spectext.READ_ONLY)
    if path.endswith(spectext.READ_WRITE):
        raise InvalidSpec(
            "--model mounts are always read-only: drop ':rw' (use --volume for writable storage)"
        )
    mount: dict[str, Any] = {"name": match["name"], "path": host_path(path, root)}
    if match["source"]:
        mount["source"] = _choice(match["source"], ModelSource, "--model source")
    if match["version"]:
        mount["version"] = match["version"]
    return mount


def _plain_mount(text: str, root: Path, option: str) -> dict[str, Any]:
    match = _split_mount(text, option, f"NAME=PATH, e.g. {option} cache=./cache")
    if match["source"] or match["version"]:
        raise InvalidSpec(f"{option} {text!r}: expected NAME=PATH (no source or version)")
    return {"name": match["name"], "path": host_path(match["path"], root)}


def _choice(value: str, enum: type, what: str) -> str:
    allowed = [e.value for e in enum]
    if value not in allowed:
        raise InvalidSpec(f"{what} {value!r}: choose one of {', '.join(allowed)}")
    return value


def _merge_mounts(existing: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(m: dict[str, Any]) -> tuple:
        return (m.get("source"), m["name"], m.get("version"))

    merged = {key(m): dict(m) for m in existing or []}
    for mount in new:
        if key(mount) in {key(m) for m in new if m is not mount}:
            raise InvalidSpec(f"{mount['name']!r} is mounted twice: give each mount once")
        merged[key(mount)] = mount
    return list(merged.values())


def image_environment(text: str, root: Path) -> dict[str, str]:
    """The environment an image text names (an interpreter, a virtualenv folder or
    ``conda:ENV``, never a registered image's name): what ``ma-jupyter images add`` registers.

    Raises:
        InvalidSpec: it names none of them.
    """
    image = _image(text if "/" in text or text.startswith(spectext.CONDA_PREFIX) else f"./{text}", root)
    return image


def _image(text: str, root: Path) -> dict[str, str]:
    # a bare name that is nothing in the current folder is a registered image (the service
    # checks it); anything with a '/', or a file or folder here, stays a path
    if spectext.IMAGE_NAME.match(text) and not os.path.lexists(root / text):
        return {"name": text}
    if text.startswith(spectext.CONDA_PREFIX):
        image = spectext.image_from_text(text, os.path.isdir)
        if not image["conda_env"]:
            raise InvalidSpec("--image conda: needs an env name, e.g. --image conda:torch", field="image")
        return image
    path = Path(host_path(text, root))
    image = spectext.image_from_text(str(path), os.path.isdir)
    if "venv" in image:
        if not (path / "bin" / "python").exists():
            raise InvalidSpec(
                f"--image {text!r} is a folder without bin/python: give a virtualenv folder, an interpreter "
                "path or conda:<env>",
                field="image",
            )
        return image
    if not path.exists():
        raise InvalidSpec(
            f"--image {text!r} does not exist: give an interpreter (e.g. /usr/bin/python3), a virtualenv "
            "folder or conda:<env>",
            field="image",
        )
    return image


def _task(text: str, root: Path) -> dict[str, Any]:
    parts = spectext.split_task(text)
    if parts is None or not parts[1]:
        raise InvalidSpec(
            f"--task {text!r}: expected ALGO_DIR{spectext.TASK_SEPARATOR}COMMAND, e.g. --task "
            f"./algo{spectext.TASK_SEPARATOR}'python train.py' (ALGO_DIR may be empty: "
            f"{spectext.TASK_SEPARATOR}COMMAND)",
            field="tasks",
        )
    algorithm, command = parts
    task: dict[str, Any] = {"command": command}
    if algorithm:
        task["algorithm"] = host_path(algorithm, root)
    return task
