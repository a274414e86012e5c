"""Per-rank log splitter: runs one rank's command and keeps its output twice.

``python -m ma_jupyter.nodeside.rank_log [--rank-var=NAME] [--rank=N] [--no-prefix] CMD ...``

A distributed launcher (torchrun, mpirun, the Ascend launcher) starts this once per rank in
place of the rank's own command.  It runs CMD with stdout and stderr merged into one pipe and
copies every byte to ``$MA_RANK_LOG_DIR/rank-<r>.log`` unchanged and to its own stdout (the
node's combined log) as whole lines with a ``[rank r] `` prefix at each line start, so the
node log stays readable when several ranks print at once (an unfinished line waits up to
:data:`HOLD` seconds for its end, a progress bar redrawn with ``\r`` for its newline: see
:class:`Copier`; the rank file has it as it is written, for the followers that show it live).  Signals (TERM, INT, HUP) are forwarded to CMD and
CMD's exit status becomes this program's exit status (128 + signal number when CMD was killed
by a signal), so launchers see a failing rank exactly as if they had started it themselves.
The first rank of a node that fails by itself (not stopped by a forwarded signal) records
``{"rank", "exit_code"}`` in ``$MA_RANK_LOG_DIR/failure.json``, which the node runner hands to
the service so the job's error names the rank.

The rank is ``--rank``, else the first variable set among ``--rank-var`` and the ranks that
launchers export (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``RANK_ID``, ``RANK``).  Without
``MA_RANK_LOG_DIR`` (or without a rank) CMD simply replaces this process.

A leading ``python``/``python3`` in CMD is the interpreter running this program, because the
node's image interpreter is the one the launcher used to start it.

Every rank of a distributed job waits for this program before its own command starts, so it
imports only the few standard modules it needs before CMD starts (no ``subprocess``, ``json`` or
``re``, no :mod:`ma_jupyter.jobdir`).  The names of the files it writes are spelled here and
re-exported by :mod:`ma_jupyter.jobdir`, which places the folder.  CMD gets the launcher's
signal dispositions and descriptors, as if the launcher had started it (MPICH's ``PMI_FD``
must reach the rank); this program's own descriptors are close-on-exec.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

from .argv import is_python

#: variable naming the folder of a node's per-rank logs inside the node
RANK_LOG_ENV = "MA_RANK_LOG_DIR"
#: a launcher's report of the first failed rank (``{"rank", "exit_code"}``)
FAILURE_REPORT = "failure.json"
#: node 0's launcher's finding that no rank of a multi-node job joined a process group
#: (``{"nodes"}``: see :mod:`ma_jupyter.nodeside.torch_run`, rule 5)
NOT_DISTRIBUTED_REPORT = "not-distributed.json"
_RANK_PREFIX = "rank-"
_LOG_SUFFIX = ".log"


def rank_log_name(rank: int) -> str:
    """The file name of one rank's log: ``rank-<r>.log``."""
    return f"{_RANK_PREFIX}{rank}{_LOG_SUFFIX}"


def rank_of(file_name: str) -> int | None:
    """The rank of a ``rank-<r>.log`` file name; None for any other name."""
    if not (file_name.startswith(_RANK_PREFIX) and file_name.endswith(_LOG_SUFFIX)):
        return None
    try:
        return int(file_name[len(_RANK_PREFIX) : -len(_LOG_SUFFIX)])
    except ValueError:
        return None


#: rank logs and failure reports: the job's account and its group, never other accounts
LOG_MODE = 0o640
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK_ID", "RANK")
USAGE = "usage: python -m ma_jupyter.nodeside.rank_log [--rank-var=NAME] [--rank=N] [--no-prefix] CMD ..."


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split the options (which come first, each one token) from the command."""
    options: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        if argv[i] == "--":
            i += 1
            break
        key, _, value = argv[i][2:].partition("=")
        options[key] = value
        i += 1
    return options, argv[i:]


def find_rank(options: dict[str, str], env: dict[str, str]) -> int | None:
    """The rank this process runs, from ``--rank``, ``--rank-var`` or the launchers' variables."""
    if options.get("rank"):
        return int(options["rank"])
    names = ([options["rank-var"]] if options.get("rank-var") else []) + list(RANK_VARIABLES)
    for name in names:
        value = env.get(name, "")
        if value.strip().isdigit():
            return int(value)
    return None


