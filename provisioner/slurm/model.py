"""Plain values and errors of the Slurm integration, and the ``SlurmClient`` seam both
backends (slurmrestd, scontrol) implement. No I/O here.

A Slurm node state is one base state (IDLE, ALLOCATED, MIXED, DOWN, ...) plus flags
(DRAIN, NOT_RESPONDING, INVALID_REG, ...); every API version spells them differently, the
parsers in ``parse.py`` turn each spelling into a ``SlurmNode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from provisioner.errors import FatalError, RetryableError

BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
# A node in one of these is known to slurmctld but its slurmd has not (validly) registered.
UNREGISTERED_BASES = frozenset({"DOWN", "FUTURE", "UNKNOWN"})
UNREGISTERED_FLAGS = frozenset({"NOT_RESPONDING", "INVALID_REG", "FUTURE"})


class SlurmUnavailable(RetryableError):
    """slurmctld/slurmrestd unreachable, timing out, or answering 5xx."""


class SlurmTimeout(RetryableError):
    """A wait on Slurm (registration, drain) ran past its deadline."""


class SlurmAuthFailed(FatalError):
    """The JWT (or the user running scontrol) is refused."""


class SlurmRejected(FatalError):
    """Slurm understood the request and refused it."""


class SlurmParseError(FatalError):
    """An answer that is not what this Slurm API version documents."""


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    state: str  # the base state, upper-case ("IDLE")
    flags: frozenset[str] = field(default_factory=frozenset)
    reason: str = ""
    reason_user: str = ""
    gres: str = ""  # as registered: "gpu:h100:8(S:0-1)", "" for (null)
    features: frozenset[str] = field(default_factory=frozenset)

    @property
    def registered(self) -> bool:
        """slurmd registered and is answering (DESIGN.md §2: ``registering`` ends here)."""
        return self.not_registered_because() is None

    def not_registered_because(self) -> str | None:
        if self.state in UNREGISTERED_BASES:
            return f"state {self.state_text}"
        if bad := self.flags & UNREGISTERED_FLAGS:
            return f"state {self.state_text} ({', '.join(sorted(bad))})"
        return None

    @property
    def draining(self) -> bool:
        """Marked DRAIN (jobs may still run)."""
        return "DRAIN" in self.flags

    @property
    def drained(self) -> bool:
        """DRAIN and no job left (sinfo's ``drained``): safe to evict the pods."""
        return (self.draining and self.state in ("IDLE", "DOWN")
                and "COMPLETING" not in self.flags)

    @property
    def state_text(self) -> str:
        return "+".join([self.state, *sorted(self.flags)])


class SlurmClient(Protocol):
    """One Slurm cluster, through slurmrestd or scontrol. Writes are idempotent."""

    async def nodes(self) -> list[SlurmNode]: ...

    async def node(self, name: str) -> SlurmNode | None:
        """The node, or None when slurmctld does not know it."""
        ...

    async def drain(self, name: str, reason: str) -> None: ...

    async def resume(self, name: str) -> None: ...

    async def delete(self, name: str) -> bool:
        """Delete a dynamic node; False when it did not exist."""
        ...

    async def aclose(self) -> None: ...
