"""Property: no request or option makes the real TFTP server (on loopback) crash, hang, leak a
transfer or answer outside the protocol; after each example the same client still fetches a
file byte for byte (a leaked transfer slot would make the server ignore that client)."""

from __future__ import annotations

import os
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.boot.tftp import TftpServer
from provisioner.boot.tftp_packets import answerable
from provisioner.config import TftpSettings
from tests.integration.test_tftp import RawClient

FUZZ = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
CONTENT = os.urandom(1300)

names = st.sampled_from(["probe.bin", "missing", "../x", "/etc/passwd", "sub", "a" * 5000,
                         "sub/../probe.bin", "\u00e9t\u00e9", "..\\probe.bin", " "]) \
    | st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=30)
modes = st.sampled_from(["octet", "OCTET", "netascii", "mail", "", "octet\u00e9"]) \
    | st.text(st.characters(blacklist_characters="\x00"), max_size=10)
option_names = st.sampled_from(["blksize", "BLKSIZE", "tsize", "timeout", "windowsize",
                                "unknown", ""])
option_values = st.sampled_from(["0", "1", "7", "8", "512", "65464", "65465", "99999999",
                                 "-1", "1.5", " 8", "\u00b2", "\u0663", "\uff18", "9" * 5000,
                                 "", "x"]) | st.integers(0, 1 << 70).map(str)
options = st.lists(st.tuples(option_names, option_values), max_size=5)


def rrq(name: str, mode: str, opts: list[tuple[str, str]], *, opcode: int = 1) -> bytes:
    fields = [name, mode, *(x for pair in opts for x in pair)]
    return struct.pack("!H", opcode) + b"".join(f.encode() + b"\0" for f in fields)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    (base / "sub").mkdir(parents=True)
    (base / "probe.bin").write_bytes(CONTENT)
    return base


@pytest.fixture
async def server(root: Path) -> AsyncIterator[TftpServer]:
    srv = TftpServer(TftpSettings(listen="127.0.0.1:0", timeout_s=1.0, retries=1), root)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
def raw() -> Iterator[RawClient]:
    client = RawClient()
    yield client
    client.close()


async def assert_answered_then_abort(raw: RawClient, server: TftpServer, packet: bytes) -> None:
    """Send ``packet``; the reply must be a TFTP ERROR, OACK or DATA (anything else, or no
    reply in 3 s, fails). A transfer that started is aborted with an ERROR from us."""
    await raw.send(packet, server.address)
    reply, peer = await raw.recv(timeout_s=3.0)
    opcode = struct.unpack("!H", reply[:2])[0]
    assert opcode in (3, 5, 6), reply[:40]
    if opcode == 5:
        code = struct.unpack("!H", reply[2:4])[0]
        message = reply[4:]
        assert code <= 8 and message.endswith(b"\0") and message[:-1].isascii(), reply
        assert peer == server.address
    else:
        assert peer != server.address  # a transfer answers from its own port
        await raw.send(b"\x00\x05\x00\x00aborted by the test\0", peer)


@FUZZ
@given(name=names, mode=modes, opts=options)
async def test_random_requests_and_options(server: TftpServer, raw: RawClient, name: str,
                                           mode: str, opts: list[tuple[str, str]]) -> None:
    await assert_answered_then_abort(raw, server, rrq(name, mode, opts))
    got = await raw.fetch(server.address, "probe.bin", blksize=512)
    assert got == CONTENT


@FUZZ
@given(data=st.binary(max_size=600))
async def test_random_datagrams(server: TftpServer, raw: RawClient, data: bytes) -> None:
    if data[:2] in (b"\x00\x01",) and data.count(b"\0") >= 3:
        data = b"\x00\x07" + data[2:]  # random bytes that parse as an RRQ: tested above
    data = data or b"\x00"
    if answerable(data):
        await assert_answered_then_abort(raw, server, data)
    else:  # DATA, ACK, ERROR, OACK or a runt: never answered on the listening port (no
        # loop with another server, CVE-2024-2169; test_attacks_bounds.py has the loop)
        await raw.send(data, server.address)
        with pytest.raises(TimeoutError):
            await raw.recv(timeout_s=0.3)
    got = await raw.fetch(server.address, "probe.bin", blksize=512)
    assert got == CONTENT


@FUZZ
@given(opts=options)
async def test_accepted_options_are_within_bounds(server: TftpServer, raw: RawClient,
                                                  opts: list[tuple[str, str]]) -> None:
    """An OACK names only options we support, with values inside RFC 2348/7440 bounds."""
    await raw.send(rrq("probe.bin", "octet", opts), server.address)
    reply, peer = await raw.recv(timeout_s=3.0)
    opcode = struct.unpack("!H", reply[:2])[0]
    assert opcode in (3, 6), reply[:40]
    if opcode == 6:
        fields = reply[2:].split(b"\0")[:-1]
        acked = dict(zip(fields[::2], fields[1::2], strict=True))
        assert set(acked) <= {b"blksize", b"tsize", b"timeout", b"windowsize"}
        assert 8 <= int(acked.get(b"blksize", b"512")) <= 65464
        assert 1 <= int(acked.get(b"windowsize", b"1")) <= 64
        assert 1 <= int(acked.get(b"timeout", b"1")) <= 255
        assert int(acked.get(b"tsize", str(len(CONTENT)).encode())) == len(CONTENT)
    await raw.send(b"\x00\x05\x00\x00aborted by the test\0", peer)
    assert await raw.fetch(server.address, "probe.bin") == CONTENT

