"""SQLModel tables. Only ``store/`` sees these; the rest gets ``provisioner.domain`` values."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


class NodeRow(SQLModel, table=True):
    __tablename__ = "node"
    __table_args__ = (Index("ix_node_created_at_id", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=36)
    hostname: str | None = Field(default=None, unique=True, max_length=253)
    serial: str | None = Field(default=None, unique=True, max_length=128)
    state: str = Field(index=True, max_length=32)
    maintenance: bool = Field(default=False, index=True)
    maintenance_reason: str = Field(default="", max_length=1024)
    profile: str | None = Field(default=None, index=True, max_length=128)
    rack: str | None = Field(default=None, index=True, max_length=128)
    position: str | None = Field(default=None, max_length=64)
    facts: str = Field(default="{}")
    last_error: str = Field(default="", max_length=4096)
    checkpoint: str = Field(default="[]")
    version: int = Field(default=0)
    history_seq: int = Field(default=0)
    bmc_driver: str | None = Field(default=None, max_length=32)
    bmc_address: str | None = Field(default=None, max_length=255)
    bmc_port: int | None = Field(default=None)
    bmc_username: str | None = Field(default=None, max_length=255)
    bmc_password_enc: str | None = Field(default=None)
    bmc_password_pending_enc: str | None = Field(default=None)
    bmc_mac: str | None = Field(default=None, max_length=17)
    power_state: str | None = Field(default=None, max_length=16)
    power_checked_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class NodeMacRow(SQLModel, table=True):
    __tablename__ = "node_mac"

    mac: str = Field(primary_key=True, max_length=17)
    node_id: str = Field(foreign_key="node.id", index=True, ondelete="CASCADE")


class TransitionRow(SQLModel, table=True):
    __tablename__ = "transition"
    __table_args__ = (UniqueConstraint("node_id", "seq", name="uq_transition_node_seq"),
                      Index("ix_transition_created_at", "created_at"))

    id: int | None = Field(default=None, primary_key=True)
    node_id: str = Field(foreign_key="node.id", index=True, ondelete="CASCADE")
    seq: int
    event: str = Field(max_length=32)
    from_state: str = Field(max_length=32)
    to_state: str = Field(max_length=32)
    actor: str = Field(max_length=128)
    reason: str = Field(default="", max_length=4096)
    created_at: datetime = Field(default_factory=utcnow)
    instance: str | None = Field(default=None, max_length=128)  # the daemon that wrote it
    fence: int | None = Field(default=None)  # its lease's fencing number, if it held one


class ApiTokenRow(SQLModel, table=True):
    __tablename__ = "api_token"

    id: str = Field(primary_key=True, max_length=16)
    name: str = Field(unique=True, max_length=128)
    role: str = Field(max_length=16)
    token_hash: str = Field(unique=True, max_length=64)
    # indexed: a node's iPXE script replaces its tokens (and a node's delete cascades here)
    node_id: str | None = Field(default=None, foreign_key="node.id", ondelete="CASCADE",
                                index=True)
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime | None = None


class LeaseRow(SQLModel, table=True):
    """A DHCP lease (authoritative mode). Reservations are nodes' MACs, not rows here."""

    __tablename__ = "lease"

    mac: str = Field(primary_key=True, max_length=17)
    ip: str = Field(unique=True, max_length=45)
    node_id: str | None = Field(default=None, foreign_key="node.id", ondelete="SET NULL")
    hostname: str | None = Field(default=None, max_length=253)
    client_id: str | None = Field(default=None, max_length=255)
    state: str = Field(max_length=16)
    expires_at: datetime
    updated_at: datetime = Field(default_factory=utcnow)


class FabricScanRow(SQLModel, table=True):
    """The latest ``ibnetdiscover`` of one fabric, as a node posted it (one row per fabric:
    a new scan replaces the old one). The live topology recomputes from these."""

    __tablename__ = "fabric_scan"

    name: str = Field(primary_key=True, max_length=64)
    text: str = Field(sa_column=Column(Text, nullable=False))
    sha256: str = Field(max_length=64)
    reporter_node_id: str | None = Field(default=None, foreign_key="node.id",
                                         ondelete="SET NULL")
    received_at: datetime = Field(default_factory=utcnow)


class NodeLeaseRow(SQLModel, table=True):
    """Who drives a node's in-flight step: one row per node, claimed with ``FOR UPDATE SKIP
    LOCKED``. ``fence`` grows at every claim; every fenced write checks it (DESIGN §7)."""

    __tablename__ = "node_lease"

    node_id: str = Field(primary_key=True, foreign_key="node.id", ondelete="CASCADE",
                         max_length=36)
    owner: str | None = Field(default=None, index=True, max_length=128)
    fence: int = Field(default=0)
    expires_at: datetime | None = None


class InstanceRow(SQLModel, table=True):
    """A running daemon: its heartbeat says it is alive."""

    __tablename__ = "instance"

    id: str = Field(primary_key=True, max_length=128)
    api_listen: str = Field(default="", max_length=255)
    started_at: datetime = Field(default_factory=utcnow)
    heartbeat_at: datetime = Field(default_factory=utcnow)


class SingletonRow(SQLModel, table=True):
    """A fleet-wide singleton's leader lease (topology publication, syncs, sweeps)."""

    __tablename__ = "singleton"

    name: str = Field(primary_key=True, max_length=64)
    owner: str | None = Field(default=None, max_length=128)
    fence: int = Field(default=0)
    expires_at: datetime | None = None


