"""Boot storm: N PXE clients boot at once against ``provisioner serve``, then against
dnsmasq + tftpd-hpa + nginx, in the same run.

Each simulated client does what a machine's firmware and then iPXE do:

1. DHCP DISCOVER / REQUEST as a PXE ROM (option 60 ``PXEClient:Arch:…``, 93 architecture,
   94 NDI, 97 UUID; retransmits after 4, 8, 16, 32 s like the PXE spec);
2. TFTP of the first stage the ACK names (``undionly.kpxe`` for BIOS clients,
   ``snponly.efi`` for UEFI x64: ``--arch mixed`` gives half of each), blksize 1456 and
   tsize like a PXE ROM, one block in flight, retransmitting its last packet after
   ``--tftp-timeout`` s (doubling);
3. as iPXE: DHCP again (option 77 user class ``iPXE``; retransmits after 1, 2, 4, 8, 16 s);
4. HTTP GET of the script URL that ACK names; a script that says ``chain`` (the daemon's
   "retry later") is followed after its ``sleep`` like iPXE does;
5. HTTP GETs of the ``kernel`` and ``initrd`` URLs in that script (each byte counted).

The clients run on asyncio in one process (DHCP packets built here with ``struct``, not the
project's codec, on one port-68 socket that reads every datagram waiting at each wake-up:
asyncio's datagram transport reads one per loop iteration, and with a thousand downloads in
the same loop the replies then queued for seconds and the clients retransmitted replies
they had been sent; TFTP over its own UDP socket per transfer; HTTP over raw sockets, the
kernel and initrd bytes counted and dropped in the kernel with ``MSG_TRUNC`` so that the
clients take as little of the servers' CPU as they can), in a network namespace joined to
the servers' namespace by a veth pair. Every client has its own
MAC and, once leased, its own IP: the client namespace holds the pool's subnet as a
``local`` route (Linux "AnyIP"), so a client binds its TFTP and HTTP sockets to the address
it leased, and the servers' namespace routes the pool to the client end of the veth (one
neighbour entry for 1,000 clients). DHCP replies are broadcast (the clients set the
broadcast flag, as PXE ROMs do). Client starts are spread evenly over ``--spread`` s. The
MACs are spread over one OUI (see ``client_macs``: consecutive MACs make dnsmasq NAK).

Stacks (both serve the same files; the TFTP root holds copies of /usr/lib/ipxe):

- ``provisioner serve``: authoritative DHCP, TFTP and the boot HTTP server with its SQLite
  store and the shipped defaults, except what a storm bench must change (printed in the
  output): ``dhcp.discovery_burst`` = 2 × clients and ``discovery_rate_per_s`` 1,000 (all
  clients are new MACs, discovered in one burst; the default 50 / 5 per s would tell most
  to retry, by design), ``boot.ramdisk_build = "off"`` (no background ramdisk build), log
  level WARNING. Every client has its own address, so the per-source caps (TFTP 64
  transfers, HTTP 256 connections, 10 discoveries per address) stay at their defaults.
  Each client gets its own per-node script (a discovered node: inspection, with a token).
- dnsmasq (``--leasefile-ro`` as in bench/dhcp_bench.py; ``dhcp-boot`` by architecture and
  user class), tftpd-hpa (forks per transfer) and nginx (``worker_processes auto``,
  sendfile) serving one static script of the same form (kernel and initrd URLs on nginx).

Kernel and initrd: ``--kernel`` / ``--initrd`` name real files; by default the bench writes
random files of ``--kernel-mib`` (8) and ``--initrd-mib`` (40) MiB, the size of a real
inspection ramdisk, because the ramdisk may not be built on this machine; they go under the
daemon's ``boot.artefacts_dir`` (``inspect/vmlinuz``, ``inspect/initrd.gz``), nginx serves
the same directory.

Reported per stack: the time until the last client has everything, the p50 / p99 of each
client's own time (its start to its last initrd byte), DHCP and TFTP retransmissions by the
clients, TCP segments the servers' namespace retransmitted, UDP datagrams either side's
sockets had no room for, the median time at which each phase ended, failures (a client not done
after ``--deadline`` s, or a wrong size), the CPU time the servers' processes used while the
clients ran (user + system, their children's included; the loopback's and the veth's softirq
work lands on whichever process the kernel interrupted) and the load average. The ratio is
the reference stack's time over ours (higher is better for us), for the last client
(``ratio``) and for the median client (``ratio p50``: the p50 of the clients' own times).
``--rounds`` (3) rounds run interleaved (ours, theirs, ours, …); each round's ratios are
taken within that round, and the bench prints every round's ratios and their median with
its spread (min–max); the table shows the medians over the rounds.

Run as root from the repository root:  python3 bench/storm_bench.py [--clients 1000]
(``--verbose``: every network counter that moved, per namespace; ``--logs DIR``: the servers'
logs and every client's phase ends per round, which ``bench/storm_progress.py`` turns into a
second-by-second table; ``--ours-toml``: TOML appended to the daemon's config, for
experiments.)
Needs: dnsmasq-base, tftpd-hpa, nginx, ipxe (/usr/lib/ipxe). Stops every process it starts
and deletes its namespaces. Traffic stays inside the namespaces.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _netns
import _proc
import _rounds
from _netns import listening, sh, veth_pair

SERVER, CLIENT = "10.77.0.1", "10.77.0.2"
POOL_NET = "10.77.16.0/20"  # the leases: "local" in the client namespace (AnyIP)
POOL_FIRST, POOL_LAST = "10.77.16.1", "10.77.31.254"
HTTP_PORT = 8080
IPXE_DIR = Path("/usr/lib/ipxe")
FIRST_STAGES = ("undionly.kpxe", "snponly.efi")
KERNEL, INITRD = "inspect/vmlinuz", "inspect/initrd.gz"
ARCH_BIOS, ARCH_EFI_X64 = 0, 7

PHASES = ("dhcp", "tftp", "ipxe_dhcp", "script", "kernel", "initrd")

# DHCP message types and the timeouts between retransmissions (PXE spec; iPXE's dhcp.c)
DISCOVER, OFFER, REQUEST, ACK, NAK = 1, 2, 3, 5, 6
FIRMWARE_TIMEOUTS = (4.0, 8.0, 16.0, 32.0)
IPXE_TIMEOUTS = (1.0, 2.0, 4.0, 8.0, 16.0)
COOKIE = b"\x63\x82\x53\x63"
PARAMS = bytes([1, 3, 6, 12, 15, 17, 28, 43, 51, 54, 58, 59, 60, 66, 67, 97, 128, 129, 130,
                131, 132, 133, 134, 135, 175])
_BOOTP = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")

# TFTP
RRQ, DATA, ACK_TFTP, ERROR, OACK = 1, 3, 4, 5, 6
BLKSIZE = 1456
TFTP_RETRIES = 6
SO_RCVBUFFORCE = 33  # Linux; root may exceed net.core.rmem_max


# -- the clients (run inside the client namespace: --client-run) ------------------------------


@dataclass
class ClientResult:
    index: int
    start: float  # scheduled start, seconds after the run's zero
    done: float | None = None  # when the last initrd byte came, same clock
    dhcp_retx: int = 0
    ipxe_dhcp_retx: int = 0  # of dhcp_retx, those of iPXE's own DHCP
    tftp_retx: int = 0
    http_retries: int = 0
    script_retries: int = 0
    error: str | None = None
    phases: dict[str, float] = field(default_factory=dict)


def client_macs(count: int) -> list[bytes]:
    """Distinct MACs spread over the 24 bits after one OUI, the same in every run: the order
    of a rack's MACs matters to dnsmasq (its address choice is a hash of the MAC: with
    consecutive MACs, clients in flight are offered the same addresses and NAKed "address
    in use" in a storm), so the bench uses neither end of that."""
    return [bytes([0x52, 0x54, 0x00]) + n.to_bytes(3, "big")
            for n in random.Random(14).sample(range(1 << 24), count)]


