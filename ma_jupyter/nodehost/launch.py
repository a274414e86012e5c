"""A node's launches: what runs where, planned from an attempt, and the node's files on the host.

Contract:

1. :func:`node_launches` plans every node of an attempt (pure: the same launches the dry run
   shows); :func:`with_machine_cards` binds a launch planned on another machine (Ray) to the
   cards of the machine that runs it.
2. :func:`prepare_node` is the one function that writes a node's files before its runner starts:
   hosts, hostname, plan files, the rank-log folder, outputs folders to create, the working
   copy's folder (:mod:`.workcopy`), ``view.json`` and (symlink mode) the symlink tree; it
   removes the build locks the user's cache holds when no node of the user's jobs runs here
   (:mod:`.caches` rule 6).  It is
   idempotent, removes what an earlier attempt left (exit code, failure report), and follows no
   symlink a job may have planted below the job's folder or the outputs folder.
3. :func:`command_argv` is the command as the node runs it: ``${VAR}`` expanded from the node's
   env, ``python`` replaced by the image's interpreter, in-view paths rewritten (symlink mode).
4. :func:`compile_node_helpers` writes the compiled modules a node runs from this package once,
   on the host, where no sandbox could.
"""

from __future__ import annotations

import logging
import os
import posixpath
from dataclasses import asdict
from pathlib import Path

from .. import accelerators, models, workspace
from ..commands import expand_argv
from ..errors import InvalidSpec
from ..foldersize import remove_tree
from ..jobdir import RANK_LOG_VIEW, NodeDir
from ..models import NodeLaunch
from ..untrusted import make_dirs, real_ancestor
from . import caches
from .host_policy import load_policy
from .image import ImageEnv, missing_modules, resolve_image
from .mounts import (
    CACHE_KIND,
    VIEW_ROOT,
    WORKDIR_KIND,
    Mount,
    mounts_for,
)
from .procfs import NODE_MARKER
from .view import (
    PACKAGE_DIR,
    SITECUSTOMIZE,
    WRITABLE_FILE_ROOTS,
    JobAttempt,
    NodeView,
    file_roots_used,
    node_env,
    node_mounts,
    node_view,
    nsswitch_conf,
    runs_sshd,
    sshd_nsswitch_conf,
    sshd_passwd,
    to_host,
)
from .workcopy import prepare_working_copy

log = logging.getLogger("ma_jupyter.nodehost")


def with_machine_cards(launch: NodeLaunch, card_type: str, *, planned_elsewhere: bool = False) -> NodeLaunch:
    """The launch with the device nodes of its real cards (``card_type``: its task's) as the
    machine it starts on shows them, where that differs from what its plan saw: a launch planned
    by a service on another machine (the Ray backend's), or a card whose node appeared or went
    since.  The card variables the plan set from the machine's indices then become the numbers
    the node can open (a value the job set itself is kept).  Called by the backend just before
    a node starts, on the node's machine; a launch without real cards, or outside bubblewrap, is
    returned as it is, and so is one ``planned_elsewhere`` on a machine that shows no card node
    of its type at all (a Ray node whose cards are a resource without devices: emulated).

    Raises:
        InvalidSpec: a card of the launch has no device node on this machine (the node must not
            start seeing fewer cards than it holds).
    """
    if not card_type or not launch.devices or launch.isolation != "bubblewrap":
        return launch
    known = accelerators.TYPES.get(card_type)
    if known is None or accelerators.cards_turned_off():
        return launch
    if planned_elsewhere and not accelerators.has_device_nodes(card_type):
        return launch
    gone = accelerators.missing_cards(card_type, launch.devices)
    if gone:
        raise InvalidSpec(
            f"{launch.host or launch.name}: {known.vendor} card(s) {', '.join(map(str, gone))} have no device "
            f"node ({', '.join(accelerators.card_node(card_type, i) for i in gone)}) on this machine: check the driver "
            f"({known.tool}), or mark the node emulated = true in cluster.toml"
        )
    paths = accelerators.device_paths(card_type, launch.devices)
    if paths == list(launch.device_nodes):
        return launch
    planned = ",".join(map(str, accelerators.visible_indices(launch.devices, bool(launch.device_nodes))))
    visible = ",".join(str(i) for i in accelerators.visible_indices(launch.devices, sandboxed=True))
    env = dict(launch.env)
    for name in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
        if env.get(name) == planned:
            env[name] = visible
    return launch.model_copy(update={"device_nodes": paths, "env": env})


