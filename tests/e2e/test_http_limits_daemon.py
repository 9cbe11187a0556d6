"""The daemon puts its HTTP limits (``httpguard``) on every HTTP server it runs: on both the
API and the boot server, a connection that never completes a request head is closed (after
the 15 s header timeout), while a normal request is answered."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator

import pytest

from provisioner.httpguard import HttpLimits
from tests.e2e.test_cli_api import Daemon, running_daemon
from tests.peers.ports import free_tcp_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    http = f"127.0.0.1:{free_tcp_port()}"
    settings = f'[http]\nlisten = "{http}"\n\n[boot]\nramdisk_build = "off"\n'
    with running_daemon(tmp_path_factory.mktemp("e2e-limits"), settings) as running:
        yield running, f"http://{http}"


async def slow_client_is_cut(url: str) -> bytes:
    """Connect, send half a request head, and read until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
    try:
        async with asyncio.timeout(HttpLimits().header_timeout_s * 3):
            return await reader.read()
    finally:
        writer.close()


def test_every_http_server_cuts_slow_clients(daemon: tuple[Daemon, str]) -> None:
    running, boot = daemon

    async def both() -> list[bytes]:
        return list(await asyncio.gather(slow_client_is_cut(running.url),
                                         slow_client_is_cut(boot)))

    got = asyncio.run(both())
    assert got == [b"", b""]  # closed without an answer: the head never came
    with urllib.request.urlopen(f"{running.url}/healthz", timeout=10) as response:
        assert response.status == 200
    with urllib.request.urlopen(f"{boot}/boot.ipxe", timeout=10) as response:
        assert response.status == 200
