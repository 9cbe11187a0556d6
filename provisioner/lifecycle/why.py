"""Why is this node (or NVLink domain) not schedulable? The one reasoning behind the
console's chain, ``GET /api/v1/nodes/{id}/why`` and ``provisioner node why``.

``explain`` walks the path BMC reachable → powered → booted → OS called back → Kubernetes
Ready → GPU operator ready → validation passed → whole domain passed → Slurm registered,
each link with its evidence (a history row, the validation record, the domain's members,
what slurmctld says now) and what to do when it is the first one that fails. ``why`` adds
what holds a node whatever its path: its lifecycle state, maintenance, the deploy gates
(SKU, an existing OS) and open health findings. Both are pure: they decide from a node, its
history, its domain's members and what the caller read (``Seen``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from provisioner.domain import HistoryEntry, Node
from provisioner.health.records import FindingRecord
from provisioner.lifecycle.states import FAILED, FAILED_TWIN, NodeState
from provisioner.lifecycle.validation import member_of, report_of
from provisioner.store.repo import NodeRepo
from provisioner.validation.domain import Member, Standing, domain_status
from provisioner.validation.record import ValidationRecord, passed_now

S = NodeState


class Status(StrEnum):
    OK = "ok"
    WAIT = "wait"        # in progress or not reached yet
    FAIL = "fail"
    UNKNOWN = "unknown"  # nothing to judge by (no BMC, never read)


@dataclass(frozen=True, slots=True)
class Link:
    key: str
    title: str
    status: Status
    evidence: str
    todo: str = ""


@dataclass(frozen=True, slots=True)
class Chain:
    links: tuple[Link, ...]

    @property
    def first_failing(self) -> str | None:
        """The first link that fails; else the first one still waiting; None: schedulable."""
        for wanted in (Status.FAIL, Status.WAIT):
            for link in self.links:
                if link.status is wanted:
                    return link.key
        return None

    def index(self, key: str | None) -> int:
        keys = [link.key for link in self.links]
        return keys.index(key) if key in keys else len(keys)


LINKS: Final = (("bmc", "BMC reachable"), ("power", "Powered on"), ("boot", "Booted its OS"),
                ("callback", "OS called back, configured"), ("kube", "Kubernetes Ready"),
                ("gpu", "GPU operator ready"), ("validation", "Validation passed"),
                ("domain", "Whole NVLink domain passed"),
                ("slurm", "Registered in Slurm"))
_PROGRESS: Final = (S.DEPLOYING, S.CONFIGURING, S.JOINING, S.VALIDATING, S.REGISTERING,
                    S.ACTIVE)
_TWIN_OF: Final = {failed: flying for flying, failed in FAILED_TWIN.items()}


def rank(state: NodeState) -> int:
    """How far along the path to active: -1 before deploying; a failed twin ranks as its
    in-flight state."""
    state = _TWIN_OF.get(state, state)
    return _PROGRESS.index(state) if state in _PROGRESS else -1


async def clique_members(repo: NodeRepo, node: Node) -> list[Member]:
    """The members of ``node``'s NVLink domain, as the validation gate sees them (read from
    that domain's nodes only)."""
    record = ValidationRecord.from_facts(node.facts)
    if record is None or record.clique is None:
        return []
    found = [member_of(n) for n in await repo.naming_clique(record.clique)]
    return [m for m in found if m is not None and m.clique == record.clique]


@dataclass(frozen=True, slots=True)
class SlurmSeen:
    """What slurmctld says of the node now, read by the caller."""

    state: str | None  # "IDLE+DRAIN"; None: slurmctld does not know the node
    reason: str = ""
    not_registered: str | None = None  # ``SlurmNode.not_registered_because()``
    draining: bool = False
    error: str = ""  # slurmctld could not be asked (then the rest is unknown)


@dataclass(frozen=True, slots=True)
class KubeSeen:
    """What the Kubernetes API server says of the node's Node now, read by the caller."""

    registered: bool
    ready: bool = False
    cordoned: str | None = None  # unschedulable: by whom or why (its annotation), else None
    missing_labels: tuple[str, ...] = ()  # ``key=value`` the node should carry and lacks
    error: str = ""  # the API server could not be asked (then the rest is unknown)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the caller read beyond the node and its history (each optional)."""

    block: str | None = None  # where the published topology puts it
    slurm: SlurmSeen | None = None
    kube: KubeSeen | None = None
    findings: Sequence[FindingRecord] = ()  # its open health findings
    os_held: tuple[str, ...] = ()  # ``Conductor.os_held``
    now: datetime | None = field(default=None)


def explain(node: Node, history: Sequence[HistoryEntry], members: Iterable[Member],
            *, block: str | None = None, slurm: SlurmSeen | None = None,
            kube: KubeSeen | None = None) -> Chain:
    ctx = _Facts(node, history)
    return Chain((_bmc(ctx), _power(ctx), _boot(ctx), _callback(ctx), _kube(ctx, kube),
                  _gpu(ctx),
                  _validation(ctx), _domain(ctx, members), _slurm(ctx, block, slurm)))


