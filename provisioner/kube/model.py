"""Plain values and errors of the Kubernetes integration; no ``kubernetes`` types, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from provisioner.errors import Conflict, FatalError, NotFound, RetryableError

# Keys the daemon owns on a Node (documented in docs/operator-guide.md, "Kubernetes").
PREFIX = "provisioner.io/"
LABEL_NODE_ID = PREFIX + "node-id"
LABEL_PROFILE = PREFIX + "profile"
LABEL_RACK = PREFIX + "rack"
LABEL_POSITION = PREFIX + "position"
ANNOTATION_SERIAL = PREFIX + "serial"
ANNOTATION_MACS = PREFIX + "macs"
ANNOTATION_MANAGED = PREFIX + "managed"
ANNOTATION_CORDON = PREFIX + "cordon-reason"  # set when the daemon cordoned the node
PROVIDER_ID_SCHEME = "provisioner://"

# GPU Operator contract (DESIGN.md §6).
LABEL_OPERANDS = "nvidia.com/gpu.deploy.operands"
LABEL_DRIVER = "nvidia.com/gpu.deploy.driver"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_CLIQUE = "nvidia.com/gpu.clique"
RESOURCE_GPU = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    @classmethod
    def parse(cls, text: str) -> Taint:
        """``KEY[=VALUE]:EFFECT`` (kubectl's notation)."""
        head, _, effect = text.rpartition(":")
        key, _, value = head.partition("=")
        return cls(key=key, effect=effect, value=value)

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""
    last_transition: datetime | None = None


@dataclass(frozen=True, slots=True)
class ConfigMapInfo:
    namespace: str
    name: str
    resource_version: str
    data: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    resource_version: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    provider_id: str = ""
    conditions: tuple[Condition, ...] = ()
    allocatable: dict[str, str] = field(default_factory=dict)

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def ready(self) -> bool:
        cond = self.condition("Ready")
        return cond is not None and cond.status == "True"


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    node_name: str
    owner_kinds: tuple[str, ...] = ()
    mirror: bool = False
    deleting: bool = False
    phase: str = ""


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What ``kube-public/cluster-info`` publishes: where the API is, which CA signs it."""

    server: str
    ca_pem: bytes


@dataclass(frozen=True, slots=True)
class NodeWatch:
    """What a watch of Nodes saw: its events in order (``ADDED``, ``MODIFIED`` or
    ``DELETED`` with the Node), the resource version to watch on from, and whether the
    version asked for was too old (410 Gone: list again)."""

    events: tuple[tuple[str, NodeInfo], ...]
    resource_version: str
    expired: bool = False


@dataclass(slots=True)
class ClientStats:
    """Counters of one client: requests sent, retried (429/5xx/connection), failed, and
    answered 409 (a write raced another writer; the caller reads again)."""

    requests: int = 0
    retries: int = 0
    failures: int = 0
    conflicts: int = 0
    throttled: int = 0  # requests that waited for the client-side rate limiter


class KubeNotFound(NotFound):
    pass


class KubeConflict(Conflict):
    pass


class KubeUnavailable(RetryableError):
    """429, 5xx or a connection error that outlived the client's retries."""


class KubeForbidden(FatalError):
    """401/403: our credentials are wrong or lack a permission; retrying cannot help."""


class KubeRejected(FatalError):
    """The apiserver refused the request as invalid (400/422)."""


class EvictionBlocked(RetryableError):
    """The Eviction API answered 429: a PodDisruptionBudget allows no disruption now."""

    def __init__(self, pod: str, pdb: str, detail: str) -> None:
        super().__init__(f"eviction of {pod} blocked by PodDisruptionBudget {pdb}: {detail}")
        self.pod = pod
        self.pdb = pdb


class KubeTimeout(RetryableError):
    """A wait ended before the condition held; the message names what is missing."""
