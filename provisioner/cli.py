"""The ``provisioner`` command: ``serve``, local admin commands, and an HTTP client of the API.

Exit codes: 0 ok, 1 an API or runtime failure (one line on stderr), 2 a usage or config error.
Heavy modules (pydantic, the store, the daemon) are imported only by the commands that need
them, so ``provisioner node list`` starts fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from provisioner import __version__, cli_format, cli_power, cli_ramdisk, cli_topology
from provisioner.client import ApiClient, ApiError, Json
from provisioner.errors import ConfigError, ProvisionerError

if TYPE_CHECKING:
    from provisioner.config import Settings

PROG = "provisioner"
API = "/api/v1"
ACTIONS = ("inspect", "deploy", "retire", "retry", "abort", "maintenance-on", "maintenance-off",
           "sku-override", "adopt")
ROLES = ("viewer", "operator", "admin")
BMC_DRIVERS = ("ipmi", "redfish", "fake")
IMPORT_TYPES = {".csv": "text/csv", ".json": "application/json"}
Command = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A bad argument found after parsing (unreadable file, wrong extension): exit 2."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad arguments, 0 for --help and --version
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    command: Command = args.command
    try:
        return command(args)
    except UsageError as exc:
        return _fail(f"{PROG}: error: {exc}", 2)
    except ConfigError as exc:
        return _fail(f"{PROG}: config error: {exc}", 2)
    except ApiError as exc:
        reason = cli_format.api_reason(exc.status, exc.detail, exc.problem)
        return _fail(f"{PROG}: error: {reason}", 1)
    except ProvisionerError as exc:
        return _fail(f"{PROG}: error: {exc}", 1)
    except KeyboardInterrupt:
        return _fail("", 130)
    except BrokenPipeError:  # `provisioner node list | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _fail(message: str, code: int) -> int:
    if message:
        print(message, file=sys.stderr)
    return code


# -- parser -------------------------------------------------------------------------------


class _RefuseSecret(argparse.Action):
    """Rejects a secret given on the command line without echoing it back."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> NoReturn:
        parser.error(f"{option_string} is not accepted on the command line (it would show "
                     f"in ps and shell history): use {option_string}-file FILE")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False,
                                     description="Bare-metal provisioning for GPU clusters.")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="config file (default: /etc/provisioner/provisioner.toml)")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the daemon until SIGTERM", allow_abbrev=False)
    serve.set_defaults(command=cmd_serve)

    db = _group(sub, "db", "database schema (local)")
    db.add_parser("upgrade", help="apply pending migrations",
                  allow_abbrev=False).set_defaults(command=cmd_db_upgrade)

    config = _group(sub, "config", "configuration (local)")
    show = config.add_parser("show", help="print the effective config, secrets masked",
                             allow_abbrev=False)
    show.add_argument("--json", action="store_true", help="JSON instead of TOML")
    show.set_defaults(command=cmd_config_show)

    token = _group(sub, "token", "API tokens (local)")
    create = token.add_parser("create", help="create an API token; prints it once",
                              allow_abbrev=False)
    create.add_argument("--role", choices=ROLES, required=True)
    create.add_argument("--name", required=True)
    create.set_defaults(command=cmd_token_create)

    _add_node_commands(_group(sub, "node", "nodes (through the API)"))
    imp = sub.add_parser("import", parents=[_api_options()], allow_abbrev=False,
                         help="import expected inventory (CSV or JSON) through the API")
    imp.add_argument("file", type=Path, metavar="FILE", help="a .csv or .json file")
    imp.add_argument("--json", action="store_true", help="print the API's report as JSON")
    imp.set_defaults(command=cmd_import)
    cli_topology.add_topology_parser(sub)
    cli_ramdisk.add_ramdisk_parser(sub, load)
    return parser


