"""What steps and the API get from ``Ports.bmc``: drivers wrapped in limits, a circuit
breaker per BMC, the retry policy and read-back confirmation.

``BmcManager`` is the ``BmcFactory`` the daemon injects. It fills in the site's default
credentials (zero-touch), and hands out ``ManagedBmc`` objects whose every single call
goes through the BMC's breaker and the limiter, with a deadline; ``set_power`` and
``set_boot_device`` are the idempotent ``ensure_*`` templates of ``base.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from provisioner.bmc.base import (
    Bmc,
    BmcFactory,
    BmcHealth,
    BmcTimeout,
    BmcUnsupported,
    BootDevice,
    BootSetting,
    Clock,
    PasswordSetter,
    PowerState,
    RetryPolicy,
    Sleep,
    ensure_boot_device,
    ensure_power,
    ensure_power_cycle,
    health_reader,
)
from provisioner.bmc.breaker import CircuitBreaker
from provisioner.bmc.guard import BmcLimiter
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import BmcSettings
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import RetryableError

log = logging.getLogger(__name__)

T = TypeVar("T")
_BACKSTOP_S = 1.0
"""A driver gets this long past ``timeout_s`` to raise its own, clearer timeout."""


def endpoint_key(endpoint: BmcEndpoint) -> str:
    """Names one BMC: its breaker and its concurrency slot are keyed by it."""
    port = f":{endpoint.port}" if endpoint.port is not None else ""
    return f"{endpoint.driver}:{endpoint.address}{port}"


class BmcManager:
    def __init__(self, registry: BmcRegistry, settings: BmcSettings, *,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._registry = registry
        self._settings = settings
        self._clock = clock
        self.limiter = BmcLimiter(total=settings.max_concurrency,
                                  per_bmc=settings.per_bmc_concurrency)
        self.policy = RetryPolicy(retries=settings.retries, backoff_s=settings.retry_backoff_s,
                                  max_backoff_s=max(settings.retry_backoff_s * 8, 1.0),
                                  sleep=sleep, clock=clock)
        self._breakers: dict[str, CircuitBreaker] = {}

    def __call__(self, node_id: str, endpoint: BmcEndpoint,
                 credentials: BmcCredentials) -> ManagedBmc:
        key = endpoint_key(endpoint)
        driver = self._registry(node_id, endpoint, self.credentials_for(credentials))
        return ManagedBmc(driver, key, self, self.breaker(key), node_id=node_id,
                          timeout_s=self._settings.timeout_for(endpoint.driver))

    def credentials_for(self, given: BmcCredentials) -> BmcCredentials:
        """Zero-touch: a node enrolled without BMC credentials gets the site defaults."""
        default_password = self._settings.default_password
        if given.password or default_password is None:
            return BmcCredentials(username=given.username or self._settings.default_username,
                                  password=given.password)
        return BmcCredentials(username=given.username or self._settings.default_username,
                              password=default_password.get_secret_value(), site_default=True)

    def driver(self, name: str) -> BmcFactory | None:
        """The registry's driver ``name`` itself (servicing talks Redfish beyond ``Bmc``)."""
        return self._registry.driver(name)

    def breaker(self, key: str) -> CircuitBreaker:
        breaker = self._breakers.get(key)
        if breaker is None:
            breaker = self._breakers[key] = CircuitBreaker(
                key, threshold=self._settings.breaker_threshold,
                reset_s=self._settings.breaker_reset_s,
                max_reset_s=self._settings.breaker_max_reset_s, clock=self._clock)
        return breaker

    @property
    def settings(self) -> BmcSettings:
        return self._settings

    async def aclose(self) -> None:
        """Close every driver's sessions (logout); the daemon calls it at shutdown."""
        await self._registry.aclose()


