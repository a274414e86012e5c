"""Whether a multi-node job actually ran distributed: the "not distributed" alert.

A job on several nodes whose processes never joined each other still succeeds: every node ran
the whole training on its own (Lightning's ``Trainer()`` with its defaults, a script that skips
``init_process_group`` when it finds too few GPUs, a TensorFlow script that never builds a
strategy from ``TF_CONFIG``).  The supervisor tells the user with an alert event, never a
failure, and only where the evidence is sure:

1. PyTorch modes: node 0's launcher (``ma_jupyter.nodeside.torch_run``, rule 5) found no rank's
   key in its rendezvous store once every node's ranks had ended; the backend hands its report
   over (:meth:`ma_jupyter.backends.base.Backend.not_distributed`).  :func:`torch_alert`.
2. TensorFlow mode: no node's log (this attempt's lines) has TensorFlow's ``Started server with
   target`` line, which every task prints when a multi-worker or parameter-server strategy (or a
   ``tf.distribute.Server``) starts its server, while at least one node's log shows that
   TensorFlow logged at its INFO level (:data:`TF_INFO_LINE`: a script that set
   ``TF_CPP_MIN_LOG_LEVEL`` hides both, and is then not judged), and every node's log was read
   whole (at most :data:`HEAD_BYTES`).  :func:`tensorflow_alone`, :func:`tensorflow_alert`.

Anything else (other modes, one node, a log too long or unreadable) says nothing.  The texts are
the service's own; nothing the job wrote is quoted in them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: the most of one node's log (this attempt's part) read for rule 2
HEAD_BYTES = 4 << 20
#: TensorFlow's line when a task's server starts (grpc_server_lib.cc)
TF_SERVER_STARTED = b"Started server with target"
#: a TensorFlow INFO line that ``TF_CPP_MIN_LOG_LEVEL`` hides as it hides the server's, printed
#: at import (the CPU features the build leaves unused) or when a GPU is set up:
#: ``I0000 00:00:1795767922.570526    2652 cpu_feature_guard.cc:227] This TensorFlow binary...``.
#: Not ``port.cc``'s oneDNN line: it comes before TensorFlow reads the level, so at every level.
TF_INFO_LINE = re.compile(rb"(?m)^I\d{4} [\d:.]+ +\d+ (?:cpu_feature_guard|gpu_device)\.cc:\d+\] ")


def torch_alert(nodes: int, mode: str) -> str:
    """Rule 1's alert for a job of ``nodes`` nodes in ``mode``."""
    return (
        f"not distributed: no rank of the {nodes} nodes joined a process group, so each node ran "
        f"the command on its own (node 0's rendezvous store saw no rank). The {mode} mode starts the "
        "command on every node with the job's MASTER_ADDR, RANK and WORLD_SIZE; the script itself must "
        "call torch.distributed.init_process_group() or have its framework do it (Lightning: "
        f"Trainer(num_nodes={nodes}, strategy='ddp'), accelerate: Accelerator()); a script that checks "
        "for GPUs may have skipped it. With one node the job runs the same without this alert."
    )


def tensorflow_alone(heads: Sequence[bytes | None]) -> bool:
    """Rule 2 on each node's log (this attempt's part: at most :data:`HEAD_BYTES` read, None
    where the log was longer or could not be read): True only when sure no task started a server."""
    if len(heads) < 2 or any(head is None or len(head) >= HEAD_BYTES for head in heads):
        return False
    if any(TF_SERVER_STARTED in head for head in heads):  # type: ignore[operator]
        return False
    return any(TF_INFO_LINE.search(head) for head in heads)  # type: ignore[arg-type]


def tensorflow_alert(nodes: int) -> str:
    """Rule 2's alert for a job of ``nodes`` nodes."""
    return (
        f"not distributed: none of the {nodes} nodes started a TensorFlow server (no 'Started server "
        "with target' line in their logs), so each node ran the command on its own. The tensorflow "
        "mode sets TF_CONFIG on every node; the script must build a strategy from it "
        "(tf.distribute.MultiWorkerMirroredStrategy(), or ParameterServerStrategy with tf.distribute.Server "
        "on the ps and worker tasks) before it trains."
    )