def _add_node_commands(node: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    api = _api_options()
    ls = node.add_parser("list", parents=[api], help="list nodes", allow_abbrev=False)
    ls.add_argument("--state")
    ls.add_argument("--rack")
    ls.add_argument("--profile")
    ls.add_argument("--maintenance", action=argparse.BooleanOptionalAction, default=None,
                    help="only nodes in (or out of) maintenance")
    ls.add_argument("-q", dest="query", metavar="TEXT", help="search hostname, serial, MAC")
    ls.add_argument("--limit", type=_int_in(1))
    ls.add_argument("--offset", type=_int_in(0))
    ls.add_argument("--all", action="store_true", help="follow pagination to the end")
    ls.add_argument("--json", action="store_true", help="a JSON array of the nodes")
    ls.set_defaults(command=cmd_node_list)

    show = node.add_parser("show", parents=[api], help="one node, with facts and history",
                           allow_abbrev=False)
    show.add_argument("node", metavar="NODE", help="id, hostname, serial or MAC")
    show.add_argument("--json", action="store_true", help="the API's JSON")
    show.set_defaults(command=cmd_node_show)

    enroll = node.add_parser("enroll", parents=[api], help="enroll a node", allow_abbrev=False)
    enroll.add_argument("--hostname")
    enroll.add_argument("--serial")
    enroll.add_argument("--mac", dest="macs", action="append", required=True,
                        metavar="MAC", help="a MAC address (repeat for each NIC)")
    enroll.add_argument("--profile")
    enroll.add_argument("--rack")
    enroll.add_argument("--position", metavar="U")
    enroll.add_argument("--bmc-driver", choices=BMC_DRIVERS)
    enroll.add_argument("--bmc-address", metavar="ADDR")
    enroll.add_argument("--bmc-port", type=_int_in(1, 65535), metavar="PORT")
    enroll.add_argument("--bmc-username", metavar="USER")
    enroll.add_argument("--bmc-password-file", type=Path, metavar="FILE",
                        help="file holding the BMC password (a trailing newline is dropped)")
    enroll.add_argument("--bmc-password", action=_RefuseSecret, nargs="?",
                        help=argparse.SUPPRESS)
    enroll.add_argument("--json", action="store_true", help="the API's JSON")
    enroll.set_defaults(command=cmd_node_enroll)

    action = node.add_parser("action", parents=[api], help="request a lifecycle action",
                             allow_abbrev=False)
    action.add_argument("node", metavar="NODE")
    action.add_argument("action", choices=ACTIONS, metavar="ACTION",
                        help=", ".join(ACTIONS))
    action.add_argument("--reason", default=None, help="recorded in the node's history")
    action.add_argument("--json", action="store_true", help="the API's JSON")
    action.set_defaults(command=cmd_node_action)

    history = node.add_parser("history", parents=[api], help="a node's transitions",
                              allow_abbrev=False)
    history.add_argument("node", metavar="NODE")
    history.add_argument("--json", action="store_true", help="a JSON array of the entries")
    history.set_defaults(command=cmd_node_history)
    cli_power.add_power_commands(node, api)


def _group(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
           help_text: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    parser = sub.add_parser(name, help=help_text, allow_abbrev=False)
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)


def _api_options() -> argparse.ArgumentParser:
    api = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    api.add_argument("--url", help="API base URL (env PROVISIONER_URL; default: api.listen "
                                   "from the config)")
    who = api.add_mutually_exclusive_group()
    who.add_argument("--token", help="bearer token (prefer env PROVISIONER_TOKEN)")
    who.add_argument("--token-file", type=Path, metavar="FILE", help="file holding the token")
    api.add_argument("--timeout", type=float, default=30.0, metavar="S",
                     help="per-request timeout in seconds (default 30)")
    return api


def _int_in(low: int, high: int = 2**63) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low}, got {text!r}"
                                             if high == 2**63 else f"expected {low}-{high}")
        return int(text)

    return parse


# -- local commands -----------------------------------------------------------------------


def load(args: argparse.Namespace) -> Settings:
    """The settings from ``--config`` (which must exist), else the default path if present."""
    from provisioner.config import DEFAULT_CONFIG_PATH, load_settings

    given: Path | None = args.config
    if given is None:
        return load_settings(DEFAULT_CONFIG_PATH, explicit=False)
    return load_settings(given, explicit=True)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load(args)
    from provisioner.daemon import run

    return run(settings)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from provisioner import admin

    print(admin.db_upgrade(load(args)))
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from provisioner import admin

    print(admin.show_config(load(args), as_json=bool(args.json)))
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from provisioner import admin

    token = admin.create_token(load(args), str(args.role), str(args.name))
    print(f"created {args.role} token {args.name!r}; it is shown once, store it now",
          file=sys.stderr)
    print(token)
    return 0


# -- API commands -------------------------------------------------------------------------


def client(args: argparse.Namespace) -> ApiClient:
    url: str | None = args.url or os.environ.get("PROVISIONER_URL")
    if not url:
        url = default_url(load(args))
    url = url.rstrip("/").removesuffix(API)
    return ApiClient(url, _token(args), timeout_s=float(args.timeout))


