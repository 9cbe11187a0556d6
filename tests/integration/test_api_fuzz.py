"""Property: no input makes the API answer 5xx (each test asserts it on its replies;
``Api.call`` checks it on every reply too, and that a refusal is problem+json)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.domain import Role
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.test_api import NODES, Api, running_api

IMPORT = "/api/v1/inventory/import"
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1)
texts = st.text(max_size=40) | surrogates | st.sampled_from(
    ["", " ", "gpu-01", "52:54:00:00:00:01", "AA-BB-CC-DD-EE-FF", "ipmi", "fake", "-x-",
     "a" * 300, "\x00", "1" * 5000])
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(texts, inner, max_size=4), max_leaves=12)
ENROLL_KEYS = ("hostname", "serial", "macs", "profile", "rack", "position", "bmc")
IMPORT_KEYS = ("serial", "hostname", "rack", "position", "profile", "macs", "bmc_driver",
               "bmc_address", "bmc_port", "bmc_username", "bmc_password")
bmcs = st.fixed_dictionaries({}, optional={k: json_values for k in (
    "driver", "address", "port", "username", "password")})
enroll_bodies = st.fixed_dictionaries(
    {}, optional={k: (bmcs if k == "bmc" else json_values) for k in ENROLL_KEYS})
import_rows = st.fixed_dictionaries({}, optional={k: json_values for k in IMPORT_KEYS})
content_types = st.sampled_from(["application/json", "text/csv", "text/plain",
                                 "application/octet-stream", "multipart/form-data", "", "\u00e9"])


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


@FUZZ
@given(data=st.binary(max_size=300), content_type=content_types)
async def test_random_bytes_never_5xx(api: Api, data: bytes, content_type: str) -> None:
    for path in (NODES, IMPORT, f"{NODES}/x/actions/inspect"):
        reply = await api.call("POST", path, data=data, headers={"Content-Type": content_type})
        assert reply.status < 500, reply.text


@FUZZ
@given(body=enroll_bodies | json_values)
async def test_random_enroll_json_never_5xx(api: Api, body: object) -> None:
    reply = await api.call("POST", NODES, data=json.dumps(body),
                           headers={"Content-Type": "application/json"})
    if reply.status == 201:
        node = reply.body
        assert (await api.get(f"{NODES}/{node['id']}")).status == 200
        action = await api.post(f"{NODES}/{node['id']}/actions/maintenance-on", body)
        assert action.status in (202, 400, 413, 422)


@FUZZ
@given(rows=st.lists(import_rows | json_values, max_size=4), wrap=st.booleans())
async def test_random_import_json_never_5xx(api: Api, rows: list[object], wrap: bool) -> None:
    body = {"machines": rows} if wrap else rows
    reply = await api.call("POST", IMPORT, data=json.dumps(body),
                           headers={"Content-Type": "application/json"})
    assert reply.status < 500, reply.text


@FUZZ
@given(header=st.lists(st.sampled_from([*IMPORT_KEYS, "junk", ""]), max_size=6),
       cells=st.lists(st.lists(texts, max_size=7), max_size=4),
       separator=st.sampled_from([",", ";", "\t"]))
async def test_random_import_csv_never_5xx(api: Api, header: list[str],
                                           cells: list[list[str]], separator: str) -> None:
    lines = [separator.join(header), *(separator.join(row) for row in cells)]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    reply = await api.call("POST", IMPORT, data=data, headers={"Content-Type": "text/csv"})
    assert reply.status < 500, reply.text


@FUZZ
@given(query=st.dictionaries(st.sampled_from(["state", "rack", "profile", "maintenance", "q",
                                              "limit", "offset", "x"]), texts, max_size=4),
       key=texts)
async def test_random_reads_never_5xx(api: Api, query: dict[str, str], key: str) -> None:
    clean = {k: v.encode("utf-8", "replace").decode() for k, v in query.items()}
    async with api.client.get(NODES, params=clean, headers=_viewer(api)) as resp:
        # 400: aiohttp's parser refuses request lines over 8 KiB before the app runs
        assert resp.status in (200, 400, 422), await resp.text()
    path = f"{NODES}/{key.encode('utf-8', 'replace').decode()}"
    async with api.client.get(path, headers=_viewer(api)) as resp:
        assert resp.status < 500, await resp.text()


def _viewer(api: Api) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.tokens[Role.VIEWER]}"}
