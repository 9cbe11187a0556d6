"""The boot HTTP server and the real agent code against a real store and conductor:
discovery of unknown MACs, per-node scripts, agent tokens, lying reports, adoption by serial,
artefacts with Range."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from provisioner.agent.__main__ import run as run_agent
from provisioner.agent.collect import collect
from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import LifecycleSettings
from provisioner.domain import NewNode
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state

S = NodeState
MAC = "52:54:00:77:00:10"


class Boot:
    def __init__(self, url: str, store: Store, conductor: Conductor, artefacts: Path) -> None:
        self.url = url
        self.store = store
        self.conductor = conductor
        self.artefacts = artefacts


@pytest.fixture
async def boot(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[Boot]:
    mailbox = FactsMailbox()
    base = fake_ports(world)
    ports = Ports(bmc=base.bmc, inspector=mailbox, installer=base.installer, kube=base.kube,
                  slurm=base.slurm)
    conductor = Conductor(store.nodes, ports, LifecycleSettings(auto_deploy=False))
    agents = AgentService(conductor, store.nodes, store.tokens, mailbox, token_ttl_s=600)
    discovery = Discovery(store.nodes, conductor, TokenBucket(rate_per_s=0.001, burst=5))
    artefacts = tmp_path / "artefacts"
    (artefacts / "inspect").mkdir(parents=True)
    (artefacts / "inspect" / "vmlinuz").write_bytes(bytes(range(256)) * 4)
    runner = web.AppRunner(web.Application())
    http = BootHttp(BootHttpConfig(base_url="", artefacts_dir=artefacts, assets_dir=tmp_path,
                                   kernel="inspect/vmlinuz", initrd="inspect/initrd.gz",
                                   kernel_args="console=ttyS0"),
                    discovery=discovery, agents=agents, tokens=store.tokens,
                    renderer=Renderer())
    runner = web.AppRunner(http.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield Boot(f"http://127.0.0.1:{port}", store, conductor, artefacts)
    await conductor.stop()
    await runner.cleanup()


def agent_args(script: str) -> dict[str, str]:
    kernel = next(line for line in script.splitlines() if line.startswith("kernel "))
    return {k.removeprefix("provisioner."): v for k, _, v in
            (w.partition("=") for w in kernel.split()) if k.startswith("provisioner.")}


def host_facts(mac: str, serial: str) -> dict[str, Any]:
    """This machine's real facts, as its agent collects them, with the booting NIC's MAC."""
    facts = collect(Path("/"))
    facts["nics"].append({"name": "pxe0", "mac": mac, "driver": "virtio_net"})
    facts["system"]["serial"] = serial
    return facts


async def get_script(boot: Boot, mac: str) -> str:
    async with aiohttp.ClientSession() as session, \
            session.get(f"{boot.url}/boot/{mac}.ipxe") as response:
        assert response.status == 200
        return await response.text()


async def agent_thread(args: dict[str, str], facts: dict[str, Any],
                       **kwargs: Any) -> list[str]:
    """The real agent loop in a thread, with ``power`` recorded instead of done."""
    powered: list[str] = []
    thread = threading.Thread(target=run_agent, args=(args,),
                              kwargs={"gather": lambda: facts, "power": powered.append, **kwargs})
    thread.start()
    await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive(), "agent did not finish"
    return powered


async def test_unknown_mac_is_discovered_inspected_and_powered_off(boot: Boot) -> None:
    script = await get_script(boot, MAC.upper())
    assert script.startswith("#!ipxe")
    args = agent_args(script)
    assert args["url"] == boot.url or args["url"] == ""
    args["url"] = boot.url
    assert args["mac"] == MAC and args["token"].startswith("pvt_")
    assert "initrd=initrd.gz" in script and "/artefacts/inspect/vmlinuz" in script
    node = await boot.store.nodes.find(MAC)
    assert node.state in (S.DISCOVERED, S.INSPECTING)
    powered = await agent_thread(args, host_facts(MAC, "QEMU-0001"))
    done = await wait_for_state(boot.store, node.id, S.INSPECTED)
    assert powered == ["poweroff"]
    assert done.serial == "QEMU-0001" and done.facts["memory_mib"] > 0
    events = [(h.event, h.to_state) for h in await boot.store.nodes.history(node.id)]
    assert events == [("enroll", "discovered"), ("inspect", "inspecting"), ("done", "inspected")]
    local = await get_script(boot, MAC)  # nothing to do now: boot from disk
    assert "sanboot" in local and "token" not in local


async def test_discovered_machine_is_adopted_by_its_imported_serial(boot: Boot) -> None:
    imported = await boot.conductor.enroll(
        NewNode(state=S.ENROLLED, hostname="gpu-017", serial="SER-17", rack="r1",
                profile="h100"), actor="import")
    await wait_for_state(boot.store, imported.id, S.INSPECTING)  # auto_inspect, no BMC
    script = await get_script(boot, MAC)
    discovered = await boot.store.nodes.find(MAC)
    assert discovered.id != imported.id
    args = agent_args(script) | {"url": boot.url}
    powered = await agent_thread(args, host_facts(MAC, "SER-17"))
    done = await wait_for_state(boot.store, imported.id, S.INSPECTED)
    assert powered == ["poweroff"]
    assert done.macs == (MAC,) and done.hostname == "gpu-017"
    assert (await boot.store.nodes.find(MAC)).id == imported.id
    assert [h.event for h in await boot.store.nodes.history(imported.id)] == [
        "enroll", "inspect", "adopt", "done"]
    assert (await boot.store.nodes.count_by_state()) == {"inspected": 1}


async def post_facts(boot: Boot, token: str, body: object) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.post(
            f"{boot.url}/agent/v1/facts", json=body, headers=headers) as response:
        return response.status, await response.json(content_type=None)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda f: f["nics"].pop(), "booting MAC"),
    (lambda f: f["disks"].append({"name": "sdz", "size_bytes": 1 << 60}), "disks[1].size_bytes"),
    (lambda f: f.update(bogus=1), "unknown field 'bogus'"),
    (lambda f: f["system"].pop("serial"), "system.serial: missing"),
    (lambda f: f.update(memory_mib="lots"), "memory_mib"),
], ids=["foreign-mac", "absurd-disk", "unknown-field", "no-serial", "bad-type"])
async def test_lying_or_malformed_reports_are_refused_with_reason(
    boot: Boot, change: Any, needle: str
) -> None:
    args = agent_args(await get_script(boot, MAC))
    facts = host_facts(MAC, "S-1")
    facts["disks"] = [{"name": "vda", "size_bytes": 1 << 30}]
    change(facts)
    status, body = await post_facts(boot, args["token"], {"mac": MAC, "facts": facts})
    assert status == 422 and needle in body["detail"]
    node = await boot.store.nodes.find(MAC)
    last = (await boot.store.nodes.history(node.id))[-1]
    assert last.event == "report_rejected" and needle in last.reason


async def test_agent_calls_need_the_nodes_token(boot: Boot) -> None:
    args = agent_args(await get_script(boot, MAC))
    facts = {"mac": MAC, "facts": host_facts(MAC, "S-1")}
    assert (await post_facts(boot, "", facts))[0] == 401
    assert (await post_facts(boot, args["token"] + "x", facts))[0] == 401
    again = agent_args(await get_script(boot, MAC))["token"]
    assert again == args["token"]  # a re-fetched script reuses a young token
    async with aiohttp.ClientSession() as session, session.post(
            f"{boot.url}/agent/v1/facts", data=b"{not json",
            headers={"Authorization": f"Bearer {again}"}) as response:
        assert response.status == 400


async def test_discovery_is_rate_limited(boot: Boot) -> None:
    scripts = [await get_script(boot, f"52:54:00:00:01:{i:02x}") for i in range(7)]
    retries = [s for s in scripts if "retrying" in s]
    assert len(retries) == 2  # burst of 5, then the machines are told to come back
    assert "chain /boot/52:54:00:00:01:06.ipxe" in retries[-1].replace(boot.url, "")
    assert sum((await boot.store.nodes.count_by_state()).values()) == 5


async def test_artefacts_support_range_and_refuse_traversal(boot: Boot) -> None:
    (boot.artefacts.parent / "secret.txt").write_text("no")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{boot.url}/artefacts/inspect/vmlinuz",
                               headers={"Range": "bytes=10-19"}) as response:
            assert response.status == 206
            assert await response.read() == bytes(range(10, 20))
        for path in ("../secret.txt", "%2e%2e/secret.txt", "inspect/../../secret.txt"):
            async with session.get(f"{boot.url}/artefacts/{path}") as response:
                assert response.status == 404, path
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"{boot.url}/artefacts/inspect/vmlinuz").read())
    assert body == bytes(range(256)) * 4


async def test_agent_tokens_rotate_after_half_their_lifetime(store: Store, world: SimWorld) -> None:
    from datetime import UTC, datetime, timedelta

    now = [datetime.now(UTC)]
    conductor = Conductor(store.nodes, fake_ports(world), LifecycleSettings(auto_inspect=False))
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(),
                          token_ttl_s=600, clock=lambda: now[0])
    node = await conductor.enroll(NewNode(state=S.ENROLLED, macs=(MAC,)), actor="t")
    first = await agents.issue_token(node.id)
    now[0] += timedelta(seconds=299)
    assert await agents.issue_token(node.id) == first
    now[0] += timedelta(seconds=2)
    second = await agents.issue_token(node.id)
    assert second != first
    # an agent holding the first goes on with it until it expires (issue 23, finding 7)
    assert await store.tokens.lookup(first) is not None
    assert (await store.tokens.lookup(second)) is not None
    await conductor.stop()


async def test_discovery_cache_sees_enrolment_at_once(store: Store, world: SimWorld) -> None:
    conductor = Conductor(store.nodes, fake_ports(world), LifecycleSettings(auto_inspect=False))
    discovery = Discovery(store.nodes, conductor, TokenBucket(1, 1), unknown_ttl_s=3600)
    assert await discovery.lookup(MAC) is None  # now cached as unknown for an hour
    node = await conductor.enroll(NewNode(state=S.ENROLLED, macs=(MAC,)), actor="op")
    known = await discovery.lookup(MAC)
    assert known is not None and known.node_id == node.id and known.state == "enrolled"
    await conductor.fire(node.id, Event.INSPECT, actor="op")
    assert (await discovery.lookup(MAC)).state == "inspecting"  # type: ignore[union-attr]
    await conductor.stop()


async def test_a_report_outside_inspection_does_not_answer_a_later_one(boot: Boot) -> None:
    """Facts posted once the OS is up (the Ansible facts role) are kept on the node but must
    not satisfy the next inspection, which has to boot the machine and look again."""
    node = await boot.conductor.enroll(NewNode(state=S.ENROLLED, macs=(MAC,), serial="LATE-1"),
                                       actor="op")
    await wait_for_state(boot.store, node.id, S.INSPECTING)
    args = agent_args(await get_script(boot, MAC)) | {"url": boot.url}
    await agent_thread(args, host_facts(MAC, "LATE-1"))
    await wait_for_state(boot.store, node.id, S.INSPECTED)
    assert "sanboot" in await get_script(boot, MAC)  # nothing to do on the network now
    status, _ = await post_facts(boot, args["token"], {"mac": MAC,
                                                       "facts": host_facts(MAC, "LATE-1")})
    assert status == 200  # accepted and kept as the node's last report
    await boot.conductor.fire(node.id, Event.INSPECT, actor="op")
    await asyncio.sleep(0.5)
    assert (await boot.store.nodes.get(node.id)).state == S.INSPECTING  # still waiting
