"""A program of the platform's own over one job's outputs (its TensorBoard), reading nothing the
job itself could not (:meth:`~ma_jupyter.backends.base.Backend.start_outputs_reader`).

Such a program reads what the job wrote, and the job may have written anything: a symlink
``outputs/steal -> <home>/jobs`` (another user's job), a folder it swaps for a symlink between
the program's check and its open (TensorBoard's projector plugin checks a path, then opens it).
Run with the service's account over the host's view, it would follow them to every job and to
the service's token.  So, in order:

1. The account is the job's, the one its nodes run as (:meth:`.HostPolicy.run_as`).
2. The outputs folder is opened once, and the folder *opened* is checked: the job's default
   folder is reached from its job folder without following a symlink; a folder the spec named
   is opened the way its mount was made and must still pass the mount rules
   (:meth:`.HostPolicy.check_source`: never the service's home, never a system folder, inside
   the allowed roots), whatever a job did to its path since.
3. With bubblewrap (:func:`.bwrap.reader_argv`) the program sees that folder, through its
   descriptor, read-only at :data:`~ma_jupyter.workspace_paths.OUTPUTS_VIEW`, the system and its
   Python installation read-only, and nothing else: a symlink in the outputs resolves inside
   this view, where no service home and no other job exists.  Its variables travel as a file
   (:data:`.bwrap.ENV_FD`), never on a command line.
4. Without bubblewrap (the symlink mode) the program runs on the host as the service's account
   over the folder's host path, the guarantee the job's own nodes have in that mode: none (they
   run unsandboxed as that same account, and could read the token themselves).  When the job's
   account is another one, it is refused, as the job's nodes are.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess

from .. import config
from ..errors import InvalidSpec, RefusedFile
from ..models import Image, Job, is_object_uri
from ..nodeside.exec_env import ENV_FD, env_file_data
from ..workspace_paths import OUTPUTS_VIEW
from .bwrap import SHOWN_FD, reader_argv, unsandboxed_reader_argv
from .host_policy import HostPolicy, load_policy
from .image import resolve_image
from .view import SYSTEM_PATH

log = logging.getLogger(__name__)

#: the variables every reader starts from (the host's are not inherited); the caller's win
BASE_ENV = {
    "PATH": SYSTEM_PATH,
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}


def open_outputs(job: Job, policy: HostPolicy) -> tuple[int, str]:
    """A descriptor of the job's outputs folder (the caller closes it) and the folder's path as
    the kernel names the folder opened (rule 2).

    Raises:
        InvalidSpec: the folder does not exist yet, or a spec's folder now resolves somewhere
            the mount rules refuse.
        RefusedFile: something else than a folder stands where the job's default folder goes.
    """
    # outputs in object storage: the job folder's own, which the uploads read (storage.py)
    if job.spec.outputs and not is_object_uri(job.spec.outputs):
        named = job.spec.outputs
        try:
            # followed as the nodes' bind followed it; what counts is where it led
            fd = os.open(named, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _missing(named, exc) from None
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
            policy.check_source(opened, f"the outputs folder of job {job.id}", "outputs", job.spec.creator)
        except BaseException:
            os.close(fd)
            raise
        return fd, opened
    jd = config.jobdir(job.id)
    root = os.open(jd.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the service's own
    try:
        fd = os.open("outputs", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise RefusedFile(
                f"job {job.id} left something that is not a folder at {jd.outputs}: "
                "its outputs cannot be read through it"
            ) from None
        raise _missing(str(jd.outputs), exc) from None
    finally:
        os.close(root)
    return fd, str(jd.outputs)


def _missing(path: str, exc: OSError) -> Exception:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return InvalidSpec(
            f"{path} is not a folder (yet): the job's outputs folder is made when the job starts"
        )
    return exc


def start(
    job: Job, argv: list[str], env: dict[str, str], output: int | None, sandbox: str
) -> subprocess.Popen:
    """Start ``argv`` over the job's outputs (see the module docstring and the contract's
    :meth:`~ma_jupyter.backends.base.Backend.start_outputs_reader`).

    Args:
        sandbox: the local backend's isolation, ``bubblewrap`` or ``symlink``.

    Raises:
        InvalidSpec: see :func:`open_outputs`; the job's account is another than the service's
            and there is no sandbox; the interpreter ``argv[0]`` is unusable.
        RefusedFile: see :func:`open_outputs`.
    """
    policy = load_policy()
    run_as = policy.run_as(job.spec.creator)
    if sandbox != "bubblewrap" and run_as is not None:
        raise InvalidSpec(
            f"bubblewrap does not work on this machine, and job {job.id}'s outputs may only be read as "
            f"{run_as.name} inside it: install bubblewrap (apt-get install bubblewrap)"
        )
    variables = {**BASE_ENV, **env}
    sink = output if output is not None else subprocess.DEVNULL
    fd, folder = open_outputs(job, policy)
    env_fd = None
    try:
        if sandbox != "bubblewrap":
            log.warning(
                "the outputs of job %s are read without a sandbox, as the service's account: "
                "a symlink in them is followed (the job's own nodes run the same way)",
                job.id,
            )
            command = unsandboxed_reader_argv(
                [folder + a[len(OUTPUTS_VIEW) :] if _in_view(a) else a for a in argv]
            )
            return subprocess.Popen(
                command,
                env=variables,
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        image = resolve_image(Image(python=argv[0]))
        env_fd = os.memfd_create("ma-reader-env")
        data = env_file_data(variables)
        while data:
            data = data[os.write(env_fd, data) :]
        os.lseek(env_fd, 0, os.SEEK_SET)
        holes = {SHOWN_FD: str(fd), ENV_FD: str(env_fd)}
        command = [holes.get(a, a) for a in reader_argv(image, run_as, OUTPUTS_VIEW, argv)]
        return subprocess.Popen(
            command,
            env={"PATH": SYSTEM_PATH},
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, which bwrap keeps (rule 5 of ``Backend.start_outputs_reader``)
            pass_fds=(fd, env_fd),
        )
    finally:
        os.close(fd)
        if env_fd is not None:
            os.close(env_fd)


def _in_view(arg: str) -> bool:
    return arg == OUTPUTS_VIEW or arg.startswith(OUTPUTS_VIEW + "/")
