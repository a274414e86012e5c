"""The node runner's last records (its failure report, its exit code) on a disk a job filled.

A job that floods its log fills the disk its node's folder lies on.  A runner whose exit-code
write failed there died without one, and its node was reported lost instead of ending with its
reason (seen in a whole run).  The records' disk is now reserved when the node starts, and a
write past that room waits, bounded, for room to come back.  Each test runs on a real tmpfs
filled to its last byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ma_jupyter.nodehost.end_records import reserve_room, write_end, write_exit_code, write_report
from tests.fixtures.node_runner import bubblewrap_node
from tests.helpers import small_tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

ROOT = Path(__file__).resolve().parents[2]

#: a job that fills the disk of the folder it is given to the last byte, then fails with code 3
FILL = r"""
import sys
with open(sys.argv[1], "wb", buffering=0) as fh:
    for size in (1 << 16, 1):
        try:
            while True:
                fh.write(b"x" * size)
        except OSError:
            pass
sys.exit(3)
"""


def _fill(folder: Path) -> Path:
    """Fill ``folder``'s file system to the last byte; the file that holds it all."""
    filler = folder / "flood.log"
    subprocess.run([sys.executable, "-c", FILL, str(filler)], check=False)
    with pytest.raises(OSError):
        (folder / "probe").write_text("0\n")  # truly full: even a tiny file fails
    (folder / "probe").unlink(missing_ok=True)
    return filler


def test_a_record_whose_room_was_reserved_is_written_on_a_disk_that_stays_full(tmp_path):
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        reserve_room(disk / "exit_code")
        reserve_room(disk / "failure.json")
        _fill(disk)
        write_report(disk / "failure.json", {"reason": "the job's logs exceeded [limits] max_log_mb"})
        write_exit_code(disk / "exit_code", 137)
        assert (disk / "exit_code").read_text() == "137\n"
        assert "max_log_mb" in (disk / "failure.json").read_text()


def test_a_record_without_room_lands_once_room_comes_back(tmp_path):
    said: list[str] = []
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        filler = _fill(disk)

        def cut_later():  # what the watchdog's cut of a flood's overflow does
            time.sleep(0.6)
            os.truncate(filler, 0)

        cutter = threading.Thread(target=cut_later)
        cutter.start()
        try:
            assert write_end(write_exit_code, disk / "exit_code", 137, time.monotonic() + 10, said.append)
        finally:
            cutter.join()
        assert (disk / "exit_code").read_text() == "137\n"


def test_the_tries_end_at_their_deadline_on_a_disk_that_stays_full_and_at_once_without_a_folder(tmp_path):
    said: list[str] = []
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        _fill(disk)
        began = time.monotonic()
        assert not write_end(write_exit_code, disk / "exit_code", 1, began + 0.5, said.append)
        full_wait = time.monotonic() - began
        assert not (disk / "exit_code").exists()
        began = time.monotonic()
        assert not write_end(write_exit_code, disk / "gone" / "exit_code", 1, began + 30, said.append)
        gone_wait = time.monotonic() - began
    assert 0.5 <= full_wait < 5, full_wait
    assert gone_wait < 5, gone_wait  # not the 30 s a full disk would wait
    assert len(said) == 2 and all(s.startswith("could not write exit_code") for s in said), said


def test_a_node_whose_job_fills_its_disk_still_ends_with_its_exit_code(tmp_path):
    """The real runner: the node's folder and its log on a 1 MiB disk, which the job fills to
    the last byte before it fails; nothing gives room back.  The node still ends recorded, with
    the job's own code, and the runner ends as soon as the job does."""
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        node_dir, spec = bubblewrap_node(disk, [sys.executable, "-c", FILL, str(disk / "flood.log")])
        with open(disk / "worker-0.log", "ab") as log:
            runner = subprocess.Popen(
                [sys.executable, "-m", "ma_jupyter.nodehost.noderun", str(spec)],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=log,
                stderr=log,
            )
        try:
            assert runner.wait(timeout=60) == 3
        finally:
            runner.kill()
            runner.wait()
        assert (node_dir / "exit_code").read_text() == "3\n"
        assert "could not write" not in (disk / "worker-0.log").read_text()


@pytest.mark.parametrize("planted", ["fifo", "symlink", "hardlink"])
def test_a_record_is_written_over_what_a_job_planted_in_its_room(tmp_path, planted):
    """end_records rule 4, the hostile side: where the node's folder is the job's account's, the
    job may leave a FIFO (nobody reading it), a link or a hard link where the exit code's room
    is.  The write neither waits on the FIFO nor writes through the links: the exit code is
    written, as a file of its own, and what the links point at is untouched."""
    target = tmp_path / "elsewhere"
    target.write_text("the job's own file\n")
    room = tmp_path / "exit_code.room"
    if planted == "fifo":
        os.mkfifo(room)
    elif planted == "symlink":
        room.symlink_to(target)
    else:
        os.link(target, room)
    done: list[bool] = []
    writer = threading.Thread(target=lambda: done.append(write_exit_code(tmp_path / "exit_code", 7) is None))
    writer.daemon = True  # a write that waits on the FIFO must not keep the test's process
    writer.start()
    writer.join(10)
    assert done == [True], "the exit code's write waited on what the job planted"
    record = tmp_path / "exit_code"
    assert record.read_text() == "7\n" and not record.is_symlink() and record.stat().st_nlink == 1
    assert target.read_text() == "the job's own file\n"