def dhcp_packet(kind: int, xid: int, mac: bytes, arch: int, ipxe: bool,
                requested: bytes | None = None, server_id: bytes | None = None) -> bytes:
    zero = b"\0\0\0\0"
    head = _BOOTP.pack(1, 1, 6, 0, xid, 0, 0x8000, zero, zero, zero, zero, mac, b"", b"")
    opts = bytearray(COOKIE)

    def opt(code: int, data: bytes) -> None:
        opts.extend(bytes((code, len(data))) + data)

    opt(53, bytes((kind,)))
    opt(57, struct.pack("!H", 1472))
    opt(93, struct.pack("!H", arch))
    opt(94, b"\x01\x02\x01")
    opt(97, b"\x00" + uuid.uuid5(uuid.NAMESPACE_OID, mac.hex()).bytes)
    opt(60, f"PXEClient:Arch:{arch:05d}:UNDI:002001".encode())
    if ipxe:
        opt(77, b"iPXE")
    if requested is not None:
        opt(50, requested)
    if server_id is not None:
        opt(54, server_id)
    opt(55, PARAMS)
    opts.append(255)
    packet = head + bytes(opts)
    return packet + b"\0" * max(0, 300 - len(packet))


@dataclass(frozen=True)
class DhcpReply:
    kind: int
    yiaddr: bytes
    siaddr: bytes
    server_id: bytes | None
    bootfile: str
    message: str = ""


def parse_dhcp(data: bytes) -> tuple[int, DhcpReply] | None:
    if len(data) < 241 or data[0] != 2 or data[236:240] != COOKIE:
        return None
    xid = struct.unpack_from("!I", data, 4)[0]
    options: dict[int, bytes] = {}
    i = 240
    while i < len(data):
        code = data[i]
        if code == 255:
            break
        if code == 0:
            i += 1
            continue
        if i + 1 >= len(data):
            break
        size = data[i + 1]
        options[code] = data[i + 2:i + 2 + size]
        i += 2 + size
    if 53 not in options:
        return None
    bootfile = options.get(67) or data[108:236].split(b"\0", 1)[0]
    return xid, DhcpReply(options[53][0], data[16:20], data[20:24], options.get(54),
                          bootfile.rstrip(b"\0").decode("ascii", "replace"),
                          options.get(56, b"").decode("ascii", "replace"))


