"""``StepOutcome``: a step that ends in a transition other than ``done``/``fail``.

The repair ladder's step ends in ``done`` (the gate passed: ``active``), ``escalate`` (out
of rungs: ``service_required``) or ``reimage`` (its last rung is the deploy path). It raises
this with the event; the step runner writes that event as the step's outcome.
"""

from __future__ import annotations

from provisioner.errors import ProvisionerError
from provisioner.lifecycle.states import Event


class StepOutcome(ProvisionerError):
    def __init__(self, event: Event, reason: str) -> None:
        super().__init__(reason)
        self.event = event
