"""The daemon's side of the TFTP worker processes (``tftp_worker.py``): it binds one
``SO_REUSEPORT`` listening socket per worker (``reuseport.py``: requests steered by source
address), starts the workers, re-emits their log records, and replaces a worker that
exits: the replacement takes over its predecessor's socket, with whatever requests wait
in it (the transfers the dead one held are lost: their clients time out and ask again).

Why processes: lock-step TFTP costs one datagram in and one out per block, and one event
loop on one core cannot keep up with tftpd-hpa, which forks per client. Why each with its
own listening socket: a storm's requests then never wait behind the daemon's loop (DHCP,
HTTP); each worker applies the jail and the limits itself (``tftp_service.py``), exactly,
since all of one address's requests reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.boot.tftp_worker import MAX_MESSAGE

log = logging.getLogger(__name__)

_MODULE = "provisioner.boot.tftp_worker"
_RESTART_PAUSE_S = 1.0  # a worker that dies within this of its start waits this long
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # workers run this very code


def shares(total: int, count: int) -> list[int]:
    """``total`` transfers shared out among ``count`` workers (they sum to ``total``)."""
    return [total // count + (1 if slot < total % count else 0) for slot in range(count)]


@dataclass(eq=False)
class _Worker:
    slot: int
    proc: asyncio.subprocess.Process
    sock: socket.socket
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    dead: bool = False


class TftpWorkers:
    def __init__(self, listening: list[socket.socket], *, root: Path, host: str,
                 timeout_s: float, retries: int, max_transfers: int, max_per_source: int,
                 max_fds: int, cache_bytes: int) -> None:
        """One worker per socket of ``listening`` (a reuseport group, closed at ``stop``);
        ``max_transfers`` in all, shared out among them."""
        self._listening = listening
        self._common = ["--root", str(root), "--host", host, "--timeout-s", str(timeout_s),
                        "--retries", str(retries), "--max-per-source", str(max_per_source),
                        "--max-fds", str(max_fds), "--cache-bytes", str(cache_bytes)]
        self._shares = shares(max_transfers, len(listening))
        self._workers: list[_Worker | None] = [None] * len(listening)
        self._supervisors: list[asyncio.Task[None]] = []
        self._closed = False
        self.replaced = 0
        """Workers that exited and were replaced so far (tests read it)."""

    @property
    def pids(self) -> list[int]:
        """The running workers' process IDs, by slot (tests read them)."""
        return [w.proc.pid for w in self._workers if w is not None and not w.dead]

    async def start(self, *, timeout_s: float = 30.0) -> None:
        workers = [await self._spawn(slot) for slot in range(len(self._listening))]
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
        for sock in self._listening:
            sock.close()

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

    @staticmethod
    def _message(worker: _Worker, message: dict[str, Any]) -> None:
        if "log" in message:
            name, level, text = (str(x) for x in message["log"])
            if not name.startswith("provisioner."):  # e.g. the worker's asyncio, not ours
                name = f"{_MODULE}.{name}"
            logging.getLogger(name).log(int(level), "%s", text,
                                        extra={"tftp_worker": worker.proc.pid})
        elif "ready" in message:
            worker.ready.set()

    async def _spawn(self, slot: int) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listening = self._listening[slot]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        level = logging.getLogger("provisioner").getEffectiveLevel()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", _MODULE, "--control", str(theirs.fileno()),
                "--listen", str(listening.fileno()), "--parent", str(os.getpid()),
                "--log-level", str(level), "--max-transfers", str(self._shares[slot]),
                *self._common, pass_fds=(theirs.fileno(), listening.fileno()),
                stdin=asyncio.subprocess.DEVNULL, env=env, start_new_session=True)
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
            self._retire(worker)
            if self._closed:
                return
            log.warning("TFTP: worker %d (pid %d) exited with status %d, its transfers lost "
                        "(their clients ask again); starting another on its socket",
                        worker.slot, worker.proc.pid, status)
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
        """Its control socket closed (the listening socket stays, for its successor)."""
        if worker.dead:
            return
        worker.dead = True
        asyncio.get_running_loop().remove_reader(worker.sock.fileno())
        worker.sock.close()
