"""The bubblewrap argv that makes a node's view (:class:`~.view.NodeView`) real.

Contract:

1. Pure: every function here returns an argv and starts nothing, except
   :func:`tmpfs_size_works`, which probes the installed bubblewrap once and remembers the answer.
2. The sandbox's root is made only of read-only binds of the system (:data:`~.image.SYSTEM_DIRS`),
   the image's Python installation and this package's helpers; fresh ``/proc``, ``/dev`` and
   ``/tmp``; the node's own cards (:func:`card_device_args`); its own pid, UTS and IPC
   namespaces; and no capabilities (``--cap-drop ALL``).  What the view mounts is bound as
   :mod:`.mounts` decided (read-only stays read-only).
3. The node's variables never travel on a command line: the runner hands them over as a file
   descriptor (:data:`~ma_jupyter.nodeside.exec_env.ENV_FD`) that
   :data:`~.view.EXEC_ENV` applies inside the sandbox.
4. System programs (bwrap, nsenter...) are found on :data:`~.view.SYSTEM_PATH`, never on a
   job's ``PATH``.
5. :func:`reader_argv` is the one view not made from a node: a platform program over one
   job's outputs (:mod:`.outputs_reader`), shown read-only and nothing else.
6. ``/sys/fs/cgroup`` shows no other job's cgroup: an empty read-only tmpfs over it, and in a
   node's sandbox only the node's own cgroup folders bound read-only where the kernel's
   hierarchies would show them (:func:`.cgroup.sandbox_binds`: its memory limit and use stay
   readable).  ``/proc/self/cgroup`` still names the node's own cgroup path (no cgroup
   namespace: the node's tests read it to see that the node is in its own cgroup); it names
   no other job.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import subprocess
import threading

from ..errors import InvalidSpec
from ..jobdir import RANK_LOG_VIEW
from ..nodeside.exec_env import COPY_FD, ENV_FD, ENV_FILE
from . import caches
from .cgroup import sandbox_binds
from .host_policy import RunAs
from .image import SYSTEM_DIRS, ImageEnv
from .mounts import VIEW_ROOT
from .view import (
    COPY_SOURCE_VIEW,
    EXEC_ENV,
    HELPERS_VIEW,
    PACKAGE_DIR,
    SITECUSTOMIZE,
    SYSTEM_PATH,
    WRITABLE_FILE_ROOTS,
    NodeView,
    file_roots_used,
    runs_sshd,
)


def card_device_args(view: NodeView) -> list[str]:
    """The bubblewrap options giving the node its cards: ``--dev-bind`` of each of
    :attr:`NodeView.device_nodes` (nothing for a node without real cards), at the same place in
    the sandbox, usable as devices (:mod:`ma_jupyter.accelerators` rule 3: ``--bind`` would
    mount them ``nodev``)."""
    args: list[str] = []
    for path in view.device_nodes:
        args += ["--dev-bind", path, path]
    return args


def _probe_root() -> list[str]:
    """The root of the probes' sandboxes: the system's program folders read-only (a link among
    them as the link), as every node's sandbox has them (:func:`_system_args`).

    Never ``/`` itself: bubblewrap remounts each mount below a recursive bind read-only, one at a
    time, and fails ("Unable to apply mount flags") when one of them goes away meanwhile: on a
    busy machine another job's network namespace file (a bind mount that lives only while its
    attempt starts), which made a probe answer "bubblewrap does not work" for a service's whole
    life."""
    return _system_dirs_args(skip="/sys")  # nothing a probe runs reads /sys


def _system_dirs_args(skip: str = "") -> list[str]:
    """:data:`~.image.SYSTEM_DIRS` but ``skip``, read-only, a link among them as the link."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if path == skip:
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def namespaces_probe_argv(bwrap: str = "bwrap") -> list[str]:
    """A sandbox that only runs ``true`` in a pid namespace of its own: whether bubblewrap can
    make namespaces here (the local backend asks once per process)."""
    return [bwrap, *_probe_root(), "--unshare-pid", "--cap-drop", "ALL", "true"]


