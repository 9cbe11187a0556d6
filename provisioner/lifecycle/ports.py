"""The seams steps drive: Protocols only. ``daemon.py`` picks the concrete drivers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from provisioner.bmc.base import BmcFactory, SoftOff
from provisioner.domain import Node, Sanitised
from provisioner.errors import FatalError
from provisioner.lifecycle.rack_limit import RackBmcLimit
from provisioner.lifecycle.service_ports import NoServicing, Servicing
from provisioner.lifecycle.stagger import PowerOnStagger
from provisioner.validation.record import ValidationRecord


class Inspector(Protocol):
    """Boots a node into inspection and returns the facts its agent reported."""

    async def inspect(self, node: Node) -> dict[str, Any]: ...


class Installer(Protocol):
    """Writes the OS and configures it. ``generation`` names one deployment, for idempotency."""

    async def deploy_image(self, node: Node, generation: str) -> None: ...

    async def configure(self, node: Node, generation: str) -> None: ...

    async def collect_facts(self, node: Node, generation: str) -> None:
        """Collect and report the configured node's facts again (the ``facts`` role)."""
        ...

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        """Erase every disk of the net-booted node but ``skip`` (device names) by the
        strongest method each supports, verified; one result per disk. ``generation`` names
        the job: asked again (a daemon restart), the agent answers without erasing again."""
        ...

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        """Build md arrays (``{"name", "level", "members"}``) on the net-booted node with
        mdadm (the agent's ``storage`` job); an array already there is left alone. The
        agent's answer: ``ok``, ``arrays`` (each: array, level, members, state, created or
        error), ``mdstat``. Asked again under the same ``generation``, it answers from
        memory."""
        ...


class KubeJoiner(Protocol):
    async def join(self, node: Node) -> None: ...

    async def maintenance(self, node: Node, on: bool, reason: str) -> None:
        """On: cordon and drain the node's workloads. Off: uncordon."""
        ...

    async def remove(self, node: Node) -> None: ...


class SlurmRegistrar(Protocol):
    async def register(self, node: Node) -> None: ...

    async def remove(self, node: Node) -> None: ...


class Repairer(Protocol):
    """The repair ladder's reach into a node (``lifecycle/repair_step.py``); the BMC rung
    uses ``Ports.bmc``, the reimage rung the deploy step."""

    async def drain(self, node: Node, reason: str, wait_jobs_s: float) -> str:
        """Drain in Slurm and cordon in Kubernetes with ``reason``, the same text in both;
        let running jobs end for up to ``wait_jobs_s`` (0: not at all), then evict the
        pods. Idempotent. Returns "" when no job was left, else what still ran."""
        ...

    async def undrain(self, node: Node) -> None:
        """Resume in Slurm, uncordon in Kubernetes (what ``drain`` set, nothing else)."""
        ...

    async def reset_gpus(self, node: Node) -> None:
        """``nvidia-smi -r`` of every GPU, over the daemon's channel to the node (Ansible)."""
        ...

    async def restart_os(self, node: Node) -> None:
        """Reboot the OS and return once it answers again."""
        ...

    async def wait_os(self, node: Node) -> None:
        """Return once the node's OS answers (after a power cycle through the BMC)."""
        ...


class NoRepairs:
    """Where no repair driver is wired: every rung fails, naming what is missing."""

    async def drain(self, node: Node, reason: str, wait_jobs_s: float) -> str:
        raise FatalError("no repair driver wired: cannot drain")

    async def undrain(self, node: Node) -> None:
        raise FatalError("no repair driver wired: cannot undrain")

    async def reset_gpus(self, node: Node) -> None:
        raise FatalError("no repair driver wired: cannot reset GPUs")

    async def restart_os(self, node: Node) -> None:
        raise FatalError("no repair driver wired: cannot restart the OS")

    async def wait_os(self, node: Node) -> None:
        raise FatalError("no repair driver wired: cannot reach the OS")


Note = Callable[[str, str], Awaitable[None]]
"""Writes one history row for the node whose step runs: (event, reason)."""
Recollect = Callable[[ValidationRecord], Awaitable[Node]]
"""Keeps the record so far, has the node's facts collected again, returns the node anew."""


class Validator(Protocol):
    """The ``validating`` step's seam (see ``lifecycle/validation.py``)."""

    async def check(self, node: Node) -> ValidationRecord:
        """The node's own checks against its profile; never waits for other nodes."""
        ...

    async def wait_domain(self, node: Node, record: ValidationRecord, note: Note) -> None:
        """Return once every node of ``record.clique`` passed; ``note`` the wait."""
        ...

    async def check_sku(self, node: Node) -> ValidationRecord:
        """The SKU gate: the inspection facts against the profile's hardware
        (``provisioner.validation.sku``)."""
        ...

    async def settle(self, node: Node, record: ValidationRecord, since: datetime,
                     recollect: Recollect, note: Note) -> ValidationRecord:
        """While ``record`` is ``settling`` (the NVSwitch fabric still trains), have the
        facts collected again (``recollect``) and check them, until the record is no longer
        settling or the settle deadline, counted from ``since``, passed; the last record."""
        ...


class AcceptAll:
    """Passes every node without looking: the Validator where none is wired (tests of the
    other steps); daemon.py wires the real one."""

    async def check(self, node: Node) -> ValidationRecord:
        return ValidationRecord(passed=True, at=datetime.now(UTC).isoformat())

    async def wait_domain(self, node: Node, record: ValidationRecord, note: Note) -> None:
        return None

    async def check_sku(self, node: Node) -> ValidationRecord:
        return ValidationRecord(passed=True, at=datetime.now(UTC).isoformat())

    async def settle(self, node: Node, record: ValidationRecord, since: datetime,
                     recollect: Recollect, note: Note) -> ValidationRecord:
        return record


