"""``provisioner import FILE``: expected inventory (CSV or JSON) into the API."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.cli import formatting
from provisioner.cli.client import API, PROG, Json, UsageError, api_client, api_options

if TYPE_CHECKING:
    from provisioner.cli.client import Subcommands

IMPORT_TYPES = {".csv": "text/csv", ".json": "application/json"}


def add_commands(sub: Subcommands) -> None:
    imp = sub.add_parser("import", parents=[api_options()], allow_abbrev=False,
                         help="import expected inventory (CSV or JSON) through the API")
    imp.add_argument("file", type=Path, metavar="FILE", help="a .csv or .json file")
    imp.add_argument("--dry-run", action="store_true",
                     help="change nothing: print what the import would change, per node")
    imp.add_argument("--allow-live-changes", action="store_true",
                     help="rename or re-profile nodes that are active or being installed")
    imp.add_argument("--prune-macs", action="store_true",
                     help="remove a known node's MACs that its row does not list")
    imp.add_argument("--json", action="store_true", help="print the API's report as JSON")
    imp.set_defaults(command=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    """Exit 0, or 1 when the API reports rows in error (each on stderr)."""
    path: Path = args.file
    content_type = IMPORT_TYPES.get(path.suffix.lower())
    if content_type is None:
        raise UsageError(f"{path}: unknown file type; expected one of "
                         f"{', '.join(sorted(IMPORT_TYPES))}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    flags = [name for name in ("dry_run", "allow_live_changes", "prune_macs")
             if getattr(args, name)]
    query = "?" + "&".join(f"{name}=true" for name in flags) if flags else ""
    report = api_client(args).post_raw(f"{API}/inventory/import{query}", data, content_type)
    errors: Sequence[Json] = report.get("errors") or []
    if args.json:
        print(formatting.dump_json(report))
    else:
        for line in change_lines(report.get("changes") or [], every=args.dry_run):
            print(line)
        verb = "would create" if args.dry_run else "created"
        print(f"{verb} {len(_planned(report, 'create'))}, "
              f"{'would update' if args.dry_run else 'updated'} "
              f"{len(_planned(report, 'update'))}, errors {len(errors)}"
              + (" (dry run: nothing changed)" if args.dry_run else ""))
    for error in errors:
        print(f"{PROG}: import: {error}", file=sys.stderr)
    return 1 if errors else 0


def _planned(report: Json, action: str) -> list[Json]:
    return [c for c in report.get("changes") or [] if c.get("action") == action]


def change_lines(changes: Sequence[Json], *, every: bool) -> list[str]:
    """One line per machine (``SERIAL (NODE): ACTION``), then its changes and notes.
    ``every``: each machine (a dry run); else the updated ones and those with notes."""
    lines: list[str] = []
    for change in changes:
        if change.get("action") == "refused":
            continue  # on stderr with the errors
        if not every and change.get("action") != "update" and not change.get("notes"):
            continue
        node = f" ({change['node']})" if change.get("node") else ""
        lines.append(f"{change.get('serial')}{node}: {change.get('action')}")
        lines += [f"  {text}" for text in change.get("changes") or []]
        lines += [f"  note: {text}" for text in change.get("notes") or []]
    return lines
