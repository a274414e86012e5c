"""The package's one folder-size walk (``ma_jupyter/foldersize.py``), rule by rule, on real files."""

from __future__ import annotations

import os

from ma_jupyter.foldersize import folder_size


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
    assert folder_size([tree], max_entries=4) is not None  # a, one, b, two: 4 entries
    assert folder_size([tree], max_entries=3) is None


def test_what_cannot_be_read_counts_as_nothing(tmp_path):
    """Rule 6."""
    assert folder_size([tmp_path / "missing"]).bytes == 0
    plain = tmp_path / "file"
    plain.write_text("not a folder")
    assert folder_size([plain]).bytes == 0
