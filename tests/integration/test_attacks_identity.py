"""Attacks on a node's identity from a machine on the provisioning network (issue 23,
findings 1, 2, 3 and 7), each against the real daemon (``provisioner serve``) with real
clients: raw DHCP packets over UDP, curl for HTTP.

Topology (findings 1, 2, 7): namespace S runs the daemon (authoritative DHCP on ``vs0``,
10.77.0.1/24, the boot server on 10.77.0.1:8080, the API on S's loopback); namespace C
(``vc0``) holds the attacker (10.77.0.2) and each victim's leased address, added to ``vc0``
once our DHCP server bound it, so curl can speak from it (``--interface``). Finding 3 runs a
daemon with ``dhcp.mode = "off"`` on loopback addresses (127.0.0.x, one per machine), where
the token is bound by first use. Nothing has an address outside these namespaces and
127.0.0.0/8.

The principles (docs/security.md): a node's identity on the boot network is what our DHCP
server bound and what the operator enrolled, never what a report claims; issuing a new token
never cuts off the agent holding the old one; the OS is reached at an address we know.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent.__main__ import AgentClient, kernel_args
from provisioner.boot.dhcp_codec import MessageType, Opt
from provisioner.errors import ProvisionerError
from provisioner.lifecycle.states import NodeState as S
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.e2e.test_cli_api import running_daemon
from tests.integration.ansible_support import make_installer, short_dir, target_settings
from tests.integration.boot_support import MAC, running_segment
from tests.integration.test_boot_http import host_facts
from tests.peers.dhcp_client import PXE_UEFI_X64, ScriptedClient, request_packet
from tests.peers.dhcp_netns import Namespace, entered, netns_unavailable_reason, veth
from tests.peers.ports import free_tcp_port
from tests.peers.sshd import ssh_node

_why_not = netns_unavailable_reason()
pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]
SERVER, ATTACKER = "10.77.0.1", "10.77.0.2"
BOOT = f"http://{SERVER}:8080"
BROADCAST = ("255.255.255.255", 67)


@dataclass
class Segment:
    server: Namespace
    client: Namespace
    root: Path
    api_port: int = field(default_factory=free_tcp_port)
    proc: subprocess.Popen[bytes] | None = None
    admin: str = ""
    runs: int = 0

    @property
    def config(self) -> Path:
        return self.root / "provisioner.toml"

    def start(self) -> None:
        self.config.write_text(f"""state_dir = "{self.root / 'state'}"
[api]
listen = "127.0.0.1:{self.api_port}"
[http]
listen = "{SERVER}:8080"
[lifecycle]
auto_inspect = false
auto_deploy = false
[dhcp]
mode = "authoritative"
interface = "vs0"
server_address = "{SERVER}"
pool = "10.77.0.100-10.77.0.150"
netmask = "255.255.255.0"
""")
        self.runs += 1
        log = self.root / f"daemon{self.runs}.log"
        self.proc = self.server.popen([sys.executable, "-m", "provisioner", "--config",
                                       str(self.config), "serve"], log=log)
        deadline = time.monotonic() + 60
        while self.server.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                               f"http://127.0.0.1:{self.api_port}/healthz"],
                              check=False).stdout != "200" or not self.server.run(
                ["ss", "-Hlun", "sport = :67"]).stdout.strip():
            assert self.proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the daemon did not start in 60 s"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None:
            self.server.stop(self.proc)
            self.proc = None

    def api(self, method: str, path: str, body: object = None) -> Any:
        if not self.admin:
            made = subprocess.run([sys.executable, "-m", "provisioner", "--config",
                                   str(self.config), "token", "create", "--role", "admin",
                                   "--name", "attacks"], capture_output=True, text=True,
                                  check=True, timeout=60)
            self.admin = made.stdout.splitlines()[-1]
        args = ["curl", "-s", "-X", method, "-H", f"Authorization: Bearer {self.admin}",
                f"http://127.0.0.1:{self.api_port}{path}"]
        if body is not None:
            args[1:1] = ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
        return json.loads(self.server.run(args).stdout)

    def http(self, source: str, method: str, path: str, *, token: str = "",
             body: object = None) -> tuple[int, str]:
        """One request to the boot server from ``source`` (an address on C's ``vc0``)."""
        args = ["curl", "-s", "-m", "10", "--interface", source, "-X", method,
                "-w", "\n%{http_code}", f"{BOOT}{path}"]
        if token:
            args[1:1] = ["-H", f"Authorization: Bearer {token}"]
        if body is not None:
            args[1:1] = ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
        text, _, status = self.client.run(args).stdout.rpartition("\n")
        return int(status), text

    def enroll_inspecting(self, body: dict[str, object]) -> Any:
        """Enrol a node and start its inspection: its boot script runs the agent."""
        node = self.api("POST", "/api/v1/nodes", body)
        self.api("POST", f"/api/v1/nodes/{node['id']}/actions/inspect")
        return node

    def node(self, node_id: str) -> Any:
        return self.api("GET", f"/api/v1/nodes/{node_id}")

    def events(self, node_id: str) -> list[str]:
        history = self.api("GET", f"/api/v1/nodes/{node_id}/history")
        rows = history["items"] if isinstance(history, dict) else history
        return [row["event"] for row in rows]


@pytest.fixture(scope="module")
def segment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Segment]:
    if _why_not is not None:
        pytest.skip(_why_not)
    server, client = Namespace("pvas"), Namespace("pvac")
    try:
        veth(server, "vs0", client, "vc0")
        server.ip("addr", "add", f"{SERVER}/24", "dev", "vs0")
        client.ip("addr", "add", f"{ATTACKER}/24", "dev", "vc0")
        segment = Segment(server, client, tmp_path_factory.mktemp("attacks"))
        segment.start()
        try:
            yield segment
        finally:
            segment.stop()
    finally:
        client.close()
        server.close()