@dataclass(frozen=True, slots=True)
class _Facts:
    node: Node
    history: Sequence[HistoryEntry]

    @property
    def rank(self) -> int:
        return rank(self.node.state)

    @property
    def failed(self) -> bool:
        return self.node.state in FAILED

    def entered(self, state: NodeState) -> str:
        """The latest history row that entered ``state``, as evidence."""
        for entry in reversed(self.history):
            if entry.to_state == state and entry.from_state != state:
                return (f"#{entry.seq} {entry.at:%Y-%m-%d %H:%M:%S} {entry.from_state} → "
                        f"{entry.to_state} ({entry.event} by {entry.actor})")
        return f"state {self.node.state}"

    def failure(self, twin: NodeState) -> str:
        return f"{self.entered(twin)}: {self.node.last_error or 'no reason recorded'}"


def _link(key: str, status: Status, evidence: str, todo: str = "") -> Link:
    return Link(key, dict(LINKS)[key], status, evidence, todo if status is not Status.OK else "")


def _bmc(c: _Facts) -> Link:
    node = c.node
    if node.bmc is None:
        return _link("bmc", Status.UNKNOWN, "no BMC enrolled",
                     "enrol its BMC (driver, address, credentials) to power and boot it")
    where = f"{node.bmc.driver} {node.bmc.address}"
    if c.failed and "bmc" in node.last_error.lower():
        return _link("bmc", Status.FAIL, f"{where}: {node.last_error}",
                     "check the BMC's address, network and credentials, then Retry")
    if node.power_state is None:
        return _link("bmc", Status.UNKNOWN, f"{where}: not read yet",
                     "read its power state (Power: status) to check the BMC answers")
    return _link("bmc", Status.OK, f"{where}: answered, power {node.power_state}")


def _power(c: _Facts) -> Link:
    state = c.node.power_state
    if state == "on":
        return _link("power", Status.OK, "last read or set: on")
    if state == "off" and c.rank < 1:  # not deployed (or deploying): off is expected
        return _link("power", Status.WAIT, "last read or set: off (not deployed yet)",
                     "deploy it (a profile, then Deploy): deploying powers it on")
    if state == "off":
        return _link("power", Status.FAIL, "last read or set: off, but its OS should run",
                     "power it on (Power: on), then find out who switched it off")
    return _link("power", Status.UNKNOWN, "power state never read")


def _boot(c: _Facts) -> Link:
    node = c.node
    if c.rank >= 1 or (node.state is S.DEPLOYING and "write-image" in node.checkpoint):
        return _link("boot", Status.OK, c.entered(S.CONFIGURING) if c.rank >= 1
                     else "image written (checkpoint write-image)")
    if node.state is S.DEPLOY_FAILED:
        return _link("boot", Status.FAIL, c.failure(S.DEPLOY_FAILED),
                     "fix the cause above (image, boot server, BMC boot device), then Retry")
    if node.state is S.DEPLOYING:
        done = ", ".join(node.checkpoint) or "nothing yet"
        return _link("boot", Status.WAIT, f"deploying; done: {done}")
    todo = ("give it a profile and Deploy" if node.state is S.INSPECTED
            else "Inspect it, then Deploy")
    return _link("boot", Status.WAIT, f"not deployed (state {node.state})", todo)


def _callback(c: _Facts) -> Link:
    node = c.node
    if c.rank >= 2:
        return _link("callback", Status.OK, c.entered(S.JOINING))
    if node.state is S.CONFIGURE_FAILED:
        return _link("callback", Status.FAIL, c.failure(S.CONFIGURE_FAILED),
                     "read the Ansible failure above, fix it, then Retry")
    if node.state is S.CONFIGURING:
        return _link("callback", Status.WAIT, "called back; configuring (Ansible)")
    if node.state is S.DEPLOYING and {"booted", "installed"} & set(node.checkpoint):
        return _link("callback", Status.OK, "the OS called back (checkpoint booted)")
    return _link("callback", Status.WAIT, "waiting for the OS to call back",
                 "if it does not: check the node's console and its network path to the "
                 "daemon's boot HTTP server")


def _kube(c: _Facts, seen: KubeSeen | None) -> Link:
    node = c.node
    if c.rank >= 3 and seen is not None and not seen.error:
        return _kube_seen(seen)
    if c.rank >= 3:
        asked = f"; the API server not asked: {seen.error}" if seen and seen.error else ""
        return _link("kube", Status.OK, c.entered(S.VALIDATING) + asked)
    if node.state is S.JOIN_FAILED:
        return _link("kube", Status.FAIL, c.failure(S.JOIN_FAILED),
                     "check kubelet on the node (journalctl -u kubelet) and the join token, "
                     "then Retry")
    return _link("kube", Status.WAIT, "not joined yet" if node.state is not S.JOINING
                 else "joining: waiting for the Node to be Ready")


