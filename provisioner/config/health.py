"""``[health]``: the repair ladder's drains and its circuit breaker."""

from __future__ import annotations

from pydantic import Field, field_validator

from provisioner.config.section import Section

#: the classes of ``provisioner.health.model.HealthClass`` (config sits below it; a unit
#: test keeps the two equal)
HEALTH_CLASSES = ("gpu-lost", "gpu-memory", "gpu", "nvlink", "fabric", "infiniband",
                  "thermal", "power", "leak", "host-memory", "hardware", "driver",
                  "application", "unresponsive", "reported")


class HealthSettings(Section):
    """What a health finding may start on its own (``provisioner.health.ladder``)."""

    auto_repair: bool = Field(
        True, description="A finding starts the repair ladder of an active node on its own; "
        "false: findings are recorded, an operator starts each ladder")
    max_repairing_fraction: float = Field(
        0.05, ge=0, le=1, description="Circuit breaker: the share of the fleet a ladder may "
        "have drained at once; past it, automatic drains stop until an operator resets it")
    max_repairing_fraction_rack: float = Field(
        0.25, ge=0, le=1, description="Circuit breaker: the same, per rack")
    max_repairing_fraction_domain: float = Field(
        0.25, ge=0, le=1, description="Circuit breaker: the same, per NVLink domain")
    breaker_floor: int = Field(
        1, ge=0, description="Circuit breaker: nodes always allowed under repair per fleet, "
        "rack or domain, however small the fraction")
    cooldown_s: float = Field(
        6 * 3600.0, ge=0, description="A finding of the class whose ladder ended on the node "
        "less than this ago does not start it again (a flapping sensor): it is recorded")
    drain_deadline_s: dict[str, float] = Field(
        default_factory=dict, description="Per class (gpu-memory = 7200, ...): how long "
        "running jobs may go on before the first rung; unset: the ladder's default")
    bmc_poll_interval_s: float = Field(
        45.0, ge=0, description="How often each in-service node's BMC is read for new SEL "
        "or Redfish log records, its Status.Health and leak detectors (45 s: a fault seen "
        "within a minute, p99, at under 2 % of a core for 1,000 GB200 trays); 0: never")
    bmc_poll_concurrency: int = Field(
        32, ge=1, description="BMCs read at once in a health poll (each within the BMC "
        "limits and breaker of [bmc])")
    probe_period_s: float = Field(
        60.0, gt=0, description="In-band probe (the node's systemd timer): how often it "
        "posts its kernel log, nvidia-smi -q, ibstat and dcgmi health to /agent/v1/health "
        "(under 60: a divisor of 60; from 60: whole minutes)")
    probe_min_interval_s: float = Field(
        10.0, ge=0, description="In-band probe: posts of one node closer together than "
        "this are refused (429); a node cannot flood the intake")
    probe_token_ttl_s: float = Field(
        30 * 86400.0, gt=0, description="In-band probe: a probe token's lifetime; past "
        "half of it, the answer to a post carries the next one")
    os_up_timeout_s: float = Field(
        900.0, gt=0, description="After an OS restart or a power cycle, how long the node's "
        "SSH may take to answer again before the rung fails")

    @field_validator("drain_deadline_s")
    @classmethod
    def _known_classes(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(HEALTH_CLASSES))
        if unknown:
            raise ValueError(f"unknown health class {unknown[0]!r}; known: "
                             + ", ".join(HEALTH_CLASSES))
        if any(v < 0 for v in value.values()):
            raise ValueError("a drain deadline is 0 s or more")
        return value
