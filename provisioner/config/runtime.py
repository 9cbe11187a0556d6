"""How the daemon itself runs: ``[api]``, ``[store]``, ``[lifecycle]``, ``[simulation]``,
``[log]``, ``[daemon]`` and ``[ha]``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from provisioner.config.section import Section, parse_host_port


class ApiSettings(Section):
    listen: str = Field("127.0.0.1:8700", description="HOST:PORT of the REST API, web UI, metrics")
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 beyond)"
    )
    page_size_max: int = Field(1000, ge=1, description="Largest page a list call may ask for")
    session_ttl_s: float = Field(
        8 * 3600.0, gt=0, description="Web console: a session's lifetime from sign-in")
    events_queue_max: int = Field(
        256, ge=1, description="Events a slow /api/v1/events client may lag before it is dropped")
    token_lifetime_days: float = Field(
        90.0, ge=0, description="API tokens expire this long after creation unless created with "
                                "their own lifetime (0: no default expiry)")

    @property
    def token_lifetime_s(self) -> float | None:
        """The default lifetime of a new API token in seconds; None: it never expires."""
        return self.token_lifetime_days * 86400.0 or None

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_host_port(value)
        return value

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_host_port(self.listen)


class StoreSettings(Section):
    auto_migrate: bool = Field(
        True, description="Apply pending migrations at start (a newer schema is always refused)"
    )
    pool_size: int = Field(4, ge=1, le=64, description="Store threads (SQLite uses one writer)")
    history_retention_days: int = Field(
        400, ge=0, description="Node history rows older than this are pruned (hourly), "
        "except each node's last row; 0 keeps them for ever")


class LifecycleSettings(Section):
    auto_inspect: bool = Field(True, description="Inspect discovered and enrolled nodes at once")
    auto_deploy: bool = Field(
        True, description="Deploy inspected nodes that have a profile, without an operator"
    )
    max_inspecting: int = Field(50, ge=1, description="Nodes inspecting at once; more queue")
    max_deploying: int = Field(20, ge=1, description="Nodes deploying at once; more queue")
    max_in_flight: int = Field(200, ge=1, description="Steps running at once, all kinds")
    step_timeout_s: float = Field(3600.0, gt=0, description="A step running longer fails")
    allow_overwrite: list[str] = Field(
        default_factory=list, description="Profiles whose nodes are deployed even when "
        "inspection finds an existing OS or data on their disks (\"*\": every profile); "
        "others are held in inspected until an operator allows it")


class SimulationSettings(Section):
    nodes: int = Field(0, ge=0, le=100_000, description="Simulated nodes enrolled at start")
    racks: int = Field(1, ge=1, description="Racks the simulated nodes are spread over")
    profile: str = Field("gpu-worker", description="Profile given to simulated nodes")
    step_delay_s: float = Field(
        0.5, ge=0, description="Simulated duration of each fake driver operation"
    )
    fail_rate: float = Field(0.0, ge=0, le=1, description="Share of fake operations that fail")


class LogSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level")


class DaemonSettings(Section):
    shutdown_timeout_s: float = Field(
        20.0, gt=0, description="Grace period for in-flight steps to checkpoint on SIGTERM"
    )


class HaSettings(Section):
    """Several daemons on one PostgreSQL database (docs/ha.md)."""

    lease_s: float = Field(
        30.0, ge=1, le=3600,
        description="A node's lease (and the singletons' lead): renewed every third of it "
        "while a step runs; a dead daemon's nodes are taken over this long after it stopped",
    )
    instance: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="This daemon's name in history rows and /api/v1/instances; default "
        "hostname-pid-random (a new one at every start)",
    )
