"""Whether a job that asks for checkpoint resume can use it: the readiness check of the dry run,
the create forms and the submit.

Checkpoint resume (``--resume N``) sends the training processes SIGTERM on a fault, waits the
grace period for them to save, and schedules the job again with ``MA_RESUME=1``.  That only helps
code that saves on SIGTERM and loads what it saved: Python's default for SIGTERM ends the process
at once, and code that never loads a checkpoint starts each resume from the beginning.  The
user learns it before the first fault: the dry run shows :func:`warning` as a note and the
submit records it as an event.

Like :mod:`.single_copy` it is a heuristic on the code's text that says nothing unless it is sure.
In order:

1. Only a job with ``checkpoint_resume`` and a ``command`` is looked at (:func:`applies`).
2. The command must be ``python SCRIPT``, ``python -m MODULE`` or ``python -c CODE`` (directly,
   or as the command of a mode that wraps it), and a script or module must be one of the
   algorithm folder's Python files (:mod:`.code_text`).  Anything else (a shell, a launcher, an
   installed module, sources the backend could not read) is unknown: no warning.
3. The texts judged are the command's code and every Python file of the algorithm folder (the
   script may import the others).  Code that starts other programs or imports code dynamically,
   that does not parse, or that imports a package that is neither the standard library, one of
   the algorithm's own modules nor one of :data:`PLAIN_LIBRARIES` is unknown: such a package may
   install its own SIGTERM handler or resume by itself.
4. The code *saves on SIGTERM* when a text names ``SIGTERM`` or calls ``signal(15, ...)``.
5. The code *resumes* when a text matches :data:`RESUMES`: it reads ``MA_RESUME`` or
   ``MA_ATTEMPT``, or loads a checkpoint (``torch.load``, ``load_state_dict``, a TensorFlow
   checkpoint's ``restore``, Keras's ``BackupAndRestore``...).
6. Code that lacks either is warned about, naming what it lacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..models import JobSpec
from . import code_text
from .code_text import beyond_text, command_texts

#: rule 4: a SIGTERM handler (by name, or by number in a ``signal(...)`` call)
SAVES_ON_SIGTERM = re.compile(r"SIGTERM|\bsignal\s*\(\s*15\s*,")
#: rule 5: reading the attempt, or loading a checkpoint
RESUMES = re.compile(
    r"MA_RESUME|MA_ATTEMPT|torch\.load|load_state_dict|load_checkpoint|load_weights|"
    r"\.restore\s*\(|BackupAndRestore|resume_from_checkpoint|CheckpointManager"
)
#: libraries that neither install a SIGTERM handler nor resume by themselves (their checkpoint
#: calls are found by RESUMES in the job's own code)
PLAIN_LIBRARIES = code_text.PLAIN_LIBRARIES | {"mindspore"}


def applies(spec: JobSpec) -> bool:
    """Whether the job asks for checkpoint resume and has a command to judge (rule 1)."""
    return spec.checkpoint_resume is not None and bool(spec.command)


def readiness(spec: JobSpec, sources: Mapping[str, str] | None) -> tuple[bool, bool] | None:
    """``(saves on SIGTERM, resumes)`` of the job's code (rules 2 to 5), or None when not sure.

    Raises:
        ValueError, SyntaxError: the command or a file does not parse.
    """
    texts = command_texts(spec, sources)
    if texts is None:
        return None
    if beyond_text(texts, sources or {}, PLAIN_LIBRARIES):
        return None
    saves = any(SAVES_ON_SIGTERM.search(text) for text in texts)
    resumes = any(RESUMES.search(text) for text in texts)
    return saves, resumes


def warning(spec: JobSpec, sources: Mapping[str, str] | None) -> str | None:
    """The sentence saying what the job's code lacks for checkpoint resume (rule 6), or None
    when it has both or the heuristic is not sure.

    Args:
        spec: the job.
        sources: the algorithm folder's Python files (path below it → text), or None when they
            could not be read (then only ``python -c CODE`` without an algorithm is judged).
    """
    if not applies(spec):
        return None
    try:
        found = readiness(spec, sources)
    except (ValueError, SyntaxError, RecursionError):
        return None
    if found is None or all(found):
        return None
    saves, resumes = found
    resume = spec.checkpoint_resume
    asks = f"this job asks for {resume.max_resumes} resume{'s' if resume.max_resumes != 1 else ''}"
    if not saves and not resumes:
        lacks = (
            "but its code neither handles SIGTERM nor reads MA_RESUME: on a fault it is killed "
            "without saving and each resume starts from the beginning"
        )
    elif not saves:
        lacks = (
            "but its code does not handle SIGTERM: on a fault it is killed at once instead of "
            f"saving in its {resume.grace_period:g} s grace period, and resumes from its last "
            "periodic checkpoint at best"
        )
    else:
        lacks = (
            "but its code neither reads MA_RESUME nor loads a checkpoint: each resume starts "
            "from the beginning"
        )
    return (
        f"warning: {asks} {lacks}. Save a checkpoint in a SIGTERM handler "
        "(signal.signal(signal.SIGTERM, ...)) and load it when MA_RESUME is 1 "
        "(docs/variables.md)"
    )