def node_launches(attempt: JobAttempt, sandbox: str) -> list[NodeLaunch]:
    """What every node of the attempt runs, resolved (the local backend's dry run); pure.

    The image and the host policy are resolved once, the mounts once per distinct
    ``(algorithm, outputs_subdir)``.  ``env`` lacks the launch-only variables (the node-run
    marker and the job's secret), so ``${VAR}`` of those expands to nothing in ``command``.

    Raises:
        InvalidSpec: from :func:`node_view`, or an unusable lifecycle command.
    """
    from ..commands import parse_command

    policy = load_policy()
    image = resolve_image(attempt.spec.image)
    lifecycle = attempt.spec.lifecycle
    hooks = {
        "on_start": parse_command(lifecycle.on_start, field="lifecycle") if lifecycle.on_start else None,
        "on_stop": parse_command(lifecycle.on_stop, field="lifecycle") if lifecycle.on_stop else None,
    }
    mounts: dict[tuple[str | None, str | None], list[Mount]] = {}
    sizes: dict[str, bool] = {}
    check_image_modules(attempt, image)
    launches = []
    for plan in attempt.plans:
        key = (plan.algorithm, plan.outputs_subdir)
        if key not in mounts:
            mounts[key] = mounts_for(
                attempt.spec,
                job_dir=attempt.jobdir.root,
                outputs_subdir=plan.outputs_subdir,
                algorithm=plan.algorithm,
                policy=policy,
            )
        own, notes = node_mounts(
            attempt, plan, sandbox, policy=policy, image=image, workspace_mounts=mounts[key], sizes=sizes
        )
        view = node_view(attempt, plan, sandbox, mounts=own, image=image, policy=policy)
        env = node_env(view, plan.env, "", plan.job_env)
        env.pop(NODE_MARKER, None)
        launches.append(
            NodeLaunch(
                name=plan.name,
                role=plan.task.role,
                index=plan.task.index,
                primary=plan.primary,
                host=plan.task.host,
                hostname=view.hostname,
                address=view.address,
                ports=list(plan.task.ports),
                cpus=list(view.cpus),
                devices=list(view.devices),
                device_nodes=list(view.device_nodes),
                argv=list(plan.argv),
                command=command_argv(view, plan.argv, env),
                env=env,
                files=view.files,
                mounts=[models.Mount(**asdict(m)) for m in view.mounts],
                workdir=view.workdir,
                image=models.ImageInfo(
                    python=image.python, bin_dir=image.bin_dir, roots=list(image.roots), env=dict(image.env)
                ),
                isolation=sandbox,
                run_as=models.RunAs(name=view.run_as.name, uid=view.run_as.uid, gid=view.run_as.gid)
                if view.run_as
                else None,
                on_start=command_argv(view, hooks["on_start"], env) if hooks["on_start"] else None,
                on_stop=command_argv(view, hooks["on_stop"], env) if hooks["on_stop"] else None,
                notes=list(plan.notes) + notes,
            )
        )
    return launches


def check_image_modules(attempt: JobAttempt, image: ImageEnv) -> None:
    """Refuse a job whose plan puts around its command a launcher the image cannot run.

    The PyTorch modes wrap a ``python ...`` command in torch's launcher (``NodePlan.needs_modules``):
    in an image without torch every node would die in the launcher before the user's first line.
    A job that brings its own ``PYTHONPATH`` is not judged (the modules may come from there).

    Raises:
        InvalidSpec: a module is missing; the message names it and the mode that runs the command
            as written.
    """
    needed = tuple(dict.fromkeys(m for plan in attempt.plans for m in plan.needs_modules))
    if not needed or "PYTHONPATH" in attempt.spec.env:
        return
    missing = missing_modules(image, needed)
    if missing:
        raise InvalidSpec(
            f"the {attempt.spec.mode.value} mode runs your python command under torch's launcher, "
            f"but the image ({image.python}) has no {', '.join(missing)} module: use --mode distributed "
            "(the same variables on every node, the command run as written), or an image with torch",
            field="mode",
        )


