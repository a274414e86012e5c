"""``torchrun`` whose nodes other than node 0 join once node 0's store listens.

``python -m ma_jupyter.nodeside.torch_run ARGS`` is ``python -m torch.distributed.run ARGS``
(``torchrun ARGS``): the same arguments (torch's own parser reads them, ``PET_*`` defaults
included), output and exit status.  The pytorch modes wrap a ``python`` command in it.  What it
adds, in order:

1. torch's launcher is imported first.  That takes seconds, and every node does it at once.
2. With the static rendezvous on more than one node, a node whose ``--node_rank`` is not 0
   then waits until node 0's store (``--rdzv_endpoint``, else ``--master_addr``:``--master_port``)
   accepts a TCP connection: a probe every 10 ms while the connection is refused (0.5 s after
   any other failure: a name that does not resolve yet, a host that does not answer within the
   time left), closed at once, for at most 60 s or the rendezvous's own ``timeout``, whichever
   is shorter (a name lookup itself is not bounded).  Node 0 does not wait: its launcher hosts
   the store.  Nothing else waits (``--standalone``, other backends, one node, a rendezvous
   option the launcher cannot read; values it refuses only later, such as ``--nnodes=0:2``,
   do make the node wait, as node 0 fails the same way).
3. The launcher runs as ``torchrun`` would have.  After a wait that gave up it applies its own
   timeouts, which count from then.
4. When it succeeds with a command as entrypoint (not ``--run-path``), the process flushes its
   output and ends at once (``os._exit(0)``): an interpreter that has imported torch takes
   about half a second to tear itself down, and nothing is left to do by then.  The workers
   are reaped, and node 0's store is already closed: the launcher drops it with its agent
   before it returns, so ending sooner cuts no other node off.  A failure ends as it would
   have: the launcher's traceback and status 1.
5. On node 0 of a job with more than one node (static rendezvous, not ``--standalone``), once
   the launcher's exit barrier has passed (every node's workers have ended, and node 0's store
   still listens), it lists the store's keys from a client connection.  Each rank that joins a
   process group through it (``init_process_group`` with ``env://``: torchrun points ranks at
   node 0's store) writes keys there; the launcher's own are under ``<rdzv_id>/``.  When the
   listing worked, shows that every node reached the barrier (its ``last_member`` key), and
   holds no other key, and the launcher succeeded, it writes ``{"nodes": N}`` to
   ``$MA_RANK_LOG_DIR/not-distributed.json``: the job ran on several nodes, but no rank took
   part in a process group, so each node trained on its own.  The node runner hands the file
   to the service, which tells the user with an alert.  Anything uncertain writes nothing: a
   torch without ``list_keys`` or without the launcher's exit barrier, a listing that failed,
   a barrier that did not complete, a failure of the launcher.  (A rank whose backend
   initialises lazily, e.g. NCCL, writes its keys at its first collective: a rank that never
   communicated counts as one that never joined.  Under torchrun ``env://`` and ``tcp://``
   both reach node 0's store; a group formed through a store of the script's own, such as
   ``file://`` on a shared folder, is not seen and gets the report.)
6. With the static rendezvous on more than one node, every node says in node 0's store that it
   has left the launcher's exit barrier (one ``add`` to ``<rdzv_id>/`` :data:`LEFT_BARRIER`),
   and node 0 waits, at most :data:`LEFT_WAIT` seconds, until every node has, before its
   launcher goes on to close the store.  Node 0's launcher closes its store as soon as its own
   barrier has passed; another node still reading the barrier's key at that moment (it was
   preempted between its two store calls, common on a loaded machine) got "Error waiting on
   exit barrier" and a C++ backtrace in its log, though its workers had succeeded.  A node
   whose barrier failed still says so; a store that is gone ends the wait at once.
7. A stop signal (TERM, INT, HUP: the platform's stop, a checkpoint before a drain or a
   scale-up) that the launcher turned into its ``SignalException`` (it has sent the signal on
   to its workers and waited for them) ends the process with status 128 + the signal's number
   and one line saying so, instead of the exception's traceback: a stop asked for is no crash,
   and the job's log of every checkpointed attempt would show one.

Why: the launcher's store client that finds nothing listening backs off before it tries again,
longer the earlier it came (with torch 2.13: a refusal 50 ms early costs 0.5 s, one 2 s early
1.8 s).  Nodes importing torch side by side finish in any order, so by hand a node 0 that is
ready second is common, and the whole job waits out the backoff.  The probe costs the store one
connection that it accepts and sees closed; the store counts its workers by their keys, not by
connections.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import sys
import time
from datetime import timedelta

from .rank_log import LOG_MODE, NOT_DISTRIBUTED_REPORT, RANK_LOG_ENV

#: the longest wait of rule 2: past it the launcher's own backoff costs little against the wait
WAIT_SECONDS = 60.0
#: between probes that were refused (node 0 is up, its store not yet)
PROBE_INTERVAL = 0.01
#: between probes that failed otherwise (a name not resolving yet: no resolver flood)
SLOW_PROBE_INTERVAL = 0.5
#: how long rule 5's connection and listing may take before the check gives up (writes nothing)
LOOK_TIMEOUT = 10.0
#: the key the launcher's exit barrier sets once every node reached it (torch's store utilities)
BARRIER_DONE = "torchelastic/agent/terminal_state/last_member"
#: rule 6's counter: nodes that have left the exit barrier
LEFT_BARRIER = "ma_jupyter/left_exit_barrier"
#: the longest rule 6 keeps node 0's store up for the other nodes
LEFT_WAIT = 10.0
#: the signals rule 7 ends on quietly: a stop asked for (the launcher raises for these alone)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def wait_for_listener(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` accepted a TCP connection within ``timeout`` seconds.

    Each probe connects and closes at once; it is tried again :data:`PROBE_INTERVAL` seconds
    after a refusal, :data:`SLOW_PROBE_INTERVAL` after any other failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            left = deadline - time.monotonic()
            with socket.create_connection((host, port), timeout=max(PROBE_INTERVAL, min(1.0, left))):
                return True
        except OSError as error:
            interval = PROBE_INTERVAL if error.errno == errno.ECONNREFUSED else SLOW_PROBE_INTERVAL
        except (ValueError, OverflowError):  # not an address: the launcher says what is wrong
            return False
        if time.monotonic() + interval > deadline:
            return False
        time.sleep(interval)


def store_to_wait_for(args) -> tuple[str, int, float] | None:
    """Node 0's store and how long to wait for it, when this node must (rule 2); else None."""
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config, parse_rendezvous_endpoint

    try:
        if args.standalone or args.rdzv_backend != "static" or int(args.node_rank) == 0:
            return None
        if run.parse_min_max_nnodes(args.nnodes)[1] == 1:
            return None
        # the launcher's own defaulting (torch.distributed.run.run, get_rdzv_endpoint)
        port = 29500 if args.master_port is None else args.master_port
        host, port = parse_rendezvous_endpoint(args.rdzv_endpoint or f"{args.master_addr}:{port}", -1)
        # read as the static rendezvous reads it (an int), so a value it refuses waits for nothing
        timeout = int(_parse_rendezvous_config(args.rdzv_conf).get("timeout", WAIT_SECONDS))
    except Exception:  # arguments the launcher refuses: it says why, without a wait
        return None
    return (host, port, float(min(timeout, WAIT_SECONDS))) if port > 0 else None


