"""TFTP worker processes: several serve concurrent tftp-hpa and atftp clients (each copy
byte for byte, their log records reaching the daemon's logging); every request from one
address reaches one worker, and many addresses spread over all of them; a retransmitted
request is told from a new one; a SIGKILLed worker is replaced on its socket and the
slots of the transfers it held are free again; no worker survives a SIGKILLed daemon.
The real server on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import struct
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from provisioner.boot.tftp import TftpServer
from provisioner.boot.tftp_workers import TftpWorkers
from provisioner.config import TftpSettings
from tests.integration.test_tftp import RawClient, _atftp, _run, _tftp_hpa

MIB = 1024 * 1024
SMALL = os.urandom(1300)  # three blocks
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    base.mkdir()
    (base / "file1m").write_bytes(os.urandom(MIB))
    (base / "small").write_bytes(SMALL)
    return base


@pytest.fixture
async def server(root: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[TftpServer]:
    caplog.set_level(logging.INFO, logger="provisioner")  # before the workers start
    srv = TftpServer(TftpSettings(listen="127.0.0.1:0", timeout_s=1.0, retries=3, workers=3),
                     root, max_per_source=1000)
    await srv.start()
    yield srv
    await srv.stop()


def _workers(server: TftpServer) -> TftpWorkers:
    assert server.workers is not None
    return server.workers


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def _fetch_all(server: TftpServer, root: Path, out_dir: Path, clients: int) -> None:
    want = (root / "file1m").read_bytes()
    port = server.address[1]
    outs = [out_dir / f"out{i}" for i in range(clients)]
    cmds = [(_atftp(port, "file1m", out, "blksize 1468") if i % 2 else
             _tftp_hpa(port, "file1m", out)) for i, out in enumerate(outs)]
    results = await asyncio.gather(*(_run(*cmd, timeout_s=120) for cmd in cmds))
    assert [rc for rc, _ in results] == [0] * clients, [text for rc, text in results if rc]
    assert all(out.read_bytes() == want for out in outs)


async def test_several_workers_serve_concurrent_clients(
        server: TftpServer, root: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    pids = _workers(server).pids
    assert len(pids) == 3 and os.getpid() not in pids
    await _fetch_all(server, root, tmp_path, 30)
    sent = [r for r in caplog.records if r.getMessage().startswith("TFTP: sent file1m")]
    assert len(sent) == 30  # each transfer logged once, through the daemon's logging
    # every CLI client's address is 127.0.0.1: one worker served them all
    assert len({getattr(r, "tftp_worker", None) for r in sent}) == 1
    caplog.clear()
    clients = [RawClient(f"127.0.0.{10 + i}") for i in range(12) for _ in range(2)]
    try:
        got = await asyncio.gather(*(c.fetch(server.address, "small") for c in clients))
    finally:
        for client in clients:
            client.close()
    assert got == [SMALL] * len(clients)

    def sent_small() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("TFTP: sent small ")]

    async with asyncio.timeout(10):  # a worker logs a transfer once the client's last ACK
        while len(sent_small()) < len(clients):  # noqa: ASYNC110  (another process's log)
            await asyncio.sleep(0.02)
    by_address: dict[str, set[int]] = {}
    for record in sent_small():
        address = record.getMessage().split(" to ")[1].split()[0]
        by_address.setdefault(address, set()).add(record.tftp_worker)
    assert len(by_address) == 12
    assert all(len(workers) == 1 for workers in by_address.values()), by_address  # steered
    assert set().union(*by_address.values()) == set(pids)  # and spread over all three


async def test_a_request_again_from_the_same_port(server: TftpServer) -> None:
    """While its transfer lives, a peer's repeated request is a retransmit (no second
    transfer); once it ended, the same port's next request is served at once."""
    raw = RawClient()
    try:
        rrq = b"\x00\x01small\0octet\0"
        await raw.send(rrq, server.address)
        first, tid = await raw.recv()
        await raw.send(rrq, server.address)
        with pytest.raises(TimeoutError):  # a second transfer would send its block 1 now
            await raw.recv(timeout_s=0.5)  # (ours resends after timeout_s, 1 s)
        got = [first[4:]]
        for block in (1, 2):
            await raw.send(struct.pack("!HH", 4, block), tid)
            data, peer = await raw.recv()
            assert peer == tid and struct.unpack("!HH", data[:4]) == (3, block + 1), data[:4]
            got.append(data[4:])
        await raw.send(struct.pack("!HH", 4, 3), tid)
        assert b"".join(got) == SMALL
        for _ in range(5):
            assert await raw.fetch(server.address, "small") == SMALL
    finally:
        raw.close()


async def test_a_killed_worker_is_replaced_and_frees_its_transfers(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="provisioner")
    srv = TftpServer(TftpSettings(listen="127.0.0.1:0", timeout_s=5.0, retries=2, workers=2),
                     root, max_per_source=1)
    await srv.start()
    held, again = RawClient("127.0.0.2"), RawClient("127.0.0.2")
    try:
        workers = _workers(srv)
        before = workers.pids
        await held.send(b"\x00\x01file1m\0octet\0", srv.address)
        await held.recv()  # its first block: the transfer is under way, never acknowledged
        await again.send(b"\x00\x01file1m\0octet\0", srv.address)
        refused, _ = await again.recv()
        assert b"too many transfers from this address" in refused
        for pid in before:  # whichever holds it
            os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(20):
            while workers.replaced < 2 or len(workers.pids) < 2:  # noqa: ASYNC110  (processes)
                await asyncio.sleep(0.05)
        after = workers.pids
        assert not set(after) & set(before) and not any(_alive(pid) for pid in before)
        exits = [r for r in caplog.records if "exited with status -9" in r.getMessage()]
        assert len(exits) == 2, [r.getMessage() for r in caplog.records]
        # the killed worker's transfer no longer counts against its address
        assert await again.fetch(srv.address, "file1m") == (root / "file1m").read_bytes()
        clients = [RawClient(f"127.0.0.{10 + i}") for i in range(10)]
        try:  # the new workers serve
            got = await asyncio.gather(*(c.fetch(srv.address, "file1m") for c in clients))
        finally:
            for client in clients:
                client.close()
        assert got == [(root / "file1m").read_bytes()] * 10
    finally:
        held.close()
        again.close()
        await srv.stop()
    assert not any(_alive(pid) for pid in after)  # and stop ends them


_DAEMON = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from provisioner.boot.tftp import TftpServer
    from provisioner.config import TftpSettings

    async def main() -> None:
        srv = TftpServer(TftpSettings(listen="127.0.0.1:0", workers=2), Path(sys.argv[1]))
        await srv.start()
        print(json.dumps(srv.workers.pids), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


async def test_no_worker_survives_a_killed_daemon(root: Path) -> None:
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DAEMON, str(root), cwd=REPO, stdout=asyncio.subprocess.PIPE)
    try:
        assert daemon.stdout is not None
        async with asyncio.timeout(60):
            pids = json.loads(await daemon.stdout.readline())
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    finally:
        daemon.kill()
        await daemon.wait()
    async with asyncio.timeout(10):
        while any(_alive(pid) for pid in pids):  # noqa: ASYNC110  (other processes' state)
            await asyncio.sleep(0.05)