def prepare_node(view: NodeView) -> None:
    """Write the node's own files on the host: hosts, hostname, plan files, rank-log folder,
    outputs folders to create, ``view.json``, and (symlink mode) the symlink tree.

    Idempotent; stale results of an earlier attempt (exit code, failure report) are removed.

    Raises:
        RefusedFile: a folder to create has a symlink (or a file) on its way below the job's
            folder or the outputs folder; the launch fails with that message.
    """
    node_dir = Path(view.node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    job_dir = node_dir.parent.parent
    owner = (view.run_as.uid, view.run_as.gid) if view.run_as is not None else None
    for stale in NodeDir.STALE:
        (node_dir / stale).unlink(missing_ok=True)
    view.nd.hosts.write_text(view.hosts)
    view.nd.hostname.write_text(view.hostname + "\n")
    if view.private_network or runs_sshd(view):
        try:
            host = Path("/etc/nsswitch.conf").read_text()
        except OSError:
            host = None
        text = nsswitch_conf(host) if view.private_network else host or ""
        view.nd.nsswitch.write_text(sshd_nsswitch_conf(text) if runs_sshd(view) else text)
    if runs_sshd(view):
        account = view.run_as.uid if view.run_as is not None else os.geteuid()
        view.nd.passwd.write_text(sshd_passwd(Path("/etc/passwd").read_text(), account))
    # the job writes its per-rank logs here (as its own account); a job of an earlier attempt may
    # have left anything in it, so it is made and given away without following symlinks
    make_dirs(
        Path(view.rank_log_dir), trusted=job_dir, owner=f"{view.node} of an earlier attempt", chown=owner
    )
    if view.files_dir.exists():
        _remove(view.files_dir)
    for root in file_roots_used(view):
        (view.files_dir / root.lstrip("/")).mkdir(parents=True, exist_ok=True)
    # the mount point of the writable rank-log folder inside the read-only /job
    (view.files_dir / RANK_LOG_VIEW.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for path, content in view.files.items():
        host = view.files_dir / path.lstrip("/")
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(content)
    if owner is not None:  # freshly made above (the old tree removed without following links)
        for root in file_roots_used(view):
            if root in WRITABLE_FILE_ROOTS:
                folder = view.files_dir / root.lstrip("/")
                for path in [folder, *folder.rglob("*")]:
                    os.lchown(path, *owner)
    for mount in view.mounts:
        if mount.kind == CACHE_KIND:
            caches.ensure(Path(mount.source), owner)
            released = caches.release_stale_locks(Path(mount.source))  # caches rule 6
            if released:
                log.info("node %s: released stale locks in %s: %s", view.node, mount.source, released[:5])
        elif mount.kind == WORKDIR_KIND:
            prepare_working_copy(view, mount, job_dir, owner)
        elif mount.create:
            # A job may have planted a symlink where a task folder goes (shared outputs): create
            # it following none below the job's folder or the user's outputs folder, and give it
            # to the node's account through the folder's own descriptor.
            source = Path(mount.source)
            trusted = job_dir if source.is_relative_to(job_dir) else real_ancestor(source)
            make_dirs(source, trusted=trusted, owner="a job", chown=owner)
            if mount.target == workspace.MODELARTS_HOME:
                # the code folder's mount point: made fresh, by the service, so nothing an
                # earlier attempt left there (a symlink) decides where the bind goes
                jobs = Path(source) / "user-job-dir"
                if jobs.is_symlink() or jobs.is_file():
                    jobs.unlink()
                elif jobs.is_dir():
                    _remove(jobs)
                jobs.mkdir(mode=0o755)
    if view.sandbox == "symlink":
        _build_tree(view)
    view.nd.view_record.write_text(view.to_json())


def _remove(path: Path) -> None:
    """Remove what an earlier attempt's job may have filled (any depth, no link followed:
    :func:`ma_jupyter.foldersize.remove_tree`); what stays fails the launch, saying what."""
    done = remove_tree(path)
    if not done.complete:
        raise OSError(f"cannot remove {path}, left by an earlier attempt: {done.failed[:3]}")


def _build_tree(view: NodeView) -> None:
    if view.tree.exists():
        _remove(view.tree)
    view.tree.mkdir(parents=True)
    helpers = view.nd.python
    if helpers.is_symlink() or helpers.is_file():
        helpers.unlink()
    helpers.mkdir(exist_ok=True)
    (helpers / "ma_jupyter").unlink(missing_ok=True)
    (helpers / "ma_jupyter").symlink_to(PACKAGE_DIR)
    (helpers / "sitecustomize.py").unlink(missing_ok=True)
    (helpers / "sitecustomize.py").symlink_to(SITECUSTOMIZE)
    for mount in view.mounts:
        if mount.kind == CACHE_KIND:
            home = view.nd.home
            home.mkdir(exist_ok=True)
            for link, target in [(".cache", mount.source), *caches.home_links(".", mount.source)]:
                path = home / link
                if path.is_dir() and not path.is_symlink():
                    _remove(path)  # an earlier attempt replaced the link with a folder
                path.unlink(missing_ok=True)
                path.symlink_to(target)
            continue
        link = view.tree / posixpath.relpath(mount.target, VIEW_ROOT)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(mount.source)


def command_argv(view: NodeView, argv: list[str], env: dict[str, str]) -> list[str]:
    """The command as the node runs it: ``${VAR}`` expanded from the node's env, ``python``/
    ``python3`` replaced by the image's interpreter, in-view paths rewritten (symlink mode)."""
    command = expand_argv(list(argv), env)
    if command and command[0] in ("python", "python3"):
        command[0] = view.image.python
    return [to_host(view, a) for a in command]


def compile_node_helpers() -> None:
    """Write the compiled modules of what a node runs from this package (its ``__init__`` and
    ``nodeside/``) next to their sources, where they are missing or older than the sources.

    Inside a sandbox the package is read-only, so no interpreter there can write them: where they
    were never written (a source tree run with ``PYTHONDONTWRITEBYTECODE``, which container
    images often set) every rank's log splitter compiled them again, about 10 ms of each rank's
    start.  A package folder this account cannot write is left as it is (an installed package
    has them from its installation); they serve the nodes whose interpreter is this one's
    version (another version compiles its own, as before).
    """
    import compileall

    package = Path(PACKAGE_DIR)
    try:
        compileall.compile_file(str(package / "__init__.py"), quiet=2)
        compileall.compile_dir(str(package / "nodeside"), maxlevels=0, quiet=2)
    except OSError:
        pass
