"""The client's end of a node's debug terminal (the service's ``/jobs/{id}/shell`` WebSocket).

:class:`ShellSession` speaks ``service/shell.py``'s protocol: :meth:`ShellSession.send` types,
:meth:`ShellSession.resize` sets the terminal's size, :meth:`ShellSession.receive` gives the
terminal's output until the shell's exit status.  What the service refuses of what was sent
(``["refused", why]``) is kept in :attr:`ShellSession.refusals` and said on stderr by
:func:`interact`; a message from the service of no known shape ends the session with a
:class:`~ma_jupyter.errors.BackendUnavailable` saying so, never a traceback.  :func:`run_command` runs one program on a
node's terminal and returns what it printed; :func:`interact` connects the calling terminal to a
shell (``ma-jupyter shell``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from ..errors import BackendUnavailable, InvalidSpec, error_from_body

#: the largest terminal size (rows or columns) the service takes
MAX_SIZE = 1000
#: the largest message taken from the service (a frame of the node's terminal is at most 1 MiB,
#: which JSON escaping may make six times as long)
MAX_RECEIVED = 8 << 20

# websockets costs ~90 ms to import: only a terminal being opened pays it
TYPE_CHECKING = False  # typing's costs an import too; type checkers read this as true
if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection


def _closed() -> type[Exception]:
    from websockets.exceptions import ConnectionClosed

    return ConnectionClosed


class ShellSession:
    """One open debug terminal; close it (or use it as a context manager) to end the shell."""

    def __init__(self, connection: ClientConnection):
        # entered as its context manager: this session is the one that closes it
        self._ws = connection.__enter__()
        self._lock = threading.Lock()
        #: the shell's exit status once :meth:`receive` returned its end
        self.exit_code: int | None = None
        #: why the service dropped messages this session sent (its ``["refused", why]``)
        self.refusals: list[str] = []

    def send(self, text: str) -> None:
        """Type ``text`` into the terminal.

        Raises:
            InvalidSpec: ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise InvalidSpec(f"a terminal takes text, not {type(text).__name__}")
        with self._lock:
            self._ws.send(json.dumps(["stdin", text]))

    def resize(self, rows: int, cols: int) -> None:
        """Give the terminal a new size (the shell gets SIGWINCH); 0: unknown.

        Raises:
            InvalidSpec: ``rows`` or ``cols`` is not a whole number from 0 to :data:`MAX_SIZE`.
        """
        for value in (rows, cols):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
                raise InvalidSpec(
                    f"a terminal's rows and cols are whole numbers from 0 to {MAX_SIZE}, not {value!r}"
                )
        with self._lock:
            self._ws.send(json.dumps(["set_size", rows, cols]))

    def receive(self, timeout: float | None = None) -> str | None:
        """The terminal's next output; None once the shell has ended (:attr:`exit_code` set);
        ``""`` when the service refused a message this session sent (in :attr:`refusals`).

        Raises:
            TimeoutError: nothing came within ``timeout`` seconds.
            MaJupyterError: the service refused the terminal (the typed error it sent).
        """
        while True:
            try:
                message = self._ws.recv(timeout=timeout)
            except _closed():
                if self.exit_code is None:
                    self.exit_code = 255
                return None
            kind, arg = _parse(message)
            if kind == "stdout":
                return arg
            if kind == "exit":
                self.exit_code = arg
                return None
            if kind == "error":
                raise error_from_body(arg.get("status", 500), arg)
            if kind == "refused":
                self.refusals.append(arg)
                return ""

    def close(self) -> None:
        """End the terminal (the shell is hung up)."""
        self._ws.close()

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _parse(message: str | bytes) -> tuple[str, object]:
    """One message from the service (its protocol's rules 2 to 4): (kind, its argument), the
    argument checked: ``stdout`` and ``refused`` text, ``exit`` a whole number, ``error`` the
    error body with a whole ``status``; another kind is ``("", None)`` (ignored).

    Raises:
        BackendUnavailable: a message of no such shape.
    """
    try:
        parsed = json.loads(message)
    except (ValueError, TypeError, RecursionError):
        parsed = None
    kind, arg = parsed if isinstance(parsed, list) and len(parsed) == 2 else (None, None)
    if kind in ("stdout", "refused") and isinstance(arg, str):
        return kind, arg
    if kind == "exit" and isinstance(arg, int) and not isinstance(arg, bool):
        return kind, arg
    if kind == "error" and isinstance(arg, dict):
        status = arg.get("status")
        whole = isinstance(status, int) and not isinstance(status, bool) and 400 <= status < 600
        return kind, {**arg, "status": status if whole else 500}
    if isinstance(kind, str) and kind not in ("stdout", "refused", "exit", "error"):
        return "", None
    raise BackendUnavailable(
        f"the job service sent a terminal message this client cannot read ({str(message)[:80]!r}): "
        "the debug terminal ended; check that client and service are the same version"
    )


def open_session(url: str, headers: dict[str, str], timeout: float) -> ShellSession:
    """Open the WebSocket at ``url`` (``http://...`` or ``ws://...``).

    Raises:
        BackendUnavailable: the service does not answer.
    """
    from websockets.sync.client import connect

    if url.startswith("http"):
        url = "ws" + url[len("http") :]
    try:
        return ShellSession(
            connect(url, additional_headers=headers, open_timeout=timeout, max_size=MAX_RECEIVED)
        )
    except (OSError, TimeoutError, _closed()) as exc:
        raise BackendUnavailable(f"the job service does not open the debug terminal ({exc})") from exc


def run_command(session: ShellSession, timeout: float | None = None) -> tuple[str, int]:
    """Everything a command on ``session`` printed (line ends as ``\\n``) and its exit status."""
    parts = []
    with session:
        while (chunk := session.receive(timeout=timeout)) is not None:
            parts.append(chunk)
    return "".join(parts).replace("\r\n", "\n"), session.exit_code if session.exit_code is not None else 255


def interact(session: ShellSession) -> int:
    """Connect this process's terminal to ``session`` until the shell ends; its exit status.

    Rules: stdin goes to raw mode while attached (restored after, also on errors); SIGWINCH
    sends the new size; stdin's end (a pipe) ends the shell.
    """
    import termios
    import tty

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    is_tty = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if is_tty else None

    def resized(_signum, _frame) -> None:
        size = os.get_terminal_size(stdin)
        session.resize(size.lines, size.columns)

    def typing() -> None:
        try:
            while data := os.read(stdin, 65536):
                session.send(data.decode(errors="replace"))
        except (OSError, _closed()):
            return
        try:
            session.send("\x04")  # stdin ended: end of input for the shell, as a terminal would
        except _closed():
            pass

    previous = None
    try:
        if is_tty:
            tty.setraw(stdin, termios.TCSADRAIN)  # TCSAFLUSH would drop what was typed already
            previous = signal.signal(signal.SIGWINCH, resized)
        threading.Thread(target=typing, daemon=True).start()
        said = 0
        while (chunk := session.receive()) is not None:
            os.write(stdout, chunk.encode())
            for why in session.refusals[said:]:  # what was dropped, and why, once each
                os.write(sys.stderr.fileno(), f"\r\n[ma-jupyter shell] refused: {why}\r\n".encode())
            said = len(session.refusals)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
        session.close()
    return session.exit_code if session.exit_code is not None else 255
