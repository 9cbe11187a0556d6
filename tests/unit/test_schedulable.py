"""``lifecycle.schedulable.why``: the steps behind the console's chain, ``GET
/api/v1/nodes/{id}/why`` and ``provisioner node why`` (pure: a node, its history, what the
caller read)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from provisioner.health.model import Action, HealthClass
from provisioner.health.records import FindingRecord, Origin
from provisioner.lifecycle.schedulable import HOLDS, why
from provisioner.lifecycle.states import NodeState as S
from provisioner.lifecycle.why import LINKS, Seen, SlurmSeen
from tests.unit.test_console_explain import NOW, history, node, record

ACTIVE_PATH = (S.DEPLOYING, S.CONFIGURING, S.JOINING, S.VALIDATING, S.REGISTERING, S.ACTIVE)


def finding(action: Action, *, silenced: bool = False) -> FindingRecord:
    return FindingRecord(
        id=1, node_id="n1-id", origin=Origin.EXTERNAL, cls=HealthClass.GPU_MEMORY,
        action=action, evidence="XID 79: GPU has fallen off the bus", subject="GPU 3",
        first_seen=NOW, last_seen=NOW, count=1,
        silenced_until=NOW + timedelta(hours=1) if silenced else None)


def test_an_active_node_is_schedulable_with_every_step_in_order() -> None:
    answer = why(node(S.ACTIVE, facts=record(True)), history(*ACTIVE_PATH), [],
                 Seen(slurm=SlurmSeen("IDLE"), now=NOW))
    assert [s.key for s in answer.steps] == [k for k, _ in HOLDS] + [k for k, _ in LINKS]
    assert answer.schedulable and answer.first_blocking is None
    out = answer.as_json()
    assert out["schedulable"] is True and not any(s["blocking"] for s in out["steps"])
    slurm = next(s for s in out["steps"] if s["key"] == "slurm")
    assert slurm["evidence"] == "slurmctld: IDLE"


def test_maintenance_blocks_with_its_reason_and_what_to_do() -> None:
    held = dataclasses.replace(node(S.ACTIVE, facts=record(True)), maintenance=True,
                               maintenance_reason="RMA 1234: PSU")
    answer = why(held, history(*ACTIVE_PATH), [])
    assert not answer.schedulable and answer.first_blocking == "maintenance"
    step = answer.steps[1]
    assert step.evidence == "in maintenance: RMA 1234: PSU" and "maintenance-off" in step.todo


def test_slurm_drain_reason_blocks_an_active_node() -> None:
    seen = Seen(slurm=SlurmSeen("IDLE+DRAIN", "xid 79", draining=True))
    answer = why(node(S.ACTIVE, facts=record(True)), history(*ACTIVE_PATH), [], seen)
    assert answer.first_blocking == "slurm"
    assert answer.steps[-1].evidence == "slurmctld: IDLE+DRAIN (xid 79)"
    unknown = why(node(S.ACTIVE, facts=record(True)), [], [], Seen(slurm=SlurmSeen(None)))
    assert unknown.first_blocking == "slurm"
    away = why(node(S.ACTIVE, facts=record(True)), [], [],
               Seen(slurm=SlurmSeen(None, error="connection refused")))
    assert away.schedulable and "not asked: connection refused" in away.steps[-1].evidence


def test_health_findings_that_need_action_block_silenced_ones_do_not() -> None:
    n = node(S.ACTIVE, facts=record(True))
    blocked = why(n, [], [], Seen(findings=[finding(Action.RESET_GPU)], now=NOW))
    assert blocked.first_blocking == "health"
    assert "gpu-memory GPU 3: XID 79" in blocked.steps[3].evidence
    assert "reset_gpu" in blocked.steps[3].todo
    quiet = why(n, [], [], Seen(findings=[finding(Action.RESET_GPU, silenced=True),
                                          finding(Action.NONE)], now=NOW))
    assert quiet.schedulable and quiet.steps[3].evidence == (
        "1 open, none needing action (1 silenced)")


def test_a_gate_holds_an_inspected_node_before_the_path_waits() -> None:
    n = node(S.INSPECTED, power="off")
    answer = why(n, [], [], Seen(os_held=("/dev/sda1: ext4 (Debian 12)",)))
    assert answer.first_blocking == "gates"  # a failure comes before a wait
    assert answer.steps[2].evidence == "existing OS: /dev/sda1: ext4 (Debian 12)"
    assert why(n, [], []).first_blocking == "power"  # no gate: deploy it (it is off)


def test_a_failed_step_is_named_before_the_state_that_sums_it_up() -> None:
    failed = node(S.JOIN_FAILED, last_error="node not Ready after 600 s")
    answer = why(failed, history(S.JOIN_FAILED), [])
    assert answer.steps[0].status == "fail" and answer.first_blocking == "kube"
    retired = why(node(S.RETIRED, power="off"), [], [], Seen(now=datetime.now(UTC)))
    assert retired.steps[0].evidence == "retired" and not retired.schedulable
