"""Opening files a job could have written, creating folders below a trusted one, splitting commands."""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import random
import shlex
import time

import pytest

from ma_jupyter.commands import parse_command, split_command
from ma_jupyter.errors import DiskFull, MaJupyterError, RefusedFile
from ma_jupyter.jobdir import NOT_DISTRIBUTED_REPORT
from ma_jupyter.service.guard import as_typed
from ma_jupyter.untrusted import collect_report, make_dirs, open_file, read_small


def _never_blocks(fn, *args, **kwargs):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result(timeout=10)


def test_a_regular_file_is_opened_and_anything_else_refused(tmp_path):
    (tmp_path / "logs" / "worker-0").mkdir(parents=True)
    (tmp_path / "logs" / "worker-0" / "rank-0.log").write_text("hello\n")
    fd = open_file(tmp_path, "logs/worker-0/rank-0.log")
    assert os.read(fd, 100) == b"hello\n"
    os.close(fd)
    with pytest.raises(FileNotFoundError):
        open_file(tmp_path, "logs/worker-0/missing.log")

    os.mkfifo(tmp_path / "logs" / "worker-0" / "fifo.log")
    with pytest.raises(RefusedFile, match="worker-0 left a FIFO at /job/logs/fifo.log"):
        _never_blocks(
            open_file, tmp_path, "logs/worker-0/fifo.log", owner="worker-0", shown="/job/logs/fifo.log"
        )
    secret = tmp_path / "service.json"
    secret.write_text('{"token": "secret"}')
    (tmp_path / "logs" / "worker-0" / "link.log").symlink_to(secret)
    with pytest.raises(RefusedFile, match="a symbolic link"):
        open_file(tmp_path, "logs/worker-0/link.log")
    os.link(secret, tmp_path / "logs" / "worker-0" / "hard.log")
    with pytest.raises(RefusedFile, match="a hard link"):
        open_file(tmp_path, "logs/worker-0/hard.log")
    with pytest.raises(RefusedFile, match="a folder"):
        open_file(tmp_path, "logs/worker-0")
    # a symlink in the middle of the path is not followed either
    (tmp_path / "logs" / "worker-1").symlink_to(tmp_path)
    with pytest.raises(RefusedFile, match="a symbolic link"):
        open_file(tmp_path, "logs/worker-1/service.json")
    with pytest.raises(ValueError):
        open_file(tmp_path, "../etc/passwd")


def test_whole_file_reads_are_bounded(tmp_path):
    (tmp_path / "failure.json").write_text(json.dumps({"rank": 1, "exit_code": 3}))
    assert json.loads(read_small(tmp_path, "failure.json")) == {"rank": 1, "exit_code": 3}
    (tmp_path / "huge.json").write_bytes(b" " * 100_000)
    with pytest.raises(RefusedFile, match="a file of 100000 bytes"):
        read_small(tmp_path, "huge.json", limit=65536)


def test_folders_are_created_without_following_symlinks(tmp_path):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    make_dirs(outputs / "sweep-0" / "deeper", trusted=outputs)
    assert (outputs / "sweep-0" / "deeper").is_dir()
    make_dirs(outputs / "sweep-0" / "deeper", trusted=outputs)  # idempotent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (outputs / "sweep-1").symlink_to(elsewhere)
    with pytest.raises(RefusedFile, match="a symbolic link at .*sweep-1"):
        make_dirs(outputs / "sweep-1", trusted=outputs)
    with pytest.raises(RefusedFile):
        make_dirs(outputs / "sweep-1" / "inner", trusted=outputs)
    (outputs / "sweep-2").write_text("a file")
    with pytest.raises(RefusedFile, match="a regular file"):
        make_dirs(outputs / "sweep-2", trusted=outputs)
    assert list(elsewhere.iterdir()) == []
    # the trusted folder itself may be reached through the user's own symlinks
    (tmp_path / "via").symlink_to(outputs)
    make_dirs(tmp_path / "via" / "sweep-3", trusted=tmp_path / "via")
    assert (outputs / "sweep-3").is_dir()


def test_the_runner_hands_over_only_a_regular_report(tmp_path):
    logs, node = tmp_path / "logs", tmp_path / "node"
    logs.mkdir()
    node.mkdir()
    (logs / "failure.json").write_text('{"rank": 2, "exit_code": 7}')
    collect_report(logs, node, "worker-0")
    assert json.loads((node / "failure.json").read_text()) == {"rank": 2, "exit_code": 7}
    assert not (logs / "failure.json").exists()
    os.mkfifo(logs / "failure.json")
    _never_blocks(collect_report, logs, node, "worker-0")
    refused = json.loads((node / "failure.json").read_text())["refused"]
    assert refused.startswith("worker-0 left a FIFO at /job/logs/failure.json")
    assert os.path.exists(logs / "failure.json")  # left where the job put it


