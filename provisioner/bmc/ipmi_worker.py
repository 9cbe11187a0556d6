"""An IPMI worker process: pyghmi for the BMCs the daemon assigns it, driven over a pipe.

Run by ``ipmi_pool.IpmiWorkers`` as ``python -m provisioner.bmc.ipmi_worker``. Requests
come on stdin, one JSON object a line (``{"id", "bmc": [address, port, user, password],
"op", "args"}``); answers go to stdout (``{"id", "ok", "session"}`` or ``{"id",
"error": {"kind", "text"}}``), and a heartbeat line (``{"hb": n}``) every
``--heartbeat-s`` from a thread of its own, so the daemon sees a stopped or dead process
even when no call is running. Calls run in a small thread pool (pyghmi blocks), one at a
time per BMC; pyghmi's process-wide session state lives here, never in the daemon, so a
wedged pyghmi costs the daemon this process (killed and replaced), not its event loop.

Exactly one pyghmi ``Command`` per BMC (address and port) at a time, whatever the
credentials: only a session pyghmi marked broken, or a call with other credentials (a
rotated password, or a reader that still holds the old one), replaces it, and the old
session is logged out first under the BMC's one lock. pyghmi routes a BMC's datagrams by
its address, so two sessions of one process with one BMC, logging in at once with two
passwords, stalled each other until the call's deadline (a power status right after a
rotation, while the power sync still read the old password). This module and nothing
else in the package imports pyghmi.
``no_blocking_toggle`` fixes a pyghmi race that stalls its IO thread (the BMC simulator of
the tests applies it too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Final

import pyghmi.ipmi.events as pyghmi_events
import pyghmi.ipmi.private.session as pyghmi_session
from pyghmi.exceptions import IpmiException, PyghmiException
from pyghmi.ipmi.command import Command

Key = tuple[str, int]


class MissingCredentials(Exception):
    pass


class Link:
    """One BMC's pyghmi ``Command``, one call at a time."""

    def __init__(self, address: str, port: int, user: str, password: str) -> None:
        self.address, self.port = address, port
        self.user, self.password = user, password
        self._command: Any = None

    @property
    def logged_in(self) -> bool:
        command = self._command
        return command is not None and not command.ipmi_session.broken

    def run(self, fn: Callable[[Any], Any]) -> Any:
        command = self._command_blocking()
        try:
            return fn(command)
        except Exception:  # IpmiException, or pyghmi tripping over its own relogin state
            if command.ipmi_session.broken:
                self._command = None  # a broken session is replaced on the next call
                forget(command.ipmi_session)
            raise

    def logout(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            if not command.ipmi_session.broken:
                command.ipmi_session.logout()
            forget(command.ipmi_session)

    def _command_blocking(self) -> Any:
        command = self._command
        if command is not None and not command.ipmi_session.broken:
            return command
        if not self.user or not self.password:
            raise MissingCredentials("no IPMI credentials")
        try:
            self._command = Command(bmc=self.address, userid=self.user,
                                    password=self.password, port=self.port)
        except BaseException:
            forget_logins(self.address, self.port)  # else the next login gets it back
            raise
        return self._command


def forget(session: Any) -> None:
    """Drop a dead session from pyghmi's login cache. pyghmi 1.6.19 never does (it deletes
    with a bytes key it stored as str), so every later ``Command()`` to that BMC got the
    dead session back and failed with a TypeError: after a logout, and after a BMC died."""
    cache = type(session).initting_sessions
    for key in [key for key, value in cache.items() if value is session]:
        del cache[key]


def forget_logins(address: str, port: int) -> None:
    """Drop a failed login from pyghmi's login cache (the ``forget`` bug, before a session
    exists): a refused password's next ``Command()`` got the dead login back and waited 7 s
    for "Session no longer connected" instead of a refusal, holding the BMC meanwhile. The
    caller holds the BMC's lock, so no other login of this process to it is under way."""
    cache = pyghmi_session.Session.initting_sessions
    for key in [key for key in cache if key[0] == address and key[3] == port]:
        del cache[key]


def no_blocking_toggle() -> None:
    """Replace pyghmi's socket IO (1.6.19) with calls that never change a socket's mode.

    pyghmi's ``_io_recvfrom`` (its IO thread) does ``setblocking(0)`` then ``recvfrom``;
    ``_io_sendto`` (any thread) does ``setblocking(1)`` then ``sendto``, on the same shared
    socket. When a send lands between the IO thread's two calls, its ``recvfrom`` blocks
    until the next datagram reaches that socket: the IO thread stops serving *every*
    socket and session of the process meanwhile. Seen in the tests' BMC simulator (one
    process silent for 6.4 s, all its BMCs unanswered, until a datagram reached the idle
    socket its IO thread blocked on) and possible here (a client socket whose BMCs all went
    quiet). Sockets now stay blocking; the IO thread reads with ``MSG_DONTWAIT``."""
    pyghmi_session._io_recvfrom = recvfrom_nowait
    pyghmi_session._io_sendto = sendto_blocking


def recvfrom_nowait(sock: socket.socket, size: int) -> tuple[bytes, Any] | None:
    try:
        return sock.recvfrom(size, socket.MSG_DONTWAIT)
    except OSError:  # nothing waiting (EAGAIN), or an ICMP error queued on the socket
        return None


def sendto_blocking(sock: socket.socket, packet: bytes, sockaddr: Any) -> None:
    # as pyghmi's own: a failed send is a lost datagram, which its retransmission covers
    with contextlib.suppress(OSError):
        sock.sendto(packet, sockaddr)


def _power_state(command: Any, _args: dict[str, Any]) -> str:
    return str(command.get_power()["powerstate"])


def _set_power(command: Any, args: dict[str, Any]) -> None:
    command.set_power(str(args["action"]), wait=False)


def _set_bootdev(command: Any, args: dict[str, Any]) -> dict[str, Any]:
    return _bootdev_reply(command.set_bootdev(str(args["target"]), persist=bool(
        args["persistent"]), uefiboot=bool(args["uefi"])))


def _get_bootdev(command: Any, _args: dict[str, Any]) -> dict[str, Any]:
    return _bootdev_reply(command.get_bootdev())


def _set_password(command: Any, args: dict[str, Any]) -> int:
    """Set User Password (IPMI 2.0, 16 bytes) for the user we are logged in as; its id is
    found by name (Get User Name, ids 1-16)."""
    name = str(args["user"])
    for uid in range(1, 17):
        if command.get_user_name(uid) == name:
            command.set_user_password(uid, mode="set_password", password=str(args["password"]))
            return uid
    raise PyghmiException(f"user {name!r} not found among user ids 1-16")


SEL_MAX: Final = 512  # records returned at most (the newest): a full SEL is ~3,000


def _sel(command: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Get SEL Info (entries, last add and erase times); the records too, decoded by
    pyghmi, unless all three are the caller's (``args["unless"]``, ``n``/``add``/``erase``):
    one command per poll while nothing happens."""
    raw = bytes(command.xraw_command(netfn=0x0A, command=0x40)["data"])
    info = {"entries": int.from_bytes(raw[1:3], "little"),
            "last_add": int.from_bytes(raw[5:9], "little"),
            "last_erase": int.from_bytes(raw[9:13], "little")}
    unless = args.get("unless") or {}
    if info["entries"] == 0 or (unless.get("n"), unless.get("add"), unless.get("erase")) == (
            info["entries"], info["last_add"], info["last_erase"]):
        return {"info": info, "entries": [] if info["entries"] == 0 else None}
    return {"info": info, "entries": [_sel_record(e) for e in _event_log(command)[-SEL_MAX:]]}


class _NoSdr:
    """A BMC without sensor records (ipmi_sim's): its sensors are named by number."""

    sensors: dict[str, Any] = {}


def _event_log(command: Any) -> list[dict[str, Any]]:
    """``Command.get_event_log()``, also for a BMC whose SDR cannot be read (pyghmi then
    fails the whole read): its records decoded without sensor names. The SDR is read once
    a session (pyghmi keeps it, or our stand-in after a failure)."""
    command.oem_init()
    try:
        sdr = command.init_sdr()
    except IpmiException:
        sdr = command._sdr = _NoSdr()  # not asked again on this session
    return list(pyghmi_events.EventHandler(sdr, command).fetch_sel(command))


def _sel_record(event: dict[str, Any]) -> dict[str, Any]:
    keep = ("record_id", "timecode", "timestamp", "component", "component_type", "event_id",
            "event", "severity", "deassertion")
    record: dict[str, Any] = {k: event[k] for k in keep if k in event}
    if "event_data" in event:
        record["event_data"] = str(event["event_data"])
    if event.get("deassertion") and "event_id" in event:  # the assertion's words: the
        record["asserted_event"] = _asserted(event)        # finding it clears is named so
    return {k: v if isinstance(v, str | int | bool | type(None)) else str(v)
            for k, v in record.items()}


def _asserted(event: dict[str, Any]) -> str:
    from pyghmi.ipmi.private import constants

    event_type, _, offset = str(event["event_id"]).partition(".")
    kind, index = int(event_type), int(offset)
    table = constants.sensor_type_offsets.get(event.get("component_type_id"), {}) \
        if kind == 0x6F else constants.generic_type_offsets.get(kind, {})
    return str(table.get(index, {}).get("desc", event.get("event", "")))


OPS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "power_state": _power_state, "set_power": _set_power,
    "set_bootdev": _set_bootdev, "get_bootdev": _get_bootdev,
    "set_password": _set_password, "sel": _sel,
}


def _bootdev_reply(reply: Any) -> dict[str, Any]:
    if not isinstance(reply, dict):
        return {}
    keep = ("bootdev", "persistent", "uefimode", "error")
    return {k: reply[k] for k in keep if k in reply and isinstance(
        reply[k], str | bool | int | type(None))}


def error_of(exc: BaseException) -> dict[str, str]:
    """An exception as ``{"kind", "text"}``: the daemon maps kinds to its errors."""
    if isinstance(exc, IpmiException):
        text = exc.args[0] if exc.args and exc.args[0] is not None else ""
        return {"kind": "ipmi", "text": str(text)}
    if isinstance(exc, PyghmiException):
        return {"kind": "pyghmi", "text": str(exc)}
    if isinstance(exc, MissingCredentials):
        return {"kind": "credentials", "text": str(exc)}
    if isinstance(exc, OSError):
        return {"kind": "os", "text": exc.strerror or str(exc)}
    return {"kind": "internal", "text": f"{type(exc).__name__}: {exc}"}


class Worker:
    def __init__(self, out: BinaryIO, threads: int) -> None:
        self._out = out
        self._write = threading.Lock()
        self._links: dict[Key, Link] = {}
        self._locks: dict[Key, threading.Lock] = {}
        self._links_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ipmi")

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._write:
            self._out.write(line)
            self._out.flush()

    def submit(self, request: dict[str, Any]) -> None:
        self._pool.submit(self._handle, request)

    def _lock(self, key: Key) -> threading.Lock:
        with self._links_lock:
            return self._locks.setdefault(key, threading.Lock())

    def _link(self, key: Key, user: str, password: str) -> Link:
        """The BMC's link for these credentials; called with the BMC's lock held. A link
        with other credentials is logged out (best effort: the password it knows may be
        gone) and forgotten before the new one logs in."""
        with self._links_lock:
            link = self._links.get(key)
        if link is not None and (link.user, link.password) == (user, password):
            return link
        if link is not None:
            with contextlib.suppress(Exception):
                link.logout()
        link = Link(key[0], key[1], user, password)
        with self._links_lock:
            self._links[key] = link
        return link

    def _handle(self, request: dict[str, Any]) -> None:
        rid = request.get("id")
        try:
            address, port, user, password = request["bmc"]
            key, creds = (str(address), int(port)), (str(user), str(password))
            lock = self._lock(key)
            # a call still running on this BMC (past its deadline) holds the lock: wait no
            # longer than this call's own deadline, so queued calls never pile up threads
            if not lock.acquire(timeout=float(request.get("timeout_s") or 30.0)):
                raise IpmiException("node busy: an earlier call on this BMC still runs")
            try:
                answer = {"id": rid, **self._run(key, creds, str(request["op"]),
                                                 dict(request.get("args") or {}))}
            finally:
                lock.release()
        except BaseException as exc:  # every failure goes back as an answer
            answer = {"id": rid, "error": error_of(exc)}
        self.send(answer)

    def _run(self, key: Key, creds: tuple[str, str], op: str,
             args: dict[str, Any]) -> dict[str, Any]:
        """One call, the BMC's lock held: ``{"ok", "session"}``."""
        if op == "logout":  # only the session these credentials opened, if still current
            with self._links_lock:
                current = self._links.get(key)
            if current is not None and (current.user, current.password) == creds:
                current.logout()
            return {"ok": None, "session": False}
        link = self._link(key, *creds)
        if op == "verify_login":  # a fresh login: drop the kept session first
            link.logout()
            result = link.run(lambda _c: None)
        else:
            result = link.run(lambda c: OPS[op](c, args))
        return {"ok": result, "session": link.logged_in}

    def logout_all(self) -> None:
        with self._links_lock:
            links = list(self._links.items())
        for key, link in links:
            try:
                with self._lock(key):
                    link.logout()
            except Exception as exc:  # a dead BMC: its session times out on its own
                print(f"ipmi worker: logout {link.address}:{link.port}: {exc}",
                      file=sys.stderr)


def heartbeat(worker: Worker, period_s: float, stop: threading.Event) -> None:
    beat = 0
    while not stop.wait(period_s):
        beat += 1
        worker.send({"hb": beat})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="IPMI worker (pyghmi) for the daemon")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--heartbeat-s", type=float, default=0.5)
    args = parser.parse_args(argv)
    no_blocking_toggle()
    worker = Worker(sys.stdout.buffer, args.threads)
    stop = threading.Event()
    threading.Thread(target=heartbeat, args=(worker, args.heartbeat_s, stop), daemon=True,
                     name="heartbeat").start()
    worker.send({"ready": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") == "logout_all":
            worker.logout_all()
            worker.send({"id": request.get("id"), "ok": None})
            continue
        worker.submit(request)
    stop.set()
    os._exit(0)  # stdin closed: the daemon is gone or done; never wait on pyghmi threads


if __name__ == "__main__":
    sys.exit(main())
