"""The Conductor: the only writer of node state.

Every transition goes through ``_transition`` under a per-node lock, as one compare-and-set
plus a history row. Steps run outside the lock; their outcome comes back as ``done``/``fail``.
Mixins, one job each: ``StepRunner`` (``step_runner.py``) runs the steps, ``LeasedSteps``
(``leasing.py``) holds the leases of in-flight nodes, ``BmcRequests`` (``bmc_requests.py``)
serves an operator's BMC requests outside the steps, ``NodeEdits`` (``node_edits.py``)
edits, deletes and replaces node records.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from provisioner.config import LifecycleSettings
from provisioner.domain import NewNode, Node
from provisioner.errors import (
    Conflict,
    Fenced,
    NodeBusy,
    ProvisionerError,
    StoreUnavailable,
)
from provisioner.lifecycle.bmc_requests import BmcRequests
from provisioner.lifecycle.budgets import Budgets
from provisioner.lifecycle.leasing import WAITING
from provisioner.lifecycle.node_edits import NodeEdits
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.service_ports import Servicing
from provisioner.lifecycle.service_record import ACTIVE as SERVICE_ACTIVE
from provisioner.lifecycle.service_record import KEY as SERVICE_KEY
from provisioner.lifecycle.service_record import ONBOARDING, ServiceRecord
from provisioner.lifecycle.states import (
    FAILED,
    IN_FLIGHT,
    INTERNAL_EVENTS,
    Event,
    NodeState,
    allowed_events,
    next_state,
)
from provisioner.lifecycle.step_runner import SYSTEM_ACTOR, StepRunner
from provisioner.lifecycle.steps import STEPS, Step
from provisioner.log import node_fields, node_name
from provisioner.retry import RACE, raced, retry_async
from provisioner.store.ownership import OwnershipRepo
from provisioner.store.repo import NodeRepo
from provisioner.tasks import TaskSet
from provisioner.validation import existing_os
from provisioner.validation.sku import OVERRIDE_EVENT, OVERRIDE_KEY, held_reasons, override_entry

log = logging.getLogger(__name__)

FactChange = Callable[[dict[str, Any]], dict[str, Any]]
"""The node's facts as stored -> as they are to be (read and written under the row's lock)."""
Observer = Callable[[Node, str, NodeState], None]
"""Called after every committed transition with (node after, event, state before)."""

_SUCCESS: Final = frozenset({NodeState.INSPECTED, NodeState.ACTIVE, NodeState.RETIRED})
_WORK_EVENTS: Final = frozenset({Event.INSPECT, Event.DEPLOY, Event.RETRY})
POLICY_ACTOR: Final = "policy"


class Conductor(BmcRequests, NodeEdits, StepRunner):
    def __init__(
        self,
        repo: NodeRepo,
        ports: Ports,
        settings: LifecycleSettings,
        *,
        steps: Mapping[NodeState, Step] = STEPS,
        observer: Observer | None = None,
        ownership: OwnershipRepo | None = None,
    ) -> None:
        """``ownership``: claim a lease per in-flight node and fence every step write with
        it (the daemon; several daemons may share the database). None: no leases (tests of
        one conductor alone)."""
        self._repo = repo
        self._own = ownership
        self._fences: dict[str, int] = {}  # node id -> fencing number of the lease we hold
        self._ports = ports
        self._settings = settings
        self._steps = steps
        self._observers: list[Observer] = [observer] if observer is not None else []
        self._budgets = Budgets(settings)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._tasks = TaskSet()
        self._running: dict[str, tuple[NodeState, asyncio.Task[None]]] = {}
        self._status: dict[str, str] = {}
        self._released: dict[str, asyncio.Event] = {}
        self._draining = False
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- requests -----------------------------------------------------------------------------

    async def enroll(self, new: NewNode, *, actor: str, reason: str = "") -> Node:
        node = await self._repo.create(new, actor=actor, reason=reason)
        log.info("node %s: enrolled as %s by %s", _named(node), node.state, actor,
                 extra=_fields(node, "enroll"))
        self._notify(node, "enroll", NodeState(node.state))
        await self._apply_policy(node)
        return await self._repo.get(node.id)  # as the policy left it

    async def fire(self, node_id: str, event: Event, *, actor: str, reason: str = "",
                   expect: NodeState | None = None, facts: FactChange | None = None) -> Node:
        """``expect``: only from that state (else NodeBusy, a Conflict: another writer moved
        it after the caller decided on it). ``facts``: a change of the node's facts written
        in the transition's transaction (a record the transition opens), or not at all."""
        if event is Event.DEPLOY:
            event = await self._onboarding(node_id, event, actor)
        node = await self._transition(node_id, event, actor=actor, reason=reason,
                                      expect=expect, facts=facts)
        if node is None:
            raise NodeBusy(f"node {node_id} left {expect} before {event} applied")
        if event is Event.ABORT and (running := self._running.get(node_id)) is not None:
            running[1].cancel()
        await self._follow_up(node)
        return node

    async def _onboarding(self, node_id: str, event: Event, actor: str) -> Event:
        """``deploy`` of an inspected node whose profile has an onboarding runbook that has
        not passed on it yet: the runbook first (``servicing``), then ``deploying``."""
        node = await self._repo.get(node_id)
        runbook = self._ports.servicing.onboarding(node)
        last = ServiceRecord.from_facts(node.facts)
        if node.state is not NodeState.INSPECTED or runbook is None or (
                last is not None and last.onboarded(runbook)):
            return event
        record = ServiceRecord.open(runbook, self._ports.servicing.runbook(runbook),
                                    ONBOARDING, actor)
        await self._repo.merge_facts(node_id, {SERVICE_KEY: record.to_facts()})
        return Event.SERVICE

    @property
    def servicing(self) -> Servicing:
        return self._ports.servicing

    async def service(self, node_id: str, runbook: str, *, actor: str,
                      reason: str = "") -> Node:
        """Start ``runbook`` on an inspected node (then ``deploying``) or an active one
        (drained first, back to ``active`` through the validation gate)."""
        node = await self._repo.find(node_id)
        steps = self._ports.servicing.runbook(runbook)  # InvalidRequest when unknown
        if node.state not in (NodeState.INSPECTED, NodeState.ACTIVE):
            raise Conflict(f"node {node.id} is {node.state}: runbooks run on inspected or "
                           "active nodes")
        if node.maintenance:
            raise Conflict(f"node {node.id} is in maintenance ({node.maintenance_reason}); "
                           "turn maintenance off first")
        origin = SERVICE_ACTIVE if node.state is NodeState.ACTIVE else ONBOARDING
        record = ServiceRecord.open(runbook, steps, origin, actor)
        await self._repo.merge_facts(node.id, {SERVICE_KEY: record.to_facts()})
        return await self.fire(node.id, Event.SERVICE, actor=actor,
                               reason=reason or f"runbook {runbook}: {', '.join(steps)}",
                               expect=node.state)

    async def set_maintenance(self, node_id: str, on: bool, *, actor: str, reason: str,
                              propagate: bool = True, renew: bool = False) -> Node:
        """Set or clear the maintenance flag (a history row). ``renew``: on again with
        another reason records the new reason (an operator's request). ``propagate``: also
        cordon and drain (or uncordon) the node in Kubernetes; False when Kubernetes told
        us."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.maintenance == on and not (on and renew and reason
                                               and reason != node.maintenance_reason):
                return node
            propagate = propagate and node.maintenance != on  # a new reason: cordoned already
            node = await self._repo.transition(
                node, to_state=node.state, event="maintenance_on" if on else "maintenance_off",
                actor=actor, reason=reason, reset_checkpoint=False,
                maintenance=(on, reason if on else ""),
            )
        log.info("node %s: maintenance %s by %s %s", _named(node), "on" if on else "off", actor,
                 reason, extra=_fields(node, "maintenance_on" if on else "maintenance_off"))
        self._notify(node, "maintenance_on" if on else "maintenance_off", node.state)
        self._hold(node_id, on)
        if propagate and node.state is NodeState.ACTIVE:
            self._tasks.spawn(self._kube_maintenance(node, on, reason),
                              name=f"kube-maintenance:{node_id}")
        if not on:
            await self._apply_policy(node)
        return node

    async def override_sku(self, node_id: str, *, actor: str, reason: str) -> Node:
        """Let a node the SKU gate holds in ``inspected`` go on (a history row, and the
        override in its facts until a new inspection writes a new record); the deploy
        policy then applies."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            held = held_reasons(node.facts) if node.state is NodeState.INSPECTED else ()
            if not held:
                raise Conflict(f"node {node_id} is not held by the SKU gate "
                               f"(state {node.state})")
            await self._repo.merge_facts(node_id, {OVERRIDE_KEY: override_entry(
                actor, reason, datetime.now(UTC).isoformat())})
            node = await self._repo.transition(
                await self._repo.get(node_id), to_state=node.state, event=OVERRIDE_EVENT,
                actor=actor, reason=f"{reason} (overrides: {'; '.join(held)})",
                reset_checkpoint=False)
        log.warning("node %s: SKU gate overridden by %s: %s", _named(node), actor, reason,
                    extra=_fields(node, OVERRIDE_EVENT))
        self._notify(node, OVERRIDE_EVENT, node.state)
        await self._apply_policy(node)
        return await self._repo.get(node_id)

    async def allow_overwrite(self, node_id: str, *, actor: str, reason: str) -> Node:
        """Let a node held for the OS found on its disks be deployed over it (a history
        row, the permission in its facts); the deploy policy then applies."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            held = self.os_held(node) if node.state is NodeState.INSPECTED else ()
            if not held:
                raise Conflict(f"node {node_id} is not held for an existing OS "
                               f"(state {node.state})")
            await self._repo.merge_facts(node_id, {existing_os.OVERRIDE_KEY: override_entry(
                actor, reason, datetime.now(UTC).isoformat())})
            node = await self._repo.transition(
                await self._repo.get(node_id), to_state=node.state,
                event=existing_os.OVERRIDE_EVENT, actor=actor,
                reason=f"{reason} (overwrites: {'; '.join(held)})", reset_checkpoint=False)
        log.warning("node %s: overwriting its existing OS allowed by %s: %s", node_id, actor,
                    reason)
        self._notify(node, existing_os.OVERRIDE_EVENT, node.state)
        await self._apply_policy(node)
        return await self._repo.get(node_id)

    def os_held(self, node: Node) -> tuple[str, ...]:
        """Why a deploy would overwrite what the node's disks hold (``()``: it may)."""
        return existing_os.held_for_existing_os(node.facts, node.profile,
                                                self._settings.allow_overwrite)

    async def record(self, node_id: str, event: str, *, actor: str, reason: str,
                     level: int = logging.INFO, fence: int | None = None) -> Node:
        """A history row that changes no state: a refused agent report, say. The reason
        may quote what a machine sent: a lone surrogate (a JSON ``\\ud800``), which no
        database encodes, is written escaped. ``fence``: a step's row, written only while
        the step's lease is still ours (checked in the row's transaction; else Fenced, as
        the step's state writes are)."""
        reason = reason.encode("utf-8", "backslashreplace").decode("utf-8")

        async def write() -> Node:
            async with self._locks[node_id]:
                node = await self._repo.get(node_id)
                return await self._repo.transition(node, to_state=node.state, event=event,
                                                   actor=actor, reason=reason,
                                                   reset_checkpoint=False, fence=fence)

        # the row has no precondition: another daemon's write between our read and ours
        # (our lock is this process's only) is read again, not a failure of the caller (a
        # step would fail: a ladder stopped in repair_failed by a finding's note)
        node = await retry_async(write, backoff=RACE, tries=5,
                                 retryable=raced)
        log.log(level, "node %s: %s by %s: %s", _named(node), event, actor, reason,
                extra=_fields(node, event))
        self._notify(node, event, node.state)
        return node

    async def edit(self, node_id: str, apply: Callable[[Node], Awaitable[Node]], *,
                   event: str) -> Node:
        """A metadata change (an import, an operator's edit) written by ``apply`` under the
        node's lock: never between a step's read of the node and its transition."""
        async with self._locks[node_id]:
            node = await apply(await self._repo.get(node_id))
        self._notify(node, event, node.state)
        return node

    async def adopt(self, discovered_id: str, owner_id: str, *, actor: str) -> Node:
        """A discovered node turned out to be an enrolled machine (same serial): fold it in.

        The discovered node's step is cancelled and the node deleted; the owner keeps its
        state, gets the MACs, and its policy applies (an enrolled owner is inspected)."""
        first, second = sorted((discovered_id, owner_id))
        async with self._locks[first], self._locks[second]:
            discovered = await self._repo.get(discovered_id)
            owner = await self._repo.get(owner_id)
            if (running := self._running.get(discovered_id)) is not None:
                running[1].cancel()
            reason = (f"discovered node {discovered.id} (MAC {', '.join(discovered.macs)}) "
                      f"is this machine (serial {owner.serial})")
            node = await self._repo.adopt(discovered, owner, actor=actor, reason=reason)
        log.info("node %s: adopted %s", _named(node), reason, extra=_fields(node, "adopt"))
        self._notify(node, "adopt", node.state)
        if node.state not in IN_FLIGHT:
            await self._apply_policy(node)
        return node

    async def _kube_maintenance(self, node: Node, on: bool, reason: str) -> None:
        try:
            await self._ports.kube.maintenance(node, on, reason or "maintenance")
        except ProvisionerError as exc:
            await self.record(node.id, "kube_maintenance_failed", actor=SYSTEM_ACTOR,
                              reason=f"{'drain' if on else 'uncordon'} failed: {exc}",
                              level=logging.WARNING)

    @staticmethod
    def allowed_events(node: Node) -> frozenset[Event]:
        """The events an operator may send now (maintenance holds inspect/deploy/retry)."""
        events = allowed_events(node.state) - INTERNAL_EVENTS
        return events - _WORK_EVENTS if node.maintenance else events

    def step_status(self, node_id: str) -> str | None:
        """``queued`` (waiting for a budget), ``running``, ``held`` (maintenance) or None."""
        return self._status.get(node_id)

    # -- start (stop: StepRunner) ------------------------------------------------------------

    async def recover(self) -> int:
        """Resume every in-flight node where it was; apply policy to waiting ones."""
        resumed = await self.take_over(limit=None)
        for node in await self._repo.in_states(WAITING):
            self._hold(node.id, node.maintenance)
            await self._apply_policy(node)
        return resumed

    # -- transitions and policy ---------------------------------------------------------------

    async def _transition(
        self, node_id: str, event: Event, *, actor: str, reason: str,
        expect: NodeState | None = None, step: bool = False, facts: FactChange | None = None,
    ) -> Node | None:
        """``expect``: apply only if the node is still in that state (a step's outcome, a
        policy decision taken on that state); ``step``: a step's outcome (fenced by the
        lease the step ran under, never a new claim); ``facts``: see ``fire``."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if expect is not None and node.state != expect:
                log.info("node %s: dropping %s meant for %s, node is %s", _named(node), event,
                         expect, node.state)
                return None
            if event in _WORK_EVENTS and node.maintenance:
                raise Conflict(f"node {node_id} is in maintenance ({node.maintenance_reason}); "
                               "turn maintenance off first")
            if event is Event.DEPLOY and node.state is NodeState.INSPECTED and (
                    held := held_reasons(node.facts)):
                raise Conflict(f"node {node_id} does not match profile {node.profile}: "
                               f"{'; '.join(held)} (the SKU gate; override it with "
                               f"`provisioner node action {node_id} sku-override --reason …`)")
            if event is Event.DEPLOY and node.state is NodeState.INSPECTED and (
                    held := self.os_held(node)):
                raise Conflict(f"node {node_id} is held before deploy: {'; '.join(held)}; "
                               "register it as running (`register-running`) or allow "
                               f"overwriting (`provisioner node action {node_id} "
                               "allow-overwrite --reason …`, or the profile in "
                               "[lifecycle] allow_overwrite)")
            target = next_state(node.state, event)
            last_error: str | None = None
            if target in FAILED or target is NodeState.SERVICE_REQUIRED:
                last_error = reason
            elif target in _SUCCESS:
                last_error = ""
            before = node.state
            fence, claimed = await self._lease(node_id, step=step,
                                               needed=before in IN_FLIGHT or target in IN_FLIGHT,
                                               force=event is Event.ABORT)
            release = fence is not None and target not in IN_FLIGHT
            try:
                node = await self._repo.transition(node, to_state=target, event=str(event),
                                                   actor=actor, reason=reason,
                                                   last_error=last_error, fence=fence,
                                                   release=release, facts=facts)
            except NodeBusy as exc:
                if fence is not None and (claimed or isinstance(exc, Fenced)):
                    self._fences.pop(node_id, None)
                    if claimed and self._own is not None:
                        await self._own.release(node_id, fence)
                raise
            if release:
                self._fences.pop(node_id, None)
        level = logging.ERROR if target in FAILED else logging.INFO
        log.log(level, "node %s: %s --%s--> %s by %s%s", _named(node), before, event, target,
                actor, f": {reason}" if reason else "", extra=_fields(node, str(event)))
        self._notify(node, str(event), before)
        return node

    async def _follow_up(self, node: Node) -> None:
        if node.state in IN_FLIGHT:
            self._start(node)
        else:
            await self._apply_policy(node)

    async def _apply_policy(self, node: Node) -> None:
        if node.maintenance:
            return
        event: Event | None = None
        if node.state in (NodeState.DISCOVERED, NodeState.ENROLLED):
            event = Event.INSPECT if self._settings.auto_inspect else None
        elif node.state is NodeState.INSPECTED and node.profile:
            if held_reasons(node.facts) or self.os_held(node):  # held: no deploy, no noise
                return
            event = Event.DEPLOY if self._settings.auto_deploy else None
        if event is None:
            return
        try:
            await self.fire(node.id, event, actor=POLICY_ACTOR, reason=f"auto_{event}",
                            expect=node.state)
        except Conflict as exc:  # someone else moved the node first
            log.info("node %s: policy skipped %s: %s", _named(node), event, exc)
        except StoreUnavailable as exc:  # the database is away: the stale-policy round
            log.warning("node %s: policy %s deferred: %s", _named(node), event, exc)  # retries

    def add_observer(self, observer: Observer) -> None:
        """Also call ``observer`` after every committed transition (caches, metrics)."""
        self._observers.append(observer)

    def _notify(self, node: Node, event: str, before: NodeState) -> None:
        for observer in self._observers:
            observer(node, event, before)


def _named(node: Node) -> str:
    return node_name(node.id, node.hostname)


def _fields(node: Node, event: str) -> dict[str, object]:
    return node_fields(node.id, node.hostname, str(node.state), event)
