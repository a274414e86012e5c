"""``ma-jupyter``: the job service from the command line.

Commands: ``service start|stop|status``, ``submit [options] -- COMMAND...``, ``clone JOB
[options]``, ``jobs``, ``get``, ``logs``, ``events``, ``wait``, ``stop``, ``delete``, ``update``,
``devenv``, ``export``, ``algorithms``, ``specs``, ``nodes``, ``cluster``, ``tensorboard``, ``shell JOB [--node N] [-- CMD]``, ``cache``, ``data list|rm``, ``whoami``, ``users
list|add|remove|token``.  A JOB argument is a job id or the exact name of a single job.

``export JOB --format k8s`` prints what the job would be on a Kubernetes cluster (YAML for
``kubectl apply -f``); ``submit --dry-run --format k8s ...`` does the same for a job not
submitted.

Every command acts as the user of ``$MA_JUPYTER_TOKEN``, else as the service owner (whose token
is in the service's runtime file).

Exit codes: 0 success; ``wait`` and ``submit --wait`` exit 1 unless the job succeeded; a user
error prints one line ``error: <message>`` to stderr and exits 2; an interrupt exits 130; any
other failure (a file the command cannot read, a broken connection, a bug) prints one line
``error: <what>: <message>`` and exits 1, never a traceback (``MA_JUPYTER_DEBUG=1`` shows it).
``delete A B C`` deletes each job it can, says on stderr why any other was not (one line per
job, then ``error: N of M jobs not deleted``) and then exits 2.  ``shell`` exits with the
status of the node's shell (or of its command), as ``ssh`` does.

Everything a command prints goes through :class:`~ma_jupyter.frontends.render.TerminalSafe`
(stdout and stderr): a job's logs, names, reasons, commands and events never drive the
reader's terminal; their control characters are shown (``^[``, ``\\x9b``: see
:func:`~ma_jupyter.frontends.render.terminal_text`), SGR colours kept on a terminal only.
The debug terminal (``shell``) is the one raw path: it is a terminal session by request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__, spectext
from ..client import Client, JobHandle
from ..client.logs import JobFollower, several_nodes, stream_label
from ..client.resolve import resolve_job
from ..errors import Conflict, InvalidSpec, MaJupyterError, NodeLost, NotFound
from ..wire import JobStatus, clone_name
from . import jobactions, options, render, usage
from .clusterview import cluster_text

if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from ..models import Job

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: where a NotFound tells the user to look for their jobs
_JOBS_HINT = "`ma-jupyter jobs`"


class _NotOnTheLine:
    """Stands in for the parser of a sub-command that the command line does not name: adding
    options (or groups, or sub-commands) to it does nothing (see :func:`build_cli`)."""

    def __init__(self, **_: Any):
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


class _Commands:
    """Adds the ``ma-jupyter`` sub-commands, each with its help; only the one ``chosen`` (every
    one when None) gets a real parser, the others a :class:`_NotOnTheLine`.

    Making an argparse parser is what costs (each looks for a translation catalogue of its
    headings on disk), so the stand-in is made where argparse makes a sub-command's parser, as
    its ``parser_class``.
    """

    def __init__(self, parser: argparse.ArgumentParser, chosen: str | None):
        self._chosen = chosen
        self._building: str | None = None
        self._subparsers = parser.add_subparsers(
            dest="cmd", metavar="COMMAND", required=True, parser_class=self._parser
        )

    def _parser(self, **kwargs: Any) -> Any:
        wanted = self._chosen in (None, self._building)
        return options.OptionsParser(**kwargs) if wanted else _NotOnTheLine()

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        self._building = name
        return self._subparsers.add_parser(name, **kwargs)


def build_cli(chosen: str | None = None) -> options.OptionsParser:
    """The ``ma-jupyter`` parser with one sub-command per action.

    With ``chosen`` (the sub-command a command line names), only that sub-command's options are
    built: every sub-command is still listed with its help (``ma-jupyter --help`` and an unknown
    command's error read the same), but a call does not pay for building the options of the
    twenty others (the job options of ``submit`` and ``clone`` above all).
    """
    parser = options.OptionsParser(
        prog="ma-jupyter", description="Task-style training jobs on this machine's job service."
    )
    parser.add_argument("--version", action="version", version=f"ma-jupyter {__version__}")
    commands = _Commands(parser, chosen)

    service = commands.add_parser("service", help="start, stop or inspect the job service")
    service.add_argument("action", choices=["start", "stop", "status"])
    service.add_argument("--json", action="store_true", help="print JSON")
    service.add_argument(
        "--backend",
        choices=["local", "ray"],
        help="start: what runs job nodes (default: [backend] of cluster.toml, else local)",
    )
    service.add_argument("--ray-address", help="start: the Ray cluster to run jobs on, HOST:PORT")

    submit = commands.add_parser(
        "submit",
        help="submit a job: ma-jupyter submit [options] -- COMMAND...",
        description="Submit a job. Put the command after `--`: ma-jupyter submit --spec cpu.small -- python train.py",
    )
    options.build_parser(parser=submit)
    _follow_option(submit)
    _export_options(submit, dry_run=True)
    submit.add_argument("command", nargs="*", help="the run command (after --)")

    clone = commands.add_parser(
        "clone",
        help="submit a copy of a job as your own: ma-jupyter clone JOB [options] [-- COMMAND...]",
        description="Submit a copy of a job (yours, or another user's you may view), with the "
        "options overriding its fields.",
    )
    clone.add_argument("job", metavar="JOB", help="job id (or the exact name of a single job)")
    options.build_parser(parser=clone)
    _follow_option(clone)
    _export_options(clone, dry_run=True)
    clone.add_argument("command", nargs="*", help="a new run command (after --); default the job's")

    jobs = commands.add_parser("jobs", help="list jobs")
    jobactions.add_list_filters(jobs)
    jobs.add_argument("--offset", type=int, default=0)
    jobs.add_argument("--json", action="store_true", help="print JSON")

    def job_command(name: str, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("job", metavar="JOB", help="job id (or the exact name of a single job)")
        if json_flag:
            sub.add_argument("--json", action="store_true", help="print JSON")
        return sub

    job_command("get", "show a job")
    logs = job_command("logs", "print a job's log", json_flag=False)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--node", help="only this node's log (worker-1, ps-0...); default every node's")
    logs.add_argument("--rank", type=int, help="a rank's own log")
    logs.add_argument("--offset", type=int, default=0, help="byte offset to start at")
    logs.add_argument(
        "--all",
        action="store_true",
        help="every node's log, each line prefixed with [node], also for one node (the default "
        "without --node; with --rank: that rank on every node)",
    )
    job_command("events", "print a job's events")
    top = job_command("top", "print a job's CPU and memory per node (now, mean, peak, limit)")
    top.add_argument("--follow", "-f", action="store_true", help="refresh until the job ends")
    wait = job_command("wait", "wait for a job to end (exit 0 if it succeeded)")
    wait.add_argument("--timeout", type=float, help="seconds to wait at most")
    job_command("stop", "stop a job")
    delete = commands.add_parser(
        "delete",
        help="delete finished jobs and their files: ma-jupyter delete JOB [JOB...]",
        description="Delete jobs, each on its own: one that cannot be deleted is reported and the "
        "others are still deleted; the exit code is 2 if any was not.",
    )
    delete.add_argument("jobs", nargs="+", metavar="JOB", help="job ids (or exact names of single jobs)")
    delete.add_argument("--force", action="store_true", help="stop each first if it still runs")
    update = job_command("update", "change a queued job's priority or a running job's duration")
    update.add_argument("--priority", choices=["normal", "urgent", "very-urgent"])
    update.add_argument("--duration", help="seconds or 30m, 2h, 1d")
    devenv = job_command(
        "devenv",
        "write a notebook that submits the job again (a development environment from the job)",
        json_flag=False,
    )
    devenv.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the notebook to write (default <job name>-devenv.ipynb; - prints it)",
    )
    devenv.add_argument(
        "--kernel",
        action="store_true",
        help="start the job's own environment instead: a dev environment job running a Jupyter kernel in a "
        "sandbox built as the job's node, and install its kernelspec for you",
    )
    devenv.add_argument("--node", help="with --kernel: the job's node (worker-1, or 1); default its first")
    exported = job_command(
        "export", "print what the job would be on another platform (Kubernetes)", json_flag=False
    )
    _export_options(exported, dry_run=False)
    shell = job_command(
        "shell",
        "open a terminal inside a running node's sandbox (jobs submitted with --debug-terminal)",
        json_flag=False,
    )
    shell.add_argument("--node", help="node (worker-0, ps-0...); default the job's first")
    shell.add_argument(
        "command",
        nargs="*",
        metavar="-- CMD",
        help="run this command on the node's terminal instead of a shell: ma-jupyter shell JOB -- ls /workspace",
    )
    tensorboard = job_command("tensorboard", "open the job's TensorBoard (prints its URL)", json_flag=False)
    tensorboard.add_argument("--stop", action="store_true", help="stop it instead")

    algorithms = commands.add_parser(
        "algorithms",
        help="your algorithm folders and favourites: ma-jupyter algorithms [favourite|unfavourite FOLDER]",
        description="List the algorithm folders your jobs ran, each with how many versions (contents) "
        "they ran, and the ones you marked favourite (`ma-jupyter jobs --algorithm FOLDER` / "
        "`--favourites` lists their jobs), or mark and unmark one.",
    )
    algorithms.add_argument("action", nargs="?", choices=["list", "favourite", "unfavourite"], default="list")
    algorithms.add_argument(
        "folder", nargs="?", metavar="FOLDER", help="the algorithm folder to mark or unmark"
    )
    algorithms.add_argument(
        "--versions", action="store_true", help="list each folder's versions (the contents its jobs ran)"
    )
    algorithms.add_argument("--json", action="store_true", help="print JSON")

    specs = commands.add_parser("specs", help="list the compute specs")
    specs.add_argument("--json", action="store_true", help="print JSON")
    nodes = commands.add_parser(
        "nodes",
        help="list the nodes and what is in use; admins: drain/undrain NODE",
        description="`nodes` lists the nodes; `nodes drain NODE [--reason TEXT]` (admins) takes a node "
        "out of placement (jobs with checkpoint resume there checkpoint and resume elsewhere); "
        "`nodes undrain NODE` puts a drained or faulty node back.",
    )
    nodes.add_argument("action", nargs="?", choices=["drain", "undrain"], help="drain or undrain NODE")
    nodes.add_argument("node", nargs="?", help="the node to drain or undrain")
    nodes.add_argument("--reason", help="drain: why (shown in `nodes` and the jobs' events)")
    nodes.add_argument("--spec", help="only nodes that fit this spec")
    nodes.add_argument("--json", action="store_true", help="print JSON")
    cluster = commands.add_parser(
        "cluster", help="the cluster's resources: nodes, how many more of each spec can start, the queue"
    )
    cluster.add_argument("--spec", action="append", default=[], help="only nodes that fit this spec (repeat)")
    cluster.add_argument("--model", action="append", default=[], help="only this board model (repeat)")
    cluster.add_argument("--json", action="store_true", help="print JSON")

    whoami = commands.add_parser("whoami", help="the user you act as (from your token)")
    whoami.add_argument("--json", action="store_true", help="print JSON")
    notify = commands.add_parser(
        "notify",
        help="where your jobs' alerts and terminal states go: your webhook, your address",
        description="Without options: your settings. --webhook URL gets each event as a JSON POST; "
        "--address ADDR (a mail address, a chat handle) is in each event the administrator's [notify] "
        "command gets, which delivers it there. An option not given leaves its setting as it is.",
    )
    hook = notify.add_mutually_exclusive_group()
    hook.add_argument("--webhook", metavar="URL", help="an http(s) URL of yours")
    hook.add_argument("--no-webhook", action="store_true", help="forget your webhook")
    address = notify.add_mutually_exclusive_group()
    address.add_argument("--address", metavar="ADDR", help="where the administrator's command tells you")
    address.add_argument("--no-address", action="store_true", help="forget your address")
    notify.add_argument("--json", action="store_true", help="print JSON")
    images = commands.add_parser(
        "images",
        help="registered images: named Python environments with a scope and a card type",
        description="A registered image names a Python environment (--image NAME), with what it may be "
        "used for (training jobs, dev environments) and the cards it is built for: a job whose spec has "
        "other cards is refused.",
    )
    image_actions = images.add_subparsers(dest="action", metavar="ACTION", required=True)
    images_list = image_actions.add_parser("list", help="the images you may use (admins: every one)")
    images_list.add_argument("--json", action="store_true", help="print JSON")
    images_add = image_actions.add_parser("add", help="register an image")
    images_add.add_argument("name", metavar="NAME")
    images_add.add_argument(
        "environment", metavar="PYTHON|VENV|conda:ENV", help="its interpreter, virtualenv folder or conda env"
    )
    images_add.add_argument(
        "--card-type", choices=["cpu", "gpu", "mlu", "npu"], default="cpu", help="the cards it is built for"
    )
    images_add.add_argument(
        "--scope",
        action="append",
        choices=["training", "devenv"],
        help="what it may be used for (repeat; default both)",
    )
    images_add.add_argument("--public", action="store_true", help="every user's (admins only)")
    images_add.add_argument("--description", default="")
    images_add.add_argument("--json", action="store_true", help="print JSON")
    images_rm = image_actions.add_parser("rm", help="remove an image of yours (admins: any)")
    images_rm.add_argument("name", metavar="NAME")
    users = commands.add_parser("users", help="manage the service's users and their tokens (admins)")
    user_actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)
    users_list = user_actions.add_parser("list", help="every user: name, admin, created (never tokens)")
    users_list.add_argument("--json", action="store_true", help="print JSON")
    users_add = user_actions.add_parser("add", help="add a user and print its token (shown once)")
    users_add.add_argument("name", metavar="NAME")
    users_add.add_argument("--admin", action="store_true", help="the user may manage users and jobs of all")
    users_add.add_argument("--json", action="store_true", help="print JSON")
    users_token = user_actions.add_parser(
        "token", help="print a new token for a user (the old one stops working)"
    )
    users_token.add_argument("name", metavar="NAME")
    users_token.add_argument("--json", action="store_true", help="print JSON")
    users_remove = user_actions.add_parser("remove", help="remove a user: its token stops working at once")
    users_remove.add_argument("name", metavar="NAME")
    cache = commands.add_parser(
        "cache",
        help="show (or clear) your persistent cache, ~/.cache in every node of your jobs",
        description="Your jobs share one cache, ~/.cache in their nodes (compiled torch and DeepSpeed "
        "extensions, Hugging Face downloads, pip wheels): its size, or --clear to empty it.",
    )
    cache.add_argument("--clear", action="store_true", help="empty it (refused while a job of yours runs)")
    cache.add_argument("--all", action="store_true", help="every user's (admins only)")
    cache.add_argument("--json", action="store_true", help="print JSON")
    data = commands.add_parser(
        "data",
        help="list (or remove) prepared data, the dataset copies jobs with --data-preparation share",
        description="Jobs with --data-preparation read copies of their datasets, shared by every job "
        "naming the same unchanged source and removed after the retention an admin sets ([data] "
        "retention in cluster.toml, default 7 days).",
    )
    data_actions = data.add_subparsers(dest="action", required=True)
    data_list = data_actions.add_parser("list", help="the copies your jobs took (every one for admins)")
    data_list.add_argument("--json", action="store_true", help="print JSON")
    data_rm = data_actions.add_parser("rm", help="remove a copy now (refused while a job uses it)")
    data_rm.add_argument("key", metavar="KEY", help="its key, from data list")
    data_rm.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _follow_option(parser: argparse.ArgumentParser) -> None:
    """``--follow``/``-f`` of the commands that start a job (submit, clone)."""
    parser.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print the job's log as it is written, then wait for its end: every node's lines, "
        "each prefixed with [node] when the job has several",
    )
    parser.add_argument(
        "--follow-node",
        metavar="NODE",
        help="with --follow: only this node's log (worker-1, ps-0...), without the prefix",
    )
    parser.add_argument(
        "--stop-on-interrupt",
        action="store_true",
        help="with --follow or --wait: Ctrl-C stops the job (default: only detaches from it)",
    )


def _export_options(parser: argparse.ArgumentParser, *, dry_run: bool) -> None:
    """``--format``, ``--container-image``, ``--mounts-as`` (on submit and clone: with ``--dry-run``)."""
    group = parser.add_argument_group("export" + (" (with --dry-run)" if dry_run else ""))
    group.add_argument(
        "--format",
        metavar="FORMAT",
        default=None if dry_run else "k8s",
        help="k8s: Kubernetes manifests (an Indexed Job per role, a headless Service), YAML"
        + ("" if dry_run else " (the default)"),
    )
    group.add_argument("--container-image", metavar="IMAGE", help="the image (default: one for the mode)")
    group.add_argument(
        "--mounts-as",
        choices=["pvc", "hostpath"],
        help="the /workspace folders as PersistentVolumeClaim placeholders (default) or hostPath volumes",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ma-jupyter`` command; returns the exit code (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    stdout, stderr = sys.stdout, sys.stderr
    # every print of this command, job-made text included, is shown without driving the terminal
    sys.stdout, sys.stderr = render.TerminalSafe(stdout), render.TerminalSafe(stderr)
    try:
        return _command(argv)
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; everything after the first ``--`` is the run command.

    argparse alone fills a sub-command's ``command`` (``nargs="*"``) with nothing as soon as it
    meets the positional before it (``clone JOB``, ``shell JOB``), and then refuses the words
    after ``--`` when options came between (``clone JOB --name X -- python t.py``).  So the
    words after ``--`` are set aside first and become ``command`` of a sub-command that has
    one; for any other the whole line is parsed as it is (and ``--`` refused as usual).
    """
    # the first word is the sub-command unless it is an option (--help, --version, a mistake)
    parser = build_cli(argv[0] if argv and not argv[0].startswith("-") else None)
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if hasattr(args, "command"):
            args.command = argv[cut + 1 :]
            return args
    return parser.parse_args(argv)


def _command(argv: list[str]) -> int:
    try:
        try:
            args = parse_command_line(argv)
        except InvalidSpec as exc:
            if argv[:1] == ["submit"] and "--" not in argv and "unrecognized arguments" in exc.message:
                raise InvalidSpec(
                    f"{exc.message}; put the command after `--`: ma-jupyter submit [options] -- python train.py --lr 1"
                ) from None
            raise
        return _COMMANDS[args.cmd](args)
    except options.OptionsExit as exc:
        return exc.status
    except MaJupyterError as exc:
        _err(f"error: {render.one_line(exc.message)}")
        return EXIT_USAGE
    except TimeoutError as exc:
        _err(f"error: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `ma-jupyter logs JOB | head`: the reader left; nothing more to say
        getattr(sys.stderr, "stream", sys.stderr).close()
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - a command line answers in one line, whatever failed
        if os.environ.get("MA_JUPYTER_DEBUG") == "1":
            raise
        _err(
            f"error: {type(exc).__name__}: {render.one_line(str(exc)) or 'no message'} (MA_JUPYTER_DEBUG=1 shows where)"
        )
        return EXIT_FAILED


# --------------------------------------------------------------------------- commands


def _service(args: argparse.Namespace) -> int:
    service_args: list[str] = []
    if args.backend:
        service_args += ["--backend", args.backend]
    if args.ray_address:
        service_args += ["--ray-address", args.ray_address]
    client = Client(autostart=args.action == "start", service_args=service_args, plain=True)
    if args.action == "start":
        running = client.service_status()
        wanted = args.backend or ("ray" if args.ray_address else None)
        if running["running"] and wanted and running["backend"] != wanted:
            raise Conflict(
                f"a job service already runs for {running['home']} with the {running['backend']} backend: "
                "stop it first (`ma-jupyter service stop`; its jobs keep running)"
            )
        client.connect()
        status = client.service_status()
        text = f"job service running at {status['url']} (pid {status['pid']}, {status['backend']} backend)"
        _out(status if args.json else text, args)
        return EXIT_OK
    if args.action == "stop":
        status = client.service_status()
        stopped = client.shutdown_service()
        if args.json:
            _out({"stopped": stopped, "pid": status["pid"]}, args)
        else:
            print(
                f"stopped the job service (pid {status['pid']})" if stopped else "no job service was running"
            )
        return EXIT_OK
    status = client.service_status()
    if args.json:
        _out(status, args)
    elif status["running"]:
        print(
            f"running at {status['url']} (pid {status['pid']}, version {status['version']}, "
            f"{status['backend']} backend)"
        )
        print(f"home {status['home']}, log {status['log']}")
    else:
        print(f"not running (home {status['home']}); `ma-jupyter service start` starts it")
    return EXIT_OK if status["running"] else EXIT_FAILED


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
            _out(plan.model_dump(mode="json"), args)
        else:
            print(render.plan_text(plan), end="")
        return EXIT_OK
    if args.follow_node and not args.follow:
        raise InvalidSpec("--follow-node narrows what --follow prints: add --follow")
    handle = client.submit(spec)
    if handle.shipped:
        _err(handle.shipped)
    if not (args.wait or args.follow):
        _out(handle.info.model_dump(mode="json") if args.json else _submitted(handle), args)
        return EXIT_OK
    if not args.json:
        _err(_submitted(handle))
    try:
        if args.follow and not args.json:
            stream = (args.follow_node, None) if args.follow_node else None
            _follow_nodes(handle, stream=stream)
        final = handle.wait(check=False)
    except KeyboardInterrupt:
        return _interrupted(handle, stop=args.stop_on_interrupt)
    if not args.json:
        _print_alerts(handle)
    return _finished(final, args)


def _interrupted(handle: JobHandle, *, stop: bool = False) -> int:
    """Ctrl-C while following or waiting for a job: the CLI detaches and says so on stderr,
    with the commands that follow, stop or attach the job again (its id, never its name: the
    name may mean a newer job by then); with ``stop`` (``--stop-on-interrupt``) it asks the
    service to stop the job instead.  Exits 130 (the shell's code for an interrupt)."""
    job_id = handle.id
    sys.stdout.flush()
    if stop:
        handle.client.stop(job_id)
        _err(
            f"interrupted: stop requested for job {job_id} (`ma-jupyter logs {job_id} --follow` shows its end)"
        )
        return EXIT_INTERRUPTED
    _err(
        f"detached: job {job_id} keeps running\n"
        f"  follow it again:   ma-jupyter logs {job_id} --follow\n"
        f"  stop it:           ma-jupyter stop {job_id}\n"
        f"  in a notebook:     %ma_attach {job_id}"
    )
    return EXIT_INTERRUPTED


def _print_alerts(handle: JobHandle) -> None:
    """The job's alert events (performance, a multi-node job that did not run distributed), one
    line each on stderr, once the job has ended (``submit``/``clone`` with ``--follow`` or
    ``--wait``, ``logs --follow``, ``wait``): the job's success does not show them."""
    for event in handle.events():
        if event.alert:
            _err(f"ALERT{f' ({event.node})' if event.node else ''}: {render.one_line(event.reason)}")


def _clone(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    source = resolve_job(client, args.job).info
    if not args.name:
        args.name = clone_name(source.spec.name)
    base = source.spec.model_dump(mode="json", exclude={"creator"})
    spec = options.spec_from_args(args, command=args.command or None, base=base, validate=False)
    return _run(client, spec, args)


def _jobs(args: argparse.Namespace) -> int:
    page = Client(plain=True).job_page(offset=args.offset, **jobactions.list_filters(args))
    if args.json:
        _out(page.model_dump(mode="json"), args)
        return EXIT_OK
    by_algorithm = bool(args.algorithm)  # then a column says which ran its current content
    rows = [["ID", "NAME", "STATUS", "SPEC", "NODES", "CREATED", "ELAPSED"]]
    rows[0] += ["CODE"] if by_algorithm else []
    rows[0] += ["REASON"]  # last: the one column of free text
    for job in page.items:
        status = job.status.value + (f" #{job.queue_position + 1}" if job.queue_position is not None else "")
        rows.append(
            [
                job.id,
                job.spec.name,
                status,
                job.chosen_spec or ",".join(job.spec.specs),
                str(job.spec.nodes),
                render.clock(job.created_at),
                render.elapsed(job),
            ]
            + ([jobactions.code_version(job, page)] if by_algorithm else [])
            + [render.list_reason(job)]
        )
    print(render.text_table(rows), end="")
    shown = len(page.items)
    if page.total > args.offset + shown:
        print(f"({shown} of {page.total} jobs shown; use --offset/--limit for more)")
    return EXIT_OK


def _get(args: argparse.Namespace) -> int:
    job = resolve_job(Client(plain=True), args.job).info
    _out(job.model_dump(mode="json") if args.json else render.format_job(job), args)
    return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    if not args.follow:
        return _print_logs(handle, args)
    try:
        return _print_logs(handle, args)
    except KeyboardInterrupt:
        return _interrupted(handle)


def _print_logs(handle: JobHandle, args: argparse.Namespace) -> int:
    if args.rank is not None and args.node:  # the log is read from the file when it is here
        elsewhere = handle.info.rank_elsewhere(args.node, args.rank)
        if elsewhere is not None:
            raise NotFound(elsewhere)
    if args.all and (args.node or args.offset):
        raise InvalidSpec("--all reads every node from its start: drop --node and --offset")
    # one stream when one is named (a node, a rank, an offset within a stream); otherwise
    # every node's log, each line prefixed with its node when the job has several
    one_stream = bool(args.node or args.offset or (args.rank is not None and not args.all))
    if one_stream and args.follow and args.node:
        # one stream followed live (a line still being written shows as it stands)
        key = (args.node, args.rank)
        # an unknown node or rank is a NotFound now, not a follow that never ends
        handle.client.read_log(handle.id, node=args.node, rank=args.rank, offset=0, limit=1)
        lost = _follow_nodes(handle, stream=key, offsets={stream_label(key): args.offset})
        _print_alerts(handle)
        return EXIT_FAILED if lost else EXIT_OK
    if one_stream:
        try:
            _print_lines(handle.logs(follow=args.follow, node=args.node, rank=args.rank, offset=args.offset))
        except NodeLost as exc:  # what could be read is printed; then why the rest cannot be
            sys.stdout.flush()
            _err(render.one_line(exc.message))
            return EXIT_FAILED
        if args.follow:  # the job has ended: what its success does not show
            _print_alerts(handle)
        return EXIT_OK
    if args.follow:
        lost = _follow_nodes(handle, rank=args.rank, prefixed=args.all)
        _print_alerts(handle)
    else:
        lost = _print_all_nodes(handle, rank=args.rank, prefixed=args.all)
    return EXIT_FAILED if lost else EXIT_OK


def _print_all_nodes(handle: JobHandle, *, rank: int | None, prefixed: bool) -> list[str]:
    """What every node's log holds now, node after node, lines prefixed with ``[node]``
    (``[node/rank-r]`` with ``--rank``) when the job has several nodes (or ``--rank``); the
    streams whose log is gone with their node's machine, each named on stderr with why."""
    lost: list[str] = []
    nodes = jobactions.every_node(handle)
    prefixed = prefixed or rank is not None or len(nodes) > 1 or several_nodes(handle.info)
    for log in jobactions.node_logs(handle, nodes, rank):
        for line in log:
            print(f"[{log.label}] {render.visible_line(line)}" if prefixed else render.visible_line(line))
        if log.lost is not None:  # the other nodes are still read
            sys.stdout.flush()
            _err(f"[{log.label}] {render.one_line(log.lost)}" if prefixed else render.one_line(log.lost))
            lost.append(log.label)
    return lost


def _follow_nodes(
    handle: JobHandle,
    *,
    stream: tuple[str, int | None] | None = None,
    rank: int | None = None,
    prefixed: bool = False,
    offsets: dict[str, int] | None = None,
) -> list[str]:
    """Print a job's log as it is written until the job has ended, through the front ends'
    one :class:`~ma_jupyter.client.logs.JobFollower`: every node's lines in arrival order,
    each prefixed with ``[node]`` when the job has several or ``prefixed`` (or only ``stream``;
    with ``rank`` that rank's log on every node, ``[node/rank-r]``).  Then each stream whose log is gone
    with its node's machine is named on stderr with why; returns those streams.

    On a terminal, a line the job is still writing (a progress bar redrawn with ``\r``) is
    shown as it stands on the last row, redrawn in place until its newline comes (the newest
    such line of all streams); a pipe or a file gets whole lines only, each once."""
    follower = JobFollower(
        handle.client, handle.info, stream=stream, rank=rank, prefixed=prefixed, offsets=offsets
    )
    write, visible = sys.stdout.write, render.visible_line
    live = sys.stdout.isatty()
    showing = False  # whether the last row holds an unfinished line
    current: dict[tuple[str, int | None], str] = {}  # each stream's unfinished line, newest last
    try:
        for items, partials in follower.updates():
            if showing:
                _control("\r\x1b[K")  # the unfinished line makes room for what came
                showing = False
            for key, line in items:
                write(f"{follower.prefix(key)}{visible(line)}\n")
            if live:
                for key, text in partials.items():
                    current.pop(key, None)
                    if text:
                        current[key] = text
                if current:
                    key, text = next(reversed(current.items()))
                    write(render.fit_width(f"{follower.prefix(key)}{visible(text)}", _columns()))
                    showing = True
            sys.stdout.flush()  # a follower sees each line as soon as the job prints it
    finally:
        if showing:
            _control("\r\x1b[K")  # an interrupt leaves no half line behind
        sys.stdout.flush()
    for label, why in follower.unavailable.items():
        _err(f"[{label}] {render.one_line(why)}" if follower.several else render.one_line(why))
    if follower.errors:
        print("log read problems: " + "; ".join(follower.errors), file=sys.stderr)
    return list(follower.unavailable)


def _events(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    events = handle.events()
    if args.json:
        _out([e.model_dump(mode="json") for e in events], args)
        return EXIT_OK
    rows = [["SEQ", "TIME", "STATUS", "WHERE", "BY", "REASON"]]
    for e in events:
        where = (e.node or "") + (f"/rank-{e.rank}" if e.rank is not None else "")
        reason = render.event_reason(e)
        rows.append(
            [str(e.seq), render.clock(e.time), e.status.value, where, e.by or "", render.one_line(reason)]
        )
    print(render.text_table(rows), end="")
    return EXIT_OK


def _top(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    while True:
        used = handle.resources()
        if args.json:
            _out(used.model_dump(mode="json"), args)
            return EXIT_OK
        if args.follow and sys.stdout.isatty():
            _control("\x1b[H\x1b[2J")  # redraw in place, as top does
        print(render.text_table([usage.HEADERS, *usage.rows(used)]), end="")
        ended = handle.refresh().status.is_terminal()
        if usage.note(used, ended=ended):
            print(usage.note(used, ended=ended))
        if not args.follow or ended:
            return EXIT_OK
        time.sleep(used.interval)


def _wait(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    final = handle.wait(timeout=args.timeout, check=False)
    if not args.json and final.status.is_terminal():
        _print_alerts(handle)
    return _finished(final, args)


def _stop(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    job = handle.stop()
    _out(job.model_dump(mode="json") if args.json else f"stopping {job.id}: {job.status.value}", args)
    return EXIT_OK


def _shell(args: argparse.Namespace) -> int:
    from ..client.shell import interact

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


def _delete(args: argparse.Namespace) -> int:
    outcomes = []
    several = len(set(args.jobs)) > 1  # then each line names the job as it was given too
    # several jobs (the seed's batch delete): each on its own, a refusal said for that job on
    # stderr and the others still deleted; one job: its refusal is the usual one-line error
    for done in jobactions.delete_jobs(Client(plain=True), args.jobs, force=args.force, hint=_JOBS_HINT):
        outcomes.append(done)
        if done.error is not None:
            _err(f"{done.ref}: not deleted: {render.one_line(done.error.message)}")
        else:
            print(
                f"deleted {done.handle.id}"
                + (f" ({done.ref})" if several and done.ref != done.handle.id else "")
            )
    failed = jobactions.not_done(outcomes)
    if failed:
        _err(f"error: {len(failed)} of {len(outcomes)} jobs not deleted")
    return EXIT_USAGE if failed else EXIT_OK


def _update(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    job = client.update(handle.id, priority=args.priority, duration=args.duration)
    _out(job.model_dump(mode="json") if args.json else render.format_job(job), args)
    return EXIT_OK


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
    from ..client.kernelspec import start_devenv_kernel  # jupyter_core: only this command needs it

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


def _algorithms(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action != "list":
        if not args.folder:
            raise InvalidSpec(f"give the folder: ma-jupyter algorithms {args.action} FOLDER")
        if args.action == "favourite":
            marked = client.favourite(args.folder)
            _out(marked.model_dump(mode="json") if args.json else f"favourite: {marked.path}", args)
        else:
            client.unfavourite(args.folder)
            print(f"no longer a favourite: {args.folder}")
        return EXIT_OK
    if args.folder:
        raise InvalidSpec("list takes no folder: ma-jupyter jobs --algorithm FOLDER lists a folder's jobs")
    found = client.algorithms()
    if args.json:
        _out([a.model_dump(mode="json") for a in found], args)
        return EXIT_OK
    rows = [["FOLDER", "FAVOURITE", "YOUR JOBS", "VERSIONS"]]
    for a in found:
        rows.append([a.path, "yes" if a.favourite else "", str(a.jobs), str(len(a.versions))])
        if args.versions:  # each content the folder's jobs ran, the most recently used first
            for v in a.versions:
                rows.append(
                    [
                        f"  version {jobactions.short_digest(v.digest)}",
                        "",
                        str(v.jobs),
                        render.clock(v.last_used),
                    ]
                )
    print(render.text_table(rows), end="")
    return EXIT_OK


def _specs(args: argparse.Namespace) -> int:
    specs = Client(plain=True).specs()
    if args.json:
        _out([s.model_dump(mode="json") for s in specs], args)
        return EXIT_OK
    rows = [["NAME", "CPUS", "MEMORY", "CARDS", "DESCRIPTION"]]
    for s in specs:
        cards = (
            f"{s.accelerators} {s.accelerator_type}" + (" (emulated)" if s.emulated else "")
            if s.accelerators
            else "-"
        )
        rows.append([s.name, f"{s.cpus:g}", f"{s.memory_gb:g} GB", cards, s.description])
    print(render.text_table(rows), end="")
    return EXIT_OK


def _nodes(args: argparse.Namespace) -> int:
    if args.action:
        if not args.node:
            print(
                f"ma-jupyter nodes {args.action} needs a node name (see `ma-jupyter nodes`)", file=sys.stderr
            )
            return EXIT_USAGE
        client = Client(plain=True)
        if args.action == "drain":
            node = client.drain_node(args.node, args.reason)
        else:
            node = client.undrain_node(args.node)
        print(f"{node.name}: {node.status}" + (f" ({node.health})" if node.health else ""))
        return EXIT_OK
    nodes = Client(plain=True).nodes(spec=args.spec)
    if args.json:
        _out([n.model_dump(mode="json") for n in nodes], args)
        return EXIT_OK
    rows = [["NAME", "STATUS", "CPUS USED", "MEMORY USED", "CARDS USED", "POOLS", "RUNNING"]]
    for n in nodes:
        cards = "-"
        if n.accelerators:
            cards = f"{len(n.accelerators_used)}/{n.accelerators} {n.accelerator_model or n.accelerator_type}"
            cards += " (emulated)" if n.emulated else ""
        rows.append(
            [
                n.name,
                n.status,
                f"{n.cpus_used:g}/{n.cpus:g}",
                f"{n.memory_used_gb:g}/{n.memory_gb:g} GB",
                cards,
                ",".join(n.pools) or "-",
                ", ".join(n.usage) or "-",
            ]
        )
        if n.health:  # why it takes no new jobs, under its row
            rows.append(["", f"  {n.health}", "", "", "", "", ""])
    print(render.text_table(rows), end="")
    return EXIT_OK


def _cluster(args: argparse.Namespace) -> int:
    view = Client(plain=True).cluster(specs=args.spec, models=args.model)
    if args.json:
        _out(view.model_dump(mode="json"), args)
        return EXIT_OK
    print(cluster_text(view), end="")
    return EXIT_OK


def _whoami(args: argparse.Namespace) -> int:
    user = Client(plain=True).whoami()
    _out(user.model_dump(mode="json") if args.json else user.name + (" (admin)" if user.admin else ""), args)
    return EXIT_OK


def _images(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action == "rm":
        client.remove_image(args.name)
        print(f"removed image {args.name} (jobs that named it keep its environment)")
        return EXIT_OK
    if args.action == "add":
        environment = options.image_environment(args.environment, Path.cwd())
        image = {
            "name": args.name,
            "environment": environment,
            "card_type": args.card_type,
            "scopes": args.scope or ["training", "devenv"],
            "visibility": "public" if args.public else "private",
            "description": args.description,
        }
        made = client.register_image(image)
        if args.json:
            _out(made.model_dump(mode="json"), args)
        else:
            print(f"registered {made.visibility} image {made.name}: --image {made.name}")
        return EXIT_OK
    found = client.images()
    if args.json:
        _out([i.model_dump(mode="json") for i in found], args)
        return EXIT_OK
    rows = [["NAME", "CARD TYPE", "SCOPES", "VISIBILITY", "OWNER", "ENVIRONMENT"]]
    for i in found:
        env = spectext.image_text(i.environment.model_dump(exclude_none=True))
        rows.append([i.name, i.card_type, ",".join(i.scopes), i.visibility, i.owner or "-", env])
    print(render.text_table(rows), end="")
    return EXIT_OK


def _notify(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    change: dict = {}
    if args.webhook is not None or args.no_webhook:
        change["webhook"] = None if args.no_webhook else args.webhook
    if args.address is not None or args.no_address:
        change["address"] = None if args.no_address else args.address
    settings = client.set_notify(**change) if change else client.notify_settings()
    if args.json:
        _out(settings.model_dump(mode="json"), args)
        return EXIT_OK
    print(f"webhook: {settings.webhook or '-'}\naddress: {settings.address or '-'}")
    return EXIT_OK


def _users(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action == "list":
        users = client.users()
        if args.json:
            _out([u.model_dump(mode="json") for u in users], args)
            return EXIT_OK
        rows = [["NAME", "ADMIN", "CREATED"]]
        rows += [[u.name, "yes" if u.admin else "no", render.clock(u.created_at)] for u in users]
        print(render.text_table(rows), end="")
        return EXIT_OK
    if args.action == "remove":
        client.remove_user(args.name)
        print(f"removed user {args.name}: its token no longer works (its jobs stay)")
        return EXIT_OK
    made = (
        client.add_user(args.name, admin=args.admin) if args.action == "add" else client.new_token(args.name)
    )
    if args.json:
        _out(made.model_dump(mode="json"), args)
        return EXIT_OK
    # stdout carries the token alone (TOKEN=$(ma-jupyter users add bob) works); the rest is said on stderr
    print(made.token, flush=True)
    role = "admin" if made.admin else "user"
    _err(
        f"{'added' if args.action == 'add' else 'new token for'} {role} {made.name}: this token is shown "
        "only now; its holder sets MA_JUPYTER_TOKEN to it"
    )


def _cache(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.clear:
        if args.all:
            raise InvalidSpec("--clear empties your own cache only: drop --all")
        held = client.clear_cache()
        if args.json:
            _out(held.model_dump(mode="json"), args)
        else:
            print(
                f"cleared the cache of {held.user}: {render.size(held.bytes)} in {held.files} file(s) removed"
            )
        return EXIT_OK
    found = client.cache(every_user=args.all)
    if args.json:
        _out([c.model_dump(mode="json") for c in found], args)
        return EXIT_OK
    rows = [["USER", "SIZE", "FILES", "FOLDER"]]
    # a cache the walk refused shows what was counted before, a lower bound ("+")
    rows += [[c.user, render.size(c.bytes) + ("+" if c.refused else ""), str(c.files), c.path] for c in found]
    print(render.text_table(rows), end="")
    for c in found:
        if c.refused:
            print(f"the cache of {c.user} could not be measured whole: {c.refused}", file=sys.stderr)
    return EXIT_OK


def _data(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action == "rm":
        gone = client.remove_prepared_data(args.key)
        if args.json:
            _out(gone.model_dump(mode="json"), args)
        else:
            print(f"removed prepared data {gone.key} ({render.size(gone.bytes)}, copy of {gone.source})")
        return EXIT_OK
    found = client.prepared_data()
    if args.json:
        _out([d.model_dump(mode="json") for d in found], args)
        return EXIT_OK
    rows = [["KEY", "SIZE", "FILES", "LAST USED", "JOBS", "SOURCE"]]
    for d in found:
        used = render.clock(datetime.fromtimestamp(d.last_used, UTC))
        rows.append([d.key, render.size(d.bytes), str(d.files), used, ",".join(d.jobs) or "-", d.source])
    print(render.text_table(rows), end="")
    return EXIT_OK


_COMMANDS = {
    "service": _service,
    "submit": _submit,
    "clone": _clone,
    "whoami": _whoami,
    "users": _users,
    "notify": _notify,
    "images": _images,
    "jobs": _jobs,
    "get": _get,
    "logs": _logs,
    "events": _events,
    "top": _top,
    "wait": _wait,
    "stop": _stop,
    "delete": _delete,
    "update": _update,
    "devenv": _devenv,
    "export": _export,
    "tensorboard": _tensorboard,
    "shell": _shell,
    "algorithms": _algorithms,
    "specs": _specs,
    "nodes": _nodes,
    "cluster": _cluster,
    "cache": _cache,
    "data": _data,
}


# ---------------------------------------------------------------------------- helpers


def _finished(job: Job, args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        _out(job.model_dump(mode="json"), args)
    else:
        line = f"{job.id}: {job.status.value}"
        if job.exit_code is not None:
            line += f" (exit code {job.exit_code})"
        if job.reason and job.status is not JobStatus.succeeded:
            line += f": {render.one_line(job.reason)}"
        print(line)
    return EXIT_OK if job.status is JobStatus.succeeded else EXIT_FAILED


def _submitted(handle: JobHandle) -> str:
    job = handle.info
    where = f" (queue position {job.queue_position + 1})" if job.queue_position is not None else ""
    return f"submitted {job.id} ({job.spec.name}): {job.status.value}{where}"


def _print_lines(lines: Any) -> None:
    """Each line as a terminal shows it (a progress bar's last state), flushed at once."""
    write, flush, visible = sys.stdout.write, sys.stdout.flush, render.visible_line
    for line in lines:
        write(visible(line) + "\n")
        flush()  # a follower sees each line as soon as the job prints it


def _out(value: Any, args: argparse.Namespace) -> None:
    if isinstance(value, str):
        print(value)
    else:
        print(json.dumps(value, indent=2 if sys.stdout.isatty() else None, default=str))


def _columns() -> int:
    """The terminal's width (80 when it cannot be told)."""
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


def _control(sequence: str) -> None:
    """Write the CLI's own terminal control (never job-made text) past the neutralising."""
    stream = sys.stdout
    if isinstance(stream, render.TerminalSafe):
        stream.control(sequence)
    else:
        stream.write(sequence)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
