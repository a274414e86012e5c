"""IPython magics: ``%%ma_train`` turns a cell into a training job; line magics manage jobs.

``%%ma_train [options]`` snapshots the cell body as ``/workspace/algorithm/<name>.py`` (plus a
copy of ``--code-dir`` when given), submits the job with the options of ``ma-jupyter submit``
(one parser: :mod:`ma_jupyter.frontends.options`), follows its logs live in the cell and returns a
:class:`~ma_jupyter.client.JobHandle`.  The line magics ``%ma_jobs``, ``%ma_logs``,
``%ma_events``, ``%ma_top``, ``%ma_stop``, ``%ma_delete``, ``%ma_update``, ``%ma_clone``, ``%ma_devenv``, ``%ma_algorithms``, ``%ma_specs``, ``%ma_cluster``,
``%ma_tensorboard``, ``%ma_shell`` and ``%ma_attach`` each take ``--help``.

Bad arguments become one ``UsageError`` line, and the typed errors of :mod:`ma_jupyter.errors`
print as one line too (a custom exception handler registered by :func:`register`), while the
cell still counts as failed, so papermill stops on them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

# Light imports only: `%load_ext ma_jupyter` must not load the client, pydantic or requests
# (the models, the session and the renderers all do), so each magic imports what it needs when
# it first runs; up here are the standard library, IPython and the errors.
from ...errors import HelpShown, JobFailed, MaJupyterError, NotFound, OptionsExit
from ...workspace_paths import script_command
from . import hints

if TYPE_CHECKING:
    from ...client import Client, JobHandle

#: the output JupyterLab's extension turns into a button opening the node's terminal in a tab
SHELL_MIME = "application/vnd.ma-jupyter.shell+json"


# ------------------------------------------------------------------------------ arguments


class MagicParser(argparse.ArgumentParser):
    """An argparse parser that never exits the kernel: errors become one UsageError line."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            print(message, file=sys.stderr if status else sys.stdout, end="")
        raise HelpShown()


