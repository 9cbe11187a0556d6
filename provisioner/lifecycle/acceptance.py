"""Fabric acceptance of an NVLink domain (issue 26): once every node of a domain passed the
single-node gate and before ``registering``, the profile's tests run over the whole domain
(``AcceptanceLauncher``: the Ansible playbook over SSH) and are judged against the fabric
class's floors (``provisioner.acceptance``). One run per domain however many of its nodes
wait: the first to arrive starts it, the others find it in the store and wait for its row.

The run is the domain's, not a node's: it runs as a task of its own, so a cancelled node
step does not end it for the others. A run counts for a node when it started after the
node's own checks passed (``ValidationRecord.at``) and covers the node: a retried node,
checked anew, therefore starts a new run, which is how a held domain is rerun
(``rerun``: retry its held nodes through the conductor). The nodes' states are written only
by the conductor: a failed run fails each node's ``validating`` step (``validate_failed``,
the summary naming the slowest node), a passed one lets each go on to ``registering``.

A row left ``running`` by a daemon that went away counts until its deadline; then a waiter
marks it interrupted and starts a new run.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from provisioner.acceptance.classes import FabricClass, fabric_class
from provisioner.acceptance.domain import (
    DOMAIN,
    DomainVerdict,
    NodeResult,
    ToolRun,
    judge_domain,
    scope_of,
    with_overrides,
)
from provisioner.acceptance.model import Figure
from provisioner.config import AcceptanceProfile, ValidationSettings
from provisioner.config.validation import AcceptanceTest
from provisioner.domain import Node
from provisioner.errors import ConfigError, Conflict, NotFound, ProvisionerError
from provisioner.lifecycle.acceptance_active import (
    JobsStillRunning,
    Reservations,
    hold,
    reservation_name,
    reservation_result,
)
from provisioner.lifecycle.ports import AcceptanceOutcome, Note
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import DOMAIN_STATES, member_of
from provisioner.store.acceptance import (
    FAILED,
    INTERRUPTED,
    PASSED,
    RUNNING,
    AcceptanceRepo,
    AcceptanceRun,
    Standing,
)
from provisioner.store.repo import NodeRepo
from provisioner.tasks import TaskSet
from provisioner.validation.record import ValidationRecord

log = logging.getLogger(__name__)
STARTED_EVENT: Final = "fabric_acceptance"
GRACE_S: Final = 60.0


class AcceptanceLauncher(Protocol):
    """Runs the tests on the domain's nodes and brings back what each printed."""

    def budget_s(self, profile: AcceptanceProfile) -> float:
        """How long one run of ``profile`` may take in all."""
        ...

    async def launch(self, run_id: str, domain: str, nodes: Sequence[Node],
                     profile: AcceptanceProfile, class_gpus: int | None) -> list[ToolRun]: ...


def expected_tests(profile: AcceptanceProfile, names: Sequence[str], scope: str
                   ) -> dict[str, list[str]]:
    """What each node (and ``DOMAIN``) must report: a missing one is a failure."""
    per_node: list[str] = [t for t in profile.tests if t in ("dcgm", "nvbandwidth")]
    if "nccl" in profile.tests and scope == "node":
        per_node.append("nccl")
    if "ib_write_bw" in profile.tests:
        per_node += [f"ib_write_bw-{device}" for device in profile.ib_devices] or [
            "ib_write_bw-(no ib_devices)"]
    expected: dict[str, list[str]] = {name: list(per_node) for name in names}
    domain: list[str] = [t for t in ("nccl", "mndiag") if t in profile.tests
              and (t != "nccl" or scope == "domain")]
    if domain:
        expected[DOMAIN] = domain
    return expected


def with_mndiag(profile: AcceptanceProfile, cls: FabricClass) -> AcceptanceProfile:
    """The profile with ``mndiag`` among its tests on a class that has it (GB200/GB300
    NVL72) unless ``mndiag = "off"``, and without it otherwise."""
    tests: list[AcceptanceTest] = [t for t in profile.tests if t != "mndiag"]
    if cls.mndiag and profile.mndiag != "off":
        tests.append("mndiag")
    return profile if tests == profile.tests else profile.model_copy(update={"tests": tests})


