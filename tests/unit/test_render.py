"""The front ends' texts: a job's status line and the dry-run plans."""

from __future__ import annotations

from ma_jupyter.frontends import render
from ma_jupyter.models import JobStatus


def test_status_line_covers_every_state():
    from datetime import UTC, datetime, timedelta

    from ma_jupyter.models import Job, JobSpec

    spec = JobSpec(name="s", command="python x.py", duration=600)
    now = datetime.now(UTC)
    queued = Job(id="j", spec=spec, status=JobStatus.queued, queue_position=1)
    assert "position 2 in the queue" in render.status_line(queued, now)
    assert "queue:     position 2, start time unknown" in render.format_job(queued)
    known = queued.model_copy(update={"estimated_start": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)})
    assert "queue:     position 2, estimated start 2026-01-02 03:04:05 UTC" in render.format_job(known)
    running = Job(id="j", spec=spec, status=JobStatus.running, started_at=now - timedelta(seconds=65))
    line = render.status_line(running, now)
    assert "0:01:05 elapsed" in line and "0:08:55 left" in line
    done = Job(
        id="j",
        spec=spec,
        status=JobStatus.error,
        started_at=now - timedelta(seconds=10),
        finished_at=now,
        exit_code=3,
        reason="worker-0 exited with 3",
    )
    line = render.status_line(done)
    assert "error after 0:00:10" in line and "exit code 3" in line and "worker-0 exited" in line


def test_reasons_in_lists_and_status_lines_say_only_what_the_status_does_not():
    from ma_jupyter.models import Job, JobSpec, NodeRun

    spec = JobSpec(name="s", command="python x.py")
    plain = Job(id="j", spec=spec, status=JobStatus.succeeded, reason="every node exited with code 0")
    assert render.reason_summary(plain) == ""
    assert "every node exited" not in render.status_line(plain)
    assert "every node exited with code 0" in render.format_job(plain)  # the job's own page keeps it
    # a failure's log tail is shown by the follower: the status line stays one line without it
    failed = Job(
        id="j",
        spec=spec,
        status=JobStatus.error,
        reason="node worker-0 exited with code 1\nlast log lines:\nTraceback (most recent call last):\nValueError: x",
    )
    assert render.reason_summary(failed) == "node worker-0 exited with code 1"
    assert "\n" not in render.status_line(failed) and "Traceback" not in render.status_line(failed)
    # a parameter server stopped once the workers succeeded: its 143 is the stop's, said so
    ps = Job(
        id="j",
        spec=JobSpec(name="s", command="python x.py", mode="tensorflow", ps=1),
        status=JobStatus.succeeded,
        exit_code=0,
        nodes=[
            NodeRun(name="worker-0", state="exited", exit_code=0),
            NodeRun(name="ps-0", role="ps", primary=False, state="exited", exit_code=143),
        ],
    )
    text = render.format_job(ps)
    assert "node:      ps-0 (exited, exit 143, stopped when the primary nodes had succeeded)" in text
    assert "worker-0 (exited, exit 0)" in text


def test_event_times_carry_their_date():
    from datetime import UTC, datetime

    from ma_jupyter.models import Event

    event = Event(
        seq=1,
        job_id="j",
        time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        status=JobStatus.running,
        reason="r",
    )
    assert f"<td>{render.clock(event.time)}</td>" in render.events_html([event])
    assert render.clock(event.time).startswith("2026-01-0")


def test_top_says_a_finished_job_will_have_no_samples():
    from ma_jupyter.frontends import usage
    from ma_jupyter.models import ResourceUsage

    empty = ResourceUsage(job_id="j", interval=2.0)
    assert "no samples of j yet" in usage.note(empty)
    ended = usage.note(empty, ended=True)
    assert "yet" not in ended and "it ended before the first sample was taken" in ended


def _plan():
    from ma_jupyter.models import Mount, NodeLaunch, Plan

    node = NodeLaunch(
        name="worker-0",
        role="worker",
        index=0,
        hostname="worker-0",
        argv=["python", "train.py", "--lr", "${LR}"],
        env={"LR": "0.1"},
        files={"/etc/mpi/hostfile": "worker-0 slots=2\nworker-1 slots=2\n"},
        mounts=[
            Mount(source="/data/d", target="/workspace/dataset/private/d", read_only=True, kind="dataset")
        ],
    )
    return Plan(spec="cpu.small", nodes=[node], can_start_now=True, notes=["ports are 0 in a dry run"])


def test_the_cli_plan_shows_every_file_line():
    text = render.plan_text(_plan())
    assert text.startswith("spec cpu.small: can start now\nnote: ports are 0 in a dry run\n")
    assert "node worker-0 (worker 0, hostname worker-0)" in text
    assert "  argv:    python train.py --lr '${LR}'" in text
    assert "      | worker-0 slots=2\n      | worker-1 slots=2" in text
    assert "    /workspace/dataset/private/d <- /data/d (ro)" in text


