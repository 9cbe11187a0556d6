"""The BMC seam: one small async protocol; drivers implement only single calls.

Everything above a single call lives here once, for every driver: the error classes, the
retry policy, and the idempotent ``ensure_*`` templates (read first, act, confirm by
read-back). ``managed.py`` applies them, with limits and a circuit breaker, around every
driver the registry hands out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar, cast, runtime_checkable

from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import FatalError, RetryableError
from provisioner.health.bmc import Event
from provisioner.health.model import Finding
from provisioner.retry import JITTER, Backoff, retry_async

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class PowerState(StrEnum):
    ON = "on"
    OFF = "off"


class PowerAction(StrEnum):
    """What an operator may ask for; ``status`` only reads."""

    ON = "on"
    OFF = "off"
    SOFT_OFF = "soft-off"
    CYCLE = "cycle"
    STATUS = "status"


class BootDevice(StrEnum):
    PXE = "pxe"
    HTTP = "http"
    DISK = "disk"
    BIOS = "bios"


@dataclass(frozen=True, slots=True)
class BootSetting:
    """A boot override as a BMC reports it; None where the BMC does not say."""

    device: BootDevice | None
    persistent: bool | None = None
    uefi: bool | None = None
    http_uri: str | None = None
    """UEFI HTTP boot only: the boot file URI the BMC hands the firmware (Redfish
    ``HttpBootUri``); None where there is none or the BMC does not say."""


# -- errors -----------------------------------------------------------------------------------


class BmcUnreachable(RetryableError):
    """No usable answer: connection refused or lost, BMC busy, a 5xx."""


class BmcTimeout(RetryableError):
    """The BMC did not answer, or a power change did not read back, in time."""


class BmcCircuitOpen(BmcUnreachable):
    """Failing fast: the BMC failed too often in a row; it is probed again later."""


class BmcAuthFailed(FatalError):
    """Wrong user or password, not enough privilege, or an untrusted TLS certificate."""


class BmcUnsupported(FatalError):
    """The BMC refuses the request as invalid or unsupported (retrying cannot help)."""


class PowerCycleUnsupported(BmcUnsupported):
    """The BMC has no restart or power cycle, but can power off and on: ``ensure_power_cycle``
    then powers off, waits for the power to read off, and powers on (HPE Cray EX nodes
    offer only ``On``/``ForceOff``/``Off``)."""


# -- the protocol -----------------------------------------------------------------------------


class Bmc(Protocol):
    """One node's BMC. Idempotent: requesting the current state is success, not an error."""

    async def power_state(self) -> PowerState: ...

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        """On, or off (``soft``: ask the OS to shut down, ACPI / GracefulShutdown)."""
        ...

    async def power_cycle(self) -> None:
        """Hard reset of a running machine (a machine that is off is powered on)."""
        ...

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        """``http_uri``: for ``HTTP`` only, the boot file the firmware fetches, where the
        BMC can be told one (Redfish ``HttpBootUri``); other drivers ignore it and the
        firmware takes the URI from DHCP."""
        ...

    async def boot_device(self) -> BootSetting:
        """The boot override as the BMC reports it (device None: no override)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PasswordSetter(Protocol):
    """A driver that can change the password of the BMC user it logs in as."""

    async def set_password(self, new_password: str) -> None: ...

    async def verify_login(self) -> None:
        """Log in afresh with this handle's credentials (a kept session is dropped first):
        the proof that a password works, which a session opened before a change is not."""
        ...


@dataclass(frozen=True, slots=True)
class BmcHealth:
    """One health read of a BMC: the findings of the log records after the caller's cursor
    (``events``), what its status and detectors say now (``states``), the cursor to keep,
    and how many old records a first read passed over (``baseline``)."""

    events: tuple[Event, ...]
    states: tuple[Finding, ...]
    cursor: str
    baseline: int = 0


@runtime_checkable
class HealthReader(Protocol):
    """A driver that reads its BMC's event log and health (``lifecycle/bmc_health.py``)."""

    async def read_health(self, cursor: str | None) -> BmcHealth: ...


def health_reader(bmc: object) -> HealthReader | None:
    """``bmc`` where it reads health, else None: ``isinstance(bmc, HealthReader)`` without
    a runtime Protocol check's cost (11 µs against 0.1, twice a node and poll)."""
    return cast(HealthReader, bmc) if callable(getattr(bmc, "read_health", None)) else None


BmcFactory = Callable[[str, BmcEndpoint, BmcCredentials], Bmc]
"""(node id, endpoint, credentials) -> Bmc"""


