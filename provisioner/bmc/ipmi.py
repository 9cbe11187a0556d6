"""The ``ipmi`` driver: IPMI 2.0 (RMCP+) through pyghmi, in worker processes.

pyghmi blocks (the login too) and keeps its session state process-wide, so it runs in a
small pool of worker processes (``ipmi_pool.py``, ``ipmi_worker.py``), each owning a set of
BMCs and their sessions; a worker that misses its heartbeat or leaves a call unanswered
past its deadline is killed and replaced, and only its BMCs' calls fail (retryable). The
daemon's own deadline (``asyncio.timeout``) bounds every call: pyghmi alone gives up on a
silent BMC only after ~5 s, and on one that died after login only after ~28 s.

One pyghmi ``Command`` per BMC, in its worker, for the worker's lifetime; calls on one BMC
never overlap (a lock here, and one in the worker: a call that outlived its deadline keeps
the BMC until pyghmi returns, and the next call on that BMC waits for it). Before a login,
the BMC must answer a sessionless ping on our own socket, so a silent BMC never reaches
pyghmi. This module maps the workers' errors; only ``ipmi_worker.py`` imports pyghmi.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from provisioner.bmc.base import (
    BmcAuthFailed,
    BmcHealth,
    BmcTimeout,
    BmcUnreachable,
    BmcUnsupported,
    BootDevice,
    BootSetting,
    PowerState,
)
from provisioner.bmc.ipmi_pool import IpmiWorkers, WorkerError
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import DriverError
from provisioner.health.bmc import new_sel, sel_cursor, sel_events, sel_unchanged

log = logging.getLogger(__name__)

DEFAULT_PORT: Final = 623
_TO_IPMI: Final = {BootDevice.PXE: "network", BootDevice.HTTP: "network",
                   BootDevice.DISK: "hd", BootDevice.BIOS: "setup"}
_FROM_IPMI: Final = {"network": BootDevice.PXE, "hd": BootDevice.DISK,
                     "setup": BootDevice.BIOS}
# Message fragments of pyghmi's IpmiException, most specific first.
_AUTH: Final = ("incorrect password", "unauthorized name", "insufficient privilege",
                "unauthorized", "privilege level")
_LOST: Final = ("no longer connected", "session failed", "logged out")
_BUSY: Final = ("node busy", "timeout while processing", "out of space",
                "cannot execute command", "bmc initialization in progress")
_UNSUPPORTED: Final = ("invalid command", "invalid data field", "not supported",
                       "parameter out of range", "unknown")


class _BmcLink:
    """One BMC as the daemon sees it: where, with which credentials, one call at a time."""

    def __init__(self, address: str, port: int, credentials: BmcCredentials) -> None:
        self.address = address
        self.port = port
        self.credentials = credentials
        self.where = f"{address}:{port}"
        self.lock = asyncio.Lock()
        self.logged_in = False  # as its worker last said


class IpmiDriver:
    """The ``ipmi`` BmcFactory: keeps one link per BMC address and port."""

    def __init__(self, workers: IpmiWorkers, *, timeout_s: float) -> None:
        self._workers = workers
        self._timeout_s = timeout_s
        self._links: dict[tuple[str, int], _BmcLink] = {}
        self._stale: list[_BmcLink] = []

    def __call__(self, node_id: str, endpoint: BmcEndpoint,
                 credentials: BmcCredentials) -> IpmiBmc:
        key = (endpoint.address, endpoint.port or DEFAULT_PORT)
        link = self._links.get(key)
        if link is None or link.credentials != credentials:
            if link is not None:  # new credentials: log the old session out at close
                self._stale.append(link)
            link = self._links[key] = _BmcLink(key[0], key[1], credentials)
        return IpmiBmc(link, self._workers, self._timeout_s)

    @property
    def sessions(self) -> int:
        """BMCs with a link (each has at most one session)."""
        return len(self._links)

    async def aclose(self) -> None:
        """Log every session out (the daemon's shutdown), then stop the workers; a BMC that
        does not answer is left to time the session out itself."""
        links = [*self._links.values(), *self._stale]
        self._links, self._stale = {}, []
        results = await asyncio.gather(*(IpmiBmc(link, self._workers, self._timeout_s)
                                         .logout() for link in links if link.logged_in),
                                       return_exceptions=True)
        failed = sum(isinstance(result, BaseException) for result in results)
        if failed:
            log.warning("ipmi: %d of %d BMC sessions not logged out cleanly", failed,
                        len(results))
        await self._workers.aclose()


class IpmiBmc:
    def __init__(self, link: _BmcLink, workers: IpmiWorkers, timeout_s: float) -> None:
        self._link = link
        self._workers = workers
        self._timeout_s = timeout_s

    async def power_state(self) -> PowerState:
        return PowerState(await self._call("power status", "power_state"))

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        action = "shutdown" if soft and state is PowerState.OFF else str(state)
        await self._call(f"power {action}", "set_power", {"action": action})

    async def power_cycle(self) -> None:
        # pyghmi's "boot": on when off, else a hard reset (chassis control 3)
        await self._call("power cycle", "set_power", {"action": "boot"})

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        if device is BootDevice.HTTP:
            log.info("ipmi %s: IPMI has no HTTP boot device; asking for UEFI network boot",
                     self._link.where)
            uefi = True
        target = _TO_IPMI[device]
        reply = await self._call(f"boot device {device}", "set_bootdev", {
            "target": target, "persistent": persistent, "uefi": uefi})
        if isinstance(reply, dict) and "error" in reply:
            raise BmcUnsupported(f"BMC {self._link.where}: boot device {device}: "
                                 f"{reply['error']}")

    async def boot_device(self) -> BootSetting:
        reply = await self._call("boot device status", "get_bootdev")
        device = _FROM_IPMI.get(str(reply.get("bootdev")))
        return BootSetting(device, reply.get("persistent"), reply.get("uefimode"))

    async def set_password(self, new_password: str) -> None:
        """Set User Password for the user we log in as (IPMI allows 16 bytes here)."""
        if len(new_password.encode()) > 16:
            raise BmcUnsupported(f"BMC {self._link.where}: IPMI passwords are at most 16 "
                                 "bytes")
        await self._call("set password", "set_password", {
            "user": self._link.credentials.username, "password": new_password})

    async def verify_login(self) -> None:
        await self._call("fresh login", "verify_login")

    async def read_health(self, cursor: str | None) -> BmcHealth:
        """New SEL records after ``cursor`` (one Get SEL Info while nothing changed)."""
        seen = json.loads(cursor) if cursor else {}
        reply = await self._call("read SEL", "sel", {"unless": seen if isinstance(
            seen, dict) else {}})
        info, entries = reply["info"], reply["entries"]
        if entries is None or sel_unchanged(info, cursor):
            return BmcHealth((), (), cursor or sel_cursor(info, []))
        fresh = new_sel(entries, cursor)
        baseline = len(entries) if not cursor else 0
        return BmcHealth(tuple(sel_events(fresh)), (), sel_cursor(info, entries), baseline)

    async def aclose(self) -> None:
        """Nothing: the BMC's session is kept for the process (``IpmiDriver.aclose``)."""

    async def logout(self) -> None:
        await self._call("logout", "logout")

    async def _call(self, what: str, op: str, args: dict[str, Any] | None = None) -> Any:
        link = self._link
        creds = link.credentials
        if op != "logout" and (creds.username is None or creds.password is None):
            raise BmcAuthFailed(f"BMC {link.where}: no IPMI credentials (set them on the "
                                "node, in an inventory import, or bmc.default_username/"
                                "default_password)")
        await self._workers.ready(link.address, link.port)
        with map_ipmi_errors(link.where, what, self._timeout_s):
            async with asyncio.timeout(self._timeout_s), link.lock:
                if op != "logout" and not link.logged_in:
                    await ping(link.address, link.port)
                try:
                    answer = await self._workers.call(
                        link.address, link.port, creds.username or "", creds.password or "",
                        op, args, timeout_s=self._timeout_s)
                except BmcUnreachable:
                    link.logged_in = False  # its worker was replaced: a new session
                    raise
                except WorkerError:
                    link.logged_in = False if op == "logout" else link.logged_in
                    raise
                link.logged_in = answer.session
                return answer.value


# Get Channel Authentication Capabilities (IPMI 1.5, sessionless; channel 0xE, admin):
# RMCP header, session header (no auth, seq 0, session 0, length 9), then the message.
_PING: Final = bytes.fromhex("0600ff07" "00" "00000000" "00000000" "09"
                             "20" "18" "c8" "81" "00" "38" "8e" "04" "b5")


class _Pong(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.answer.done():
            self.answer.set_result(None)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


async def ping(address: str, port: int, *, resend_s: float = 0.5) -> None:
    """Wait until the BMC answers a sessionless IPMI request, on our own asyncio socket.

    Done before every login, so that a BMC that is silent or whose port is closed never
    reaches pyghmi: pyghmi's shared session machinery wedged here for every BMC when
    several logins to dead BMCs timed out in its threads at once. The caller's deadline
    bounds the wait; a closed port (ICMP unreachable) fails at once."""
    loop = asyncio.get_running_loop()
    transport, pong = await loop.create_datagram_endpoint(_Pong, remote_addr=(address, port))
    try:
        while True:
            transport.sendto(_PING)
            done, _ = await asyncio.wait({pong.answer}, timeout=resend_s)
            if done:
                return pong.answer.result()
    finally:
        transport.close()


@contextmanager
def map_ipmi_errors(where: str, what: str, timeout_s: float) -> Iterator[None]:
    """pyghmi's exceptions (and our deadline) to ours, at the module boundary."""
    try:
        yield
    except DriverError:
        raise
    except TimeoutError:
        raise BmcTimeout(f"BMC {where}: no answer to {what} within {timeout_s:g} s") from None
    except WorkerError as exc:
        raise _translate(exc, where, what) from None
    except OSError as exc:
        raise BmcUnreachable(f"BMC {where}: {what}: {exc.strerror or exc}") from exc


def _translate(exc: WorkerError, where: str, what: str) -> DriverError:
    """A worker's error (pyghmi's exception, by kind and text) to ours."""
    text = exc.text
    if exc.kind == "credentials":
        return BmcAuthFailed(f"BMC {where}: no IPMI credentials")
    if exc.kind == "pyghmi":
        return BmcUnsupported(f"BMC {where}: {what}: {text}")
    if exc.kind == "os":
        return BmcUnreachable(f"BMC {where}: {what}: {text}")
    if exc.kind != "ipmi":  # pyghmi's internals (a TypeError during a relogin, seen)
        return BmcUnreachable(f"BMC {where}: {what}: IPMI session in a bad state ({text})")
    low = text.lower()
    if not text or low == "timeout" or "timed out" in low:
        return BmcTimeout(f"BMC {where}: no answer to {what} (IPMI session timed out)")
    if any(part in low for part in _AUTH):
        reason = "wrong password" if "password" in low else text
        return BmcAuthFailed(f"BMC {where}: authentication failed: {reason}")
    if any(part in low for part in _LOST):
        return BmcUnreachable(f"BMC {where}: session lost during {what}: {text}")
    if any(part in low for part in _BUSY):
        return BmcUnreachable(f"BMC {where}: busy during {what}: {text}")
    if any(part in low for part in _UNSUPPORTED):
        return BmcUnsupported(f"BMC {where}: {what} refused: {text}")
    return BmcUnreachable(f"BMC {where}: {what} failed: {text}")
