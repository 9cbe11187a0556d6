"""API models of the health findings routes (``api/health.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from provisioner.health.model import Action, HealthClass
from provisioner.health.records import MAX_EVIDENCE, MAX_SUBJECT, FindingRecord

MAX_FINDINGS = 100
MAX_SILENCE_S = 90 * 86400
_ONE_LINE = r"^[^\x00-\x1f\x7f]*$"
NodeKey = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                           max_length=253, pattern=_ONE_LINE)]
Reason = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                          max_length=1024, pattern=_ONE_LINE)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class FindingIn(_Request):
    cls: HealthClass = Field(alias="class")
    action: Action = Field(Action.DRAIN, description="Recommended first action")
    evidence: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                               max_length=MAX_EVIDENCE)]
    subject: Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_SUBJECT,
                                              pattern=_ONE_LINE)] = Field(
        "", description="What it is about: a GPU's PCI bus id, an HCA port, a sensor")
    resolved: bool = Field(False, description="true: the finding has cleared")


class FindingsRequest(_Request):
    """One or more findings of one node, from an outside tool (``origin``)."""

    node: NodeKey = Field(description="node id, hostname, serial or MAC address")
    origin: Literal["external", "bmc", "in-band"] = "external"
    findings: list[FindingIn] = Field(min_length=1, max_length=MAX_FINDINGS)


class SilenceRequest(_Request):
    """Silence one finding (``finding_id``) or a class of findings on the node."""

    cls: HealthClass | None = Field(None, alias="class")
    finding_id: int | None = Field(None, ge=1)
    duration_s: int = Field(ge=60, le=MAX_SILENCE_S, description="How long, in seconds")
    reason: Reason

    @model_validator(mode="after")
    def _one_target(self) -> SilenceRequest:
        if (self.cls is None) == (self.finding_id is None):
            raise ValueError("give exactly one of class or finding_id")
        return self


class FindingQuery(_Request):
    cls: HealthClass | None = Field(None, alias="class")
    origin: Literal["bmc", "in-band", "slurm", "kubernetes", "external",
                    "alertmanager"] | None = None
    node: NodeKey | None = None
    all: bool = Field(False, description="true: cleared findings too")
    limit: int = Field(100, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=10**9)


class NodeHealthQuery(_Request):
    all: bool = Field(False, description="true: cleared findings too")


class FindingOut(BaseModel):
    model_config = ConfigDict(serialize_by_alias=True)

    id: int
    node_id: str
    hostname: str | None
    origin: str
    cls: str = Field(alias="class")
    action: str
    evidence: str
    subject: str
    first_seen: datetime
    last_seen: datetime
    count: int = Field(description="Reports since it opened (or reopened)")
    cleared_at: datetime | None
    open: bool
    silenced: bool
    silenced_until: datetime | None
    silence_reason: str
    silenced_by: str


class FindingPage(BaseModel):
    items: list[FindingOut]
    total: int


class ReportOut(BaseModel):
    change: str = Field(description="opened, reopened, seen or cleared")
    finding: FindingOut


class ReportResult(BaseModel):
    node_id: str
    results: list[ReportOut]


class AlertmanagerResult(BaseModel):
    received: int
    firing: int
    resolved: int
    unknown_nodes: list[str] = Field(description="Nodes the alerts named that are not ours")
    skipped: int = Field(description="Alerts naming no node (no node, instance or Hostname)")


class SilenceResult(BaseModel):
    silenced_until: datetime
    items: list[FindingOut]


def finding_out(record: FindingRecord, now: datetime, hostname: str | None = None) -> FindingOut:
    return FindingOut.model_validate({
        "id": record.id, "node_id": record.node_id,
        "hostname": record.hostname if record.hostname is not None else hostname,
        "origin": str(record.origin), "class": str(record.cls), "action": str(record.action),
        "evidence": record.evidence, "subject": record.subject,
        "first_seen": record.first_seen, "last_seen": record.last_seen, "count": record.count,
        "cleared_at": record.cleared_at, "open": record.open,
        "silenced": record.silenced(now), "silenced_until": record.silenced_until,
        "silence_reason": record.silence_reason, "silenced_by": record.silenced_by})
