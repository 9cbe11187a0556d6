"""One async function per in-flight state. Steps are idempotent and checkpoint sub-steps,
so a daemon killed at any moment resumes each one where it was."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Final, Protocol

from provisioner.bmc.base import Bmc, BootDevice, PowerState
from provisioner.domain import Node
from provisioner.errors import FatalError
from provisioner.lifecycle.erasure import sanitise_disks
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.repair_step import repair
from provisioner.lifecycle.service_step import service
from provisioner.lifecycle.states import NodeState
from provisioner.validation.record import KEY as VALIDATION_KEY
from provisioner.validation.record import NODE_CHECKED, ValidationRecord
from provisioner.validation.sku import CHECKED as SKU_CHECKED
from provisioner.validation.sku import HELD_EVENT as SKU_HELD
from provisioner.validation.sku import KEY as SKU_KEY
from provisioner.validation.sku import NOTE_EVENT as SKU_NOTE

DOMAIN_COMPLETE: Final = "nvlink-domain-complete"
FABRIC_ACCEPTED: Final = "fabric-accepted"
ACCEPTANCE_KEY: Final = "fabric_acceptance"
SETTLE_SINCE: Final = "fabric-settle-since:"


class StepContext(Protocol):
    @property
    def node(self) -> Node: ...

    @property
    def ports(self) -> Ports: ...

    @property
    def run_id(self) -> str:
        """Names this run of the step; new after a retry, and stable across a restart in
        the ``KEYED_STEPS`` (the only ones that may use it)."""
        ...

    async def bmc(self) -> Bmc: ...

    async def substep(self, name: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` unless the checkpoint says it finished; then checkpoint it."""
        ...

    def finished(self, name: str) -> bool:
        """Whether sub-step ``name`` is checkpointed (a wait outside a sub-step skips)."""
        ...

    async def merge_facts(self, facts: dict[str, Any]) -> None: ...

    async def update_facts(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """``change`` applied to the facts as stored now, under the node's row lock."""
        ...

    async def record(self, event: str, reason: str) -> None:
        """One history row for this node that changes no state."""
        ...

    async def note_power(self, state: str) -> None:
        """Remember the power state this step set (the power sync then sees no change)."""
        ...


Step = Callable[[StepContext], Awaitable[None]]


async def _boot_from(ctx: StepContext, device: BootDevice) -> None:
    bmc = await ctx.bmc()
    uri = ctx.ports.http_boot_uri(ctx.node) if device is BootDevice.HTTP else None
    await bmc.set_boot_device(device, http_uri=uri)


async def _power(ctx: StepContext, state: PowerState) -> None:
    """Idempotent and confirmed by read-back (the Bmc from ``Ports.bmc`` does both); a
    power-on waits for the rack's stagger only when the node really is off."""
    bmc = await ctx.bmc()
    if state is PowerState.ON and await bmc.power_state() is PowerState.OFF:
        await ctx.ports.stagger.wait(ctx.node)
    await bmc.set_power(state)
    await ctx.note_power(str(state))


async def _netboot(ctx: StepContext, prefix: str = "") -> None:
    """Boot from the network: next boot PXE, then off and on (each idempotent and
    checkpointed, unlike a reboot). A node without a BMC is already net-booted.
    ``prefix``: before each sub-step's name, for a step that netboots more than once (a
    runbook's ``sanitise`` after ``storage_layout``'s mdadm arrays)."""
    if ctx.node.bmc is None:
        return
    await ctx.substep(f"{prefix}bootdev-pxe", lambda: _boot_from(ctx, BootDevice.PXE))
    await ctx.substep(f"{prefix}power-off-for-netboot", lambda: _power(ctx, PowerState.OFF))
    await ctx.substep(f"{prefix}power-on", lambda: _power(ctx, PowerState.ON))


async def inspect(ctx: StepContext) -> None:
    """Netboot the ramdisk, collect its facts, check them against the profile's hardware
    (the SKU gate: a mismatch is written with every reason and holds the node in
    ``inspected``, see ``provisioner.validation.sku``), power off."""
    async def collect() -> None:
        await ctx.merge_facts(await ctx.ports.inspector.inspect(ctx.node))

    async def sku() -> None:
        record = await ctx.ports.validator.check_sku(ctx.node)
        if record.checks or not record.passed or SKU_KEY in ctx.node.facts:  # else: no SKU
            await ctx.merge_facts({SKU_KEY: record.to_facts()})
        for note in record.notes:  # what the gate could not check, for the operator
            await ctx.record(SKU_NOTE, note)
        if not record.passed:
            await ctx.record(SKU_HELD, f"does not match profile {ctx.node.profile}: "
                                       f"{record.reason}")

    await _netboot(ctx)
    await ctx.substep("collect-facts", collect)
    await ctx.substep(SKU_CHECKED, sku)
    if ctx.node.bmc is not None:
        await ctx.substep("power-off", lambda: _power(ctx, PowerState.OFF))
        rotate = ctx.ports.rotate_bmc
        if rotate is not None:  # the daemon's hook: only profiles that opt in rotate
            await ctx.substep("rotate-bmc-password", lambda: rotate(ctx.node))


#: Deploy sub-steps others look at: once the image is written the node boots its disk,
#: never the ramdisk again (boot/http.py); ``installed`` is the installer path's wait
#: (install/unattended.py serves a local boot once it is checkpointed).
IMAGE_WRITTEN: Final = "write-image"
BOOTED: Final = "booted"
INSTALLED: Final = "installed"


async def deploy(ctx: StepContext) -> None:
    """Image path: netboot the agent, which writes the image, the seed and reports; next
    boot disk, power-cycle; wait for the OS's ``booted`` callback. Installer path: netboot
    the installer and wait for its ``installed`` callback (it reboots itself, into a local
    boot), then next boot disk. A node without a BMC is rebooted by its agent."""
    boots = ctx.ports.boots
    installer = boots.uses_installer(ctx.node)
    if installer or boots.waits(ctx.node):
        await ctx.substep("forget-callback", lambda: boots.forget(ctx.node))  # a stale one
    if VALIDATION_KEY in ctx.node.facts:  # re-provisioning a node that was handed on
        await _take_out_of_service(ctx)
    await _netboot(ctx)
    if installer:
        await _wait_callback(ctx, INSTALLED)
        if ctx.node.bmc is not None:
            await ctx.substep("bootdev-disk", lambda: _boot_from(ctx, BootDevice.DISK))
        return
    await ctx.substep(
        IMAGE_WRITTEN, lambda: ctx.ports.installer.deploy_image(ctx.node, ctx.run_id)
    )
    if ctx.node.bmc is not None:
        await ctx.substep("bootdev-disk", lambda: _boot_from(ctx, BootDevice.DISK))
        await ctx.substep("power-off-for-disk", lambda: _power(ctx, PowerState.OFF))
        await ctx.substep("power-on-disk", lambda: _power(ctx, PowerState.ON))
    if boots.waits(ctx.node):
        await _wait_callback(ctx, BOOTED)


async def _wait_callback(ctx: StepContext, name: str) -> None:
    """Wait for the OS's callback outside a sub-step (a parked wait must not hold up a
    graceful stop), then checkpoint it: a resumed step does not wait twice."""
    if not ctx.finished(name):
        await ctx.ports.boots.wait_booted(ctx.node)
        await ctx.substep(name, _nothing)


async def configure(ctx: StepContext) -> None:
    await ctx.substep("configure", lambda: ctx.ports.installer.configure(ctx.node, ctx.run_id))


async def join(ctx: StepContext) -> None:
    await ctx.substep("kube-join", lambda: ctx.ports.kube.join(ctx.node))


async def validate(ctx: StepContext) -> None:
    """Hold the node out unless its hardware matches its profile (every reason at once),
    then wait until its whole NVLink domain passed: a partial NVL72 rack never goes to
    Slurm. The wait runs outside a sub-step (a parked wait must not hold up a graceful
    stop) and is checkpointed once over, so a resumed step does not wait again. So does the
    settling of a node whose NVSwitch fabric still trains (``_settle``)."""
    if not ctx.finished(NODE_CHECKED):
        checked = await ctx.ports.validator.check(ctx.node)
        if checked.settling:
            checked = await _settle(ctx, checked)

        async def keep() -> None:
            await ctx.merge_facts({VALIDATION_KEY: checked.to_facts()})
            if not checked.passed:
                raise FatalError(f"validation failed: {checked.reason}")

        await ctx.substep(NODE_CHECKED, keep)
    record = ValidationRecord.from_facts(ctx.node.facts)
    if record is not None and record.clique is not None and not ctx.finished(DOMAIN_COMPLETE):
        await ctx.ports.validator.wait_domain(ctx.node, record, ctx.record)
        await ctx.substep(DOMAIN_COMPLETE, _nothing)
    if record is not None and not ctx.finished(FABRIC_ACCEPTED):
        await _accept(ctx, record)


async def _accept(ctx: StepContext, record: ValidationRecord) -> None:
    """Fabric acceptance of the whole domain (``Ports.acceptance``): a wait like the domain
    gate's, outside a sub-step; its result is kept in the node's facts and checkpointed. A
    failed domain fails every node of it, each with the result naming the slowest node."""
    outcome = await ctx.ports.acceptance.accept(ctx.node, record, ctx.record)
    if outcome is None:
        return

    async def keep() -> None:
        await ctx.merge_facts({ACCEPTANCE_KEY: {
            "run_id": outcome.run_id, "domain": outcome.domain, "passed": outcome.passed,
            "summary": outcome.summary}})
        if not outcome.passed:
            raise FatalError(outcome.summary)

    await ctx.substep(FABRIC_ACCEPTED, keep)


async def _nothing() -> None:
    return None


async def _settle(ctx: StepContext, record: ValidationRecord) -> ValidationRecord:
    """Collect the facts again while the fabric trains (``Validator.settle``). When the
    settling began is checkpointed (``fabric-settle-since:<time>``), so a daemon restarted
    meanwhile keeps the deadline instead of starting it over."""
    since = next((item.removeprefix(SETTLE_SINCE) for item in ctx.node.checkpoint
                  if item.startswith(SETTLE_SINCE)), None)
    if since is None:
        since = record.at
        await ctx.substep(SETTLE_SINCE + since, _nothing)
    try:
        started = datetime.fromisoformat(since)
    except ValueError:
        started = datetime.fromisoformat(record.at)

    async def recollect(latest: ValidationRecord) -> Node:
        await ctx.ports.installer.collect_facts(ctx.node, ctx.run_id)
        await ctx.merge_facts({VALIDATION_KEY: latest.to_facts()})  # and reads the new facts
        return ctx.node

    return await ctx.ports.validator.settle(ctx.node, record, started, recollect, ctx.record)


async def register(ctx: StepContext) -> None:
    await ctx.substep("slurm-register", lambda: ctx.ports.slurm.register(ctx.node))


async def _take_out_of_service(ctx: StepContext) -> None:
    """Drain and remove the node from Slurm, then from Kubernetes, before its disk goes:
    running jobs end first, and the reinstalled OS joins as a new Node."""
    await ctx.substep("slurm-remove", lambda: ctx.ports.slurm.remove(ctx.node))
    await ctx.substep("kube-remove", lambda: ctx.ports.kube.remove(ctx.node))


async def retire(ctx: StepContext) -> None:
    """Out of Slurm and Kubernetes, netboot the agent, erase every disk (``erasure``: the
    method per disk in the history, a disk that cannot be erased fails the step), power off."""
    await _take_out_of_service(ctx)
    await _netboot(ctx)
    await sanitise_disks(ctx)
    if ctx.node.bmc is not None:
        await ctx.substep("power-off", lambda: _power(ctx, PowerState.OFF))


STEPS: Final[Mapping[NodeState, Step]] = {
    NodeState.INSPECTING: inspect,
    NodeState.DEPLOYING: deploy,
    NodeState.CONFIGURING: configure,
    NodeState.JOINING: join,
    NodeState.VALIDATING: validate,
    NodeState.REGISTERING: register,
    NodeState.RETIRING: retire,
    NodeState.REPAIRING: repair,
    NodeState.SERVICING: service,
}

#: Steps whose drivers key their work by ``run_id`` (the image written, the Ansible run, the
#: disks erased, a runbook's agent jobs): the run id is checkpointed before their first
#: sub-step, so a restart keeps it.
KEYED_STEPS: Final[frozenset[NodeState]] = frozenset({NodeState.DEPLOYING,
                                                      NodeState.CONFIGURING,
                                                      NodeState.RETIRING,
                                                      NodeState.SERVICING})

#: Steps that wait for other nodes: they bound their own waits (no step timeout) and hold no
#: in-flight budget slot while they wait (a slot held by a waiting node could starve the very
#: nodes it waits for).
WAITING_STEPS: Final[frozenset[NodeState]] = frozenset({NodeState.VALIDATING,
                                                       NodeState.REPAIRING,
                                                       NodeState.SERVICING})
