"""Whether a job's code takes part in a distributed run: the warning for a script that every
node would run as a separate copy of the whole training.

A job on several nodes in the distributed, pytorch, horovod or tensorflow mode starts its command on every
node; a script that never reads the variables the platform sets (``RANK``, ``WORLD_SIZE``,
``TF_CONFIG``, Open MPI's ``OMPI_*``...) nor starts a distributed framework trains N times side
by side, and the copies overwrite each other's outputs.  The dry run shows :func:`warning` as
a note and the submit records it as an event.

The test is a heuristic on the code's text that says nothing unless it is sure.  In order:

1. Only a job of one of :data:`MODES` on more than one node, with a ``command``, is looked at
   (:func:`applies`).
2. A command that names a distributed variable or launcher itself (``$RANK``, ``torchrun``,
   ``--local_rank``...) is distributed.
3. The command must be ``python SCRIPT``, ``python -m MODULE`` or ``python -c CODE``, and the
   script or module must be one of the algorithm folder's Python files (``/workspace/algorithm``,
   as the backend read them: :meth:`~ma_jupyter.backends.base.Backend.code_sources`).  Anything
   else (a shell, a launcher, an installed module, sources the backend could not read) is
   unknown: no warning.
4. Any :data:`MARKERS` word in the command's code or any of the algorithm's Python files
   (comments included: the script may import the others) means distributed.
5. Code that starts other programs or imports code dynamically (:data:`.code_text.DYNAMIC`),
   that does not parse, or that imports a package that is neither the standard library, one of
   the algorithm's own modules nor one of :data:`SINGLE_PROCESS_LIBRARIES` is unknown (such a
   package may set up the distributed run itself).
6. What is left is a single-process script: warn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..models import JobSpec, Mode
from . import code_text
from .code_text import beyond_text, command_texts

MODES = (Mode.distributed, Mode.pytorch, Mode.horovod, Mode.tensorflow)

#: words whose presence means the code knows it runs distributed (rule 4)
MARKERS = re.compile(
    r"RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TF_CONFIG|OMPI_|PMI_|\bSLOTS\b|PET_|DEVICE_ID"
    r"|\brank\b|get_rank|world_size|local_rank|task_index|ps_hosts|worker_hosts|init_method"
    r"|distribute|Distributed|Strategy|init_process_group|horovod|hvd\b|mpi4py|\bMPI\b"
    r"|lightning|Lightning|accelerate|Accelerator|deepspeed|DeepSpeed|\bray\b|torchrun|mpirun|mpiexec"
    r"|JAX_|MA_PORTS|MA_MASTER_PORTS|MS_SCHED|MS_WORKER|collective|Tracker"
)
#: libraries that never set up a distributed run by themselves (their distributed parts are
#: reached through names MARKERS finds: torch.distributed, tf.distribute...)
SINGLE_PROCESS_LIBRARIES = code_text.PLAIN_LIBRARIES


def applies(spec: JobSpec) -> bool:
    """Whether the job runs its command on several nodes in a mode that starts it on each (rule 1)."""
    return spec.mode in MODES and spec.nodes > 1 and bool(spec.command)


def warning(spec: JobSpec, sources: Mapping[str, str] | None) -> str | None:
    """The sentence warning that every node runs its own copy of a single-process script, or
    None when the job is distributed-aware or the heuristic is not sure.

    Args:
        spec: the job.
        sources: the algorithm folder's Python files (path below it → text), or None when they
            could not be read (then only ``python -c CODE`` without an algorithm is judged).
    """
    if not applies(spec):
        return None
    try:
        aware = is_distributed(spec, sources)
    except (ValueError, SyntaxError, RecursionError):
        return None  # a command or a file that does not parse: not sure
    if aware is not False:
        return None
    return (
        "warning: nothing in the job's code reads a variable of the distributed run (RANK, "
        "WORLD_SIZE, TF_CONFIG, OMPI_*...) or starts a distributed framework: each of the "
        f"{spec.nodes} nodes will run its own copy of the whole training, and the copies write the "
        "same outputs. Submit it with --nodes 1, or make it distributed (docs/variables.md lists "
        "what each node gets)"
    )


def is_distributed(spec: JobSpec, sources: Mapping[str, str] | None) -> bool | None:
    """True: the code takes part in a distributed run; False: a single-process script; None:
    not sure (rules 2 to 6)."""
    command = spec.command or ""
    if MARKERS.search(command):
        return True
    texts = command_texts(spec, sources)
    if texts is None:
        return None
    if any(MARKERS.search(text) for text in texts):
        return True
    if beyond_text(texts, sources or {}, SINGLE_PROCESS_LIBRARIES):
        return None
    return False