class FabricAcceptanceRow(SQLModel, table=True):
    """One fabric acceptance run of a domain (issue 26): its nodes, state and judged result
    (per node and for the domain, JSON). The latest row of a domain is its standing."""

    __tablename__ = "fabric_acceptance"
    __table_args__ = (Index("ix_fabric_acceptance_domain_started", "domain", "started_at"),)

    id: str = Field(primary_key=True, max_length=36)
    domain: str = Field(max_length=128)
    fabric_class: str = Field(max_length=64)
    status: str = Field(max_length=16)  # running, passed, failed, interrupted
    nodes: str = Field(sa_column=Column(Text, nullable=False))  # JSON: [[id, name], ...]
    summary: str = Field(default="", max_length=4096)
    slowest: str | None = Field(default=None, max_length=253)
    result: str = Field(sa_column=Column(Text, nullable=False))  # JSON: DomainVerdict
    requested_by: str = Field(default="", max_length=128)
    instance: str | None = Field(default=None, max_length=128)
    started_at: datetime = Field(default_factory=utcnow)
    deadline_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class HealthFindingRow(SQLModel, table=True):
    """A health finding of a node: one row per (node, origin, class, subject); a repeat
    updates ``last_seen`` and ``count``, a return after ``cleared_at`` reopens the row."""

    __tablename__ = "health_finding"
    __table_args__ = (
        UniqueConstraint("node_id", "origin", "health_class", "subject",
                         name="uq_health_finding_key"),
        Index("ix_health_finding_open", "cleared_at", "health_class"),
    )

    id: int | None = Field(default=None, primary_key=True)
    node_id: str = Field(foreign_key="node.id", index=True, ondelete="CASCADE", max_length=36)
    origin: str = Field(max_length=16)
    health_class: str = Field(max_length=32)
    subject: str = Field(default="", max_length=128)
    action: str = Field(max_length=32)
    evidence: str = Field(default="", max_length=2048)
    first_seen: datetime = Field(default_factory=utcnow)
    last_seen: datetime = Field(default_factory=utcnow)
    count: int = Field(default=1)
    cleared_at: datetime | None = None
    silenced_until: datetime | None = None
    silence_reason: str = Field(default="", max_length=1024)
    silenced_by: str = Field(default="", max_length=128)


class HealthSilenceRow(SQLModel, table=True):
    """An operator's silence of one class of findings on one node, until a time: findings
    of that class opened meanwhile start silenced."""

    __tablename__ = "health_silence"

    node_id: str = Field(primary_key=True, foreign_key="node.id", ondelete="CASCADE",
                         max_length=36)
    health_class: str = Field(primary_key=True, max_length=32)
    until: datetime
    reason: str = Field(default="", max_length=1024)
    actor: str = Field(default="", max_length=128)


class SecretKeyCheckRow(SQLModel, table=True):
    """The fleet's key check: a known text encrypted with the key its first daemon used, so a
    daemon whose ``secret.key`` differs refuses to start instead of failing one node later."""

    __tablename__ = "secret_key_check"

    id: int = Field(default=1, primary_key=True)
    fingerprint: str = Field(max_length=16)
    token: str = Field(max_length=512)
    written_by: str = Field(default="", max_length=128)
    written_at: datetime = Field(default_factory=utcnow)


class FirmwareWaveRow(SQLModel, table=True):
    """A firmware wave (issue 25): its limits, its nodes (JSON: id -> status, name, domain,
    rack), the sizes of the domains and racks it counts shares of (JSON), its status. Every
    write compares ``version``; the driver's also its lead of the ``fleet`` singleton."""

    __tablename__ = "firmware_wave"

    id: str = Field(primary_key=True, max_length=36)
    profile: str = Field(index=True, max_length=128)
    runbook: str = Field(max_length=64)
    max_nodes: int
    max_domain_share: float
    max_rack_share: float
    stop_after_failures: int
    status: str = Field(index=True, max_length=16)  # running, stopped, failed, done
    reason: str = Field(default="", max_length=1024)
    nodes: str = Field(sa_column=Column(Text, nullable=False))
    groups: str = Field(sa_column=Column(Text, nullable=False))
    failures: int = Field(default=0)
    version: int = Field(default=1)
    started_by: str = Field(default="", max_length=128)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class HealthCursorRow(SQLModel, table=True):
    """Where a health source got to on a node: the BMC poller's cursor (the last SEL or log
    record it read, the states it last reported), so a restart raises no old record again."""

    __tablename__ = "health_cursor"

    node_id: str = Field(primary_key=True, foreign_key="node.id", ondelete="CASCADE",
                         max_length=36)
    source: str = Field(primary_key=True, max_length=16)
    cursor: str = Field(sa_column=Column(Text, nullable=False))
    updated_at: datetime = Field(default_factory=utcnow)


class HealthBreakerRow(SQLModel, table=True):
    """The repair ladder's circuit breaker (one row, ``fleet``): open since when and why,
    and the nodes whose findings it held, so a restart or another daemon keeps it open."""

    __tablename__ = "health_breaker"

    name: str = Field(primary_key=True, max_length=16)
    tripped: bool = Field(default=False)
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    since: str = Field(default="", max_length=40)
    held: str = Field(default="{}", sa_column=Column(Text, nullable=False))  # JSON: id -> line
    updated_at: datetime = Field(default_factory=utcnow)
