"""Simulated IPMI BMCs: pyghmi's server-side ``Bmc`` class, many in one process.

Run as a subprocess (``python -m tests.sim.ipmi_bmc --count N ...``): one UDP port per BMC
on one loopback address (ports picked by the OS), real RMCP+ on the wire. It prints one
JSON line, ``{"ports": [...]}``, when every BMC listens, then answers commands on stdin,
one per line: ``stats`` prints a JSON line with each BMC's power, boot device and session
counts. PEERS.md §5's three fixes are applied (SHA-1 cipher, wake the IO thread, a listen
loop that survives exceptions), plus a bounded IO wait (fix 5: no wedge), sockets whose
blocking mode no thread toggles (fix 6, the IPMI worker's ``no_blocking_toggle``: a group of
healthy BMCs unanswered for seconds) and a watchdog.
Options inject a latency per IPMI command (answered later from the same loop, so 1,000
slow BMCs do not serialise), flapping BMCs (the first k commands answer "node busy") and
silent ones (a bound UDP socket that never answers).
"""

from __future__ import annotations

import argparse
import faulthandler
import heapq
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyghmi.ipmi.bmc as pyghmi_bmc
import pyghmi.ipmi.private.serversession as serversession
import pyghmi.ipmi.private.session as ipmisession

from provisioner.bmc.ipmi_worker import no_blocking_toggle

log = logging.getLogger("ipmi-sim")
_ROOT = Path(__file__).resolve().parents[2]
PER_PROCESS = 10
"""BMCs per simulator process. With ~85 in one process, pyghmi's server (or its routing of
one client socket talking to many BMC ports of one process) wedged 2 runs in 7 under 32
concurrent client threads; 17 per process: 0 in 7. On 2026-11-25 (clients in 4 IPMI worker
processes, machine load 5-7 on 2 cores) 20 per process left a group of healthy BMCs
unanswered in 4 of 16 reference runs; 10 per process: 0 in 8. Still 3 in 33 at load 8-15;
the cause was fix 6 (an IO thread blocked reading one idle socket of the process), whose
odds grow with the sockets per process: this count may go back up."""

_due: list[tuple[float, int, Callable[[], None]]] = []
_seq = itertools.count()


def later(delay_s: float, fn: Callable[[], None]) -> None:
    heapq.heappush(_due, (time.monotonic() + delay_s, next(_seq), fn))


class CountingSession(serversession.ServerSession):
    """Fix 1 (answer SHA-256 proposals with "invalid auth algorithm", so the client falls
    back to SHA-1) and session counting (established at RAKP4, closed by Close Session)."""

    def create_open_session_response(self, request: Any) -> Any:
        if request[12] != 1:
            self.clientsessionid = request[4:8]
            return bytearray([request[0], 0x11, 0, 0]) + request[4:8]
        return super().create_open_session_response(request)

    def _send_rakp4(self, tagvalue: int, statuscode: int) -> None:
        super()._send_rakp4(tagvalue, statuscode)
        if statuscode == 0:
            self.bmc.opened += 1

    # Fix 4 (found here, not in PEERS.md): the pyghmi client shares one UDP socket among
    # up to 64 BMCs. A new login from that socket to a BMC it had a session with (e.g. the
    # retry after fix 1) made pyghmi's server drop the client's sessions with *every* BMC
    # of the process, and its leftovers then died with "no attribute sessionless_data".
    def _handle_ipmi_packet(self, data: Any, sockaddr: Any = None, qent: Any = None) -> Any:
        if data[4] in (0, 2) and bytes(data[5:13]) == bytes(8):  # sessionless IPMI 1.5
            handlers = ipmisession.Session.bmc_handlers.get(sockaddr, {})
            handlers.pop(self.bmc.port, None)
            if not handlers:
                ipmisession.Session.bmc_handlers.pop(sockaddr, None)
            self.bmc.sessionless_data(data, sockaddr)
            return None
        return super()._handle_ipmi_packet(data, sockaddr=sockaddr, qent=qent)

    def process_pktqueue(self) -> None:
        handlers = ipmisession.Session.bmc_handlers
        while self.pktqueue:
            pkt = self.pktqueue.popleft()
            data = bytearray(pkt[0])
            if not (data[0] == 6 and data[2:4] == b"\xff\x07"):
                continue
            if self.bmc.port in handlers.get(pkt[1], {}):
                self._handle_ipmi_packet(data, sockaddr=pkt[1], qent=pkt)
            else:  # no longer a session of ours: it is the server's
                self.bmc.sessionless_data(data, pkt[1])

    def handle_client_request(self, request: Any) -> None:
        if request["netfn"] == 6 and request["command"] == 0x3C:
            self.bmc.closed += 1
        super().handle_client_request(request)


