"""The error tree. Domain errors know nothing about HTTP: api/app.py maps them to status codes."""

from __future__ import annotations

from collections.abc import Iterable


class ProvisionerError(Exception):
    """Base of every error the daemon raises on purpose."""


class NotFound(ProvisionerError):
    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} {key!r} not found")
        self.kind = kind
        self.key = key


class Conflict(ProvisionerError):
    """The request is valid but clashes with the current state of the resource."""


class InvalidTransition(Conflict):
    def __init__(self, state: str, event: str, allowed: Iterable[str]) -> None:
        self.state = str(state)
        self.event = str(event)
        self.allowed = sorted(str(name) for name in allowed)
        allowed_text = ", ".join(self.allowed) or "none"
        super().__init__(
            f"event {self.event!r} is not allowed in state {self.state!r} "
            f"(allowed: {allowed_text})"
        )


class NodeBusy(Conflict):
    """Another writer changed the node between our read and our write."""


class StoreUnavailable(ProvisionerError):
    """The database stayed unreachable longer than the store retries a call."""


class Fenced(NodeBusy):
    """This daemon lost the node's lease (another daemon claimed it): its write is refused."""


class InvalidRequest(ProvisionerError):
    """Input that is well-formed but semantically wrong."""


class ConfigError(ProvisionerError):
    """The configuration is missing or invalid; the message names the key."""


class SchemaError(ProvisionerError):
    """The database schema is not the one this version of the daemon understands."""


class DriverError(ProvisionerError):
    """A driver (BMC, installer, Kubernetes, Slurm) failed."""


class RetryableError(DriverError):
    """A failure that may go away on its own: timeouts, unreachable peers."""


class FatalError(DriverError):
    """A failure retrying cannot fix: wrong credentials, unsupported hardware."""


class StepAborted(ProvisionerError):
    """An operator aborted the in-flight step."""
