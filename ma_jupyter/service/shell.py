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
3. Then the client sends ``["stdin", text]`` and ``["set_size", rows, cols]`` (whole numbers
   0 to 1000); the service sends ``["stdout", text]`` (the terminal's bytes, UTF-8 decoded)
   and, last, ``["exit", code]``.
4. A client message that is not one of those (not JSON, nested too deep, another shape, wrong
   types, numbers out of range, over :data:`MAX_MESSAGE` bytes) is dropped and answered with
   ``["refused", why]``; the terminal goes on.
5. Either side closing ends the shell (the agent hangs it up); no shell outlives its terminal.
   So does an agent that sends a frame over ``agent_wire.MAX_FRAME`` bytes, or that takes
   keystrokes for none of :data:`WRITE_TIMEOUT` seconds (a stopped agent), and a client that
   takes none of the terminal's output for :data:`WRITE_TIMEOUT` seconds: each is told why
   with ``["error", ...]`` where it still listens.  No wait on the agent holds a thread.
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
from ..backends.base import SHELL_MAX_FRAME as MAX_FRAME
from ..backends.base import SHELL_RESIZE as RESIZE

#: the largest client message accepted (one paste into the terminal)
MAX_MESSAGE = 1 << 20
#: the largest terminal size a client may set (rows or columns), as the agent's own cap
MAX_SIZE = 1000
#: seconds a write to the agent, or to the client, may wait before the terminal is ended
WRITE_TIMEOUT = 60.0
_HEADER = struct.Struct(SHELL_FRAME_HEADER)


def parse_message(text: str | bytes) -> tuple[int, bytes]:
    """A client message (rule 3) as the agent frame it becomes: (channel, payload).

    Raises:
        ValueError: not a message of rule 3 (rule 4); the message says what is wrong.
    """
    if len(text) > MAX_MESSAGE:
        raise ValueError(f"a terminal message of {len(text)} bytes, over the {MAX_MESSAGE} one may have")
    try:
        message = json.loads(text)
    except RecursionError:
        raise ValueError("a terminal message nested too deep: send a JSON list") from None
    except ValueError:
        raise ValueError("a terminal message that is not JSON: send a JSON list") from None
    if not (isinstance(message, list) and message and isinstance(message[0], str)):
        raise ValueError('a terminal message is a JSON list: ["stdin", text] or ["set_size", rows, cols]')
    kind, args = message[0], message[1:]
    if kind == "stdin":
        if len(args) != 1 or not isinstance(args[0], str):
            raise ValueError('stdin takes one string: ["stdin", text]')
        return DATA, args[0].encode(errors="replace")
    if kind == "set_size":
        whole = [a for a in args if isinstance(a, int) and not isinstance(a, bool) and 0 <= a <= MAX_SIZE]
        if len(args) != 2 or len(whole) != 2:
            raise ValueError(
                f'set_size takes two whole numbers from 0 to {MAX_SIZE}: ["set_size", rows, cols]'
            )
        return RESIZE, json.dumps({"rows": args[0], "cols": args[1]}).encode()
    raise ValueError(f"an unknown terminal message {kind[:40]!r}: send stdin or set_size")


def parse_argv(text: str | None) -> list[str] | None:
    """The ``command`` query value (a JSON list of strings), or None.

    Raises:
        ValueError: not a non-empty JSON list of strings without NUL bytes.
    """
    if not text:
        return None
    try:
        argv = json.loads(text)
    except (ValueError, RecursionError):
        argv = None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise ValueError('command must be a JSON list of strings, e.g. ["ls", "/workspace"]')
    return argv


async def bridge(websocket: WebSocket, conn: socket.socket) -> None:
    """Carry one accepted WebSocket to and from the agent connection ``conn`` (rules 3 to 5)."""
    conn.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=conn)

    async def send(message: list) -> None:
        try:
            await asyncio.wait_for(websocket.send_text(json.dumps(message)), WRITE_TIMEOUT)
        except TimeoutError:
            raise ConnectionError("the client took none of the terminal's output") from None

    async def from_agent() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            channel, size = _HEADER.unpack(await reader.readexactly(_HEADER.size))
            if size > MAX_FRAME:
                await send(["error", _ended(f"the node's terminal sent a frame of {size} bytes")])
                return
            payload = await reader.readexactly(size)
            if channel == DATA:
                text = decoder.decode(payload)
                if text:
                    await send(["stdout", text])
            elif channel == EXIT:
                rest = decoder.decode(b"", final=True)
                if rest:
                    await send(["stdout", rest])
                await send(["exit", int(payload) if payload.isdigit() and len(payload) < 4 else 255])
                return

    async def to_agent() -> None:
        while True:
            received = await websocket.receive()
            if received["type"] == "websocket.disconnect":
                return
            message = received.get("text")
            if message is None:  # a binary message: its bytes, parsed alike
                message = received.get("bytes") or b""
            try:
                channel, payload = parse_message(message)
            except ValueError as exc:
                await send(["refused", str(exc)])
                continue
            writer.write(_HEADER.pack(channel, len(payload)) + payload)
            try:
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
            except TimeoutError:
                await send(
                    ["error", _ended("the node's terminal takes no keystrokes (is its agent stopped?)")]
                )
                return

    tasks = [asyncio.ensure_future(from_agent()), asyncio.ensure_future(to_agent())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()  # the agent hangs the shell up (its rule 3)
        try:
            await asyncio.wait_for(websocket.close(), WRITE_TIMEOUT)
        except (TimeoutError, RuntimeError, WebSocketDisconnect, OSError):
            pass  # the client is gone already


def _ended(why: str) -> dict:
    """Rule 5's error body: the terminal ended, and why."""
    return {"error": "error", "message": f"{why}: the debug terminal ended", "status": 502, "field": None}


async def refuse(websocket: WebSocket, body: dict) -> None:
    """Rule 2's refusal: the error body, then the close."""
    await websocket.send_text(json.dumps(["error", body]))
    await websocket.close()


async def serve(
    websocket: WebSocket, opener: Callable[[], Awaitable[tuple[socket.socket, Callable[[], None]]]]
) -> None:
    """Accept ``websocket``; ``opener`` checks the request and connects to the agent (rule 2),
    raising the typed error the client gets, and returns the connection with what to call once
    the terminal ended (its count released)."""
    from ..errors import MaJupyterError

    await websocket.accept()
    try:
        conn, done = await opener()
    except MaJupyterError as exc:
        await refuse(websocket, {**exc.to_body(), "status": exc.status})
        return
    try:
        await bridge(websocket, conn)
    finally:
        done()
