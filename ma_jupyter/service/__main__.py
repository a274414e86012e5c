"""``python -m ma_jupyter.service``: run the job service for ``$MA_JUPYTER_HOME``.

It listens on loopback only, writes ``service.json`` (url, the owner's token, the proxy token,
pid; mode 0600) once it accepts connections, holds ``service.lock`` so one home never gets two
services, and leaves running jobs alone when it exits: they do not depend on it.  The account
that starts it owns it: that user is an admin of the service (see :mod:`.users`), and the home
is made private to it (mode 0700).

The backend is the one place chosen here: ``--backend`` (with ``--ray-address``), else
``[backend]`` of ``cluster.toml``, else the local backend.  A backend that cannot start (Ray
missing, the cluster unreachable) ends the service with exit status 2 and one line saying why.

A start costs little more than its imports (tests and the client's autostart start services by
the hundred): the cyclic garbage collector pauses while the service is built, and where the
environment turns bytecode files off (``PYTHONDONTWRITEBYTECODE``, which container images often
set) the service writes its package's compiled modules once, in the background after it
answers (:func:`keep_compiled`), so that the next start does not compile them again.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path

from .. import config
from ..procstat import STARTTIME, stat_fields


def write_runtime(url: str, token: str, proxy_token: str) -> None:
    """Atomically write the runtime file, readable by the owner only."""
    path = config.runtime_file()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # also when an earlier run left the file
    with os.fdopen(fd, "w") as fh:
        # "started": the process's start in clock ticks (/proc/PID/stat), so that a client can
        # tell this process from a later one given the same pid (a reboot, a killed service)
        fields = stat_fields(os.getpid())
        started = int(fields[STARTTIME]) if fields else None
        json.dump(
            {"url": url, "token": token, "proxy_token": proxy_token, "pid": os.getpid(), "started": started},
            fh,
        )
    os.replace(tmp, path)


#: this package's folder (whose compiled modules :func:`keep_compiled` writes)
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def keep_compiled(package: Path = PACKAGE_DIR) -> None:
    """Write the compiled modules of ``package`` next to its sources where they are missing or
    older than the sources (:func:`compileall.compile_dir`), when the environment turns writing
    them off (``sys.dont_write_bytecode``; otherwise every import writes its own).

    Without them every start of the service compiled its ~170 modules from source again: about
    0.3 s of CPU time of each start on the 2-core test machine.  Python still reads compiled
    modules that exist, also with ``PYTHONDONTWRITEBYTECODE``.  A package folder this account
    cannot write is left as it is (an installed package has them from its installation); the
    node runners read these (:func:`ma_jupyter.nodehost.runner_env.runner_env`).
    """
    if not sys.dont_write_bytecode:
        return
    import compileall

    try:
        compileall.compile_dir(str(package), quiet=2)
    except OSError:
        pass


def owner_name() -> str:
    """The name of the account running the service: its owner (from the account database, never
    from ``$USER``, which the environment could set to anyone)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def make_backend(kind: str | None = None, ray_address: str | None = None):
    """The backend the options (else ``cluster.toml``'s ``[backend]``) choose.

    Raises:
        InvalidSpec: a bad choice (``ray`` without an address, an unknown kind), or a
            ``[network] egress`` policy this service cannot enforce (a service run by an
            ordinary user, no ``nft``: :func:`.egress.refusal`; a Ray cluster file that fences
            every job: :func:`.egress_gate.refusal`), never ignored.
        BackendUnavailable: the backend cannot run here (Ray missing, the cluster unreachable).
    """
    choice = config.load_backend()
    if kind is not None or ray_address is not None:
        kind = kind or ("ray" if ray_address else choice.kind)
        address = ray_address or (choice.address if choice.kind == kind else None)
        choice = config.backend_config(kind, address, choice.node_root, choice.network)
    from ..errors import InvalidSpec

    policy = config.load_egress()
    if policy is not None:
        if choice.kind == "ray":  # the gate is in each Ray node's agent
            from ..backends.ray.egress_gate import refusal as ray_refusal

            why = ray_refusal(policy, choice.network)
        else:
            from ..nodehost.egress import refusal

            why = refusal(policy)
        if why:
            raise InvalidSpec(f"{config.cluster_file()}: [network] egress lists destinations, but {why}")
        config.load_egress_bounds()  # a bound out of its range stops the start, as an entry does
    from ..nodehost import egress_names

    # the policy's names are looked up ahead of the launches (a policy added later too), on
    # either backend: the Ray backend sends the addresses with each launch
    egress_names.NAMES.watch(config.load_egress)
    if choice.kind == "ray":
        from ..backends.ray import RayBackend

        return RayBackend(choice.address or "", choice.node_root, network=choice.network)
    from ..backends.local import LocalBackend

    return LocalBackend()