def default_url(settings: Settings) -> str:
    host, port = settings.api.host_port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        return _read_secret(args.token_file, "--token-file") or None
    token: str | None = args.token or os.environ.get("PROVISIONER_TOKEN")
    return token.strip() if token else None


def _read_secret(path: Path, option: str) -> str:
    try:
        value = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path}: not UTF-8 text") from None
    return value.removesuffix("\n").removesuffix("\r")


def _node_path(key: str, *rest: str) -> str:
    return "/".join([f"{API}/nodes", urllib.parse.quote(key, safe=""), *rest])


def _emit(value: Json) -> None:
    print(cli_format.dump_json(value))


def cmd_node_list(args: argparse.Namespace) -> int:
    api = client(args)
    params: dict[str, str | int | bool | None] = {
        "state": args.state, "rack": args.rack, "profile": args.profile,
        "maintenance": args.maintenance, "q": args.query, "limit": args.limit,
        "offset": args.offset,
    }
    page = api.get(f"{API}/nodes", params)
    items: list[Json] = list(page["items"])
    total = int(page.get("total", len(items)))
    offset = int(page.get("offset") or 0)
    while args.all and page["items"] and offset + len(items) < total:
        params["offset"] = offset + len(items)
        page = api.get(f"{API}/nodes", params)
        items.extend(page["items"])
    if args.json:
        _emit(items)
        return 0
    print(cli_format.node_table(items))
    if offset + len(items) < total or offset:
        print(f"({len(items)} of {total} nodes from offset {offset}; --all lists every one)",
              file=sys.stderr)
    return 0


def cmd_node_show(args: argparse.Namespace) -> int:
    node = client(args).get(_node_path(args.node))
    print(cli_format.dump_json(node) if args.json else cli_format.node_detail(node))
    return 0


def cmd_node_enroll(args: argparse.Namespace) -> int:
    body: dict[str, Json] = {"macs": list(args.macs)}
    for name in ("hostname", "serial", "profile", "rack", "position"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    bmc = _bmc_body(args)
    if bmc is not None:
        body["bmc"] = bmc
    node = client(args).post(f"{API}/nodes", body)
    if args.json:
        _emit(node)
    else:
        print(f"enrolled {node.get('hostname') or node.get('serial') or node['id']}: "
              f"id {node['id']}, state {node.get('state')}")
    return 0


def _bmc_body(args: argparse.Namespace) -> dict[str, Json] | None:
    given = [args.bmc_address, args.bmc_port, args.bmc_username, args.bmc_password_file]
    if args.bmc_driver is None:
        if any(value is not None for value in given):
            raise UsageError("--bmc-* options need --bmc-driver")
        return None
    if not args.bmc_address:
        raise UsageError("--bmc-driver needs --bmc-address")
    bmc: dict[str, Json] = {"driver": args.bmc_driver, "address": args.bmc_address}
    if args.bmc_port is not None:
        bmc["port"] = args.bmc_port
    if args.bmc_username is not None:
        bmc["username"] = args.bmc_username
    if args.bmc_password_file is not None:
        bmc["password"] = _read_secret(args.bmc_password_file, "--bmc-password-file")
    return bmc


def cmd_node_action(args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason is not None else None
    node = client(args).post(_node_path(args.node, "actions", args.action), body)
    if args.json:
        _emit(node)
    else:
        name = node.get("hostname") or node.get("serial") or node.get("id")
        print(f"{name}: {args.action} accepted; state {node.get('state')}")
    return 0


def cmd_node_history(args: argparse.Namespace) -> int:
    items = client(args).get(_node_path(args.node, "history"))["items"]
    print(cli_format.dump_json(items) if args.json else cli_format.history_table(items))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    path: Path = args.file
    content_type = IMPORT_TYPES.get(path.suffix.lower())
    if content_type is None:
        raise UsageError(f"{path}: unknown file type; expected one of "
                         f"{', '.join(sorted(IMPORT_TYPES))}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    report = client(args).post_raw(f"{API}/inventory/import", data, content_type)
    errors: Sequence[Json] = report.get("errors") or []
    if args.json:
        _emit(report)
    else:
        print(f"created {len(report.get('created') or [])}, "
              f"updated {len(report.get('updated') or [])}, errors {len(errors)}")
    for error in errors:
        print(f"{PROG}: import: {error}", file=sys.stderr)
    return 1 if errors else 0
