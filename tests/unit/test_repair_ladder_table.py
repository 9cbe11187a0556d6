"""The repair ladder's pure parts: the table per class, the plan from a finding's action,
the circuit breaker, the cool-down, the repair record's round trip."""

from __future__ import annotations

from datetime import UTC, datetime

from provisioner.config.health import HEALTH_CLASSES, HealthSettings
from provisioner.health.ladder import (
    LADDERS,
    RUNGS,
    BreakerLimits,
    Peer,
    breaker,
    cooling_down,
    plan,
)
from provisioner.health.model import Action, Finding, HealthClass, Source
from provisioner.health.record import RepairRecord
from provisioner.lifecycle.states import TRANSITIONS, Event, NodeState, next_state

H, A, S = HealthClass, Action, NodeState


def test_every_class_but_application_has_a_ladder_mildest_first() -> None:
    assert set(LADDERS) == set(HealthClass) - {H.APPLICATION}
    for ladder in LADDERS.values():
        assert list(ladder.rungs) == sorted(ladder.rungs, key=lambda r: r.rank)
        assert set(ladder.rungs) <= set(RUNGS)
    assert tuple(str(c) for c in HealthClass) == HEALTH_CLASSES  # config's copy


def test_plan_starts_at_the_recommended_action() -> None:
    lost = plan(H.GPU_LOST, A.RESTART_OS)
    assert lost is not None and lost.drain_at_once and lost.drain_deadline_s == 0
    assert lost.rungs == (A.RESTART_OS, A.POWER_CYCLE)
    memory = plan(H.GPU_MEMORY, A.DRAIN, deadlines={"gpu-memory": 600})
    assert memory is not None and not memory.drain_at_once
    assert memory.drain_deadline_s == 600 and memory.rungs[0] is A.RESET_GPU
    service = plan(H.GPU, A.SERVICE_REQUIRED)
    assert service is not None and service.rungs == ()
    assert plan(H.GPU, A.NONE) is None and plan(H.APPLICATION, A.DRAIN) is None
    assert plan(H.LEAK, A.DRAIN) == plan(H.LEAK, A.RESET_GPU)  # drain, then a person


def peers(repairing: int, total: int, rack: str = "r1") -> list[Peer]:
    return [Peer(f"n{i}", rack, None, i < repairing) for i in range(total)]


def test_breaker_fleet_rack_and_domain() -> None:
    limits = BreakerLimits(fleet=0.1, rack=0.5, domain=0.25)
    fleet = peers(0, 100)
    assert breaker(Peer("x", "r1", None, False), fleet, limits) is None
    fleet = peers(10, 100)
    why = breaker(Peer("x", "r9", None, False), fleet, limits)
    assert why is not None and why.startswith("the fleet: 11 of 101")
    rack = peers(2, 4, "r2") + peers(0, 96, "r3")
    assert "rack r2" in (breaker(Peer("x", "r2", None, False), rack, limits) or "")
    domain = [Peer(f"t{i}", "r4", "clique-1", i < 4) for i in range(18)]
    why = breaker(Peer("t17", "r4", "clique-1", False), domain + peers(0, 200, "r5"),
                  BreakerLimits(fleet=0.5, rack=1.0, domain=0.25))
    assert why is not None and "NVLink domain clique-1: 5 of 18" in why
    # the floor: a lone node may always be repaired
    assert breaker(Peer("a", None, None, False), [], BreakerLimits(0.0, 0.0, 0.0)) is None
    assert breaker(Peer("a", None, None, False), [],
                   BreakerLimits(0.0, 0.0, 0.0, floor=0)) is not None


def test_cooldown_is_per_class() -> None:
    assert cooling_down("nvlink", 1000.0, H.NVLINK, 1500.0, 3600)
    assert not cooling_down("nvlink", 1000.0, H.NVLINK, 5000.0, 3600)
    assert not cooling_down("gpu-memory", 1000.0, H.NVLINK, 1500.0, 3600)
    assert not cooling_down(None, None, H.NVLINK, 1500.0, 3600)


def test_repair_record_round_trip_and_escalation_events() -> None:
    the_plan = plan(H.GPU_MEMORY, A.RESET_GPU)
    assert the_plan is not None
    facts = {"system": {"serial": "SN1"},
             "gpus": [{"pci_address": "00000000:18:00.0", "name": "H100", "serial": "G1"}]}
    finding = Finding(H.GPU_MEMORY, A.RESET_GPU, "xid 94", Source.KERNEL_LOG, "0000:18:00")
    at = datetime(2025, 1, 1, tzinfo=UTC)
    record = RepairRecord.open(finding, the_plan, facts, serial=None, actor="health", at=at)
    assert record.serial == "SN1" and record.parts[0]["serial"] == "G1"
    record = record.with_result("reset_gpu", "failed: ecc", at).with_skip("restart_os")
    assert RepairRecord.from_facts({"repair": record.to_facts()}) == record
    assert next_state(S.REPAIRING, Event.ESCALATE) is S.SERVICE_REQUIRED
    assert next_state(S.REPAIRING, Event.DONE) is S.ACTIVE
    assert next_state(S.REPAIRING, Event.FAIL) is S.REPAIR_FAILED
    assert (S.REPAIRING, Event.REIMAGE) in TRANSITIONS
    assert HealthSettings(drain_deadline_s={"nvlink": 60}).drain_deadline_s["nvlink"] == 60