def test_the_runner_hands_over_the_not_distributed_report_by_the_same_rules(tmp_path):
    logs, node = tmp_path / "logs", tmp_path / "node"
    logs.mkdir()
    node.mkdir()
    (logs / NOT_DISTRIBUTED_REPORT).write_text('{"nodes": 2}')
    collect_report(logs, node, "worker-0", NOT_DISTRIBUTED_REPORT)
    assert json.loads((node / NOT_DISTRIBUTED_REPORT).read_text()) == {"nodes": 2}
    assert not (node / "failure.json").exists()
    (logs / NOT_DISTRIBUTED_REPORT).symlink_to("/etc/passwd")
    collect_report(logs, node, "worker-0", NOT_DISTRIBUTED_REPORT)
    refused = json.loads((node / NOT_DISTRIBUTED_REPORT).read_text())["refused"]
    assert refused.startswith("worker-0 left a symbolic link at /job/logs/not-distributed.json")


def _without_line_continuations(text: str) -> str:
    """``text`` with each backslash-newline outside single quotes removed, as a POSIX shell does
    before it splits words (``shlex`` does not): the reference for ``split_command``."""
    out, i, single, double = [], 0, False, False
    while i < len(text):
        char = text[i]
        if char == "\\" and not single:
            pair = text[i : i + 2]
            out.append("" if pair == "\\\n" else pair)
            i += 2
            continue
        if char == "'" and not double:
            single = not single
        elif char == '"' and not single:
            double = not double
        out.append(char)
        i += 1
    return "".join(out)


def test_split_command_matches_shlex_on_random_input():
    """``shlex.split`` after a shell's removal of line continuations."""
    alphabet = ["a", "b", " ", "'", '"', "\\", ";", "&", "\n", "$", "|", ">", "\t", "#"]
    rng = random.Random(15)
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        try:
            expected = shlex.split(_without_line_continuations(text))
        except ValueError:
            expected = None
        try:
            got = split_command(text)[0]
        except ValueError:
            got = None
        assert got == expected, text
    assert split_command("a 2>&1 'x;y' b\\;c")[1] == [">&"]
    # a command over several lines, as the seeds print it
    assert split_command("mpirun \\\n  -np 2 \"-p \\\n1\" a\\\nb 'c\\\nd'")[0] == [
        "mpirun",
        "-np",
        "2",
        "-p 1",
        "ab",
        "c\\\nd",
    ]


def test_parsing_a_megabyte_command_is_linear():
    """shlex took about two minutes for this; the bound is generous for a loaded machine."""
    times = []
    for size in (250_000, 1_000_000):
        started = time.perf_counter()
        assert parse_command("python x.py " + "a" * size)[2] == "a" * size
        with pytest.raises(MaJupyterError, match="';'"):
            parse_command("echo '" + "b" * size + "' ; rm")
        times.append(time.perf_counter() - started)
    print(f"parse_command: 250 kB {times[0]:.3f} s, 1 MB {times[1]:.3f} s")
    assert times[1] < 20


def test_a_full_disk_is_reported_as_disk_full_naming_the_folder():
    error = as_typed(OSError(errno.ENOSPC, "No space left on device", "/data/out/file.bin"))
    assert isinstance(error, DiskFull) and error.status == 507
    assert error.message.startswith("disk full under /data/out")
    assert as_typed(RuntimeError("boom")).status == 500


def test_a_new_outputs_folder_starts_below_the_last_real_folder(tmp_path):
    from ma_jupyter.untrusted import real_ancestor

    outputs = tmp_path / "outputs"
    assert real_ancestor(outputs / "new" / "sweep-0") == tmp_path
    outputs.mkdir()
    assert real_ancestor(outputs / "sweep-0") == outputs
    (outputs / "planted").symlink_to(tmp_path)
    assert real_ancestor(outputs / "planted" / "sweep-0") == outputs
    with pytest.raises(RefusedFile):
        make_dirs(outputs / "planted" / "sweep-0", trusted=real_ancestor(outputs / "planted" / "sweep-0"))


def test_make_dirs_gives_the_folder_away_through_its_descriptor(tmp_path):
    """The owner is changed on the folder opened without following symlinks, never by name."""
    import pwd

    import pytest

    from ma_jupyter.errors import RefusedFile
    from ma_jupyter.untrusted import make_dirs

    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    nobody = pwd.getpwnam("nobody")
    make_dirs(tmp_path / "a" / "b", trusted=tmp_path, chown=(nobody.pw_uid, nobody.pw_gid))
    assert (tmp_path / "a" / "b").stat().st_uid == nobody.pw_uid
    assert (tmp_path / "a").stat().st_uid == 0  # only the folder itself
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(RefusedFile):
        make_dirs(tmp_path / "link" / "c", trusted=tmp_path, chown=(nobody.pw_uid, nobody.pw_gid))
    assert victim.stat().st_uid == 0 and not (victim / "c").exists()