@pytest.fixture
def dhcp(segment: Segment) -> Iterator[ScriptedClient]:
    with entered(segment.client):
        sock = ScriptedClient.bound("0.0.0.0", 68, interface="vc0")
    yield sock
    sock.close()


async def lease(segment: Segment, dhcp: ScriptedClient, mac: str) -> str:
    """DISCOVER, OFFER, REQUEST, ACK for ``mac``; its address is added to ``vc0``."""
    offer, = await dhcp.exchange(request_packet(mac, MessageType.DISCOVER, extra=PXE_UEFI_X64),
                                 BROADCAST, wait_s=5)
    ack, = await dhcp.exchange(request_packet(mac, MessageType.REQUEST, xid=offer.xid, extra={
        **PXE_UEFI_X64, Opt.SERVER_ID: IPv4Address(SERVER).packed,
        Opt.REQUESTED_IP: offer.yiaddr.packed}), BROADCAST, wait_s=5)
    assert ack.message_type is MessageType.ACK
    segment.client.ip("addr", "add", f"{ack.yiaddr}/32", "dev", "vc0")
    return str(ack.yiaddr)


def token_of(script: str) -> str:
    return next(word.partition("=")[2] for word in script.split()
                if word.startswith("provisioner.token="))


async def test_a_forged_decline_does_not_free_a_known_nodes_lease(
        segment: Segment, dhcp: ScriptedClient) -> None:
    """Finding 1: a DECLINE with the victim's MAC and address deleted its lease; the token
    binding then fell back to first use and the attacker got the victim's boot script."""
    mac = "52:54:00:a1:00:01"
    victim = segment.enroll_inspecting({"hostname": "victim-1", "macs": [mac]})
    address = await lease(segment, dhcp, mac)
    status, script = segment.http(address, "GET", f"/boot/{mac}.ipxe")
    assert status == 200 and "provisioner.token=" in script
    # the attacker forges the victim's DECLINE (chaddr, option 50, option 54)
    forged = request_packet(mac, MessageType.DECLINE, extra={
        Opt.REQUESTED_IP: IPv4Address(address).packed,
        Opt.SERVER_ID: IPv4Address(SERVER).packed})
    assert await dhcp.exchange(forged, BROADCAST, wait_s=1.0) == []
    status, text = segment.http(ATTACKER, "GET", f"/boot/{mac}.ipxe")
    assert status == 403 and "provisioner.token=" not in text, text
    assert f"bound {address}" in text  # the reservation is still there
    assert "boot_refused" in segment.events(victim["id"])
    # the victim goes on: same address at its next DISCOVER, its script from there
    offer, = await dhcp.exchange(request_packet(mac, MessageType.DISCOVER, extra=PXE_UEFI_X64),
                                 BROADCAST, wait_s=5)
    assert str(offer.yiaddr) == address
    token = token_of(segment.http(address, "GET", f"/boot/{mac}.ipxe")[1])
    assert segment.http(address, "GET", "/agent/v1/command", token=token)[0] == 200
    assert segment.http(ATTACKER, "GET", "/agent/v1/command", token=token)[0] == 403


