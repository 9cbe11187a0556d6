"""The repair record: what a ladder was opened for and what it tried, kept in the node's
facts under ``repair`` (so it survives a restart, and goes with the node to the vendor). Pure.

Written when a ladder opens (the finding, its evidence, the plan, the machine's serial and
the part the finding names), updated after each rung (its result), closed with the outcome:
``passed`` (back in service), ``service_required`` (out of rungs), ``reimage`` (handed to
the deploy path). A later finding on a node that is under repair adds its evidence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from provisioner.health.ladder import Plan
from provisioner.health.model import Action, Finding, HealthClass

KEY: Final = "repair"
EVIDENCE_MAX: Final = 20  # lines of evidence kept (the first ones, then the latest)

PASSED: Final = "passed"
SKIPPED: Final = "skipped"


@dataclass(frozen=True, slots=True)
class RungResult:
    rung: str
    result: str  # passed | failed: <gate's reason> | skipped | <the rung's error>
    at: str

    @property
    def passed(self) -> bool:
        return self.result == PASSED


@dataclass(frozen=True, slots=True)
class RepairRecord:
    kind: str
    action: str
    evidence: tuple[str, ...]
    source: str
    subject: str
    opened_at: str
    opened_by: str
    plan: tuple[str, ...]
    drain_at_once: bool
    drain_deadline_s: float
    serial: str = ""
    parts: tuple[Mapping[str, Any], ...] = ()
    finding_id: str | None = None
    tried: tuple[RungResult, ...] = ()
    skip: tuple[str, ...] = ()
    outcome: str = ""
    ended_at: str = ""
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def open(cls, finding: Finding, the_plan: Plan, facts: Mapping[str, Any], *,
             serial: str | None, actor: str, at: datetime,
             finding_id: str | None = None) -> RepairRecord:
        return cls(kind=str(finding.cls), action=str(finding.action),
                   evidence=(finding.evidence,), source=str(finding.source),
                   subject=finding.subject, opened_at=at.isoformat(), opened_by=actor,
                   plan=tuple(str(r) for r in the_plan.rungs),
                   drain_at_once=the_plan.drain_at_once,
                   drain_deadline_s=the_plan.drain_deadline_s,
                   serial=serial or _system_serial(facts),
                   parts=parts_named(facts, finding.subject), finding_id=finding_id)

    @property
    def health_class(self) -> HealthClass:
        return HealthClass(self.kind)

    @property
    def open_now(self) -> bool:
        return not self.outcome

    def result_of(self, rung: str) -> RungResult | None:
        return next((r for r in reversed(self.tried) if r.rung == rung), None)

    def with_result(self, rung: str, result: str, at: datetime) -> RepairRecord:
        return replace(self, tried=(*self.tried, RungResult(rung, result, at.isoformat())))

    def with_evidence(self, line: str) -> RepairRecord:
        if line in self.evidence:
            return self
        kept = (*self.evidence, line)
        if len(kept) > EVIDENCE_MAX:
            kept = (*kept[:EVIDENCE_MAX // 2], *kept[-(EVIDENCE_MAX // 2):])
        return replace(self, evidence=kept)

    def with_skip(self, rung: str) -> RepairRecord:
        return self if rung in self.skip else replace(self, skip=(*self.skip, rung))

    def closed(self, outcome: str, at: datetime) -> RepairRecord:
        return replace(self, outcome=outcome, ended_at=at.isoformat())

    def reopened(self) -> RepairRecord:
        """The ladder runs again (``retry``): rungs already tried are not tried twice."""
        return replace(self, outcome="", ended_at="")

    def summary(self) -> str:
        """One line for a history row, an alert, a vendor ticket's subject."""
        tried = ", ".join(f"{r.rung}: {r.result}" for r in self.tried) or "no rung tried"
        part = f" ({self.subject})" if self.subject else ""
        return f"{self.kind}{part}: {self.evidence[0] if self.evidence else ''}; {tried}"

    def to_facts(self) -> dict[str, Any]:
        return {
            "class": self.kind, "action": self.action, "evidence": list(self.evidence),
            "source": self.source, "subject": self.subject, "opened_at": self.opened_at,
            "opened_by": self.opened_by, "plan": list(self.plan),
            "drain_at_once": self.drain_at_once, "drain_deadline_s": self.drain_deadline_s,
            "serial": self.serial, "parts": [dict(p) for p in self.parts],
            "finding_id": self.finding_id,
            "tried": [{"rung": r.rung, "result": r.result, "at": r.at} for r in self.tried],
            "skip": list(self.skip), "outcome": self.outcome, "ended_at": self.ended_at,
            "notes": list(self.notes)}

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> RepairRecord | None:
        raw = facts.get(KEY)
        if not isinstance(raw, Mapping) or raw.get("class") not in set(HealthClass):
            return None
        try:
            return cls(
                kind=str(raw["class"]), action=str(raw.get("action", Action.DRAIN)),
                evidence=tuple(str(e) for e in raw.get("evidence", ())),
                source=str(raw.get("source", "")), subject=str(raw.get("subject", "")),
                opened_at=str(raw.get("opened_at", "")), opened_by=str(raw.get("opened_by", "")),
                plan=tuple(str(r) for r in raw.get("plan", ())),
                drain_at_once=bool(raw.get("drain_at_once", False)),
                drain_deadline_s=float(raw.get("drain_deadline_s", 0.0)),
                serial=str(raw.get("serial", "")),
                parts=tuple(p for p in raw.get("parts", ()) if isinstance(p, Mapping)),
                finding_id=raw.get("finding_id"),
                tried=tuple(RungResult(str(r["rung"]), str(r["result"]), str(r.get("at", "")))
                            for r in raw.get("tried", ()) if isinstance(r, Mapping)),
                skip=tuple(str(r) for r in raw.get("skip", ())),
                outcome=str(raw.get("outcome", "")), ended_at=str(raw.get("ended_at", "")),
                notes=tuple(str(n) for n in raw.get("notes", ())))
        except (KeyError, TypeError, ValueError):
            return None


def _system_serial(facts: Mapping[str, Any]) -> str:
    system = facts.get("system")
    serial = system.get("serial") if isinstance(system, Mapping) else None
    return serial if isinstance(serial, str) else ""


def parts_named(facts: Mapping[str, Any], subject: str) -> tuple[Mapping[str, Any], ...]:
    """The GPUs the finding's subject names (a PCI address, ``GPU <n>``), as the facts
    describe them (model, PCI address, serial when known): what the vendor replaces."""
    gpus = [g for g in facts.get("gpus", ()) if isinstance(g, Mapping)]
    if not subject or not gpus:
        return ()
    wanted = subject.lower()
    if wanted.startswith("gpu ") and wanted[4:].strip().isdigit():
        index = int(wanted[4:])
        return (_part(gpus[index]),) if index < len(gpus) else ()
    bus = _bus_device(wanted)
    return tuple(_part(g) for g in gpus
                 if bus and _bus_device(str(g.get("pci_address", ""))) == bus)


def _bus_device(address: str) -> str:
    """``bus:device`` of a PCI address as XIDs (``0000:18:00``) and facts
    (``0000:18:00.0``, ``00000000:18:00.0``) write it; "" when it is none."""
    parts = address.lower().split(".")[0].split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else ""


def _part(gpu: Mapping[str, Any]) -> Mapping[str, Any]:
    return {k: gpu[k] for k in ("name", "pci_address", "serial", "uuid", "device")
            if k in gpu}