class DhcpPort:
    """Port 68 on the client end of the veth: every client's replies, by xid. All the
    datagrams waiting are read at each wake-up (asyncio's datagram transport reads one per
    loop iteration: with a thousand downloads in the same loop, replies queued behind each
    other for seconds and the clients' own timers fired before their replies were read)."""

    def __init__(self, sock: socket.socket, macs: list[bytes]) -> None:
        self.sock = sock
        self.macs = macs
        self.waiting: dict[int, asyncio.Queue[DhcpReply]] = {}
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        while True:
            try:
                data = self.sock.recv(2048)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP error queued for the socket: one per recv
                if self.sock.fileno() < 0:
                    return
                continue
            self.datagram_received(data)

    def datagram_received(self, data: bytes) -> None:
        parsed = parse_dhcp(data)
        if parsed is not None and (queue := self.waiting.get(parsed[0])) is not None:
            queue.put_nowait(parsed[1])

    def send(self, packet: bytes) -> None:
        with suppress(BlockingIOError):  # a full buffer drops it, as a network may
            self.sock.sendto(packet, ("255.255.255.255", 67))


async def dhcp_lease(port: DhcpPort, result: ClientResult, xid: int, arch: int,
                     ipxe: bool) -> DhcpReply:
    """DISCOVER, OFFER, REQUEST, ACK with retransmissions; the ACK."""
    mac = port.macs[result.index]
    timeouts = IPXE_TIMEOUTS if ipxe else FIRMWARE_TIMEOUTS
    queue: asyncio.Queue[DhcpReply] = asyncio.Queue()
    port.waiting[xid] = queue

    async def exchange(packet: bytes, want: tuple[int, ...],
                       check: Callable[[DhcpReply], bool]) -> DhcpReply | None:
        for n, timeout in enumerate(timeouts):
            if n:
                result.dhcp_retx += 1
            port.send(packet)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                try:
                    reply = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if reply.kind in want and check(reply):
                    return reply
        return None

    naks: list[str] = []
    try:
        for _ in range(3):  # a NAK or a silent REQUEST starts over
            offer = await exchange(dhcp_packet(DISCOVER, xid, mac, arch, ipxe), (OFFER,),
                                   lambda r: r.yiaddr != b"\0\0\0\0")
            if offer is None:
                raise RuntimeError(f"{'iPXE' if ipxe else 'PXE ROM'} DHCP: no OFFER")
            server_id = offer.server_id or offer.siaddr

            def from_server(reply: DhcpReply, chosen: bytes = server_id) -> bool:
                return reply.server_id in (None, chosen)

            ack = await exchange(dhcp_packet(REQUEST, xid, mac, arch, ipxe, offer.yiaddr,
                                             server_id), (ACK, NAK), from_server)
            if ack is not None and ack.kind == ACK:
                return ack
            naks.append(ack.message if ack is not None else "no answer")
            while not queue.empty():
                queue.get_nowait()
        raise RuntimeError(f"{'iPXE' if ipxe else 'PXE ROM'} DHCP: no ACK ({'; '.join(naks)})")
    finally:
        del port.waiting[xid]


class TftpGet(asyncio.DatagramProtocol):
    """One read request, one block in flight, retransmitting the last packet sent."""

    def __init__(self, server: str, filename: str, timeout_s: float,
                 result: ClientResult) -> None:
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[int] = self.loop.create_future()
        self.server = server
        self.rrq = struct.pack("!H", RRQ) + b"\0".join(
            (filename.encode(), b"octet", b"blksize", str(BLKSIZE).encode(), b"tsize",
             b"0")) + b"\0"
        self.timeout_s = timeout_s
        self.result = result
        self.transport: asyncio.DatagramTransport | None = None
        self.peer: tuple[str, int] | None = None
        self.last: tuple[bytes, tuple[str, int]] = (self.rrq, (server, 69))
        self.blksize = 512
        self.expected = 1
        self.received = 0
        self.tries = 0
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(*self.last)

    def _send(self, packet: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        self.last = (packet, addr)
        self.transport.sendto(packet, addr)
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(self.timeout_s * (2 ** self.tries), self._expired)

    def _expired(self) -> None:
        self.tries += 1
        if self.tries > TFTP_RETRIES:
            self._finish(RuntimeError(f"TFTP: no answer after {TFTP_RETRIES} retries"))
            return
        self.result.tftp_retx += 1
        self._send(*self.last)

    def _finish(self, outcome: int | BaseException) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not self.done.done():
            if isinstance(outcome, BaseException):
                self.done.set_exception(outcome)
            else:
                self.done.set_result(outcome)
        assert self.transport is not None
        self.transport.close()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.peer is None and addr[0] == self.server:
            self.peer = addr
        if addr != self.peer or len(data) < 4 or self.done.done():
            return
        opcode, number = struct.unpack_from("!HH", data)
        if opcode == ERROR:
            self._finish(RuntimeError(f"TFTP error {number}: {data[4:-1]!r}"))
        elif opcode == OACK and self.expected == 1:
            fields = data[2:].split(b"\0")
            opts = dict(zip(fields[::2], fields[1::2], strict=False))
            self.blksize = int(opts.get(b"blksize", b"512"))
            self.tries = 0
            self._send(struct.pack("!HH", ACK_TFTP, 0), addr)
        elif opcode == DATA:
            if number == self.expected & 0xFFFF:
                self.received += len(data) - 4
                self.expected += 1
                self.tries = 0
                ack = struct.pack("!HH", ACK_TFTP, number)
                if len(data) - 4 < self.blksize:
                    assert self.transport is not None
                    self.transport.sendto(ack, addr)
                    self._finish(self.received)
                else:
                    self._send(ack, addr)
            elif number == (self.expected - 1) & 0xFFFF:  # our ACK was lost: say it again
                assert self.transport is not None
                self.transport.sendto(struct.pack("!HH", ACK_TFTP, number), addr)

    def error_received(self, exc: Exception) -> None:
        pass


async def tftp_get(server: str, filename: str, source: str, timeout_s: float,
                   result: ClientResult) -> int:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_datagram_endpoint(
        lambda: TftpGet(server, filename, timeout_s, result), local_addr=(source, 0))
    return await proto.done


def split_url(url: str) -> tuple[str, int, str]:
    if not url.startswith("http://"):
        raise RuntimeError(f"not an http URL: {url!r}")
    host_port, _, path = url[7:].partition("/")
    host, _, port = host_port.partition(":")
    return host, int(port or 80), "/" + path


async def http_get(source: str, url: str, sink: bytearray | None,
                   timeout_s: float) -> tuple[int, bytes]:
    """GET ``url`` from ``source``: (body length, body) — the body is only kept when
    ``sink`` is None (small documents); else it is read into ``sink`` and dropped."""
    host, port, path = split_url(url)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout_s):
            sock.bind((source, 0))
            await loop.sock_connect(sock, (host, port))
            await loop.sock_sendall(sock, (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: iPXE/1.21.1\r\n"
                "Connection: close\r\n\r\n").encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await loop.sock_recv(sock, 65536)
                if not chunk:
                    raise RuntimeError(f"{url}: connection closed in the headers")
                head += chunk
            head, _, rest = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            if status != 200:
                raise RuntimeError(f"{url}: HTTP {status}")
            length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                           if line.lower().startswith("content-length:")), None)
            if length is None:
                raise RuntimeError(f"{url}: no Content-Length")
            body = bytearray(rest)
            got = len(rest)
            view = memoryview(sink) if sink is not None else None
            while got < length:
                if view is not None:
                    n = await discard(loop, sock, view, length - got)
                    if not n:
                        break
                    got += n
                else:
                    chunk = await loop.sock_recv(sock, 65536)
                    if not chunk:
                        break
                    body += chunk
                    got += len(chunk)
            if got != length:
                raise RuntimeError(f"{url}: {got} of {length} bytes")
            return length, bytes(body) if sink is None else b""
    finally:
        sock.close()