async def test_a_report_listing_the_victims_mac_does_not_adopt_it(
        segment: Segment, dhcp: ScriptedClient) -> None:
    """Finding 2: a made-up machine reporting the victim's serial and listing the victim's
    MAC among its NICs was adopted into the victim's node and got its token."""
    victim_mac, own_mac = "52:54:00:a2:00:01", "52:54:00:a2:00:66"
    victim = segment.api("POST", "/api/v1/nodes", {"serial": "SER-VICTIM-2",
                                                   "macs": [victim_mac]})
    own = await lease(segment, dhcp, own_mac)  # the attacker's own MAC: discovered
    status, script = segment.http(own, "GET", f"/boot/{own_mac}.ipxe")
    assert status == 200
    facts = host_facts(own_mac, "SER-VICTIM-2")
    facts["nics"].append({"name": "eth9", "mac": victim_mac, "driver": "virtio_net"})
    status, text = segment.http(own, "POST", "/agent/v1/facts", token=token_of(script),
                                body={"mac": own_mac, "facts": facts})
    assert status == 422 and "none of which it booted with" in text, text
    assert "pvt_" not in text  # no token of the victim's node
    kept = segment.node(victim["id"])
    assert kept["macs"] == [victim_mac] and kept["state"] == "enrolled"
    assert "adopt_refused" in segment.events(victim["id"])


async def test_a_restart_never_revokes_the_running_agents_token(
        segment: Segment, dhcp: ScriptedClient) -> None:
    """Finding 7: after a daemon restart the next script (or a rebuilt seed) issued a fresh
    token and revoked the one on the running agent's kernel command line (401: the agent
    exited). Whoever fetches the script first after the restart must not take it."""
    mac = "52:54:00:a7:00:01"
    segment.enroll_inspecting({"hostname": "victim-7", "macs": [mac]})
    address = await lease(segment, dhcp, mac)
    agent_token = token_of(segment.http(address, "GET", f"/boot/{mac}.ipxe")[1])
    assert segment.http(address, "GET", "/agent/v1/command", token=agent_token)[0] == 200
    segment.stop()
    segment.start()
    status, text = segment.http(ATTACKER, "GET", f"/boot/{mac}.ipxe")  # first after it
    assert status == 403 and "provisioner.token=" not in text
    fresh = token_of(segment.http(address, "GET", f"/boot/{mac}.ipxe")[1])
    assert fresh != agent_token  # issued anew: the daemon keeps only hashes
    status, text = segment.http(address, "GET", "/agent/v1/command", token=agent_token)
    assert status == 200, text  # the running agent goes on
    assert segment.http(ATTACKER, "GET", "/agent/v1/command", token=agent_token)[0] == 403


def test_a_callback_no_step_waits_for_does_not_redirect_ansible(tmp_path: Path) -> None:
    """Finding 3: any holder of a node's token sent ``booted`` and its source address
    became ``facts.address``, Ansible's target, though no deploy waited for a callback.
    Without a lease (``dhcp.mode = "off"``) the token is bound to its first user: here the
    attacker, who read the script first."""
    mac, attacker = "52:54:00:a3:00:01", "127.0.0.83"
    boot_port = free_tcp_port()
    settings = (f'[http]\nlisten = "127.0.0.1:{boot_port}"\n\n'
                "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n")
    with running_daemon(tmp_path / "daemon", settings) as daemon:
        made = subprocess.run([sys.executable, "-m", "provisioner", "--config",
                               str(daemon.config), "token", "create", "--role", "admin",
                               "--name", "cb"], capture_output=True, text=True, check=True)
        admin = made.stdout.splitlines()[-1]

        def curl(source: str, url: str, token: str, body: object = None) -> tuple[int, str]:
            args = ["curl", "-s", "-m", "10", "--interface", source, "-w", "\n%{http_code}",
                    "-H", f"Authorization: Bearer {token}", url]
            if body is not None:
                args[1:1] = ["-H", "Content-Type: application/json", "--data",
                             json.dumps(body)]
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            text, _, status = out.rpartition("\n")
            return int(status), text

        status, node = curl("127.0.0.1", f"{daemon.url}/api/v1/nodes", admin,
                            {"hostname": "victim-3", "macs": [mac]})
        assert status == 201, node
        node_id = json.loads(node)["id"]
        status, text = curl("127.0.0.1", f"{daemon.url}/api/v1/nodes/{node_id}/actions/inspect",
                            admin, {})
        assert status == 202, text
        boot = f"http://127.0.0.1:{boot_port}"
        status, script = curl(attacker, f"{boot}/boot/{mac}.ipxe", "")
        token = token_of(script)
        status, text = curl(attacker, f"{boot}/agent/v1/callback", token,
                            {"event": "booted", "hostname": "victim-3"})
        assert status == 200 and json.loads(text)["waiting"] is False
        shown = json.loads(curl("127.0.0.1", f"{daemon.url}/api/v1/nodes/{node_id}",
                                admin)[1])
        assert "address" not in shown["facts"], shown["facts"]  # Ansible's target untouched
        history = json.loads(curl("127.0.0.1", f"{daemon.url}/api/v1/nodes/{node_id}/history",
                                  admin)[1])
        rows = history["items"] if isinstance(history, dict) else history
        assert rows[-1]["event"] == "callback_ignored" and attacker in rows[-1]["reason"]
        # a body claiming another address than its source is refused outright
        status, text = curl(attacker, f"{boot}/agent/v1/callback", token,
                            {"event": "booted", "hostname": "victim-3",
                             "address": "127.0.0.1"})
        assert status == 422 and "claims address" in text


