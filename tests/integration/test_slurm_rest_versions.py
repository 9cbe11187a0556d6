"""API version negotiation and the v0.0.40+ node writes of ``RestSlurm``.

Debian 12 ships only Slurm 22.05 (API v0.0.36-38, tested against the real slurmrestd in
test_slurm.py). Newer servers are replayed here: an aiohttp app on loopback that answers with
the published v0.0.42/v0.0.44 node documents (tests/fixtures/slurm/README.md), 404s the
versions it does not offer exactly as slurmrestd does (the recorded plain-text 404), and applies
``POST``/``DELETE /slurm/vX/node/NAME`` the way the v0.0.40+ OpenAPI describes (``state`` a list
of flags, ``reason``). No real peer can produce these versions on this platform.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from provisioner.slurm.model import SlurmAuthFailed, SlurmRejected
from provisioner.slurm.rest import RestSlurm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
NOT_FOUND = (FIXTURES / "rest-v0.0.39-ping-404.txt").read_text()
TOKEN = "jwt-for-tests"
DOCS = {"v0.0.42": "rest-v0.0.42-node-idle.json", "v0.0.44": "rest-v0.0.44-node-down.json",
        "v0.0.38": "rest-v0.0.38-nodes-idle.json"}


class Replay:
    def __init__(self, offered: list[str], *, listing: bool = True) -> None:
        self.offered = offered
        self.listing = listing
        self.docs = {v: json.loads((FIXTURES / DOCS[v]).read_text()) for v in offered}
        self.requests: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/openapi/v3", self.openapi)
        app.router.add_route("*", "/slurm/{version}/{tail:.*}", self.slurm)
        return app

    async def openapi(self, request: web.Request) -> web.Response:
        if not self.listing:
            return web.Response(status=404, text=NOT_FOUND)
        return web.json_response({"paths": {f"/slurm/{v}/ping": {} for v in self.offered}})

    async def slurm(self, request: web.Request) -> web.Response:
        version, tail = request.match_info["version"], request.match_info["tail"]
        self.requests.append(f"{request.method} {request.path}")
        if request.headers.get("X-SLURM-USER-TOKEN") != TOKEN:
            return web.Response(status=401, text="Authentication failure")
        if version not in self.offered:
            return web.Response(status=404, text=NOT_FOUND)
        doc = self.docs[version]
        if tail == "ping":
            return web.json_response({"pings": [{"hostname": "ctld", "pinged": "UP"}],
                                      "errors": []})
        if tail == "nodes":
            return web.json_response(doc)
        name = tail.removeprefix("node/")
        found = [n for n in doc["nodes"] if n["name"] == name]
        if not found:
            return web.json_response({"nodes": [], "errors": [{
                "description": "Invalid node name specified", "error_number": 2018,
                "error": "Invalid node name specified"}]}, status=404)
        if request.method == "POST":
            self.update(found[0], await request.json())
        elif request.method == "DELETE":
            doc["nodes"].remove(found[0])
        return web.json_response({**doc, "nodes": found})

    @staticmethod
    def update(node: dict[str, Any], body: dict[str, Any]) -> None:
        assert set(body) <= {"state", "reason"}, body
        assert isinstance(body["state"], list), body
        if "DRAIN" in body["state"]:
            node["state"] = [*node["state"], "DRAIN"]
            node["reason"] = body["reason"]
        if "RESUME" in body["state"]:
            node["state"] = [s for s in node["state"] if s != "DRAIN"]
            node["reason"] = ""


@pytest.fixture
async def replay() -> AsyncIterator[Callable[..., Any]]:
    servers: list[TestServer] = []
    clients: list[RestSlurm] = []

    async def start(offered: list[str], *, listing: bool = True,
                    token: str = TOKEN) -> tuple[Replay, RestSlurm]:
        state = Replay(offered, listing=listing)
        server = TestServer(state.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        client = RestSlurm(str(server.make_url("/")), user="root", token=SecretStr(token))
        clients.append(client)
        return state, client

    yield start
    for client in clients:
        await client.aclose()
    for server in servers:
        await server.close()


@pytest.mark.parametrize(("offered", "listing", "chosen"), [
    (["v0.0.42", "v0.0.44"], True, "v0.0.44"),
    (["v0.0.42"], True, "v0.0.42"),
    (["v0.0.42"], False, "v0.0.42"),      # no listing: probe newest first
    (["v0.0.38"], False, "v0.0.38"),
])
async def test_negotiates_the_newest_offered_version(
        replay: Callable[..., Any], offered: list[str], listing: bool, chosen: str) -> None:
    state, client = await replay(offered, listing=listing)
    assert await client.version() == chosen
    nodes = await client.nodes()
    assert nodes and all(n.name for n in nodes)
    assert state.requests[-1] == f"GET /slurm/{chosen}/nodes"
    if listing:  # the listing spares the probes
        assert state.requests[0] == f"GET /slurm/{chosen}/ping"


async def test_v0042_drain_resume_delete_over_rest(replay: Callable[..., Any]) -> None:
    state, client = await replay(["v0.0.42"])
    await client.drain("host1", "provisioner: swap PSU")
    node = await client.node("host1")
    assert node is not None and node.drained and node.reason == "provisioner: swap PSU"
    await client.resume("host1")
    node = await client.node("host1")
    assert node is not None and not node.draining
    await client.resume("host1")  # not drained: no request
    assert state.requests.count("POST /slurm/v0.0.42/node/host1") == 2
    assert await client.node("nope") is None
    assert await client.delete("host1") is True
    assert await client.delete("host1") is False
    assert await client.nodes() == []


async def test_server_upgrade_is_renegotiated(replay: Callable[..., Any]) -> None:
    state, client = await replay(["v0.0.42", "v0.0.44"])
    assert await client.version() == "v0.0.44"
    state.offered.remove("v0.0.44")  # slurmrestd restarted without the v0.0.44 plugin
    [node] = await client.nodes()
    assert node.name == "host1" and await client.version() == "v0.0.42"


async def test_refusals(replay: Callable[..., Any]) -> None:
    _, bad_token = await replay(["v0.0.42"], token="wrong")
    with pytest.raises(SlurmAuthFailed, match="HTTP 401"):
        await bad_token.nodes()
    _, too_old = await replay(["v0.0.38"])
    with pytest.raises(SlurmRejected, match="cannot drain a node and no scontrol"):
        await too_old.drain("gpu-node-01", "x")
    state, none_known = await replay([], listing=True)
    with pytest.raises(SlurmRejected, match="offers none of the API versions"):
        await none_known.nodes()
    assert state.requests == []  # the empty listing spared every probe