async def discard(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview,
                  most: int) -> int:
    """Up to ``most`` received bytes, dropped in the kernel (TCP ``MSG_TRUNC``: not copied
    to ``view``), so the clients' process costs the servers' CPU as little as it can."""
    while True:
        try:
            return sock.recv_into(view, min(len(view), most), socket.MSG_TRUNC)
        except BlockingIOError:
            readable = loop.create_future()
            loop.add_reader(sock.fileno(), readable.set_result, None)
            try:
                await readable
            finally:
                loop.remove_reader(sock.fileno())


def script_targets(script: str) -> tuple[str | None, str | None, str | None, float]:
    """(kernel URL, initrd URL, chain URL, sleep seconds) from an iPXE script."""
    kernel = initrd = chain = None
    sleep = 0.0
    for line in script.splitlines():
        words = line.split()
        if not words:
            continue
        urls = [w for w in words[1:] if w.startswith("http://")]
        if words[0] == "kernel" and urls:
            kernel = urls[0]
        elif words[0] == "initrd" and urls:
            initrd = urls[0]
        elif words[0] == "chain" and urls:
            chain = urls[0]
        elif words[0] == "sleep" and len(words) > 1:
            sleep = float(words[1])
    return kernel, initrd, chain, sleep


@dataclass(frozen=True)
class ClientPlan:
    clients: int
    spread_s: float
    arch: str
    tftp_timeout_s: float
    deadline_s: float
    sizes: dict[str, int]  # URL path suffix -> expected bytes


