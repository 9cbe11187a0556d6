"""``RepairService``: where a health finding (or an operator) starts the repair ladder.

``open(node_id, finding)`` is what the findings' intake calls for each new finding; it
decides, and only the conductor changes the node's state (``Event.REPAIR``):

* nothing to do for the class or action (``none``, ``application``): a history row only;
* the node already under repair, or waiting for a person (``service_required``): its
  evidence joins the record (no second ladder; the record the vendor gets has it all, also
  when the finding came a moment after the ladder that it raced ended);
* not in service (not ``active``), or in maintenance: a history row only;
* ``[health] auto_repair`` off, a ladder of the same class that ended on the node less than
  ``cooldown_s`` ago (a flapping sensor), or the circuit breaker: held, with a history row;
* else the repair record is written into the node's facts and the ladder starts.

The circuit breaker counts the nodes a ladder has drained (``repairing``, ``repair_failed``)
in the fleet, the candidate's rack and its NVLink domain. Once it trips it stays open: no
automatic ladder starts, each refused finding is a ``repair_held`` row, until an operator
resets it (``reset_breaker``). An operator's own ``start`` passes the breaker and the
cool-down: a person decided.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from provisioner.config.health import HealthSettings
from provisioner.domain import Node
from provisioner.errors import Conflict, InvalidRequest, NodeBusy
from provisioner.health.ladder import RUNGS, BreakerLimits, Peer, breaker, cooling_down, plan
from provisioner.health.model import Action, Finding, HealthClass, Source
from provisioner.health.record import KEY, RepairRecord
from provisioner.health.records import Change, FindingRecord
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.repair_step import drain_reason
from provisioner.lifecycle.states import Event, NodeState
from provisioner.retry import RACE, raced, retry_async
from provisioner.store.repo import NodeRepo
from provisioner.validation.record import ValidationRecord

log = logging.getLogger(__name__)

UNDER_REPAIR: Final = frozenset({NodeState.REPAIRING, NodeState.REPAIR_FAILED})
#: the nodes the breaker counts: in service or drained by a ladder
_COUNTED: Final = frozenset({NodeState.ACTIVE}) | UNDER_REPAIR
HELD_EVENT: Final = "repair_held"
NOTED_EVENT: Final = "health_finding"
EVIDENCE_EVENT: Final = "repair_evidence"
SKIP_EVENT: Final = "repair_skip"
BREAKER_EVENT: Final = "repair_breaker_reset"


class LostStart(NodeBusy):
    """Our ``repair`` transition found the node's lease held: another daemon is moving the
    node (into its own ladder, most likely). Decided again, like any raced write."""


@dataclass(frozen=True, slots=True)
class RepairDecision:
    """What ``open`` did: ``started``, ``joined`` (evidence added to the open ladder),
    ``noted`` (nothing to repair), ``not_in_service``, ``held`` (auto_repair off or
    maintenance), ``cooldown`` or ``breaker``; ``reason`` says why."""

    outcome: str
    reason: str
    node: Node

    @property
    def started(self) -> bool:
        return self.outcome == "started"


@dataclass(frozen=True, slots=True)
class BreakerState:
    tripped: bool
    reason: str
    since: str
    held: tuple[str, ...]


Saved = tuple[str, str, dict[str, str]]
"""The breaker as stored: (reason, since, held node id -> finding line)."""


class BreakerStore(Protocol):
    """Where the breaker lives across restarts and daemons (``store.findings``)."""

    async def load_breaker(self) -> Saved | None: ...

    async def change_breaker(self, change: Callable[[Saved | None], Saved | None]
                             ) -> Saved | None:
        """``change`` applied to the breaker as stored now, under its lock; the result."""
        ...


class BreakerClosed(NodeBusy):
    """The breaker that held a finding was reset by an operator (on any daemon) while the
    finding was decided: decided again, with the breaker closed."""


class RepairService:
    def __init__(self, conductor: Conductor, repo: NodeRepo, settings: HealthSettings, *,
                 clock: Callable[[], float] = time.time,
                 breakers: BreakerStore | None = None) -> None:
        self._conductor = conductor
        self._repo = repo
        self._breakers = breakers  # None: the breaker lives in this process only
        self._settings = settings
        self._clock = clock
        self._limits = BreakerLimits(settings.max_repairing_fraction,
                                     settings.max_repairing_fraction_rack,
                                     settings.max_repairing_fraction_domain,
                                     settings.breaker_floor)
        self._lock = asyncio.Lock()  # one decision at a time: the breaker counts them all
        self._tripped: tuple[str, str] | None = None  # (reason, since)
        self._held: dict[str, str] = {}  # node id -> the finding the breaker held

    async def open(self, node_id: str, finding: Finding, *, actor: str = "health",
                   finding_id: str | None = None) -> RepairDecision:
        """A finding for ``node_id`` (id, hostname, serial or MAC): start its repair ladder
        if the class has one, the node is in service and nothing holds it."""
        return await self._open(node_id, finding, actor=actor, finding_id=finding_id,
                                operator=False)

    async def start(self, node_id: str, finding: Finding | None, *, actor: str,
                    reason: str = "") -> RepairDecision:
        """An operator starts a ladder (from ``active`` or ``service_required``): past the
        breaker and the cool-down. No finding: the class of the node's last repair record."""
        node = await self._repo.find(node_id)
        if finding is None:
            last = RepairRecord.from_facts(node.facts)
            if last is None:
                raise InvalidRequest(f"node {node.id} has no repair record: name the class")
            finding = Finding(last.health_class, Action(last.action) if last.action in
                              set(Action) else Action.DRAIN,
                              reason or f"operator {actor}: repair again", Source.KERNEL_LOG,
                              last.subject)
        decision = await self._open(node.id, finding, actor=actor, finding_id=None,
                                    operator=True)
        if not decision.started:
            raise Conflict(f"node {node.id}: repair not started: {decision.reason}")
        return decision

    async def stop(self, node_id: str, *, actor: str, reason: str) -> Node:
        """Stop the ladder where it is (``repair_failed``; the node stays drained):
        ``retry`` goes on from the next rung, ``deploy`` reimages, ``retire`` retires."""
        node = await self._repo.find(node_id)
        return await self._conductor.fire(node.id, Event.ABORT, actor=actor,
                                          reason=reason or "repair stopped by an operator",
                                          expect=NodeState.REPAIRING)

    async def skip(self, node_id: str, rung: str, *, actor: str, reason: str = "") -> Node:
        """Skip ``rung`` of the node's open ladder (taken when the ladder reaches it)."""
        if rung not in set(RUNGS):
            raise InvalidRequest(f"unknown rung {rung!r}; rungs: "
                                 + ", ".join(str(r) for r in RUNGS))
        node = await self._repo.find(node_id)
        record = RepairRecord.from_facts(node.facts)
        if node.state not in UNDER_REPAIR or record is None or not record.open_now:
            raise Conflict(f"node {node.id} has no open repair ladder (state {node.state})")
        if rung not in record.plan:
            raise Conflict(f"rung {rung} is not in node {node.id}'s ladder: "
                           + (", ".join(record.plan) or "no rungs"))
        if record.result_of(rung) is not None:
            raise Conflict(f"rung {rung} of node {node.id} was already tried")
        await self._repo.update_fact(node.id, _on_record(lambda now: now.with_skip(rung)))
        return await self._conductor.record(node.id, SKIP_EVENT, actor=actor,
                                            reason=f"{rung}: {reason or 'skip'}")

    def breaker_state(self) -> BreakerState:
        reason, since = self._tripped or ("", "")
        return BreakerState(self._tripped is not None, reason, since, tuple(sorted(self._held)))

    async def current_breaker(self) -> BreakerState:
        """``breaker_state`` as stored now (another daemon may have tripped or reset it)."""
        async with self._lock:
            await self._load_breaker()
        return self.breaker_state()

    async def reset_breaker(self, *, actor: str, reason: str) -> BreakerState:
        """Close the breaker: automatic ladders may start again (the held findings are
        not replayed: their sources report them again, or an operator starts them)."""
        before: list[Saved | None] = []

        def reset(stored: Saved | None) -> None:
            before[:] = [stored]
            return None

        async with self._lock:
            await self._change_breaker(reset)
        was = before[0] if before else None
        held = dict(was[2]) if was is not None else {}
        if was is not None:
            log.warning("repair breaker reset by %s: %s (was: %s)", actor, reason, was[0])
        for node_id in held:
            await self._conductor.record(node_id, BREAKER_EVENT, actor=actor,
                                         reason=reason or "breaker reset")
        return self.breaker_state()

    # -- the decision ------------------------------------------------------------------------

    async def _load_breaker(self) -> None:
        if self._breakers is not None:
            saved = await self._breakers.load_breaker()
            self._tripped = (saved[0], saved[1]) if saved is not None else None
            self._held = dict(saved[2]) if saved is not None else {}

    async def _change_breaker(self, change: Callable[[Saved | None], Saved | None]) -> None:
        """``change`` applied to the breaker as stored now (another daemon's holds, an
        operator's reset kept: never a copy read earlier written back); ours set from it."""
        if self._breakers is not None:
            saved = await self._breakers.change_breaker(change)
        else:
            saved = change(None if self._tripped is None else (*self._tripped,
                                                               dict(self._held)))
        self._tripped = (saved[0], saved[1]) if saved is not None else None
        self._held = dict(saved[2]) if saved is not None else {}

    async def _hold(self, node_id: str, line: str, trip: str | None = None) -> None:
        """The breaker holds ``node_id``'s finding: already open (``trip`` None), or
        tripped by it now."""
        tripped: list[str] = []

        def hold(stored: Saved | None) -> Saved:
            if stored is not None:
                return stored[0], stored[1], stored[2] | {node_id: line}
            if trip is None:
                raise BreakerClosed("the repair breaker was reset meanwhile")
            tripped[:] = [trip]
            return trip, datetime.now(UTC).isoformat(timespec="seconds"), {node_id: line}

        await self._change_breaker(hold)
        if tripped:
            log.error("repair circuit breaker tripped: %s; automatic repairs stop until an "
                      "operator resets it (`provisioner health breaker reset`)", tripped[0])

    async def _unhold(self, node_id: str) -> None:
        await self._change_breaker(lambda stored: None if stored is None else (
            stored[0], stored[1], {k: v for k, v in stored[2].items() if k != node_id}))

    async def _open(self, node_id: str, finding: Finding, *, actor: str,
                    finding_id: str | None, operator: bool) -> RepairDecision:
        async def decide() -> RepairDecision:
            return await self._decide(node_id, finding, actor=actor, finding_id=finding_id,
                                      operator=operator)

        # another daemon wrote the node (its note of the same finding from another origin,
        # or its ladder for it) between our read and our transition: decide again on the
        # node as it is now, which joins our evidence to that ladder's record (a Conflict
        # here would drop the evidence: the listener logs it, nothing more). Only the
        # transition into ``repairing`` writes a new record (same transaction): two
        # daemons deciding at once never overwrite each other's record.
        return await retry_async(decide, backoff=RACE, tries=5, retryable=raced)

    async def _decide(self, node_id: str, finding: Finding, *, actor: str,
                      finding_id: str | None, operator: bool) -> RepairDecision:
        async with self._lock:
            await self._load_breaker()
            node = await self._repo.find(node_id)
            ladder = plan(finding.cls, finding.action, deadlines=self._settings.drain_deadline_s)
            line = f"{finding.cls} {finding.action}: {' '.join(finding.evidence.split())}"
            if ladder is None:
                return await self._note(node, "noted", NOTED_EVENT, f"{line} (no repair for "
                                        f"{finding.cls}/{finding.action})", actor)
            current = RepairRecord.from_facts(node.facts)
            if _joins(node, current, operator):
                await self._repo.update_fact(node.id, _on_record(
                    lambda record: record.with_evidence(finding.evidence)))
                return await self._note(node, "joined", EVIDENCE_EVENT, line, actor)
            allowed = {NodeState.ACTIVE, NodeState.SERVICE_REQUIRED} if operator \
                else {NodeState.ACTIVE}
            if node.state not in allowed:
                return await self._note(node, "not_in_service", NOTED_EVENT,
                                        f"{line} (state {node.state}: no ladder)", actor)
            if not operator and (held := self._holds(node, finding, current)) is not None:
                outcome, why = held
                if outcome == "breaker":
                    await self._hold(node.id, line)
                return await self._note(node, outcome, HELD_EVENT, f"{line}: {why}", actor,
                                        level=logging.WARNING)
            if not operator and (trip := await self._breaker(node)) is not None:
                await self._hold(node.id, line, trip)
                return await self._note(node, "breaker", HELD_EVENT,
                                        f"{line}: circuit breaker: {trip}", actor,
                                        level=logging.ERROR)
            record = RepairRecord.open(finding, ladder, node.facts, serial=node.serial,
                                       actor=actor, at=datetime.now(UTC),
                                       finding_id=finding_id)
            try:  # the record is written with the transition, or not at all
                node = await self._conductor.fire(
                    node.id, Event.REPAIR, actor=actor, reason=drain_reason(record),
                    expect=node.state, facts=lambda facts: facts | {KEY: record.to_facts()})
            except NodeBusy:
                raise  # moved since we read it (another daemon's ladder): decide again
            except Conflict as exc:  # its lease is held: another daemon is starting one
                raise LostStart(str(exc)) from exc
            if node.id in self._held:
                await self._unhold(node.id)
            return RepairDecision("started", drain_reason(record), node)

    def _holds(self, node: Node, finding: Finding,
               last: RepairRecord | None) -> tuple[str, str] | None:
        if node.maintenance:
            return "held", f"in maintenance ({node.maintenance_reason})"
        if not self._settings.auto_repair:
            return "held", "[health] auto_repair is off: an operator starts the ladder"
        if last is not None and not last.open_now and cooling_down(
                last.kind, _epoch(last.ended_at), finding.cls, self._clock(),
                self._settings.cooldown_s):
            return "cooldown", (f"a {finding.cls} ladder ended {last.outcome} at "
                                f"{last.ended_at}: not again within [health] cooldown_s = "
                                f"{self._settings.cooldown_s:g}")
        if self._tripped is not None:
            return "breaker", f"circuit breaker open since {self._tripped[1]}: " \
                              f"{self._tripped[0]}"
        return None

    async def _breaker(self, node: Node) -> str | None:
        peers = [Peer(s.id, s.rack, None, NodeState(s.state) in UNDER_REPAIR)
                 for s in await self._repo.summaries() if s.state in _COUNTED]
        clique = _clique(node)
        if clique is not None:
            members = {n.id: n for n in await self._repo.naming_clique(clique)
                       if n.state in _COUNTED}
            peers = [Peer(p.node_id, p.rack, clique if p.node_id in members else None,
                          p.repairing) for p in peers]
        return breaker(Peer(node.id, node.rack, clique, False), peers, self._limits)

    async def _note(self, node: Node, outcome: str, event: str, reason: str, actor: str,
                    level: int = logging.INFO) -> RepairDecision:
        node = await self._conductor.record(node.id, event, actor=actor, reason=reason,
                                            level=level)
        return RepairDecision(outcome, reason, node)