class ManagedBmc:
    """A driver's Bmc behind its breaker and the limiter; power and boot calls idempotent,
    retried and confirmed by read-back."""

    def __init__(self, driver: Bmc, key: str, manager: BmcManager,
                 breaker: CircuitBreaker, *, timeout_s: float, node_id: str = "") -> None:
        self._driver = driver
        self._node_id = node_id  # its log lines start "node <id>": they name the hostname
        self._timeout_s = timeout_s
        """This driver's per-call deadline (``BmcSettings.timeout_for``)."""
        self._key = key
        self._manager = manager
        self._breaker = breaker
        self._raw = _GuardedBmc(driver, self.call)

    @property
    def key(self) -> str:
        return self._key

    async def power_state(self) -> PowerState:
        return await self._manager.policy.run(self._raw.power_state, what="power status")

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        await self.ensure_power(state, soft=soft)

    async def ensure_power(self, state: PowerState, *, soft: bool = False,
                           before_change: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Like ``set_power``; True if the power changed. ``before_change`` runs only when a
        change is needed (the per-rack power-on stagger)."""
        settings = self._manager.settings
        changed = await ensure_power(
            self._raw, state, policy=self._manager.policy, soft=soft,
            confirm_timeout_s=settings.confirm_timeout_s, poll_s=settings.confirm_poll_s,
            before_change=before_change)
        if changed:
            log.info("node %s: bmc %s: power %s%s", self._node_id, self._key,
                     "soft-" if soft else "", state)
        return changed

    async def power_cycle(self) -> None:
        settings = self._manager.settings
        await ensure_power_cycle(self._raw, policy=self._manager.policy,
                                 confirm_timeout_s=settings.confirm_timeout_s,
                                 poll_s=settings.confirm_poll_s)
        log.info("node %s: bmc %s: power cycled", self._node_id, self._key)

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        if await ensure_boot_device(self._raw, device, policy=self._manager.policy,
                                    persistent=persistent, uefi=uefi, http_uri=http_uri):
            log.info("node %s: bmc %s: boot device %s (%s, %s)%s", self._node_id, self._key,
                     device, "persistent" if persistent else "once",
                     "uefi" if uefi else "legacy",
                     f" from {http_uri}" if http_uri and device is BootDevice.HTTP else "")

    async def boot_device(self) -> BootSetting:
        return await self._manager.policy.run(self._raw.boot_device, what="boot device")

    async def set_password(self, new_password: str) -> None:
        """Change the BMC password of our user (through the breaker and the deadline; a
        retry sets the same password again, which is harmless)."""
        driver = self._driver
        if not isinstance(driver, PasswordSetter):
            raise BmcUnsupported(f"BMC {self._key}: this driver cannot change BMC passwords")
        await self._manager.policy.run(
            lambda: self.call("set password", lambda: driver.set_password(new_password)),
            what="set BMC password")

    async def verify_login(self) -> None:
        """A fresh login with this handle's credentials (retried if the BMC is busy; a
        refused password is BmcAuthFailed at once)."""
        driver = self._driver
        if not isinstance(driver, PasswordSetter):
            raise BmcUnsupported(f"BMC {self._key}: this driver cannot verify a login")
        await self._manager.policy.run(
            lambda: self.call("fresh login", driver.verify_login), what="fresh BMC login")

    async def read_health(self, cursor: str | None) -> BmcHealth:
        """The BMC's new log records and health (``HealthReader``), through the breaker
        and the deadline; not retried (the next poll is)."""
        driver = health_reader(self._driver)
        if driver is None:
            raise BmcUnsupported(f"BMC {self._key}: this driver reads no health")
        return await self.call("read health", lambda: driver.read_health(cursor))

    async def aclose(self) -> None:
        await self._driver.aclose()

    async def call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One driver call: breaker check, a concurrency slot, a deadline, the verdict."""
        breaker = self._breaker
        breaker.check()  # fail fast, without queueing behind a dead BMC
        async with self._manager.limiter.slot(self._key):
            breaker.before_call()
            verdict = False
            try:
                timeout_s = self._timeout_s + _BACKSTOP_S
                try:
                    async with asyncio.timeout(timeout_s):
                        result = await fn()
                except TimeoutError:
                    raise BmcTimeout(f"BMC {self._key}: no answer to {what} within "
                                     f"{timeout_s:g} s") from None
            except RetryableError as exc:
                breaker.record_failure(exc)
                verdict = True
                raise
            else:
                breaker.record_success()
                verdict = True
                return result
            finally:
                if not verdict:
                    breaker.release()


class _GuardedBmc:
    """The single driver calls, each through ``ManagedBmc.call``; what ``ensure_*`` drive."""

    def __init__(self, driver: Bmc, call: _Call) -> None:
        self._driver = driver
        self._call = call

    async def power_state(self) -> PowerState:
        return await self._call("power status", self._driver.power_state)

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        await self._call(f"power {state}", lambda: self._driver.set_power(state, soft=soft))

    async def power_cycle(self) -> None:
        await self._call("power cycle", self._driver.power_cycle)

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        await self._call(f"boot device {device}", lambda: self._driver.set_boot_device(
            device, persistent=persistent, uefi=uefi, http_uri=http_uri))

    async def boot_device(self) -> BootSetting:
        return await self._call("boot device status", self._driver.boot_device)

    async def aclose(self) -> None:
        return None


class _Call(Protocol):
    def __call__(self, what: str, fn: Callable[[], Awaitable[T]]) -> Awaitable[T]: ...
