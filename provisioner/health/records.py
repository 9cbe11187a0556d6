"""Findings as records: where a finding came from (``Origin``), one observation of it
(``Report``), and the stored record (``FindingRecord``) with its first and last sighting,
its clearing and its silence.

A record is keyed by (node, origin, class, subject): a repeat of the same report updates
``last_seen`` and ``count`` of the one row, never a new one, so the table stays bounded
whatever the rate; a cleared record that is reported again reopens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from provisioner.health.model import Action, Finding, HealthClass

MAX_EVIDENCE = 2048
MAX_SUBJECT = 128


class Origin(StrEnum):
    """Who told us: the BMC, the node's OS, Slurm, Kubernetes, an operator's tool
    (``POST /health/findings``) or Prometheus Alertmanager."""

    BMC = "bmc"
    IN_BAND = "in-band"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    EXTERNAL = "external"
    ALERTMANAGER = "alertmanager"


class Change(StrEnum):
    """What one report did to its record."""

    OPENED = "opened"        # a new record
    REOPENED = "reopened"    # a cleared record came back
    SEEN = "seen"            # an open record seen again: last_seen, count
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class Report:
    """One observation of a finding, before it is a record."""

    cls: HealthClass
    action: Action
    evidence: str
    subject: str = ""
    seen_at: datetime | None = field(default=None, compare=False)
    """When the source saw the fault, where it says (a Kubernetes condition's last
    transition, an alert's ``startsAt``): the time to detect. Not part of the report's
    identity: a sync pass that sees the same report again changes nothing."""

    @classmethod
    def of(cls, finding: Finding) -> Report:
        return cls(finding.cls, finding.action, finding.evidence, finding.subject)

    def clipped(self) -> Report:
        """Evidence on one line and bounded; the subject bounded."""
        evidence = " ".join(self.evidence.split())[:MAX_EVIDENCE]
        return Report(self.cls, self.action, evidence, self.subject.strip()[:MAX_SUBJECT],
                      self.seen_at)

    @property
    def key(self) -> tuple[str, str]:
        return (str(self.cls), self.subject)


@dataclass(frozen=True, slots=True)
class FindingRecord:
    id: int
    node_id: str
    origin: Origin
    cls: HealthClass
    action: Action
    evidence: str
    subject: str
    first_seen: datetime
    last_seen: datetime
    count: int
    cleared_at: datetime | None = None
    silenced_until: datetime | None = None
    silence_reason: str = ""
    silenced_by: str = ""
    hostname: str | None = None

    @property
    def open(self) -> bool:
        return self.cleared_at is None

    def silenced(self, now: datetime) -> bool:
        return self.silenced_until is not None and self.silenced_until > now

    def summary(self) -> str:
        """One line for the node's history: class, action, subject, origin, evidence."""
        about = f" {self.subject}" if self.subject else ""
        return (f"{self.cls} ({self.action}){about} from {self.origin}: "
                f"{self.evidence}")[:1024]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A record after a report or a clearing, and what changed."""

    record: FindingRecord
    change: Change
