"""What the judge says about one figure of one test, and the error for input it cannot read."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import ProvisionerError


class AcceptanceInputError(ProvisionerError):
    """Text that is none of the outputs the judge reads (or is empty): the message says which."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One judged figure: ``<test> <figure> <value> floor <floor> PASS|FAIL <reason>``.

    ``value`` and ``floor`` are already formatted with their unit (``476.96GB/s``); ``floor``
    is ``-`` where the figure is a condition rather than a number (``#wrong``, the algorithm,
    DCGM's verdict)."""

    test: str
    figure: str
    value: str
    floor: str
    passed: bool
    reason: str

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"{self.test} {self.figure} {self.value} floor {self.floor} {verdict} {self.reason}"


def fmt(value: float, unit: str) -> str:
    return f"{value:.2f}{unit}"
