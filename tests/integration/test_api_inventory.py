"""Inventory import (CSV and JSON) and the OpenAPI document, through the REST API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from provisioner.domain import Role
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.test_api import NODES, SECRET, Api, running_api

IMPORT = "/api/v1/inventory/import"
CSV_HEADERS = {"Content-Type": "text/csv"}

FLEET_CSV = f"""\
serial,hostname,rack,position,profile,macs,bmc_driver,bmc_address,bmc_port,bmc_username,bmc_password
SN-100,gpu-100,r1,u1,gpu-worker,52:54:00:00:01:00 52:54:00:00:01:01,fake,bmc-100,623,admin,{SECRET}
SN-101,gpu-101,r1,u2,gpu-worker,52-54-00-00-01-02;52-54-00-00-01-03,,,,,
SN-102,,r2,,,,,,,,
"""


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


async def _import_csv(api: Api, text: str, **kw: Any) -> Any:
    return await api.call("POST", IMPORT, data=text.encode(), headers=CSV_HEADERS, **kw)


async def test_csv_import_enrolls_then_reimport_updates(api: Api) -> None:
    reply = await _import_csv(api, FLEET_CSV)
    assert reply.status == 200, reply.text
    report = reply.body
    assert len(report["created"]) == 3 and report["updated"] == [] and report["errors"] == []
    listed = (await api.get(NODES)).body
    assert [n["serial"] for n in listed["items"]] == ["SN-100", "SN-101", "SN-102"]
    assert {n["state"] for n in listed["items"]} == {"enrolled"}
    first = (await api.get(f"{NODES}/SN-100")).body
    assert first["macs"] == ["52:54:00:00:01:00", "52:54:00:00:01:01"]
    assert first["bmc"] == {"driver": "fake", "address": "bmc-100", "port": 623,
                            "username": "admin", "password_set": True}
    assert (await api.get(f"{NODES}/52:54:00:00:01:03")).body["hostname"] == "gpu-101"
    history = (await api.get(f"{NODES}/SN-102/history")).body["items"]
    assert history[0]["actor"] == "token:operator-tok"

    again = await _import_csv(api, "serial,rack,profile\nSN-102,r9,cpu-worker\nSN-103,r9,\n")
    assert again.status == 200
    assert again.body["updated"] == [report["created"][2]] and len(again.body["created"]) == 1
    moved = (await api.get(f"{NODES}/SN-102")).body
    assert (moved["rack"], moved["profile"], moved["state"]) == ("r9", "cpu-worker", "enrolled")


@pytest.mark.parametrize("wrap", [False, True], ids=["list", "machines-object"])
async def test_json_import(api: Api, wrap: bool) -> None:
    machines = [{"serial": "J-1", "hostname": "json-1", "macs": ["52:54:00:00:02:01"],
                 "bmc_driver": "redfish", "bmc_address": "10.1.0.1", "bmc_password": SECRET},
                {"serial": "J-2", "macs": "52:54:00:00:02:02 52:54:00:00:02:03",
                 "rack": "r3", "hostname": None, "bmc_driver": "redfish",
                 "bmc_address": "10.1.0.2", "bmc_port": "8443"}]
    body: object = {"machines": machines} if wrap else machines
    reply = await api.post(IMPORT, body)
    assert reply.status == 200, reply.text
    assert len(reply.body["created"]) == 2
    second = (await api.get(f"{NODES}/J-2")).body
    assert second["macs"] == ["52:54:00:00:02:02", "52:54:00:00:02:03"]
    assert second["rack"] == "r3" and second["hostname"] is None
    assert second["bmc"]["port"] == 8443 and second["bmc"]["password_set"] is False
    again = (await api.post(IMPORT, body)).body  # the same rows: nothing to write
    assert again["updated"] == [] and again["created"] == []
    assert [(c["node"], c["action"]) for c in again["changes"]] == [
        (node, "unchanged") for node in reply.body["created"]]


async def test_a_bad_row_rejects_the_whole_import(api: Api) -> None:
    text = ("serial,hostname,macs,bmc_driver,bmc_address,bmc_port\n"
            "SN-1,ok-1,52:54:00:00:03:01,,,\n"
            "SN-2,-bad-,,,,\n"
            "SN-3,ok-3,zz:zz,,,\n"
            "SN-4,ok-4,,ipmi,,\n"
            ",ok-5,,,,\n"
            "SN-1,ok-6,,,,\n"
            "SN-7,ok-7,,ipmi,10.0.0.7,99999\n"
            "SN-8,ok-8,,,,,surplus\n")
    reply = await _import_csv(api, text)
    assert reply.status == 422
    errors = {(error["row"], error["loc"]) for error in reply.body["errors"]}
    assert errors == {(2, "hostname"), (3, "macs.0"), (4, "(body)"), (5, "serial"),
                      (7, "bmc_port"), (8, "(row)")}
    assert (await api.get(NODES)).body["total"] == 0


async def test_duplicates_within_an_import_are_422(api: Api) -> None:
    reply = await api.post(IMPORT, [
        {"serial": "D-1", "hostname": "dup", "macs": ["aa:aa:aa:aa:aa:aa"]},
        {"serial": "D-1"},
        {"serial": "D-3", "hostname": "DUP"},
        {"serial": "D-4", "macs": ["AAAA.AAAA.AAAA"]},
    ])
    assert reply.status == 422
    errors = {(error["row"], error["loc"]) for error in reply.body["errors"]}
    assert errors == {(2, "serial"), (3, "hostname"), (4, "macs")}
    assert (await api.get(NODES)).body["total"] == 0


async def test_import_conflicting_with_an_existing_node_is_reported(api: Api) -> None:
    await api.enroll(serial="OLD-1", hostname="taken")
    reply = await api.post(IMPORT, [{"serial": "NEW-1", "hostname": "taken"},
                                    {"serial": "NEW-2"}])
    assert reply.status == 200
    assert len(reply.body["created"]) == 1 and len(reply.body["errors"]) == 1
    assert "NEW-1" in reply.body["errors"][0]


@pytest.mark.parametrize(("content_type", "data", "status"), [
    ("text/csv", "hostname,rack\nx,r1\n", 422),
    ("text/csv", "serial,colour\nS,red\n", 422),
    ("text/csv", "serial,serial\nS,T\n", 422),
    ("text/csv", "", 422),
    ("text/csv", b"serial\n\xff\xfe", 400),
    ("text/csv", 'serial\n"unterminated', 400),
    ("application/json", '{"rows": []}', 422),
    ("application/json", '"serial"', 422),
    ("application/json", "[{", 400),
    ("application/xml", "<machines/>", 415),
], ids=["no-serial-column", "unknown-column", "column-twice", "empty-csv", "not-utf8",
        "unterminated-quote", "wrong-key", "scalar", "bad-json", "xml"])
async def test_import_malformed_bodies(api: Api, content_type: str, data: str | bytes,
                                       status: int) -> None:
    reply = await api.call("POST", IMPORT, data=data, headers={"Content-Type": content_type})
    assert reply.status == status


async def test_import_needs_operator(api: Api) -> None:
    reply = await _import_csv(api, FLEET_CSV, role=Role.VIEWER)
    assert reply.status == 403
    assert (await api.get(NODES)).body["total"] == 0


async def test_empty_import_is_a_no_op(api: Api) -> None:
    reply = await _import_csv(api, "serial,hostname\n")
    assert reply.status == 200
    assert reply.body == {"created": [], "updated": [], "errors": [], "dry_run": False,
                          "changes": []}


# -- OpenAPI --------------------------------------------------------------------------------


async def test_openapi_document_describes_every_route(api: Api) -> None:
    reply = await api.get("/api/v1/openapi.json", role=None)
    assert reply.status == 200
    doc = json.loads(reply.text)
    assert doc["openapi"].startswith("3.1")
    paths = doc["paths"]
    assert set(paths) >= {"/api/v1/nodes", "/api/v1/nodes/{id}", "/api/v1/nodes/{id}/history",
                          "/api/v1/nodes/{id}/actions/{action}", "/api/v1/inventory/import",
                          "/healthz", "/metrics"}
    assert set(paths["/api/v1/nodes"]) == {"get", "post"}
    enroll = paths["/api/v1/nodes"]["post"]
    assert enroll["security"] == [{"bearer": []}]
    assert {"201", "401", "403", "409", "413", "422"} <= set(enroll["responses"])
    listing = paths["/api/v1/nodes"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {
        "state", "rack", "profile", "maintenance", "q", "limit", "offset", "include"}
    assert paths["/healthz"]["get"]["security"] == []
    schemas = doc["components"]["schemas"]
    assert {"EnrollRequest", "NodeOut", "NodeDetailOut", "Problem", "ImportRow"} <= set(schemas)
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    refs = [ref for ref in _refs(doc) if ref.startswith("#/components/schemas/")]
    assert refs and all(ref.rsplit("/", 1)[1] in schemas for ref in refs)
    assert (await api.get("/openapi.json", role=None)).text == reply.text


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []
