"""``ma-jupyter service start|stop|status``: the job service of this home."""

from __future__ import annotations

import argparse

from ...client import Client
from ...errors import Conflict
from .output import (
    EXIT_FAILED,
    EXIT_OK,
    out,
)


def _service(args: argparse.Namespace) -> int:
    service_args: list[str] = []
    if args.backend:
        service_args += ["--backend", args.backend]
    if args.ray_address:
        service_args += ["--ray-address", args.ray_address]
    client = Client(autostart=args.action == "start", service_args=service_args, plain=True)
    if args.action == "start":
        running = client.service_status()
        wanted = args.backend or ("ray" if args.ray_address else None)
        if running["running"] and wanted and running["backend"] != wanted:
            raise Conflict(
                f"a job service already runs for {running['home']} with the {running['backend']} backend: "
                "stop it first (`ma-jupyter service stop`; its jobs keep running)"
            )
        client.connect()
        status = client.service_status()
        text = f"job service running at {status['url']} (pid {status['pid']}, {status['backend']} backend)"
        out(status if args.json else text, args)
        return EXIT_OK
    if args.action == "stop":
        status = client.service_status()
        stopped = client.shutdown_service()
        if args.json:
            out({"stopped": stopped, "pid": status["pid"]}, args)
        else:
            print(
                f"stopped the job service (pid {status['pid']})" if stopped else "no job service was running"
            )
        return EXIT_OK
    status = client.service_status()
    if args.json:
        out(status, args)
    elif status["running"]:
        print(
            f"running at {status['url']} (pid {status['pid']}, version {status['version']}, "
            f"{status['backend']} backend)"
        )
        print(f"home {status['home']}, log {status['log']}")
    else:
        print(f"not running (home {status['home']}); `ma-jupyter service start` starts it")
    return EXIT_OK if status["running"] else EXIT_FAILED


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {"service": _service}
