"""The real ``Validator``: a node's last facts report against its profile's checks, and the
NVLink domain gate over the store (``provisioner/validation/`` decides; this reads and waits).

The domain wait polls one shared, periodically refreshed view of the fleet (``DomainWatch``),
so a rack of waiting nodes costs one light query per interval; it writes a history row when
it starts waiting and one per member that failed, never one per poll, also across restarts
(it reads back what it already wrote since the node entered ``validating``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from provisioner.config import ValidationProfile, ValidationSettings
from provisioner.domain import Node
from provisioner.errors import FatalError
from provisioner.lifecycle.ports import Note, Recollect
from provisioner.lifecycle.states import NodeState
from provisioner.store.repo import NodeRepo
from provisioner.validation.checks import Expectation, evaluate
from provisioner.validation.domain import Member, Standing, domain_status
from provisioner.validation.record import REPORT_KEY, ValidationRecord, passed_now
from provisioner.validation.sku import asks_anything, inspection_facts, sku_expectation

log = logging.getLogger(__name__)

WAIT_EVENT: Final = "validation_wait"
SETTLE_EVENT: Final = "validation_settling"
HELD_EVENT: Final = "validation_held"
_CHUNK: Final = 500
#: the states ``member_of`` judges
DOMAIN_STATES: Final = (NodeState.VALIDATING, NodeState.VALIDATE_FAILED,
                         NodeState.REGISTERING, NodeState.ACTIVE)


def expectation(profile: ValidationProfile | None) -> Expectation:
    if profile is None:
        return Expectation()
    return Expectation(
        gpu_count=profile.gpu_count, gpu_model=profile.gpu_model,
        ib_rate_gbps=profile.ib_rate_gbps, ib_port_count=profile.ib_port_count,
        nvlink_domain=profile.nvlink_domain, nvlink_domain_nodes=profile.nvlink_domain_nodes,
        require_dcgm=profile.require_dcgm,
        nvlink_accept_degraded_bandwidth=profile.nvlink_accept_degraded_bandwidth,
        memory_min_gib=profile.memory_min_gib, disk_count=profile.disk_count,
        disk_min_gb=profile.disk_min_gb, imex=profile.imex)


def report_of(facts: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node's last facts report (the OS-level one from the Ansible ``facts`` role once
    configured); an inspection-only node's facts are its report."""
    report = facts.get(REPORT_KEY)
    return report if isinstance(report, Mapping) else facts


class FactsValidator:
    def __init__(self, repo: NodeRepo, settings: ValidationSettings, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 watch: DomainWatch | None = None) -> None:
        self._repo = repo
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._watch = watch or DomainWatch(repo, interval_s=settings.domain_poll_interval_s)

    async def check(self, node: Node) -> ValidationRecord:
        expect = expectation(self._settings.profiles.get(node.profile or ""))
        # Parsing a multi-MiB nvidia-smi report is CPU work: off the event loop.
        verdict = await asyncio.to_thread(evaluate, report_of(node.facts), expect,
                                          node.hostname or "")
        return ValidationRecord(
            passed=verdict.passed, at=self._clock().isoformat(), failures=verdict.failures,
            clique=verdict.clique,
            domain_nodes=expect.nvlink_domain_nodes if verdict.clique else None,
            checks=verdict.checks, notes=verdict.notes, settling=verdict.settling)

    async def settle(self, node: Node, record: ValidationRecord, since: datetime,
                     recollect: Recollect, note: Note) -> ValidationRecord:
        """Re-collect and re-check while the NVSwitch fabric trains, every
        ``fabric_settle_interval_s``, until ``fabric_settle_timeout_s`` after ``since``
        (checkpointed by the step, so a restart keeps the deadline). One history row when
        it starts waiting; the sleeps yield the loop."""
        deadline = since + timedelta(seconds=self._settings.fabric_settle_timeout_s)
        noted = False
        while record.settling and self._clock() < deadline:
            if not noted:
                noted = True
                await note(SETTLE_EVENT, f"{record.reason}; collecting the facts again every "
                           f"{self._settings.fabric_settle_interval_s:g} s until "
                           f"{deadline.isoformat(timespec='seconds')} "
                           "(validation.fabric_settle_timeout_s)")
            await self._sleep(self._settings.fabric_settle_interval_s)
            node = await recollect(record)
            record = await self.check(node)
        if record.settling:
            failures = (*record.failures, f"nvlink-fabric: still training after "
                        f"{self._settings.fabric_settle_timeout_s:g} s "
                        "(validation.fabric_settle_timeout_s): is Fabric Manager running?")
            record = replace(record, failures=failures, settling=False)
        return record

    async def check_sku(self, node: Node) -> ValidationRecord:
        """The SKU gate on the inspection facts (``provisioner.validation.sku``); a node
        without a profile, or a profile that names no hardware, passes."""
        expect = sku_expectation(expectation(self._settings.profiles.get(node.profile or "")))
        if not asks_anything(expect):
            return ValidationRecord(passed=True, at=self._clock().isoformat())
        verdict = await asyncio.to_thread(evaluate, inspection_facts(node.facts), expect,
                                          node.hostname or "")
        return ValidationRecord(passed=verdict.passed, at=self._clock().isoformat(),
                                failures=verdict.failures, checks=verdict.checks,
                                notes=verdict.notes)

    async def wait_domain(self, node: Node, record: ValidationRecord, note: Note) -> None:
        if record.clique is None:
            return
        me = Member(node.id, node.hostname or node.id, record.clique, Standing.PASSED)
        noted = await self._noted(node.id)
        deadline = self._deadline(record)
        while True:
            members = await self._watch.members()
            status = domain_status(record.clique, me, members, record.domain_nodes)
            if status.complete:
                log.info("node %s: NVLink domain %s complete (%d nodes)", node.id,
                         record.clique, len(status.passed))
                return
            if deadline is not None and self._clock() >= deadline:
                raise FatalError(f"{status.waiting()}; gave up after "
                                 f"{self._settings.domain_wait_timeout_s:g} s "
                                 "(validation.domain_wait_timeout_s)")
            if not any(event == WAIT_EVENT for event, _ in noted):
                noted.add((WAIT_EVENT, status.waiting()))
                await note(WAIT_EVENT, status.waiting())
            for line in status.held():
                if (HELD_EVENT, line) not in noted:
                    noted.add((HELD_EVENT, line))
                    await note(HELD_EVENT, line)
            await self._sleep(self._settings.domain_poll_interval_s)

    async def _noted(self, node_id: str) -> set[tuple[str, str]]:
        """The wait rows this node already has since it last entered ``validating``."""
        history = await self._repo.history(node_id)
        entered = max((i for i, h in enumerate(history)
                       if h.to_state == NodeState.VALIDATING
                       and h.from_state != NodeState.VALIDATING), default=-1)
        return {(h.event, h.reason) for h in history[entered + 1:]
                if h.event in (WAIT_EVENT, HELD_EVENT)}

    def _deadline(self, record: ValidationRecord) -> datetime | None:
        """Counted from the node's own pass, so a restart does not start the wait over."""
        timeout = self._settings.domain_wait_timeout_s
        if timeout is None:
            return None
        try:
            since = datetime.fromisoformat(record.at)
        except ValueError:
            since = self._clock()
        return since + timedelta(seconds=timeout)


