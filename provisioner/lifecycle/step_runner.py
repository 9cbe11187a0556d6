"""Running the steps: one task per in-flight node, under a budget slot and the step timeout,
its outcome written back as ``done``/``fail``; the gate around each sub-step (maintenance
holds, draining at stop). A mixin of ``Conductor``, which owns the transitions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager, nullcontext
from typing import Any, Final

from provisioner.domain import Node
from provisioner.errors import Fenced, ProvisionerError, StoreUnavailable
from provisioner.ids import NodeId
from provisioner.lifecycle.budgets import Budgets
from provisioner.lifecycle.context import RunContext
from provisioner.lifecycle.leasing import LeasedSteps
from provisioner.lifecycle.outcome import StepOutcome
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import Event, NodeState
from provisioner.lifecycle.steps import KEYED_STEPS, WAITING_STEPS, Step
from provisioner.retry import RACE, raced, retry_async
from provisioner.tasks import TaskSet

log = logging.getLogger(__name__)

_OUTCOME_TRIES: Final = 5  # a step's outcome retried when another daemon's write raced it
SYSTEM_ACTOR: Final = "conductor"


class StepRunner(LeasedSteps):
    _ports: Ports
    _steps: Mapping[NodeState, Step]
    _budgets: Budgets
    _tasks: TaskSet
    _status: dict[str, str]
    _released: dict[str, asyncio.Event]
    _draining: bool
    _busy: int
    _idle: asyncio.Event

    # the Conductor's (conductor.py): a step's outcome goes through its transitions

    async def _transition(
        self, node_id: str, event: Event, *, actor: str, reason: str,
        expect: NodeState | None = None, step: bool = False,
        facts: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> Node | None:
        raise NotImplementedError

    async def _follow_up(self, node: Node) -> None:
        raise NotImplementedError

    async def record(self, node_id: str, event: str, *, actor: str, reason: str,
                     level: int = logging.INFO, fence: int | None = None) -> Node:
        raise NotImplementedError

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

    def _start(self, node: Node) -> None:
        """Run the step of ``node.state`` unless it runs already. A task left over for an
        earlier state (a stale start) never blocks this one: it finds the node moved on and
        ends without acting; nor does one cancelled and still unwinding (its lease lost, or
        the daemon stood down while the database was away: a take-over that claims the node
        again must start it, or the lease is renewed for a step nobody runs)."""
        current = self._running.get(node.id)
        if current is not None and current[0] == node.state and not current[1].done() \
                and not current[1].cancelling():
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
        async def write() -> Node | None:
            return await self._transition(node_id, event, actor=SYSTEM_ACTOR, reason=reason,
                                          expect=state, step=True)

        try:
            return await retry_async(write, backoff=RACE, retryable=raced,
                                     tries=_OUTCOME_TRIES)
        except (Fenced, StoreUnavailable) as exc:
            log.warning("node %s: %s; %s of its %s step dropped", node_id, exc, event, state)
            self._fences.pop(node_id, None)
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
            except StepOutcome as exc:  # a step that chose its own outcome (the ladder)
                return exc.event, str(exc)
            except ProvisionerError as exc:
                return Event.FAIL, str(exc)
            except Exception as exc:  # a task boundary: log once, keep the node's reason
                log.exception("node %s: %s step crashed", node_id, state)
                return Event.FAIL, f"internal error in {state}: {type(exc).__name__}: {exc}"
            finally:
                await ctx.aclose()
        return Event.DONE, ""

    async def _step_record(self, node_id: str, event: str, reason: str,
                           fence: int | None) -> None:
        """A step's history row, fenced by the lease the step runs under (not the one this
        daemon holds now: a lost lease is refused, never written unfenced)."""
        await self.record(node_id, event, actor=SYSTEM_ACTOR, reason=reason, fence=fence)

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
