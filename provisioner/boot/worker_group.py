"""The daemon's side of a group of boot worker processes (TFTP's ``tftp_workers.py``,
DHCP's ``dhcp_workers.py``): one ``SO_REUSEPORT`` listening socket per worker
(``reuseport.py``), bound here; it starts the workers, re-emits their log records, and
replaces a worker that exits: the replacement takes over its predecessor's socket, with
whatever requests wait in it (what the dead one held in memory is lost: its clients ask
again). A worker's end of the control socket: ``worker_channel.py``.
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

from provisioner.boot.worker_channel import MAX_MESSAGE

log = logging.getLogger(__name__)

_CONTROL_BUFFER = 1 << 20
_RESTART_PAUSE_S = 1.0  # a worker that dies within this of its start waits this long
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # workers run this very code


def shares(total: int, count: int) -> list[int]:
    """``total`` (transfers, addresses) shared out among ``count`` workers (they sum to
    ``total``)."""
    return [total // count + (1 if slot < total % count else 0) for slot in range(count)]


@dataclass(eq=False)
class Worker:
    slot: int
    proc: asyncio.subprocess.Process
    sock: socket.socket
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    dead: bool = False


class WorkerGroup:
    """Subclasses name the worker's ``module`` and ``kind`` (log lines), give its own
    arguments (``arguments``), and may greet a new worker (``started``) and take the
    messages beyond ``log`` and ``ready`` (``received``)."""

    module = ""
    kind = ""

    def __init__(self, listening: list[socket.socket]) -> None:
        """One worker per socket of ``listening`` (a reuseport group, closed at ``stop``)."""
        self._listening = listening
        self._workers: list[Worker | None] = [None] * len(listening)
        self._supervisors: list[asyncio.Task[None]] = []
        self._closed = False
        self._log_key = f"{self.kind.lower()}_worker"
        self.replaced = 0
        """Workers that exited and were replaced so far (tests read it)."""

    # -- what a subclass gives --------------------------------------------------------------

    def arguments(self, slot: int) -> list[str]:
        return []

    def started(self, worker: Worker) -> None:
        """A worker was spawned (its first messages may follow)."""

    def received(self, worker: Worker, message: dict[str, Any]) -> None:
        """A message other than ``log`` and ``ready``."""

    # -- the group --------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """The running workers' process IDs, by slot (tests read them)."""
        return [w.proc.pid for w in self.running()]

    def running(self) -> list[Worker]:
        return [w for w in self._workers if w is not None and not w.dead]

    def send(self, worker: Worker, message: dict[str, Any]) -> bool:
        """To one worker, without waiting; False when it cannot take it now (its buffer
        full) or any more (gone)."""
        if worker.dead:
            return False
        try:
            worker.sock.send(json.dumps(message, separators=(",", ":")).encode())
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            log.debug("%s: worker %d missed a message: %s", self.kind, worker.slot, exc)
            return False
        return True

    async def start(self, *, timeout_s: float = 30.0) -> None:
        workers = [await self._spawn(slot) for slot in range(len(self._listening))]
        self._supervisors = [asyncio.get_running_loop().create_task(
            self._supervise(w), name=f"{self._log_key}-{w.slot}") for w in workers]
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(w.ready.wait() for w in workers))
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"{self.kind} workers did not start within "
                               f"{timeout_s:g} s") from None

    async def stop(self) -> None:
        self._closed = True
        for worker in self._workers:
            if worker is not None and not worker.dead:
                self._retire(worker)
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()  # what it held ends with it, as in the daemon's loop
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        self._supervisors = []
        for sock in self._listening:
            sock.close()

    def _readable(self, worker: Worker) -> None:
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
            try:
                message = json.loads(data)
            except ValueError:
                log.warning("%s: worker %d sent a malformed message", self.kind, worker.slot)
                continue
            self._message(worker, message)

    def _message(self, worker: Worker, message: dict[str, Any]) -> None:
        if "log" in message:
            name, level, text = (str(x) for x in message["log"])
            if not name.startswith("provisioner."):  # e.g. the worker's asyncio, not ours
                name = f"{self.module}.{name}"
            logging.getLogger(name).log(int(level), "%s", text,
                                        extra={self._log_key: worker.proc.pid})
        elif "ready" in message:
            worker.ready.set()
        else:
            self.received(worker, message)

    async def _spawn(self, slot: int) -> Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):  # room for a storm's notices either way
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _CONTROL_BUFFER)
        listening = self._listening[slot]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        level = logging.getLogger("provisioner").getEffectiveLevel()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, "--control", str(theirs.fileno()),
                "--listen", str(listening.fileno()), "--parent", str(os.getpid()),
                "--log-level", str(level), *self.arguments(slot),
                pass_fds=(theirs.fileno(), listening.fileno()),
                stdin=asyncio.subprocess.DEVNULL, env=env, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        worker = Worker(slot, proc, ours)
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable, worker)
        self._workers[slot] = worker
        self.started(worker)
        log.info("%s: worker %d started (pid %d)", self.kind, slot, proc.pid)
        return worker

    async def _supervise(self, worker: Worker) -> None:
        """Wait for the worker's exit; replace it unless stopping."""
        while True:
            started = time.monotonic()
            status = await worker.proc.wait()
            self._retire(worker)
            if self._closed:
                return
            log.warning("%s: worker %d (pid %d) exited with status %d, what it held lost "
                        "(its clients ask again); starting another on its socket",
                        self.kind, worker.slot, worker.proc.pid, status)
            self.replaced += 1
            if time.monotonic() - started < _RESTART_PAUSE_S:
                await asyncio.sleep(_RESTART_PAUSE_S)
            while not self._closed:
                try:
                    worker = await self._spawn(worker.slot)
                    break
                except OSError as exc:
                    log.error("%s: cannot start a worker: %s", self.kind, exc)
                    await asyncio.sleep(_RESTART_PAUSE_S)
            if self._closed:  # stopped while it started: it must not outlive the stop
                self._retire(worker)
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
                await worker.proc.wait()
                return

    def _retire(self, worker: Worker) -> None:
        """Its control socket closed (the listening socket stays, for its successor)."""
        if worker.dead:
            return
        worker.dead = True
        asyncio.get_running_loop().remove_reader(worker.sock.fileno())
        worker.sock.close()
