"""Firmware waves (issue 25): an operator brings a profile's drifted active nodes back to
its baseline by starting the profile's runbook (``Conductor.service``, the path of
``provisioner node service``) on a few at a time.

A wave starts at most ``max_nodes`` of its nodes at once, never more than
``max_domain_share`` of one NVLink domain or ``max_rack_share`` of one rack being serviced
at any moment (nodes serviced for any other reason count against the share too), and
starts no more once ``stop_after_failures`` of its nodes failed (those being serviced
finish). Domains it has begun are finished first.

Its state is its row (``store.waves``): every node is marked ``starting`` there before its
runbook starts, and the runbook's record names the wave (actor ``wave:<id>``), so a daemon
restarted mid-wave, or another daemon taking the ``fleet`` singleton over, finds which
nodes run, passed or failed and starts none twice. Only the ``fleet`` singleton's leader
drives waves (``WaveDriver.run`` is one of its works); its writes are fenced by that lead.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final

from provisioner.domain import Node, NodeState
from provisioner.errors import Conflict, InvalidRequest, NotFound
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.drift import domain_of, node_firmware
from provisioner.lifecycle.service_record import PASSED, ServiceRecord
from provisioner.store.repo import NodeRepo
from provisioner.store.waves import DONE, FAILED, OPEN, RUNNING, Wave, WaveNode, WaveRepo
from provisioner.validation.drift import DRIFTED, Candidate, Limits, plan_wave

log = logging.getLogger(__name__)

PENDING: Final = "pending"
STARTING: Final = "starting"
NODE_RUNNING: Final = "running"
NODE_PASSED: Final = "passed"
NODE_FAILED: Final = "failed"
SKIPPED: Final = "skipped"
_OPEN: Final = OPEN

Lead = Callable[[], tuple[str, int] | None]


def wave_actor(wave_id: str) -> str:
    return f"wave:{wave_id}"


class WaveDriver:
    def __init__(self, waves: WaveRepo, nodes: NodeRepo, conductor: Conductor, *,
                 interval_s: float = 5.0, lead: Lead | None = None) -> None:
        """``lead``: (instance, fence) of this daemon's ``fleet`` singleton lead, None while
        it has none; unset: no HA fencing (tests of one driver alone)."""
        self._waves = waves
        self._nodes = nodes
        self._conductor = conductor
        self.interval_s = interval_s
        self._lead = lead
        self._wake = asyncio.Event()

    @property
    def repo(self) -> WaveRepo:
        return self._waves

    # -- requests (any daemon: the API) --------------------------------------------------

    async def start(self, profile: str, *, actor: str, runbook: str | None = None,
                    max_nodes: int = 1, max_domain_share: float = 0.25,
                    max_rack_share: float = 0.25, stop_after_failures: int = 1) -> Wave:
        servicing = self._conductor.servicing
        runbook = runbook or servicing.wave_runbook(profile)
        if runbook is None:
            raise InvalidRequest(f"profile {profile} has no [servicing.profiles.{profile}] "
                                 "wave_runbook: name one (--runbook)")
        steps = servicing.runbook(runbook)  # InvalidRequest when unknown
        if "firmware_update" not in steps:
            raise InvalidRequest(f"runbook {runbook} ({', '.join(steps)}) has no "
                                 "firmware_update step")
        fleet = await self._nodes.in_states(NodeState)
        mine = [n for n in fleet if n.profile == profile]
        if not mine or not servicing.baseline(mine[0]).firmware:
            raise InvalidRequest(f"profile {profile} has no nodes with a firmware baseline")
        domains = Counter(d for n in fleet if (d := domain_of(n)))
        racks = Counter(n.rack for n in fleet if n.rack)
        wanted = {str(n.id): WaveNode(PENDING, n.hostname or n.id, domain_of(n), n.rack)
                  for n in mine if _startable(n, self._conductor)}
        wave = Wave(id=str(uuid.uuid4()), profile=profile, runbook=runbook,
                    max_nodes=max_nodes, max_domain_share=max_domain_share,
                    max_rack_share=max_rack_share, stop_after_failures=stop_after_failures,
                    nodes=wanted, started_by=actor,
                    domain_sizes={d: domains[d] for d in {w.domain for w in wanted.values()}
                                  if d},
                    rack_sizes={r: racks[r] for r in {w.rack for w in wanted.values()} if r},
                    status=RUNNING if wanted else DONE,
                    reason="" if wanted else "no drifted active node")
        created = await self._waves.create(wave)
        log.info("firmware wave %s on profile %s by %s: %d drifted nodes, runbook %s",
                 created.id, profile, actor, len(wanted), runbook)
        self._wake.set()
        return created

    # -- driving (the fleet singleton's leader) ----------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop's task boundary: the database may be away
                log.warning("firmware waves: round failed: %s: %s", type(exc).__name__, exc)
            self._wake.clear()
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def tick(self) -> None:
        """One round over the running waves."""
        for wave in await self._waves.unsettled():
            await self._drive(wave)

    async def _drive(self, wave: Wave) -> None:
        lead = self._lead() if self._lead is not None else None
        if self._lead is not None and lead is None:
            return  # not (or no longer) the leader
        nodes = {str(n.id): n for n in await self._nodes.get_many(list(wave.nodes))}
        was = wave.status
        wave = _observed(wave, nodes)
        if wave.status != RUNNING:  # stopped or failed: its last runbooks end; none starts
            wave = _unstarted(wave, nodes)
        elif wave.failures >= wave.stop_after_failures:
            failed = sorted(w.name for w in wave.nodes.values() if w.status == NODE_FAILED)
            wave = replace(wave, status=FAILED, reason=f"stopped after {wave.failures} "
                           f"failures (limit {wave.stop_after_failures}): {', '.join(failed)}")
        chosen: list[Candidate] = []
        if wave.status == RUNNING:
            wave, chosen = await self._plan(wave, nodes)
            if not chosen and not any(w.status in _OPEN | {PENDING}
                                      for w in wave.nodes.values()):
                wave = replace(wave, status=DONE, reason=f"{wave.count(NODE_PASSED)} passed, "
                               f"{wave.failures} failed, {wave.count(SKIPPED)} skipped")
        saved = await self._waves.save(wave, lead=lead)
        if saved is None:
            return  # stopped by an operator, or the lead moved: read again next round
        if saved.status != RUNNING and was == RUNNING:
            log.info("firmware wave %s: %s (%s)", saved.id, saved.status, saved.reason)
        for cand in chosen:
            await self._start(saved, cand, lead)

    async def _plan(self, wave: Wave, nodes: Mapping[str, Node]) -> tuple[Wave, list[Candidate]]:
        for node_id, entry in wave.nodes.items():  # pending ones no longer drifted or active
            node = nodes.get(node_id)
            if entry.status == PENDING and (node is None
                                            or not _startable(node, self._conductor)):
                wave = wave.with_node(node_id, SKIPPED)
        busy = [(domain_of(n), n.rack) for n in
                await self._nodes.in_states([NodeState.SERVICING])]
        busy += [(w.domain, w.rack) for i, w in wave.nodes.items() if w.status == STARTING
                 and (n := nodes.get(i)) is not None and n.state is not NodeState.SERVICING]
        retry = [i for i, w in wave.nodes.items() if w.status == STARTING
                 and (n := nodes.get(i)) is not None and n.state is NodeState.ACTIVE]
        running = sum(1 for w in wave.nodes.values() if w.status in _OPEN)
        plan = plan_wave(
            [Candidate(i, w.name, w.domain, w.rack) for i, w in wave.nodes.items()
             if w.status == PENDING],
            running=running, busy=busy, domain_sizes=wave.domain_sizes,
            rack_sizes=wave.rack_sizes,
            limits=Limits(wave.max_nodes, wave.max_domain_share, wave.max_rack_share),
            started_domains={w.domain for w in wave.nodes.values()
                             if w.domain and w.status != PENDING})
        for cand in plan:
            wave = wave.with_node(cand.node_id, STARTING)
        # marked before a crash, never started: started now (already counted as running)
        again = [Candidate(i, wave.nodes[i].name, wave.nodes[i].domain, wave.nodes[i].rack)
                 for i in retry]
        return wave, again + plan

    async def _start(self, wave: Wave, cand: Candidate, lead: tuple[str, int] | None) -> None:
        try:
            await self._conductor.service(cand.node_id, wave.runbook,
                                          actor=wave_actor(wave.id),
                                          reason=f"firmware wave {wave.id}: runbook "
                                                 f"{wave.runbook}")
        except Conflict as exc:  # busy now (a step, the lease of a daemon that died): later
            log.info("firmware wave %s: %s not started yet: %s", wave.id, cand.name, exc)
            await self._mark(wave.id, cand.node_id, PENDING, lead)
        except (InvalidRequest, NotFound) as exc:  # moved meanwhile: not ours now
            log.info("firmware wave %s: %s skipped: %s", wave.id, cand.name, exc)
            await self._mark(wave.id, cand.node_id, SKIPPED, lead)

    async def _mark(self, wave_id: str, node_id: str, status: str,
                    lead: tuple[str, int] | None) -> None:
        for _ in range(5):
            wave = await self._waves.get(wave_id)
            if await self._waves.save(wave.with_node(node_id, status), lead=lead):
                return


def _startable(node: Node, conductor: Conductor) -> bool:
    if node.state is not NodeState.ACTIVE or node.maintenance:
        return False
    found = node_firmware(node, conductor.servicing)
    return found is not None and found.status == DRIFTED


def _observed(wave: Wave, nodes: Mapping[str, Node]) -> Wave:
    """The wave's nodes as the store has them now: a node its runbook runs on is
    ``running``, one whose runbook passed ``passed``, failed ``failed``."""
    for node_id, entry in wave.nodes.items():
        if entry.status not in _OPEN:
            continue
        node = nodes.get(node_id)
        if node is None:
            wave = wave.with_node(node_id, SKIPPED)
            continue
        record = ServiceRecord.from_facts(node.facts)
        ours = record is not None and record.actor == wave_actor(wave.id)
        if not ours:
            continue  # marked, not started yet (a crash in between): started again
        assert record is not None
        if node.state is NodeState.SERVICING:
            wave = wave.with_node(node_id, NODE_RUNNING)
        elif node.state is NodeState.ACTIVE and record.outcome == PASSED:
            wave = wave.with_node(node_id, NODE_PASSED)
        elif node.state is not NodeState.ACTIVE:
            wave = wave.with_node(node_id, NODE_FAILED)
    return replace(wave, failures=wave.count(NODE_FAILED))


def _unstarted(wave: Wave, nodes: Mapping[str, Node]) -> Wave:
    """A wave that no longer runs: its nodes marked but never started are pending again."""
    for node_id, entry in wave.nodes.items():
        node = nodes.get(node_id)
        record = ServiceRecord.from_facts(node.facts) if node is not None else None
        if entry.status == STARTING and (record is None
                                         or record.actor != wave_actor(wave.id)):
            wave = wave.with_node(node_id, PENDING)
    return wave
