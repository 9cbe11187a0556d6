"""The Conductor: the only writer of node state.

Every transition goes through ``_transition`` under a per-node lock, as one compare-and-set
plus a history row. Steps run outside the lock; their outcome comes back as ``done``/``fail``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from provisioner.bmc.base import Bmc, BootDevice, PowerAction, PowerState
from provisioner.config import LifecycleSettings
from provisioner.domain import NewNode, Node
from provisioner.errors import (
    Conflict,
    Fenced,
    InvalidRequest,
    NodeBusy,
    ProvisionerError,
    StoreUnavailable,
)
from provisioner.ids import NodeId
from provisioner.lifecycle.budgets import Budgets
from provisioner.lifecycle.context import RunContext
from provisioner.lifecycle.leasing import WAITING, LeasedSteps
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.power import SYNC_ACTOR, apply_power
from provisioner.lifecycle.states import (
    FAILED,
    IN_FLIGHT,
    INTERNAL_EVENTS,
    Event,
    NodeState,
    allowed_events,
    next_state,
)
from provisioner.lifecycle.steps import KEYED_STEPS, STEPS, WAITING_STEPS, Step
from provisioner.store.ownership import OwnershipRepo
from provisioner.store.repo import NodeRepo
from provisioner.tasks import TaskSet
from provisioner.validation.sku import OVERRIDE_EVENT, OVERRIDE_KEY, held_reasons, override_entry

log = logging.getLogger(__name__)

T = TypeVar("T")

Observer = Callable[[Node, str, NodeState], None]
"""Called after every committed transition with (node after, event, state before)."""

_SUCCESS: Final = frozenset({NodeState.INSPECTED, NodeState.ACTIVE, NodeState.RETIRED})
_WORK_EVENTS: Final = frozenset({Event.INSPECT, Event.DEPLOY, Event.RETRY})
_OUTCOME_TRIES: Final = 5  # a step's outcome retried when another daemon's write raced it
SYSTEM_ACTOR: Final = "conductor"
POLICY_ACTOR: Final = "policy"


class Conductor(LeasedSteps):
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
        log.info("node %s: enrolled as %s by %s", node.id, node.state, actor)
        self._notify(node, "enroll", NodeState(node.state))
        await self._apply_policy(node)
        return await self._repo.get(node.id)  # as the policy left it

    async def fire(self, node_id: str, event: Event, *, actor: str, reason: str = "",
                   expect: NodeState | None = None) -> Node:
        """``expect``: only from that state (else Conflict): a policy decided on it."""
        node = await self._transition(node_id, event, actor=actor, reason=reason,
                                      expect=expect)
        if node is None:
            raise Conflict(f"node {node_id} left {expect} before {event} applied")
        if event is Event.ABORT and (running := self._running.get(node_id)) is not None:
            running[1].cancel()
        await self._follow_up(node)
        return node

    async def set_maintenance(self, node_id: str, on: bool, *, actor: str, reason: str,
                              propagate: bool = True) -> Node:
        """Set or clear the maintenance flag (a history row). ``propagate``: also cordon and
        drain (or uncordon) the node in Kubernetes; False when Kubernetes told us."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.maintenance == on:
                return node
            node = await self._repo.transition(
                node, to_state=node.state, event="maintenance_on" if on else "maintenance_off",
                actor=actor, reason=reason, reset_checkpoint=False,
                maintenance=(on, reason if on else ""),
            )
        log.info("node %s: maintenance %s by %s %s", node_id, "on" if on else "off", actor, reason)
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
        log.warning("node %s: SKU gate overridden by %s: %s", node_id, actor, reason)
        self._notify(node, OVERRIDE_EVENT, node.state)
        await self._apply_policy(node)
        return await self._repo.get(node_id)

    async def record(self, node_id: str, event: str, *, actor: str, reason: str,
                     level: int = logging.INFO) -> Node:
        """A history row that changes no state: a refused agent report, say."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            node = await self._repo.transition(node, to_state=node.state, event=event,
                                               actor=actor, reason=reason,
                                               reset_checkpoint=False)
        log.log(level, "node %s: %s by %s: %s", node_id, event, actor, reason)
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
        log.info("node %s: adopted %s", owner_id, reason)
        self._notify(node, "adopt", node.state)
        if node.state not in IN_FLIGHT:
            await self._apply_policy(node)
        return node

    # -- power (BMC) outside steps ------------------------------------------------------------

    async def record_power(self, node_id: str, state: str, *,
                           actor: str = SYNC_ACTOR) -> Node | None:
        """Record a power state read from the node's BMC. A change goes into the history
        (event ``power_sync``); None when nothing was recorded: no change, or a step is in
        flight (it owns the power). A first reading is stored without a history row."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.state in IN_FLIGHT or node.power_state == state:
                return None
            if node.power_state is None:
                await self._repo.note_power(node_id, state)
                return None
            reason = f"power {node.power_state}\u2192{state} out of band"
            node = await self._repo.record_power(node, state, event="power_sync", actor=actor,
                                                 reason=reason)
        log.info("node %s: %s (seen by %s)", node_id, reason, actor)
        return node

    async def power(self, node_id: str, action: PowerAction, *,
                    actor: str) -> tuple[Node, PowerState]:
        """An operator's power request. ``status`` reads, even while a step runs; the others
        need an idle node (Conflict while a step owns the BMC) and go into the history."""
        if action is PowerAction.STATUS:
            node = await self._repo.get(node_id)
            state = await self._with_bmc(node, lambda bmc: apply_power(bmc, action))
            await self.record_power(node_id, str(state), actor=actor)
            return await self._repo.get(node_id), state
        async with self._no_step(node_id, f"power {action}") as node:
            soft_off = self._ports.soft_off(node)
            state = await self._with_bmc(node, lambda bmc: apply_power(
                bmc, action, soft_off=soft_off))
            node = await self._repo.record_power(
                node, str(state), event="power_" + str(action).replace("-", "_"), actor=actor,
                reason=f"power {action} requested")
        log.info("node %s: power %s by %s", node_id, action, actor)
        return node, state

    async def set_boot_device(self, node_id: str, device: BootDevice, *, persistent: bool,
                              uefi: bool, actor: str) -> Node:
        """An operator's boot-device request; needs an idle node; goes into the history."""
        how = f"{'persistent' if persistent else 'once'}, {'UEFI' if uefi else 'legacy'}"
        async with self._no_step(node_id, "boot device") as node:
            uri = self._ports.http_boot_uri(node) if device is BootDevice.HTTP else None
            how += f", from {uri}" if uri else ""
            await self._with_bmc(node, lambda bmc: bmc.set_boot_device(
                device, persistent=persistent, uefi=uefi, http_uri=uri))
            node = await self._repo.transition(node, to_state=node.state, event="bootdev",
                                               actor=actor, reason=f"boot device {device} "
                                               f"({how})", reset_checkpoint=False)
        log.info("node %s: boot device %s (%s) by %s", node_id, device, how, actor)
        return node

    async def while_idle(self, node_id: str, what: str,
                         fn: Callable[[Node], Awaitable[T]]) -> T:
        """Run ``fn(node)`` under the node's lock, refused (Conflict) while a step owns the
        BMC: for BMC work outside the steps (password rotation)."""
        async with self._no_step(node_id, what) as node:
            return await fn(node)

    @asynccontextmanager
    async def _no_step(self, node_id: str, what: str) -> AsyncIterator[Node]:
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if node.state in IN_FLIGHT:
                raise Conflict(f"node {node_id} is {node.state}: its step owns the BMC; "
                               f"{what} refused until the step ends (or abort it)")
            yield node

    async def _with_bmc(self, node: Node, fn: Callable[[Bmc], Awaitable[T]]) -> T:
        if node.bmc is None:
            raise InvalidRequest(f"node {node.id} has no BMC endpoint")
        bmc = self._ports.bmc(node.id, node.bmc, await self._repo.credentials(node.id))
        try:
            return await fn(bmc)
        finally:
            await bmc.aclose()

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

    # -- start and stop -----------------------------------------------------------------------

    async def recover(self) -> int:
        """Resume every in-flight node where it was; apply policy to waiting ones."""
        resumed = await self.take_over(limit=None)
        for node in await self._repo.in_states(WAITING):
            self._hold(node.id, node.maintenance)
            await self._apply_policy(node)
        return resumed

    async def stop(self, grace_s: float = 0.0) -> None:
        """Let running sub-steps finish (up to ``grace_s``), start no new ones, then cancel.

        Nodes stay in their in-flight state with their checkpoint: the next start resumes
        them. A sub-step cut off by the deadline is redone then (sub-steps are idempotent)."""
        self._draining = True
        if grace_s > 0:
            try:
                async with asyncio.timeout(grace_s):
                    await self._idle.wait()
            except TimeoutError:
                log.warning("%d sub-steps still running after %g s; cancelling them",
                            self._busy, grace_s)
        await self._tasks.cancel_all()

    # -- internals ----------------------------------------------------------------------------

    async def _transition(
        self, node_id: str, event: Event, *, actor: str, reason: str,
        expect: NodeState | None = None, step: bool = False,
    ) -> Node | None:
        """``expect``: apply only if the node is still in that state (a step's outcome, a
        policy decision taken on that state); ``step``: a step's outcome (fenced by the
        lease the step ran under, never a new claim)."""
        async with self._locks[node_id]:
            node = await self._repo.get(node_id)
            if expect is not None and node.state != expect:
                log.info("node %s: dropping %s meant for %s, node is %s", node_id, event,
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
            target = next_state(node.state, event)
            last_error: str | None = None
            if target in FAILED:
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
                                                   release=release)
            except NodeBusy as exc:
                if fence is not None and (claimed or isinstance(exc, Fenced)):
                    self._fences.pop(node_id, None)
                    if claimed and self._own is not None:
                        await self._own.release(node_id, fence)
                raise
            if release:
                self._fences.pop(node_id, None)
        level = logging.ERROR if target in FAILED else logging.INFO
        log.log(level, "node %s: %s --%s--> %s by %s%s", node_id, before, event, target,
                actor, f": {reason}" if reason else "")
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
            if held_reasons(node.facts):  # the SKU gate holds it: no deploy, no noise
                return
            event = Event.DEPLOY if self._settings.auto_deploy else None
        if event is None:
            return
        try:
            await self.fire(node.id, event, actor=POLICY_ACTOR, reason=f"auto_{event}",
                            expect=node.state)
        except Conflict as exc:  # someone else moved the node first
            log.info("node %s: policy skipped %s: %s", node.id, event, exc)
        except StoreUnavailable as exc:  # the database is away: the stale-policy round
            log.warning("node %s: policy %s deferred: %s", node.id, event, exc)  # retries

    def _start(self, node: Node) -> None:
        """Run the step of ``node.state`` unless it runs already. A task left over for an
        earlier state (a stale start) never blocks this one: it finds the node moved on and
        ends without acting."""
        current = self._running.get(node.id)
        if current is not None and current[0] == node.state and not current[1].done():
            return
        self._status[node.id] = "queued"
        task = self._tasks.spawn(self._run(node.id, node.state), name=f"{node.state}:{node.id}")
        self._running[node.id] = (node.state, task)

    async def _run(self, node_id: NodeId, state: NodeState) -> None:
        outcome: tuple[Event, str] | None = None
        try:
            outcome = await self._execute(node_id, state)
        finally:
            current = self._running.get(node_id)
            if current is not None and current[1] is asyncio.current_task():
                del self._running[node_id]
                self._status.pop(node_id, None)
        if outcome is not None:
            node = await self._outcome(node_id, state, *outcome)
            if node is not None:
                await self._follow_up(node)

    async def _outcome(self, node_id: NodeId, state: NodeState, event: Event,
                       reason: str) -> Node | None:
        """Write a step's outcome; retried when another daemon's write (a maintenance flag,
        a history row) raced it; dropped, and logged, when our lease was lost."""
        for attempt in range(_OUTCOME_TRIES):
            try:
                return await self._transition(node_id, event, actor=SYSTEM_ACTOR,
                                              reason=reason, expect=state, step=True)
            except (Fenced, StoreUnavailable) as exc:
                log.warning("node %s: %s; %s of its %s step dropped", node_id, exc, event,
                            state)
                self._fences.pop(node_id, None)
                return None
            except NodeBusy:
                if attempt == _OUTCOME_TRIES - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        return None

    async def _execute(self, node_id: NodeId, state: NodeState) -> tuple[Event, str] | None:
        waits = state in WAITING_STEPS  # bounds its own wait; holds no budget slot
        async with nullcontext() if waits else self._budgets.slot(state):
            node = await self._repo.get(node_id)
            if node.state != state:
                return None  # a stale start: the node moved on
            if self._own is not None and node_id not in self._fences:
                log.info("node %s: %s step not started, another daemon holds its lease",
                         node_id, state)
                return None
            self._status[node_id] = "running"
            ctx = RunContext(node, self._ports, self._repo, self._gate,
                             recorder=self._step_record, keyed=state in KEYED_STEPS,
                             fence=self._fences.get(node_id))
            try:
                async with asyncio.timeout(None if waits else self._settings.step_timeout_s):
                    await self._steps[state](ctx)
            except TimeoutError:
                return Event.FAIL, f"{state} timed out after {self._settings.step_timeout_s:g} s"
            except (Fenced, StoreUnavailable) as exc:
                # lease lost, or no database to record anything in: the node stays in
                # flight, and its lease expires; whoever claims it next resumes it
                log.warning("node %s: %s; its %s step stops here", node_id, exc, state)
                self._fences.pop(node_id, None)
                return None
            except ProvisionerError as exc:
                return Event.FAIL, str(exc)
            except Exception as exc:  # a task boundary: log once, keep the node's reason
                log.exception("node %s: %s step crashed", node_id, state)
                return Event.FAIL, f"internal error in {state}: {type(exc).__name__}: {exc}"
            finally:
                await ctx.aclose()
        return Event.DONE, ""

    async def _step_record(self, node_id: str, event: str, reason: str) -> None:
        await self.record(node_id, event, actor=SYSTEM_ACTOR, reason=reason)

    @asynccontextmanager
    async def _gate(self, node_id: str) -> AsyncIterator[None]:
        """Entered around each sub-step: waits while the node is in maintenance, never lets
        a new sub-step start while the daemon drains, and counts busy sub-steps."""
        released = self._released.get(node_id)
        if released is not None and not released.is_set():
            self._status[node_id] = "held"
            await released.wait()
            self._status[node_id] = "running"
        if self._draining:
            await asyncio.Future()  # parked until stop() cancels it
        self._busy += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    def _hold(self, node_id: str, on: bool) -> None:
        released = self._released.setdefault(node_id, asyncio.Event())
        if on:
            released.clear()
        else:
            released.set()
            del self._released[node_id]

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.spawn(coro, name=name)

    def add_observer(self, observer: Observer) -> None:
        """Also call ``observer`` after every committed transition (caches, metrics)."""
        self._observers.append(observer)

    def _notify(self, node: Node, event: str, before: NodeState) -> None:
        for observer in self._observers:
            observer(node, event, before)