async def test_ansible_accepts_only_the_host_keys_the_callback_delivered(
        store: Store, make_node: Any, tmp_path: Path) -> None:
    """Finding 3, the other half: Ansible ran with ``StrictHostKeyChecking=no``, so whoever
    answered at the node's address got the run (and ``join.yml``'s bootstrap token). Now
    the keys the booted callback delivered are the only ones accepted, whatever
    ``install.ssh_common_args`` says (here the test peer's own ``StrictHostKeyChecking=no``)."""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "join.yml").write_text("- hosts: all\n  tasks: []\n")
    (playbooks / "site.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Reach the node\n      ansible.builtin.raw: 'true'\n")
    impostor = tmp_path / "impostor"
    await asyncio.to_thread(subprocess.run, ["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                                             "-f", str(impostor)], check=True)
    with short_dir() as work, ssh_node(work / "node") as target:
        real = (work / "node" / "upper" / "etc" / "ssh" / "provisioner-test"
                / "host_ed25519.pub").read_text()
        installer, pool = make_installer(target_settings(target, playbooks_dir=playbooks),
                                         work / "state")
        node = await make_node(S.CONFIGURING, hostname="gpu-keys-01")
        await store.nodes.merge_facts(node.id, {
            "address": target.address, "ssh_known_hosts_id": "a",
            "ssh_host_keys": [impostor.with_suffix(".pub").read_text().strip()]})
        with pytest.raises(ProvisionerError, match="(?i)host key|unreachable"):
            await installer.configure(await store.nodes.get(node.id), "run-1")
        await store.nodes.merge_facts(node.id, {"ssh_known_hosts_id": "b",
                                                "ssh_host_keys": [real.strip()]})
        await installer.configure(await store.nodes.get(node.id), "run-2")
        pool.shutdown()


async def test_an_agent_whose_token_was_revoked_fetches_a_fresh_one(
        store: Store, world: SimWorld, tmp_path: Path) -> None:
    """Finding 7, the agent's half: on a 401 the agent fetched nothing and exited (the node
    sat in ``deploying`` for an hour); now it fetches its boot script again and goes on."""
    async with running_segment(store, world, tmp_path) as booted:
        status, script = await booted.script("127.0.0.1")
        assert status == 200
    args = kernel_args(script)
    node = await store.nodes.find(MAC)
    await store.tokens.revoke_for_node(node.id)  # what the old code's restart did to it
    async with running_segment(store, world, tmp_path) as restarted:  # the next daemon
        client = AgentClient(restarted.url, args["token"], args["mac"])
        command = await asyncio.to_thread(client.call, "GET", "/agent/v1/command")
        assert command["command"] in ("wait", "report")
        assert client.token != args["token"]  # the script's fresh token
        stranger = AgentClient(restarted.url, "pvt_not-a-token")  # no MAC: no refetch
        with pytest.raises(RuntimeError, match="401"):
            await asyncio.to_thread(stranger.call, "GET", "/agent/v1/command")
