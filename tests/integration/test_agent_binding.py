"""The provisioning network is hostile (docs/security.md): an agent token works only from the
address the DHCP server bound for the node's MAC (else from the first address that used it),
every refusal is a history row, and a report never adopts a node past inspection.

Real boot HTTP server, real store and lease store, real sockets from distinct loopback
addresses (127.0.0.1, .2, .3: one per "machine" on the segment)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from provisioner.api.app import make_app
from provisioner.config import ApiSettings
from provisioner.domain import Role
from provisioner.lifecycle.agent_binding import AgentBinding, RefusalLog, SourceRefused
from provisioner.lifecycle.agents import AgentService, AgentTokens, FactsMailbox
from provisioner.lifecycle.states import NodeState
from provisioner.metrics import Metrics
from provisioner.simulation.world import SimWorld
from provisioner.store.leases import AddressRange, Holder
from provisioner.store.store import Store
from tests.conftest import wait_for_state
from tests.integration.boot_support import MAC, Segment, running_segment
from tests.integration.test_boot_http import agent_args, host_facts

S = NodeState
NODE_A, ATTACKER, LEASED = "127.0.0.1", "127.0.0.2", "127.0.0.3"


@pytest.fixture
async def segment(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[Segment]:
    async with running_segment(store, world, tmp_path) as started:
        yield started


async def test_without_a_lease_the_token_is_bound_to_its_first_address(
        segment: Segment) -> None:
    status, script = await segment.script(NODE_A)
    assert status == 200
    token = agent_args(script)["token"]
    # the attacker fetched the same script (same MAC) and holds the same token...
    assert agent_args((await segment.script(ATTACKER))[1])["token"] == token
    # ...but the node used it first: it is bound to NODE_A now
    assert (await segment.call(NODE_A, "GET", "/agent/v1/command", token=token))[0] == 200
    facts = {"mac": MAC, "facts": host_facts(MAC, "SER-BIND-1")}
    refused = [
        await segment.call(ATTACKER, "POST", "/agent/v1/facts", token=token, body=facts),
        await segment.call(ATTACKER, "GET", "/agent/v1/command", token=token),
        await segment.call(ATTACKER, "POST", "/agent/v1/result", token=token,
                           body={"command": "deploy", "generation": "g", "ok": True}),
        await segment.call(ATTACKER, "POST", "/agent/v1/callback", token=token,
                           body={"event": "booted", "hostname": "evil"}),
        await segment.call(ATTACKER, "GET", "/agent/v1/seed?generation=g", token=token),
    ]
    assert [status for status, _ in refused] == [403] * 5
    assert all(f"used from {ATTACKER}" in text and f"bound to {NODE_A}" in text
               for _, text in refused)
    rows = [reason for event, reason in await segment.history() if event == "agent_refused"]
    assert len(rows) == 1 and ATTACKER in rows[0]  # a flood costs one row per 10 s
    node = await segment.store.nodes.find(MAC)
    assert node.serial is None and "last_report" not in node.facts  # nothing got through
    assert "address" not in node.facts  # the callback did not redirect Ansible
    # the node itself goes on
    assert (await segment.call(NODE_A, "POST", "/agent/v1/facts", token=token,
                               body=facts))[0] == 200
    done = await wait_for_state(segment.store, node.id, S.INSPECTED)
    assert done.serial == "SER-BIND-1"


async def test_with_a_lease_only_the_leased_address_gets_and_uses_the_token(
        segment: Segment) -> None:
    pool = AddressRange.parse("127.0.0.3-127.0.0.9", "255.0.0.0")
    lease = await segment.leases.bind(Holder(MAC), IPv4Address(LEASED), pool, lease_time_s=600)
    assert lease is not None and str(lease.ip) == LEASED
    status, text = await segment.script(ATTACKER)
    assert status == 403 and "pvt_" not in text and f"bound {LEASED}" in text
    history = await segment.history()
    assert history[-1][0] == "boot_refused" and ATTACKER in history[-1][1]
    status, script = await segment.script(LEASED)
    assert status == 200
    token = agent_args(script)["token"]
    # with a lease there is no first-use: even the first call from elsewhere is refused
    status, text = await segment.call(NODE_A, "GET", "/agent/v1/command", token=token)
    assert status == 403 and f"bound {LEASED}" in text
    assert (await segment.history())[-1][0] == "agent_refused"
    assert (await segment.call(LEASED, "GET", "/agent/v1/command", token=token))[0] == 200


async def test_a_report_cannot_adopt_a_node_past_inspection(segment: Segment, make_node: Any,
                                                            aiohttp_client: Any) -> None:
    owner = await make_node(S.ACTIVE, serial="SER-ACTIVE", macs=("52:54:00:aa:00:01",))
    status, script = await segment.script(NODE_A)  # an unknown MAC: discovered, inspected
    token = agent_args(script)["token"]
    status, text = await segment.call(NODE_A, "POST", "/agent/v1/facts", token=token,
                                      body={"mac": MAC, "facts": host_facts(MAC, "SER-ACTIVE")})
    assert status == 422 and "operator's confirmation" in text
    kept = await segment.store.nodes.get(owner.id)
    assert kept.state is S.ACTIVE and kept.macs == ("52:54:00:aa:00:01",)
    discovered = await segment.store.nodes.find(MAC)
    assert discovered.id != owner.id and discovered.serial is None
    for node_id in (discovered.id, owner.id):
        last = (await segment.store.nodes.history(node_id))[-1]
        assert last.event == "adopt_refused" and "SER-ACTIVE" in last.reason
    # an operator confirms through the API: the discovered node folds into the active one
    api = await aiohttp_client(make_app(conductor=segment.conductor, nodes=segment.store.nodes,
                                        tokens=segment.store.tokens, metrics=Metrics(),
                                        settings=ApiSettings()))
    operator = (await segment.store.tokens.create("op", Role.OPERATOR))[1]
    async with api.post(f"/api/v1/nodes/{discovered.id}/actions/adopt",
                        headers={"Authorization": f"Bearer {operator}"}) as response:
        assert response.status == 202, await response.text()
    adopted = await segment.store.nodes.find(MAC)
    assert adopted.id == owner.id and adopted.state is S.ACTIVE and MAC in adopted.macs
    last = (await segment.store.nodes.history(owner.id))[-1]
    assert last.event == "adopt" and last.actor == "token:op"
    async with api.post(f"/api/v1/nodes/{owner.id}/actions/adopt",
                        headers={"Authorization": f"Bearer {operator}"}) as response:
        assert response.status == 422  # nothing waits for adoption on this one


async def test_a_report_cannot_adopt_an_expected_node_with_other_macs(
        segment: Segment, make_node: Any) -> None:
    owner = await make_node(S.ENROLLED, serial="SER-MACS", macs=("52:54:00:aa:00:09",))
    token = agent_args((await segment.script(NODE_A))[1])["token"]
    status, text = await segment.call(NODE_A, "POST", "/agent/v1/facts", token=token,
                                      body={"mac": MAC, "facts": host_facts(MAC, "SER-MACS")})
    assert status == 422 and "enrolled with MACs 52:54:00:aa:00:09" in text
    assert (await segment.store.nodes.get(owner.id)).macs == ("52:54:00:aa:00:09",)
    last = (await segment.store.nodes.history(owner.id))[-1]
    assert last.event == "adopt_refused"


async def test_a_report_still_adopts_a_node_awaiting_inspection(segment: Segment,
                                                                make_node: Any) -> None:
    owner = await make_node(S.ENROLLED, serial="SER-NEW", macs=())
    token = agent_args((await segment.script(NODE_A))[1])["token"]
    status, text = await segment.call(NODE_A, "POST", "/agent/v1/facts", token=token,
                                      body={"mac": MAC, "facts": host_facts(MAC, "SER-NEW")})
    assert status == 200, text
    assert (await segment.store.nodes.find(MAC)).id == owner.id


async def test_a_first_use_binding_left_idle_can_move() -> None:
    """A node that rebooted and got another address from the site's DHCP: once its old
    binding has been silent for ``idle_rebind_s``, the new address binds."""
    now = [0.0]
    binding = AgentBinding(idle_rebind_s=120.0, clock=lambda: now[0])
    await binding.check_call("n1", (MAC,), "pvt_x", NODE_A)
    now[0] = 100.0
    await binding.check_call("n1", (MAC,), "pvt_x", NODE_A)  # in use: stays bound
    now[0] = 200.0
    with pytest.raises(SourceRefused, match="bound to 127.0.0.1"):
        await binding.check_call("n1", (MAC,), "pvt_x", ATTACKER)  # used 100 s ago
    now[0] = 321.0
    await binding.check_call("n1", (MAC,), "pvt_x", LEASED)  # silent 221 s: moves
    with pytest.raises(SourceRefused, match=f"bound to {LEASED}"):
        await binding.check_call("n1", (MAC,), "pvt_x", NODE_A)


def test_refusals_are_coalesced_but_counted() -> None:
    now = [0.0]
    refusals = RefusalLog(interval_s=10.0, clock=lambda: now[0])
    assert refusals.note("n1", "agent_refused", ATTACKER) == 0  # the first: a row
    for _ in range(37):
        now[0] += 0.1
        assert refusals.note("n1", "agent_refused", ATTACKER) is None  # counted only
    assert refusals.note("n1", "agent_refused", LEASED) == 0  # another source: its own row
    now[0] = 10.5
    assert refusals.note("n1", "agent_refused", ATTACKER) == 37  # the next row counts them


async def test_an_image_written_releases_a_first_use_binding() -> None:
    """The node reboots into its OS, whose address may differ (no lease): it binds again."""
    binding = AgentBinding()
    await binding.check_call("n1", (MAC,), "pvt_x", NODE_A)
    with pytest.raises(SourceRefused, match="bound to 127.0.0.1"):
        await binding.check_call("n1", (MAC,), "pvt_x", ATTACKER)
    binding.release("n1")
    await binding.check_call("n1", (MAC,), "pvt_x", LEASED)  # the OS, from its own address
    with pytest.raises(SourceRefused, match=f"bound to {LEASED}"):
        await binding.check_call("n1", (MAC,), "pvt_x", NODE_A)


async def test_the_controller_token_works_from_the_daemon_host_only(segment: Segment) -> None:
    """The Ansible facts role posts from the controller: its token is not the node's (that one
    is bound to the node's address) and works only from the daemon's own host."""
    pool = AddressRange.parse("127.0.0.3-127.0.0.9", "255.0.0.0")
    await segment.leases.bind(Holder(MAC), IPv4Address(LEASED), pool, lease_time_s=600)
    token = agent_args((await segment.script(LEASED))[1])["token"]
    node = await segment.store.nodes.find(MAC)
    tokens = segment.store.tokens
    controller = await AgentTokens(tokens, ttl_s=600).issue_controller_token(node.id)
    assert controller != token
    # from the daemon's host (loopback here): accepted, though the node's lease is .3
    assert (await segment.call(NODE_A, "GET", "/agent/v1/command", token=controller))[0] == 200
    assert (await segment.call(NODE_A, "GET", "/agent/v1/command", token=token))[0] == 403
    agents = AgentService(segment.conductor, segment.store.nodes, tokens, FactsMailbox(),
                          token_ttl_s=600)
    info = await tokens.lookup(controller)
    assert info is not None
    with pytest.raises(SourceRefused, match="not from the daemon's host"):
        await agents.check_source(info, controller, "10.9.0.5", local="10.9.0.1")
    await agents.check_source(info, controller, "10.9.0.1", local="10.9.0.1")  # same host
    last = (await segment.store.nodes.history(node.id))[-1]
    assert last.event == "agent_refused" and "10.9.0.5" in last.reason