class SimBmc(pyghmi_bmc.Bmc):  # type: ignore[misc]
    def __init__(self, authdata: dict[str, str], port: int, address: str, *,
                 latency_s: float = 0.0, flap: int = 0) -> None:
        super().__init__(authdata, port=port, address=address)
        self.port = self.serversocket.getsockname()[1]
        self.latency_s = latency_s
        self.flap = flap  # answer this many commands with "node busy" first
        self.power = "off"
        self.boot_flags = 0
        self.boot_device_byte = 0
        self.opened = self.closed = self.commands = 0
        self.log: list[str] = []

    # -- chassis ---------------------------------------------------------------------------
    def get_power_state(self) -> str:
        return self.power

    def power_on(self) -> None:
        self._power("on")

    def power_off(self) -> None:
        self._power("off")

    def power_shutdown(self) -> None:
        self._power("off")

    def power_reset(self) -> int | None:
        if self.power == "off":
            return 0xD5
        self.log.append("reset")
        return None

    def power_cycle(self) -> int | None:
        if self.power == "off":
            return 0xD5
        self.log.append("cycle")
        return None

    def _power(self, state: str) -> None:
        self.log.append(f"power {state}")
        self.power = state

    def get_boot_device(self) -> int:
        return self.boot_device_byte

    # keep the EFI (0x20) and persistent (0x40) bits, which the base class drops
    def set_system_boot_options(self, request: Any, session: Any) -> None:
        data = request["data"]
        if data[0] == 5:
            self.boot_flags, self.boot_device_byte = data[1] & 0x7F, data[2]
            self.log.append(f"bootdev {data[2]:#x} flags {data[1]:#x}")
            session.send_ipmi_response()
        else:
            super().set_system_boot_options(request, session)

    def get_system_boot_options(self, request: Any, session: Any) -> None:
        if request["data"][0] != 5:
            return super().get_system_boot_options(request, session)  # type: ignore[no-any-return]
        valid = 0x80 if self.boot_device_byte else 0
        data = [1, 5, valid | self.boot_flags, self.boot_device_byte, 0, 0, 0]
        session.send_ipmi_response(data=data)

    def handle_raw_request(self, request: Any, session: Any) -> None:
        self.commands += 1
        if self.flap > 0:
            self.flap -= 1
            answer: Callable[[], None] = lambda: session.send_ipmi_response(code=0xC0)  # noqa: E731
        else:
            def answer() -> None:
                super(SimBmc, self).handle_raw_request(request, session)
        if self.latency_s > 0:
            later(self.latency_s, answer)
        else:
            answer()

    def stats(self) -> dict[str, Any]:
        return {"power": self.power, "bootdev": self.boot_device_byte,
                "boot_flags": self.boot_flags, "opened": self.opened, "closed": self.closed,
                "commands": self.commands, "log": self.log[-20:]}


def bounded_io_wait(timeout: float, myaddr: Any = None, evq: Any = None) -> None:
    """Fix 5 (the simulator wedge of 2026-11-21): pyghmi's ``_io_wait`` queues a wake-up for
    its IO thread and then waits on an Event with no timeout; when the IO thread misses
    that wake-up, the listen loop (``wait_for_rsp``) blocks until the IO thread's next
    300 s select() ends, and every BMC of the process and its stdin go silent. Same
    protocol with the wait bounded by the timeout asked for: a missed wake-up costs at
    most that (the loop asks for 0.1 s), never a wedge."""
    evt = threading.Event()
    if evq is not None:
        evq.append(evt)
    deadline = timeout + ipmisession._monotonic_time()
    ipmisession.ioqueue.append((deadline, evt, myaddr))
    if deadline < ipmisession.selectdeadline:
        wake = ipmisession.iosockets[0]
        wake.sendto(b"\x01", (ipmisession.myself, wake.getsockname()[1]))
    evt.wait(timeout + 0.05)


class LoopWatchdog:
    """Liveness of the listen loop: a stall longer than ``dump_s`` dumps every thread's
    stack to stderr (what the wedge looked like); longer than ``exit_s`` ends the process
    (exit 70), so a test fails on a dead simulator at once instead of waiting on it."""

    def __init__(self, *, dump_s: float = 5.0, exit_s: float = 30.0) -> None:
        self.beat = time.monotonic()
        self._dump_s, self._exit_s = dump_s, exit_s
        threading.Thread(target=self._watch, daemon=True, name="watchdog").start()

    def _watch(self) -> None:
        dumped = False
        while True:
            time.sleep(0.5)
            stalled = time.monotonic() - self.beat
            if stalled > self._exit_s:
                print(f"ipmi simulator: listen loop stalled {stalled:.0f} s; exiting",
                      file=sys.stderr, flush=True)
                os._exit(70)
            if stalled > self._dump_s and not dumped:
                print(f"ipmi simulator: listen loop stalled {stalled:.0f} s:",
                      file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr)
                dumped = True
            elif stalled <= self._dump_s:
                dumped = False


