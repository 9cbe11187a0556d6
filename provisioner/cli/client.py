"""The CLI's one client module, which every command group imports: a tiny synchronous client
of the REST API (stdlib only, so the CLI starts fast), the API options that make one
(``--url``, ``--token``, ``--token-file``, ``--timeout``), and what the groups share besides:
the settings behind ``--config``, ``UsageError``, API paths and the group parser.

Errors come back as ``ApiError`` with a one-line reason taken from the problem document
(``application/problem+json``); the bearer token is never part of any message.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from provisioner import __version__
from provisioner.errors import ProvisionerError

if TYPE_CHECKING:
    from provisioner.config import Settings

    #: A group's commands, as ``ArgumentParser.add_subparsers`` returns them.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

PROG = "provisioner"
API = "/api/v1"
#: JSON as it comes off the wire; the CLI looks at it, it never crosses into the daemon.
Json = Any
ParamValue = str | int | bool | list[str] | None


class UsageError(Exception):
    """A bad argument found after parsing (unreadable file, wrong extension): exit 2."""


class ApiError(Exception):
    """A request failed: ``status`` is the HTTP status, or 0 when no response came back."""

    def __init__(self, status: int, detail: str, problem: Mapping[str, Json] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.problem: Mapping[str, Json] = problem or {}


@dataclass(frozen=True, slots=True)
class SseFrame:
    """One server-sent event: its ``event:``, its ``data:`` and its ``id:`` (None if none)."""

    event: str
    data: str
    id: int | None


class ApiClient:
    def __init__(self, base_url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # never show the token
        return f"ApiClient({self.base_url!r})"

    def get(self, path: str, params: Mapping[str, ParamValue] | None = None) -> Json:
        return self._request("GET", path + _query(params or {}), None, None)

    def post(self, path: str, body: Mapping[str, Json] | None = None) -> Json:
        data = None if body is None else json.dumps(body).encode()
        return self._request("POST", path, data, "application/json" if data else None)

    def post_raw(self, path: str, data: bytes, content_type: str) -> Json:
        return self._request("POST", path, data, content_type)

    def patch(self, path: str, body: Mapping[str, Json]) -> Json:
        return self._request("PATCH", path, json.dumps(body).encode(), "application/json")

    def delete(self, path: str) -> Json:
        return self._request("DELETE", path, None, None)

    def events(self, path: str, params: Mapping[str, ParamValue],
               last_event_id: int | None = None) -> Iterator[SseFrame]:
        """The server-sent events of ``path``, one frame at a time, until the server ends
        the stream (ApiError when it cannot be read)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        request = self._build("GET", path + _query(params), None, None, headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                fields: dict[str, str] = {}
                for raw in response:
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    if line:
                        name, _, value = line.partition(":")
                        if name:  # a ": comment" line has no name
                            fields[name] = value.removeprefix(" ")
                        continue
                    if "data" in fields:
                        yield SseFrame(fields.get("event", "message"), fields["data"],
                                       int(fields["id"]) if fields.get("id", "").isdigit()
                                       else None)
                    fields = {}
        except urllib.error.HTTPError as exc:
            with exc:
                raise _api_error(exc.code, exc.reason, exc.read()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise ApiError(0, f"cannot read events from {self.base_url}: "
                              f"{_reason(exc)}") from None

    def _build(self, method: str, path: str, data: bytes | None, content_type: str | None,
               extra: Mapping[str, str] | None = None) -> urllib.request.Request:
        headers = {"Accept": "application/json", "User-Agent": f"provisioner-cli/{__version__}"}
        headers.update(extra or {})
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if content_type:
            headers["Content-Type"] = content_type
        return urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                      method=method)

    def _request(
        self, method: str, path: str, data: bytes | None, content_type: str | None
    ) -> Json:
        request = self._build(method, path, data, content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                raise _api_error(exc.code, exc.reason, exc.read()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise ApiError(0, f"cannot reach provisioner at {self.base_url}: "
                              f"{_reason(exc)}") from None
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError:
            raise ApiError(0, f"{method} {path}: the response is not JSON") from None


def _query(params: Mapping[str, ParamValue]) -> str:
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        elif isinstance(value, list):  # a repeatable filter: ?state=a&state=b
            pairs.extend((key, item) for item in value)
        else:
            pairs.append((key, str(value)))
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


def _api_error(status: int, reason: object, body: bytes) -> ApiError:
    """Build the error from a problem document, or from the status line when there is none."""
    try:
        problem = json.loads(body) if body else None
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        text = body.decode("utf-8", "replace").strip().splitlines()
        return ApiError(status, f"HTTP {status}: {text[0] if text else reason}")
    detail = str(problem.get("detail") or problem.get("title") or reason or f"HTTP {status}")
    errors = problem.get("errors")
    if isinstance(errors, list):
        more = [text for text in map(_describe_error, errors) if text not in detail]
        if more:
            detail += "; " + "; ".join(more[:5])
        if len(more) > 5:
            detail += f"; and {len(more) - 5} more"
    return ApiError(status, " ".join(detail.split()), problem)


def _describe_error(item: Json) -> str:
    """``row 3: bmc.port: Input should be a valid integer`` from an ``errors`` item."""
    if not isinstance(item, dict):
        return str(item)
    loc = item.get("loc")
    if isinstance(loc, list):
        loc = ".".join(str(part) for part in loc)
    text = f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", item))
    return f"row {item['row']}: {text}" if item.get("row") is not None else text


def _reason(exc: Exception) -> str:
    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return str(reason.strerror).lower()
    return str(reason) or type(reason).__name__


# -- the API options and the client they make ------------------------------------------------


def api_options() -> argparse.ArgumentParser:
    """The parent parser of every command that talks to the API."""
    api = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    api.add_argument("--url", help="API base URL (env PROVISIONER_URL; default: api.listen "
                                   "from the config)")
    who = api.add_mutually_exclusive_group()
    who.add_argument("--token", help="bearer token (prefer env PROVISIONER_TOKEN)")
    who.add_argument("--token-file", type=Path, metavar="FILE", help="file holding the token")
    api.add_argument("--timeout", type=float, default=30.0, metavar="S",
                     help="per-request timeout in seconds (default 30)")
    return api


def api_client(args: argparse.Namespace) -> ApiClient:
    """The client that ``--url`` (else PROVISIONER_URL, else the config) and the token name."""
    url: str | None = args.url or os.environ.get("PROVISIONER_URL")
    if not url:
        url = default_url(load_config(args))
    url = url.rstrip("/").removesuffix(API)
    return ApiClient(url, bearer_token(args), timeout_s=float(args.timeout))


def default_url(settings: Settings) -> str:
    host, port = settings.api.host_port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bearer_token(args: argparse.Namespace) -> str | None:
    """``--token-file``, else ``--token``, else PROVISIONER_TOKEN; None when none is set."""
    if args.token_file is not None:
        return read_secret(args.token_file, "--token-file") or None
    token: str | None = args.token or os.environ.get("PROVISIONER_TOKEN")
    return token.strip() if token else None


def read_secret(path: Path, option: str) -> str:
    """The secret in ``path`` (given as ``option``), less one trailing newline."""
    try:
        value = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path}: not UTF-8 text") from None
    return value.removesuffix("\n").removesuffix("\r")


def node_path(key: str, *rest: str) -> str:
    """``/api/v1/nodes/<key>/<rest…>``, the key (id, hostname, serial or MAC) quoted."""
    return "/".join([f"{API}/nodes", urllib.parse.quote(key, safe=""), *rest])


# -- --wait, shared by one node's action and the bulk form --------------------------------------

#: the stable states an action's --wait counts as success (other actions: any stable
#: state that is not a failure)
WAIT_FOR: dict[str, tuple[str, ...]] = {
    "inspect": ("inspected", "active"), "deploy": ("active",), "retire": ("retired",),
}
#: the lifecycle's in-flight states (the CLI imports no lifecycle module;
#: tests/unit/test_cli_events.py holds the two equal)
IN_FLIGHT = frozenset({"inspecting", "deploying", "configuring", "joining", "validating",
                       "registering", "retiring", "repairing", "servicing"})
WAIT_POLL_S = 0.5


def action_succeeded(action: str, state: str) -> bool:
    if action in WAIT_FOR:
        return state in WAIT_FOR[action]
    return not (state.endswith("_failed") or state == "service_required")


def wait_until_rest(api: ApiClient, node: Json, action: str, timeout_s: float) -> Json:
    """Poll the node until it rests (not in flight) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while node.get("state") in IN_FLIGHT:
        if time.monotonic() > deadline:
            raise ProvisionerError(f"{node.get('hostname') or node['id']}: {action} did not "
                                   f"finish in {timeout_s:.0f} s (state {node.get('state')})")
        time.sleep(WAIT_POLL_S)
        node = api.get(node_path(node["id"]))
    return node


# -- shared by the groups ----------------------------------------------------------------------


def load_config(args: argparse.Namespace) -> Settings:
    """The settings from ``--config`` (which must exist), else the default path if present."""
    from provisioner.config import DEFAULT_CONFIG_PATH, load_settings

    given: Path | None = args.config
    if given is None:
        return load_settings(DEFAULT_CONFIG_PATH, explicit=False)
    return load_settings(given, explicit=True)


def add_group(sub: Subcommands, name: str, help_text: str) -> Subcommands:
    """A command group (``provisioner NAME COMMAND``) whose commands the caller adds."""
    parser = sub.add_parser(name, help=help_text, allow_abbrev=False)
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)
