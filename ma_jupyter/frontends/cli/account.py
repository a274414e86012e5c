"""``ma-jupyter whoami``, ``notify``, ``users``, ``images``, ``algorithms``, ``cache``, ``data``: what
belongs to a user (and, for admins, the users themselves)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from ... import spectext
from ...client import Client
from ...client.plain import as_json
from ...errors import InvalidSpec
from .. import jobactions, options, render
from .output import (
    EXIT_OK,
    err,
    out,
)


def _whoami(args: argparse.Namespace) -> int:
    user = Client(plain=True).whoami()
    out(as_json(user) if args.json else user.name + (" (admin)" if user.admin else ""), args)
    return EXIT_OK


def _notify(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    change: dict = {}
    if args.webhook is not None or args.no_webhook:
        change["webhook"] = None if args.no_webhook else args.webhook
    if args.address is not None or args.no_address:
        change["address"] = None if args.no_address else args.address
    settings = client.set_notify(**change) if change else client.notify_settings()
    if args.json:
        out(as_json(settings), args)
        return EXIT_OK
    print(f"webhook: {settings.webhook or '-'}\naddress: {settings.address or '-'}")
    return EXIT_OK


def _users(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action == "list":
        users = client.users()
        if args.json:
            out(as_json(users), args)
            return EXIT_OK
        rows = [["NAME", "ADMIN", "CREATED"]]
        rows += [[u.name, "yes" if u.admin else "no", render.clock(u.created_at)] for u in users]
        print(render.text_table(rows), end="")
        return EXIT_OK
    if args.action == "remove":
        client.remove_user(args.name)
        print(f"removed user {args.name}: its token no longer works (its jobs stay)")
        return EXIT_OK
    made = (
        client.add_user(args.name, admin=args.admin) if args.action == "add" else client.new_token(args.name)
    )
    if args.json:
        out(as_json(made), args)
        return EXIT_OK
    # stdout carries the token alone (TOKEN=$(ma-jupyter users add bob) works); the rest is said on stderr
    print(made.token, flush=True)
    role = "admin" if made.admin else "user"
    err(
        f"{'added' if args.action == 'add' else 'new token for'} {role} {made.name}: this token is shown "
        "only now; its holder sets MA_JUPYTER_TOKEN to it"
    )


def _images(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action == "rm":
        client.remove_image(args.name)
        print(f"removed image {args.name} (jobs that named it keep its environment)")
        return EXIT_OK
    if args.action == "add":
        environment = options.image_environment(args.environment, Path.cwd())
        image = {
            "name": args.name,
            "environment": environment,
            "card_type": args.card_type,
            "scopes": args.scope or ["training", "devenv"],
            "visibility": "public" if args.public else "private",
            "description": args.description,
        }
        made = client.register_image(image)
        if args.json:
            out(as_json(made), args)
        else:
            print(f"registered {made.visibility} image {made.name}: --image {made.name}")
        return EXIT_OK
    found = client.images()
    if args.json:
        out(as_json(found), args)
        return EXIT_OK
    rows = [["NAME", "CARD TYPE", "SCOPES", "VISIBILITY", "OWNER", "ENVIRONMENT"]]
    for i in found:
        env = spectext.image_text(i.environment.model_dump(exclude_none=True))
        rows.append([i.name, i.card_type, ",".join(i.scopes), i.visibility, i.owner or "-", env])
    print(render.text_table(rows), end="")
    return EXIT_OK


def _algorithms(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action != "list":
        if not args.folder:
            raise InvalidSpec(f"give the folder: ma-jupyter algorithms {args.action} FOLDER")
        if args.action == "favourite":
            marked = client.favourite(args.folder)
            out(as_json(marked) if args.json else f"favourite: {marked.path}", args)
        else:
            client.unfavourite(args.folder)
            print(f"no longer a favourite: {args.folder}")
        return EXIT_OK
    if args.folder:
        raise InvalidSpec("list takes no folder: ma-jupyter jobs --algorithm FOLDER lists a folder's jobs")
    found = client.algorithms()
    if args.json:
        out(as_json(found), args)
        return EXIT_OK
    rows = [["FOLDER", "FAVOURITE", "YOUR JOBS", "VERSIONS"]]
    for a in found:
        rows.append([a.path, "yes" if a.favourite else "", str(a.jobs), str(len(a.versions))])
        if args.versions:  # each content the folder's jobs ran, the most recently used first
            for v in a.versions:
                rows.append(
                    [
                        f"  version {jobactions.short_digest(v.digest)}",
                        "",
                        str(v.jobs),
                        render.clock(v.last_used),
                    ]
                )
    print(render.text_table(rows), end="")
    return EXIT_OK


def _cache(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.clear:
        if args.all:
            raise InvalidSpec("--clear empties your own cache only: drop --all")
        held = client.clear_cache()
        if args.json:
            out(as_json(held), args)
        else:
            print(
                f"cleared the cache of {held.user}: {render.size(held.bytes)} in {held.files} file(s) removed"
            )
        return EXIT_OK
    found = client.cache(every_user=args.all)
    if args.json:
        out(as_json(found), args)
        return EXIT_OK
    rows = [["USER", "SIZE", "FILES", "FOLDER"]]
    # a cache the walk refused shows what was counted before, a lower bound ("+")
    rows += [[c.user, render.size(c.bytes) + ("+" if c.refused else ""), str(c.files), c.path] for c in found]
    print(render.text_table(rows), end="")
    for c in found:
        if c.refused:
            print(f"the cache of {c.user} could not be measured whole: {c.refused}", file=sys.stderr)
    return EXIT_OK


def _data(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    if args.action == "rm":
        gone = client.remove_prepared_data(args.key)
        if args.json:
            out(as_json(gone), args)
        else:
            print(f"removed prepared data {gone.key} ({render.size(gone.bytes)}, copy of {gone.source})")
        return EXIT_OK
    found = client.prepared_data()
    if args.json:
        out(as_json(found), args)
        return EXIT_OK
    rows = [["KEY", "SIZE", "FILES", "LAST USED", "JOBS", "SOURCE"]]
    for d in found:
        used = render.clock(datetime.fromtimestamp(d.last_used, UTC))
        rows.append([d.key, render.size(d.bytes), str(d.files), used, ",".join(d.jobs) or "-", d.source])
    print(render.text_table(rows), end="")
    return EXIT_OK


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {
    "whoami": _whoami,
    "notify": _notify,
    "users": _users,
    "images": _images,
    "algorithms": _algorithms,
    "cache": _cache,
    "data": _data,
}
