"""The validation record a node carries in ``node.facts["validation"]``: other nodes of its
NVLink domain read it to know whether it passed, the Kubernetes joiner to know whether GPU
operands may run. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

KEY: Final = "validation"
"""``node.facts[KEY]``: the record of the node's last validation."""
REPORT_KEY: Final = "last_report"
"""``node.facts[REPORT_KEY]``: the last facts report (agent or Ansible ``facts`` role)."""
NODE_CHECKED: Final = "validate-node"
"""The sub-step that writes the record: a node in ``validating`` passed only once its
checkpoint holds it (a record without it is left over from an earlier run)."""
_PASSED_STATES: Final = frozenset({"registering", "active"})


@dataclass(frozen=True, slots=True)
class ValidationRecord:
    """One validation of one node. ``failures``: one line per failed check, naming the check
    and what was seen against what was expected. ``clique``: the node's NVLink domain
    (``<ClusterUUID>.<CliqueId>``) when its GPUs report one; ``domain_nodes``: how many nodes
    the profile says that domain has (None: whoever is known)."""

    passed: bool
    at: str
    failures: tuple[str, ...] = ()
    clique: str | None = None
    domain_nodes: int | None = None
    checks: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """What was not checked and why (``InfiniBand not checked at inspection: no driver``)."""
    settling: bool = False
    """Failed only because the node's NVSwitch fabric is still training (``In Progress``):
    the validating step collects the facts again before it holds the node."""

    def to_facts(self) -> dict[str, Any]:
        return {"passed": self.passed, "at": self.at, "failures": list(self.failures),
                "clique": self.clique, "domain_nodes": self.domain_nodes,
                "checks": list(self.checks), "notes": list(self.notes),
                "settling": self.settling}

    @property
    def reason(self) -> str:
        return "; ".join(self.failures) if self.failures else "passed"

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> ValidationRecord | None:
        """The record in a node's facts; None when there is none or it is malformed (a
        record is only ever written by the validating step, so malformed means absent)."""
        raw = facts.get(KEY)
        if not isinstance(raw, Mapping) or not isinstance(raw.get("passed"), bool):
            return None
        failures = raw.get("failures")
        checks = raw.get("checks")
        clique = raw.get("clique")
        nodes = raw.get("domain_nodes")
        notes = raw.get("notes")
        return cls(
            passed=raw["passed"], at=str(raw.get("at", "")),
            failures=tuple(str(f) for f in failures) if isinstance(failures, list) else (),
            clique=clique if isinstance(clique, str) and clique else None,
            domain_nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool)
            else None,
            checks=tuple(str(c) for c in checks) if isinstance(checks, list) else (),
            notes=tuple(str(n) for n in notes) if isinstance(notes, list) else (),
            settling=raw.get("settling") is True)


def passed_now(state: str, facts: Mapping[str, Any], checkpoint: tuple[str, ...]) -> bool:
    """Whether a node in ``state`` has passed validation in its current provisioning: it is
    past the gate (``registering``, ``active``) with a passing record, or in ``validating``
    with a passing record written by this run. A record left over from an earlier
    provisioning (the node is being deployed again) does not count."""
    record = ValidationRecord.from_facts(facts)
    if record is None or not record.passed:
        return False
    if str(state) in _PASSED_STATES:
        return True
    return str(state) == "validating" and NODE_CHECKED in checkpoint