def _on_record(change: Callable[[RepairRecord], RepairRecord]) -> Callable[
        [dict[str, Any]], dict[str, Any]]:
    """``change`` applied to the repair record as stored now, not to a copy read earlier:
    the ladder (another daemon's, or this one's) may have written a rung's result since."""
    def apply(facts: dict[str, Any]) -> dict[str, Any]:
        record = RepairRecord.from_facts(facts)
        return facts if record is None else facts | {KEY: change(record).to_facts()}

    return apply


def _joins(node: Node, current: RepairRecord | None, operator: bool) -> bool:
    """Whether a finding's evidence joins the node's repair record (no ladder of its own):
    the ladder is open, or it ended in ``service_required`` (the record a person hands to
    the vendor; the node may not have left ``repairing`` yet). A ladder that has just
    passed, its node not yet ``active``: NodeBusy, decided again once it is."""
    if current is None or node.state not in UNDER_REPAIR | {NodeState.SERVICE_REQUIRED}:
        return False
    if current.open_now:
        return node.state in UNDER_REPAIR
    if current.outcome == NodeState.SERVICE_REQUIRED:
        return not operator
    if node.state is NodeState.REPAIRING:
        raise NodeBusy(f"node {node.id}: its ladder ended ({current.outcome}); the node "
                       "has not left repairing yet")
    return False


