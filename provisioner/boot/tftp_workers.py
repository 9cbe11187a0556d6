"""The daemon's side of the TFTP worker processes (``tftp_worker.py``): it starts them,
hands each accepted request (with its file, opened by the jail) to the least-busy one,
frees a peer's slot when its worker reports the transfer done, re-emits the workers' log
records, and replaces a worker that exits (the transfers it held are lost: their clients
time out and ask again).

Why processes: lock-step TFTP costs one datagram in and one out per block, and one event
loop on one core cannot keep up with tftpd-hpa, which forks per client. Requests still
arrive on the daemon's one listening socket, so the per-source and total limits and the
jail stay exact, in one place; only the per-block work moves.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.boot.tftp_packets import E_UNDEFINED, OPTIONS, ReadRequest, TftpError
from provisioner.boot.tftp_transfer import Peer
from provisioner.boot.tftp_worker import MAX_MESSAGE

log = logging.getLogger(__name__)

_MODULE = "provisioner.boot.tftp_worker"
_NAME_CHARS = 256
_RESTART_PAUSE_S = 1.0  # a worker that dies within this of its start waits this long
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # workers run this very code


@dataclass(eq=False)
class _Worker:
    slot: int
    proc: asyncio.subprocess.Process
    sock: socket.socket
    peers: set[Peer] = field(default_factory=set)
    outbox: deque[tuple[bytes, int, Peer]] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    writing: bool = False
    dead: bool = False


class TftpWorkers:
    def __init__(self, count: int, *, host: str, timeout_s: float, retries: int,
                 max_fds: int, cache_bytes: int, on_done: Callable[[Peer], None],
                 on_again: Callable[[bytes, Peer], None]) -> None:
        """``on_done(peer)``: a transfer handed out ended (or its worker died);
        ``on_again(rrq, peer)``: a request ``again`` passed on is not a retransmit."""
        self._args = ["--host", host, "--timeout-s", str(timeout_s), "--retries",
                      str(retries), "--max-fds", str(max_fds), "--cache-bytes",
                      str(cache_bytes)]
        self._count = count
        self._on_done, self._on_again = on_done, on_again
        self._workers: list[_Worker | None] = [None] * count
        self._supervisors: list[asyncio.Task[None]] = []
        self._closed = False
        self.replaced = 0
        """Workers that exited and were replaced so far (tests read it)."""

    @property
    def pids(self) -> list[int]:
        """The running workers' process IDs, by slot (tests read them)."""
        return [w.proc.pid for w in self._workers if w is not None and not w.dead]

    async def start(self, *, timeout_s: float = 30.0) -> None:
        workers = [await self._spawn(slot) for slot in range(self._count)]
        self._supervisors = [asyncio.get_running_loop().create_task(
            self._supervise(w), name=f"tftp-worker-{w.slot}") for w in workers]
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(w.ready.wait() for w in workers))
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"TFTP workers did not start within {timeout_s:g} s") from None

    async def stop(self) -> None:
        self._closed = True
        for worker in self._workers:
            if worker is not None and not worker.dead:
                self._retire(worker)
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()  # its transfers end with it, like in-process ones
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        self._supervisors = []

    def dispatch(self, fd: int, req: ReadRequest, peer: Peer) -> None:
        """Hand the transfer to the least-busy worker; ``fd`` is theirs (closed here once
        sent). TftpError when no worker runs (all being replaced)."""
        live = [w for w in self._workers if w is not None and not w.dead]
        if not live:
            os.close(fd)
            raise TftpError(E_UNDEFINED, "server busy, retry later")
        worker = min(live, key=lambda w: len(w.peers))
        options = {k: v for k, v in req.options.items() if k in OPTIONS}
        job = {"peer": list(peer), "name": req.filename[:_NAME_CHARS], "mode": req.mode,
               "options": options}  # the name only for the worker's log lines
        worker.peers.add(peer)
        worker.outbox.append((json.dumps(job, ensure_ascii=False).encode(), fd, peer))
        self._flush(worker)

    def again(self, rrq: bytes, peer: Peer) -> None:
        """A request from a peer whose transfer a worker holds: that worker tells a
        retransmit (dropped) from a new request (passed back to ``on_again``)."""
        for worker in self._workers:
            if worker is not None and not worker.dead and peer in worker.peers:
                job = {"again": list(peer), "rrq": base64.b64encode(rrq).decode()}
                worker.outbox.append((json.dumps(job).encode(), -1, peer))
                self._flush(worker)
                return

    def _flush(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        while worker.outbox and not worker.dead:
            message, fd, peer = worker.outbox[0]
            try:
                socket.send_fds(worker.sock, [message], [fd] if fd >= 0 else [])
            except (BlockingIOError, InterruptedError):  # the worker is behind: wait
                if not worker.writing:
                    loop.add_writer(worker.sock.fileno(), self._flush, worker)
                    worker.writing = True
                return
            except OSError as exc:  # gone (then replaced) or refused: dropped, not stuck
                log.warning("TFTP: cannot hand %s to worker %d: %s", peer[0],
                            worker.proc.pid, exc)
                worker.outbox.popleft()
                if fd >= 0:
                    os.close(fd)
                    worker.peers.discard(peer)
                    self._on_done(peer)
                continue
            worker.outbox.popleft()
            if fd >= 0:
                os.close(fd)
        if worker.writing and not worker.dead:
            loop.remove_writer(worker.sock.fileno())
            worker.writing = False

    def _readable(self, worker: _Worker) -> None:
        for _ in range(256):
            try:
                data = worker.sock.recv(MAX_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # the worker exited: the supervisor cleans up and replaces it
                asyncio.get_running_loop().remove_reader(worker.sock.fileno())
                return
            self._message(worker, json.loads(data))

    def _message(self, worker: _Worker, message: dict[str, Any]) -> None:
        if "done" in message:
            peer = (str(message["done"][0]), int(message["done"][1]))
            if peer in worker.peers:
                worker.peers.discard(peer)
                self._on_done(peer)
        elif "log" in message:
            name, level, text = (str(x) for x in message["log"])
            if not name.startswith("provisioner."):  # e.g. the worker's asyncio, not ours
                name = f"{_MODULE}.{name}"
            logging.getLogger(name).log(int(level), "%s", text,
                                        extra={"tftp_worker": worker.proc.pid})
        elif "again" in message:
            self._on_again(base64.b64decode(str(message["rrq"])),
                           (str(message["again"][0]), int(message["again"][1])))
        elif "ready" in message:
            worker.ready.set()

    async def _spawn(self, slot: int) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        level = logging.getLogger("provisioner").getEffectiveLevel()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", _MODULE, "--control", str(theirs.fileno()),
                "--parent", str(os.getpid()), "--log-level", str(level), *self._args,
                pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL, env=env,
                start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        worker = _Worker(slot, proc, ours)
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable, worker)
        self._workers[slot] = worker
        log.info("TFTP: worker %d started (pid %d)", slot, proc.pid)
        return worker

    async def _supervise(self, worker: _Worker) -> None:
        """Wait for the worker's exit; replace it unless stopping."""
        while True:
            started = time.monotonic()
            status = await worker.proc.wait()
            lost = len(worker.peers)
            self._retire(worker)
            if self._closed:
                return
            log.warning("TFTP: worker %d (pid %d) exited with status %d, %d transfers lost; "
                        "starting another", worker.slot, worker.proc.pid, status, lost)
            self.replaced += 1
            if time.monotonic() - started < _RESTART_PAUSE_S:
                await asyncio.sleep(_RESTART_PAUSE_S)
            while not self._closed:
                try:
                    worker = await self._spawn(worker.slot)
                    break
                except OSError as exc:
                    log.error("TFTP: cannot start a worker: %s", exc)
                    await asyncio.sleep(_RESTART_PAUSE_S)
            if self._closed:  # stopped while it started: it must not outlive the stop
                self._retire(worker)
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
                await worker.proc.wait()
                return

    def _retire(self, worker: _Worker) -> None:
        """Its socket closed, its queued files closed, its peers' slots freed."""
        if worker.dead:
            return
        worker.dead = True
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.sock.fileno())
        if worker.writing:
            loop.remove_writer(worker.sock.fileno())
        worker.sock.close()
        for _, fd, _ in worker.outbox:
            if fd >= 0:
                os.close(fd)
        worker.outbox.clear()
        peers, worker.peers = worker.peers, set()
        for peer in peers:
            self._on_done(peer)
