"""One address cannot take every TFTP transfer: past ``max_per_source`` concurrent transfers
it gets an ERROR packet, while another address is served; its share frees as its transfers
end; the same with the transfers in the daemon's process and in three worker processes.
The real server on loopback, clients on distinct loopback addresses."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from provisioner.boot.tftp import TftpServer
from provisioner.config import TftpSettings
from tests.integration.test_tftp import RawClient

CONTENT = os.urandom(5000)


@pytest.fixture(params=[1, 3], ids=["in-process", "3-workers"])
async def server(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[TftpServer]:
    """With workers, each address's requests reach one of them, which counts them all."""
    (tmp_path / "f.bin").write_bytes(CONTENT)
    settings = TftpSettings(listen="127.0.0.1:0", timeout_s=5.0, retries=2,
                            workers=request.param)
    srv = TftpServer(settings, tmp_path, max_per_source=3)
    await srv.start()
    yield srv
    await srv.stop()


async def test_one_address_gets_its_share_and_no_more(server: TftpServer) -> None:
    greedy = [RawClient("127.0.0.2") for _ in range(3)]
    extra, other = RawClient("127.0.0.2"), RawClient("127.0.0.3")
    try:
        peers = []
        for client in greedy:  # transfers started and never acknowledged: held
            await client.send(b"\x00\x01f.bin\0octet\0", server.address)
            data, peer = await client.recv()
            assert struct.unpack("!H", data[:2])[0] == 3
            peers.append(peer)
        await extra.send(b"\x00\x01f.bin\0octet\0", server.address)
        data, _ = await extra.recv()
        assert struct.unpack("!HH", data[:4]) == (5, 0)
        assert b"too many transfers from this address" in data
        assert await other.fetch(server.address, "f.bin") == CONTENT  # others are served
        for client, peer in zip(greedy, peers, strict=True):  # the greedy ones give up
            await client.send(b"\x00\x05\x00\x00done\0", peer)
        assert await fetch_when_free(extra, server) == CONTENT  # its share is back
    finally:
        for client in (*greedy, extra, other):
            client.close()


async def fetch_when_free(client: RawClient, server: TftpServer) -> bytes:
    """The fetch, asked again while refused as "too many": a worker process reports a
    transfer's end to the daemon a moment after the client's ERROR reached it."""
    async with asyncio.timeout(10):
        while True:
            try:
                return await client.fetch(server.address, "f.bin")
            except AssertionError as exc:
                if "too many transfers from this address" not in str(exc):
                    raise
            await asyncio.sleep(0.05)