def test_the_notebook_plan_shows_the_first_file_line():
    text = render.plan_summary(_plan())
    assert text.startswith("plan on spec cpu.small: 1 node(s), can start now (dry run: nothing submitted)")
    assert "[worker-0] role=worker index=0 hostname=worker-0" in text
    assert "    /etc/mpi/hostfile: worker-0 slots=2 …" in text
    assert "    /workspace/dataset/private/d <- /data/d (ro)" in text


def test_tables_as_text_and_html():
    bundle = render.table_bundle(["id", "status"], [["a-1", "running"], ["b", None]])
    assert bundle["text/plain"] == "id   status\na-1  running\nb"
    assert "<th>status</th>" in bundle["text/html"] and "<td>a-1</td>" in bundle["text/html"]


def test_cli_texts_and_badges():
    assert render.one_line("a\n  b\tc") == "a b c"
    assert render.clock(None) == "-"
    assert render.text_table([["id", "status"], ["a-1", "running"]]) == "id   status\na-1  running\n"
    badge = render.status_badge(JobStatus.error)
    assert "ma-status-error" in badge and ">error</span>" in badge


def test_visible_line_applies_carriage_returns_and_backspaces_as_a_terminal_does():
    visible = render.visible_line
    assert visible("plain line") == "plain line"
    # each \r redraw overwrites from the line start; the last state is what shows
    assert visible("\r 10%|#   |\r 50%|##  |\r100%|####| done") == "100%|####| done"
    # a shorter redraw leaves the tail of a longer one (as on a terminal); a trailing \r is nothing
    assert visible("abcdef\rXY") == "XYcdef"
    assert visible("text\r") == "text"
    # Keras: backspaces over the previous bar, then \r and the new one
    keras = "1/2 [==>...] loss: 0.9" + "\b" * 22 + "\r2/2 [=====] loss: 0.10"
    assert visible(keras) == "2/2 [=====] loss: 0.10"
    assert visible("abc\b\bX") == "aXc"
    assert visible("\b\bab") == "ab"  # never before the line start
    # a bar far longer than a cell keeps: what remains is its final state
    bar = "".join(f"\rstep {i:5d}/20000 |{'#' * (i // 1000):20s}|" for i in range(1, 20001))
    assert len(bar) > 8000 and visible(bar) == "step 20000/20000 |####################|"


def test_log_lines_split_at_newlines_only():
    text = "first\n\r 1%\r100% final\nlast without newline"
    assert render.log_lines(text) == ["first", "100% final", "last without newline"]
    assert render.log_lines("a\r\nb\n") == ["a", "b"]
    assert render.log_lines("") == []


def test_terminal_text_shows_every_control_character_and_keeps_colours_only_on_request():
    hostile = (
        "clip \x1b]52;c;ZWNobyBwd25lZA==\x07 title \x1b]0;root\x1b\\ \x1b[2J\x1b[1;1H\x1b[3A"
        " c1 \x9b2J \x9d0;t\x9c \x1b[31mred\x1b[0m\ttab \r\b\x00\x7f"
    )
    shown = render.terminal_text(hostile)
    assert shown == (
        "clip ^[]52;c;ZWNobyBwd25lZA==^G title ^[]0;root^[\\ ^[[2J^[[1;1H^[[3A"
        " c1 \\x9b2J \\x9d0;t\\x9c red\ttab ^M^H^@^?"
    )
    # nothing a terminal would act on is left, but tab
    assert not [c for c in shown if (ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) <= 0x9F]
    kept = render.terminal_text(hostile, keep_sgr=True)
    assert "\x1b[31mred\x1b[0m" in kept and kept.count("\x1b") == 2  # colours only
    assert render.terminal_text(shown) == shown  # idempotent
    assert render.terminal_text("line\n\ttabbed") == "line\n\ttabbed"
    # an SGR cut by a write, or an escape that only looks like one, is shown, never passed
    assert render.terminal_text("\x1b[31", keep_sgr=True) == "^[[31"
    assert render.terminal_text("\x1b[31;1H", keep_sgr=True) == "^[[31;1H"


def test_a_terminal_safe_stream_neutralises_every_write():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    plain, tty = io.StringIO(), Tty()
    for target in (plain, tty):
        stream = render.TerminalSafe(target)
        print("\x1b]52;c;eA==\x07 \x1b[32mok\x1b[0m", file=stream)
        stream.control("\x1b[H")  # the CLI's own redraw passes as it is
    assert plain.getvalue() == "^[]52;c;eA==^G ok\n\x1b[H"
    assert tty.getvalue() == "^[]52;c;eA==^G \x1b[32mok\x1b[0m\n\x1b[H"


def test_a_line_redrawn_in_place_fits_one_terminal_row():
    from ma_jupyter.frontends.render import fit_width

    assert fit_width("short", 80) == "short"
    assert fit_width("x" * 100, 80) == "x" * 79  # one column left for the cursor
    assert fit_width("界" * 50, 21) == "界" * 10  # a wide character takes two columns
    # a job's control characters are shown, never passed (and counted as shown)
    assert fit_width("a\x1b]0;title\x07b", 80) == "a^[]0;title^Gb"
    assert fit_width("\x1b[31mred\x1b[0m", 80) == "red"