@dataclass(frozen=True, slots=True)
class AcceptanceOutcome:
    """A domain's fabric acceptance as one of its nodes sees it."""

    run_id: str
    domain: str
    passed: bool
    summary: str


class Acceptance(Protocol):
    """Fabric acceptance of a node's NVLink domain, after the domain gate and before
    ``registering`` (``lifecycle/acceptance.py``)."""

    async def accept(self, node: Node, record: ValidationRecord,
                     note: Note) -> AcceptanceOutcome | None:
        """Run (or join, or reuse) the acceptance of the node's domain and return its
        result; None: the node's profile asks for none."""
        ...


class NoAcceptance:
    """No profile asks for acceptance: the default where none is wired."""

    async def accept(self, node: Node, record: ValidationRecord,
                     note: Note) -> AcceptanceOutcome | None:
        return None


class BootWaiter(Protocol):
    """Waits for a deployed OS to report that it is up (``lifecycle/callbacks.py``)."""

    def uses_installer(self, node: Node) -> bool:
        """The node's profile is installed by an installer (autoinstall, preseed,
        kickstart), which calls back ``installed``, rather than written as an image."""
        ...

    def waits(self, node: Node) -> bool:
        """Whether ``wait_booted`` waits for this node (not for simulated nodes, nor with
        the wait turned off); a step that will not wait checkpoints nothing for it."""
        ...

    async def forget(self, node: Node) -> None:
        """Drop a report from an earlier boot: the node is about to be rebooted."""
        ...

    async def wait_booted(self, node: Node) -> None: ...


class NoBootWait:
    """For wirings where no OS calls back (the simulated rack, tests): nothing to wait for."""

    def uses_installer(self, node: Node) -> bool:
        return False

    def waits(self, node: Node) -> bool:
        return False

    async def forget(self, node: Node) -> None:
        return None

    async def wait_booted(self, node: Node) -> None:
        return None


class AgentJobQueue(Protocol):
    """Jobs waiting for nodes' agents: ``AgentService`` hands them out and takes the agents'
    reports; the image writer queues them (``install.images.AgentJobs`` implements it)."""

    def pending(self, node_id: str) -> dict[str, Any] | None: ...

    def seed(self, node_id: str, generation: str) -> bytes | None:
        """The cloud-init seed of the node's pending deploy job, if it names ``generation``."""
        ...

    def complete(self, node_id: str, generation: str, ok: bool, error: str,
                 report: dict[str, Any] | None = None) -> bool:
        """Settle the node's job for ``generation`` (``report``: the agent's whole answer);
        False when there is none."""
        ...


class NoAgentJobs:
    """For wirings with no image writer: no job is ever queued."""

    def pending(self, node_id: str) -> dict[str, Any] | None:
        return None

    def seed(self, node_id: str, generation: str) -> bytes | None:
        return None

    def complete(self, node_id: str, generation: str, ok: bool, error: str,
                 report: dict[str, Any] | None = None) -> bool:
        return False


HttpBootUri = Callable[[Node], str | None]
"""A node's UEFI HTTP boot file URI (``boot.policy.uefi_http_boot_uri``); None: unknown."""


def no_http_boot_uri(_node: Node) -> str | None:
    return None


def default_soft_off(_node: Node) -> SoftOff:
    return SoftOff()


@dataclass(frozen=True, slots=True)
class Ports:
    bmc: BmcFactory
    inspector: Inspector
    installer: Installer
    kube: KubeJoiner
    slurm: SlurmRegistrar
    stagger: PowerOnStagger = field(default_factory=PowerOnStagger.unlimited)
    """Per-rack power-on stagger (inrush); the default waits for nothing."""
    rack_bmc: RackBmcLimit = field(default_factory=RackBmcLimit.unlimited)
    """How many BMCs of one rack the steps drive at once; the default: no limit."""
    boots: BootWaiter = field(default_factory=NoBootWait)
    """The deployed OS's "booted"/"installed" callback (``BootCallbacks`` in the daemon)."""
    validator: Validator = field(default_factory=AcceptAll)
    """The validation gate; the default passes every node."""
    acceptance: Acceptance = field(default_factory=NoAcceptance)
    """Fabric acceptance of a domain before ``registering``; the default runs none."""
    soft_off: Callable[[Node], SoftOff] = default_soft_off
    """How a node's soft power-off may end (daemon: ``bmc.profiles``)."""
    rotate_bmc: Callable[[Node], Awaitable[None]] | None = None
    """Inspection's last sub-step for nodes whose profile opts in (``bmc.profiles.<p>.
    rotate_credentials``): rotate the BMC password. None: never."""
    repairs: Repairer = field(default_factory=NoRepairs)
    """The repair ladder's drains and in-band rungs (daemon: Slurm, Kubernetes, Ansible)."""
    servicing: Servicing = field(default_factory=NoServicing)
    """Runbooks, baselines and the BMC's servicing side (daemon: ``[servicing]``, Redfish)."""
    http_boot_uri: HttpBootUri = no_http_boot_uri
    """What a ``http`` boot override hands the BMC as ``HttpBootUri`` (daemon: the boot
    HTTP server's first stage for the node's architecture)."""
