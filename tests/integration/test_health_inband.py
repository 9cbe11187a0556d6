"""The in-band health source against real peers: the probe (``playbooks/roles/
health_probe``) installed by ``health-probe.yml`` over the SSH node the Ansible tests use,
run on that node as its timer would, posting through the node's network to the real boot
HTTP server (``POST /agent/v1/health``); a real XID kernel-log excerpt becomes a finding
(origin ``in-band``) that walks the repair ladder to ``service_required`` when no rung
clears it. Then the intake's refusals: another address, another route, too soon, too big."""

from __future__ import annotations

import asyncio
import socket
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import LifecycleSettings
from provisioner.config.health import HealthSettings
from provisioner.domain import BmcEndpoint
from provisioner.health.inband import MAX_BODY_BYTES
from provisioner.health.model import HealthClass
from provisioner.health.record import RepairRecord
from provisioner.health.records import Origin
from provisioner.install.base import AgentEndpoint
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.inband import InbandIntake
from provisioner.lifecycle.repair import RepairService, ladder_listener
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.drivers import FAULT, simulated_facts
from provisioner.simulation.world import SimWorld
from provisioner.store.findings import FindingFilter
from provisioner.store.store import Store
from tests.conftest import fake_ports, wait_for_state
from tests.integration.ansible_support import (
    TARGET_VARS,
    make_installer,
    short_dir,
    target_settings,
)
from tests.peers.debootstrap import debootstrap_unavailable_reason
from tests.peers.dhcp_netns import Namespace, entered
from tests.peers.sshd import SshNode, ssh_node

S = NodeState
HEALTH = Path(__file__).parents[1] / "fixtures" / "health"
XID79_LOG = HEALTH / "ubuntu-forum-syslog-xid79.log"  # a real kern.log excerpt (README)
IBSTAT_DOWN = HEALTH / "gpud-ibstat.47.0.h100.some.down.with.polling.1.txt"
IBSTAT_UP = HEALTH / "gpud-ibstat.47.0.h100.some.down.1.txt"
CONTROLLER = "10.77.0.1"  # the daemon's side of the node's wire, in a namespace of ours
KERN_LOG, SAVED = "/var/log/provisioner-test-kern.log", "/root/xid79.log"
BOOT = "0d5c1b3e-8a53-4b1c-9d8e-6a0c3f2e9b11"


@dataclass
class Daemon:
    url: str
    intake: InbandIntake
    repairs: RepairService
    conductor: Conductor


@asynccontextmanager
async def daemon(store: Store, world: SimWorld, sock: socket.socket | None,
                 **health: Any) -> AsyncIterator[Daemon]:
    """The daemon's pieces that matter here, as ``daemon/serve.py`` wires them: the
    conductor, the ladder hearing ``HealthFindings``, the boot HTTP server with the intake
    (on ``sock``, else on 127.0.0.1)."""
    settings = HealthSettings(max_repairing_fraction=1.0, **health)
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    repairs = RepairService(conductor, store.nodes, settings)
    findings = HealthFindings(store.findings, conductor)
    findings.add_listener(ladder_listener(repairs))
    intake = InbandIntake(store.nodes, store.tokens, findings, settings)
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(), token_ttl_s=600)
    here = Path(".")
    http = BootHttp(BootHttpConfig(base_url="", artefacts_dir=here, assets_dir=here,
                                   kernel="k", initrd="i", kernel_args=""),
                    discovery=Discovery(store.nodes, conductor, TokenBucket(0.001, 1)),
                    agents=agents, tokens=store.tokens, renderer=Renderer(), inband=intake)
    runner = web.AppRunner(http.app())
    await runner.setup()
    if sock is not None:
        site: web.BaseSite = web.SockSite(runner, sock)
        host, port = sock.getsockname()[:2]
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        site = web.SockSite(runner, listener)
        host, port = listener.getsockname()[:2]
    await site.start()
    try:
        yield Daemon(f"http://{host}:{port}", intake, repairs, conductor)
    finally:
        await runner.cleanup()
        await conductor.stop()