class DomainWatch:
    """Who is in which NVLink domain, refreshed at most once per ``interval_s`` however many
    nodes ask (the validation gate and the console's fabric page). Each refresh reads only
    (id, state, updated_at) of the nodes whose facts name a clique; a node is read again in
    full, in bulk, only when that stamp changed."""

    def __init__(self, repo: NodeRepo, *, interval_s: float,
                 now: Callable[[], float] = time.monotonic) -> None:
        self._repo = repo
        self._interval_s = interval_s
        self._now = now
        self._lock = asyncio.Lock()
        self._taken: float | None = None
        self._cache: dict[str, tuple[tuple[str, datetime], Member | None]] = {}
        self._members: tuple[Member, ...] = ()

    async def members(self) -> tuple[Member, ...]:
        async with self._lock:
            if self._taken is None or self._now() - self._taken >= self._interval_s:
                await self._refresh()
                self._taken = self._now()
        return self._members

    async def _refresh(self) -> None:
        stamps = await self._repo.clique_stamps(DOMAIN_STATES)  # nodes naming a clique only
        cache = {i: known for i, known in self._cache.items() if stamps.get(i) == known[0]}
        changed = [i for i in stamps if i not in cache]
        for start in range(0, len(changed), _CHUNK):  # in bulk: a first look at a big fleet
            for node in await self._repo.get_many(changed[start:start + _CHUNK]):
                cache[node.id] = ((str(node.state), node.updated_at), member_of(node))
        self._cache = cache
        self._members = tuple(m for _, m in cache.values() if m is not None)


def member_of(node: Node) -> Member | None:
    """The node as a member of the NVLink domain its validation record names; None when it
    names none (no multi-node NVLink, or never validated)."""
    record = ValidationRecord.from_facts(node.facts)
    if record is None or record.clique is None:
        return None
    name = node.hostname or node.id
    if node.state is NodeState.VALIDATE_FAILED:
        reason = record.reason if not record.passed else (node.last_error or "failed")
        return Member(node.id, name, record.clique, Standing.FAILED, reason)
    if passed_now(node.state, node.facts, node.checkpoint):
        return Member(node.id, name, record.clique, Standing.PASSED)
    if node.state is NodeState.VALIDATING:
        return Member(node.id, name, record.clique, Standing.PENDING)
    return None  # registering/active with a failed record: not ours to judge


def validation_passed(node: Node) -> bool:
    """The validation gate the Kubernetes joiner holds GPU operands behind: the validating
    step's record says the node passed in its current provisioning (a record left from an
    earlier one does not count)."""
    return passed_now(node.state, node.facts, node.checkpoint)
