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
    report = api_client(args).post_raw(f"{API}/inventory/import", data, content_type)
    errors: Sequence[Json] = report.get("errors") or []
    if args.json:
        print(formatting.dump_json(report))
    else:
        print(f"created {len(report.get('created') or [])}, "
              f"updated {len(report.get('updated') or [])}, errors {len(errors)}")
    for error in errors:
        print(f"{PROG}: import: {error}", file=sys.stderr)
    return 1 if errors else 0
