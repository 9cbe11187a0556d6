"""The servicing record a runbook keeps in the node's facts (``facts["servicing"]``): which
runbook, why (a new node's onboarding, or an active node drained for it), each step's
result, the firmware tasks started (so a resumed step polls them, never starts a second
update), and how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

KEY: Final = "servicing"
ONBOARDING: Final = "onboarding"
ACTIVE: Final = "active"
PASSED: Final = "passed"
ASKING: Final = "asking:"
"""A task entry that holds ``ASKING`` + the image URI: the update was being asked for when the
daemon stopped (written before ``SimpleUpdate``), so a resumed step looks for the BMC's task
before it asks again."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    runbook: str
    steps: tuple[str, ...]
    origin: str  # ONBOARDING or ACTIVE
    actor: str
    started_at: str
    results: tuple[tuple[str, str, str], ...] = ()  # (step, result, at)
    tasks: dict[str, str] = field(default_factory=dict)  # component id -> task monitor URI
    outcome: str = ""
    ended_at: str = ""
    netboot: bool = False  # the node is to boot the agent's ramdisk (storage_layout, mdadm)

    @classmethod
    def open(cls, runbook: str, steps: tuple[str, ...], origin: str, actor: str) -> ServiceRecord:
        return cls(runbook, steps, origin, actor, now())

    @property
    def drains(self) -> bool:
        return self.origin == ACTIVE

    @property
    def open_now(self) -> bool:
        return not self.outcome

    def with_result(self, step: str, result: str) -> ServiceRecord:
        return replace(self, results=(*self.results, (step, result, now())))

    def with_task(self, component: str, uri: str) -> ServiceRecord:
        return replace(self, tasks={**self.tasks, component: uri})

    def with_intent(self, component: str, image_uri: str,
                    known: list[str] | None = None) -> ServiceRecord:
        """``known``: a push's intent keeps the BMC's tasks from before it (its task is a
        new one: a push's task payload does not name the image)."""
        kept = "" if known is None else "\n" + " ".join(known)
        return self.with_task(component, ASKING + image_uri + kept)

    def known(self, component: str) -> tuple[str, ...] | None:
        """The tasks a push's intent kept; None for a SimpleUpdate's."""
        _, sep, rest = self.tasks.get(component, "").partition("\n")
        return tuple(rest.split()) if sep else None

    def asking(self, component: str) -> bool:
        """Whether the update of ``component`` was being asked for, its task unknown."""
        return self.tasks.get(component, "").startswith(ASKING)

    def with_netboot(self, on: bool) -> ServiceRecord:
        return replace(self, netboot=on)

    def closed(self, outcome: str) -> ServiceRecord:
        return replace(self, outcome=outcome, ended_at=now())

    def to_facts(self) -> dict[str, Any]:
        return {"runbook": self.runbook, "steps": list(self.steps), "origin": self.origin,
                "actor": self.actor, "started_at": self.started_at,
                "results": [{"step": s, "result": r, "at": a} for s, r, a in self.results],
                "tasks": dict(self.tasks), "outcome": self.outcome, "ended_at": self.ended_at,
                "netboot": self.netboot}

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> ServiceRecord | None:
        raw = facts.get(KEY)
        if not isinstance(raw, dict) or not isinstance(raw.get("runbook"), str):
            return None
        results = tuple((str(r.get("step", "")), str(r.get("result", "")), str(r.get("at", "")))
                        for r in raw.get("results") or [] if isinstance(r, dict))
        tasks = raw.get("tasks") if isinstance(raw.get("tasks"), dict) else {}
        return cls(raw["runbook"], tuple(str(s) for s in raw.get("steps") or []),
                   str(raw.get("origin", ACTIVE)), str(raw.get("actor", "")),
                   str(raw.get("started_at", "")), results,
                   {str(k): str(v) for k, v in (tasks or {}).items()},
                   str(raw.get("outcome", "")), str(raw.get("ended_at", "")),
                   raw.get("netboot") is True)

    def onboarded(self, runbook: str) -> bool:
        """Whether this record is a passed onboarding run of ``runbook``."""
        return self.origin == ONBOARDING and self.runbook == runbook and self.outcome == PASSED
