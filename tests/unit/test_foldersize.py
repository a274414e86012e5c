"""The package's one folder-size walk (``ma_jupyter/foldersize.py``), rule by rule, on real files."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from ma_jupyter import foldersize
from ma_jupyter.errors import FolderRefused
from ma_jupyter.foldersize import folder_size, remove_tree, walk

#: deeper than Python's recursion limit: what a hostile job makes to break a recursive walk
DEEP = 1100


def _tree(root):
    (root / "a").mkdir(parents=True)
    (root / "a" / "one").write_bytes(b"x" * 1000)
    (root / "a" / "b").mkdir()
    (root / "a" / "b" / "two").write_bytes(b"y" * 3000)
    return root


def test_regular_files_are_counted_below_every_folder(tmp_path):
    found = folder_size([_tree(tmp_path / "t")])
    assert (found.bytes, found.files) == (4000, 2)


def test_no_link_below_the_folder_is_followed(tmp_path):
    """Rule 1: a job may plant a link towards anything; it counts as nothing."""
    tree = _tree(tmp_path / "t")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"z" * 100_000)
    (tree / "a" / "to-folder").symlink_to(outside)
    (tree / "a" / "to-file").symlink_to(outside / "big")
    assert folder_size([tree]).bytes == 4000


def test_a_linked_top_is_entered_only_when_asked(tmp_path):
    tree = _tree(tmp_path / "t")
    link = tmp_path / "link"
    link.symlink_to(tree)
    assert folder_size([link]).bytes == 4000
    assert folder_size([link], follow_top=False).bytes == 0


def test_overlapping_folders_are_counted_once(tmp_path):
    """Rule 2: a job's default outputs lie inside its job folder."""
    tree = _tree(tmp_path / "t")
    assert folder_size([tree, tree / "a" / "b"]).bytes == 4000
    assert folder_size([tree / "a" / "b", tree]).bytes == 4000


def test_allocated_counts_blocks_not_sizes(tmp_path):
    """Rule 3: a sparse file holds its size in contents, almost nothing on the disk."""
    folder = tmp_path / "sparse"
    folder.mkdir()
    with open(folder / "hole", "wb") as fh:
        fh.truncate(50 << 20)
    assert folder_size([folder]).bytes == 50 << 20
    assert folder_size([folder], allocated=True).bytes < 1 << 20


def test_another_file_system_is_not_counted(tmp_path):
    """Rule 4: only what lies on the device named."""
    tree = _tree(tmp_path / "t")
    device = os.stat(tree).st_dev
    assert folder_size([tree], device=device).bytes == 4000
    assert folder_size([tree], device=device + 1).bytes == 0


def test_counting_stops_past_the_limit_and_past_the_entries(tmp_path):
    """Rule 5."""
    tree = _tree(tmp_path / "t")
    over = folder_size([tree], limit=500)
    assert 500 < over.bytes < 4000 and over.files == 1
    assert folder_size([tree], max_entries=4).files == 2  # a, one, b, two: 4 entries
    with pytest.raises(FolderRefused, match="more than 3 files and folders"):
        folder_size([tree], max_entries=3)


def test_what_cannot_be_read_counts_as_nothing(tmp_path):
    """Rule 6."""
    assert folder_size([tmp_path / "missing"]).bytes == 0
    plain = tmp_path / "file"
    plain.write_text("not a folder")
    assert folder_size([plain]).bytes == 0


def test_ignored_entries_are_left_out_as_a_filtered_copy_would(tmp_path):
    """Rule 7: ``ignore`` sees each folder's path and its names, as shutil.copytree's does."""
    tree = _tree(tmp_path / "t")
    seen = []

    def ignore(folder, names):
        seen.append((folder, sorted(names)))
        return {"b"} if folder.endswith("/a") else set()

    found = folder_size([tree], ignore=ignore)
    assert (found.bytes, found.files) == (1000, 1)  # the folder b and its file are not entered
    assert (str(tree / "a"), ["b", "one"]) in seen