def check_fabric_classes(settings: ValidationSettings) -> None:
    """ConfigError naming the profile whose acceptance names an unknown fabric class (run
    by ``serve``'s preflight and ``config check``, and again here)."""
    for name, profile in settings.profiles.items():
        accept = profile.acceptance
        if accept is None:
            continue
        cls = fabric_class(accept.fabric_class)
        if cls is None:
            raise ConfigError(f"validation.profiles.{name}.acceptance.fabric_class: "
                              f"unknown class {accept.fabric_class!r} "
                              "(provisioner fabric judge --list-classes)")
        if not cls.mndiag and ("mndiag" in accept.tests or accept.mndiag == "require"):
            raise ConfigError(f"validation.profiles.{name}.acceptance: dcgmi mndiag runs on "
                              "GB200/GB300 NVL72 classes only, not on "
                              f"{accept.fabric_class!r}")


@dataclass(frozen=True, slots=True)
class Rerun:
    """What ``rerun`` started: the held nodes it retried, or (an active domain) the nodes
    accepted inside ``reservation``."""

    nodes: list[str]
    reservation: str | None = None


class DomainAcceptance:
    def __init__(self, repo: NodeRepo, runs: AcceptanceRepo, launcher: AcceptanceLauncher,
                 settings: ValidationSettings, *, instance: str | None = None,
                 poll_s: float = 2.0, reservations: Reservations | None = None,
                 on_hold: Callable[[], None] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        check_fabric_classes(settings)  # a typo fails at start-up
        self._repo = repo
        self._runs = runs
        self._launcher = launcher
        self._settings = settings
        self._instance = instance
        self._poll_s = poll_s
        self._clock = clock
        self._reservations = reservations
        self._on_hold = on_hold
        self._locks: dict[str, asyncio.Lock] = {}
        self._mine: dict[str, asyncio.Task[None]] = {}
        self._tasks = TaskSet()

    def profile_of(self, node: Node) -> AcceptanceProfile | None:
        profile = self._settings.profiles.get(node.profile or "")
        return profile.acceptance if profile is not None else None

    # -- the validating step's seam ------------------------------------------------------------

    async def accept(self, node: Node, record: ValidationRecord,
                     note: Note) -> AcceptanceOutcome | None:
        profile = self.profile_of(node)
        if profile is None:
            return None
        domain = record.clique or node.hostname or node.id
        since = _parse(record.at, self._clock())
        noted = False
        while True:
            run = await self._current(domain, node.id, since)
            if run is None:
                run = await self._start(domain, node, profile, since)
            if run.status != RUNNING:
                return AcceptanceOutcome(run.id, domain, run.status == PASSED, run.summary)
            if not noted:
                noted = True
                await note(STARTED_EVENT, f"fabric acceptance {run.id} of {domain} "
                           f"({run.fabric_class}) running on {len(run.nodes)} node(s) until "
                           f"{run.deadline_at.isoformat(timespec='seconds')}")
            await asyncio.sleep(self._poll_s)

    async def _current(self, domain: str, node_id: str, since: datetime
                       ) -> AcceptanceRun | None:
        """The run that counts for this node, if any; a dead daemon's stale row, past its
        deadline, is marked interrupted and does not."""
        run = await self._runs.latest(domain)
        if run is None or run.started_at < since or node_id not in run.node_ids:
            return None
        if (run.status == RUNNING and run.id not in self._mine
                and self._clock() > run.deadline_at + timedelta(seconds=GRACE_S)):
            await self._runs.finish(run.id, INTERRUPTED, summary=(
                f"fabric acceptance {run.id} of {domain} interrupted: its daemon went away"),
                slowest=None, result={})
            return None
        return run

    async def _start(self, domain: str, node: Node, profile: AcceptanceProfile,
                     since: datetime) -> AcceptanceRun:
        lock = self._locks.setdefault(domain, asyncio.Lock())
        async with lock:  # one start per domain in this daemon
            run = await self._current(domain, node.id, since)
            if run is not None:
                return run
            members = [m for m in await self.members(domain, node)
                       if m.state is NodeState.VALIDATING]  # never load an active node
            if node.id not in {m.id for m in members}:
                members = [*members, node]
            cls = self._class(profile, node.profile or "")
            profile = with_mndiag(profile, cls)
            run_id = uuid.uuid4().hex
            deadline = self._clock() + timedelta(seconds=self._launcher.budget_s(profile))
            run = await self._runs.start(
                run_id, domain, cls.name, [(m.id, m.hostname or m.id) for m in members],
                deadline_at=deadline, requested_by=f"validating:{node.hostname or node.id}",
                instance=self._instance)
            self._mine[run_id] = self._tasks.spawn(
                self._execute(run, members, profile, cls), name=f"acceptance:{domain}")
            log.info("fabric acceptance %s of %s (%s) started on %d node(s)", run_id,
                     domain, cls.name, len(members))
            return run

    async def members(self, domain: str, node: Node | None = None) -> list[Node]:
        """The nodes of ``domain`` that passed their own checks (an NVLink clique), or the
        one node whose hostname (or id) it is."""
        stamps = await self._repo.clique_stamps(DOMAIN_STATES)
        found = [n for n in await self._repo.get_many(list(stamps))
                 if (m := member_of(n)) is not None and m.clique == domain]
        if not found and node is not None and (node.hostname or node.id) == domain:
            return [node]
        return sorted(found, key=lambda n: n.hostname or n.id)

    def _class(self, profile: AcceptanceProfile, profile_name: str) -> FabricClass:
        base = fabric_class(profile.fabric_class)
        if base is None:
            raise ConfigError(f"unknown fabric class {profile.fabric_class!r}")
        return with_overrides(base, tolerance=profile.tolerance, floors=profile.floors,
                              source=f"profile {profile_name}")

    async def _execute(self, run: AcceptanceRun, members: Sequence[Node],
                       profile: AcceptanceProfile, cls: FabricClass,
                       reservation: str | None = None) -> None:
        names = [m.hostname or m.id for m in members]
        status, verdict = FAILED, None
        extra: dict[str, object] = {}
        try:
            if reservation is not None and self._reservations is not None:
                try:
                    await hold(self._reservations, reservation, names,
                               wait_s=profile.jobs_wait_s, poll_s=self._poll_s)
                except JobsStillRunning:
                    raise
                except ProvisionerError as exc:  # Slurm refused: nothing tested, not held
                    raise JobsStillRunning(f"could not reserve the nodes in Slurm ({exc}): "
                                           "released, nothing was tested") from exc
            runs = await self._launcher.launch(run.id, run.domain, members, profile, cls.gpus)
            scope = scope_of(profile.nccl_scope, cls.gpus)
            verdict = judge_domain(run.domain, cls, names,
                                   expected_tests(profile, names, scope), runs,
                                   mndiag_required=profile.mndiag == "require")
            status = PASSED if verdict.passed else FAILED
        except JobsStillRunning as exc:
            status = INTERRUPTED
            verdict = DomainVerdict(run.domain, cls.name, (NodeResult(DOMAIN, (Figure(
                "acceptance", "reservation", "-", "-", False, str(exc)),)),))
        except ProvisionerError as exc:
            verdict = DomainVerdict(run.domain, cls.name, (NodeResult(DOMAIN, (Figure(
                "acceptance", "launch", "-", "-", False, f"could not run the tests: {exc}"),)),
            ))
        except asyncio.CancelledError:
            status = INTERRUPTED
            raise
        finally:
            if reservation is not None:
                extra = await asyncio.shield(self._settle(reservation, status))
            summary = (verdict.summary() if verdict is not None else
                       f"fabric acceptance {run.id} of {run.domain} interrupted (daemon stop)")
            if status == INTERRUPTED and verdict is not None:
                summary = f"fabric acceptance of {run.domain} interrupted: " + (
                    verdict.nodes[0].failures()[0] if verdict.nodes else summary)
            await asyncio.shield(self._runs.finish(
                run.id, status, summary=summary, slowest=verdict.slowest if verdict else None,
                result=(verdict.to_json() if verdict else {}) | extra))
            if reservation is not None and self._on_hold is not None:
                self._on_hold()  # the published topology leaves held nodes out
            self._mine.pop(run.id, None)
            log.log(logging.INFO if status == PASSED else logging.WARNING, "%s", summary)

    async def _settle(self, reservation: str, status: str) -> dict[str, object]:
        """Release the reservation unless the run failed (then it holds the domain until a
        later run passes). Nothing tested (jobs that did not end, Slurm refused, a daemon
        stop): released, not held."""
        held = status == FAILED
        if status in (PASSED, INTERRUPTED) and self._reservations is not None:
            try:
                await self._reservations.release(reservation)
            except ProvisionerError as exc:
                log.warning("fabric acceptance: releasing reservation %s failed: %s",
                            reservation, exc)
                held = True
        return reservation_result(reservation, held)

    # -- operators ---------------------------------------------------------------------------

    async def rerun(self, domain: str, retry: Callable[[str], Awaitable[object]], *,
                    requested_by: str = "operator") -> Rerun:
        """Rerun a held domain after a repair: retry each of its ``validate_failed`` nodes
        (through the conductor): they are checked anew and, once all passed, start a new
        run. A domain whose nodes are all ``active`` is accepted inside a Slurm maintenance
        reservation (``acceptance_active``). Conflict when a run is going on, or nothing is
        held and there is no Slurm to reserve the nodes in."""
        latest = await self._runs.latest(domain)
        if latest is not None and latest.status == RUNNING and (
                self._clock() <= latest.deadline_at + timedelta(seconds=GRACE_S)):
            raise Conflict(f"fabric acceptance {latest.id} of {domain} is still running")
        stamps = await self._repo.clique_stamps(DOMAIN_STATES)
        nodes = [n for n in await self._repo.get_many(list(stamps))
                 if (m := member_of(n)) is not None and m.clique == domain]
        if not nodes and latest is not None:  # a node alone, or members that left the index
            nodes = await self._repo.get_many(list(latest.node_ids))
        if not nodes:
            raise NotFound("NVLink domain", domain)
        held = sorted((n for n in nodes if n.state is NodeState.VALIDATE_FAILED),
                      key=lambda n: n.hostname or n.id)
        if not held and all(n.state is NodeState.ACTIVE for n in nodes):
            return await self._accept_active(domain, nodes, requested_by)
        if not held:
            states = sorted({str(n.state) for n in nodes})
            raise Conflict(f"domain {domain} holds no failed node and is not all active "
                           f"(states: {', '.join(states)})")
        for node in held:
            await retry(node.id)
        return Rerun([n.hostname or n.id for n in held])

    async def _accept_active(self, domain: str, nodes: Sequence[Node],
                             requested_by: str) -> Rerun:
        if self._reservations is None:
            raise Conflict(f"domain {domain} is active: its acceptance runs inside a Slurm "
                           "maintenance reservation, and this daemon has no Slurm "
                           "(slurm.enabled)")
        members = sorted(nodes, key=lambda n: n.hostname or n.id)
        profile = self.profile_of(members[0])
        if profile is None:
            raise Conflict(f"profile {members[0].profile!r} of domain {domain} has no "
                           "acceptance (validation.profiles.<p>.acceptance)")
        lock = self._locks.setdefault(domain, asyncio.Lock())
        async with lock:
            latest = await self._runs.latest(domain)
            if latest is not None and latest.status == RUNNING and latest.id in self._mine:
                raise Conflict(f"fabric acceptance {latest.id} of {domain} is still running")
            cls = self._class(profile, members[0].profile or "")
            profile = with_mndiag(profile, cls)
            name = reservation_name(domain)
            run_id = uuid.uuid4().hex
            budget = self._launcher.budget_s(profile) + profile.jobs_wait_s
            run = await self._runs.start(
                run_id, domain, cls.name, [(m.id, m.hostname or m.id) for m in members],
                deadline_at=self._clock() + timedelta(seconds=budget),
                requested_by=f"{requested_by} (reservation {name})", instance=self._instance)
            self._mine[run_id] = self._tasks.spawn(
                self._execute(run, members, profile, cls, reservation=name),
                name=f"acceptance:{domain}")
        log.info("fabric acceptance %s of active domain %s (%s) in reservation %s",
                 run_id, domain, cls.name, name)
        return Rerun([m.hostname or m.id for m in members], name)

    async def held_nodes(self) -> set[str]:
        """The nodes of active domains held by a failed run's reservation."""
        return await self._runs.held_nodes()

    async def last_passes(self) -> dict[str, datetime | None]:
        """Each domain's last passed run (None: never): a repaired tray rejoins after it."""
        return {domain: s.last_pass for domain, s in (await self.standings()).items()}

    async def latest(self, domain: str) -> AcceptanceRun | None:
        return await self._runs.latest(domain)

    async def standings(self) -> dict[str, Standing]:
        """Every domain's latest run and last pass (the console's fabric view)."""
        return await self._runs.standings()

    async def aclose(self) -> None:
        await self._tasks.cancel_all()


def _parse(text: str, default: datetime) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return default
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
