"""``[bmc]``: drivers' limits, retries and breakers, site credentials, per-profile power-off
and credential rotation (``[bmc.profiles.<profile>]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, IPvAnyNetwork, SecretStr

from provisioner.config.section import Section


class BmcProfile(Section):
    """Per node profile (``bmc.profiles.<name>``); a node without one gets the defaults."""

    soft_off_timeout_s: float = Field(
        300.0, gt=0, description="How long a soft power-off (ACPI, GracefulShutdown) may take")
    hard_off_fallback: bool = Field(
        False, description="After the soft-off timeout (or on a BMC with no soft off at "
        "all), power off hard (ForceOff) instead of failing")
    rotate_credentials: bool = Field(
        False, description="Inspection ends by rotating the node's BMC password (a per-node "
        "generated one, or bmc.rotation_password), verified by a fresh login")


class BmcSettings(Section):
    timeout_s: float = Field(20.0, gt=0, description="Per-call BMC timeout")
    driver_timeout_s: dict[Literal["ipmi", "redfish"], Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="Per driver, a per-call timeout other than "
        "timeout_s (`[bmc.driver_timeout_s]` `ipmi = 2`, `redfish = 30`): IPMI answers in "
        "milliseconds or not at all, some Redfish BMCs take seconds per request")
    max_concurrency: int = Field(64, ge=1, description="BMC calls in flight, all BMCs")
    per_bmc_concurrency: int = Field(1, ge=1, description="Calls in flight per BMC")
    retries: int = Field(3, ge=0, description="Retries of a retryable BMC error")
    retry_backoff_s: float = Field(1.0, ge=0, description="First retry delay (doubles)")
    confirm_timeout_s: float = Field(60.0, gt=0, description="Wait for power read-back")
    breaker_threshold: int = Field(5, ge=1, description="Failures that open a BMC's breaker")
    breaker_reset_s: float = Field(30.0, gt=0, description="First probe of an open breaker")
    breaker_max_reset_s: float = Field(
        600.0, gt=0, description="Longest wait between probes of an open breaker (doubles)")
    confirm_poll_s: float = Field(1.0, gt=0, description="Power read-back polling interval")
    per_rack_concurrency: int | None = Field(
        None, ge=1, description="BMCs of one rack the lifecycle steps drive at once; unset: "
        "no limit (GB200/GB300 racks: see the operator guide)")
    profile_rack_concurrency: dict[str, int] = Field(
        default_factory=dict, description="Per profile, a lower per-rack limit for its nodes "
        "(`[bmc.profile_rack_concurrency]`, profile = N)")
    power_on_per_rack_per_s: float = Field(
        2.0, gt=0, description="Power-ons per rack per second (inrush stagger)")
    power_sync_interval_s: float = Field(
        300.0, ge=0, description="Power-state sync period; 0 disables it")
    power_sync_concurrency: int = Field(16, ge=1, description="BMCs polled at once in a sync")
    discovered_driver: Literal["ipmi", "redfish", "none"] = Field(
        "ipmi", description="Driver for a BMC learned from an inspection report (zero-touch "
        "linking, with the site default credentials); none: never link")
    link_subnets: list[IPvAnyNetwork] = Field(
        default_factory=list, description="Where zero-touch linking may link a reported BMC "
        "(and send it the site default credentials), e.g. [\"10.1.0.0/16\"]; a report naming "
        "any other address is held for an operator. Empty: every one is held")
    default_username: str | None = Field(None, description="Site default BMC user")
    default_password: SecretStr | None = Field(None, description="Site default BMC password")
    redfish_verify_tls: bool = Field(
        True, description="Verify Redfish BMC certificates; false accepts any (lab only)")
    redfish_ca_file: Path | None = Field(
        None, description="CA bundle for Redfish BMC certificates; default the system's")
    profiles: dict[str, BmcProfile] = Field(
        default_factory=dict, description="Soft-off and credential rotation per node "
        "profile name")
    rotation_password: SecretStr | None = Field(
        None, description="Site BMC password that rotation sets; unset: a generated "
        "password per node (16 letters and digits)")
    ipmi_workers: int = Field(4, ge=1, description="IPMI worker processes (pyghmi); each "
                              "owns a share of the BMCs and their sessions")
    ipmi_worker_threads: int = Field(16, ge=1, description="IPMI calls in flight per worker")
    ipmi_heartbeat_timeout_s: float = Field(
        10.0, gt=0, description="An IPMI worker silent this long is killed and replaced "
        "(it beats every 0.5 s; a starved machine delays beats by seconds)")
    ipmi_hang_grace_s: float = Field(
        15.0, gt=0, description="An IPMI worker that leaves a call unanswered this long past "
        "its deadline (timeout_s) is killed and replaced")

    def timeout_for(self, driver: str) -> float:
        """The per-call timeout of ``driver``'s BMCs: ``driver_timeout_s`` or ``timeout_s``."""
        for name, timeout_s in self.driver_timeout_s.items():
            if name == driver:
                return timeout_s
        return self.timeout_s

    def profile(self, name: str | None) -> BmcProfile:
        return self.profiles.get(name or "", BmcProfile())
