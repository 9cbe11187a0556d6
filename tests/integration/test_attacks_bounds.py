"""Attacks on what a machine on the provisioning network may write (issue 23, findings 4, 5,
6 and two of the low ones), each run as the attacker would, with real clients:

- its serial is an Ansible template: the real dynamic inventory under ``ansible-inventory``
  and ``ansible`` shows it literally and never runs it;
- its token (a made-up discovered node's, from its own boot script) posts a fabric scan
  (refused: the published fabric stays), callbacks in a loop (the history stays bounded),
  and JSON nested 100,000 deep (a 400, not a 500), all against ``provisioner serve``;
- the daemon's own fabric scan, 300 KB sent in pieces, is read whole; its scans are bounded
  in rate and in number (the real boot HTTP server, store and conductor);
- one spoofed TFTP ERROR between two of our TFTP servers (a network namespace, a raw
  socket) is not answered: no loop, in the daemon's process and in worker processes.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from provisioner.boot.http import FABRIC_SCAN_BURST, BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.boot.tftp import TftpServer
from provisioner.boot.tftp_packets import E_UNDEFINED, error_packet
from provisioner.config import InstallSettings, LifecycleSettings, TftpSettings
from provisioner.domain import Role
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.fabrics import MAX_FABRICS_PER_NODE, FabricReports
from provisioner.lifecycle.row_budget import ROWS_BURST
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.e2e.test_cli_api import Daemon, clean_env, running_daemon
from tests.integration.ansible_support import make_installer, short_dir
from tests.integration.test_boot_http import host_facts
from tests.peers.dhcp_netns import Namespace, entered, netns_unavailable_reason
from tests.peers.ports import free_tcp_port
from tests.topology_support.nvsmi import FIXTURES

S = NodeState
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventory" / "provisioner.py"
BIN = Path(sys.executable).parent
HEALTHY = FIXTURES / "infiniband-sim" / "healthy" / "ibnetdiscover.txt"
TOPOGRAPH = FIXTURES / "infiniband" / "topograph-ibnetdiscover-example.out"  # 300 KB
TOKEN = re.compile(r"provisioner\.token=(\S+)")
NESTED = b"[" * 100_000 + b"]" * 100_000


# -- the real daemon, and a made-up machine on its provisioning network -----------------------

def call(url: str, token: str, body: bytes | None = None) -> tuple[int, str]:
    """(status, text) of a GET, or of a JSON POST of ``body`` (urllib: a plain client)."""
    request = urllib.request.Request(url, data=body, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


@dataclass(frozen=True)
class Booted:
    daemon: Daemon
    boot: str  # the boot HTTP server's URL
    admin: str  # an API token

    def api(self, path: str) -> Any:
        status, text = call(f"{self.daemon.url}/api/v1{path}", self.admin)
        assert status == 200, text
        return json.loads(text)

    def history(self, node_id: str) -> list[dict[str, Any]]:
        return list(self.api(f"/nodes/{node_id}/history")["items"])

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "provisioner", "--config", str(self.daemon.config), *args],
            capture_output=True, text=True, timeout=60, check=False,
            env=clean_env() | {"PROVISIONER_URL": self.daemon.url})
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    http = f"127.0.0.1:{free_tcp_port()}"
    settings = (f'[http]\nlisten = "{http}"\n\n[boot]\nramdisk_build = "off"\n\n'
                "[lifecycle]\nauto_inspect = false\nauto_deploy = false\n")
    with running_daemon(tmp_path_factory.mktemp("attacks-bounds"), settings) as daemon:
        admin = Booted(daemon, "", "").cli("token", "create", "--role", "admin",
                                           "--name", "attacks-bounds")
        yield Booted(daemon, f"http://{http}", admin)


def made_up_machine(boot: str, mac: str, serial: str) -> tuple[str, str]:
    """(node id, agent token) of a machine nobody enrolled: it asks for its boot script
    (the daemon discovers it and hands it a token) and reports facts with ``serial``."""
    with urllib.request.urlopen(f"{boot}/boot/{mac}.ipxe", timeout=30) as response:
        found = TOKEN.search(response.read().decode())
    assert found is not None, "no token in the inspection script"
    token = found.group(1)
    body = json.dumps({"mac": mac, "facts": host_facts(mac, serial)}).encode()
    status, text = call(f"{boot}/agent/v1/facts", token, body)
    assert status == 200, text
    return str(json.loads(text)["node_id"]), token


def test_a_reported_serial_is_never_templated_by_ansible(booted: Booted) -> None:
    """Finding 4: the serial ``{{ lookup('pipe', 'id > X') }}``; ansible-core 2.19 ran it on
    the controller when a play used the host's variables."""
    marker_dir = Path(tempfile.mkdtemp(prefix="pvx"))
    marker = marker_dir / "x"
    payload = f"{{{{ lookup('pipe', 'id > {marker}') }}}}"
    try:
        node_id, _ = made_up_machine(booted.boot, "52:54:00:be:ef:04", payload)
        viewer = booted.cli("token", "create", "--role", "viewer", "--name", "inventory")
        env = clean_env() | {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
                             "PROVISIONER_URL": booted.daemon.url, "PROVISIONER_TOKEN": viewer}

        def run(*argv: str) -> str:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                    env=env, check=False)
            assert result.returncode == 0, result.stdout + result.stderr
            return result.stdout

        used = run(str(BIN / "ansible"), "-i", str(INVENTORY), node_id, "-m", "debug", "-a",
                   'msg="{{ provisioner_serial }} and '
                   "{{ hostvars[inventory_hostname]['provisioner_serial'] }}\"")
        assert not marker.exists(), "the reported serial ran on the controller"
        assert f'"msg": "{payload} and {payload}"' in used, used  # shown literally
        listed = json.loads(run(str(BIN / "ansible-inventory"), "-i", str(INVENTORY), "--list"))
        shown = listed["_meta"]["hostvars"][node_id]["provisioner_serial"]
        assert shown == {"__ansible_unsafe": payload}  # how ansible shows an unsafe string
        assert not marker.exists()
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)


