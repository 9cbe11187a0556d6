"""``provisioner token create|list|revoke``: API tokens, on the store directly (local: the
first admin token has no API to ask). A token's secret is printed once, at creation; ``list``
shows names, roles and expiry, never a secret (only hashes are stored)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from provisioner.cli.client import UsageError, add_group, load_config
from provisioner.cli.formatting import table

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands
    from provisioner.domain import TokenInfo

ROLES = ("viewer", "operator", "admin")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def add_commands(sub: Subcommands) -> None:
    token = add_group(sub, "token", "API tokens (local)")
    create = token.add_parser("create", help="create an API token; prints it once",
                              allow_abbrev=False)
    create.add_argument("--role", choices=ROLES, required=True)
    create.add_argument("--name", required=True)
    lifetime = create.add_mutually_exclusive_group()
    lifetime.add_argument("--expires-in", metavar="DURATION", type=duration_s,
                          help="lifetime: 90d, 12h, 30m, 3600s (default: the site's "
                               "api.token_lifetime_days)")
    lifetime.add_argument("--no-expiry", action="store_true",
                          help="a token that never expires (revoke it when done)")
    create.set_defaults(command=cmd_token_create)
    listing = token.add_parser("list", help="list API tokens (never their secrets)",
                               allow_abbrev=False)
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    listing.set_defaults(command=cmd_token_list)
    revoke = token.add_parser("revoke", help="revoke an API token at once",
                              allow_abbrev=False)
    revoke.add_argument("token", metavar="NAME_OR_ID")
    revoke.set_defaults(command=cmd_token_revoke)


def duration_s(text: str) -> float:
    """``90d``, ``12h``, ``30m``, ``3600s`` or plain seconds, as seconds (at least 60)."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 90d, 12h, 30m)")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds < 60:
        raise argparse.ArgumentTypeError("a token's lifetime is at least one minute")
    return seconds


def cmd_token_create(args: argparse.Namespace) -> int:
    from provisioner import admin

    info, token = admin.create_token(load_config(args), str(args.role), str(args.name),
                                     expires_in_s=args.expires_in, no_expiry=args.no_expiry)
    until = info.expires_at.isoformat() if info.expires_at else "never"
    print(f"created {args.role} token {args.name!r} (id {info.id}, expires {until}); it is "
          "shown once, store it now", file=sys.stderr)
    print(token)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from provisioner import admin

    tokens = admin.list_tokens(load_config(args))
    if args.json:
        print(json.dumps([token_json(info) for info in tokens], indent=2))
        return 0
    now = datetime.now(UTC)
    print(table(("ID", "NAME", "ROLE", "CREATED", "EXPIRES"), [
        (info.id, info.name, str(info.role), _when(info.created_at),
         _expires(info.expires_at, now)) for info in tokens]))
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from provisioner import admin

    key = str(args.token).strip()
    if not key:
        raise UsageError("name the token to revoke (its name or id)")
    info = admin.revoke_token(load_config(args), key)
    print(f"revoked {info.role} token {info.name!r} (id {info.id})", file=sys.stderr)
    return 0


def token_json(info: TokenInfo) -> dict[str, str | None]:
    return {"id": info.id, "name": info.name, "role": str(info.role),
            "created_at": _when(info.created_at),
            "expires_at": info.expires_at.isoformat() if info.expires_at else None}


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else "-"


def _expires(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    return _when(moment) + (" (expired)" if moment <= now else "")