class ProcessGroupCheck:
    """Rule 5: whether the ranks of a multi-node job left any key in node 0's store.

    :meth:`look` runs once, in the launcher's thread, right after its exit barrier;
    :attr:`alone` is then True only when the look proved that no rank wrote to the store.
    """

    def __init__(self, host: str, port: int, run_id: str, nodes: int) -> None:
        self.host, self.port, self.run_id, self.nodes = host, port, run_id, nodes
        self.alone = False

    def look(self) -> None:
        try:
            from torch.distributed import TCPStore

            client = TCPStore(
                self.host, self.port, is_master=False, wait_for_workers=False,
                timeout=timedelta(seconds=LOOK_TIMEOUT),
            )  # fmt: skip
            keys = list(client.list_keys())
        except Exception:  # an older torch, a store gone: unsure, so nothing is said
            return
        own = f"{self.run_id}/"
        self.alone = own + BARRIER_DONE in keys and all(key.startswith(own) for key in keys)

    def report(self, folder: str | None) -> None:
        """Write ``not-distributed.json`` in ``folder`` when :meth:`look` found no rank's key."""
        if not (self.alone and folder):
            return
        try:
            fd = os.open(
                os.path.join(folder, NOT_DISTRIBUTED_REPORT), os.O_WRONLY | os.O_CREAT | os.O_EXCL, LOG_MODE
            )
        except OSError:  # there already (a job's own file): the runner judges what it finds
            return
        with os.fdopen(fd, "w") as fh:
            json.dump({"nodes": self.nodes}, fh)


