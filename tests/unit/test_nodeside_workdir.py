"""The working copy's helper on real folders: what ``copy`` takes, what ``export`` keeps, and
``exec_env --copy`` reporting the copy's end before it runs the command."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

from ma_jupyter.nodeside import workdir
from ma_jupyter.nodeside.exec_env import env_file_data

EXEC_ENV = os.path.join(os.path.dirname(workdir.__file__), "exec_env.py")


def _source(tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "train.py").chmod(0o444)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (src / "data.lnk").symlink_to("/etc/hostname")  # copied as a link, never followed
    os.mkfifo(src / "pipe")  # left out: no program's folder needs one
    os.utime(src / "train.py", ns=(1_000_000_000, 1_000_000_000))
    return src


def test_copy_keeps_links_modes_and_times_and_leaves_out_special_files(tmp_path):
    src, dst = _source(tmp_path), tmp_path / "dst"
    dst.mkdir()
    files, total = workdir.copy(str(src), str(dst), 1 << 20)
    assert files == 3 and total == len("print(1)\n") + 1
    assert sorted(p.name for p in dst.iterdir()) == ["data.lnk", "pkg", "train.py"]
    assert os.readlink(dst / "data.lnk") == "/etc/hostname"
    st = (dst / "train.py").stat()
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_mtime_ns == 1_000_000_000  # writable by its owner
    assert (dst / "pkg" / "__pycache__" / "x.pyc").read_bytes() == b"\0"


def test_copy_over_the_limit_stops_with_exit_3_and_says_what_to_do(tmp_path, capsys):
    src, dst = _source(tmp_path), tmp_path / "dst"
    dst.mkdir()
    assert workdir.main(["copy", str(src), str(dst), "4"]) == 3
    err = capsys.readouterr().err
    assert "more than 4 bytes" in err and "--dataset" in err and "--code-writable" in err


def test_export_keeps_only_what_changed_after_the_copy(tmp_path, capsys):
    src, dst, out = _source(tmp_path), tmp_path / "dst", tmp_path / "out"
    dst.mkdir()
    workdir.copy(str(src), str(dst), 1 << 20)
    since = time.time_ns()
    assert not workdir.changed_since(str(dst), since)
    time.sleep(0.02)
    (dst / "model.pt").write_bytes(b"weights")
    (dst / "runs" / "exp").mkdir(parents=True)
    (dst / "runs" / "exp" / "events").write_text("e")
    (dst / "pkg" / "__pycache__" / "y.pyc").write_bytes(b"\0")  # Python's, not the job's
    (dst / "latest").symlink_to("model.pt")
    assert workdir.changed_since(str(dst), since)
    assert workdir.main(["export", str(dst), str(out), str(since)]) == 0
    kept = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir())
    assert kept == ["latest", "model.pt", "runs/exp/events"]
    assert os.readlink(out / "latest") == "model.pt"
    assert "kept 3 file(s)" in capsys.readouterr().out
    # the next attempt's export replaces what the last one kept, through a temporary name
    (dst / "model.pt").write_bytes(b"better")
    workdir.export(str(dst), str(out), since)
    assert (out / "model.pt").read_bytes() == b"better"
    assert not [p for p in out.rglob("*") if p.name.endswith(".ma-partial")]


def test_exec_env_fills_the_copy_reports_its_end_then_runs_the_command(tmp_path):
    src, dst = _source(tmp_path), tmp_path / "dst"
    dst.mkdir()
    env_file = tmp_path / "env"
    env_file.write_bytes(env_file_data({"PATH": os.defpath, "GREETING": "hi"}))
    read, write = os.pipe()
    started = time.time_ns()
    script = "import os; print(os.environ['GREETING'], sorted(os.listdir('.')))"
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            EXEC_ENV,
            str(env_file),
            "--copy",
            str(src),
            str(dst),
            "100000",
            str(write),
            "--",
        ]
        + [sys.executable, "-c", script],
        cwd=dst,
        pass_fds=(write,),
        capture_output=True,
        text=True,
        timeout=60,
    )
    os.close(write)
    reported = os.read(read, 100)
    os.close(read)
    assert proc.returncode == 0, proc.stderr
    assert "hi ['data.lnk', 'pkg', 'train.py']" in proc.stdout  # the command ran in the filled copy
    assert reported.endswith(b"\n") and int(reported) >= started
    # a copy that fails reports nothing and runs nothing
    again = tmp_path / "again"
    again.mkdir()
    read, write = os.pipe()
    failed = subprocess.run(
        [sys.executable, "-I", "-S", EXEC_ENV, str(env_file), "--copy", str(src), str(again), "1", str(write)]
        + ["--", sys.executable, "-c", "print('RAN')"],
        pass_fds=(write,),
        capture_output=True,
        text=True,
        timeout=60,
    )
    os.close(write)
    assert failed.returncode == 3 and "RAN" not in failed.stdout and os.read(read, 100) == b""
    os.close(read)


def test_a_chain_of_folders_deeper_than_recursion_in_the_working_copy_is_refused_saying_so(tmp_path, capsys):
    """A job's 1,100-deep chain (made relative to a descriptor) in its working copy: the export
    walked it recursively into RecursionError (a traceback); it ends with exit 1 naming the
    bound, and a chain within it is still exported."""
    from ma_jupyter.foldersize import remove_tree

    src, dst, out = _source(tmp_path), tmp_path / "dst", tmp_path / "out"
    dst.mkdir()
    workdir.copy(str(src), str(dst), 1 << 20)
    since = time.time_ns()
    time.sleep(0.02)

    def chain(depth: int, name: str) -> None:
        fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
        os.mkdir(name, dir_fd=fd)
        below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.close(fd)

    try:
        chain(300, "a")
        assert workdir.main(["export", str(dst), str(out), str(since)]) == 0
        assert "kept 1 file(s)" in capsys.readouterr().out
        chain(1100, "b")
        assert workdir.main(["export", str(dst), str(out), str(since)]) == 1
        assert f"a chain of folders more than {workdir.MAX_DEPTH} deep" in capsys.readouterr().err
    finally:
        assert remove_tree(dst).complete and remove_tree(out).complete