async def one_client(index: int, plan: ClientPlan, port: DhcpPort, zero: float,
                     sink: bytearray, salt: int) -> ClientResult:
    start = plan.spread_s * index / max(1, plan.clients)
    result = ClientResult(index, start)
    arch = {"bios": ARCH_BIOS, "uefi": ARCH_EFI_X64}.get(
        plan.arch, ARCH_BIOS if index % 2 == 0 else ARCH_EFI_X64)
    await asyncio.sleep(max(0.0, zero + start - time.monotonic()))

    def mark(phase: str) -> None:
        result.phases[phase] = time.monotonic() - zero - start

    async def get(source: str, url: str, keep: bool) -> tuple[int, bytes]:
        for attempt in range(3):
            try:
                return await http_get(source, url, None if keep else sink, plan.deadline_s)
            except OSError:
                if attempt == 2:
                    raise
                result.http_retries += 1
                await asyncio.sleep(1.0)
        raise AssertionError

    try:
        async with asyncio.timeout(plan.deadline_s - start):
            ack = await dhcp_lease(port, result, (salt + 4 * index) & 0xFFFFFFFF, arch, False)
            mark("dhcp")
            source = socket.inet_ntoa(ack.yiaddr)
            if not ack.bootfile:
                raise RuntimeError("no boot file in the ACK")
            size = await tftp_get(socket.inet_ntoa(ack.siaddr), ack.bootfile, source,
                                  plan.tftp_timeout_s, result)
            if size != plan.sizes.get(ack.bootfile, -1):
                raise RuntimeError(f"TFTP {ack.bootfile}: {size} bytes")
            mark("tftp")
            before_ipxe = result.dhcp_retx
            ack = await dhcp_lease(port, result, (salt + 4 * index + 1) & 0xFFFFFFFF, arch,
                                   True)
            mark("ipxe_dhcp")
            result.ipxe_dhcp_retx = result.dhcp_retx - before_ipxe
            source, url = socket.inet_ntoa(ack.yiaddr), ack.bootfile
            while True:
                _, body = await get(source, url, keep=True)
                kernel, initrd, chain, pause = script_targets(body.decode())
                if kernel is not None and initrd is not None:
                    break
                if chain is None:
                    raise RuntimeError(f"script names no kernel, initrd or chain: {body!r}")
                result.script_retries += 1
                await asyncio.sleep(pause)
                url = chain
            mark("script")
            for name, target in (("kernel", kernel), ("initrd", initrd)):
                length, _ = await get(source, target, keep=False)
                want = next((n for suffix, n in plan.sizes.items()
                             if target.endswith(suffix)), -1)
                if length != want:
                    raise RuntimeError(f"{target}: {length} bytes, expected {want}")
                mark(name)
            result.done = time.monotonic() - zero
    except TimeoutError:
        result.error = f"not done after {plan.deadline_s:.0f} s"
    except (RuntimeError, OSError, ValueError) as exc:
        result.error = str(exc)
    return result


async def run_clients(plan: ClientPlan) -> dict[str, object]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"vc0")
    sock.bind(("0.0.0.0", 68))
    macs = client_macs(plan.clients)
    port = DhcpPort(sock, macs)
    sink = bytearray(4 << 20)
    salt = random.getrandbits(32)
    cpu = time.process_time()
    zero = time.monotonic() + 0.2
    results = await asyncio.gather(*(one_client(i, plan, port, zero, sink, salt)
                                     for i in range(plan.clients)))
    return {"clients": [asdict(r) for r in results], "cpu_s": time.process_time() - cpu}


# -- the servers (in the server namespace) ----------------------------------------------------


@contextmanager
def namespaces() -> Iterator[tuple[str, str]]:
    # every leased address is the client namespace's own (AnyIP), reached through it
    with veth_pair("s", SERVER, CLIENT, routes=(
            ("-n", "{cli}", "route", "add", "local", POOL_NET, "dev", "lo"),
            ("-n", "{srv}", "route", "add", POOL_NET, "via", CLIENT, "dev", "vs0"))) as pair:
        yield pair


def wait_ready(ns: str, procs: list[subprocess.Popen[bytes]], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for proto, port in (("u", 67), ("u", 69), ("t", HTTP_PORT)):
        while not listening(ns, proto, port):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"nothing listens on {proto} {port} in {ns}")
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    _netns.stop(proc, grace_s=20.0)


def _toml(settings: dict[str, Any]) -> str:
    """Scalars first, then one table per section (json quoting is valid TOML for these)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for section, values in settings.items():
        if isinstance(values, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def start_ours(ns: str, d: Path, files: Path, clients: int,
               extra: str = "") -> list[subprocess.Popen[bytes]]:
    settings: dict[str, Any] = {
        "state_dir": str(d / "state"),
        "api": {"listen": "127.0.0.1:18700"},
        "dhcp": {"mode": "authoritative", "interface": "vs0", "server_address": SERVER,
                 "pool": f"{POOL_FIRST}-{POOL_LAST}", "netmask": "255.255.0.0",
                 "discovery_rate_per_s": 1000.0, "discovery_burst": max(50, 2 * clients)},
        "tftp": {"listen": f"{SERVER}:69"},
        "http": {"listen": f"{SERVER}:{HTTP_PORT}"},
        "boot": {"assets_dir": str(files / "tftp"), "artefacts_dir": str(files / "artefacts"),
                 "ramdisk_build": "off"},
        "log": {"level": "WARNING"},
    }
    for section, values in tomllib.loads(extra).items():  # --ours-toml, merged per section
        if isinstance(values, dict):
            settings.setdefault(section, {}).update(values)
        else:
            settings[section] = values
    config = d / "provisioner.toml"
    config.write_text(_toml(settings))
    exe = Path(sys.executable).parent / "provisioner"
    log = (d / "provisioner.log").open("wb")
    return [subprocess.Popen(["ip", "netns", "exec", ns, str(exe), "--config", str(config),
                              "serve"], stdout=log, stderr=subprocess.STDOUT)]


def start_theirs(ns: str, d: Path, files: Path, clients: int,
                 nginx_workers: str) -> list[subprocess.Popen[bytes]]:
    script_url = f"http://{SERVER}:{HTTP_PORT}/boot/static.ipxe"
    dnsmasq = [
        "ip", "netns", "exec", ns, "dnsmasq", "-k", "--port=0", "--interface=vs0",
        "--bind-interfaces", "--dhcp-authoritative", "--user=root", "--no-ping",
        f"--dhcp-range={POOL_FIRST},{POOL_LAST},255.255.0.0,1h", "--dhcp-lease-max=100000",
        "--leasefile-ro", "--quiet-dhcp", f"--log-facility={d / 'dnsmasq.log'}",
        "--dhcp-userclass=set:ipxe,iPXE", "--dhcp-match=set:efi64,option:client-arch,7",
        f"--dhcp-boot=tag:ipxe,{script_url}",
        f"--dhcp-boot=tag:!ipxe,tag:efi64,snponly.efi,boot,{SERVER}",
        f"--dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe,boot,{SERVER}"]
    tftpd = ["ip", "netns", "exec", ns, "in.tftpd", "-L", "-a", f"{SERVER}:69", "-s", "-u",
             "root", str(files / "tftp")]
    conf = d / "nginx.conf"
    conf.write_text(f"""