def user_namespace_probe_argv(bwrap: str) -> list[str]:
    """A sandbox mounting a fresh ``/proc`` and ``/dev`` and running ``true``, which
    :func:`.userns.check_user_namespace` starts in a user namespace (the probe builds it here and
    hands it to the check: the check's process need not import these builders)."""
    argv = [bwrap, *_probe_root(), "--proc", "/proc", "--dev", "/dev", "--unshare-pid"]
    return argv + ["--cap-drop", "ALL", "--", "true"]


def _host_program(name: str) -> str:
    """The absolute path of a system program the platform runs (never looked up on a job's PATH)."""
    found = shutil.which(name, path=SYSTEM_PATH)
    if not found:
        raise InvalidSpec(f"{name} is not installed on this machine (looked in {SYSTEM_PATH})")
    return found


def enter_env_argv(view: NodeView, command: list[str], *, copy: bool = False) -> list[str]:
    """The command that, inside the sandbox, switches to the node's account and then (and only
    then) applies the job's environment: ``setpriv`` (as root only), then
    :mod:`ma_jupyter.nodeside.exec_env` reading :data:`ENV_FILE`; with ``copy``, exec_env first
    fills the node's working copy from :data:`COPY_SOURCE_VIEW` and reports its end on the
    descriptor the runner puts in place of :data:`COPY_FD`.

    The job's variables never reach a program running with privileges (``LD_PRELOAD`` or a
    ``PATH`` of the job's apply to the job's own command, after the switch), and never stand on
    a command line, which every user of the host can read.
    """
    fill: list[str] = []
    if copy:
        mount = view.working_copy
        assert mount is not None
        fill = ["--copy", COPY_SOURCE_VIEW, mount.target, str(view.copy_limit), COPY_FD]
    return _enter_argv(view.run_as, view.image.python, command, fill)


def _enter_argv(
    run_as: RunAs | None, python: str, command: list[str], fill: list[str] | None = None
) -> list[str]:
    """``setpriv`` to ``run_as`` (none: no switch), then ``exec_env`` under ``python`` applying
    :data:`ENV_FILE`, then ``command`` (see :func:`enter_env_argv`)."""
    prefix: list[str] = []
    if run_as is not None:
        prefix = [
            _host_program("setpriv"),
            f"--reuid={run_as.uid}",
            f"--regid={run_as.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ]
    return prefix + [python, "-I", "-S", EXEC_ENV, ENV_FILE, *(fill or []), "--", *command]


def bwrap_argv(
    view: NodeView,
    command: list[str],
    *,
    pid_namespace: bool = True,
    copy: bool = False,
    cgroup: dict | None = None,
) -> list[str]:
    """The bubblewrap argv running ``command`` in the node's view, with the variables the runner
    hands over through :data:`ENV_FD`.

    A minimal root (never ``--dev-bind / /``): the system folders, ``/etc`` entry by entry (so
    the node's own hosts, hostname and ``/etc/mpi`` can take their places) and the image's
    installation, all read-only; fresh /proc, /dev, /tmp; the workspace mounts; the node's file
    roots read-only (but ``/user/config``) and its rank-log folder writable at ``/job/logs``.  ``--cap-drop ALL`` keeps
    root from remounting read-only binds; ``--unshare-pid`` + ``--die-with-parent`` make the
    node's processes die together when bwrap is killed, whatever sessions they made.
    ``--clearenv`` plus :func:`enter_env_argv`: bubblewrap runs with the caller's fixed
    environment, and the job's own variables apply only after the switch to its account.

    Args:
        view: the node.
        command: argv to run inside (already expanded, see :func:`command_argv`).
        env: the node's environment (:func:`node_env`); None: none but a system PATH.
        pid_namespace: False to share the host's pid namespace (e.g. a helper that must see
            processes outside).
        copy: the node's first phase at its first launch: it fills the working copy before
            the command runs (:func:`enter_env_argv`), the original shown read-only at
            :data:`COPY_SOURCE_VIEW` for this phase only.
        cgroup: the node's own cgroup (the runner's ``cgroup`` instructions, :mod:`.cgroup`),
            shown read-only under ``/sys/fs/cgroup`` (rule 6); None: none shown.
    """
    args = [_host_program("bwrap"), "--die-with-parent", "--new-session", "--unshare-uts", "--unshare-ipc"]
    if pid_namespace:
        args.append("--unshare-pid")
    args += ["--hostname", view.hostname]
    args += _system_args(view.tmpfs_limit, cgroup)
    args += card_device_args(view)
    args += _etc_args(view)
    args += _python_args(view.image.roots) + _helpers_args(view)
    args += ["--perms", "0755", "--dir", VIEW_ROOT]
    for mount in view.mounts:
        if not mount.target.startswith("/tmp/"):  # /tmp is there already (its tmpfs)
            args += _parents(mount.target)
        args += ["--ro-bind" if mount.read_only else "--bind", mount.source, mount.target]
    for root in file_roots_used(view):
        if root.startswith("/etc/"):
            continue  # bound together with /etc, see _etc_args
        bind = "--bind" if root in WRITABLE_FILE_ROOTS else "--ro-bind"
        args += _parents(root) + [bind, str(view.files_dir / root.lstrip("/")), root]
    args += ["--bind", view.rank_log_dir, RANK_LOG_VIEW]
    args += _env_file_args()
    if copy and view.working_copy is not None and view.working_copy.copy_of:
        args += ["--ro-bind", view.working_copy.copy_of, COPY_SOURCE_VIEW]
    args += ["--remount-ro", "/etc", "--chdir", view.workdir, "--clearenv", "--setenv", "PATH", SYSTEM_PATH]
    args += _capability_args(view.run_as)
    return args + ["--"] + enter_env_argv(view, list(command), copy=copy)


def _system_args(tmpfs_limit: int = 0, cgroup: dict | None = None) -> list[str]:
    """The system folders read-only, fresh ``/proc`` and ``/dev``, and empty ``/tmp``, ``/run``
    and ``/dev/shm`` (each at most ``tmpfs_limit`` bytes when it is positive), and of
    ``/sys/fs/cgroup`` only the folders of ``cgroup`` (rule 6): the base of every
    sandbox."""
    args = _system_dirs_args()
    args += _cgroup_args(cgroup)
    # /tmp is every account's (HOME=/tmp): sticky and world-writable, like a host's /tmp
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]
    args += [*_tmpfs(tmpfs_limit, "/tmp"), *_tmpfs(tmpfs_limit, "/run")]
    # shared memory every account may use (PyTorch's data loaders; seed 000 lists /dev/shm)
    args += ["--perms", "1777", *_tmpfs(tmpfs_limit, "/dev/shm")]
    return args


