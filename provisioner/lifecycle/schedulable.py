"""Is this node schedulable, and if not, why? One answer, as structured steps, for the console,
``GET /api/v1/nodes/{id}/why`` and ``provisioner node why``.

The steps: the node's lifecycle state, then what holds it whatever its path (maintenance,
the deploy gates, open health findings), then the path of ``why.explain`` (BMC → power →
boot → callback → Kubernetes → GPUs → validation → whole NVLink domain → Slurm). A step
``blocks`` when it fails or still waits; the node is schedulable when none does. Pure: the
caller reads the node, its history, its domain's members and ``Seen``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from provisioner.domain import HistoryEntry, Node
from provisioner.health.model import Action
from provisioner.lifecycle.states import FAILED, NodeState
from provisioner.lifecycle.why import Chain, Link, Seen, Status, explain, rank
from provisioner.validation.domain import Member
from provisioner.validation.sku import held_reasons

S = NodeState

HOLDS: Final = (("state", "Lifecycle state"), ("maintenance", "Not in maintenance"),
                ("gates", "No deploy gate holds it"), ("health", "No open health finding"))
_STUCK: Final = frozenset({S.SERVICE_REQUIRED, S.RETIRED, S.RETIRING, *FAILED})


@dataclass(frozen=True, slots=True)
class Why:
    node_id: str
    hostname: str | None
    state: str
    holds: tuple[Link, ...]
    chain: Chain  # the path (the console's chain)

    @property
    def steps(self) -> tuple[Link, ...]:
        return (*self.holds, *self.chain.links)

    @property
    def first_blocking(self) -> str | None:
        """The first step that fails, else the first that waits (the state step last: it
        only sums the others up); None: schedulable."""
        steps = [s for s in self.steps if s.key != "state"] + [self.holds[0]]
        for wanted in (Status.FAIL, Status.WAIT):
            for step in steps:
                if step.status is wanted:
                    return step.key
        return None

    @property
    def schedulable(self) -> bool:
        return self.first_blocking is None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.node_id, "hostname": self.hostname, "state": self.state,
                "schedulable": self.schedulable, "first_blocking": self.first_blocking,
                "steps": [{"key": s.key, "title": s.title, "status": str(s.status),
                           "blocking": blocking(s), "evidence": s.evidence, "todo": s.todo}
                          for s in self.steps]}


def blocking(step: Link) -> bool:
    return step.status in (Status.FAIL, Status.WAIT)


def why(node: Node, history: Sequence[HistoryEntry], members: Iterable[Member],
        seen: Seen | None = None) -> Why:
    seen = seen or Seen()
    holds = (_state(node), _maintenance(node), _gates(node, seen), _health(seen))
    chain = explain(node, history, members, block=seen.block, slurm=seen.slurm,
                    kube=seen.kube)
    return Why(node.id, node.hostname, str(node.state), holds, chain)


def _hold(key: str, status: Status, evidence: str, todo: str = "") -> Link:
    return Link(key, dict(HOLDS)[key], status, evidence, todo if status is not Status.OK else "")


def _state(node: Node) -> Link:
    if node.state is S.ACTIVE:
        return _hold("state", Status.OK, "active")
    if node.state in _STUCK:
        error = f": {node.last_error}" if node.last_error else ""
        todo = {S.RETIRED: "replace it (provisioner node replace) or enrol another",
                S.RETIRING: "wait for the retirement to end"}.get(
            node.state, "deal with the cause, then Retry (or Abort)")
        return _hold("state", Status.FAIL, f"{node.state}{error}", todo)
    if rank(node.state) < 0:
        return _hold("state", Status.WAIT, f"{node.state}: not deployed",
                     "give it a profile and deploy it")
    return _hold("state", Status.WAIT, f"{node.state}: on its way to active")


def _maintenance(node: Node) -> Link:
    if not node.maintenance:
        return _hold("maintenance", Status.OK, "not in maintenance")
    reason = node.maintenance_reason or "no reason recorded"
    return _hold("maintenance", Status.FAIL, f"in maintenance: {reason}",
                 "maintenance-off once the work is done")


def _gates(node: Node, seen: Seen) -> Link:
    if node.state is not S.INSPECTED:
        return _hold("gates", Status.OK, "no gate applies in state " + str(node.state))
    held: list[str] = [f"SKU gate: {r}" for r in held_reasons(node.facts)]
    held += [f"existing OS: {r}" for r in seen.os_held]
    if not held:
        return _hold("gates", Status.OK, "the SKU and existing-OS gates let it deploy")
    todo = ("fix or replace the hardware, or sku-override with a reason" if held[0].startswith(
        "SKU") else "allow-overwrite with a reason, or wipe the disks yourself")
    return _hold("gates", Status.FAIL, "; ".join(held), todo)


def _health(seen: Seen) -> Link:
    now = seen.now or datetime.now(UTC)
    live = [f for f in seen.findings if f.open and not f.silenced(now)]
    acting = [f for f in live if f.action is not Action.NONE]
    silenced = len([f for f in seen.findings if f.open and f.silenced(now)])
    quiet = f" ({silenced} silenced)" if silenced else ""
    if not acting:
        noted = f"{len(live)} open, none needing action" if live else "no open finding"
        return _hold("health", Status.OK, noted + quiet)
    worst = max(acting, key=lambda f: f.action.rank)
    listed = "; ".join(f"{f.cls} {f.subject or '-'}: {' '.join(f.evidence.split())[:200]} "
                       f"({f.action})" for f in acting[:5])
    more = f"; and {len(acting) - 5} more" if len(acting) > 5 else ""
    return _hold("health", Status.FAIL, listed + more + quiet,
                 f"recommended first action: {worst.action} (provisioner node health)")
