"""The DHCP server's datagram handler under garbage: random and mutated datagrams (from the
captured real packets) never raise out of it, never log an error, and the server still
answers afterwards. Driven without sockets through a recording transport."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest

from provisioner.boot.dhcp import DhcpServer
from provisioner.boot.dhcp_codec import MessageType, encode, parse
from provisioner.config import BootSettings, DhcpSettings
from provisioner.errors import ConfigError
from provisioner.store.leases import LeaseRepo
from provisioner.store.store import Store
from tests.peers.dhcp_client import PXE_UEFI_X64, MemoryInventory, request_packet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dhcp"


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.event = asyncio.Event()

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.sent.append((data, addr))
        self.event.set()

    def get_extra_info(self, name: str) -> None:
        return None


def _captured() -> list[bytes]:
    return [bytes.fromhex(p.read_text().splitlines()[-1]) for p in sorted(FIXTURES.glob("*.hex"))]


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 10)):
        pos = rng.randrange(len(data)) if data else 0
        action = rng.choice(("flip", "cut", "insert", "delete", "option"))
        if action == "flip" and data:
            data[pos] = rng.randrange(256)
        elif action == "cut":
            del data[pos:]
        elif action == "insert":
            data[pos:pos] = rng.randbytes(rng.randint(1, 6))
        elif action == "option" and len(data) > 241:
            at = rng.randrange(240, len(data))
            data[at:at] = bytes((rng.randrange(1, 255), rng.randrange(256)))
        elif data:
            del data[pos]
    return bytes(data)


@pytest.mark.parametrize("mode", ["authoritative", "proxy"])
async def test_garbage_never_escapes_the_handler(store: Store, mode: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    settings = DhcpSettings(mode=mode, server_address="10.77.0.1",
                            pool="10.77.0.100-10.77.0.199" if mode == "authoritative" else None)
    leases = LeaseRepo(store.engine, store.pool) if mode == "authoritative" else None
    server = DhcpServer(settings, BootSettings(), http_base_url="http://10.77.0.1:8080",
                        inventory=MemoryInventory(), leases=leases)
    transport = RecordingTransport()
    rng = random.Random(1234)
    seeds = _captured()
    caplog.set_level(logging.DEBUG, logger="provisioner.boot.dhcp")
    try:
        for n in range(3000):
            if n % 3 == 0:
                data = rng.randbytes(rng.randint(0, 600))
            else:
                data = _mutate(rng, rng.choice(seeds))
            server.received(data, ("10.77.0.50", 68), 67 if n % 2 else 4011,
                            transport)  # type: ignore[arg-type]
            if n % 100 == 0:
                await asyncio.sleep(0)
        for _ in range(200):  # let the spawned answers finish
            await asyncio.sleep(0.01)
        valid = request_packet("52:54:00:77:00:99", MessageType.DISCOVER, extra=PXE_UEFI_X64)
        transport.sent.clear()
        transport.event.clear()
        server.received(encode(valid), ("0.0.0.0", 68), 67, transport)  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            await transport.event.wait()
        assert parse(transport.sent[0][0]).message_type is MessageType.OFFER
    finally:
        await server.stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors[:3]
    assert any("malformed" in r.getMessage() for r in caplog.records)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "dropped packets" in r.getMessage()]
    assert len(warnings) <= 1  # drops are summarised, at most once a minute


def test_configuration_is_checked() -> None:
    inventory = MemoryInventory()
    with pytest.raises(ConfigError, match="server_address"):
        DhcpServer(DhcpSettings(mode="proxy"), BootSettings(), http_base_url="http://x",
                   inventory=inventory, leases=None)
    with pytest.raises(ConfigError, match="pool"):
        DhcpServer(DhcpSettings(mode="authoritative", server_address="10.0.0.1"),
                   BootSettings(), http_base_url="http://x", inventory=inventory, leases=None)
    off = DhcpServer(DhcpSettings(), BootSettings(), http_base_url="http://x",
                     inventory=inventory, leases=None)
    assert off.addresses == []