def hook_exit_barrier(args) -> ProcessGroupCheck | None:
    """Rules 5 and 6, hooked after the launcher's exit barrier where they apply; rule 5's check
    (node 0 only), else None."""
    from torch.distributed import run
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    try:
        if args.standalone or args.rdzv_backend != "static":
            return None
        node_rank = int(args.node_rank)
        nodes = run.parse_min_max_nnodes(args.nnodes)[1]
        port = 29500 if args.master_port is None else args.master_port
        host, port = parse_rendezvous_endpoint(args.rdzv_endpoint or f"{args.master_addr}:{port}", -1)
    except Exception:  # arguments the launcher refuses: it says why
        return None
    barrier = SimpleElasticAgent.__dict__.get("_exit_barrier")
    if nodes < 2 or barrier is None:
        return None
    check = ProcessGroupCheck(host, int(port), str(args.rdzv_id), nodes) if node_rank == 0 else None

    def exit_barrier(agent):  # the store is still up: node 0's agent closes it after this
        barrier(agent)
        left_barrier(agent, node_rank)
        if check is not None:
            check.look()

    SimpleElasticAgent._exit_barrier = exit_barrier
    return check


def left_barrier(agent, node_rank: int) -> None:
    """Rule 6 for this node: say it left the barrier; node 0 waits for every node's word."""
    try:
        store = agent._store
        nodes = agent._worker_group.group_world_size
        left = store.add(LEFT_BARRIER, 1)
        deadline = time.monotonic() + LEFT_WAIT
        while node_rank == 0 and left < nodes and time.monotonic() < deadline:
            time.sleep(0.005)
            left = store.add(LEFT_BARRIER, 0)
    except Exception:  # a torch without these, a store gone: the launcher goes on as it would
        return


def stop_signal(exc: BaseException) -> int | None:
    """The signal number of the launcher's ``SignalException`` for a stop signal (rule 7), else
    None (any other failure, reported as the launcher's own)."""
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
    except ImportError:
        return None
    if isinstance(exc, SignalException) and int(exc.sigval) in STOP_SIGNALS:
        return int(exc.sigval)
    return None


def main(argv: list[str]) -> None:
    from torch.distributed import run

    sys.argv[0] = run.__file__  # usage and errors name the launcher, as under ``-m``
    args = run.parse_args(argv)
    store = store_to_wait_for(args)
    if store is not None:
        host, port, timeout = store
        wait_for_listener(host, port, timeout)
    check = hook_exit_barrier(args)
    try:
        run.main(argv)  # a failure raises: the interpreter reports it (rule 4)
    except Exception as exc:
        signum = stop_signal(exc)
        if signum is None:
            raise
        print(
            f"[ma_jupyter] torchrun stopped by {signal.Signals(signum).name}: its workers got the signal and ended",
            file=sys.stderr,
            flush=True,
        )
        logging.shutdown()
        sys.stdout.flush()
        os._exit(128 + signum)  # rule 7
    if check is not None:
        check.report(os.environ.get(RANK_LOG_ENV))
    if args.run_path:  # a function entrypoint: multiprocessing's exit handlers have work
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
