"""The ``sanitise`` runbook step (issue 25): the node erased as ``retire`` erases it, before
it changes hands. The servicing record's ``netboot`` makes the boot server hand the node the
agent's ramdisk (``boot.http``), the node is net-booted the way ``retire`` does it
(``steps._netboot``, its sub-steps named after this step), and ``erasure.sanitise_disks``
erases every disk by the strongest method it offers, verifies it, and writes one
``disk_erased`` history row per disk (a disk no allowed method erases fails the step with
the agent's message: ``service_failed``). Resumable as on retire: each disk is checkpointed
as it is recorded and the agent's job is keyed by the step's run id.

The node's OS is gone afterwards: ``sanitise`` is only a runbook's last step (config), and
``service_step.service`` sends the node on to ``deploying`` instead of the validation gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from provisioner.lifecycle.erasure import erased_disks, sanitise_disks
from provisioner.lifecycle.service_step import BmcGetter, _record, _write

if TYPE_CHECKING:
    from provisioner.lifecycle.steps import StepContext


async def sanitise(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    from provisioner.lifecycle.steps import _netboot  # steps imports service_step

    async def boot_ramdisk() -> None:
        await _write(ctx, _record(ctx).with_netboot(True))

    await ctx.substep(f"{name}:ramdisk", boot_ramdisk)
    await _netboot(ctx, prefix=f"{name}:")
    await sanitise_disks(ctx)
    erased = sorted(erased_disks(ctx.node.checkpoint))
    return (f"{len(erased)} disks erased ({', '.join(erased) or 'none found'}; method per "
            "disk in the disk_erased rows); the node is re-deployed next")