#: where the kernel's cgroup hierarchies are mounted (hidden in every sandbox, rule 6)
CGROUP_ROOT = "/sys/fs/cgroup"


def _cgroup_args(cgroup: dict | None) -> list[str]:
    """Rule 6: an empty tmpfs over ``/sys/fs/cgroup`` (other jobs' cgroups hold their ids and
    memory use), then the node's own cgroup folders read-only where the hierarchies show them
    (``--ro-bind-try``: a node whose runner could not make its cgroup runs without, as its log
    says), and all of it read-only."""
    if not os.path.isdir(CGROUP_ROOT):
        return []
    args = ["--perms", "0755", "--tmpfs", CGROUP_ROOT]
    for host, shown in sandbox_binds(cgroup, CGROUP_ROOT) if cgroup else []:
        if shown != CGROUP_ROOT:
            args += ["--perms", "0755", "--dir", shown]
        args += ["--ro-bind-try", host, shown]
    return args + ["--remount-ro", CGROUP_ROOT]


log = logging.getLogger(__name__)


_TMPFS_SIZE_LOCK = threading.Lock()


_TMPFS_SIZE_OK: bool | None = None


def tmpfs_size_works(bwrap: str | None = None) -> bool:
    """Whether bubblewrap caps a tmpfs here (``--size``: bubblewrap 0.7 and later, and refused
    by a setuid install), tried once per process with a real 4 KiB tmpfs (``bwrap`` names
    another program than the machine's, for a test: then nothing is remembered).  When it cannot,
    the service log says so once and the memory-backed folders stay uncapped: the node's memory
    watchdog still counts what they hold, but one of them may take up to half the host's memory
    before a sample sees it."""
    global _TMPFS_SIZE_OK
    with _TMPFS_SIZE_LOCK:
        if _TMPFS_SIZE_OK is not None and bwrap is None:
            return _TMPFS_SIZE_OK
        argv = [bwrap or _host_program("bwrap"), *_probe_root(), "--size", "4096", "--tmpfs", "/tmp"]
        argv += ["--", "true"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            works = done.returncode == 0
            why = done.stderr.strip()[:300] or f"exit code {done.returncode}"
        except (OSError, subprocess.SubprocessError) as exc:
            works, why = False, str(exc)
        if not works:
            log.warning(
                "bubblewrap cannot cap a tmpfs here (--size needs bubblewrap 0.7 or later, not "
                "installed setuid: %s): the nodes' /tmp, /run and /dev/shm are uncapped, their use "
                "still counts in each node's memory",
                why,
            )
        if bwrap is None:
            _TMPFS_SIZE_OK = works
        return works


def _tmpfs(limit: int, path: str) -> list[str]:
    """A memory-backed folder no larger than ``limit`` bytes (a node's memory,
    :attr:`NodeView.tmpfs_limit`, where its use counts too): without a cap each would take up to
    half the host's memory, outside the node's limit.  Uncapped where bubblewrap cannot cap it
    (:func:`tmpfs_size_works`)."""
    size = ["--size", str(limit)] if limit > 0 and tmpfs_size_works() else []
    return [*size, "--tmpfs", path]


def _python_args(roots: tuple[str, ...] | list[str]) -> list[str]:
    """The Python installation's folders ``roots`` and this package, read-only."""
    args: list[str] = []
    for root in roots:
        args += _parents(root) + ["--ro-bind", root, root]
    if not any(PACKAGE_DIR == r or PACKAGE_DIR.startswith(r + "/") for r in roots):
        args += _parents(PACKAGE_DIR) + ["--ro-bind", PACKAGE_DIR, PACKAGE_DIR]
    return args


def _helpers_args(view: NodeView) -> list[str]:
    """:data:`HELPERS_VIEW` holding a link to this package and the node's ``sitecustomize``, and
    (with the user's cache) the links of the folders frameworks keep in HOME to theirs in the
    cache (:func:`.caches.home_links`)."""
    args = _parents(HELPERS_VIEW) + ["--perms", "0755", "--dir", HELPERS_VIEW]
    args += ["--symlink", PACKAGE_DIR, f"{HELPERS_VIEW}/ma_jupyter"]
    args += ["--symlink", SITECUSTOMIZE, f"{HELPERS_VIEW}/sitecustomize.py"]
    if view.cache is not None:
        home = posixpath.dirname(caches.CACHE_VIEW)
        for link, target in caches.home_links(home, caches.CACHE_VIEW):
            args += ["--symlink", posixpath.relpath(target, home), link]
    return args


def _env_file_args() -> list[str]:
    """:data:`ENV_FILE`, read-only, from the descriptor the runner puts in place of :data:`ENV_FD`."""
    folder = ["--perms", "0755", "--dir", posixpath.dirname(ENV_FILE)]
    return folder + ["--perms", "0444", "--ro-bind-data", ENV_FD, ENV_FILE]


def _capability_args(run_as: RunAs | None) -> list[str]:
    """No capability survives, but the two setpriv needs to switch to ``run_as``."""
    args = ["--cap-drop", "ALL"]
    if run_as is not None:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return args


def _parents(target: str) -> list[str]:
    """``--perms 0755 --dir`` for each ancestor of ``target`` (bwrap would make them 0700)."""
    out: list[str] = []
    parts = target.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        out += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return out


def _etc_args(view: NodeView) -> list[str]:
    """/etc as a tmpfs holding the host's entries read-only, except the ones the node owns."""
    own_files = {"hosts": view.nd.hosts, "hostname": view.nd.hostname}
    if view.private_network or runs_sshd(view):
        own_files["nsswitch.conf"] = view.nd.nsswitch
    if runs_sshd(view):
        own_files["passwd"] = view.nd.passwd
    roots = {r.split("/")[2] for r in file_roots_used(view) if r.startswith("/etc/")}
    owned = set(own_files) | roots
    if all(
        os.path.isfile(f"/etc/{name}") and not os.path.islink(f"/etc/{name}") for name in own_files
    ) and all(os.path.isdir(f"/etc/{name}") and not os.path.islink(f"/etc/{name}") for name in roots):
        # Every entry the node owns already exists on the host (its files as files, its file
        # roots as folders): bind /etc whole and lay the node's over them (binding over an existing file creates nothing on the host, and one
        # bind instead of one per entry makes the sandbox start much faster).
        args = ["--ro-bind", "/etc", "/etc"]
        for name, path in own_files.items():
            args += ["--ro-bind", str(path), f"/etc/{name}"]
        for root in file_roots_used(view):
            if root.startswith("/etc/"):
                args += ["--ro-bind", str(view.files_dir / root.lstrip("/")), root]
        return args
    args = ["--perms", "0755", "--tmpfs", "/etc"]
    try:
        entries = sorted(os.listdir("/etc"))
    except OSError:
        entries = []
    for name in entries:
        if name in owned:
            continue
        path = f"/etc/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    for name, path in own_files.items():
        args += ["--ro-bind", str(path), f"/etc/{name}"]
    for root in file_roots_used(view):
        if root.startswith("/etc/"):
            args += ["--ro-bind", str(view.files_dir / root.lstrip("/")), root]
    return args


def sandbox_argv(
    view: NodeView,
    command: list[str],
    *,
    pid_namespace: bool = True,
    copy: bool = False,
    cgroup: dict | None = None,
) -> list[str]:
    """``command`` wrapped to run in the node's view: bubblewrap (the runner hands the node's
    variables over through :data:`ENV_FD`; ``copy``, ``cgroup``: see :func:`bwrap_argv`), or as is in the
    symlink mode (where the command's paths were already rewritten by :func:`command_argv`, the
    runner applies the variables to the command alone, and copies the working copy itself)."""
    if view.sandbox == "bubblewrap":
        return bwrap_argv(view, command, pid_namespace=pid_namespace, copy=copy, cgroup=cgroup)
    return list(command)


#: a reader's argv holds this argument where the runner puts the descriptor of the folder the
#: reader is shown (:func:`reader_argv`)
SHOWN_FD = "{shown-fd}"


def reader_argv(image: ImageEnv, run_as: RunAs | None, shown: str, command: list[str]) -> list[str]:
    """The bubblewrap argv running ``command``, a program of the platform's own that reads one
    folder of a job's for the service (its TensorBoard over the outputs), as ``run_as``.

    The same minimal root as a node's (:func:`bwrap_argv`): the system folders, ``/etc``, the
    image (``image``: the interpreter that runs ``command``) and this package, all read-only;
    fresh ``/proc``, ``/dev`` and ``/tmp``; its own pid, UTS and IPC namespaces; no capability
    but the two ``setpriv`` needs; the variables from :data:`ENV_FD` applied after the switch
    (:func:`enter_env_argv`).  Then the folder, read-only at ``shown``, bound from the
    descriptor the caller puts in place of :data:`SHOWN_FD` (the folder it opened and checked,
    never a path resolved again), and nothing else: no job folder, no service home, nothing
    writable but its ``/tmp``.  The network is the caller's (the service's, whose proxy reaches
    the program on loopback).

    ``--die-with-parent``: it ends with the *thread* that started bwrap (a parent-death signal
    follows the thread, not the process), so the caller starts it from one that lives as long as
    the reader should.  No ``--new-session``: the reader stays in the process group the caller
    made, so one ``killpg`` ends all of it (its stdin is not a terminal, so a new session keeps
    nothing from it).
    """
    args = [_host_program("bwrap"), "--die-with-parent", "--unshare-uts", "--unshare-ipc", "--unshare-pid"]
    args += ["--hostname", "reader"]
    args += _system_args()
    args += ["--ro-bind", "/etc", "/etc"]
    args += _python_args(image.roots)
    args += _parents(shown) + ["--ro-bind-fd", SHOWN_FD, shown]
    args += _env_file_args()
    args += ["--chdir", "/", "--clearenv", "--setenv", "PATH", SYSTEM_PATH]
    args += _capability_args(run_as)
    return args + ["--"] + _enter_argv(run_as, image.python, list(command))


def unsandboxed_reader_argv(command: list[str]) -> list[str]:
    """The symlink mode's :func:`reader_argv`: ``command`` as it is, on the host, ending with
    the thread that started it as bubblewrap's ``--die-with-parent`` would make it."""
    return [_host_program("setpriv"), "--pdeathsig", "KILL", "--", *command]
