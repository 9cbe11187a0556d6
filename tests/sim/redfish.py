"""A small Redfish BMC simulator (aiohttp), for what sushy-tools cannot do: sessions
(SessionService login, X-Auth-Token, expiry, DELETE), injected latency per request at the
scale of 1,000 BMCs, and vendor quirks (no ``Once``, no ``UefiHttp``, no ``HttpBootUri``).

In-process: ``app = make_app(RedfishSim(...))``. As a process for the bench:
``python -m tests.sim.redfish --count 1000 --latency-s 2`` prints ``{"ports": [...],
"control": PORT}`` once every BMC listens; ``GET http://127.0.0.1:CONTROL/stats`` sums
the counters (and gives each BMC's power and request count under ``bmcs``). From a test:
``with SimRedfish(count=5, latency_s=5) as sim: sim.urls, sim.stats()``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import resource
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

SYSTEM = "/redfish/v1/Systems/1"
SESSIONS = "/redfish/v1/SessionService/Sessions"


@dataclass
class RedfishSim:
    user: str = "admin"
    password: str = "password"
    latency_s: float = 0.0
    power_delay_s: float = 0.0
    sessions_supported: bool = True
    once_supported: bool = True
    http_boot_supported: bool = True
    http_boot_uri_supported: bool = True
    http_boot_uri_writable: bool = True
    http_boot_uri: str = ""
    power: str = "Off"
    target: str = "None"
    enabled: str = "Disabled"
    mode: str = "UEFI"
    tokens: dict[str, str] = field(default_factory=dict)  # token -> session id
    logins: int = 0
    password_changes: int = 0
    logouts: int = 0
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    resets: list[str] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def expire_sessions(self) -> None:
        self.tokens.clear()

    def authorized(self, request: web.Request) -> bool:
        token = request.headers.get("X-Auth-Token")
        if token is not None:
            return token in self.tokens
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Basic":
            return False
        user, _, password = base64.b64decode(value).decode().partition(":")
        return (user, password) == (self.user, self.password)

    def system(self) -> dict[str, Any]:
        targets = ["None", "Pxe", "Hdd", "BiosSetup", *(["UefiHttp"] if
                                                        self.http_boot_supported else [])]
        enabled = ["Disabled", "Continuous", *(["Once"] if self.once_supported else [])]
        return {
            "@odata.id": SYSTEM, "Id": "1", "PowerState": self.power,
            "Boot": {"BootSourceOverrideTarget": self.target,
                     "BootSourceOverrideEnabled": self.enabled,
                     "BootSourceOverrideMode": self.mode,
                     "BootSourceOverrideTarget@Redfish.AllowableValues": targets,
                     "BootSourceOverrideEnabled@Redfish.AllowableValues": enabled,
                     **({"HttpBootUri": self.http_boot_uri}
                        if self.http_boot_uri_supported else {})},
            "Actions": {"#ComputerSystem.Reset": {
                "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown",
                                                      "ForceRestart"]}}}

    async def apply_power(self, state: str) -> None:
        await asyncio.sleep(self.power_delay_s)
        self.power = state


SIM = web.AppKey("sim", RedfishSim)


@web.middleware
async def _gate(request: web.Request, handler: Any) -> web.StreamResponse:
    sim = request.app[SIM]
    sim.requests += 1
    sim.in_flight += 1
    sim.max_in_flight = max(sim.max_in_flight, sim.in_flight)
    try:
        if sim.latency_s:
            await asyncio.sleep(sim.latency_s)
        public = request.path.rstrip("/") == "/redfish/v1" or (
            request.method == "POST" and request.path == SESSIONS)
        if not public and not sim.authorized(request):
            return web.json_response({"error": {"message": "unauthorized"}}, status=401)
        response: web.StreamResponse = await handler(request)
        return response
    finally:
        sim.in_flight -= 1


async def root(request: web.Request) -> web.Response:
    body: dict[str, Any] = {"@odata.id": "/redfish/v1/", "RedfishVersion": "1.6.0",
                            "Systems": {"@odata.id": "/redfish/v1/Systems"}}
    if request.app[SIM].sessions_supported:
        body["SessionService"] = {"@odata.id": "/redfish/v1/SessionService"}
        body["Links"] = {"Sessions": {"@odata.id": SESSIONS}}
    body["AccountService"] = {"@odata.id": "/redfish/v1/AccountService"}
    return web.json_response(body)


async def login(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    if not sim.sessions_supported:
        raise web.HTTPNotFound()
    body = await request.json()
    if (body.get("UserName"), body.get("Password")) != (sim.user, sim.password):
        return web.json_response({"error": {"message": "bad credentials"}}, status=401)
    sid = str(next(sim._ids))
    token = base64.b16encode(f"{id(sim)}-{sid}".encode()).decode()
    sim.tokens[token] = sid
    sim.logins += 1
    return web.json_response({"@odata.id": f"{SESSIONS}/{sid}", "Id": sid}, status=201,
                             headers={"X-Auth-Token": token, "Location": f"{SESSIONS}/{sid}"})


async def logout(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    sid = request.match_info["sid"]
    for token, value in list(sim.tokens.items()):
        if value == sid:
            del sim.tokens[token]
            sim.logouts += 1
    return web.Response(status=204)


ACCOUNTS = "/redfish/v1/AccountService/Accounts"


async def account_service(request: web.Request) -> web.Response:
    return web.json_response({"@odata.id": "/redfish/v1/AccountService",
                              "Accounts": {"@odata.id": ACCOUNTS}})


async def accounts(request: web.Request) -> web.Response:
    return web.json_response({"Members": [{"@odata.id": f"{ACCOUNTS}/1"},
                                          {"@odata.id": f"{ACCOUNTS}/2"}]})


async def account(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    aid = request.match_info["aid"]
    if aid not in ("1", "2"):
        raise web.HTTPNotFound()
    name = "operator" if aid == "1" else sim.user  # ours is not the first account
    return web.json_response({"@odata.id": f"{ACCOUNTS}/{aid}", "Id": aid, "UserName": name,
                              "Password": None}, headers={"ETag": f'W/"{sim.password_changes}"'})


async def patch_account(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    if request.match_info["aid"] != "2":
        return web.json_response({"error": {"message": "not that account"}}, status=403)
    if request.headers.get("If-Match") not in (None, f'W/"{sim.password_changes}"'):
        return web.json_response({"error": {"message": "stale ETag"}}, status=412)
    password = (await request.json()).get("Password")
    if not isinstance(password, str) or len(password) < 8:
        return web.json_response({"error": {"message": "password too short"}}, status=400)
    sim.password = password
    sim.password_changes += 1
    return web.Response(status=204)


async def systems(request: web.Request) -> web.Response:
    return web.json_response({"Members": [{"@odata.id": SYSTEM}], "Members@odata.count": 1})


async def system(request: web.Request) -> web.Response:
    return web.json_response(request.app[SIM].system(), headers={"ETag": 'W/"1"'})


async def patch_system(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    boot = (await request.json()).get("Boot", {})
    sim.patches.append(boot)
    allowed = sim.system()["Boot"]
    if boot.get("BootSourceOverrideEnabled") not in (
            None, *allowed["BootSourceOverrideEnabled@Redfish.AllowableValues"]):
        return web.json_response({"error": {"message": "bad Enabled"}}, status=400)
    if boot.get("BootSourceOverrideTarget") not in (
            None, *allowed["BootSourceOverrideTarget@Redfish.AllowableValues"]):
        return web.json_response({"error": {"message": "bad Target"}}, status=400)
    if "HttpBootUri" in boot and not (sim.http_boot_uri_supported
                                      and sim.http_boot_uri_writable):
        return web.json_response({"error": {"message": "no HttpBootUri"}}, status=400)
    sim.target = boot.get("BootSourceOverrideTarget", sim.target)
    sim.enabled = boot.get("BootSourceOverrideEnabled", sim.enabled)
    sim.mode = boot.get("BootSourceOverrideMode", sim.mode)
    sim.http_boot_uri = boot.get("HttpBootUri", sim.http_boot_uri)
    return web.Response(status=204)


async def reset(request: web.Request) -> web.Response:
    sim = request.app[SIM]
    kind = (await request.json()).get("ResetType")
    sim.resets.append(kind)
    target = {"On": "On", "ForceOff": "Off", "GracefulShutdown": "Off",
              "ForceRestart": "On"}.get(kind)
    if target is None:
        return web.json_response({"error": {"message": f"bad ResetType {kind}"}}, status=400)
    if kind == "ForceRestart":
        sim.power = "Off"
    request.app[TASKS].add(asyncio.create_task(sim.apply_power(target)))
    return web.Response(status=204)


TASKS = web.AppKey("tasks", set)


def make_app(sim: RedfishSim) -> web.Application:
    app = web.Application(middlewares=[_gate])
    app[SIM] = sim
    app[TASKS] = set()
    app.router.add_get("/redfish/v1", root)
    app.router.add_get("/redfish/v1/", root)
    app.router.add_post(SESSIONS, login)
    app.router.add_delete(SESSIONS + "/{sid}", logout)
    app.router.add_get("/redfish/v1/AccountService", account_service)
    app.router.add_get(ACCOUNTS, accounts)
    app.router.add_get(ACCOUNTS + "/{aid}", account)
    app.router.add_patch(ACCOUNTS + "/{aid}", patch_account)
    app.router.add_get("/redfish/v1/Systems", systems)
    app.router.add_get(SYSTEM, system)
    app.router.add_patch(SYSTEM, patch_system)
    app.router.add_post(f"{SYSTEM}/Actions/ComputerSystem.Reset", reset)
    return app


async def _serve(count: int, latency_s: float) -> None:
    sims = [RedfishSim(latency_s=latency_s) for _ in range(count)]
    runners, ports = [], []
    for sim in sims:
        runner = web.AppRunner(make_app(sim), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=16)
        await site.start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response({
            "logins": sum(s.logins for s in sims), "logouts": sum(s.logouts for s in sims),
            "live_sessions": sum(len(s.tokens) for s in sims),
            "requests": sum(s.requests for s in sims),
            "max_in_flight_per_bmc": max(s.max_in_flight for s in sims),
            "bmcs": {port: {"power": s.power, "requests": s.requests, "logins": s.logins}
                     for port, s in zip(ports, sims, strict=True)}})

    control = web.Application()
    control.router.add_get("/stats", stats)
    runner = web.AppRunner(control, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(json.dumps({"ports": ports, "control": runner.addresses[0][1]}), flush=True)
    await asyncio.Event().wait()


class SimRedfish:
    """``python -m tests.sim.redfish`` as a child process (its own event loop, as a real BMC
    is its own machine): ``urls`` once every BMC listens; stopped by PID."""

    def __init__(self, *, count: int, latency_s: float = 0.0) -> None:
        self._argv = [sys.executable, "-m", "tests.sim.redfish", "--count", str(count),
                      "--latency-s", str(latency_s)]
        self.proc: subprocess.Popen[str] | None = None
        self.ports: list[int] = []
        self._control = 0
        self.user, self.password = "admin", "password"

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def __enter__(self) -> SimRedfish:
        self.proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parents[2])
        ready = self.proc.stdout.readline() if self.proc.stdout else ""
        if not ready:
            self.stop()
            raise RuntimeError(f"redfish simulator exited with {self.proc.wait()}")
        info = json.loads(ready)
        self.ports, self._control = info["ports"], info["control"]
        return self

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self._control}/stats",
                                    timeout=10) as response:
            return dict(json.loads(response.read()))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--latency-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.count + 256)),
                                                hard))
    asyncio.run(_serve(args.count, args.latency_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
