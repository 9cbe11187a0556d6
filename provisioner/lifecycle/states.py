"""Node states, events and the transition table (DESIGN §2). Pure: the standard library,
``provisioner.domain`` and ``provisioner.errors`` only.

``NodeState`` itself lives in ``provisioner.domain`` (the store and the drivers use it
without the lifecycle); it is re-exported here.

Stable states wait for a request or a policy; in-flight states (gerunds) run one step;
every in-flight state has a ``*_failed`` twin that records why it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from provisioner.domain import NodeState as NodeState
from provisioner.errors import InvalidTransition


class Event(StrEnum):
    INSPECT = "inspect"
    DEPLOY = "deploy"
    RETIRE = "retire"
    RETRY = "retry"
    REPAIR = "repair"      # a health finding (or an operator) starts the repair ladder
    ABORT = "abort"
    DONE = "done"
    FAIL = "fail"
    ESCALATE = "escalate"  # the repair ladder ran out of rungs: service_required
    REIMAGE = "reimage"    # re-provision (deploying): the repair ladder's last rung, or an
    #                        active node's runbook that ended in ``sanitise`` (its OS is gone)
    SERVICE = "service"    # run a runbook (provisioner.lifecycle.service_step)
    ONBOARDED = "onboarded"  # a new node's onboarding runbook passed: on to deploying
    REGISTER_RUNNING = "register_running"  # brownfield: the machine already runs its OS


S, E = NodeState, Event

#: in-flight state -> its failed twin
FAILED_TWIN: Final[Mapping[NodeState, NodeState]] = {
    S.INSPECTING: S.INSPECT_FAILED,
    S.DEPLOYING: S.DEPLOY_FAILED,
    S.CONFIGURING: S.CONFIGURE_FAILED,
    S.JOINING: S.JOIN_FAILED,
    S.VALIDATING: S.VALIDATE_FAILED,
    S.REGISTERING: S.REGISTER_FAILED,
    S.RETIRING: S.RETIRE_FAILED,
    S.REPAIRING: S.REPAIR_FAILED,
    S.SERVICING: S.SERVICE_FAILED,
}
IN_FLIGHT: Final[frozenset[NodeState]] = frozenset(FAILED_TWIN)
FAILED: Final[frozenset[NodeState]] = frozenset(FAILED_TWIN.values())
STABLE: Final[frozenset[NodeState]] = frozenset(NodeState) - IN_FLIGHT

#: where a successful step leads
_DONE: Final[Mapping[NodeState, NodeState]] = {
    S.INSPECTING: S.INSPECTED,
    S.DEPLOYING: S.CONFIGURING,
    S.CONFIGURING: S.JOINING,
    S.JOINING: S.VALIDATING,
    S.VALIDATING: S.REGISTERING,  # the node and its whole NVLink domain passed
    S.REGISTERING: S.ACTIVE,
    S.RETIRING: S.RETIRED,
    S.REPAIRING: S.ACTIVE,  # the validation gate passed after a rung: back in service
    S.SERVICING: S.ACTIVE,  # a drained node's runbook and the validation gate passed
}

#: stable states from which an operator may retire a node
_RETIRABLE: Final[frozenset[NodeState]] = frozenset(
    {S.DISCOVERED, S.ENROLLED, S.INSPECTED, S.ACTIVE, S.SERVICE_REQUIRED}
    | (FAILED - {S.RETIRE_FAILED})
)


def _build() -> dict[tuple[NodeState, Event], NodeState]:
    table: dict[tuple[NodeState, Event], NodeState] = {
        (S.DISCOVERED, E.INSPECT): S.INSPECTING,
        (S.ENROLLED, E.INSPECT): S.INSPECTING,
        (S.INSPECTED, E.INSPECT): S.INSPECTING,
        (S.RETIRED, E.INSPECT): S.INSPECTING,
        (S.INSPECTED, E.DEPLOY): S.DEPLOYING,
        (S.ACTIVE, E.DEPLOY): S.DEPLOYING,  # re-provision
        # the repair ladder (provisioner.health.ladder): drain, rungs, the gate after each
        (S.ACTIVE, E.REPAIR): S.REPAIRING,
        (S.SERVICE_REQUIRED, E.REPAIR): S.REPAIRING,  # the vendor swapped the part
        (S.SERVICE_REQUIRED, E.DEPLOY): S.DEPLOYING,
        (S.REPAIR_FAILED, E.DEPLOY): S.DEPLOYING,
        (S.REPAIRING, E.ESCALATE): S.SERVICE_REQUIRED,
        (S.REPAIRING, E.REIMAGE): S.DEPLOYING,
        # runbooks: a new node's onboarding (then deploying), or a drained active node's
        (S.INSPECTED, E.SERVICE): S.SERVICING,
        (S.ACTIVE, E.SERVICE): S.SERVICING,
        (S.SERVICING, E.ONBOARDED): S.DEPLOYING,
        (S.SERVICING, E.REIMAGE): S.DEPLOYING,  # an active node's runbook ended in sanitise
        (S.SERVICE_FAILED, E.DEPLOY): S.DEPLOYING,
        # brownfield adoption (Ironic's ``adopt``, MAAS's ``deployed=True``): a machine that
        # already runs its OS goes to active as it is: no inspection needed, no disk write
        (S.ENROLLED, E.REGISTER_RUNNING): S.ACTIVE,
        (S.INSPECTED, E.REGISTER_RUNNING): S.ACTIVE,
        (S.INSPECT_FAILED, E.REGISTER_RUNNING): S.ACTIVE,
    }
    for in_flight, failed in FAILED_TWIN.items():
        table[in_flight, E.DONE] = _DONE[in_flight]
        table[in_flight, E.FAIL] = failed
        table[in_flight, E.ABORT] = failed
        table[failed, E.RETRY] = in_flight
    for state in _RETIRABLE:
        table[state, E.RETIRE] = S.RETIRING
    return table


TRANSITIONS: Final[Mapping[tuple[NodeState, Event], NodeState]] = _build()

#: events only the step runner fires; operators use the others
INTERNAL_EVENTS: Final[frozenset[Event]] = frozenset({E.DONE, E.FAIL, E.ESCALATE,
                                                     E.REIMAGE, E.ONBOARDED,
                                                     E.SERVICE})


def allowed_events(state: NodeState) -> frozenset[Event]:
    return frozenset(event for (source, event) in TRANSITIONS if source == state)


def next_state(current: NodeState, event: Event) -> NodeState:
    """The state ``event`` leads to; InvalidTransition names the events an operator could
    send instead (``done``/``fail`` are the step runner's own)."""
    try:
        return TRANSITIONS[current, event]
    except KeyError:
        offered = allowed_events(current) - INTERNAL_EVENTS
        raise InvalidTransition(current, event, offered) from None