#: the most descriptors the service asks for (its soft limit raised up to the hard one)
OPEN_FILES_WANTED = 65536


def _raise_open_files_limit() -> None:
    """Raise the soft limit of open files towards the hard one: the egress forwarder's relays,
    terminals and log followers are bounded by what the limit leaves (nodehost/egress.py), and
    the common soft limit of 1024 would leave jobs a few dozen connections in all."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger(__name__).warning("open files stay limited to %d: %s", soft, exc)


def main(argv: list[str] | None = None) -> int:
    """Run the service until SIGTERM; exit status 1 if another service already owns this home."""
    parser = argparse.ArgumentParser(prog="python -m ma_jupyter.service", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--backend",
        choices=config.BACKEND_KINDS,
        help="what runs job nodes (default: [backend] of cluster.toml, else local)",
    )
    parser.add_argument("--ray-address", help="the Ray cluster's address HOST:PORT (with --backend ray)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _raise_open_files_limit()
    # The project folder jobs may mount from by default (host_policy): the one the client that
    # started us worked in, else the folder we were started in.
    os.environ.setdefault(config.ENV_PROJECT_DIR, os.getcwd())
    # The home holds the tokens, the database and every job's files: the owner's alone, also
    # when it was made by hand with looser permissions.
    os.chmod(config.home(), 0o700)

    # 0600 as every file of the home; a lock a killed service left is taken over (flock dies
    # with its holder)
    lock = os.fdopen(os.open(config.home() / "service.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w")
    os.fchmod(lock.fileno(), 0o600)  # also a lock an earlier version left 0644
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"a job service already runs for {config.home()}; see {config.runtime_file()}", file=sys.stderr)
        return 1

    # The start is mostly imports (the web stack, the store, the backend), which allocate many
    # objects and few cycles: the cyclic collector, run on allocation counts, would scan the
    # growing heap again and again for almost nothing.  It resumes once the app is built, with
    # what the start made frozen (objects that live as long as the service: never scanned again).
    gc.disable()
    try:
        return _serve(args)
    finally:
        gc.enable()


def _serve(args: argparse.Namespace) -> int:
    """Build the service (backend, store, supervisor, app) and serve until SIGTERM."""
    import uvicorn

    from ..errors import MaJupyterError
    from .app import create_app
    from .scheduler import Scheduler
    from .store import Store
    from .supervisor import Supervisor
    from .tensorboard import TensorBoardManager
    from .users import Directory, new_token

    try:
        backend = make_backend(args.backend, args.ray_address)
        store = Store(config.db_path())  # StoreTooNew: a database a newer version wrote
    except MaJupyterError as exc:
        print(f"cannot start the job service: {exc.message}", file=sys.stderr)
        return 2
    cluster = config.load_cluster()
    supervisor = Supervisor(store, Scheduler(cluster, inventory=backend.inventory), backend)
    tensorboards = TensorBoardManager(
        backend.start_outputs_reader,
        memory_limit_mb=cluster.limits.tensorboard_memory_mb,
        max_per_user=cluster.limits.max_tensorboards_per_user,
    )
    supervisor.on_job_deleted.append(tensorboards.stop)
    token, proxy_token = new_token(), new_token()
    app = create_app(supervisor, Directory(store, owner_name(), token, proxy_token), tensorboards)

    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the listening
    # socket says it is TCP; without it every keep-alive request waits ~40 ms (Nagle + delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))  # loopback only, never all interfaces
    sock.listen(128)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    supervisor.start()
    server_config = uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan="off")
    server_config.load()  # what the server would load on its start (its protocols), done here
    server = uvicorn.Server(server_config)
    gc.freeze()
    gc.enable()
    write_runtime(url, token, proxy_token)
    threading.Thread(target=keep_compiled, name="ma-compile", daemon=True).start()
    # the home's pycache/ is what node runners of earlier versions compiled for themselves (a
    # mirror of every module they imported); runners now read the installation's own
    threading.Thread(
        target=shutil.rmtree, args=(config.home() / "pycache",), kwargs={"ignore_errors": True}, daemon=True
    ).start()

    def _terminate(_signum, _frame):
        server.should_exit = True

    signal.signal(signal.SIGTERM, _terminate)
    try:
        server.run(sockets=[sock])
    finally:
        supervisor.shutdown()
        tensorboards.shutdown()
        try:
            if json.loads(config.runtime_file().read_text()).get("pid") == os.getpid():
                config.runtime_file().unlink()
        except (OSError, ValueError):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