def _chain(at, depth: int, every: int = 100) -> None:
    """A chain of ``depth`` folders made as a job would, each relative to its parent's
    descriptor (no path is ever longer than a name), a 10-byte file and a link to /etc every
    ``every`` levels, and a 5-byte file at the bottom."""
    fd = os.open(at, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            os.mkdir("d", dir_fd=fd)
            if level % every == 0:
                file = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(file, b"x" * 10)
                os.close(file)
                os.symlink("/etc", "l", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        file = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(file, b"y" * 5)
        os.close(file)
    finally:
        os.close(fd)


@pytest.fixture
def hostile(tmp_path):
    """A folder for a hostile tree, removed after the test: pytest's own clean-up of old
    temporary folders (shutil.rmtree) would raise RecursionError on a deep chain."""
    folder = tmp_path / "hostile"
    folder.mkdir()
    yield folder
    assert remove_tree(folder).complete


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_chain_deeper_than_recursion_is_refused_or_counted_never_recursion(hostile):
    """Rule 8: a 1,100-deep chain (shutil.rmtree and os.fwalk raise RecursionError on it) is
    refused with the one error type past ``max_depth``, and counted whole below it, holding
    a bounded number of descriptors."""
    _chain(hostile, DEEP)
    with pytest.raises(FolderRefused, match=f"more than {foldersize.MAX_DEPTH} deep") as refused:
        folder_size([hostile])
    assert refused.value.counted is not None and refused.value.status == 422
    before = _open_fds()
    held = []
    for _path, _fd, _found in walk([hostile], max_depth=2 * DEEP):
        held.append(_open_fds())
    assert len(held) == DEEP + 1 and max(held) - before <= foldersize.HELD_FDS
    found = folder_size([hostile], max_depth=2 * DEEP)
    assert (found.bytes, found.files) == (11 * 10 + 5, 12)  # no link followed
    assert _open_fds() == before


def test_a_comb_is_walked_whole_with_its_descriptors_bounded(hostile):
    """Rule 8: every level with a sibling left to enter (its descriptor closed, opened again
    from the nearest one held)."""
    fd = os.open(hostile, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(300):
        for name in ("a", "b"):
            os.mkdir(name, dir_fd=fd)
        os.close(os.open("b/file", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        below = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    before = _open_fds()
    most = 0
    paths = []
    for path, _fd, _found in walk([hostile]):
        most = max(most, _open_fds())
        paths.append(path)
    assert len(paths) == 601 and len(set(paths)) == 601
    assert most - before <= foldersize.HELD_FDS
    assert folder_size([hostile]).files == 300
    most = 0
    for _path, _fd, _found in walk([hostile], max_depth=1 << 20):  # as the disk reserve walks
        most = max(most, _open_fds())
    assert most - before <= foldersize.HELD_FDS


def test_the_entry_bound_is_checked_as_a_folder_is_listed(tmp_path):
    """Rule 8: one folder of many names is refused after ``max_entries`` of them, before the
    walk looks at any (no lstat of the folder that passed it: nothing is yielded)."""
    for i in range(3000):
        (tmp_path / str(i)).touch()
    seen = []
    with pytest.raises(FolderRefused, match="more than 100 files"):
        for path, _fd, found in walk([tmp_path], max_entries=100):
            seen.append((path, found))
    assert seen == []


def test_a_walk_past_its_seconds_is_refused(hostile):
    _chain(hostile, 50)
    with pytest.raises(FolderRefused, match="took more than 0 s"):
        folder_size([hostile], max_seconds=0)


def test_remove_tree_removes_a_deep_chain_whole_following_no_link(tmp_path):
    """The one removal: a chain deeper than Python's recursion (shutil.rmtree raises
    RecursionError on it) is removed whole; the links in it go, not their targets."""
    doomed = tmp_path / "job"
    doomed.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the job's")
    _chain(doomed, DEEP)
    os.symlink(outside, doomed / "to-outside")
    with pytest.raises(RecursionError):
        shutil.rmtree(doomed)
    before = _open_fds()
    done = remove_tree(doomed)
    assert done.complete and done.failures == 0 and not doomed.exists()
    assert (outside / "keep").read_text() == "not the job's"
    assert _open_fds() == before


def test_remove_tree_of_a_link_removes_the_link_only(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").touch()
    link = tmp_path / "link"
    link.symlink_to(target)
    assert remove_tree(link).complete and not os.path.lexists(link)
    assert (target / "keep").exists()
    assert remove_tree(tmp_path / "missing").complete


def test_remove_tree_ends_while_another_thread_keeps_filling_the_folder(tmp_path):
    """A folder written to while it is removed is listed again a bounded number of times: the
    removal ends, and what it could not remove is counted (never a hang, never a raise)."""
    doomed = tmp_path / "job"
    (doomed / "a" / "b").mkdir(parents=True)
    (doomed / "a" / "b" / "f").touch()
    (doomed / "c").touch()
    # a folder another thread keeps filling while it is removed: bounded rounds, no hang
    stop = threading.Event()

    def fill() -> None:
        n = 0
        while not stop.is_set():
            try:
                (doomed / "a" / f"n{n}").touch()
            except OSError:
                return
            n += 1

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    try:
        done = remove_tree(doomed)
    finally:
        stop.set()
        filler.join(timeout=60)
    assert done.removed >= 3
    assert done.complete == (not doomed.exists())
    assert done.complete or done.failures >= 1


def test_remove_tree_enters_no_other_file_system(tmp_path):
    """A mount point below the folder (a sandbox's bind left behind): what lies there is not
    the tree's; it is named among the failures, the rest goes."""
    import subprocess

    doomed = tmp_path / "job"
    mount = doomed / "mnt"
    mount.mkdir(parents=True)
    (doomed / "log").write_text("job's")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (mount / "keep").write_text("another file system's")
        done = remove_tree(doomed)
        assert not done.complete and done.failures >= 1
        assert ("./mnt", "another file system") in done.failed
        assert (mount / "keep").read_text() == "another file system's"
        assert not (doomed / "log").exists()
    finally:
        subprocess.run(["umount", str(mount)], check=False)
    assert remove_tree(doomed).complete
