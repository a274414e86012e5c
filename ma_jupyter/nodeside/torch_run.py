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

Why: the launcher's store client that finds nothing listening backs off before it tries again,
longer the earlier it came (with torch 2.13: a refusal 50 ms early costs 0.5 s, one 2 s early
1.8 s).  Nodes importing torch side by side finish in any order, so by hand a node 0 that is
ready second is common, and the whole job waits out the backoff.  The probe costs the store one
connection that it accepts and sees closed; the store counts its workers by their keys, not by
connections.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import time

#: the longest wait of rule 2: past it the launcher's own backoff costs little against the wait
WAIT_SECONDS = 60.0
#: between probes that were refused (node 0 is up, its store not yet)
PROBE_INTERVAL = 0.01
#: between probes that failed otherwise (a name not resolving yet: no resolver flood)
SLOW_PROBE_INTERVAL = 0.5


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


def main(argv: list[str]) -> None:
    from torch.distributed import run

    sys.argv[0] = run.__file__  # usage and errors name the launcher, as under ``-m``
    args = run.parse_args(argv)
    store = store_to_wait_for(args)
    if store is not None:
        host, port, timeout = store
        wait_for_listener(host, port, timeout)
    run.main(argv)  # a failure raises: the interpreter reports it (rule 4)
    if args.run_path:  # a function entrypoint: multiprocessing's exit handlers have work
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
