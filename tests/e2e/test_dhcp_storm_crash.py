"""SIGKILL in the middle of a DHCP storm: no bound lease lost, no address bound twice.

``provisioner serve`` (authoritative DHCP, its SQLite store) in namespace S; Kea's
``perfdhcp`` in namespace C asks for new leases at 400 DORA/s (as a relay: replies come
to its address, port 67). A raw packet socket in C records every DHCPACK that reached the
wire, independently of both programs. The daemon is killed with SIGKILL mid-storm (with
``dhcp.workers = 2``, one of its two DHCP worker processes first; with 0, its loop alone
answers). Every
ACK a client received must then be a bound lease of that MAC in the store (an ACK is sent
only after its lease is committed; offers, held in memory, may be lost: clients re-ask),
and no address may be in two rows. A restarted daemon serves the next storm from the same
store, giving clients it had bound before the kill their addresses again.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.dhcp_netns import Namespace, entered, netns_unavailable_reason, veth
from tests.peers.ports import free_tcp_port

SERVER, CLIENT = "10.77.0.1", "10.77.0.2"
ETH_P_IP = 0x0800
ACK = 5

_why_not = netns_unavailable_reason()
pytestmark = [
    pytest.mark.skipif(_why_not is not None, reason=_why_not or ""),
    pytest.mark.skipif(shutil.which("perfdhcp") is None,
                       reason="kea-admin (perfdhcp) missing: run scripts/setup.sh"),
]


class AckSniffer:
    """Every DHCPACK on ``vc0`` in ``ns``: (client MAC, yiaddr), from the raw frames."""

    def __init__(self, ns: Namespace) -> None:
        with entered(ns):
            self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
            self._sock.bind(("vc0", ETH_P_IP))
        self.acks: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="ack-sniffer", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if not select.select([self._sock], [], [], 0.2)[0]:
                continue
            frame = self._sock.recv(2048)
            if (ack := _dhcp_ack(frame)) is not None:
                self.acks.add(ack)

    def close(self) -> set[tuple[str, str]]:
        time.sleep(0.5)  # the last frames in the socket's buffer
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        return self.acks


def _dhcp_ack(frame: bytes) -> tuple[str, str] | None:
    """(chaddr, yiaddr) of a DHCPACK sent from the server port, else None."""
    ip = frame[14:]
    if len(ip) < 20 or ip[9] != socket.IPPROTO_UDP:
        return None
    udp = ip[(ip[0] & 0x0F) * 4:]
    if len(udp) < 8 + 240 or int.from_bytes(udp[0:2], "big") != 67:
        return None
    dhcp = udp[8:]
    if dhcp[0] != 2 or dhcp[236:240] != b"\x63\x82\x53\x63":  # BOOTREPLY, magic cookie
        return None
    i = 240
    while i + 1 < len(dhcp) and dhcp[i] != 255:
        code = dhcp[i]
        if code == 0:
            i += 1
            continue
        length = dhcp[i + 1]
        if code == 53 and length == 1 and i + 2 < len(dhcp):
            if dhcp[i + 2] != ACK:
                return None
            mac = ":".join(f"{b:02x}" for b in dhcp[28:34])
            return mac, socket.inet_ntoa(dhcp[16:20])
        i += 2 + length
    return None


@pytest.fixture
def segment() -> Iterator[tuple[Namespace, Namespace]]:
    server, client = Namespace("pvs"), Namespace("pvc")
    try:
        veth(server, "vs0", client, "vc0")
        server.ip("addr", "add", f"{SERVER}/16", "dev", "vs0")
        client.ip("addr", "add", f"{CLIENT}/16", "dev", "vc0")
        yield server, client
    finally:
        client.close()
        server.close()


def _serve(server: Namespace, tmp_path: Path, log: Path,
           workers: int = 0) -> subprocess.Popen[bytes]:
    config = tmp_path / "provisioner.toml"
    config.write_text(f"""state_dir = "{tmp_path / 'state'}"
