"""NVLink domains and the repair ladder: which trays the published topology leaves out.

A tray under repair (``repairing``, ``repair_failed``, ``service_required``) is not a member
of the live topology (``topology_live.live.MEMBER_STATES``): its domain's Slurm block shrinks
by it. Two more rules, computed here and given to ``LiveTopology.hold_with`` (next to the
failed fabric acceptances' holds):

* the whole domain held: a tray of a profile with ``hold_domain_on_repair`` under repair
  holds every node of its NVLink domain (the block gone, not shrunk);
* a repaired tray (``active`` again, its repair record closed ``passed``) of a profile with
  domain checks (``acceptance``) rejoins its block only once its domain's acceptance passed
  after the repair ended; until then it is held, and ``ask_acceptance`` is the hook that
  asks for that run (``RepairRejoin.observe``).

The nodes are read by their stamps (``clique_stamps``: only nodes that name a clique) and
re-read only when their row changed, as the domain view of the validating step does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from provisioner.config import ValidationSettings
from provisioner.domain import Node
from provisioner.health.record import PASSED, RepairRecord
from provisioner.lifecycle.states import NodeState
from provisioner.store.repo import NodeRepo
from provisioner.validation.record import ValidationRecord

log = logging.getLogger(__name__)

UNDER_REPAIR: Final = (NodeState.REPAIRING, NodeState.REPAIR_FAILED,
                       NodeState.SERVICE_REQUIRED)
_READ: Final = (*UNDER_REPAIR, NodeState.ACTIVE)
_CHUNK: Final = 500

LastPasses = Callable[[], Awaitable[Mapping[str, datetime | None]]]
"""Each domain's last passed acceptance (``DomainAcceptance.standings`` folded)."""


@dataclass(frozen=True, slots=True)
class Tray:
    hostname: str
    clique: str
    profile: str
    state: NodeState
    repaired_at: datetime | None  # an active tray whose last repair passed: when it ended


def tray_of(node: Node) -> Tray | None:
    record = ValidationRecord.from_facts(node.facts)
    if record is None or record.clique is None or not node.hostname:
        return None
    repaired: datetime | None = None
    repair = RepairRecord.from_facts(node.facts)
    if node.state is NodeState.ACTIVE and repair is not None and repair.outcome == PASSED:
        repaired = _parse(repair.ended_at)
    return Tray(node.hostname, record.clique, node.profile or "", NodeState(node.state),
                repaired)


def held_trays(trays: list[Tray], settings: ValidationSettings,
               last_pass: Mapping[str, datetime | None]) -> set[str]:
    """The hostnames to leave out of the published topology (see the module's text)."""
    held: set[str] = set()
    whole = {t.clique for t in trays if t.state in UNDER_REPAIR and _hold_whole(t, settings)}
    for tray in trays:
        if tray.clique in whole:
            held.add(tray.hostname)
        elif tray.repaired_at is not None and _checked(tray, settings):
            passed = last_pass.get(tray.clique)
            if passed is None or passed < tray.repaired_at:
                held.add(tray.hostname)
    return held


def _hold_whole(tray: Tray, settings: ValidationSettings) -> bool:
    profile = settings.profiles.get(tray.profile)
    return profile is not None and profile.hold_domain_on_repair


def _checked(tray: Tray, settings: ValidationSettings) -> bool:
    profile = settings.profiles.get(tray.profile)
    return profile is not None and profile.acceptance is not None


class RepairHolds:
    def __init__(self, repo: NodeRepo, settings: ValidationSettings, *,
                 last_passes: LastPasses | None = None) -> None:
        self._repo = repo
        self._settings = settings
        self._last_passes = last_passes
        self._cache: dict[str, tuple[tuple[str, datetime], Tray | None]] = {}

    async def trays(self) -> list[Tray]:
        stamps = await self._repo.clique_stamps(_READ)
        cache = {i: known for i, known in self._cache.items() if stamps.get(i) == known[0]}
        changed = [i for i in stamps if i not in cache]
        for start in range(0, len(changed), _CHUNK):
            for node in await self._repo.get_many(changed[start:start + _CHUNK]):
                cache[node.id] = ((str(node.state), node.updated_at), tray_of(node))
        self._cache = cache
        return [tray for _, tray in cache.values() if tray is not None]

    async def held(self) -> set[str]:
        trays = await self.trays()
        passes: Mapping[str, datetime | None] = {}
        if self._last_passes is not None and any(t.repaired_at is not None for t in trays):
            passes = await self._last_passes()
        return held_trays(trays, self._settings, passes)


def combine(*sources: Callable[[], Awaitable[set[str]]]) -> Callable[[], Awaitable[set[str]]]:
    """One ``hold_with`` callable of several (the acceptance's holds and the repairs')."""
    async def held() -> set[str]:
        found: set[str] = set()
        for source in sources:
            found |= await source()
        return found

    return held


class RepairRejoin:
    """A conductor observer: a tray of a profile with domain checks that leaves
    ``repairing`` for ``active`` asks for its domain's acceptance (``ask``, e.g.
    ``acceptance_sweep.ask_acceptance``); the tray stays held until that run passed."""

    def __init__(self, settings: ValidationSettings,
                 ask: Callable[[Node], Awaitable[object]]) -> None:
        self._settings = settings
        self._ask = ask
        self._tasks: set[asyncio.Task[None]] = set()

    def observe(self, node: Node, event: str, before: NodeState) -> None:
        if before is not NodeState.REPAIRING or node.state is not NodeState.ACTIVE:
            return
        tray = tray_of(node)
        if tray is None or tray.repaired_at is None or not _checked(tray, self._settings):
            return
        task = asyncio.get_running_loop().create_task(self._run(node), name=f"rejoin:{node.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, node: Node) -> None:
        try:
            answer = await self._ask(node)
        except Exception:  # a task boundary: logged; the sweep or an operator asks again
            log.exception("node %s: asking for its domain's acceptance after a repair failed",
                          node.id)
            return
        log.info("node %s: repaired; its domain's acceptance asked: %s", node.id, answer)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _parse(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
