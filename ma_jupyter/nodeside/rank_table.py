"""Ascend HCCL rank tables (``jobstart_hccl.json``): the platform's template 2, and template 1.

The platform writes template 2 (seed 000) into the folder ``$RANK_TABLE_FILE`` names::

    {"group_count": "1",
     "group_list": [{"device_count": "1", "group_name": "job-trainjob", "instance_count": "1",
                     "instance_list": [{"devices": [{"device_id": "4", "device_ip": "192.1.10.254"}],
                                        "pod_name": "jobxxxxxxxx-job-trainjob-0",
                                        "server_id": "192.168.0.25"}]}],
     "status": "completed"}

``status`` is not necessarily ``completed`` when the boot file starts: a script waits for it
(:func:`wait_completed`) before reading the rest, and may convert the table to template 1
(:func:`to_template1`), where every device gets its ``rank_id`` in order::

    {"server_count": "1",
     "server_list": [{"device": [{"device_id": "4", "device_ip": "192.1.10.254", "rank_id": "0"}],
                      "server_id": "192.168.0.25"}],
     "status": "completed", "version": "1.0"}

``python -m ma_jupyter.nodeside.rank_table [--wait SECONDS] IN.json OUT.json`` does both from a
shell.  Every value is a string, as in the seed's examples.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

FILE_NAME = "jobstart_hccl.json"
COMPLETED = "completed"
#: the status the platform writes before every node is up
INITIALIZING = "initializing"


def device_ip(node_index: int, card: int) -> str:
    """The address listed for an emulated card (there is no device network on simulated nodes)."""
    return f"192.1.{node_index}.{100 + card}"


def template2(
    group_name: str,
    instances: list[dict],
    status: str = INITIALIZING,
) -> dict:
    """A template-2 rank table with one group.

    Args:
        group_name: the group's name (the job's name).
        instances: one ``{"devices": [{"device_id", "device_ip"}], "pod_name", "server_id"}``
            per node, in node order.
        status: ``initializing`` until every node is up, then ``completed``.
    """
    devices = sum(len(i["devices"]) for i in instances)
    return {
        "group_count": "1",
        "group_list": [
            {
                "device_count": str(devices),
                "group_name": group_name,
                "instance_count": str(len(instances)),
                "instance_list": instances,
            }
        ],
        "status": status,
    }


def to_template1(table: dict) -> dict:
    """Convert a template-2 table to template 1, numbering devices in order as ``rank_id``.

    Raises:
        ValueError: the table is not template 2 (no ``group_list``).
    """
    if "group_list" not in table:
        raise ValueError("not a template-2 rank table: it has no group_list")
    servers = []
    rank = 0
    for group in table["group_list"]:
        for instance in group.get("instance_list", []):
            devices = []
            for device in instance.get("devices", []):
                devices.append(
                    {
                        "device_id": str(device["device_id"]),
                        "device_ip": str(device["device_ip"]),
                        "rank_id": str(rank),
                    }
                )
                rank += 1
            servers.append({"device": devices, "server_id": str(instance["server_id"])})
    return {
        "server_count": str(len(servers)),
        "server_list": servers,
        "status": table.get("status", COMPLETED),
        "version": "1.0",
    }


def read(path: str | Path) -> dict:
    """The rank table at ``path`` (a file, or the folder holding ``jobstart_hccl.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    return json.loads(path.read_text())


def wait_completed(path: str | Path, timeout: float = 300.0, interval: float = 0.1) -> dict:
    """Poll the table until its ``status`` is ``completed`` and return it.

    Raises:
        TimeoutError: not completed within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            table = read(path)
            if table.get("status") == COMPLETED:
                return table
        except (OSError, ValueError):
            pass  # being replaced right now, or not written yet
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{path}: status did not become {COMPLETED!r} within {timeout:.0f} s")
        time.sleep(interval)


def write_atomic(path: Path, table: dict) -> None:
    """Replace ``path`` in one step, so a reader never sees half a table."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """CLI: wait for a template-2 table to complete and write it as template 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    timeout = 300.0
    if args[:1] == ["--wait"] and len(args) > 1:
        timeout = float(args[1])
        args = args[2:]
    if len(args) != 2:
        print(
            "usage: python -m ma_jupyter.nodeside.rank_table [--wait SECONDS] IN.json OUT.json",
            file=sys.stderr,
        )
        return 2
    table = wait_completed(args[0], timeout)
    write_atomic(Path(args[1]), to_template1(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
