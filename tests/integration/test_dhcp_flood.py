"""A flood of DHCP requests from one MAC gets at most that MAC's share of answers (its burst),
and another machine booting meanwhile is answered. The real server's datagram handler with
the real lease store, driven like test_dhcp_server (a recording transport)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from provisioner.boot.dhcp import PER_MAC_BURST, DhcpServer
from provisioner.boot.dhcp_codec import MessageType, encode, parse
from provisioner.config import BootSettings, DhcpSettings
from provisioner.store.leases import LeaseRepo
from provisioner.store.store import Store
from tests.integration.test_dhcp_server import RecordingTransport
from tests.peers.dhcp_client import PXE_UEFI_X64, MemoryInventory, request_packet

FLOODER, VICTIM = "52:54:00:f1:00:01", "52:54:00:f1:00:02"


async def test_a_flood_from_one_mac_does_not_starve_another(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    settings = DhcpSettings(mode="authoritative", server_address="10.77.0.1",
                            pool="10.77.0.100-10.77.0.199")
    server = DhcpServer(settings, BootSettings(), http_base_url="http://10.77.0.1:8080",
                        inventory=MemoryInventory(), leases=LeaseRepo(store.engine, store.pool))
    transport = RecordingTransport()
    caplog.set_level(logging.DEBUG, logger="provisioner.boot.dhcp")
    try:
        for n in range(2000):  # far more than any client sends; a burst, no pause
            flood = request_packet(FLOODER, MessageType.DISCOVER, extra=PXE_UEFI_X64)
            server.received(encode(flood), ("0.0.0.0", 68), 67, transport)  # type: ignore[arg-type]
            if n == 1000:
                victim = request_packet(VICTIM, MessageType.DISCOVER, extra=PXE_UEFI_X64)
                server.received(encode(victim), ("0.0.0.0", 68), 67,
                                transport)  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            while not any(parse(data).chaddr.hex(":").startswith(VICTIM)
                          for data, _ in transport.sent):
                transport.event.clear()
                await transport.event.wait()
        for _ in range(50):  # let the admitted answers finish
            await asyncio.sleep(0.01)
    finally:
        await server.stop()
    answers = [parse(data) for data, _ in transport.sent]
    to_flooder = [p for p in answers if p.chaddr.hex(":").startswith(FLOODER)]
    to_victim = [p for p in answers if p.chaddr.hex(":").startswith(VICTIM)]
    assert len(to_victim) == 1 and to_victim[0].message_type is MessageType.OFFER
    assert 1 <= len(to_flooder) <= PER_MAC_BURST  # its burst, not 2,000 answers
    assert any("from one MAC" in r.getMessage() for r in caplog.records)