user root;
worker_processes {nginx_workers};
daemon off;
error_log {d}/nginx-error.log;
pid {d}/nginx.pid;
events {{ worker_connections {max(1024, 4 * clients)}; }}
http {{
  access_log off;
  sendfile on; tcp_nopush on;
  default_type application/octet-stream;
  client_body_temp_path {d}/nginx-body; proxy_temp_path {d}/nginx-proxy;
  fastcgi_temp_path {d}/nginx-fcgi; uwsgi_temp_path {d}/nginx-uwsgi;
  scgi_temp_path {d}/nginx-scgi;
  server {{
    listen {SERVER}:{HTTP_PORT};
    location = /boot/static.ipxe {{ alias {d}/static.ipxe; }}
    location /artefacts/ {{ alias {files / 'artefacts'}/; }}
  }}
}}
""")
    base = f"http://{SERVER}:{HTTP_PORT}"
    (d / "static.ipxe").write_text(
        "#!ipxe\necho storm: inspect node\n"
        f"kernel {base}/artefacts/{KERNEL} initrd=initrd.gz console=ttyS0 "
        f"provisioner.url={base} provisioner.token={'x' * 43} provisioner.mac=${{mac}}\n"
        f"initrd --name initrd.gz {base}/artefacts/{INITRD}\nboot\n")
    nginx = ["ip", "netns", "exec", ns, "nginx", "-c", str(conf)]
    return [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for cmd in (dnsmasq, tftpd, nginx)]


def counters(ns: str) -> dict[str, int]:
    """The namespace's /proc/net/snmp and /proc/net/netstat, as ``Tcp.RetransSegs``: n."""
    text = sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp", "/proc/net/netstat").stdout
    found: dict[str, int] = {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        prefix = names.split(":", 1)[0]
        for name, value in zip(names.split()[1:], values.split()[1:], strict=False):
            found[f"{prefix}.{name}"] = int(value)
    return found


@dataclass
class StackRun:
    name: str
    total_s: float
    p50_s: float
    p99_s: float
    dhcp_retx: int
    tftp_retx: int
    tcp_retx: int
    syn_retx: int
    server_udp_drops: int
    client_udp_drops: int
    http_retries: int
    script_retries: int
    failures: int
    client_cpu_s: float
    server_cpu_s: float
    load: str
    phases: dict[str, float]
    spans: dict[str, float]
    errors: list[str]
    ipxe_dhcp_retx: int = 0  # of dhcp_retx


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(name: str, start: Callable[[Path], list[subprocess.Popen[bytes]]], srv: str,
            cli: str, plan: ClientPlan, logs: Path | None, verbose: bool) -> StackRun:
    with tempfile.TemporaryDirectory(prefix="stormbench") as tmp:
        d = Path(tmp)
        d.chmod(0o755)
        procs = start(d)
        try:
            wait_ready(srv, procs)
            time.sleep(1.0)
            before = {ns: counters(ns) for ns in (srv, cli)}
            server_cpu = _proc.tree_cpu_seconds([p.pid for p in procs])
            out = subprocess.run(
                ["ip", "netns", "exec", cli, sys.executable, __file__, "--client-run",
                 json.dumps(asdict(plan))], capture_output=True, text=True,
                timeout=plan.deadline_s + 120)
            if out.returncode != 0:
                raise RuntimeError(f"clients failed:\n{out.stderr}")
            server_cpu = _proc.tree_cpu_seconds([p.pid for p in procs]) - server_cpu
            after = {ns: counters(ns) for ns in (srv, cli)}
            delta = {ns: {k: v - before[ns].get(k, 0) for k, v in after[ns].items()}
                     for ns in after}
            tcp, syn = delta[srv]["Tcp.RetransSegs"], delta[srv].get("TcpExt.TCPSynRetrans", 0)
            # datagrams the servers' and the clients' sockets had no room for
            udp_drops = {ns: delta[ns].get("Udp.RcvbufErrors", 0) for ns in delta}
            if verbose:
                for ns, label in ((srv, "servers"), (cli, "clients")):
                    print(f"  {label}' namespace counters: " + ", ".join(
                        f"{k} {v}" for k, v in sorted(delta[ns].items()) if v), file=sys.stderr)
            load = Path("/proc/loadavg").read_text().split()[:3]
        finally:
            for proc in reversed(procs):
                stop(proc)
            if logs is not None:
                target = logs / name.split()[0]
                target.mkdir(parents=True, exist_ok=True)
                for log in d.glob("*.log"):
                    shutil.copyfile(log, target / log.name)
    data = json.loads(out.stdout)
    if logs is not None:  # every client's phase ends, a file a round (clients-1.json, ...)
        target = logs / name.split()[0]
        rounds = len(list(target.glob("clients-*.json")))
        (target / f"clients-{rounds + 1}.json").write_text(json.dumps(
            {"kernel_bytes": plan.sizes[KERNEL], "initrd_bytes": plan.sizes[INITRD], **data}))
    results = [ClientResult(**r) for r in data["clients"]]
    done = [r for r in results if r.done is not None and r.error is None]
    own = [r.done - r.start for r in done if r.done is not None]
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    phases = {p: statistics.median(r.phases[p] for r in done) for p in PHASES if done}
    # how long each phase itself took (its end less the previous one's), median client
    spans = {p: statistics.median(r.phases[p] - r.phases.get(q, 0.0) for r in done)
             for q, p in zip(("",) + PHASES, PHASES, strict=False) if done}
    run = StackRun(
        name, max((r.done for r in done if r.done is not None), default=float("nan")),
        percentile(own, 0.5), percentile(own, 0.99), sum(r.dhcp_retx for r in results),
        sum(r.tftp_retx for r in results), tcp, syn, udp_drops[srv], udp_drops[cli],
        sum(r.http_retries for r in results),
        sum(r.script_retries for r in results), len(results) - len(done), data["cpu_s"],
        server_cpu, " ".join(load), phases, spans,
        [f"{n} × {e}" for e, n in sorted(errors.items())],
        ipxe_dhcp_retx=sum(r.ipxe_dhcp_retx for r in results))
    print(f"{name}: last client done at {run.total_s:.2f} s, p50 {run.p50_s:.2f} s, p99 "
          f"{run.p99_s:.2f} s, {run.failures} failed, DHCP/TFTP/TCP retransmits "
          f"{run.dhcp_retx}/{run.tftp_retx}/{run.tcp_retx} (DHCP: {run.ipxe_dhcp_retx} by iPXE; "
          f"TCP: {run.syn_retx} SYN-ACKs), "
          "UDP receive-buffer drops "
          f"servers {run.server_udp_drops} / clients {run.client_udp_drops}, HTTP retries "
          f"{run.http_retries}, script retries {run.script_retries}, client CPU "
          f"{run.client_cpu_s:.1f} s, server CPU {run.server_cpu_s:.1f} s, load {run.load}",
          file=sys.stderr)
    print("  median phase ends (s after the client's start): " + ", ".join(
        f"{p} {t:.2f}" for p, t in phases.items()), file=sys.stderr)
    print("  median phase durations (s): " + ", ".join(
        f"{p} {t:.2f}" for p, t in spans.items()), file=sys.stderr)
    for line in run.errors[:10]:
        print(f"  failure: {line}", file=sys.stderr)
    return run


def prepare_files(root: Path, args: argparse.Namespace) -> dict[str, int]:
    """The TFTP root (copies of the iPXE first stages) and the artefacts; name -> size."""
    tftp, artefacts = root / "tftp", root / "artefacts"
    (artefacts / "inspect").mkdir(parents=True)
    tftp.mkdir()
    sizes = {}
    for name in FIRST_STAGES:
        shutil.copyfile(IPXE_DIR / name, tftp / name)
        sizes[name] = (tftp / name).stat().st_size
    for rel, given, mib in ((KERNEL, args.kernel, args.kernel_mib),
                            (INITRD, args.initrd, args.initrd_mib)):
        target = artefacts / rel
        if given is not None:
            shutil.copyfile(given, target)
        else:
            with target.open("wb") as fh:
                chunk = os.urandom(1 << 20)
                for _ in range(mib):
                    fh.write(chunk)
        sizes[rel] = target.stat().st_size
    for path in (root, tftp, artefacts, artefacts / "inspect"):
        path.chmod(0o755)
    return sizes


def report(every: dict[str, list[StackRun]], clients: int) -> str:
    """One row a stack: the medians over its rounds (failures: all rounds' together); our
    ratios are the median of each round's ratio, ours and theirs from the same round, for
    the last client and the median client (p50); then every round's ratios and the spread."""
    ours = every.get("provisioner serve", [])
    ref = next((rs for name, rs in every.items() if name != "provisioner serve"), None)
    last = [_rounds.ratio(t.total_s, o.total_s) for o, t in zip(ours, ref or [], strict=False)]
    p50 = [_rounds.ratio(t.p50_s, o.p50_s) for o, t in zip(ours, ref or [], strict=False)]
    lines = [f"{max(map(len, every.values()), default=0)} round(s) a stack, interleaved "
             f"({', '.join(every)}, then again); medians over the rounds", "",
             "| stack | clients | last client done | p50 per client | p99 per client | "
             "DHCP retransmits | TFTP retransmits | TCP retransmits (servers) | failures | "
             "ratio p50 (their time / ours) | ratio (their time / ours) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in every.items():
        ratio_p50, ratio = "—", "—"
        if name == "provisioner serve" and ref is not None:
            ratio_p50, ratio = (_rounds.cell(_rounds.median(v)) for v in (p50, last))

        def med(get: Callable[[StackRun], float], rs: list[StackRun] = rs) -> float:
            return _rounds.median([get(r) for r in rs])

        lines.append(f"| {name} | {clients} | {med(lambda r: r.total_s):.2f} s | "
                     f"{med(lambda r: r.p50_s):.2f} s | {med(lambda r: r.p99_s):.2f} s | "
                     f"{med(lambda r: r.dhcp_retx):.0f} | {med(lambda r: r.tftp_retx):.0f} | "
                     f"{med(lambda r: r.tcp_retx):.0f} ({med(lambda r: r.syn_retx):.0f} "
                     f"SYN-ACK) | {sum(r.failures for r in rs)} | {ratio_p50} | {ratio} |")
    lines.append("")
    for name, rs in every.items():
        lines.append(f"{name}: last client " + ", ".join(f"{r.total_s:.2f}" for r in rs)
                     + " s; p50 " + ", ".join(f"{r.p50_s:.2f}" for r in rs) + " s; server "
                     "CPU " + ", ".join(f"{r.server_cpu_s:.1f}" for r in rs) + " s; median "
                     "phase ends (median over the rounds): " + ", ".join(
                         f"{p} {_rounds.median([r.phases.get(p, float('nan')) for r in rs]):.2f}"
                         for p in PHASES) + "; median phase durations: " + ", ".join(
                         f"{p} {_rounds.median([r.spans.get(p, float('nan')) for r in rs]):.2f}"
                         for p in PHASES))
    if ours and ref:
        lines.append(_rounds.summary("ratio, last client (their time / ours)", last))
        lines.append(_rounds.summary("ratio p50, median client (their time / ours)", p50))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--spread", type=float, default=3.0,
                        help="seconds over which the clients start")
    parser.add_argument("--arch", choices=("mixed", "bios", "uefi"), default="mixed")
    parser.add_argument("--kernel", type=Path, help="a real kernel (default: random bytes)")
    parser.add_argument("--initrd", type=Path, help="a real initrd (default: random bytes)")
    parser.add_argument("--kernel-mib", type=int, default=8)
    parser.add_argument("--initrd-mib", type=int, default=40)
    parser.add_argument("--tftp-timeout", type=float, default=1.0)
    parser.add_argument("--deadline", type=float, default=300.0,
                        help="a client not done this long after its start failed")
    parser.add_argument("--nginx-workers", default="auto")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per stack, interleaved (ours, theirs, ours, …); every "
                        "round's ratios and their median are reported")
    parser.add_argument("--verbose", action="store_true",
                        help="print every network counter that moved, per namespace")
    parser.add_argument("--ours-toml", default="", help="TOML appended to the daemon's "
                        "config (experiments, e.g. '[lifecycle]\\nauto_inspect = false')")
    parser.add_argument("--logs", type=Path, help="copy the servers' logs here, and every "
                        "client's phase ends of each round (clients-N.json)")
    parser.add_argument("--only", default="", help="run only stacks whose name has this")
    parser.add_argument("--client-run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_run is not None:
        plan = ClientPlan(**json.loads(args.client_run))
        print(json.dumps(asyncio.run(run_clients(plan))))
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    for tool in ("dnsmasq", "in.tftpd", "nginx"):
        if shutil.which(tool) is None and not args.only.startswith("provisioner"):
            raise SystemExit(f"{tool} is not installed (apt-get install dnsmasq-base "
                             "tftpd-hpa nginx)")
    with tempfile.TemporaryDirectory(prefix="stormfiles") as tmp:
        files = Path(tmp)
        sizes = prepare_files(files, args)
        plan = ClientPlan(args.clients, args.spread, args.arch, args.tftp_timeout,
                          args.deadline, sizes)
        print(f"storm: {args.clients} clients over {args.spread:.1f} s, arch {args.arch}, "
              f"kernel {sizes[KERNEL] >> 20} MiB, initrd {sizes[INITRD] >> 20} MiB; "
              f"provisioner serve config beside the defaults: dhcp.discovery_burst = "
              f"{max(50, 2 * args.clients)}, dhcp.discovery_rate_per_s = 1000, "
              f"boot.ramdisk_build = off (per-source caps unchanged: one address a client)",
              file=sys.stderr)
        stacks: list[tuple[str, Callable[[str, Path], list[subprocess.Popen[bytes]]]]] = [
            ("provisioner serve", lambda ns, d: start_ours(ns, d, files, args.clients,
                                                              args.ours_toml.replace("\\n", "\n"))),
            ("dnsmasq + tftpd-hpa + nginx",
             lambda ns, d: start_theirs(ns, d, files, args.clients, args.nginx_workers)),
        ]
        every: dict[str, list[StackRun]] = {}
        with namespaces() as (srv, cli):
            for _ in range(args.rounds):  # interleaved: ours, theirs, ours, theirs, …
                for name, fn in stacks:
                    if args.only in name:
                        def begin(d: Path, f: Callable[[str, Path], list[subprocess.Popen[
                                bytes]]] = fn) -> list[subprocess.Popen[bytes]]:
                            return f(srv, d)

                        every.setdefault(name, []).append(
                            measure(name, begin, srv, cli, plan, args.logs, args.verbose))
    print(report(every, args.clients))
    last = [rs[-1] for rs in every.values()]
    print(f"\nload average after the runs: {last[-1].load if last else '?'}; "
          f"client process CPU (last round): " + ", ".join(f"{r.name} {r.client_cpu_s:.1f} s"
                                                            for r in last))
    return 0


if __name__ == "__main__":
    with suppress(KeyboardInterrupt):
        sys.exit(main())