SITE = """\
- hosts: all
  gather_facts: false
  vars_prompt:
    - name: provisioner_agent_token
      prompt: provisioner secret provisioner_agent_token
      private: true
      unsafe: true
  tasks:
    - name: Write the serial where the test reads it
      ansible.builtin.copy:
        content: "{{{{ provisioner_serial }}}}"
        dest: {out}
"""


async def test_the_daemons_own_configure_run_never_templates_the_serial(
        make_node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Finding 4, the daemon's side: ``configuring`` runs site.yml with the node's serial
    among the extra vars (``-e @env/extravars``, a file whose strings Ansible trusts)."""
    marker_dir = Path(tempfile.mkdtemp(prefix="pvx"))
    payload = f"{{{{ lookup('pipe', 'id > {marker_dir / 'x'}') }}}}"
    out = tmp_path / "serial.txt"
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "site.yml").write_text(SITE.format(out=out))
    (books / "join.yml").write_text("- hosts: all\n  tasks: []\n")
    node = await make_node(S.CONFIGURING, serial=payload)
    settings = InstallSettings(playbooks_dir=books, install_packages=False, extra_vars={
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable})
    try:
        with short_dir() as state:
            installer, pool = make_installer(settings, state)
            try:
                await installer.configure(node, "gen-1")
            finally:
                pool.shutdown()
        assert not (marker_dir / "x").exists(), "the reported serial ran on the controller"
        assert out.read_text() == payload
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)


def test_a_discovered_nodes_token_cannot_replace_the_fabric(booted: Booted) -> None:
    """Finding 5: a made-up machine's token posted the fabric Slurm and Kubernetes get."""
    node_id, token = made_up_machine(booted.boot, "52:54:00:be:ef:05", "EVIL-5")
    body = json.dumps({"fabric": "default", "ibnetdiscover": HEALTHY.read_text()}).encode()
    for _ in range(3):
        status, text = call(f"{booted.boot}/agent/v1/fabric", token, body)
        assert status == 403, text
        assert "controller token" in json.loads(text)["detail"]
    assert booted.api("/topology")["fabrics"] == []
    events = [row["event"] for row in booted.history(node_id)]
    assert "fabric_reported" not in events
    assert events.count("fabric_refused") == 1  # three refused, one row (coalesced)


def test_callbacks_in_a_loop_keep_the_history_and_the_log_bounded(booted: Booted) -> None:
    """Finding 5: 200 callbacks in a row were 200 history rows (and 200 log lines)."""
    node_id, token = made_up_machine(booted.boot, "52:54:00:be:ef:06", "EVIL-6")
    before = len(booted.history(node_id))

    body = json.dumps({"event": "booted", "hostname": "evil"}).encode()
    statuses = [call(f"{booted.boot}/agent/v1/callback", token, body)[0] for _ in range(200)]
    assert all(status < 500 for status in statuses), statuses
    added = len(booted.history(node_id)) - before
    assert added <= ROWS_BURST, f"{added} history rows for 200 callbacks"
    lines = [line for line in booted.daemon.log.read_text().splitlines()
             if node_id in line and "booted" in line]
    assert len(lines) <= ROWS_BURST + 2, f"{len(lines)} log lines for 200 callbacks"


@pytest.mark.parametrize("path", ["facts", "result", "callback"])
def test_json_nested_100000_deep_is_a_400(booted: Booted, path: str) -> None:
    """Low: the parser's RecursionError was a 500 on every agent endpoint."""
    _, token = made_up_machine(booted.boot, f"52:54:00:be:e0:{len(path):02x}", f"EVIL-{path}")
    for body in (NESTED, b'{"a":' * 100 + b"1" + b"}" * 100):  # too deep to parse; to keep
        status, text = call(f"{booted.boot}/agent/v1/{path}", token, body)
        assert status == 400, text
        assert "nests deeper than" in json.loads(text)["detail"]


# -- the daemon's own fabric scans: the real boot HTTP server, store and conductor ------------

@dataclass
class Env:
    url: str
    store: Store

    async def token(self, node_id: str, *, controller: bool = True) -> str:
        """A controller token (what the daemon gives its own configure run) or one a node
        holds (what its boot script carries)."""
        kind = "controller" if controller else "agent"
        name = f"{kind}:{node_id}:{secrets.token_hex(4)}"
        _, token = await self.store.tokens.create(name, Role.AGENT, node_id=node_id)
        return token


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
    yield Env(f"http://127.0.0.1:{port}/agent/v1/fabric", store)
    await conductor.stop()
    await runner.cleanup()


async def _post(url: str, token: str, body: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(
            url, data=body, headers={"Authorization": f"Bearer {token}",
                                     "Content-Type": "application/json"}) as response:
        return response.status, await response.text()


async def _pieces(body: bytes, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]
        await asyncio.sleep(0.005)  # each piece its own packets: the server sees them apart


async def chunked_post(url: str, token: str, body: bytes) -> tuple[int, str]:
    """aiohttp sends a generator as ``Transfer-Encoding: chunked``, piece by piece."""
    async with aiohttp.ClientSession() as http, http.post(
            url, data=_pieces(body), headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"}) as response:
        return response.status, await response.text()


async def sized_post(url: str, token: str, body: bytes) -> tuple[int, str]:
    """A ``Content-Length`` request written in pieces over a raw connection."""
    host, port = url.removeprefix("http://").split("/", 1)[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /agent/v1/fabric HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                 f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode())
    async for piece in _pieces(body):
        writer.write(piece)
        await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, text = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), text.decode()


@pytest.mark.parametrize("send", [chunked_post, sized_post], ids=["chunked", "content-length"])
async def test_a_300_kb_scan_sent_in_pieces_is_read_whole(env: Env, make_node, send) -> None:  # type: ignore[no-untyped-def]
    """Low: one read of the body returned what had arrived; 1 in 20 real posts was cut."""
    node = await make_node(S.CONFIGURING, hostname="a05-p1-dgx-01-c01")
    text = TOPOGRAPH.read_text()
    body = json.dumps({"fabric": "compute", "ibnetdiscover": text}).encode()
    assert len(body) > 300_000
    status, reply = await send(env.url, await env.token(node.id), body)
    assert status == 200, reply
    assert json.loads(reply)["switches"] == 40
    (scan,) = await env.store.topology.all()
    assert scan.text == text and scan.reporter_node_id == node.id
    # past the cap it is still a 413, however it is sent
    status, reply = await send(env.url, await env.token(node.id), b" " * 400_001)
    assert status == 413 and "larger than 400000" in reply


async def test_only_the_daemons_configure_run_may_post_a_scan(env: Env, make_node) -> None:  # type: ignore[no-untyped-def]
    """Finding 5: the node's own token, or a node the daemon is not configuring, is a 403
    and the stored fabric stays as it was; nested JSON is a 400 here too."""
    configuring = await make_node(S.CONFIGURING)
    active = await make_node(S.ACTIVE)
    body = json.dumps({"fabric": "default", "ibnetdiscover": HEALTHY.read_text()}).encode()
    for token in (await env.token(configuring.id, controller=False),
                  await env.token(active.id)):
        status, reply = await _post(env.url, token, body)
        assert status == 403, reply
    assert await env.store.topology.all() == []
    status, reply = await _post(env.url, await env.token(configuring.id), NESTED)
    assert status == 400 and "nests deeper than" in reply


async def test_scans_are_bounded_in_number_and_rate_per_node(env: Env, make_node) -> None:  # type: ignore[no-untyped-def]
    """Finding 5: any number of scans under made-up fabric names, as fast as sent."""
    node = await make_node(S.CONFIGURING)
    token = await env.token(node.id)
    text = HEALTHY.read_text()
    statuses = []
    for n in range(FABRIC_SCAN_BURST + 2):
        body = json.dumps({"fabric": f"made-up-{n}", "ibnetdiscover": text}).encode()
        status, reply = await _post(env.url, token, body)
        statuses.append(status)
        if n == MAX_FABRICS_PER_NODE:
            assert status == 422 and "at most" in reply, reply
    assert statuses[:MAX_FABRICS_PER_NODE] == [200] * MAX_FABRICS_PER_NODE
    assert statuses[FABRIC_SCAN_BURST:] == [429] * 2
    assert len(await env.store.topology.all()) == MAX_FABRICS_PER_NODE
    async with aiohttp.ClientSession() as http, http.post(
            env.url, data=b"{}", headers={"Authorization": f"Bearer {token}"}) as response:
        assert response.status == 429 and response.headers["Retry-After"] == "60"


# -- TFTP: two of our servers, one spoofed ERROR ----------------------------------------------

def _udp_datagrams(ns: Namespace) -> int:
    """UDP datagrams delivered to sockets in ``ns`` so far (its /proc/net/snmp)."""
    lines = [line.split() for line in ns.run(["cat", "/proc/net/snmp"]).stdout.splitlines()
             if line.startswith("Udp:")]
    return int(lines[1][lines[0].index("InDatagrams")])


def _spoof(source: tuple[str, int], target: tuple[str, int], payload: bytes) -> None:
    """One UDP datagram with a forged source (a raw socket: the attacker's one packet)."""
    udp = struct.pack("!HHHH", source[1], target[1], 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP,
                     0, socket.inet_aton(source[0]), socket.inet_aton(target[0]))
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw:
        raw.sendto(ip + udp, (target[0], 0))


@pytest.mark.root
@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "worker-processes"])
async def test_a_spoofed_tftp_error_does_not_loop_between_two_servers(
        workers: int, tmp_path: Path) -> None:
    """Finding 6 (the CVE-2024-2169 class): each server answered the other's ERROR with an
    ERROR from port 69, for ever (75,881 datagrams in 3 s)."""
    if (reason := netns_unavailable_reason()) is not None:
        pytest.skip(reason)
    root = tmp_path / "tftp"
    root.mkdir()
    (root / "pxe.bin").write_bytes(bytes(range(256)) * 40)
    ns = Namespace("pvtf")
    servers: list[TftpServer] = []
    addresses = ("127.0.0.1", "127.0.0.2")
    try:
        for address in addresses:
            server = TftpServer(TftpSettings(listen=f"{address}:69", workers=workers), root)
            with entered(ns):
                await server.start()
            servers.append(server)
        before = _udp_datagrams(ns)
        with entered(ns):
            _spoof((addresses[1], 69), (addresses[0], 69),
                   error_packet(E_UNDEFINED, "spoofed"))
        await asyncio.sleep(2.0)
        counted = _udp_datagrams(ns) - before
        assert counted <= 3, f"{counted} datagrams in 2 s after one spoofed ERROR"
        for address in addresses:  # both still serve a real client
            with entered(ns):  # the in-process server opens its transfer socket meanwhile
                proc = await asyncio.create_subprocess_exec(
                    "curl", "-s", "--max-time", "10", "-o", "-", f"tftp://{address}/pxe.bin",
                    stdout=asyncio.subprocess.PIPE)
                out, _ = await proc.communicate()
            assert out == (root / "pxe.bin").read_bytes(), f"no file from {address}"
    finally:
        for server in servers:
            await server.stop()
        ns.close()
