"""``torch.distributed.run`` whose nodes other than node 0 join once node 0's store listens.

``python -m ma_jupyter.nodeside.torch_run ARGS`` is ``python -m torch.distributed.run ARGS``:
the same arguments (torch's own parser reads them, ``PET_*`` defaults included), output and
exit status.  The pytorch modes wrap a ``python`` command in it.  One thing differs, in order:

1. torch's launcher is imported first.  That takes seconds, and every node does it at once.
2. With the static rendezvous and more than one node, a node whose ``--node_rank`` is not 0
   then waits until ``--master_addr``:``--master_port`` accepts a TCP connection: a probe every
   10 ms, closed at once, for at most the static rendezvous's own timeout (600 s).  Node 0
   does not wait: its launcher hosts the store.
3. The launcher runs as ``python -m torch.distributed.run`` would have.
4. When it succeeds, the process flushes its output and ends at once (``os._exit(0)``): an
   interpreter that has imported torch takes about half a second to tear itself down, and
   nothing is left to do by then (the workers are reaped; the exit barrier, the last thing any
   node's launcher asks of the store, is passed).  A failure ends as it would have: the
   launcher's traceback and status 1.

Why: the launcher's store client that finds nothing listening backs off before it tries again,
longer the earlier it came (with torch 2.13: a refusal 50 ms early costs 0.5 s, one 2 s early
1.8 s).  Nodes importing torch side by side finish in any order, so by hand a node 0 that is
ready second is common, and the whole job waits out the backoff.  The probe costs the store one
connection that it accepts and sees closed; the store counts its workers by their keys, not by
connections.  A probe that never succeeds changes nothing: after the wait the launcher runs and
applies its own timeouts.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time

#: the static rendezvous's default timeout (``torch.distributed.elastic.rendezvous.
#: static_tcp_rendezvous``): waiting longer than the launcher itself would cannot help
WAIT_SECONDS = 600.0
PROBE_INTERVAL = 0.01


def wait_for_listener(host: str, port: int, timeout: float, interval: float = PROBE_INTERVAL) -> bool:
    """Whether ``host:port`` accepted a TCP connection within ``timeout`` seconds.

    Each probe connects and closes at once; a refusal, an unreachable host or a name that does
    not resolve yet is tried again ``interval`` seconds later.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(interval, 1.0)):
                return True
        except OSError:
            pass
        if time.monotonic() + interval > deadline:
            return False
        time.sleep(interval)


def store_to_wait_for(args) -> tuple[str, int] | None:
    """Node 0's store address when this node must wait for it (rule 2), else None."""
    single_node = str(args.nnodes) in ("1", "1:1")
    if args.rdzv_backend != "static" or single_node or int(args.node_rank) == 0 or args.master_port is None:
        return None
    return args.master_addr, int(args.master_port)


def main(argv: list[str]) -> None:
    from torch.distributed import run

    store = store_to_wait_for(run.parse_args(argv))
    if store is not None:
        wait_for_listener(*store, timeout=WAIT_SECONDS)
    run.main(argv)  # a failure raises: the interpreter reports it (rule 4)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
