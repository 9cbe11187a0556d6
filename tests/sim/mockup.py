"""Replays a recorded Redfish BMC (tests/fixtures/redfish/<vendor>/: ``serviceroot.json``,
``systems.json``, ``system.json`` and, where recorded, the ``resetactioninfo.json`` its
Reset action names in ``@Redfish.ActionInfo``, as the BMC answered them) on loopback, with
the state a driver changes: sessions at the root's ``Links.Sessions``, ``PATCH`` of the
System's ``Boot`` checked against the recorded ``@Redfish.AllowableValues`` (an unknown
property is a 400, as on real BMCs), and ``POST`` of the recorded Reset target checked
against the recorded ``ResetType`` values (inline or in the ActionInfo). Paths match as the
BMC spells them, with or without the trailing slash and in any case (iLO links
``/redfish/v1/systems/1/`` and ``/Systems/1/``).

``lenient_reset``: a run-together value (Supermicro's ``GracefulShutdownGracefulRestart``)
accepts its parts, as that firmware does; strict accepts only what is listed verbatim.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.sim.basic_auth import basic_auth_ok

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish"
VENDORS = tuple(sorted(p.name for p in FIXTURES.iterdir() if (p / "system.json").is_file()))
_BOOT_KEYS = ("BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode",
              "HttpBootUri", "UefiTargetBootSourceOverride")
_RESULT = {"On": "On", "ForceOn": "On", "ForceOff": "Off", "GracefulShutdown": "Off",
           "ForceRestart": "On", "GracefulRestart": "On", "PowerCycle": "On",
           "FullPowerCycle": "On"}
_KNOWN = sorted({*_RESULT, "Nmi", "PushPowerButton"}, key=len, reverse=True)


def _key(path: str) -> str:
    return path.split("?", 1)[0].rstrip("/").lower() or "/"


def _parts(value: str) -> list[str]:
    out: list[str] = []
    rest = value
    while rest:
        match = next((k for k in _KNOWN if rest.startswith(k)), None)
        if match is None:
            return []
        out.append(match)
        rest = rest[len(match):]
    return out


@dataclass
class Replay:
    vendor: str
    user: str = "admin"
    password: str = "password"
    lenient_reset: bool = True
    power_delay_s: float = 0.05
    graceful_honoured: bool = True
    """False: the OS ignores the ACPI button (GracefulShutdown, PushPowerButton when on)."""
    system: dict[str, Any] = field(init=False)
    resets: list[str] = field(default_factory=list)
    states_at_reset: list[str] = field(default_factory=list)
    """The PowerState the System read when each accepted Reset arrived."""
    patches: list[dict[str, Any]] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        folder = FIXTURES / self.vendor
        self.root = json.loads((folder / "serviceroot.json").read_text())
        self.systems = json.loads((folder / "systems.json").read_text())
        self.recorded = json.loads((folder / "system.json").read_text())
        info = folder / "resetactioninfo.json"
        self.action_info = json.loads(info.read_text()) if info.is_file() else None
        self.system = copy.deepcopy(self.recorded)
        self.system["PowerState"] = "Off"

    @property
    def system_path(self) -> str:
        return str(self.systems["Members"][0]["@odata.id"])

    @property
    def reset(self) -> dict[str, Any]:
        return dict(self.recorded.get("Actions", {}).get("#ComputerSystem.Reset", {}))

    def allowed_resets(self) -> set[str] | None:
        values = self.reset.get("ResetType@Redfish.AllowableValues")
        if not isinstance(values, list) and self.action_info is not None:
            values = next((p.get("AllowableValues") for p in self.action_info["Parameters"]
                           if p.get("Name") == "ResetType"), None)
        if not isinstance(values, list):
            return None  # not recorded: the firmware's list is unknown; accept known types
        allowed = set(values)
        if self.lenient_reset:
            for value in values:
                allowed.update(_parts(value))
        return allowed

    def authorized(self, request: web.Request) -> bool:
        if request.headers.get("X-Auth-Token") in self.tokens:
            return True
        return basic_auth_ok(request, self.user, self.password)


REPLAY = web.AppKey("replay", Replay)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": "Base.1.0.GeneralError", "message": message}},
                             status=status)


async def _handle(request: web.Request) -> web.StreamResponse:
    replay = request.app[REPLAY]
    path, method = _key(request.path), request.method
    sessions = _key(str(replay.root.get("Links", {}).get("Sessions", {}).get("@odata.id", "")))
    if path == "/redfish/v1" and method == "GET":
        return web.json_response(replay.root)
    if path == sessions and method == "POST":
        return await _login(replay, request)
    if not replay.authorized(request):
        return _error(401, "unauthorized")
    if path.startswith(sessions + "/") and method == "DELETE":
        replay.tokens.discard(request.headers.get("X-Auth-Token", ""))
        return web.Response(status=204)
    if path == _key(str(replay.root["Systems"]["@odata.id"])) and method == "GET":
        return web.json_response(replay.systems)
    if path == _key(replay.system_path):
        if method == "GET":
            return web.json_response(replay.system)
        if method == "PATCH":
            return _patch(replay, await request.json())
    info = replay.reset.get("@Redfish.ActionInfo")
    if replay.action_info is not None and path == _key(str(info)) and method == "GET":
        return web.json_response(replay.action_info)
    if path == _key(str(replay.reset.get("target", ""))) and method == "POST":
        return _reset(replay, request.app, (await request.json()).get("ResetType"))
    return _error(404 if method == "GET" else 405, f"{method} {request.path}: not recorded")


async def _login(replay: Replay, request: web.Request) -> web.Response:
    body = await request.json()
    if (body.get("UserName"), body.get("Password")) != (replay.user, replay.password):
        return _error(401, "bad credentials")
    token = base64.b16encode(f"{replay.vendor}-{next(replay._ids)}".encode()).decode()
    replay.tokens.add(token)
    location = f"{replay.root['Links']['Sessions']['@odata.id'].rstrip('/')}/{len(replay.tokens)}"
    return web.json_response({"@odata.id": location}, status=201,
                             headers={"X-Auth-Token": token, "Location": location})


def _patch(replay: Replay, body: dict[str, Any]) -> web.Response:
    boot = body.get("Boot")
    if not isinstance(boot, dict) or set(body) != {"Boot"}:
        return _error(400, "only Boot is patched here")
    replay.patches.append(boot)
    recorded = replay.recorded.get("Boot", {})
    for name, value in boot.items():
        if name not in _BOOT_KEYS or name not in recorded:
            return _error(400, f"PropertyUnknown: {name}")
        allowed = recorded.get(f"{name}@Redfish.AllowableValues")
        if isinstance(allowed, list) and value not in allowed:
            return _error(400, f"PropertyValueNotInList: {name}={value}")
    replay.system["Boot"].update(boot)
    return web.Response(status=204)


def _reset(replay: Replay, app: web.Application, kind: object) -> web.Response:
    allowed = replay.allowed_resets()
    known = kind in _RESULT or kind in ("Nmi", "PushPowerButton")
    if not isinstance(kind, str) or not known or (allowed is not None and kind not in allowed):
        return _error(400, f"ActionParameterNotSupported: ResetType {kind}")
    replay.resets.append(kind)
    now = replay.system["PowerState"]
    replay.states_at_reset.append(now)
    if kind == "PushPowerButton":
        target = "Off" if now == "On" else "On"
        graceful = now == "On"
    else:
        target, graceful = _RESULT.get(kind, now), kind == "GracefulShutdown"
    if graceful and not replay.graceful_honoured:
        return web.Response(status=204)  # accepted; the OS never shuts down

    async def apply() -> None:
        await asyncio.sleep(replay.power_delay_s)
        replay.system["PowerState"] = target

    task = asyncio.get_running_loop().create_task(apply())
    replay.tasks.add(task)
    task.add_done_callback(replay.tasks.discard)
    del app
    return web.Response(status=204)


def make_app(replay: Replay) -> web.Application:
    app = web.Application()
    app[REPLAY] = replay
    app.router.add_route("*", "/{tail:.*}", _handle)
    return app
