"""The debug terminal's WebSocket: ``/api/v1/jobs/{id}/shell`` bridged to a node's shell agent.

A job submitted with ``--debug-terminal`` runs a shell agent inside each node's sandbox
(``nodehost.shell_agent``); :meth:`Backend.open_shell` connects to it.  This module carries
that connection over a WebSocket, in the message format of JupyterLab's terminals (terminado),
so that a browser terminal, the CLI and the notebook magic speak one protocol.

Protocol (rules, in order):

1. The client opens ``/api/v1/jobs/{id}/shell?node=N&rows=R&cols=C`` (0: the size is not
   known, and the terminal gets 24 rows or 80 columns) with its token in the
   ``Authorization`` header, and optionally ``command=<JSON argv>`` to run one program on the
   terminal instead of an interactive shell.
2. The service accepts the WebSocket, then checks the caller (the job's owner or an admin:
   access.Op.shell), the job (running, with ``debug_terminal``) and the node; on a refusal it
   sends ``["error", {"error": ..., "message": ..., "status": ...}]`` (the REST error body) and
   closes.  Otherwise it records who opened the terminal as an event of the job.
3. Then the client sends ``["stdin", text]`` and ``["set_size", rows, cols]``; the service sends
   ``["stdout", text]`` (the terminal's bytes, UTF-8 decoded) and, last, ``["exit", code]``.
4. Either side closing ends the shell (the agent hangs it up); no shell outlives its terminal.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import socket
import struct
from collections.abc import Awaitable, Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..backends.base import SHELL_DATA as DATA
from ..backends.base import SHELL_EXIT as EXIT
from ..backends.base import SHELL_FRAME_HEADER
from ..backends.base import SHELL_RESIZE as RESIZE

#: the largest client message accepted (one paste into the terminal)
MAX_MESSAGE = 1 << 20
_HEADER = struct.Struct(SHELL_FRAME_HEADER)


def parse_argv(text: str | None) -> list[str] | None:
    """The ``command`` query value (a JSON list of strings), or None.

    Raises:
        ValueError: not a non-empty JSON list of strings without NUL bytes.
    """
    if not text:
        return None
    argv = json.loads(text)
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise ValueError('command must be a JSON list of strings, e.g. ["ls", "/workspace"]')
    return argv


async def bridge(websocket: WebSocket, conn: socket.socket) -> None:
    """Carry one accepted WebSocket to and from the agent connection ``conn`` (rules 3 and 4)."""
    conn.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=conn)

    async def from_agent() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            channel, size = _HEADER.unpack(await reader.readexactly(_HEADER.size))
            payload = await reader.readexactly(size)
            if channel == DATA:
                text = decoder.decode(payload)
                if text:
                    await websocket.send_text(json.dumps(["stdout", text]))
            elif channel == EXIT:
                rest = decoder.decode(b"", final=True)
                if rest:
                    await websocket.send_text(json.dumps(["stdout", rest]))
                await websocket.send_text(json.dumps(["exit", int(payload)]))
                return

    async def to_agent() -> None:
        while True:
            message = await websocket.receive_text()
            if len(message) > MAX_MESSAGE:
                continue
            try:
                kind, *args = json.loads(message)
                if kind == "stdin":
                    data = str(args[0]).encode()
                    writer.write(_HEADER.pack(DATA, len(data)) + data)
                elif kind == "set_size":
                    size = json.dumps({"rows": int(args[0]), "cols": int(args[1])}).encode()
                    writer.write(_HEADER.pack(RESIZE, len(size)) + size)
                else:
                    continue
            except (ValueError, TypeError, IndexError):
                continue  # one bad message is dropped, the terminal goes on
            await writer.drain()

    tasks = [asyncio.ensure_future(from_agent()), asyncio.ensure_future(to_agent())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()  # the agent hangs the shell up (its rule 3)
        try:
            await websocket.close()
        except (RuntimeError, WebSocketDisconnect):
            pass  # the client is gone already


async def refuse(websocket: WebSocket, body: dict) -> None:
    """Rule 2's refusal: the error body, then the close."""
    await websocket.send_text(json.dumps(["error", body]))
    await websocket.close()


async def serve(websocket: WebSocket, opener: Callable[[], Awaitable[socket.socket]]) -> None:
    """Accept ``websocket``; ``opener`` checks the request and connects to the agent (rule 2),
    raising the typed error the client gets."""
    from ..errors import MaJupyterError

    await websocket.accept()
    try:
        conn = await opener()
    except MaJupyterError as exc:
        await refuse(websocket, {**exc.to_body(), "status": exc.status})
        return
    await bridge(websocket, conn)