def _clique(node: Node) -> str | None:
    record = ValidationRecord.from_facts(node.facts)
    return record.clique if record is not None else None


def _epoch(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def known_class(name: str) -> HealthClass:
    try:
        return HealthClass(name)
    except ValueError:
        raise InvalidRequest(f"unknown health class {name!r}; classes: "
                             + ", ".join(str(c) for c in HealthClass)) from None


def ladder_listener(repairs: RepairService) -> Callable[[FindingRecord, Change],
                                                           Awaitable[None]]:
    """The findings' intake (``lifecycle.health.HealthFindings.add_listener``) → the ladder:
    an opened or reopened finding that no operator silenced goes to ``RepairService.open``
    (which holds it when ``[health] auto_repair`` is off, in a cool-down or past the breaker).
    An error is logged, never raised into the intake: the finding is stored either way."""

    async def opened(record: FindingRecord, change: Change) -> None:
        if change not in (Change.OPENED, Change.REOPENED) or record.silenced(datetime.now(UTC)):
            return
        finding = Finding(record.cls, record.action, record.evidence, str(record.origin),
                          record.subject)
        try:
            decision = await repairs.open(record.node_id, finding,
                                          actor=f"health:{record.origin}",
                                          finding_id=str(record.id))
        except (Conflict, InvalidRequest) as exc:
            log.warning("node %s: finding %s not taken by the repair ladder: %s",
                        record.node_id, record.id, exc)
            return
        log.info("node %s: finding %s (%s): repair %s", record.node_id, record.id,
                 record.cls, decision.outcome)

    return opened


def repair_timer(observe: Callable[[str, float], None]) -> Callable[[Node, str, NodeState],
                                                                      None]:
    """A conductor observer: a node leaving ``repairing`` with its repair record closed
    (``passed``: active again, ``service_required``, ``reimage``) → ``observe(outcome,
    seconds from the ladder's start)`` (``Metrics.observe_repair``). A stopped ladder
    (``repair_failed``, the record still open) is not an end."""

    def observed(node: Node, event: str, before: NodeState) -> None:
        if before is not NodeState.REPAIRING or node.state is NodeState.REPAIRING:
            return
        record = RepairRecord.from_facts(node.facts)
        if record is None or record.open_now:
            return
        start, end = _epoch(record.opened_at), _epoch(record.ended_at)
        if start is not None and end is not None:
            observe(record.outcome, max(0.0, end - start))

    return observed