@contextmanager
def controller_side(node: SshNode) -> Iterator[socket.socket]:
    """The node's veth peer moved into a namespace of ours, addressed ``CONTROLLER``, with
    a listening socket there: the node reaches the daemon over its own NIC, so the daemon
    sees the node's real address."""
    ctl = Namespace("pvh")
    sock: socket.socket | None = None
    try:
        subprocess.run(["ip", "-n", node.namespace, "link", "set", "wire0", "netns",
                        ctl.name], check=True, capture_output=True)
        ctl.ip("addr", "add", f"{CONTROLLER}/24", "dev", "wire0")
        ctl.ip("link", "set", "wire0", "up")
        with entered(ctl):
            sock = socket.create_server((CONTROLLER, 0))
        yield sock
    finally:
        if sock is not None:
            sock.close()
        ctl.close()


async def probe(node: SshNode) -> str:
    """One run of the probe on the node, as its timer's service runs it."""
    done = await asyncio.to_thread(
        node.run, "sh", "-c", "set -a; . /etc/provisioner/health-probe.env; set +a; "
        "exec /usr/local/sbin/provisioner-health-probe")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def inband_findings(store: Store, node_id: str) -> list[Any]:
    found, _ = await store.findings.list(FindingFilter(node_id=node_id,
                                                       origin=str(Origin.IN_BAND)))
    return found