def _parse(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace | None:
    """Parse a magic's line; None when ``--help`` was shown."""
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{parser.prog}: {exc} (check the quotes)") from None
    try:
        return parser.parse_args(argv)
    except HelpShown:
        return None
    except SystemExit as exc:
        # a parser built elsewhere may still exit on --help or errors: never let it end the kernel
        if exc.code in (0, None):
            return None
        raise UsageError(f"{parser.prog}: invalid arguments (see {parser.prog} --help)") from None


def _job_parser(prog: str, description: str, *, job: str = "one", **kw) -> MagicParser:
    parser = MagicParser(prog=prog, description=description, **kw)
    if job == "one":
        parser.add_argument("job", help="job id (or the exact name of a single job)")
    elif job == "many":
        parser.add_argument("job", nargs="+", help="job ids or names")
    elif job == "optional":
        parser.add_argument("job", nargs="?", help="job id or name")
    return parser


#: where a NotFound tells the user to look for their jobs
_JOBS_HINT = "`%ma_jobs`"


def _devenv_kernel(ref: str, node: str | None) -> JobHandle:
    """``%ma_devenv JOB --kernel``: start the dev environment and install its kernelspec."""
    from ...client.kernelspec import start_devenv_kernel
    from .session import get_client

    client = get_client()
    started = start_devenv_kernel(client, resolve_job(client, ref).id, node)
    made = started.devenv
    print(
        f"started dev environment {made.id} ({made.info.status.value}): job {started.source.id}'s "
        f"{started.node} with a Jupyter kernel; open a notebook with the kernel "
        f"'{started.display_name}' ({started.kernel_name}) to run code there; `%ma_stop {made.id}` ends it"
    )
    return made


def resolve_job(client: Client, ref: str) -> JobHandle:
    """The job ``ref`` names (see :func:`ma_jupyter.client.resolve.resolve_job`)."""
    from ...client.resolve import resolve_job as resolve

    return resolve(client, ref, hint=_JOBS_HINT)


def _spec_parser(prog: str, *, clone: bool = False) -> argparse.ArgumentParser:
    """The shared job-options parser plus the options only a notebook has."""
    from .. import options
    from . import live

    parser = options.build_parser(prog)
    group = parser.add_argument_group("notebook")
    if clone:
        group.add_argument("job", help="id (or name) of the job to clone")
    group.add_argument(
        "--command",
        default=None,
        help=f"run command (default: {script_command('<name>')} for the cell body; "
        "for a clone, the cloned job's)",
    )
    group.add_argument("--out", metavar="VAR", help="also bind the JobHandle to this variable")
    group.add_argument(
        "--no-follow", action="store_true", help="return at once instead of following the logs"
    )
    group.add_argument(
        "--follow-node",
        metavar="NODE",
        help="follow only this node's log (worker-1, ps-0...); default every node's, each line "
        "prefixed with [node] when the job has several",
    )
    group.add_argument(
        "--stop-on-interrupt",
        action="store_true",
        help="interrupting the kernel stops the job (default: only detach from it)",
    )
    group.add_argument(
        "--lines",
        type=int,
        default=live.DEFAULT_MAX_LINES,
        metavar="N",
        help=f"newest log lines the cell keeps (default {live.DEFAULT_MAX_LINES})",
    )
    return parser


def _parse_spec_line(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace | None:
    try:
        return _parse(parser, line)
    except OptionsExit:
        return None  # --help was printed
    except MaJupyterError as exc:
        raise UsageError(f"{parser.prog}: {exc.message}") from None


# ------------------------------------------------------------------------------ the magics


@magics_class
class MaJupyterMagics(Magics):
    """``%%ma_train`` and the ``%ma_*`` line magics."""

    # -- helpers

    def _follow(
        self,
        handle: Any,
        *,
        offsets: dict | None = None,
        lines: int,
        stop_on_interrupt: bool,
        note: str = "",
        stream: tuple[str, int | None] | None = None,
        kernel_hint: bool = False,
    ):
        """Follow the job live in the cell; with ``kernel_hint`` (a job this cell submitted), a
        failure on a NameError of a kernel variable says how to pass values in."""
        from . import live
        from . import record as notebook_record
        from .session import get_client

        job_id = handle.id
        notebook_record.remember(job_id, handle.name, offsets)

        def progress(seen: dict[str, int]) -> None:
            notebook_record.remember(job_id, handle.name, seen)

        try:
            live.follow_job(
                get_client(),
                job_id,
                offsets=offsets,
                max_lines=lines,
                stop_on_interrupt=stop_on_interrupt,
                on_progress=progress,
                note=note,
                stream=stream,
            )
        except JobFailed as exc:
            hint = hints.kernel_variable_hint(exc.log_tail, self.shell.user_ns) if kernel_hint else None
            if hint is None:
                raise
            raise JobFailed(f"{exc.message}\n{hint}", job=exc.job, log_tail=exc.log_tail) from None
        handle.refresh()
        return handle

    def _bind(self, var: str | None, value: Any) -> None:
        if var:
            self.shell.user_ns[var] = value

    def _submit(self, spec: dict, args: argparse.Namespace) -> Any:
        import shutil

        from ...client.snapshot import is_snapshot
        from .. import render
        from . import record as notebook_record
        from .session import get_client

        if args.out and not args.out.isidentifier():
            raise UsageError(f"--out {args.out}: not a Python variable name")
        client = get_client()
        if getattr(args, "dry_run", False):
            try:
                plan = client.plan(spec)
            finally:
                if is_snapshot(spec.get("algorithm") or ""):
                    shutil.rmtree(spec["algorithm"], ignore_errors=True)  # nothing will run it
            print(render.plan_summary(plan))
            return None
        handle = client.submit(spec)
        if handle.shipped:
            print(handle.shipped)
        notebook_record.remember(handle.id, handle.name)
        self._bind(args.out, handle)
        if args.no_follow:
            from IPython.display import display

            if getattr(args, "wait", False):
                handle.wait()

            display(
                {"text/plain": f"submitted job {handle.id} ({handle.name}): {handle.info.status.value}"},
                raw=True,
                metadata={"ma_jupyter": {"job_id": handle.id, "offsets": {}}},
            )
            return handle
        follow_node = getattr(args, "follow_node", None)
        return self._follow(
            handle,
            lines=args.lines,
            stop_on_interrupt=args.stop_on_interrupt,
            kernel_hint=True,
            stream=(follow_node, None) if follow_node else None,
        )

    # -- %%ma_train

    @line_cell_magic
    def ma_train(self, line: str, cell: str | None = None):
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
        from ...models import NAME_PATTERN
        from .. import options
        from .snapshot import default_name, snapshot_algorithm

        parser = _spec_parser("%%ma_train")
        args = _parse_spec_line(parser, line)
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
                spec = options.spec_from_args(args)
            except MaJupyterError as exc:
                raise UsageError(f"%%ma_train: {exc.message}") from None
            return self._submit(spec, args)
        if command is None:
            if body is None:
                raise UsageError("%ma_train --code-dir without a cell body needs --command (what to run)")
            # a body that is a shell command fails in the job with a bare SyntaxError: say it now
            hint = hints.shell_command_hint(body)
            if hint:
                raise UsageError(hint)
            command = script_command(name)
        try:
            spec = options.spec_from_args(args, command=command)
        except MaJupyterError as exc:
            raise UsageError(f"%%ma_train: {exc.message}") from None
        if body is None and not code_dir:
            # `%ma_train --command "python train.py"`: as with `ma-jupyter submit`, the client
            # ships the current folder when the command names a file in it
            return self._submit(spec, args)
        spec["algorithm"] = str(snapshot_algorithm(name, body, code_dir))
        if code_dir:  # the folder the job's code comes from: search by algorithm finds it there
            spec["algorithm_origin"] = os.path.normpath(os.path.abspath(code_dir))
        return self._submit(spec, args)

    # -- %ma_clone

    @line_magic
    def ma_clone(self, line: str):
        """Submit a copy of a job, with options overriding its fields: ``%ma_clone JOB --spec cpu.medium``."""
        from ...models import clone_name
        from .. import options
        from .session import get_client

        parser = _spec_parser("%ma_clone", clone=True)
        args = _parse_spec_line(parser, line)
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
        return self._submit(spec, args)

    # -- listing

    @line_magic
    def ma_jobs(self, line: str):
        """A table of jobs: ``%ma_jobs [--status running ...] [--name TEXT] [--spec SPEC] [--creator USER]
        [--outputs TEXT] [--algorithm FOLDER] [--favourites] [--type batch] [--limit N]``; a batch
        job's status counts its tasks by status; searched by ``--algorithm``, a ``code`` column says
        which jobs ran the folder's current content (``current``) and which another version."""
        from ...models import JobStatus
        from .. import jobactions, render
        from .session import get_client

        parser = MagicParser(prog="%ma_jobs", description="List jobs, newest first.")
        jobactions.add_list_filters(parser)
        args = _parse(parser, line)
        if args is None:
            return None
        page = get_client().job_page(**jobactions.list_filters(args))
        rows = []
        for job in page.items:
            status = job.status.value
            if job.status is JobStatus.queued and job.queue_position is not None:
                status += f" (#{job.queue_position + 1})"
            if job.task_counts:
                status += f"; tasks: {render.task_summary(job)}"
            rows.append(
                [
                    job.id,
                    job.spec.name,
                    status,
                    job.spec.mode.value,
                    job.spec.nodes,
                    job.chosen_spec or ",".join(job.spec.specs),
                    render.clock(job.created_at),
                    render.reason_summary(job),
                ]
                # searched by algorithm: whether it ran the folder's current content
                + ([jobactions.code_version(job, page)] if args.algorithm else [])
            )
        from IPython.display import display

        if not rows:
            print("no jobs match")
            return None
        columns = ["id", "name", "status", "mode", "nodes", "spec", "created", "reason"]
        display(render.table_bundle(columns + (["code"] if args.algorithm else []), rows), raw=True)
        return None

    @line_magic
    def ma_algorithms(self, line: str):
        """Your algorithm folders and favourites: ``%ma_algorithms [favourite|unfavourite FOLDER]``.

        Lists the folders your jobs ran and the ones you marked favourite (``%ma_jobs
        --algorithm FOLDER`` / ``--favourites`` lists their jobs), or marks and unmarks one.
        """
        from .. import render
        from .session import get_client

        parser = MagicParser(prog="%ma_algorithms", description="Your algorithm folders and favourites.")
        parser.add_argument("action", nargs="?", choices=["list", "favourite", "unfavourite"], default="list")
        parser.add_argument("folder", nargs="?", metavar="FOLDER", help="the folder to mark or unmark")
        args = _parse(parser, line)
        if args is None:
            return None
        client = get_client()
        if args.action != "list":
            if not args.folder:
                raise UsageError(f"%ma_algorithms {args.action} needs the FOLDER")
            if args.action == "favourite":
                print(f"favourite: {client.favourite(args.folder).path}")
            else:
                client.unfavourite(args.folder)
                print(f"no longer a favourite: {args.folder}")
            return None
        found = client.algorithms()
        if not found:
            print("no algorithm folders yet: jobs with --code-dir (or a shipped folder) add theirs")
            return None
        from IPython.display import display

        from .. import jobactions

        # each folder with its versions (the contents its jobs ran, the most recent first)
        rows = [
            [
                a.path,
                "yes" if a.favourite else "",
                a.jobs,
                ", ".join(f"{jobactions.short_digest(v.digest)} ({v.jobs})" for v in a.versions),
            ]
            for a in found
        ]
        display(render.table_bundle(["folder", "favourite", "your jobs", "versions"], rows), raw=True)
        return None

    @line_magic
    def ma_specs(self, line: str):
        """The specs and how many nodes could take one more job node of each right now."""
        from .. import render
        from .session import get_client

        parser = MagicParser(prog="%ma_specs", description="Specs (flavors) and what is free now.")
        if _parse(parser, line) is None:
            return None
        client = get_client()
        nodes = client.nodes()
        rows = []
        held = _real_cards_held(nodes)
        for spec in client.specs():
            fit = [n for n in nodes if _fits_now(spec, n, held)]
            cards = f"{spec.accelerators} {spec.accelerator_type}" if spec.accelerators else "-"
            rows.append(
                [
                    spec.name,
                    f"{spec.cpus:g}",
                    f"{spec.memory_gb:g} GB",
                    cards + (" (emulated)" if spec.emulated else ""),
                    f"{len(fit)}/{len(nodes)} nodes"
                    + (f" ({', '.join(n.name for n in fit)})" if fit else ""),
                    spec.description,
                ]
            )
        from IPython.display import display

        display(
            render.table_bundle(["spec", "cpus", "memory", "cards", "free now", "description"], rows),
            raw=True,
        )
        return None

    @line_magic
    def ma_cluster(self, line: str):
        """The cluster's resources: ``%ma_cluster [--spec S ...] [--model M ...]``: nodes and their
        use (cards as ``card(virtual):job``), how many more of each spec could start now, the
        queue by priority and queued card demand per board model."""
        from ..clusterview import cluster_text
        from .session import get_client

        parser = MagicParser(prog="%ma_cluster", description="Nodes, specs that can start, the queue.")
        parser.add_argument("--spec", action="append", default=[], help="only nodes that fit this spec")
        parser.add_argument("--model", action="append", default=[], help="only this board model")
        args = _parse(parser, line)
        if args is None:
            return None
        print(cluster_text(get_client().cluster(specs=args.spec, models=args.model)), end="")
        return None

    # -- one job

    @line_magic
    def ma_logs(self, line: str):
        """A job's log: ``%ma_logs JOB [--follow] [--node worker-0] [--rank R] [--tail N]``.

        ``--follow`` shows the log live from its start until the job ends; only while this
        kernel already follows the job live (another cell's follow) does it continue where that
        one is (nothing shown twice).  ``%ma_attach`` continues where the notebook left off.
        """
        from ...client.logs import stream_label
        from .. import jobactions, render
        from . import live
        from . import record as notebook_record
        from .session import get_client

        parser = _job_parser("%ma_logs", "Print or follow a job's log.")
        parser.add_argument("--follow", "-f", action="store_true", help="follow live until the job ends")
        parser.add_argument("--node", help="node, e.g. worker-0 (default: every node)")
        parser.add_argument("--rank", type=int, help="one rank's log of the node")
        parser.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
        parser.add_argument(
            "--from-start",
            action="store_true",
            help="with --follow: start at the beginning also while this kernel follows the job live",
        )
        parser.add_argument(
            "--lines", type=int, default=live.DEFAULT_MAX_LINES, help="lines a followed cell keeps"
        )
        args = _parse(parser, line)
        if args is None:
            return None
        if args.rank is not None and not args.node:
            raise UsageError("%ma_logs: --rank needs --node (e.g. --node worker-0 --rank 1)")
        client = get_client()
        handle = resolve_job(client, args.job)
        if args.follow:
            live_now = handle.id in live.following and not args.from_start
            offsets = notebook_record.offsets(handle.id) if live_now else {}
            stream = (args.node, args.rank) if args.node else None
            if stream is not None:
                # an unknown node or rank is a NotFound now, not a follow that never ends
                client.read_log(handle.id, node=args.node, rank=args.rank, offset=0, limit=1)
                offsets = {k: v for k, v in offsets.items() if k == stream_label(stream)}
            note = "continuing where this notebook left off" if offsets else ""
            self._follow(
                handle, offsets=offsets, lines=args.lines, stop_on_interrupt=False, note=note, stream=stream
            )
            return None
        nodes = [args.node] if args.node else jobactions.every_node(handle)
        several = len(nodes) > 1
        for log in jobactions.node_logs(handle, nodes, args.rank):
            lines = [render.visible_line(entry) for entry in log]
            if log.lost is not None:  # gone with its node's machine: the other nodes still show
                print(f"[{log.label}] {log.lost}" if several else log.lost)
                continue
            if args.tail is not None:
                lines = lines[-args.tail :] if args.tail > 0 else []
            for entry in lines:
                # shown, never acting on the terminal (SGR colours stay: the output area shows them)
                entry = render.terminal_text(entry, keep_sgr=True)
                print(f"[{log.label}] {entry}" if several else entry)
        return None

    @line_magic
    def ma_events(self, line: str):
        """A job's events (status changes and notices with their reasons): ``%ma_events JOB``."""
        from ...client.logs import stream_label
        from .. import render
        from .session import get_client

        parser = _job_parser("%ma_events", "Show a job's events.")
        args = _parse(parser, line)
        if args is None:
            return None
        client = get_client()
        handle = resolve_job(client, args.job)
        rows = []
        for ev in client.events(handle.id):
            where = stream_label((ev.node, ev.rank)) if ev.node else ""
            rows.append(
                [ev.seq, render.clock(ev.time), ev.status.value, where, ev.by or "", render.event_reason(ev)]
            )
        from IPython.display import display

        display(render.table_bundle(["seq", "time", "status", "node", "by", "reason"], rows), raw=True)
        return None

    @line_magic
    def ma_top(self, line: str):
        """A job's CPU and memory per node: ``%ma_top JOB`` (a table: now, mean, peak, limit);
        ``--inline`` draws them over time as a PNG."""
        from .. import render, usage
        from .session import get_client

        parser = _job_parser("%ma_top", "Show a job's CPU and memory use per node.")
        parser.add_argument("--inline", action="store_true", help="draw CPU and memory over time (PNG)")
        args = _parse(parser, line)
        if args is None:
            return None
        client = get_client()
        handle = resolve_job(client, args.job)
        used = client.resources(handle.id)
        ended = handle.refresh().status.is_terminal()
        from IPython.display import Image, display

        if args.inline:
            display(Image(data=usage.png(used), format="png"))
        else:
            display(render.table_bundle([h.lower() for h in usage.HEADERS], usage.rows(used)), raw=True)
        if usage.note(used, ended=ended):
            print(usage.note(used, ended=ended))
        return None

    @line_magic
    def ma_shell(self, line: str):
        """A terminal inside a running node's sandbox (jobs submitted with ``--debug-terminal``).

        ``%ma_shell JOB [--node N] -- CMD ...`` runs CMD on the node's terminal and prints what
        it printed (and its exit status unless 0); ``%ma_shell JOB [--node N]`` offers the
        interactive shell: JupyterLab shows a button that opens it in a terminal tab, elsewhere
        the line to run in a terminal.
        """
        from .session import get_client

        parser = _job_parser("%ma_shell", "Open a terminal inside a running node's sandbox.")
        parser.add_argument("--node", help="node (worker-0, ps-0...); default the job's first")
        parser.add_argument("command", nargs="*", help="after --: a command to run there")
        args = _parse(parser, line)
        if args is None:
            return None
        client = get_client()
        handle = resolve_job(client, args.job)
        node = args.node or (handle.info.nodes[0].name if handle.info.nodes else "worker-0")
        if args.command:
            from ...client.shell import run_command

            out, code = run_command(client.shell(handle.id, node, command=args.command), timeout=None)
            print(out, end="" if out.endswith("\n") or not out else "\n")
            if code:
                print(f"[exit status {code}]")
            return None
        from IPython.display import display

        from ...models import check_node_target

        # the bundle names what JupyterLab's button opens: only an id and a node of the wire
        # model's shapes go into it (the extension checks them again, as it does every notebook's)
        check_node_target(handle.id, node)
        command = f"ma-jupyter shell {shlex.quote(handle.id)} --node {shlex.quote(node)}"
        display(
            {
                SHELL_MIME: {"job": handle.id, "node": node},
                "text/plain": f"debug terminal of {node}: run `{command}` in a terminal",
            },
            raw=True,
        )
        return None

    @line_magic
    def ma_stop(self, line: str):
        """Stop jobs: ``%ma_stop JOB [JOB ...]``."""
        from .. import jobactions
        from .session import get_client

        parser = _job_parser("%ma_stop", "Stop running or queued jobs.", job="many")
        args = _parse(parser, line)
        if args is None:
            return None
        for done in jobactions.stop_jobs(get_client(), args.job, hint=_JOBS_HINT):
            if done.error is not None:
                raise done.error
            print(
                f"job {done.handle.id} ({done.handle.name}): stop requested, now {done.result.status.value}"
            )
        return None

    @line_magic
    def ma_delete(self, line: str):
        """Delete finished jobs (``--force`` stops a running one first): ``%ma_delete JOB [JOB ...] [--force]``.

        Each job on its own: one that cannot be deleted is reported, the others are still
        deleted, and then the cell fails naming how many were not.
        """
        from .. import jobactions, render
        from . import record as notebook_record
        from .session import get_client

        parser = _job_parser("%ma_delete", "Delete jobs and their records.", job="many")
        parser.add_argument("--force", action="store_true", help="stop the job first if it still runs")
        args = _parse(parser, line)
        if args is None:
            return None
        outcomes = []
        for done in jobactions.delete_jobs(get_client(), args.job, force=args.force, hint=_JOBS_HINT):
            outcomes.append(done)
            if done.error is not None:
                print(f"job {done.ref}: not deleted: {render.one_line(done.error.message)}")
                continue
            notebook_record.forget(done.handle.id)
            print(f"job {done.handle.id} ({done.handle.name}) deleted")
        failed = jobactions.not_done(outcomes)
        if failed:
            raise UsageError(
                f"%ma_delete: {len(failed)} of {len(outcomes)} jobs not deleted: {', '.join(failed)}"
            )
        return None

    @line_magic
    def ma_update(self, line: str):
        """Change a queued job's priority or a job's duration: ``%ma_update JOB --priority urgent``,
        ``%ma_update JOB --duration 2h``."""
        from ...models import Priority
        from .. import render
        from .session import get_client

        parser = _job_parser(
            "%ma_update", "Change a queued job's priority or a queued or running job's duration."
        )
        parser.add_argument("--priority", choices=[p.value for p in Priority], help="queued jobs")
        parser.add_argument(
            "--duration", metavar="TIME", help="seconds or 30m, 2h, 1d (queued or running jobs)"
        )
        args = _parse(parser, line)
        if args is None:
            return None
        if args.priority is None and args.duration is None:
            raise UsageError(
                "%ma_update: give --priority (queued jobs) or --duration (queued or running jobs)"
            )
        client = get_client()
        handle = resolve_job(client, args.job)
        job = client.update(handle.id, priority=args.priority, duration=args.duration)
        handle.info = job
        changed = []
        if args.priority is not None:
            changed.append(f"priority {job.spec.priority.value}")
        if args.duration is not None:
            shown = render.format_seconds(job.spec.duration) if job.spec.duration else "none"
            changed.append(f"duration {shown}")
        print(f"job {job.id} ({job.spec.name}): {', '.join(changed)}; now {job.status.value}")
        return handle

    @line_magic
    def ma_devenv(self, line: str):
        """Write a notebook that submits a job again, next to this one: ``%ma_devenv JOB``.

        The seed's "create a development environment from a job": its first code cell is the
        ``%%ma_train`` cell with the job's options and code (see
        :mod:`ma_jupyter.export.notebook`).  The file is ``<job name>-devenv.ipynb`` in this
        notebook's folder (``-2``, ``-3``... when taken); a link to it is shown.  Returns its path.

        ``%ma_devenv JOB --kernel [--node N]`` starts the job's own environment instead: a dev
        environment job with the sandbox of the job's node N (default its first) running a
        Jupyter kernel, and installs its kernelspec (``ma_jupyter: <job name> (<node>)``) for
        this account; a notebook opened with it runs there.  Returns the dev environment's handle.
        """
        from . import record as notebook_record
        from .session import get_client

        parser = _job_parser("%ma_devenv", "Write a notebook that submits the job again.")
        parser.add_argument("--to", metavar="FOLDER", help="write it there (default: this notebook's folder)")
        parser.add_argument(
            "--kernel",
            action="store_true",
            help="start the job's own environment as a Jupyter kernel instead",
        )
        parser.add_argument(
            "--node", help="with --kernel: the job's node (worker-1, or 1); default its first"
        )
        args = _parse(parser, line)
        if args is None:
            return None
        if args.kernel:
            return _devenv_kernel(args.job, args.node)
        if args.node:
            raise UsageError(
                "%ma_devenv: --node chooses the node of a dev environment's kernel: add --kernel"
            )
        import json
        import os
        from pathlib import Path

        client = get_client()
        handle = resolve_job(client, args.job)
        made = client.devenv(handle.id)
        here = notebook_record.notebook_path()
        folder = Path(args.to) if args.to else (here.parent if here is not None else Path.cwd())
        if not folder.is_dir():
            raise UsageError(f"%ma_devenv: --to {folder}: not a folder")
        stem = Path(made["name"]).stem
        path = folder / made["name"]
        number = 1
        while path.exists():
            number += 1
            path = folder / f"{stem}-{number}.ipynb"
        path.write_text(json.dumps(made["notebook"], indent=1, ensure_ascii=False) + "\n")
        from IPython.display import FileLink, display

        try:
            shown = os.path.relpath(path)
        except ValueError:
            shown = str(path)
        print(f"wrote {path}: a notebook that submits job {handle.id} ({handle.name}) again")
        display(FileLink(shown))
        return str(path)

    @line_magic
    def ma_attach(self, line: str):
        """Continue following jobs after a kernel restart: ``%ma_attach [JOB]``.

        Without a job: every job this notebook started that is still going (or whose log was
        not fully shown), each continuing where the notebook left off.
        """
        from ...client.logs import fully_shown
        from .. import render
        from . import live
        from . import record as notebook_record
        from .session import get_client

        parser = _job_parser("%ma_attach", "Re-attach to this notebook's jobs.", job="optional")
        parser.add_argument("--lines", type=int, default=live.DEFAULT_MAX_LINES)
        parser.add_argument("--stop-on-interrupt", action="store_true")
        args = _parse(parser, line)
        if args is None:
            return None
        client = get_client()
        if args.job:
            handles = [resolve_job(client, args.job)]
        else:
            handles = []
            for job_id in notebook_record.jobs():
                try:
                    handles.append(client.job(job_id))
                except NotFound:
                    notebook_record.forget(job_id)
            if not handles:
                print("this notebook has no jobs to attach to: `%ma_jobs` lists every job")
                return None
        attached = []
        for handle in handles:
            offsets = notebook_record.offsets(handle.id)
            if handle.info.status.is_terminal() and offsets and not args.job:
                if fully_shown(client, handle.id, offsets):
                    print(render.status_line(handle.info))
                    continue
            note = "re-attached: continuing where this notebook left off" if offsets else "re-attached"
            self._follow(
                handle, offsets=offsets, lines=args.lines, stop_on_interrupt=args.stop_on_interrupt, note=note
            )
            attached.append(handle)
        if len(attached) == 1:
            return attached[0]
        return attached or None

    # -- TensorBoard

    @line_magic
    def ma_tensorboard(self, line: str):
        """TensorBoard over a job's outputs: ``%ma_tensorboard JOB [--inline] [--height PX]``.

        Shows the job's TensorBoard in an IFrame; ``--inline`` draws the job's scalars as a PNG
        instead (kept in the saved notebook).
        """
        from .session import get_client

        parser = _job_parser("%ma_tensorboard", "Open a job's TensorBoard, or plot its scalars inline.")
        parser.add_argument("--inline", action="store_true", help="plot the scalars as a PNG (no server)")
        parser.add_argument("--height", type=int, default=600, help="IFrame height in pixels")
        parser.add_argument("--stop", action="store_true", help="stop the job's TensorBoard")
        parser.add_argument(
            "--via-jupyter",
            nargs="?",
            const="/",
            metavar="BASE_URL",
            help="show it through the Jupyter server's proxy (<BASE_URL>ma-jupyter/tensorboard/<job>/, "
            "default base /), for a browser that reaches only the Jupyter server",
        )
        args = _parse(parser, line)
        if args is None:
            return None
        from IPython.display import IFrame, display

        client = get_client()
        handle = resolve_job(client, args.job)
        if args.stop:
            client.stop_tensorboard(handle.id)
            print(f"TensorBoard of job {handle.id} stopped")
            return None
        if args.inline:
            from .scalars import scalars_png

            outputs = handle.info.outputs_folder or handle.info.spec.outputs
            if not outputs:  # a job of an older service, without the default folder recorded
                raise UsageError(f"job {handle.id} has no outputs folder (--output): nothing to plot")
            png = scalars_png(outputs, title=f"{handle.name} ({handle.id})")
            display({"image/png": png, "text/plain": f"scalars of job {handle.id}"}, raw=True)
            return None
        url = client.tensorboard(handle.id)
        shown = url
        if args.via_jupyter:
            from urllib.parse import quote

            # a path on the page's own server: the browser resolves it against JupyterLab's origin
            shown = f"{args.via_jupyter.rstrip('/')}/ma-jupyter/tensorboard/{quote(handle.id, safe='')}/"
        display(IFrame(shown, width="100%", height=args.height))
        print(f"TensorBoard of job {handle.id}: {shown}")
        return url


# ------------------------------------------------------------------------------ helpers


def _real_cards_held(nodes: list) -> set[tuple[str, int]]:
    """The real cards held on any node, as (type, machine index): such a card is held for every
    node that lists it (the scheduler gives it to one node at a time)."""
    return {(n.accelerator_type, c) for n in nodes if n.emulated is False for c in n.accelerators_used}


def _fits_now(spec: Any, node: Any, held: set[tuple[str, int]] = frozenset()) -> bool:
    if node.status in ("down", "drained", "faulty"):  # drained and faulty nodes take no new job
        return False
    if spec.cpus > node.cpus - node.cpus_used or spec.memory_gb > node.memory_gb - node.memory_used_gb:
        return False
    if spec.accelerators:
        if node.emulated is False:
            indices = node.devices or list(range(node.accelerators))
            free = sum(1 for i in indices if (node.accelerator_type, i) not in held)
        else:
            free = node.accelerators - len(node.accelerators_used)
        return node.accelerator_type == spec.accelerator_type and free >= spec.accelerators
    return True


def _typed_error_handler(shell, etype, value, tb, tb_offset=None):
    """Show a typed error as its message (``InvalidSpec: message``) instead of a traceback.

    IPython discards what a custom handler returns when the error comes from running code, so
    the handler shows it itself; in a kernel this is an ``error`` output (ename, evalue), which
    is what papermill and nbclient look for.
    """
    stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def register(shell: Any) -> None:
    """Register the magics and the one-line display of typed errors on ``shell``."""
    shell.register_magics(MaJupyterMagics)
    shell.set_custom_exc((MaJupyterError,), _typed_error_handler)