def serve(bmcs: list[SimBmc], commands: deque[str]) -> None:
    """Fix 3: one exception must not end every BMC's listen loop."""
    by_port = {bmc.port: bmc for bmc in bmcs}
    watchdog = LoopWatchdog()
    while True:
        watchdog.beat = time.monotonic()
        timeout = 0.1
        if _due:
            timeout = max(0.0, min(timeout, _due[0][0] - time.monotonic()))
        try:
            ipmisession.Session.wait_for_rsp(timeout=timeout)
        except Exception:
            log.exception("listen loop")
        now = time.monotonic()
        while _due and _due[0][0] <= now:
            _, _, fn = heapq.heappop(_due)
            try:
                fn()
            except Exception:
                log.exception("deferred answer")
        while commands:
            if commands.popleft() == "stats":
                print(json.dumps({str(p): b.stats() for p, b in by_port.items()}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", default="password")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--flap", type=int, default=0, help="BMCs (the first ones) that flap")
    parser.add_argument("--flap-calls", type=int, default=2, help="failing commands each")
    parser.add_argument("--silent", type=int, default=0, help="extra silent UDP ports")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serversession.ServerSession = CountingSession  # type: ignore[misc]
    ipmisession._io_wait = bounded_io_wait
    no_blocking_toggle()  # fix 6
    bmcs = [SimBmc({args.user: args.password}, 0, args.address,
                   latency_s=args.latency_ms / 1000.0,
                   flap=args.flap_calls if i < args.flap else 0) for i in range(args.count)]
    silent = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(args.silent)]
    for sock in silent:
        sock.bind((args.address, 0))
    # Fix 2: the IO thread select()s on the sockets that existed when it started: wake it.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as wake:
        wake.sendto(b"\x01", (args.address, bmcs[0].port))
    commands: deque[str] = deque()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.append(line.strip())
        os._exit(0)  # the parent is gone (even if SIGKILLed): do not outlive it

    threading.Thread(target=read_stdin, daemon=True, name="stdin").start()
    print(json.dumps({"ports": [b.port for b in bmcs],
                      "silent": [s.getsockname()[1] for s in silent]}), flush=True)
    serve(bmcs, commands)
    return 0


if __name__ == "__main__":
    sys.exit(main())


class SimBmcs:
    """Start ``python -m tests.sim.ipmi_bmc`` children; ``ports`` once they listen.

    ``with SimBmcs(count=3, flap=1) as sim: sim.ports, sim.stats()``; stopped by PID.
    BMCs are spread over processes of at most ``per_process`` (see ``PER_PROCESS``)."""

    def __init__(self, *, count: int, user: str = "admin", password: str = "password",
                 latency_ms: float = 0.0, flap: int = 0, flap_calls: int = 2,
                 silent: int = 0, address: str = "127.0.0.1",
                 per_process: int = PER_PROCESS) -> None:
        self.address = address
        self.user, self.password = user, password
        self._argvs = []
        for start in range(0, max(count, 1), per_process):
            size = min(per_process, count - start)
            flapping = max(0, min(flap - start, size))
            self._argvs.append([
                sys.executable, "-m", "tests.sim.ipmi_bmc", "--count", str(size), "--user",
                user, "--password", password, "--latency-ms", str(latency_ms), "--flap",
                str(flapping), "--flap-calls", str(flap_calls), "--silent",
                str(silent if start == 0 else 0), "--address", address])
        self.procs: list[subprocess.Popen[str]] = []
        self.ports: list[int] = []
        self.silent: list[int] = []

    def __enter__(self) -> SimBmcs:
        try:
            self.procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True, cwd=_ROOT) for argv in self._argvs]
            for proc in self.procs:
                ready = proc.stdout.readline() if proc.stdout else ""
                if not ready:
                    raise RuntimeError(f"ipmi simulator exited with {proc.wait()}")
                info = json.loads(ready)
                self.ports += info["ports"]
                self.silent += info["silent"]
        except BaseException:
            self.stop()
            raise
        return self

    def stats(self) -> dict[int, dict[str, Any]]:
        merged: dict[int, dict[str, Any]] = {}
        for proc in self.procs:
            assert proc.stdin and proc.stdout
            proc.stdin.write("stats\n")
            proc.stdin.flush()
            merged.update({int(port): value for port, value in
                           json.loads(proc.stdout.readline()).items()})
        return merged

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()