async def test_xid_lines_on_the_node_walk_the_ladder_to_service_required(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    if (reason := debootstrap_unavailable_reason()) is not None:
        pytest.skip(reason)
    log_lines = XID79_LOG.read_text().splitlines()
    cut = next(i for i, line in enumerate(log_lines) if "): 79," in line)
    with short_dir() as work, ssh_node(work / "node", files={
            SAVED: (XID79_LOG.read_text(), 0o644),
            KERN_LOG: ("\n".join(log_lines[:cut]) + "\n", 0o644)}) as target, \
            controller_side(target) as sock:
        async with daemon(store, world, sock, probe_min_interval_s=0) as d:
            node = await make_node(S.ACTIVE, serial="IB1", hostname="gpu-inband-01",
                                   profile="gpu", bmc=BmcEndpoint(driver="fake", address="IB1"),
                                   bmc_password="pw")
            await store.nodes.merge_facts(node.id, simulated_facts("IB1", "IB1") | {
                "address": target.address})
            node = await store.nodes.get(node.id)  # with its address: Ansible's target
            await world.ensure("IB1", "boot", "power", "on")
            await world.ensure("IB1", "inject", FAULT, "never")  # no rung clears it

            token = await d.intake.issue_token(node.id)
            settings = target_settings(target, extra_vars=TARGET_VARS | {
                "health_probe_kernel_log": KERN_LOG})
            installer, pool = make_installer(settings, work / "state",
                                             agent=AgentEndpoint(d.url, d.intake.issue_token))
            try:  # the token reaches the node over SSH only
                await installer.install_health_probe(node, "g1", token)
            finally:
                pool.shutdown()
            written = target.changed_file("/etc/provisioner/probe-token")
            assert written.read_text().strip() == token
            assert stat.S_IMODE(written.stat().st_mode) == 0o600
            assert target.changed_file(
                "/etc/systemd/system/timers.target.wants/provisioner-health-probe.timer"
            ).is_symlink()
            timer = target.changed_file(
                "/etc/systemd/system/provisioner-health-probe.timer").read_text()
            assert "OnCalendar=*:0/1\n" in timer and "RandomizedDelaySec=60\n" in timer

            # the log before the XID: read, nothing found, the node stays in service
            assert f"{cut} lines, 0 findings" in await probe(target)
            assert await inband_findings(store, node.id) == []
            assert (await store.nodes.get(node.id)).state == S.ACTIVE

            # XID 79 lands in the kernel log: only the new lines are read
            done = await asyncio.to_thread(target.run, "cp", SAVED, KERN_LOG)
            assert done.returncode == 0, done.stderr
            assert f"{len(log_lines) - cut} lines, 1 findings" in await probe(target)
            [finding] = await inband_findings(store, node.id)
            assert finding.cls is HealthClass.GPU_LOST and "Xid (PCI:0000:01:00): 79" in \
                finding.evidence
            stuck = await wait_for_state(store, node.id, S.SERVICE_REQUIRED, timeout_s=30)
            record = RepairRecord.from_facts(stuck.facts)
            assert record is not None and record.outcome == "service_required"
            # XID 79: a GPU reset cannot bring a GPU back on the bus (NVIDIA's catalogue)
            assert [r.rung for r in record.tried] == ["restart_os", "power_cycle"]
            assert all(not r.passed for r in record.tried)
            assert any("): 79," in line for line in record.evidence) and record.serial == "IB1"

            # the next period: the same log raises nothing twice
            assert "0 lines, 0 findings" in await probe(target)
            [again] = await inband_findings(store, node.id)
            assert again.id == finding.id and again.count == finding.count


async def test_the_intake_refuses_what_a_node_may_not_do(
        store: Store, world: SimWorld, make_node) -> None:  # type: ignore[no-untyped-def]
    async with daemon(store, world, None, probe_min_interval_s=60) as d, \
            aiohttp.ClientSession() as http:
        node = await make_node(S.ACTIVE, serial="IB2", hostname="gpu-inband-02")
        await store.nodes.merge_facts(node.id, {"address": "127.0.0.1"})
        elsewhere = await make_node(S.ACTIVE, serial="IB3", hostname="gpu-inband-03")
        await store.nodes.merge_facts(elsewhere.id, {"address": "10.77.0.3"})
        token = await d.intake.issue_token(node.id)

        async def post(body: object, with_token: str = token, path: str = "/agent/v1/health",
                       raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
            async with http.post(f"{d.url}{path}", json=None if raw else body, data=raw,
                                 headers={"Authorization": f"Bearer {with_token}",
                                          "Content-Type": "application/json"}) as reply:
                return reply.status, await reply.json(content_type=None)

        ib = {"boot_id": BOOT, "ibstat": IBSTAT_DOWN.read_text()}
        status, answer = await post(ib)
        assert status == 200 and answer["findings"] == 1, answer
        status, answer = await post(ib)  # within probe_min_interval_s
        assert status == 429, answer
        # the body's own words never name another node: unknown keys are refused
        d.intake._last.clear()
        assert (await post({"boot_id": BOOT, "node_id": elsewhere.id}))[0] == 422
        assert (await post({}, raw=b"{" + b" " * MAX_BODY_BYTES + b"}"))[0] == 413
        # a probe token is for this route alone; an agent token is not a probe token
        assert (await post({"mac": "x", "facts": {}}, path="/agent/v1/facts"))[0] == 401
        agent_token = await AgentService(d.conductor, store.nodes, store.tokens,
                                         FactsMailbox(), token_ttl_s=600).issue_token(node.id)
        assert (await post(ib, with_token=agent_token))[0] == 401
        # bound to the node's address: the other node's token from here is refused
        status, answer = await post(ib, with_token=await d.intake.issue_token(elsewhere.id))
        assert status == 403 and "10.77.0.3" in answer["detail"]
        assert await inband_findings(store, elsewhere.id) == []

        # the port came back: the state clears; the token is rotated past half its life
        d.intake._last.clear()
        [down] = await inband_findings(store, node.id)
        status, answer = await post({"boot_id": BOOT, "ibstat": IBSTAT_UP.read_text()})
        assert status == 200 and "token" not in answer
        assert await inband_findings(store, node.id) == []
        cleared, _ = await store.findings.list(FindingFilter(node_id=node.id, open_only=False))
        assert [f.id for f in cleared] == [down.id] and cleared[0].cleared_at is not None
        d.intake._last.clear()
        d.intake._now = lambda: datetime.now(UTC) + timedelta(days=20)  # past half its life
        status, answer = await post({"boot_id": BOOT})
        assert status == 200 and answer["token"] != token
        d.intake._last.clear()
        assert (await post({"boot_id": BOOT}, with_token=answer["token"]))[0] == 200
