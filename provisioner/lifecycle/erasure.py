"""The sanitise step (``retire``): every disk erased by the node's agent, one history row per
disk with its method, a failed disk failing the step. Resumable: each disk's result is
checkpointed (``erased:<device>``) as it is recorded, the job is keyed by the step's run id
(``sanitise:<run id>``, kept across a restart), and the agent answers a job it already ran
from its memory; a disk checkpointed here is left out of the job (``skip``) should the
agent have restarted meanwhile. So a daemon killed mid-erase never starts a second erase."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final

from provisioner.domain import DiskErasure, Sanitised
from provisioner.errors import FatalError

if TYPE_CHECKING:
    from provisioner.lifecycle.steps import StepContext

ERASED: Final = "disk_erased"
ERASE_FAILED: Final = "disk_erase_failed"
SANITISED: Final = "sanitise"
DISK_DONE: Final = "erased:"
__all__ = ["DiskErasure", "Sanitised", "erased_disks", "sanitise_disks"]


def erased_disks(checkpoint: Sequence[str]) -> frozenset[str]:
    return frozenset(item.removeprefix(DISK_DONE) for item in checkpoint
                     if item.startswith(DISK_DONE))


async def sanitise_disks(ctx: StepContext) -> None:
    """Erase every disk of the net-booted node; FatalError naming each disk that failed."""
    if ctx.finished(SANITISED):
        return
    outcome = await ctx.ports.installer.sanitise(
        ctx.node, f"sanitise:{ctx.run_id}", erased_disks(ctx.node.checkpoint))
    for disk in outcome.disks:
        if disk.ok:
            await ctx.substep(DISK_DONE + disk.device, _recorder(ctx, ERASED, disk.describe()))
        else:
            await ctx.record(ERASE_FAILED, disk.describe())
    if outcome.error:
        raise FatalError(f"sanitise failed: {outcome.error}")

    async def nothing() -> None:
        return None

    await ctx.substep(SANITISED, nothing)


def _recorder(ctx: StepContext, event: str, reason: str) -> Callable[[], Awaitable[None]]:
    async def record() -> None:
        await ctx.record(event, reason)

    return record