def open_rank_log(folder: str, rank: int):
    """A rank's log, opened for appending; created without read access for other accounts."""
    fd = os.open(os.path.join(folder, rank_log_name(rank)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_MODE)
    return os.fdopen(fd, "ab")


def report_failure(folder: str, rank: int, code: int) -> None:
    """Record the node's first failed rank in ``<folder>/failure.json`` (the first report wins)."""
    import json  # only a failing rank needs it (see the module docstring)

    try:
        fd = os.open(os.path.join(folder, FAILURE_REPORT), os.O_WRONLY | os.O_CREAT | os.O_EXCL, LOG_MODE)
    except OSError:
        return  # another rank failed first, or the folder is gone
    with os.fdopen(fd, "w") as fh:
        json.dump({"rank": rank, "exit_code": code}, fh)


def resolve(command: list[str]) -> list[str]:
    """CMD with a leading python replaced by this interpreter."""
    if is_python(command):
        return [sys.executable, *command[1:]]
    return list(command)


#: seconds a rank's unfinished line is held back from the node log before it goes out alone
HOLD = 0.5
#: bytes a line being redrawn (``\r``, no newline yet) may grow to before it goes out alone
REDRAW_LIMIT = 64 << 10


class Copier:
    """Copies a rank's output to its rank file (raw) and to stdout, the node log, as whole lines.

    Every rank of a node writes into the same node log, so a rank that printed half a line
    would have the next rank's line glued to it.  The rules, in order:

    1. Every byte goes to the rank file at once, unchanged.
    2. The node log gets whole lines only, each in one write: the bytes up to the last newline
       seen, with ``prefix`` at the start of each line and after each carriage return that does
       not end a line (a progress bar redrawn with ``\\r`` keeps its rank label once the
       reader applies the ``\\r``).
    3. An unfinished line is held back until its newline comes, until ``hold`` seconds after
       its first byte (a prompt), or until the rank's output ends; then it goes out as a line
       of its own, ended by a newline the rank did not write (the rank file keeps the exact
       bytes).
    4. An unfinished line being redrawn with ``\r`` (a progress bar: tqdm, Keras) is not cut
       into a line per state at ``hold``: it waits for its newline (or the rank's end, or
       :data:`REDRAW_LIMIT` bytes), so the node log keeps it as one line, whose last state a
       reader shows.  Its states meanwhile are in the rank file as they are written, where the
       followers show them live (:class:`ma_jupyter.client.logs.JobFollower`, rule 6).

    Args:
        source: the read end of the pipe the rank writes into.
        rank_file: the open (binary) rank log.
        prefix: put before every line in stdout (empty: none).
        lock: shared by the copiers of one process that write to the same ``out``.
        out: the node log's file descriptor (default stdout).
        hold: seconds an unfinished line waits for its end (rule 3).
    """

    def __init__(
        self,
        source: int,
        rank_file,
        prefix: bytes,
        lock: threading.Lock | None = None,
        *,
        out: int = 1,
        hold: float = HOLD,
    ):
        self.source = source
        self.rank_file = rank_file
        self.prefix = prefix
        self.out = out
        self.hold = hold
        self.pending = b""
        self.pending_since = 0.0
        self.lock = lock or threading.Lock()  # the reading thread and finish() both write
        self.closed = False

    def format(self, text: bytes) -> bytes:
        """Whole lines (``text`` ends with a newline) with the prefix put in (rule 2)."""
        if not self.prefix:
            return text
        if b"\r" in text:  # a prefix after each \r that does not end a line
            pieces = text.split(b"\r")
            text = pieces[0] + b"".join(
                b"\r" + (piece if piece.startswith(b"\n") else self.prefix + piece) for piece in pieces[1:]
            )
        # text ends with a newline: a prefix after every newline but that last one
        return self.prefix + text[:-1].replace(b"\n", b"\n" + self.prefix) + b"\n"

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.out, view) :]
        except OSError:
            pass  # the node log went away; the rank file still gets everything

    def take(self, data: bytes) -> None:
        """Account for bytes the rank wrote: whole lines out now, the rest held (rules 2 and 3)."""
        with self.lock:
            if self.closed:
                return
            if not self.pending:
                self.pending_since = time.monotonic()
            pending = self.pending + data
            cut = pending.rfind(b"\n") + 1
            if cut:
                self._write(self.format(pending[:cut]))
                pending = pending[cut:]
                self.pending_since = time.monotonic()
            if len(pending) > REDRAW_LIMIT and b"\r" in pending:
                self._write(self.format(pending + b"\n"))  # rule 4's bound
                pending = b""
            self.pending = pending

    def redrawing(self) -> bool:
        """Whether the held line is being redrawn with ``\r`` (rule 4)."""
        return b"\r" in self.pending

    def flush_partial(self) -> None:
        """Send the held unfinished line out as a line of its own (rule 3)."""
        with self.lock:
            if self.pending:
                self._write(self.format(self.pending + b"\n"))
                self.pending = b""

    def due(self) -> float | None:
        """Seconds until the held line must go out (None: nothing is held, or a line being
        redrawn that waits for its newline)."""
        if not self.pending or self.redrawing():
            return None
        return max(0.0, self.pending_since + self.hold - time.monotonic())

    def run(self) -> None:
        while True:
            wait = self.due()
            if wait is not None:  # a line is held: read only until it must go out
                try:
                    ready, _, _ = select.select([self.source], [], [], wait)
                except (OSError, ValueError):
                    break
                if not ready:
                    self.flush_partial()
                    continue
            try:
                data = os.read(self.source, 65536)
            except OSError:
                break
            if not data:
                break
            self.rank_file.write(data)
            self.rank_file.flush()
            self.take(data)
        self.flush_partial()

    def finish(self) -> None:
        """The rank ended: send what is held and write nothing more (a background process the
        rank left behind may still hold the pipe; its bytes still reach the rank file)."""
        self.flush_partial()
        with self.lock:
            self.closed = True


