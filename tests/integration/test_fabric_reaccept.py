"""Scheduled fabric acceptance of active domains (issue 26, ``lifecycle/acceptance_sweep.py``)
against a real SQLite store, at a fixed clock: which domains the sweep picks (last pass older
than the profile's ``reaccept_interval_days``, oldest first), and those it never touches (a
run going on, a held domain, a node not active or in maintenance, a recent interrupted try,
a profile without the schedule). The runs it starts, inside real Slurm maintenance
reservations and under the concurrency cap: test_fabric_acceptance_slurm.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlmodel import Session

from provisioner.acceptance.domain import ToolRun
from provisioner.config import AcceptanceProfile, ValidationProfile, ValidationSettings
from provisioner.domain import Node
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.acceptance_sweep import Due, ReacceptSweep, ask_acceptance
from provisioner.lifecycle.states import NodeState
from provisioner.store.models import FabricAcceptanceRow
from provisioner.store.store import Store
from provisioner.validation.record import ValidationRecord

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


class NotLaunched:
    """The sweep's choice is read, never run, here."""

    def budget_s(self, profile: AcceptanceProfile) -> float:
        return 60.0

    async def launch(self, run_id: str, domain: str, nodes: Sequence[Node],
                     profile: AcceptanceProfile, class_gpus: int | None) -> list[ToolRun]:
        raise AssertionError(f"nothing is launched in this test ({domain})")


def settings(**kw: Any) -> ValidationSettings:
    def profile(days: float) -> ValidationProfile:
        return ValidationProfile(nvlink_domain=True, acceptance=AcceptanceProfile(
            fabric_class="gb200-nvl72", reaccept_interval_days=days))

    return ValidationSettings(profiles={"nvl": profile(7), "off": profile(0)}, **kw)


async def domain(store: Store, make_node: Any, name: str, size: int = 2, *,
                 profile: str = "nvl", state: NodeState = NodeState.ACTIVE,
                 clique: bool = True) -> list[Node]:
    nodes = []
    for i in range(size):
        node = await make_node(state, profile=profile, hostname=f"{name}-{i}")
        record = ValidationRecord(passed=True, at="2026-11-01T00:00:00+00:00",
                                  clique=f"{name}.1" if clique else None, domain_nodes=size)
        await store.nodes.merge_facts(node.id, {"validation": record.to_facts()})
        nodes.append(await store.nodes.get(node.id))
    return nodes


def past_run(store: Store, domain: str, nodes: Sequence[Node], status: str, days_ago: float,
             *, held: bool = False, now: datetime = NOW) -> None:
    """A run row as an earlier daemon left it, at a time of the test's choosing."""
    started = now - timedelta(days=days_ago)
    result = {"reservation": {"name": f"provisioner-acceptance-{domain}", "held": held}}
    with Session(store.engine) as s:
        s.add(FabricAcceptanceRow(
            id=uuid.uuid4().hex, domain=domain, fabric_class="gb200-nvl72", status=status,
            nodes=json.dumps([[n.id, n.hostname] for n in nodes]), result=json.dumps(result),
            requested_by="test", started_at=started,
            deadline_at=started + timedelta(hours=2),
            finished_at=None if status == "running" else started + timedelta(minutes=30)))
        s.commit()


def acceptance_of(store: Store, validation: ValidationSettings) -> DomainAcceptance:
    return DomainAcceptance(store.nodes, store.acceptance, NotLaunched(), validation,
                            clock=lambda: NOW)


def sweep_of(store: Store, validation: ValidationSettings) -> ReacceptSweep:
    return ReacceptSweep(acceptance_of(store, validation), store.nodes, store.acceptance,
                         validation, clock=lambda: NOW)


