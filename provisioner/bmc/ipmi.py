"""The ``ipmi`` driver: IPMI 2.0 (RMCP+) through pyghmi, in the daemon's bounded "bmc" pool.

pyghmi blocks (the login too), so every call runs in the injected thread pool, and the
daemon's own deadline (``asyncio.timeout``) bounds it: pyghmi alone gives up on a silent
BMC only after ~5 s, and on one that died after login only after ~28 s.

Exactly one pyghmi ``Command`` per BMC for the process lifetime: it is created lazily in
the pool and reused (pyghmi caches logins process-wide, and a second ``Command`` to a
logged-in BMC can block forever). Only a session pyghmi marked broken is replaced. Calls
on one BMC never overlap, in the pool either: a call that outlived its deadline keeps the
BMC's thread until pyghmi returns, and the next call on that BMC waits for it, so a dead
BMC holds at most one thread. This is the only module that imports pyghmi.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from pyghmi.exceptions import IpmiException, PyghmiException
from pyghmi.ipmi.command import Command

from provisioner.bmc.base import (
    BmcAuthFailed,
    BmcTimeout,
    BmcUnreachable,
    BmcUnsupported,
    BootDevice,
    BootSetting,
    PowerState,
)
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import DriverError

log = logging.getLogger(__name__)

T = TypeVar("T")
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
    """One BMC's pyghmi ``Command``, touched only from the pool, one call at a time."""

    def __init__(self, address: str, port: int, credentials: BmcCredentials) -> None:
        self.address = address
        self.port = port
        self.credentials = credentials
        self.where = f"{address}:{port}"
        self.lock = asyncio.Lock()
        self.running: asyncio.Future[Any] | None = None
        self._command: Any = None

    def run_blocking(self, fn: Callable[[Any], T]) -> T:
        command = self._command_blocking()
        try:
            return fn(command)
        except Exception:  # IpmiException, or pyghmi tripping over its own relogin state
            if command.ipmi_session.broken:
                self._command = None  # a broken session is replaced on the next call
                _forget_blocking(command.ipmi_session)
            raise

    def _command_blocking(self) -> Any:
        command = self._command
        if command is not None and not command.ipmi_session.broken:
            return command
        if self.credentials.username is None or self.credentials.password is None:
            raise BmcAuthFailed(f"BMC {self.where}: no IPMI credentials (set them on the "
                                "node, in an inventory import, or bmc.default_username/"
                                "default_password)")
        self._command = Command(bmc=self.address, userid=self.credentials.username,
                                password=self.credentials.password, port=self.port)
        return self._command

    @property
    def logged_in(self) -> bool:
        command = self._command
        return command is not None and not command.ipmi_session.broken

    def logout_blocking(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            if not command.ipmi_session.broken:
                command.ipmi_session.logout()
            _forget_blocking(command.ipmi_session)


def _forget_blocking(session: Any) -> None:
    """Drop a dead session from pyghmi's login cache. pyghmi 1.6.19 never does (it deletes
    with a bytes key it stored as str), so every later ``Command()`` to that BMC got the
    dead session back and failed with a TypeError: after a logout, and after a BMC died."""
    cache = type(session).initting_sessions
    for key in [key for key, value in cache.items() if value is session]:
        del cache[key]


class IpmiDriver:
    """The ``ipmi`` BmcFactory: keeps one link per BMC address and port."""

    def __init__(self, pool: ThreadPoolExecutor, *, timeout_s: float) -> None:
        self._pool = pool
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
        return IpmiBmc(link, self._pool, self._timeout_s)

    @property
    def sessions(self) -> int:
        """BMCs with a link (each has at most one session)."""
        return len(self._links)

    async def aclose(self) -> None:
        """Log every session out (the daemon's shutdown); a BMC that does not answer is
        left to time the session out itself."""
        links = [*self._links.values(), *self._stale]
        self._links, self._stale = {}, []
        results = await asyncio.gather(*(IpmiBmc(link, self._pool, self._timeout_s)
                                         .logout() for link in links), return_exceptions=True)
        failed = sum(isinstance(result, BaseException) for result in results)
        if failed:
            log.warning("ipmi: %d of %d BMC sessions not logged out cleanly", failed,
                        len(links))


class IpmiBmc:
    def __init__(self, link: _BmcLink, pool: ThreadPoolExecutor, timeout_s: float) -> None:
        self._link = link
        self._pool = pool
        self._timeout_s = timeout_s

    async def power_state(self) -> PowerState:
        reply = await self._call("power status", lambda c: c.get_power())
        return PowerState(reply["powerstate"])

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        action = "shutdown" if soft and state is PowerState.OFF else str(state)
        await self._call(f"power {action}", lambda c: c.set_power(action, wait=False))

    async def power_cycle(self) -> None:
        # pyghmi's "boot": on when off, else a hard reset (chassis control 3)
        await self._call("power cycle", lambda c: c.set_power("boot", wait=False))

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        if device is BootDevice.HTTP:
            log.info("ipmi %s: IPMI has no HTTP boot device; asking for UEFI network boot",
                     self._link.where)
            uefi = True
        target = _TO_IPMI[device]
        reply = await self._call(f"boot device {device}", lambda c: c.set_bootdev(
            target, persist=persistent, uefiboot=uefi))
        if isinstance(reply, dict) and "error" in reply:
            raise BmcUnsupported(f"BMC {self._link.where}: boot device {device}: "
                                 f"{reply['error']}")

    async def boot_device(self) -> BootSetting:
        reply = await self._call("boot device status", lambda c: c.get_bootdev())
        device = _FROM_IPMI.get(str(reply.get("bootdev")))
        return BootSetting(device, reply.get("persistent"), reply.get("uefimode"))

    async def aclose(self) -> None:
        """Nothing: the BMC's session is kept for the process (``IpmiDriver.aclose``)."""

    async def logout(self) -> None:
        await self._call("logout", lambda _c: None, command=False)

    async def _call(self, what: str, fn: Callable[[Any], T], *, command: bool = True) -> T:
        link = self._link
        loop = asyncio.get_running_loop()
        with map_ipmi_errors(link.where, what, self._timeout_s):
            async with asyncio.timeout(self._timeout_s), link.lock:
                if link.running is not None and not link.running.done():
                    await asyncio.wait({link.running})  # a call that outlived its deadline
                if command and not link.logged_in:
                    await ping(link.address, link.port)
                work: Callable[[], Any] = (lambda: link.run_blocking(fn)) if command else \
                    link.logout_blocking
                future = loop.run_in_executor(self._pool, work)
                future.add_done_callback(_consume)
                link.running = future
                result: T = await asyncio.shield(future)
                return result


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


def _consume(future: asyncio.Future[Any] | Future[Any]) -> None:
    """Retrieve the outcome of a call whose caller gave up (no 'never retrieved' noise)."""
    if not future.cancelled():
        future.exception()


@contextmanager
def map_ipmi_errors(where: str, what: str, timeout_s: float) -> Iterator[None]:
    """pyghmi's exceptions (and our deadline) to ours, at the module boundary."""
    try:
        yield
    except DriverError:
        raise
    except TimeoutError:
        raise BmcTimeout(f"BMC {where}: no answer to {what} within {timeout_s:g} s") from None
    except IpmiException as exc:
        raise _translate(exc, where, what) from exc
    except PyghmiException as exc:
        raise BmcUnsupported(f"BMC {where}: {what}: {exc}") from exc
    except OSError as exc:
        raise BmcUnreachable(f"BMC {where}: {what}: {exc.strerror or exc}") from exc
    except Exception as exc:  # pyghmi's internals (a TypeError during a relogin, seen)
        raise BmcUnreachable(f"BMC {where}: {what}: IPMI session in a bad state "
                             f"({type(exc).__name__}: {exc})") from exc


def _translate(exc: IpmiException, where: str, what: str) -> DriverError:
    text = str(exc.args[0]) if exc.args and exc.args[0] is not None else ""
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
