"""The live topology against a real store and conductor: fabric scans posted to the real boot
HTTP server (``POST /agent/v1/fabric``, real ibnetdiscover captures), and change detection
(a publisher is called once per change, never for an unchanged topology)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import LifecycleSettings, TopologySettings
from provisioner.domain import Role
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.fabrics import FabricReports
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.topology.snapshot import Snapshot
from provisioner.topology_live.live import LiveTopology
from tests.conftest import fake_ports
from tests.integration.test_boot_http import host_facts
from tests.topology_support.nvsmi import FIXTURES, gpus, xml

S = NodeState
HEALTHY = FIXTURES / "infiniband-sim" / "healthy" / "ibnetdiscover.txt"
TOPOGRAPH = FIXTURES / "infiniband" / "topograph-ibnetdiscover-example.out"


class Recorder:
    """A Publisher that records what it was given (the sinks are tested on real peers in
    test_topology_publish.py; here only *when* publishing happens is under test)."""

    name = "recorder"

    def __init__(self) -> None:
        self.digests: list[str] = []
        self.snapshots: list[Snapshot] = []

    async def publish(self, snapshot: Snapshot) -> bool:
        self.digests.append(snapshot.digest)
        self.snapshots.append(snapshot)
        return True


class Env:
    def __init__(self, url: str, store: Store, conductor: Conductor) -> None:
        self.url, self.store, self.conductor = url, store, conductor

    async def token(self, node_id: str) -> str:
        """A controller token: what the daemon gives its own configure run, the only one
        whose fabric scans it takes (test_attacks_bounds.py has the refusals)."""
        _, token = await self.store.tokens.create(f"controller:{node_id}", Role.AGENT,
                                                  node_id=node_id)
        return token

    async def post(self, token: str, body: object) -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as http, http.post(
                f"{self.url}/agent/v1/fabric", json=body,
                headers={"Authorization": f"Bearer {token}"}) as response:
            return response.status, await response.json(content_type=None)


@pytest.fixture
async def env(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[Env]:
    conductor = Conductor(store.nodes, fake_ports(world), LifecycleSettings(auto_deploy=False))
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(), token_ttl_s=600)
    http = BootHttp(BootHttpConfig(base_url="", artefacts_dir=tmp_path, assets_dir=tmp_path,
                                   kernel="k", initrd="i", kernel_args=""),
                    discovery=Discovery(store.nodes, conductor, TokenBucket(0.001, 1)),
                    agents=agents, tokens=store.tokens, renderer=Renderer(),
                    fabrics=FabricReports(conductor, store.topology, store.nodes),
                    max_fabric_bytes=400_000)
    runner = web.AppRunner(http.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield Env(f"http://127.0.0.1:{port}", store, conductor)
    await conductor.stop()
    await runner.cleanup()


async def test_fabric_scan_is_parsed_stored_and_recorded(env: Env, make_node) -> None:  # type: ignore[no-untyped-def]
    node = await make_node(S.CONFIGURING, hostname="a05-p1-dgx-01-c01")
    token = await env.token(node.id)
    text = TOPOGRAPH.read_text()
    status, body = await env.post(token, {"fabric": "compute", "ibnetdiscover": text})
    assert status == 200, body
    assert body["fabric"] == "compute" and body["switches"] == 40 and int(str(body["cas"])) > 100
    (scan,) = await env.store.topology.all()
    assert scan.name == "compute" and scan.text == text and scan.reporter_node_id == node.id
    history = await env.store.nodes.history(node.id)
    assert history[-1].event == "fabric_reported" and "40 switches" in history[-1].reason

    status, body = await env.post(token, {"ibnetdiscover": HEALTHY.read_text()})
    assert status == 200 and body["fabric"] == "default"     # the default name
    assert [s.name for s in await env.store.topology.all()] == ["compute", "default"]


async def test_malformed_scan_is_422_with_the_line_and_in_history(env: Env, make_node) -> None:  # type: ignore[no-untyped-def]
    node = await make_node(S.CONFIGURING)
    token = await env.token(node.id)
    lines = HEALTHY.read_text().splitlines()
    lines.insert(20, "this is not ibnetdiscover output")
    status, body = await env.post(token, {"fabric": "default", "ibnetdiscover": "\n".join(lines)})
    assert status == 422
    assert "line 21" in str(body["detail"]) and "not an ibnetdiscover line" in str(body["detail"])
    assert await env.store.topology.all() == []
    last = (await env.store.nodes.history(node.id))[-1]
    assert last.event == "fabric_rejected" and "line 21" in last.reason


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"fabric": "bad name!", "ibnetdiscover": "x"}, 422, "is not a name"),
    ({"fabric": "default"}, 422, "ibnetdiscover: must be"),
    ({"fabric": 7, "ibnetdiscover": "x"}, 422, "fabric: must be a string"),
    ({"fabric": "default", "ibnetdiscover": "x" * 400_001}, 413, "larger than 400000"),
], ids=["name", "missing", "type", "too-large"])
async def test_bad_fabric_bodies_are_refused(env: Env, make_node, body: object,  # type: ignore[no-untyped-def]
                                             status: int, needle: str) -> None:
    node = await make_node(S.CONFIGURING)
    got, reply = await env.post(await env.token(node.id), body)
    assert got == status and needle in str(reply["detail"])


async def test_fabric_route_needs_an_agent_token(env: Env, make_node) -> None:  # type: ignore[no-untyped-def]
    status, _ = await env.post("pvt_nope", {"ibnetdiscover": HEALTHY.read_text()})
    assert status == 401


async def test_publishes_once_per_change_and_never_when_unchanged(  # type: ignore[no-untyped-def]
        env: Env, make_node) -> None:
    store, conductor = env.store, env.conductor
    hosts = {}
    for n in range(1, 5):
        hosts[n] = await make_node(S.ACTIVE, hostname=f"gpu-node-{n:02d}")
    await store.nodes.merge_facts(hosts[1].id, {"last_report": {"nvidia_smi_xml": xml(gpus(1))}})
    await store.topology.save("default", HEALTHY.read_text(), reporter_node_id=hosts[1].id)
    recorder = Recorder()
    live = LiveTopology(store.topology, TopologySettings(), [recorder])
    conductor.add_observer(live.observe)

    await live.refresh()
    assert len(recorder.digests) == 1
    first = recorder.snapshots[0]
    assert "SwitchName=ib-leaf-01 Nodes=gpu-node-[01-04]" in first.tree_conf
    assert live.spec_for("gpu-node-01") == "default:ib-spine-01:ib-leaf-01"
    assert first.fleet.node("gpu-node-01").clique is not None   # type: ignore[union-attr]

    await live.refresh()
    await live.refresh()
    assert len(recorder.digests) == 1, "unchanged topology published again"

    joining = await make_node(S.CONFIGURING, hostname="gpu-node-05")   # not a member yet
    await live.refresh()
    assert len(recorder.digests) == 1
    await conductor.fire(joining.id, Event.DONE, actor="test")        # configuring -> joining
    assert live._dirty.is_set(), "the observer did not notice the join"
    await live.refresh()
    assert len(recorder.digests) == 2
    assert "gpu-node-05" in recorder.snapshots[-1].tree_conf
    await live.refresh()
    assert len(recorder.digests) == 2

    await conductor.fire(hosts[4].id, Event.RETIRE, actor="test")      # leaves
    await live.refresh()
    assert len(recorder.digests) == 3
    last = recorder.snapshots[-1]
    assert "gpu-node-04" not in last.tree_conf and "gpu-node-04" not in last.labels
    await live.refresh()
    assert len(recorder.digests) == 3
    view = await live.view()
    assert view.publishers["recorder"].digest == last.digest
    assert not view.publishers["recorder"].pending
    await live.aclose()


async def test_a_facts_report_from_the_os_recomputes_the_topology(  # type: ignore[no-untyped-def]
        env: Env, make_node) -> None:
    """The ``facts`` role posts ``nvidia-smi -q -x`` once the driver is up: the report is a
    ``facts_reported`` history row, which marks the topology for a recompute, and the node's
    NVLink clique appears (checkpoints alone never trigger one)."""
    host = await make_node(S.ACTIVE, hostname="gpu-node-01")
    await env.store.topology.save("default", HEALTHY.read_text(), reporter_node_id=host.id)
    recorder = Recorder()
    live = LiveTopology(env.store.topology, TopologySettings(), [recorder])
    env.conductor.add_observer(live.observe)
    await live.refresh()
    assert recorder.snapshots[0].fleet.node("gpu-node-01").clique is None  # type: ignore[union-attr]
    await env.store.nodes.save_checkpoint(host, ["run:x"])
    await live.refresh()
    assert len(recorder.digests) == 1

    facts = host_facts(host.macs[0], host.serial or "") | {"nvidia_smi_xml": xml(gpus(1))}
    async with aiohttp.ClientSession() as http, http.post(
            f"{env.url}/agent/v1/facts", json={"mac": "", "facts": facts},
            headers={"Authorization": f"Bearer {await env.token(host.id)}"}) as response:
        assert response.status == 200, await response.text()
    last = (await env.store.nodes.history(host.id))[-1]
    assert (last.event, last.actor) == ("facts_reported", "agent")
    assert "nvidia-smi -q -x" in last.reason
    assert live._dirty.is_set(), "the report did not mark the topology"
    await live.refresh()
    assert len(recorder.digests) == 2
    assert recorder.snapshots[-1].fleet.node("gpu-node-01").clique is not None  # type: ignore[union-attr]
    await live.aclose()


async def test_a_failing_sink_is_retried_with_the_same_digest(env: Env, make_node) -> None:  # type: ignore[no-untyped-def]
    node = await make_node(S.ACTIVE, hostname="gpu-node-01")
    await env.store.topology.save("default", HEALTHY.read_text(), reporter_node_id=node.id)

    class Flaky(Recorder):
        name = "flaky"
        fail = True

        async def publish(self, snapshot: Snapshot) -> bool:
            if self.fail:
                raise OSError("disk full")
            return await super().publish(snapshot)

    flaky = Flaky()
    live = LiveTopology(env.store.topology, TopologySettings(), [flaky])
    await live.refresh()
    status = (await live.view()).publishers["flaky"]
    assert status.pending and status.error == "disk full" and status.digest is None
    flaky.fail = False
    await live.refresh()
    assert len(flaky.digests) == 1
    await live.refresh()
    assert len(flaky.digests) == 1
    assert not (await live.view()).publishers["flaky"].pending
    await live.aclose()


async def test_topology_repo_on_both_backends(any_store: Store) -> None:
    """The fabric table (migration 0004) and the member reads on SQLite and PostgreSQL."""
    from provisioner.domain import NewNode

    node = await any_store.nodes.create(NewNode(state=S.ACTIVE, hostname="gpu-node-01",
                                                serial="PG1"), actor="test")
    await any_store.nodes.create(NewNode(state=S.ENROLLED, hostname="gpu-node-02",
                                         serial="PG2"), actor="test")
    await any_store.nodes.merge_facts(node.id, {"last_report": {"nvidia_smi_xml": "<x/>"}})
    first = await any_store.topology.save("default", "a", reporter_node_id=node.id)
    second = await any_store.topology.save("default", HEALTHY.read_text(),
                                           reporter_node_id="gone")
    assert first.sha256 != second.sha256 and second.reporter_node_id is None
    (scan,) = await any_store.topology.all()
    assert scan.text == HEALTHY.read_text() and scan.received_at.tzinfo is not None
    assert await any_store.topology.digests() == {"default": second.sha256}
    (member,) = await any_store.topology.members({"active"})
    assert member.hostname == "gpu-node-01"
    assert await any_store.topology.gpu_xml([member.node_id, "nope"]) == {node.id: "<x/>"}
