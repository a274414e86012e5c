"""The ``ma-jupyter`` argument parser: every sub-command listed with its help, only the one a
command line names built with its options."""

from __future__ import annotations

import argparse

from ... import __version__
from .. import jobactions, options

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any


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
