"""A job's output never drives the reader's terminal: ``ma-jupyter`` shows the control
characters a job (or its submitter) put in its logs, command, reason and events instead of
passing them (OSC 52 would write the reader's clipboard, OSC 0 the window title, a clear
screen and cursor moves forge what an admin sees); SGR colours stay on a terminal only.

The CLI runs as a real process, its output read through a pipe and through a pty."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import subprocess
import sys

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# what the hostile job prints: every trick of the report, then a line in colour
HOSTILE = (
    "import sys\n"
    "w = sys.stdout.write\n"
    "w('clip \\x1b]52;c;ZWNobyBwd25lZA==\\x07 end\\n')\n"  # OSC 52: the reader's clipboard
    "w('title \\x1b]0;root@admin\\x07 end\\n')\n"  # OSC 0: the window title
    "w('\\x1b[2J\\x1b[H\\x1b[3A\\x1b[10;1Hforged: job succeeded\\n')\n"  # clear, cursor moves
    "w('c1 \\x9b2J \\x9d0;t\\x9c end\\n')\n"  # the one-byte CSI, OSC and ST (C1)
    "w('\\x1b[31mRED\\x1b[0m plain\\n')\n"  # SGR: a colour, kept on a terminal only
    "w('bell \\x07 nul \\x00 del \\x7f tab\\tend\\n')\n"
    "sys.stdout.flush()\n"
    "sys.exit(3)\n"
)
# raw bytes none of the outputs may carry (UTF-8: a C1 character is \xc2 + 0x80..0x9f)
C0_BUT_TAB_NEWLINE = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
C1 = re.compile(rb"\xc2[\x80-\x9f]")
SGR = re.compile(rb"\x1b\[[0-9;]*m")


def _cli_env(home) -> dict:
    return {
        **os.environ,
        "MA_JUPYTER_HOME": str(home),
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _through_pipe(home, *args: str) -> bytes:
    done = subprocess.run(
        [PY, "-m", "ma_jupyter.frontends.cli", *args], env=_cli_env(home), capture_output=True, timeout=120
    )
    return done.stdout + done.stderr


def _through_pty(home, *args: str) -> bytes:
    """What a terminal receives from ``ma-jupyter ARGS`` (its stdout and stderr on a pty)."""
    main, side = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "ma_jupyter.frontends.cli", *args], env=_cli_env(home), stdout=side, stderr=side
    )
    os.close(side)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([main], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the side closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
        proc.wait(timeout=60)
    return out


def _assert_inert(out: bytes, *, terminal: bool) -> None:
    """No control byte but tab and newline (a pty adds \\r before each \\n), no C1 character,
    and SGR colours only where ``terminal``."""
    if terminal:
        assert SGR.search(out), out  # the colour survived on a terminal
        out = SGR.sub(b"", out).replace(b"\r\n", b"\n")
    else:
        assert b"\x1b[31m" not in out
    found = C0_BUT_TAB_NEWLINE.search(out) or C1.search(out)
    assert found is None, (found, out)


def test_job_output_and_fields_never_drive_the_readers_terminal(ma_client, ma_home):
    # the submitter's own text carries controls too: an argument of the command
    command = f"{PY} -c {shlex.quote(HOSTILE)} '\x1b]0;cmd-title\x07' '\x9b2J'"
    handle = ma_client.submit(name="term", command=command)
    final = wait_status_of(ma_client, handle.id)
    assert final.status.value == "error"

    piped = _through_pipe(ma_home, "logs", handle.id)
    _assert_inert(piped, terminal=False)
    text = piped.decode()
    assert "clip ^[]52;c;ZWNobyBwd25lZA==^G end" in text  # shown, visibly
    assert "title ^[]0;root@admin^G end" in text
    assert "^[[2J^[[H^[[3A^[[10;1Hforged: job succeeded" in text
    assert "c1 \\x9b2J \\x9d0;t\\x9c end" in text
    assert "RED plain" in text  # the colour dropped where no terminal shows it
    assert "bell ^G nul ^@ del ^? tab\tend" in text

    on_terminal = _through_pty(ma_home, "logs", handle.id)
    _assert_inert(on_terminal, terminal=True)
    assert b"\x1b[31mRED\x1b[0m plain" in on_terminal
    assert b"^[]52;c;ZWNobyBwd25lZA==^G" in on_terminal

    # every other print of job-made text: the job, its events (the reason holds the log's
    # tail), the job list, the wait, the logs of every node, followed
    for args in (
        ["get", handle.id],
        ["events", handle.id],
        ["jobs"],
        ["wait", handle.id],
        ["logs", handle.id, "--all"],
        ["logs", handle.id, "--all", "--follow"],
        ["logs", handle.id, "--follow"],
    ):
        piped = _through_pipe(ma_home, *args)
        _assert_inert(piped, terminal=False)
        shown = _through_pty(ma_home, *args)
        assert not C1.search(shown) and not C0_BUT_TAB_NEWLINE.search(
            SGR.sub(b"", shown).replace(b"\r\n", b"\n")
        ), (
            args,
            shown,
        )
    got = _through_pipe(ma_home, "get", handle.id).decode()
    assert "^[]0;cmd-title^G" in got and "\\x9b2J" in got  # the command, shown
    events = _through_pipe(ma_home, "events", handle.id).decode()
    assert "forged: job succeeded" in events and "^[[2J" in events  # the reason's tail, shown


def wait_status_of(client, job_id):
    return client.job(job_id).wait(timeout=120, check=False)
