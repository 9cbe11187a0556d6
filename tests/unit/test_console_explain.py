"""The why-not-schedulable chain (``provisioner.lifecycle.why``): pure, from a node, its
history and its NVLink domain's members."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from provisioner.domain import BmcEndpoint, HistoryEntry, Node
from provisioner.ids import NodeId
from provisioner.lifecycle.states import NodeState as S
from provisioner.lifecycle.why import LINKS, Status, explain, rank
from provisioner.validation.domain import Member, Standing

NOW = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
GPUS = {"gpus": [{"name": "NVIDIA GB200"}] * 4}
CLIQUE = "c0ffee.1"


def node(state: S, *, power: str | None = "on", bmc: bool = True, last_error: str = "",
         facts: dict[str, Any] | None = None, checkpoint: tuple[str, ...] = (),
         name: str = "n1") -> Node:
    return Node(id=NodeId(name + "-id"), state=state, hostname=name, serial=None, macs=(),
                maintenance=False, maintenance_reason="", profile="p", rack=None,
                position=None, facts=facts or {}, last_error=last_error,
                checkpoint=checkpoint, version=1, history_seq=1,
                bmc=BmcEndpoint("ipmi", "10.0.0.9") if bmc else None, created_at=NOW,
                updated_at=NOW, power_state=power)


def history(*states: S) -> list[HistoryEntry]:
    out, before = [], "enrolled"
    for seq, state in enumerate(states, 1):
        out.append(HistoryEntry(NodeId("n1-id"), seq, "done", before, str(state), "conductor",
                                "", NOW))
        before = str(state)
    return out


def record(passed: bool, *, failures: tuple[str, ...] = (), clique: str | None = None,
           ) -> dict[str, Any]:
    return {"validation": {"passed": passed, "at": NOW.isoformat(), "failures": list(failures),
                           "clique": clique, "domain_nodes": 2 if clique else None,
                           "checks": ["gpu_count"]}, "last_report": GPUS}


def statuses(n: Node, members: list[Member] | None = None,
             hist: list[HistoryEntry] | None = None) -> dict[str, str]:
    chain = explain(n, hist or [], members or [])
    return {link.key: str(link.status) for link in chain.links}


def test_an_active_node_holds_every_link_with_evidence() -> None:
    n = node(S.ACTIVE, facts=record(True))
    chain = explain(n, history(S.DEPLOYING, S.CONFIGURING, S.JOINING, S.VALIDATING,
                               S.REGISTERING, S.ACTIVE), [], block="b1")
    assert [link.key for link in chain.links] == [key for key, _ in LINKS]
    assert {link.status for link in chain.links} == {Status.OK}
    assert chain.first_failing is None
    slurm = chain.links[-1]
    assert "registering → active" in slurm.evidence and "published topology: b1" in slurm.evidence
    assert not any(link.todo for link in chain.links)


@pytest.mark.parametrize(("state", "error", "first"), [
    (S.DEPLOY_FAILED, "image checksum mismatch", "boot"),
    (S.DEPLOY_FAILED, "BMC unreachable: timeout after 20 s", "bmc"),
    (S.CONFIGURE_FAILED, "ansible: task 'apt' failed", "callback"),
    (S.JOIN_FAILED, "node not Ready after 600 s", "kube"),
    (S.REGISTER_FAILED, "slurmd never registered", "slurm"),
])
def test_a_failed_step_fails_its_link_with_the_reason(state: S, error: str,
                                                      first: str) -> None:
    facts = record(True) if state is S.REGISTER_FAILED else {}
    chain = explain(node(state, last_error=error, facts=facts), history(state), [])
    assert chain.first_failing == first
    link = next(link for link in chain.links if link.key == first)
    assert link.status is Status.FAIL and error in link.evidence and link.todo


def test_a_failed_validation_lists_every_reason() -> None:
    failures = ("gpu_count: 7 GPUs, expected 8", "ib_rate: mlx5_3 at 200 Gb/s, expected 400")
    chain = explain(node(S.VALIDATE_FAILED, facts=record(False, failures=failures)), [], [])
    assert chain.first_failing == "validation"
    link = next(link for link in chain.links if link.key == "validation")
    assert all(f in link.evidence for f in failures)


def test_no_gpu_in_the_report_is_the_gpu_operators_link() -> None:
    facts = {"last_report": {"gpus": []}}
    assert explain(node(S.VALIDATING, facts=facts), [], []).first_failing == "gpu"


def test_a_powered_off_node_fails_at_power_and_no_bmc_is_unknown() -> None:
    assert explain(node(S.ACTIVE, power="off", facts=record(True)), [], []
                   ).first_failing == "power"
    waiting = explain(node(S.INSPECTED, power="off"), [], [])  # off until deployed: normal
    assert waiting.first_failing == "power" and waiting.links[1].status is Status.WAIT
    chain = explain(node(S.ENROLLED, bmc=False, power=None), [], [])
    assert statuses(node(S.ENROLLED, bmc=False, power=None))["bmc"] == "unknown"
    assert chain.first_failing == "boot"  # nothing fails; the first wait: not deployed


def test_the_domain_link_waits_for_pending_members_and_fails_on_failed_ones() -> None:
    me = node(S.VALIDATING, facts=record(True, clique=CLIQUE), checkpoint=("validate-node",))
    pending = Member("n2-id", "n2", CLIQUE, Standing.PENDING)
    failed = Member("n2-id", "n2", CLIQUE, Standing.FAILED, "ib_rate: low")
    assert statuses(me, [pending])["domain"] == "wait"
    chain = explain(me, [], [failed])
    assert chain.first_failing == "domain"
    assert "n2 (ib_rate: low)" in chain.links[7].evidence
    passed = Member("n2-id", "n2", CLIQUE, Standing.PASSED)
    assert statuses(me, [passed])["domain"] == "ok"


def test_rank_orders_failed_twins_with_their_step() -> None:
    assert rank(S.ENROLLED) == -1 < rank(S.DEPLOYING) == rank(S.DEPLOY_FAILED) \
        < rank(S.VALIDATE_FAILED) < rank(S.ACTIVE)