# -- retry policy -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries ``RetryableError`` with doubling, jittered back-off (``provisioner.retry``),
    never ``FatalError``.

    ``deadline_s`` bounds all attempts together (None: only ``retries`` bounds them). A
    ``BmcCircuitOpen`` is not retried: the breaker already decided when to try again.
    ``jitter``: the random share of each pause (0: exactly ``delay_s``)."""

    retries: int = 3
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    deadline_s: float | None = None
    sleep: Sleep = field(default=asyncio.sleep, compare=False)
    clock: Clock = field(default=time.monotonic, compare=False)
    jitter: float = JITTER

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.backoff_s, self.max_backoff_s, self.jitter)

    def delay_s(self, retry: int) -> float:
        """The longest pause before retry number ``retry`` (0-based)."""
        return self.backoff.ceiling_s(retry)

    async def run(self, attempt: Callable[[], Awaitable[T]], *, what: str) -> T:
        def noted(exc: BaseException, retry: int, pause: float) -> None:
            log.warning("%s failed (%s); retry %d of %d in %.2g s", what, exc, retry,
                        self.retries, pause)

        return await retry_async(attempt, backoff=self.backoff, retryable=_retryable,
                                 tries=self.retries + 1, deadline_s=self.deadline_s,
                                 sleep=self.sleep, clock=self.clock, on_retry=noted)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, RetryableError) and not isinstance(exc, BmcCircuitOpen)


# -- idempotent templates ---------------------------------------------------------------------


async def confirm_power(bmc: Bmc, want: PowerState, *, timeout_s: float, poll_s: float,
                        sleep: Sleep = asyncio.sleep, clock: Clock = time.monotonic) -> None:
    """Poll ``power_state()`` until it reads ``want``; BmcTimeout after ``timeout_s``.

    BMCs apply power actions seconds after acknowledging them: read-back is the proof."""
    deadline = clock() + timeout_s
    while True:
        seen = await bmc.power_state()
        if seen is want:
            return
        left = deadline - clock()
        if left <= 0:
            raise BmcTimeout(f"power did not read back {want} within {timeout_s:g} s "
                             f"(still {seen})")
        await sleep(min(poll_s, left))


async def ensure_power(bmc: Bmc, want: PowerState, *, policy: RetryPolicy,
                       confirm_timeout_s: float, poll_s: float = 1.0, soft: bool = False,
                       before_change: Callable[[], Awaitable[None]] | None = None) -> bool:
    """Bring the power to ``want`` and confirm it; True if it had to change.

    Reads first: asking for the current state is success and touches nothing. Each retry
    starts over with a read, so a request that did land is never repeated."""

    async def attempt() -> bool:
        if await bmc.power_state() is want:
            return False
        if before_change is not None:
            await before_change()
        await bmc.set_power(want, soft=soft)
        await confirm_power(bmc, want, timeout_s=confirm_timeout_s, poll_s=poll_s,
                            sleep=policy.sleep, clock=policy.clock)
        return True

    return await policy.run(attempt, what=f"power {'soft-' if soft else ''}{want}")


async def ensure_power_cycle(bmc: Bmc, *, policy: RetryPolicy, confirm_timeout_s: float,
                             poll_s: float = 1.0) -> None:
    """Reset a running machine (power on one that is off), then confirm it reads on. A BMC
    without a cycle (``PowerCycleUnsupported``) is powered off hard, confirmed off, then on;
    a retry starts over with a read, so it never powers off twice a machine already off."""

    async def attempt() -> None:
        if await bmc.power_state() is PowerState.OFF:
            await bmc.set_power(PowerState.ON)
        else:
            try:
                await bmc.power_cycle()
            except PowerCycleUnsupported as exc:
                log.info("power cycle by off, then on: %s", exc)
                await bmc.set_power(PowerState.OFF)
                await confirm_power(bmc, PowerState.OFF, timeout_s=confirm_timeout_s,
                                    poll_s=poll_s, sleep=policy.sleep, clock=policy.clock)
                await bmc.set_power(PowerState.ON)
        await confirm_power(bmc, PowerState.ON, timeout_s=confirm_timeout_s, poll_s=poll_s,
                            sleep=policy.sleep, clock=policy.clock)

    await policy.run(attempt, what="power cycle")


@dataclass(frozen=True, slots=True)
class SoftOff:
    """How a soft power-off may end: within ``timeout_s`` (None: the BMC layer's own
    confirmation timeout), else a hard off when ``hard_fallback``, else BmcTimeout."""

    timeout_s: float | None = None
    hard_fallback: bool = False


async def ensure_soft_off(bmc: Bmc, how: SoftOff) -> bool:
    """Soft power-off (the OS shuts down); True when it had to fall back to a hard off.

    A BMC without any soft off (no GracefulShutdown, no PushPowerButton) falls back at
    once when allowed; one whose soft off does not read back in time, after the timeout."""
    try:
        async with asyncio.timeout(how.timeout_s):
            await bmc.set_power(PowerState.OFF, soft=True)
        return False
    except (TimeoutError, BmcTimeout, BmcUnsupported) as exc:
        reason = (f"not off {how.timeout_s:g} s after a soft off"
                  if isinstance(exc, TimeoutError) else str(exc))
        if not how.hard_fallback:
            if isinstance(exc, TimeoutError):
                raise BmcTimeout(f"soft power-off: {reason}") from None
            raise
    log.warning("soft power-off failed (%s); powering off hard", reason)
    await bmc.set_power(PowerState.OFF)
    return True


def same_device(seen: BootDevice | None, want: BootDevice) -> bool:
    """Whether a read-back device satisfies a request. BMCs may report an HTTP-boot request
    as network boot (IPMI has no HTTP device; sushy-tools stores UefiHttp as Pxe)."""
    return seen is want or (want is BootDevice.HTTP and seen is BootDevice.PXE)


async def ensure_boot_device(bmc: Bmc, device: BootDevice, *, policy: RetryPolicy,
                             persistent: bool = False, uefi: bool = True,
                             http_uri: str | None = None) -> bool:
    """Set the boot override unless it already is exactly that; confirm the device by
    read-back (not the persistence and UEFI bits, which many BMCs do not report
    faithfully; a BMC that reports no override at all cannot confirm anything)."""
    uri = http_uri if device is BootDevice.HTTP else None

    async def attempt() -> bool:
        seen = await bmc.boot_device()
        if seen == BootSetting(device, persistent, uefi, uri):
            return False
        await bmc.set_boot_device(device, persistent=persistent, uefi=uefi, http_uri=uri)
        after = await bmc.boot_device()
        if after.device is None:  # e.g. ipmi_sim: accepts overrides, never reports them
            log.debug("boot device %s set; the BMC reports no override to confirm it", device)
        elif not same_device(after.device, device):
            raise BmcTimeout(f"boot device {device} was accepted but reads back as "
                             f"{after.device or 'no override'}")
        return True

    return await policy.run(attempt, what=f"boot device {device}")
