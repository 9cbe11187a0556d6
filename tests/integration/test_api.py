"""The REST API on a real 127.0.0.1 socket against a real SQLite store and the fake drivers.

``running_api`` is shared by the other ``test_api_*.py`` files: it wires a conductor (with
the metrics observer), the app, a client and one token per role, records every response
body, and fails the test if the BMC password ``SECRET`` ever appears in one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from provisioner.api.app import make_app
from provisioner.config import ApiSettings, LifecycleSettings
from provisioner.domain import Role
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import NodeState
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.topology_live.live import LiveTopology
from tests.conftest import fake_ports

SECRET = "Sup3r-secret-BMC-pw"
NODES = "/api/v1/nodes"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    text: str

    @property
    def body(self) -> Any:
        return json.loads(self.text)


@dataclass
class Api:
    client: Any
    store: Store
    conductor: Conductor
    tokens: dict[Role, str]
    seen: list[str] = field(default_factory=list)

    async def call(self, method: str, path: str, *, role: Role | None = Role.OPERATOR,
                   body: object = None, data: bytes | str | None = None,
                   headers: Mapping[str, str] | None = None) -> Reply:
        sent = dict(headers or {})
        if role is not None:
            sent.setdefault("Authorization", f"Bearer {self.tokens[role]}")
        if body is not None:
            data = json.dumps(body)
            sent.setdefault("Content-Type", "application/json")
        async with self.client.request(method, path, data=data, headers=sent) as resp:
            reply = Reply(resp.status, resp.headers, await resp.text())
        self.seen.append(reply.text)
        assert reply.status < 500, reply.text
        if reply.status >= 400:
            assert reply.headers["Content-Type"].startswith("application/problem+json")
            assert reply.body["status"] == reply.status and reply.body["detail"]
        return reply

    async def get(self, path: str, *, role: Role | None = Role.VIEWER) -> Reply:
        return await self.call("GET", path, role=role)

    async def post(self, path: str, body: object = None, **kw: Any) -> Reply:
        return await self.call("POST", path, body=body, **kw)

    async def enroll(self, **fields: object) -> dict[str, Any]:
        reply = await self.post(NODES, fields)
        assert reply.status == 201, reply.text
        created: dict[str, Any] = reply.body
        return created


@asynccontextmanager
async def running_api(aiohttp_client: Any, store: Store, world: SimWorld, *,
                      settings: ApiSettings | None = None,
                      delay_s: float = 0.0, ports: Ports | None = None,
                      topology: LiveTopology | None = None,
                      **app_kw: Any) -> AsyncIterator[Api]:
    metrics = Metrics()
    lifecycle = LifecycleSettings(auto_inspect=False, auto_deploy=False)
    conductor = Conductor(store.nodes, ports or fake_ports(world, delay_s=delay_s), lifecycle,
                          observer=metrics.observe_transition)
    app = make_app(conductor=conductor, nodes=store.nodes, tokens=store.tokens,
                   metrics=metrics, settings=settings or ApiSettings(), topology=topology,
                   health=HealthFindings(store.findings, conductor), **app_kw)
    client = await aiohttp_client(app)
    tokens = {role: (await store.tokens.create(f"{role}-tok", role))[1]
              for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN, Role.AGENT)}
    api = Api(client, store, conductor, tokens)
    try:
        yield api
    finally:
        await conductor.stop()
    assert not [text for text in api.seen if SECRET in text], "BMC password in a response"


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


# -- enroll ---------------------------------------------------------------------------------


async def test_enroll_returns_201_with_location_and_node(api: Api) -> None:
    reply = await api.post(NODES, {
        "hostname": "GPU-001", "serial": "SN1", "macs": ["AA-BB-CC-00-11-22"],
        "profile": "gpu-worker", "rack": "r1", "position": "u12",
        "bmc": {"driver": "fake", "address": "10.0.0.1", "port": 623, "username": "root",
                "password": SECRET}})
    assert reply.status == 201
    node = reply.body
    assert reply.headers["Location"] == f"{NODES}/{node['id']}"
    assert node["hostname"] == "gpu-001" and node["serial"] == "SN1"
    assert node["macs"] == ["aa:bb:cc:00:11:22"]
    assert node["state"] == "enrolled" and node["maintenance"] is False
    assert node["bmc"] == {"driver": "fake", "address": "10.0.0.1", "port": 623,
                           "username": "root", "password_set": True}
    assert node["created_at"].endswith("Z") or node["created_at"].endswith("+00:00")
    shown = await api.get(reply.headers["Location"])
    assert shown.status == 200 and shown.body["id"] == node["id"]


async def test_enroll_duplicate_serial_is_409(api: Api) -> None:
    await api.enroll(serial="DUP-1")
    reply = await api.post(NODES, {"serial": "DUP-1", "hostname": "other"})
    assert reply.status == 409
    assert "serial" in reply.body["detail"]


@pytest.mark.parametrize(("body", "field_name"), [
    ({"serial": "S", "macs": ["not-a-mac"]}, "macs.0"),
    ({"serial": "S", "colour": "red"}, "colour"),
    ({"profile": "gpu"}, "(body)"),
    ({"hostname": "-bad-"}, "hostname"),
    ({"serial": "S", "bmc": {"driver": "telnet", "address": "x"}}, "bmc.driver"),
    ({"serial": "S", "bmc": {"driver": "ipmi", "address": "x", "port": 70000}}, "bmc.port"),
    ({"serial": "S", "macs": ["aa:bb:cc:dd:ee:ff", "AABBCCDDEEFF"]}, "macs"),
    (["serial"], "(body)"),
], ids=["bad-mac", "unknown-field", "no-identity", "bad-hostname", "bad-driver", "bad-port",
        "duplicate-mac", "not-an-object"])
async def test_enroll_invalid_body_is_422_naming_the_field(
        api: Api, body: object, field_name: str) -> None:
    reply = await api.post(NODES, body)
    assert reply.status == 422
    assert field_name in [error["loc"] for error in reply.body["errors"]]
    assert (await api.get(NODES)).body["total"] == 0


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe\x00", b"", b"[" * 100_000],
                         ids=["syntax", "not-utf8", "empty", "deep"])
async def test_enroll_malformed_json_is_400(api: Api, data: bytes) -> None:
    reply = await api.call("POST", NODES, data=data,
                           headers={"Content-Type": "application/json"})
    assert reply.status == 400
    assert "JSON" in reply.body["detail"]


async def test_oversized_body_is_413(aiohttp_client: Any, store: Store, world: SimWorld) -> None:
    async with running_api(aiohttp_client, store, world,
                           settings=ApiSettings(max_body_bytes=1024)) as small:
        reply = await small.post(NODES, {"serial": "S", "hostname": "x" * 2000})
        assert reply.status == 413
        assert (await small.post(NODES, {"serial": "S"})).status == 201


# -- list and show --------------------------------------------------------------------------


async def _fleet(api: Api) -> list[dict[str, Any]]:
    specs = [
        {"hostname": "gpu-a1", "serial": "SN-A1", "rack": "r1", "profile": "gpu-worker",
         "macs": ["52:54:00:aa:00:01"]},
        {"hostname": "gpu-a2", "serial": "SN-A2", "rack": "r1", "profile": "cpu-worker",
         "macs": ["52:54:00:aa:00:02"]},
        {"hostname": "gpu-b1", "serial": "SN-B1", "rack": "r2", "profile": "gpu-worker",
         "macs": ["52:54:00:bb:00:01"]},
    ]
    return [await api.enroll(**spec) for spec in specs]


def _hostnames(reply: Reply) -> list[str]:
    return [item["hostname"] for item in reply.body["items"]]


@pytest.mark.parametrize(("query", "expected"), [
    ("", ["gpu-a1", "gpu-a2", "gpu-b1"]),
    ("?rack=r1", ["gpu-a1", "gpu-a2"]),
    ("?profile=gpu-worker", ["gpu-a1", "gpu-b1"]),
    ("?rack=r1&profile=gpu-worker", ["gpu-a1"]),
    ("?state=enrolled", ["gpu-a1", "gpu-a2", "gpu-b1"]),
    ("?state=inspected", []),
    ("?maintenance=true", ["gpu-a2"]),
    ("?maintenance=false", ["gpu-a1", "gpu-b1"]),
    ("?q=a2", ["gpu-a2"]),
    ("?q=SN-B", ["gpu-b1"]),
    ("?q=aa:00", ["gpu-a1", "gpu-a2"]),
    ("?q=BB:00:01", ["gpu-b1"]),
    ("?q=nothing", []),
], ids=["all", "rack", "profile", "rack+profile", "state", "state-none", "maintenance",
        "not-maintenance", "q-hostname", "q-serial", "q-mac", "q-mac-upper", "q-none"])
async def test_list_filters(api: Api, query: str, expected: list[str]) -> None:
    nodes = await _fleet(api)
    reply = await api.post(f"{NODES}/{nodes[1]['id']}/actions/maintenance-on",
                           {"reason": "bad fan"})
    assert reply.status == 202
    reply = await api.get(NODES + query)
    assert reply.status == 200
    assert _hostnames(reply) == expected
    assert reply.body["total"] == len(expected)


async def test_list_paginates(api: Api) -> None:
    await _fleet(api)
    first = await api.get(f"{NODES}?limit=2")
    assert first.body | {"items": None} == {"items": None, "total": 3, "limit": 2, "offset": 0}
    assert _hostnames(first) == ["gpu-a1", "gpu-a2"]
    second = await api.get(f"{NODES}?limit=2&offset=2")
    assert _hostnames(second) == ["gpu-b1"] and second.body["total"] == 3
    beyond = await api.get(f"{NODES}?offset=10")
    assert beyond.body["items"] == [] and beyond.body["total"] == 3
    assert (await api.get(NODES)).body["limit"] == 100


@pytest.mark.parametrize("query", [
    "limit=0", "limit=abc", "limit=1001", "offset=-1", "maintenance=perhaps", "state=flying",
    "sort=hostname",
], ids=["limit-0", "limit-text", "limit-over-max", "offset-negative", "maintenance-text",
        "state-unknown", "unknown-param"])
async def test_list_bad_query_is_422_with_reason(api: Api, query: str) -> None:
    reply = await api.get(f"{NODES}?{query}")
    assert reply.status == 422
    # a repeatable filter names the value at fault (``state.0``)
    assert query.split("=")[0] in [error["loc"].split(".")[0] for error in reply.body["errors"]]


async def test_show_by_id_hostname_serial_and_mac(api: Api) -> None:
    node = await api.enroll(hostname="gpu-x", serial="SN-X", macs=["52:54:00:12:34:56"])
    for key in (node["id"], "gpu-x", "SN-X", "52:54:00:12:34:56", "52-54-00-12-34-56"):
        reply = await api.get(f"{NODES}/{key}")
        assert reply.status == 200, key
        detail = reply.body
        assert detail["id"] == node["id"]
    assert detail["facts"] == {} and detail["checkpoint"] == []
    assert detail["step_status"] is None and detail["last_error"] == ""
    assert detail["allowed_actions"] == ["inspect", "retire", "register-running",
                                         "maintenance-on"]
    assert [h["event"] for h in detail["history"]] == ["enroll"]


@pytest.mark.parametrize("key", ["missing", "%FF", "a%00b"], ids=["unknown", "bad-utf8", "nul"])
async def test_show_unknown_is_404(api: Api, key: str) -> None:
    reply = await api.get(f"{NODES}/{key}")
    assert reply.status == 404
    assert reply.body["title"] == "Not Found"


# -- auth -----------------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer nope", "Basic dXNlcjpwdw==",
                                           "Bearer", "Bearer caf\u00e9"],
                         ids=["missing", "wrong-token", "basic", "empty", "non-ascii"])
async def test_no_valid_token_is_401_with_challenge(api: Api, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    for method, path in (("GET", NODES), ("POST", NODES), ("GET", f"{NODES}/x/history"),
                         ("POST", "/api/v1/inventory/import"), ("GET", "/api/v1/nope")):
        reply = await api.call(method, path, role=None, headers=headers)
        assert reply.status == 401, (method, path)
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")


async def test_viewer_reads_but_may_not_act(api: Api) -> None:
    node = await api.enroll(serial="SN-V")
    assert (await api.get(f"{NODES}/{node['id']}", role=Role.VIEWER)).status == 200
    reply = await api.post(f"{NODES}/{node['id']}/actions/inspect", role=Role.VIEWER)
    assert reply.status == 403
    assert "operator" in reply.body["detail"]
    assert (await api.post(NODES, {"serial": "SN-W"}, role=Role.VIEWER)).status == 403
    assert (await api.post(NODES, {"serial": "SN-W"}, role=Role.ADMIN)).status == 201
    assert (await api.get(NODES, role=Role.AGENT)).status == 403


async def test_public_endpoints_need_no_token(api: Api) -> None:
    health = await api.get("/healthz", role=None)
    assert health.status == 200 and health.body == {"status": "ok"}
    assert (await api.get("/metrics", role=None)).status == 200
    assert (await api.get("/openapi.json", role=None)).status == 200
    assert (await api.get("/api/v1/openapi.json", role=None)).status == 200


# -- errors ---------------------------------------------------------------------------------


async def test_unknown_route_and_method_are_problems(api: Api) -> None:
    assert (await api.get("/api/v1/nope")).status == 404
    reply = await api.call("DELETE", NODES)
    assert reply.status == 405
    assert {m.strip() for m in reply.headers["Allow"].split(",")} == {"GET", "POST"}


async def test_unexpected_failure_is_500_logged_once_without_internals(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    node = await api.enroll(serial="SN-500")
    api.store.pool.shutdown(wait=True)  # a real failure: the store can take no more work
    with caplog.at_level(logging.ERROR, logger="provisioner.api"):
        async with api.client.get(f"{NODES}/{node['id']}",
                                  headers={"Authorization": "Bearer x"}) as resp:
            assert resp.status == 500
            assert resp.headers["Content-Type"].startswith("application/problem+json")
            problem = await resp.json(content_type=None)
    assert problem == {"type": "about:blank", "title": "Internal Server Error", "status": 500,
                       "detail": "internal error; see the daemon log"}
    errors = [r for r in caplog.records if r.name.startswith("provisioner.api")]
    assert len(errors) == 1 and errors[0].exc_info is not None


# -- secrets --------------------------------------------------------------------------------


async def test_bmc_password_is_never_returned_or_logged(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    node = await api.enroll(serial="SN-P", hostname="gpu-p", bmc={
        "driver": "fake", "address": "gpu-p-bmc", "username": "admin", "password": SECRET})
    key = node["id"]
    await api.post(NODES, {"serial": "SN-P", "bmc": {"driver": "fake", "address": "a",
                                                      "password": SECRET}})  # 409
    await api.post(NODES, {"serial": "SN-Q", "bmc": {"driver": "fake", "address": "a",
                                                      "password": SECRET, "extra": 1}})  # 422
    await api.post(NODES, {"serial": "SN-R", "bmc": {"driver": "nope", "address": "a",
                                                      "password": SECRET}})  # 422
    for path in (NODES, f"{NODES}/{key}", f"{NODES}/{key}/history", f"{NODES}?q=gpu-p"):
        assert (await api.get(path)).status == 200
    await api.post(f"{NODES}/{key}/actions/inspect")
    assert len(api.seen) >= 8
    assert not [text for text in api.seen if SECRET in text]
    assert SECRET not in caplog.text
    assert (await api.get(f"{NODES}/{key}")).body["bmc"]["password_set"] is True


async def test_state_filter_values_are_the_lifecycle_states(api: Api) -> None:
    for state in NodeState:
        assert (await api.get(f"{NODES}?state={state}")).status == 200