[api]
listen = "127.0.0.1:{free_tcp_port()}"
[dhcp]
mode = "authoritative"
interface = "vs0"
server_address = "{SERVER}"
pool = "10.77.1.0-10.77.255.254"
netmask = "255.255.0.0"
workers = {workers}
[http]
listen = "{SERVER}:{free_tcp_port()}"
[log]
level = "WARNING"
""")
    proc = server.popen([sys.executable, "-m", "provisioner", "--config", str(config), "serve"],
                        log=log)
    deadline = time.monotonic() + 60
    while not server.run(["ss", "-Hlun", "sport = :67"]).stdout.strip():
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "the daemon did not bind DHCP in 60 s"
        time.sleep(0.1)
    return proc


def _perfdhcp(client: Namespace, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return client.popen(["perfdhcp", "-4", "-l", CLIENT, "-R", "100000", "-W", "1000000",
                         *args, SERVER], log=log)


def _answering(client: Namespace, log: Path) -> None:
    """Until 20 clients get their leases at once (the port is bound before the worker
    processes that answer it are ready; their requests wait in its sockets)."""
    deadline = time.monotonic() + 60
    while True:
        warm = client.popen(["perfdhcp", "-4", "-l", CLIENT, "-R", "20", "-n", "20",
                             "-r", "100", "-W", "1000000", SERVER], log=log)
        if warm.wait(60) == 0:
            return
        assert time.monotonic() < deadline, log.read_text()[-1500:]


def _leases(db: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT mac, ip, state FROM lease").fetchall()


def _workers(daemon: int) -> list[int]:
    """The daemon's DHCP worker processes."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == daemon and b"dhcp_worker" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("workers", [0, 2], ids=["in-daemon", "2-workers"])
def test_sigkill_mid_storm_loses_no_bound_lease(segment: tuple[Namespace, Namespace],
                                                tmp_path: Path, workers: int) -> None:
    """With worker processes, one worker is killed first (the daemon starts another on its
    socket), then the daemon: its workers die with it (nothing keeps port 67)."""
    server, client = segment
    daemon = _serve(server, tmp_path, tmp_path / "daemon.log", workers)
    deadline = time.monotonic() + 30  # the daemon binds port 67, then starts its workers
    while len(children := _workers(daemon.pid)) < workers:
        assert time.monotonic() < deadline, f"DHCP workers started: {children}"
        time.sleep(0.1)
    assert len(children) == workers
    _answering(client, tmp_path / "warm-up.log")
    sniffer = AckSniffer(client)
    storm = _perfdhcp(client, tmp_path / "storm.log", "-r", "400", "-p", "8")
    if children:
        time.sleep(1.5)
        os.kill(children[0], signal.SIGKILL)
        time.sleep(1.5)
        assert children[0] not in (now := _workers(daemon.pid)) and len(now) == workers, now
    else:
        time.sleep(3.0)  # mid-storm
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait(10)
    deadline = time.monotonic() + 10
    while server.run(["ss", "-Hlun", "sport = :67"]).stdout.strip():
        assert time.monotonic() < deadline, "a DHCP worker outlived its daemon"
        time.sleep(0.1)
    storm.wait(60)
    acked = sniffer.close()
    assert len(acked) >= 100, f"only {len(acked)} ACKs before the kill: no storm to test"

    rows = _leases(tmp_path / "state" / "provisioner.sqlite")
    stored = {mac: (ip, state) for mac, ip, state in rows}
    lost = sorted((mac, ip) for mac, ip in acked if stored.get(mac) != (ip, "bound"))
    assert lost == [], f"{len(lost)} of {len(acked)} ACKed leases not bound in the store"
    assert len({ip for _mac, ip, _state in rows}) == len(rows)  # no address in two rows

    again = _serve(server, tmp_path, tmp_path / "daemon2.log", workers)  # the same store
    sniffer = AckSniffer(client)
    after = _perfdhcp(client, tmp_path / "after.log", "-r", "100", "-n", "100")
    after.wait(60)
    more = sniffer.close()  # perfdhcp's MACs repeat from run to run: the same clients
    server.stop(again)
    assert len(more) >= 50, (f"the restarted daemon ACKed only {len(more)} clients: "
                             f"{(tmp_path / 'after.log').read_text()[-1500:]}"
                             f"{(tmp_path / 'daemon2.log').read_text()[-1500:]}")
    rows = _leases(tmp_path / "state" / "provisioner.sqlite")
    assert len({ip for _mac, ip, _state in rows}) == len({mac for mac, *_ in rows}) == len(rows)
    stored = {mac: (ip, state) for mac, ip, state in rows}
    assert all(stored.get(mac) == (ip, "bound") for mac, ip in more)
    again_acked = {mac: ip for mac, ip in acked}
    assert all(again_acked.get(mac, ip) == ip for mac, ip in more)  # sticky across the kill