async def test_the_sweep_picks_old_passes_first_and_leaves_the_rest(
        store: Store, make_node: Any) -> None:
    old = await domain(store, make_node, "old")
    past_run(store, "old.1", old, "passed", days_ago=30)
    past_run(store, "old.1", old, "passed", days_ago=9)          # last pass 9 days ago: due
    older = await domain(store, make_node, "older")
    past_run(store, "older.1", older, "passed", days_ago=20)     # due, before "old"
    fresh = await domain(store, make_node, "fresh")
    past_run(store, "fresh.1", fresh, "passed", days_ago=3)      # within 7 days
    await domain(store, make_node, "never")                       # no run at all: first
    held = await domain(store, make_node, "held")
    past_run(store, "held.1", held, "passed", days_ago=40)
    past_run(store, "held.1", held, "failed", days_ago=8, held=True)
    busy = await domain(store, make_node, "busy")
    past_run(store, "busy.1", busy, "passed", days_ago=40)
    past_run(store, "busy.1", busy, "running", days_ago=0.01)     # under a run now
    stale = await domain(store, make_node, "stale")
    past_run(store, "stale.1", stale, "running", days_ago=1)      # its daemon went away
    tried = await domain(store, make_node, "tried")
    past_run(store, "tried.1", tried, "passed", days_ago=40)
    past_run(store, "tried.1", tried, "interrupted", days_ago=0.1)  # 2.4 h ago: not yet
    retry = await domain(store, make_node, "retry")
    past_run(store, "retry.1", retry, "passed", days_ago=40)
    past_run(store, "retry.1", retry, "interrupted", days_ago=0.5)  # 12 h ago: again
    off = await domain(store, make_node, "off", profile="off")
    past_run(store, "off.1", off, "passed", days_ago=400)         # no schedule
    joining = await domain(store, make_node, "joining", state=NodeState.VALIDATING)
    past_run(store, "joining.1", joining, "passed", days_ago=40)  # not active
    mixed = await domain(store, make_node, "mixed")
    await store.nodes.transition(mixed[1], to_state=NodeState.ACTIVE, event="maintenance-on",
                                 actor="test", maintenance=(True, "cable swap"))
    past_run(store, "mixed.1", mixed, "passed", days_ago=40)      # a node in maintenance
    hgx = await domain(store, make_node, "hgx", size=1, clique=False)
    past_run(store, "hgx-0", hgx, "passed", days_ago=10)          # a domain of one node

    due, running = await sweep_of(store, settings()).due()
    finished = NOW + timedelta(minutes=30)  # each past run took 30 minutes
    assert due == [Due("never.1", None), Due("stale.1", None),
                   Due("retry.1", finished - timedelta(days=40)),
                   Due("older.1", finished - timedelta(days=20)),
                   Due("hgx-0", finished - timedelta(days=10)),
                   Due("old.1", finished - timedelta(days=9))]
    assert running == 1  # busy.1


async def test_a_shorter_retry_brings_back_a_recent_interrupted_try(
        store: Store, make_node: Any) -> None:
    tried = await domain(store, make_node, "tried")
    past_run(store, "tried.1", tried, "passed", days_ago=40)
    past_run(store, "tried.1", tried, "interrupted", days_ago=0.1)
    assert (await sweep_of(store, settings()).due())[0] == []
    due, _ = await sweep_of(store, settings(reaccept_retry_s=3600)).due()
    assert [d.domain for d in due] == ["tried.1"]


async def test_the_sweep_is_off_unless_a_profile_asks(store: Store) -> None:
    assert sweep_of(store, settings()).enabled
    off = ValidationSettings(profiles={"nvl": ValidationProfile(
        acceptance=AcceptanceProfile(fabric_class="hgx-h100"))})
    assert not sweep_of(store, off).enabled
    assert AcceptanceProfile(fabric_class="hgx-h100").reaccept_interval_days == 0


async def test_the_ladder_asks_and_is_told_why_not(store: Store, make_node: Any) -> None:
    """``ask_acceptance``: the repair ladder's hook answers rather than raises."""
    nodes = await domain(store, make_node, "asked")
    past_run(store, "asked.1", nodes, "running", days_ago=0.01)
    asked = await ask_acceptance(acceptance_of(store, settings()), nodes[0],
                                 requested_by="repair")
    assert asked.domain == "asked.1" and asked.started is None
    assert "still running" in asked.reason
    lone = (await domain(store, make_node, "solo", size=1, clique=False))[0]
    asked = await ask_acceptance(acceptance_of(store, settings()), lone,
                                 requested_by="repair")
    assert asked.domain == "solo-0" and asked.started is None
    past_run(store, "solo-0", [lone], "passed", days_ago=30)
    asked = await ask_acceptance(acceptance_of(store, settings()), lone,
                                 requested_by="repair")  # active, and no Slurm here
    assert asked.started is None and "has no Slurm" in asked.reason, asked
