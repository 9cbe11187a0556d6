"""The ``reboot`` runbook step (issue 25): a power cycle through the BMC (the driver's
``power_cycle``: ForceRestart, PowerCycle or FullPowerCycle as the BMC offers, else off then
on; a node that is off is powered on), then, for an active node, its OS waited for with the
repair ladder's own wait (``Repairer.wait_os``: the OS answering again within
``health.os_up_timeout_s``). A new node (``inspected``, no OS yet) needs the cycle alone.

At most once: the intent (``<step>:asked``) is written into the servicing record before the
BMC is asked, and the cycle is checkpointed after it. A daemon stopped between the two does
not cycle again on resume: a node it finds off is powered on (a cycle by off then on that
stopped halfway), one it finds on is taken as cycled, and a history row says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from provisioner.bmc.base import PowerState
from provisioner.errors import FatalError
from provisioner.lifecycle.service_record import now
from provisioner.lifecycle.service_step import (
    STEP_EVENT,
    BmcGetter,
    _record,
    _write,
    power_cycle,
)

if TYPE_CHECKING:
    from provisioner.lifecycle.steps import StepContext


def asked(name: str) -> str:
    return f"{name}:asked"


async def reboot(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    if ctx.node.bmc is None:
        raise FatalError("reboot: the node has no BMC to power cycle it through")
    intent = asked(name)
    notes: list[str] = []

    async def cycle() -> None:
        if any(step == intent for step, _, _ in _record(ctx).results):
            notes.append(await _resumed(ctx))
            return
        await _write(ctx, _record(ctx).with_result(intent, now()))
        await power_cycle(ctx)

    await ctx.substep(f"{name}:cycled", cycle)
    done = notes[0] if notes else "power cycled through the BMC"
    if not _record(ctx).drains:
        return done + " (a new node: no OS to wait for)"
    await ctx.substep(f"{name}:os-up", lambda: ctx.ports.repairs.wait_os(ctx.node))
    return done + "; the OS answers again"


async def _resumed(ctx: StepContext) -> str:
    """The cycle was asked for before the daemon stopped: never asked again."""
    handle = await ctx.bmc()
    if await handle.power_state() is PowerState.OFF:
        await ctx.ports.stagger.wait(ctx.node)
        await handle.set_power(PowerState.ON)
        await ctx.note_power(str(PowerState.ON))
        note = "the power cycle asked for before a restart left the node off: powered on"
    else:
        note = "the power cycle asked for before a restart is not asked for again"
    await ctx.record(STEP_EVENT, f"reboot: {note}")
    return note
