"""One async function per in-flight state. Steps are idempotent and checkpoint sub-steps,
so a daemon killed at any moment resumes each one where it was."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from provisioner.bmc.base import Bmc, BootDevice, PowerState
from provisioner.domain import Node
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import NodeState


class StepContext(Protocol):
    @property
    def node(self) -> Node: ...

    @property
    def ports(self) -> Ports: ...

    @property
    def run_id(self) -> str:
        """Names this run of the step; stable across a restart, new after a retry."""
        ...

    async def bmc(self) -> Bmc: ...

    async def substep(self, name: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` unless the checkpoint says it finished; then checkpoint it."""
        ...

    async def merge_facts(self, facts: dict[str, Any]) -> None: ...

    async def note_power(self, state: str) -> None:
        """Remember the power state this step set (the power sync then sees no change)."""
        ...


Step = Callable[[StepContext], Awaitable[None]]


async def _boot_from(ctx: StepContext, device: BootDevice) -> None:
    bmc = await ctx.bmc()
    await bmc.set_boot_device(device)


async def _power(ctx: StepContext, state: PowerState) -> None:
    """Idempotent and confirmed by read-back (the Bmc from ``Ports.bmc`` does both); a
    power-on waits for the rack's stagger only when the node really is off."""
    bmc = await ctx.bmc()
    if state is PowerState.ON and await bmc.power_state() is PowerState.OFF:
        await ctx.ports.stagger.wait(ctx.node)
    await bmc.set_power(state)
    await ctx.note_power(str(state))


async def _netboot(ctx: StepContext) -> None:
    """Boot from the network: next boot PXE, then off and on (each idempotent and
    checkpointed, unlike a reboot). A node without a BMC is already net-booted."""
    if ctx.node.bmc is None:
        return
    await ctx.substep("bootdev-pxe", lambda: _boot_from(ctx, BootDevice.PXE))
    await ctx.substep("power-off-for-netboot", lambda: _power(ctx, PowerState.OFF))
    await ctx.substep("power-on", lambda: _power(ctx, PowerState.ON))


async def inspect(ctx: StepContext) -> None:
    async def collect() -> None:
        await ctx.merge_facts(await ctx.ports.inspector.inspect(ctx.node))

    await _netboot(ctx)
    await ctx.substep("collect-facts", collect)
    if ctx.node.bmc is not None:
        await ctx.substep("power-off", lambda: _power(ctx, PowerState.OFF))


async def deploy(ctx: StepContext) -> None:
    await _netboot(ctx)
    await ctx.substep(
        "write-image", lambda: ctx.ports.installer.deploy_image(ctx.node, ctx.run_id)
    )
    if ctx.node.bmc is not None:
        await ctx.substep("bootdev-disk", lambda: _boot_from(ctx, BootDevice.DISK))


async def configure(ctx: StepContext) -> None:
    await ctx.substep("configure", lambda: ctx.ports.installer.configure(ctx.node, ctx.run_id))


async def join(ctx: StepContext) -> None:
    await ctx.substep("kube-join", lambda: ctx.ports.kube.join(ctx.node))


async def register(ctx: StepContext) -> None:
    await ctx.substep("slurm-register", lambda: ctx.ports.slurm.register(ctx.node))


async def retire(ctx: StepContext) -> None:
    await ctx.substep("slurm-remove", lambda: ctx.ports.slurm.remove(ctx.node))
    await ctx.substep("kube-remove", lambda: ctx.ports.kube.remove(ctx.node))
    await _netboot(ctx)
    await ctx.substep("wipe", lambda: ctx.ports.installer.wipe(ctx.node))
    if ctx.node.bmc is not None:
        await ctx.substep("power-off", lambda: _power(ctx, PowerState.OFF))


STEPS: Final[Mapping[NodeState, Step]] = {
    NodeState.INSPECTING: inspect,
    NodeState.DEPLOYING: deploy,
    NodeState.CONFIGURING: configure,
    NodeState.JOINING: join,
    NodeState.REGISTERING: register,
    NodeState.RETIRING: retire,
}
