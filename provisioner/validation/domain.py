"""The NVLink domain gate: a domain goes to Slurm only when all its nodes passed (a partial
NVL72 rack never receives multi-node jobs). Pure: decides from a snapshot of the members.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

_NAMED: Final = 8  # nodes named in a line; the rest are counted


class Standing(StrEnum):
    PASSED = "passed"    # past the gate, or validating with this run's passing record
    PENDING = "pending"  # validating, own checks not done yet
    FAILED = "failed"    # validate_failed: the domain is held until it passes


@dataclass(frozen=True, slots=True)
class Member:
    """One node that names ``clique`` as its NVLink domain."""

    node_id: str
    name: str
    clique: str
    standing: Standing
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DomainStatus:
    clique: str
    passed: tuple[str, ...]
    pending: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]  # (name, reason)
    expected: int | None

    @property
    def complete(self) -> bool:
        enough = self.expected is None or len(self.passed) >= self.expected
        return enough and not self.pending and not self.failed

    def waiting(self) -> str:
        """One line: who the domain waits for."""
        parts = []
        if self.pending:
            parts.append(f"{_names(self.pending)} still validating")
        if self.failed:
            parts.append(f"{_names(n for n, _ in self.failed)} failed validation")
        if self.expected is not None and len(self.passed) + len(self.pending) + len(
                self.failed) < self.expected:
            unseen = self.expected - len(self.passed) - len(self.pending) - len(self.failed)
            parts.append(f"{unseen} node(s) not yet seen")
        count = f" of {self.expected}" if self.expected is not None else ""
        return (f"NVLink domain {self.clique}: {len(self.passed)}{count} nodes passed; "
                f"waiting for {', '.join(parts) or 'nothing'}")

    def held(self) -> list[str]:
        """One line per failed member: why the domain is held."""
        return [f"NVLink domain {self.clique} held: {name} failed validation: {reason}"
                for name, reason in self.failed]


def domain_status(clique: str, me: Member, members: Iterable[Member],
                  expected: int | None) -> DomainStatus:
    """The domain as ``members`` shows it, with ``me`` (which passed) in it whatever the
    snapshot says: a snapshot taken before my own record was written must not hold me."""
    others = [m for m in members if m.clique == clique and m.node_id != me.node_id]
    everyone = sorted([me, *others], key=lambda m: m.name)
    return DomainStatus(
        clique=clique,
        passed=tuple(m.name for m in everyone if m.standing is Standing.PASSED),
        pending=tuple(m.name for m in everyone if m.standing is Standing.PENDING),
        failed=tuple((m.name, m.reason) for m in everyone if m.standing is Standing.FAILED),
        expected=expected)


def _names(names: Iterable[str]) -> str:
    listed: Sequence[str] = list(names)
    shown = ", ".join(listed[:_NAMED])
    return shown if len(listed) <= _NAMED else f"{shown} and {len(listed) - _NAMED} more"