def _kube_seen(seen: KubeSeen) -> Link:
    if not seen.registered:
        return _link("kube", Status.FAIL, "no Node of this name in Kubernetes",
                     "check kubelet on the node; Retry joins it again")
    if not seen.ready:
        return _link("kube", Status.FAIL, "the Node is NotReady",
                     "journalctl -u kubelet on the node; kubectl describe node")
    if seen.cordoned is not None:
        return _link("kube", Status.FAIL, f"the Node is cordoned ({seen.cordoned})",
                     "kubectl uncordon once the reason is dealt with")
    if seen.missing_labels:
        return _link("kube", Status.FAIL, "the Node lacks labels: "
                     + ", ".join(seen.missing_labels[:8]),
                     "someone removed them: Retry, or kubectl label them back")
    return _link("kube", Status.OK, "the Node is Ready, schedulable, with its labels")


def _gpu(c: _Facts) -> Link:
    report: Mapping[str, Any] = report_of(c.node.facts)
    raw = report.get("gpus")
    gpus: list[Any] = raw if isinstance(raw, list) else []
    count = len(gpus)
    if c.rank < 3:
        return _link("gpu", Status.WAIT, "not reached yet")
    if raw is None and c.node.state is S.ACTIVE:  # registered running: never reported
        return _link("gpu", Status.UNKNOWN, "no GPU inventory reported")
    if count == 0:
        return _link("gpu", Status.FAIL, "the node's last report lists no GPU",
                     "check the GPU Operator's driver and device-plugin pods on the node "
                     "(kubectl -n gpu-operator get pods -o wide)")
    models = sorted({str(g.get("model") or g.get("name") or "?") for g in gpus
                     if isinstance(g, Mapping)})
    return _link("gpu", Status.OK, f"{count} GPUs reported ({', '.join(models)})")


def _validation(c: _Facts) -> Link:
    node = c.node
    record = ValidationRecord.from_facts(node.facts)
    if passed_now(node.state, node.facts, node.checkpoint):
        assert record is not None
        checks = ", ".join(record.checks) or "all checks"
        return _link("validation", Status.OK, f"passed at {record.at}: {checks}")
    if node.state is S.VALIDATE_FAILED or (record is not None and not record.passed
                                           and c.rank == 3):
        reasons = "; ".join(record.failures) if record and record.failures \
            else node.last_error or "no reason recorded"
        return _link("validation", Status.FAIL, reasons,
                     "fix or replace the hardware named above, then Retry validation")
    if c.rank >= 4:
        return _link("validation", Status.OK, c.entered(S.REGISTERING))
    return _link("validation", Status.WAIT, "not validated yet" if c.rank < 3
                 else "validating: running the checks")


def _domain(c: _Facts, members: Iterable[Member]) -> Link:
    node = c.node
    record = ValidationRecord.from_facts(node.facts)
    if record is None or record.clique is None:
        seen = "no multi-node NVLink domain reported" if record else "not validated yet"
        return _link("domain", Status.OK if c.rank >= 4 else Status.WAIT, seen)
    if c.rank >= 4:
        return _link("domain", Status.OK, f"NVLink domain {record.clique} complete")
    me = Member(node.id, node.hostname or node.id, record.clique,
                _standing(node, record))
    domain = domain_status(record.clique, me, members, record.domain_nodes)
    if domain.failed:
        names = ", ".join(f"{name} ({reason})" for name, reason in domain.failed)
        return _link("domain", Status.FAIL, f"{domain.waiting()}; failed: {names}",
                     "fix the failed member(s): the whole domain waits for them")
    if domain.complete:
        return _link("domain", Status.OK, domain.waiting())
    return _link("domain", Status.WAIT, domain.waiting())


def _standing(node: Node, record: ValidationRecord) -> Standing:
    if node.state is S.VALIDATE_FAILED or not record.passed:
        return Standing.FAILED
    return Standing.PASSED if passed_now(node.state, node.facts, node.checkpoint) \
        else Standing.PENDING


def _slurm(c: _Facts, block: str | None, seen: SlurmSeen | None) -> Link:
    node = c.node
    where = f"; in the published topology: {block}" if block else ""
    if node.state is S.ACTIVE and seen is not None and not seen.error:
        said = f"slurmctld: {seen.state}" + (f" ({seen.reason})" if seen.reason else "")
        if seen.state is None:
            return _link("slurm", Status.FAIL, "slurmctld does not know this node",
                         "Retry registration, or check the node's slurmd")
        if seen.not_registered is not None or seen.draining:
            return _link("slurm", Status.FAIL, said,
                         "scontrol show node; resume it once the reason is dealt with")
        return _link("slurm", Status.OK, said + where)
    if node.state is S.ACTIVE:
        slurmctld = f"; slurmctld not asked: {seen.error}" if seen and seen.error else ""
        return _link("slurm", Status.OK, c.entered(S.ACTIVE) + where + slurmctld)
    if node.state is S.REGISTER_FAILED:
        return _link("slurm", Status.FAIL, c.failure(S.REGISTER_FAILED),
                     "check slurmctld and the node's slurmd (scontrol show node), then Retry")
    if node.state is S.REGISTERING:
        return _link("slurm", Status.WAIT, "registering: waiting for slurmctld to see it")
    return _link("slurm", Status.WAIT, "not reached yet")
