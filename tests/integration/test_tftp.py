"""The TFTP server against real clients (tftp-hpa, atftp) and a raw client on loopback:
contents byte for byte, options (blksize, tsize, timeout, windowsize), netascii, block-number
rollover, the jail (traversal, absolute paths, symlinks out, devices), read-only, unknown
TIDs, many concurrent transfers and a prompt stop; with worker processes and in the
daemon's own loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from provisioner.boot.tftp import TftpServer
from provisioner.config import TftpSettings

MIB = 1024 * 1024


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    (base / "sub" / "dir").mkdir(parents=True)
    (base / "file1m").write_bytes(os.urandom(MIB))
    (base / "exact512").write_bytes(os.urandom(512))
    (base / "empty").write_bytes(b"")
    (base / "text.txt").write_bytes(b"line one\nline two\r\nbare\rcr\n")
    (base / "sub" / "dir" / "deep.bin").write_bytes(os.urandom(3000))
    (tmp_path / "secret").write_text("outside the root\n")
    (base / "escape").symlink_to("/etc/passwd")
    (base / "escape-rel").symlink_to("../secret")
    (base / "inside").symlink_to("file1m")
    os.mkfifo(base / "fifo")
    return base


@pytest.fixture(params=[2, 1], ids=["workers", "in-process"])
async def server(root: Path, request: pytest.FixtureRequest) -> AsyncIterator[TftpServer]:
    srv = TftpServer(TftpSettings(listen="127.0.0.1:0", timeout_s=1.0, retries=3,
                                  workers=request.param), root)
    await srv.start()
    yield srv
    await srv.stop()


async def _run(*cmd: str, timeout_s: float = 60.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    async with asyncio.timeout(timeout_s):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def _tftp_hpa(port: int, name: str, out: Path, mode: str = "binary") -> tuple[str, ...]:
    return ("tftp", "127.0.0.1", str(port), "-m", mode, "-c", "get", name, str(out))


def _atftp(port: int, name: str, out: Path, *options: str) -> tuple[str, ...]:
    opts = [arg for option in options for arg in ("--option", option)]
    return ("atftp", "--trace", *opts, "-g", "-r", name, "-l", str(out), "127.0.0.1",
            str(port))


@pytest.fixture(autouse=True)
def _clients() -> None:
    for tool, package in (("tftp", "tftp-hpa"), ("atftp", "atftp")):
        assert shutil.which(tool), f"{package} missing: run scripts/setup.sh"


@pytest.mark.parametrize("name", ["file1m", "exact512", "empty", "sub/dir/deep.bin", "inside"])
async def test_tftp_hpa_fetches_byte_for_byte(server: TftpServer, root: Path, tmp_path: Path,
                                              name: str) -> None:
    out = tmp_path / "out"
    rc, text = await _run(*_tftp_hpa(server.address[1], name, out))
    assert rc == 0 and out.read_bytes() == (root / name).read_bytes(), text


async def test_tftp_hpa_netascii(server: TftpServer, root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, text = await _run(*_tftp_hpa(server.address[1], "text.txt", out, mode="ascii"))
    assert rc == 0 and out.read_bytes() == (root / "text.txt").read_bytes(), text


@pytest.mark.parametrize("options", [(), ("blksize 1468",), ("tsize 0",),
                                     ("blksize 1468", "tsize 0"), ("blksize 8",),
                                     ("blksize 65464",), ("windowsize 8", "blksize 1024"),
                                     ("timeout 2",)],
                         ids=lambda o: "+".join(o) or "none")
async def test_atftp_fetches_with_options(server: TftpServer, root: Path, tmp_path: Path,
                                          options: tuple[str, ...]) -> None:
    name = "exact512" if options == ("blksize 8",) else "file1m"
    out = tmp_path / "out"
    rc, text = await _run(*_atftp(server.address[1], name, out, *options))
    assert rc == 0, text
    assert out.read_bytes() == (root / name).read_bytes()
    oack = re.search(r"^received OACK <(.*)>$", text, re.M)
    assert (oack is None) == (not options), text[:500]
    for option in options:
        key, value = option.split()
        if key == "tsize":
            value = str((root / name).stat().st_size)
        assert oack is not None and f"{key}: {value}," in oack.group(1)


_REFUSED = {"../secret": 2, "/etc/passwd": 2, "..\\secret": 2, "sub/../../secret": 2,
            "escape": 2, "escape-rel": 2, "fifo": 2, "sub": 2, "missing": 1,
            "sub/missing": 1}


class RawClient:
    """An RRQ/ACK speaker on a real socket, for what the CLI clients cannot show."""

    def __init__(self, source: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((source, 0))
        self.sock.setblocking(False)

    async def send(self, data: bytes, to: tuple[str, int]) -> None:
        await asyncio.get_running_loop().sock_sendto(self.sock, data, to)

    async def recv(self, timeout_s: float = 3.0) -> tuple[bytes, tuple[str, int]]:
        async with asyncio.timeout(timeout_s):
            data, addr = await asyncio.get_running_loop().sock_recvfrom(self.sock, 70000)
        return data, addr

    async def fetch(self, to: tuple[str, int], name: str, **options: int) -> bytes:
        """RRQ with options; ACK each window (windowsize) or each block."""
        fields = [name, "octet"] + [x for k, v in options.items() for x in (k, str(v))]
        await self.send(b"\x00\x01" + b"".join(f.encode() + b"\0" for f in fields), to)
        blksize, window = options.get("blksize", 512), options.get("windowsize", 1)
        chunks: list[bytes] = []
        expected = 1
        while True:
            data, peer = await self.recv()
            opcode, number = struct.unpack("!HH", data[:4])
            if opcode == 6:
                await self.send(b"\x00\x04\x00\x00", peer)
                continue
            assert opcode == 3, data
            if number != expected & 0xFFFF:
                continue
            chunks.append(data[4:])
            last = len(data) - 4 < blksize
            if last or expected % window == 0:
                await self.send(struct.pack("!HH", 4, number), peer)
            if last:
                return b"".join(chunks)
            expected += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[RawClient]:
    client = RawClient()
    yield client
    client.close()


@pytest.mark.parametrize("name", sorted(_REFUSED))
async def test_jail_refuses_with_an_error_packet(server: TftpServer, raw: RawClient,
                                                 tmp_path: Path, name: str) -> None:
    await raw.send(b"\x00\x01" + name.encode() + b"\0octet\0", server.address)
    data, _ = await raw.recv()
    opcode, code = struct.unpack("!HH", data[:4])
    assert (opcode, code) == (5, _REFUSED[name]), data
    out = tmp_path / "out"
    rc, text = await _run(*_atftp(server.address[1], name, out))
    assert rc != 0 and (not out.exists() or out.stat().st_size == 0), text


async def test_writes_are_refused(server: TftpServer, raw: RawClient, tmp_path: Path,
                                  root: Path) -> None:
    await raw.send(b"\x00\x02new.bin\0octet\0", server.address)
    data, _ = await raw.recv()
    assert struct.unpack("!HH", data[:4]) == (5, 2)
    local = tmp_path / "upload"
    local.write_bytes(b"x" * 100)
    await _run("tftp", "127.0.0.1", str(server.address[1]), "-m", "binary", "-c", "put",
               str(local), "new.bin")
    assert not (root / "new.bin").exists()


async def test_block_numbers_roll_over(server: TftpServer, raw: RawClient,
                                       root: Path) -> None:
    content = os.urandom(8 * 70000)  # 70,001 blocks of 8 bytes: past block 65535
    (root / "big").write_bytes(content)
    got = await raw.fetch(server.address, "big", blksize=8, windowsize=64)
    assert got == content


async def _blocks(client: RawClient, seconds: float) -> set[int]:
    """The DATA block numbers ``client`` receives within ``seconds``."""
    seen: set[int] = set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                data, _ = await client.recv()
                opcode, number = struct.unpack("!HH", data[:4])
                seen.add(number if opcode == 3 else -opcode)
    return seen


async def test_another_source_cannot_steer_a_transfer(
        server: TftpServer, raw: RawClient, root: Path) -> None:
    """A transfer's socket is connected to its client (as tftpd-hpa's is): a datagram from
    any other address, here an ACK that would move the transfer on, never reaches it (the
    kernel answers with ICMP port unreachable at most, no TFTP error), and the transfer
    goes on with its client."""
    await raw.send(b"\x00\x01file1m\0octet\0", server.address)
    first, transfer = await raw.recv()
    assert struct.unpack("!HH", first[:4]) == (3, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendto(stranger, b"\x00\x04\x00\x01", transfer)
        with pytest.raises(TimeoutError):  # no answer to the stranger ...
            async with asyncio.timeout(0.3):
                await loop.sock_recvfrom(stranger, 1000)
    # ... and its ACK did not send block 2 (block 1 again, on the 1 s timer, may come)
    assert await _blocks(raw, 0.3) <= {1}
    await raw.send(b"\x00\x04\x00\x01", transfer)
    second, _ = await raw.recv()
    while struct.unpack("!HH", second[:4]) == (3, 1):  # a retransmission crossed our ACK
        second, _ = await raw.recv()
    assert struct.unpack("!HH", second[:4]) == (3, 2)
    assert second[4:] == (root / "file1m").read_bytes()[512:1024]


async def test_one_mib_to_many_concurrent_clients(server: TftpServer, root: Path,
                                                  tmp_path: Path) -> None:
    want = (root / "file1m").read_bytes()
    outs = [tmp_path / f"out{i}" for i in range(60)]
    cmds = [(_atftp(server.address[1], "file1m", out, "blksize 1468") if i % 2 else
             _tftp_hpa(server.address[1], "file1m", out)) for i, out in enumerate(outs)]
    results = await asyncio.gather(*(_run(*cmd, timeout_s=120) for cmd in cmds))
    assert [rc for rc, _ in results] == [0] * len(cmds)
    assert all(out.read_bytes() == want for out in outs)


async def test_stop_is_prompt_with_transfers_in_flight(root: Path) -> None:
    srv = TftpServer(TftpSettings(listen="127.0.0.1:0"), root)
    await srv.start()
    clients = [RawClient() for _ in range(20)]
    try:
        for client in clients:  # requests that are never ACKed
            await client.send(b"\x00\x01file1m\0octet\0", srv.address)
        first, _ = await clients[-1].recv()
        assert struct.unpack("!HH", first[:4]) == (3, 1)  # block 1: a transfer is in flight
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with asyncio.timeout(10):  # a hang fails here rather than stalling the run
            await srv.stop()
        assert loop.time() - started < 1.0
    finally:
        for client in clients:
            client.close()
