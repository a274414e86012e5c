"""``cluster.toml`` against its one schema (ma_jupyter/cluster_schema.py): an unknown table or
key is refused in every table, naming the file and the key; wrong types name what they must be;
every key docs/admin.md documents is taken."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ma_jupyter import config
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.service import access

ADMIN_DOC = Path(__file__).resolve().parents[2] / "docs" / "admin.md"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[users]\nsharng = false\n", r"\[users\] has no key 'sharng': use sharing, urgent_quota"),
        ("[limits]\nmax_restart = 3\n", r"\[limits\] has no key 'max_restart'"),
        ("[resources]\nsample_intervals = 1\n", r"\[resources\] has no key 'sample_intervals'"),
        ("[mounts]\nallowed_root = []\n", r"\[mounts\] has no key 'allowed_root'"),
        ('[backend]\nkind = "local"\nadress = "x:1"\n', r"\[backend\] has no key 'adress'"),
        ('[storage]\nendpoint = "http://x"\n', r"\[storage\] has no key 'endpoint'"),
        ('[data]\nretain = "1d"\n', r"\[data\] has no key 'retain'"),
        ('[notify]\ncmd = "x"\n', r"\[notify\] has no key 'cmd'"),
        ('[[pool]]\nname = "a"\ndedicate = true\n', r"\[\[pool\]\] has no key 'dedicate'"),
        ('[[node]]\nname = "n"\ncpus = 1\nmemory_gb = 1\ncpu = 2\n', r"\[\[node\]\] cpu: Extra inputs"),
        ('[[spec]]\nname = "s"\ncpus = 1\nmemory_gb = 1\ngpus = 2\n', r"\[\[spec\]\] gpus: Extra inputs"),
        ("[user]\nsharing = false\n", r"there is no table \[user\]: use \[\[spec\]\]"),
        (
            '[resources]\nsample_interval = "fast"\n',
            r"\[resources\] sample_interval must be a positive number",
        ),
        ("[resources]\nsample_interval = 0\n", r"\[resources\] sample_interval must be a positive number"),
        ("[users]\njob_account = 3\n", r"\[users\] job_account must be an account's name"),
        ("[mounts]\nworkdir_copy_mb = -1\n", r"\[mounts\] workdir_copy_mb must be a number of megabytes"),
        ('[[pool]]\nname = "a"\ndedicated = "yes"\n', r"\[\[pool\]\] dedicated must be true or false"),
        ("users = 1\n", r"\[users\] must be a table; it takes sharing"),
    ],
)
def test_every_table_refuses_unknown_keys_and_wrong_types_naming_the_file_and_key(tmp_path, text, says):
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(InvalidSpec, match=says) as refused:
        config.read_cluster_file(path)
    assert refused.value.message.startswith(f"{path}")


def test_a_bad_sample_interval_is_refused_not_swallowed(tmp_path, monkeypatch):
    from ma_jupyter.service import resources

    monkeypatch.setenv(config.ENV_HOME, str(tmp_path))
    assert resources.load_interval() == resources.DEFAULT_INTERVAL  # no file: the default
    (tmp_path / "cluster.toml").write_text("[resources]\nsample_interval = 0.5\n")
    assert resources.load_interval() == 0.5
    (tmp_path / "cluster.toml").write_text('[resources]\nsample_interval = "1s"\n')
    with pytest.raises(InvalidSpec, match=r"\[resources\] sample_interval must be a positive number"):
        resources.load_interval()


def test_a_misspelt_users_key_stops_the_rules_instead_of_being_ignored(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text("[users]\nsharng = false\n")
    with pytest.raises(InvalidSpec, match="sharng"):
        access.load_rules(path)
    with pytest.raises(InvalidSpec, match="sharng"):
        config.load_cluster(path)


def test_every_key_the_admin_page_documents_is_taken(tmp_path):
    """docs/admin.md's table of keys and the schema name the same keys (a new key is a line in
    the schema and a row there)."""
    from ma_jupyter import cluster_schema

    documented: dict[str, set[str]] = {}
    table = None
    for line in ADMIN_DOC.read_text().split("## `cluster.toml`", 1)[1].splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or len(cells) < 3 or cells[0] == "| table":
            continue
        head = re.match(r"\|\s*`\[\[?(\w+)\]\]?`", cells[0])
        table = head.group(1) if head else table
        keys = cells[1]
        while re.search(r"\([^()]*\)", keys):  # the parentheses say what a key's values are
            keys = re.sub(r"\([^()]*\)", "", keys)
        documented.setdefault(table, set()).update(re.findall(r"`(\w+)`", keys))
    schema = {
        name: set(cluster_schema.table_keys(name)) for name in documented if name not in ("spec", "node")
    }
    assert set(documented) == set(cluster_schema.ClusterFile.model_fields)
    for name, keys in schema.items():
        assert keys == documented[name], name


def test_a_file_keeping_the_schema_reads_as_written(tmp_path):
    path = tmp_path / "cluster.toml"
    text = (
        '[users]\nsharing = false\nurgent_quota = 0\nallow_root = ["root"]\njob_account = "nobody"\n'
        "[limits]\nhang_minutes = 0\nmax_log_mb = 2.5\n[resources]\nsample_interval = 0.5\n"
        '[data]\nretention = "2h"\n[[pool]]\nname = "a"\n'
    )
    path.write_text(text)
    import tomllib

    assert config.read_cluster_file(path) == tomllib.loads(text)
    assert access.load_rules(path).sharing is False
    assert config.load_cluster(path).limits.hang_minutes == 0


def test_a_hostile_file_is_refused_in_words_not_a_crash_or_unbounded_memory(tmp_path):
    """Nesting deep enough to exhaust the parser's recursion (a RecursionError, which every
    caller let through as a 500 or a dead thread), a file past the size cap (each read holds it
    whole) and a FIFO (each read would wait for a writer) are refused as bad cluster files,
    naming the file and the limit."""
    path = tmp_path / "cluster.toml"
    for text in (
        "[network]\negress = " + "[" * 5000 + "]" * 5000 + "\n",
        "[users]\nsharing = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n",
    ):
        path.write_text(text)
        with pytest.raises(InvalidSpec, match=r"is not a valid cluster file: .*nested too deep"):
            config.read_cluster_file(path)
    path.write_text("# padding\n" * (config.MAX_CLUSTER_FILE_BYTES // 10 + 1))
    with pytest.raises(InvalidSpec, match=rf"is over {config.MAX_CLUSTER_FILE_BYTES} bytes, the most"):
        config.read_cluster_file(path)
    # a FIFO (no writer: opening it to read would block for ever) and a device are no cluster file
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(InvalidSpec, match=r"cluster.toml is not a regular file"):
        config.read_cluster_file(path)
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(InvalidSpec, match=r"cluster.toml is not a regular file"):
        config.read_cluster_file(path)