#: the signals passed on to CMD
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: dispositions Python's start changed (it ignores these), set back to default for CMD
RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


def spawn(command: list[str], output: int) -> int:
    """Start ``command`` with stdout and stderr on ``output``; its pid.

    ``posix_spawnp`` rather than :mod:`subprocess`, whose import alone takes longer than the
    spawn; :mod:`subprocess` only on a Python without it (before 3.8).  The child starts with no
    signal blocked and SIGPIPE and SIGXFSZ at their defaults, as ``Popen`` would start it.

    Raises:
        OSError: CMD cannot be started (not found, not executable).
    """
    if not hasattr(os, "posix_spawnp"):
        import subprocess

        def unblock() -> None:
            signal.pthread_sigmask(signal.SIG_SETMASK, ())

        popen = subprocess.Popen(command, stdout=output, stderr=output, close_fds=False, preexec_fn=unblock)
        return popen.pid
    actions = [(os.POSIX_SPAWN_DUP2, output, 1), (os.POSIX_SPAWN_DUP2, output, 2)]
    return os.posix_spawnp(
        command[0], command, os.environ, file_actions=actions, setsigmask=(), setsigdef=RESTORED
    )


def exit_status(status: int) -> int:
    """A ``waitpid`` status as the shell reports it: the exit code, or 128+N after signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str] | None = None) -> int:
    """Run CMD as one rank; returns CMD's exit status (see the module docstring).

    The order matters:

    1. the rank file opens first: a folder it cannot use fails this rank before CMD exists;
    2. the forwarded signals are blocked, CMD starts (with none blocked and the launcher's
       dispositions), the handlers are set, the signals unblocked: a signal that came meanwhile
       is delivered once, to a handler that knows CMD;
    3. the copy begins (CMD's first bytes wait in the pipe meanwhile);
    4. once CMD is reaped nothing is forwarded any more (its pid may be reused).
    """
    options, command = parse(list(sys.argv[1:] if argv is None else argv))
    if not command:
        print(USAGE, file=sys.stderr)
        return 2
    command = resolve(command)
    rank = find_rank(options, dict(os.environ))
    folder = os.environ.get(RANK_LOG_ENV, "")
    if rank is None or not folder:
        os.execvp(command[0], command)
    os.makedirs(folder, exist_ok=True)
    prefix = b"" if "no-prefix" in options else f"[rank {rank}] ".encode()
    child: list[int] = []
    stopped: list[int] = []

    def forward(signum, _frame):
        stopped.append(signum)
        if child:
            try:
                os.kill(child[0], signum)
            except ProcessLookupError:
                pass

    with open_rank_log(folder, rank) as rank_file:
        read_end, write_end = os.pipe()
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            child.append(spawn(command, write_end))
        except OSError as exc:
            print(f"[rank {rank}] cannot start {command[0]}: {exc}", file=sys.stderr)
            return 127
        finally:
            os.close(write_end)
            for sig in FORWARDED:
                signal.signal(sig, forward)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        copier = Copier(read_end, rank_file, prefix)
        thread = threading.Thread(target=copier.run, daemon=True)
        thread.start()
        _, status = os.waitpid(child[0], 0)
        child.clear()
        # A background process the rank left behind may keep the pipe open: do not wait for it.
        thread.join(timeout=2.0)
        copier.finish()
    status = exit_status(status)
    if status and not stopped:
        report_failure(folder, rank, status)
    return status


if __name__ == "__main__":
    sys.exit(main())
