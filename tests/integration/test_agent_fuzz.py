"""Property: no body, query or header makes the agent endpoints (facts, command, result,
callback, seed) answer 5xx, hang, or answer an error that is not a one-line problem document;
a refused report leaves the node as it was. Real boot HTTP server, store and agent service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.boot_support import MAC, Segment, running_segment
from tests.integration.test_api_fuzz import json_values, texts
from tests.integration.test_boot_http import agent_args, host_facts

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
ENDPOINTS = [("POST", "/agent/v1/facts"), ("GET", "/agent/v1/command"),
             ("POST", "/agent/v1/result"), ("POST", "/agent/v1/callback"),
             ("GET", "/agent/v1/seed")]
OK = {200, 400, 401, 403, 404, 413, 422}
FACTS = host_facts(MAC, "FUZZ-1")


class Agent:
    def __init__(self, segment: Segment, token: str) -> None:
        self.segment, self.token = segment, token

    async def assert_no_5xx(self, method: str, path: str, *, data: bytes | None = None,
                   headers: dict[str, str] | None = None,
                   params: dict[str, str] | None = None) -> tuple[int, str]:
        """One request; fails on a 5xx, a hang (10 s) or an error that is not a problem."""
        sent = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        sent.update(headers or {})
        async with asyncio.timeout(10), aiohttp.ClientSession() as session, \
                session.request(method, self.segment.url + path, data=data, headers=sent,
                                params=params) as response:
            text = await response.text(errors="replace")
            status = response.status
        assert status in OK, (status, path, text[:300])
        if status >= 400 and status != 404:
            problem = json.loads(text)
            assert problem["status"] == status and problem["detail"]
            assert "Traceback" not in text
        return status, text


@pytest.fixture
async def agent(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[Agent]:
    async with running_segment(store, world, tmp_path) as segment:
        status, script = await segment.script("127.0.0.1")
        assert status == 200
        yield Agent(segment, agent_args(script)["token"])


def mutated_facts() -> st.SearchStrategy[dict[str, Any]]:
    """The real facts of this host with one field replaced by something random."""
    keys = st.sampled_from(sorted(FACTS))
    return st.tuples(keys, json_values).map(lambda kv: {**FACTS, kv[0]: kv[1]})


@FUZZ
@given(data=st.binary(max_size=400), which=st.sampled_from(ENDPOINTS))
async def test_random_bytes(agent: Agent, data: bytes, which: tuple[str, str]) -> None:
    method, path = which
    await agent.assert_no_5xx(method, path, data=data)


@FUZZ
@given(body=json_values | st.fixed_dictionaries({}, optional={
    "mac": json_values, "facts": json_values | mutated_facts(), "command": texts,
    "generation": json_values, "ok": json_values, "error": json_values, "event": texts
    | st.sampled_from(["booted", "installed"]), "hostname": json_values, "bytes": json_values,
    "sha256": json_values, "note": json_values, "layout": json_values}),
    which=st.sampled_from(ENDPOINTS))
async def test_random_json(agent: Agent, body: object, which: tuple[str, str]) -> None:
    method, path = which
    before = await agent.segment.store.nodes.find(MAC)
    status, _ = await agent.assert_no_5xx(method, path, data=json.dumps(body).encode())
    after = await agent.segment.store.nodes.find(MAC)
    if status >= 400:  # refused: the node is untouched (a history row may say why)
        assert (after.serial, after.macs, after.hostname) == \
            (before.serial, before.macs, before.hostname)


@FUZZ
@given(facts=mutated_facts(), mac=texts)
async def test_mutated_facts_are_accepted_or_refused_with_a_reason(
        agent: Agent, facts: dict[str, Any], mac: str) -> None:
    before = await agent.segment.store.nodes.find(MAC)
    rows = len(await agent.segment.store.nodes.history(before.id))
    status, text = await agent.assert_no_5xx("POST", "/agent/v1/facts",
                                    data=json.dumps({"mac": mac, "facts": facts}).encode())
    node = await agent.segment.store.nodes.find(MAC)
    if status == 422:
        history = await agent.segment.store.nodes.history(node.id)
        detail = json.loads(text)["detail"]
        assert detail
        # its row, unless over the node's history budget (RowBudget); the inspection an
        # earlier example's report ended may add its own rows meanwhile
        rejected = [row for row in history[rows:] if row.event == "report_rejected"]
        assert len(rejected) <= 1
        if rejected:  # a lone surrogate is stored escaped
            assert rejected[0].reason.startswith(
                detail.encode("utf-8", "backslashreplace").decode("utf-8"))
    else:
        assert status == 200 and node.facts.get("last_report") is not None


@FUZZ
@given(generation=texts, header=texts, scheme=st.sampled_from(["Bearer", "bearer", "Basic",
                                                               "", "Bearer  "]))
async def test_random_queries_and_authorization(agent: Agent, generation: str, header: str,
                                                scheme: str) -> None:
    status, _ = await agent.assert_no_5xx("GET", "/agent/v1/seed",
                                          params={"generation": generation})
    assert status == 404  # no deploy pending: nothing to hand out, whatever the generation
    # what an HTTP client can send at all: visible Latin-1, no control characters
    auth = scheme + " " + "".join(ch for ch in header
                                  if 0x20 <= ord(ch) < 0x7F or 0xA0 <= ord(ch) <= 0xFF)
    for method, path in ENDPOINTS:
        status, _ = await agent.assert_no_5xx(method, path, data=b"{}",
                                     headers={"Authorization": auth})
        assert status == 401


@FUZZ
@given(name=texts, kind=st.sampled_from(["boot/{}.ipxe", "boot/{}.grub", "artefacts/{}",
                                         "ipxe/{}", "install/{}/user-data",
                                         "install/pvt_x/{}"]))
async def test_random_boot_paths(agent: Agent, name: str, kind: str) -> None:
    """Script, artefact and installer paths with any name: an answer, never a 5xx; a script
    is either refused (400) or a script."""
    name = name.encode("utf-8", "replace").decode()  # a lone surrogate cannot be sent
    path = "/" + kind.format(quote(name, safe=""))
    async with asyncio.timeout(10), aiohttp.ClientSession() as session, \
            session.get(agent.segment.url + path) as response:
        text = await response.text(errors="replace")
        assert response.status in OK, (response.status, path, text[:200])
    if kind.startswith("boot/") and response.status == 200:
        assert text.startswith("#!ipxe") or "echo" in text  # an iPXE script or grub.cfg
