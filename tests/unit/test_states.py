"""The transition table: every allowed pair, and every refused pair refused with a reason."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from provisioner.errors import InvalidTransition
from provisioner.lifecycle import statesdoc
from provisioner.lifecycle.states import (
    FAILED,
    FAILED_TWIN,
    IN_FLIGHT,
    STABLE,
    TRANSITIONS,
    Event,
    NodeState,
    allowed_events,
    next_state,
)

S, E = NodeState, Event

EXPECTED: dict[tuple[NodeState, Event], NodeState] = {
    (S.DISCOVERED, E.INSPECT): S.INSPECTING,
    (S.ENROLLED, E.INSPECT): S.INSPECTING,
    (S.INSPECTED, E.INSPECT): S.INSPECTING,
    (S.RETIRED, E.INSPECT): S.INSPECTING,
    (S.INSPECTING, E.DONE): S.INSPECTED,
    (S.INSPECTED, E.DEPLOY): S.DEPLOYING,
    (S.ACTIVE, E.DEPLOY): S.DEPLOYING,
    (S.DEPLOYING, E.DONE): S.CONFIGURING,
    (S.CONFIGURING, E.DONE): S.JOINING,
    (S.JOINING, E.DONE): S.VALIDATING,
    (S.VALIDATING, E.DONE): S.REGISTERING,
    (S.REGISTERING, E.DONE): S.ACTIVE,
    (S.RETIRING, E.DONE): S.RETIRED,
    # the repair ladder (issue 24)
    (S.ACTIVE, E.REPAIR): S.REPAIRING,
    (S.SERVICE_REQUIRED, E.REPAIR): S.REPAIRING,
    (S.REPAIRING, E.DONE): S.ACTIVE,
    (S.REPAIRING, E.ESCALATE): S.SERVICE_REQUIRED,
    (S.REPAIRING, E.REIMAGE): S.DEPLOYING,
    (S.SERVICE_REQUIRED, E.DEPLOY): S.DEPLOYING,
    (S.REPAIR_FAILED, E.DEPLOY): S.DEPLOYING,
    # servicing runbooks (issue 25): onboarding before deploying, or a drained active node
    (S.INSPECTED, E.SERVICE): S.SERVICING,
    (S.ACTIVE, E.SERVICE): S.SERVICING,
    (S.SERVICING, E.DONE): S.ACTIVE,
    (S.SERVICING, E.ONBOARDED): S.DEPLOYING,
    (S.SERVICING, E.REIMAGE): S.DEPLOYING,  # a runbook that ended in sanitise
    (S.SERVICE_FAILED, E.DEPLOY): S.DEPLOYING,
    # brownfield adoption (issue 30): a machine that already runs its OS
    (S.ENROLLED, E.REGISTER_RUNNING): S.ACTIVE,
    (S.INSPECTED, E.REGISTER_RUNNING): S.ACTIVE,
    (S.INSPECT_FAILED, E.REGISTER_RUNNING): S.ACTIVE,
    **{(state, E.RETIRE): S.RETIRING for state in (
        S.DISCOVERED, S.ENROLLED, S.INSPECTED, S.ACTIVE, S.INSPECT_FAILED, S.DEPLOY_FAILED,
        S.CONFIGURE_FAILED, S.JOIN_FAILED, S.VALIDATE_FAILED, S.REGISTER_FAILED,
        S.SERVICE_REQUIRED, S.REPAIR_FAILED, S.SERVICE_FAILED)},
    **{(flight, E.FAIL): failed for flight, failed in FAILED_TWIN.items()},
    **{(flight, E.ABORT): failed for flight, failed in FAILED_TWIN.items()},
    **{(failed, E.RETRY): flight for flight, failed in FAILED_TWIN.items()},
}


def test_table_is_exactly_the_design() -> None:
    assert dict(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED), ids=lambda v: str(v))
def test_allowed_pair(state: NodeState, event: Event) -> None:
    assert next_state(state, event) == EXPECTED[state, event]


REFUSED = sorted(set(itertools.product(NodeState, Event)) - set(EXPECTED))


@pytest.mark.parametrize(("state", "event"), REFUSED, ids=lambda v: str(v))
def test_refused_pair(state: NodeState, event: Event) -> None:
    with pytest.raises(InvalidTransition) as info:
        next_state(state, event)
    assert info.value.state == state
    offered = allowed_events(state) - {E.DONE, E.FAIL, E.ESCALATE, E.REIMAGE,
                                       E.ONBOARDED, E.SERVICE}
    assert set(info.value.allowed) == {str(e) for e in offered}
    assert f"state {str(state)!r}" in str(info.value)


def test_every_in_flight_state_has_a_failed_twin_and_a_way_out() -> None:
    assert frozenset(FAILED_TWIN) == IN_FLIGHT
    for state in IN_FLIGHT:
        assert {E.DONE, E.FAIL, E.ABORT} <= allowed_events(state)
        assert not allowed_events(state) & {E.INSPECT, E.DEPLOY, E.RETIRE, E.RETRY}
    for failed in FAILED:
        assert E.RETRY in allowed_events(failed)


def test_partition_of_states() -> None:
    assert frozenset(NodeState) == STABLE | IN_FLIGHT
    assert not STABLE & IN_FLIGHT
    assert FAILED <= STABLE


def test_state_values_are_lower_snake() -> None:
    for state in NodeState:
        assert str(state) == state.value == state.value.lower()
        assert " " not in state.value


def test_docs_states_md_is_current() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "states.md"
    assert doc.read_text() == statesdoc.render(), (
        "docs/states.md is stale: python -m provisioner.lifecycle.statesdoc > docs/states.md")
