"""The ``bmc_settings`` servicing step (issue 25): the profile's BMC settings baseline
(``[servicing.profiles.<p>.bmc]``; ``validation.bmc_settings`` names them) brought to the
node's BMC, the same way ``bios_settings`` brings the BIOS baseline:

1. every setting checked first, at once: vendor attributes against the BMC's manager
   attribute registry (unknown, read-only, disallowed value), standard ones against the
   resource the BMC serves (no such protocol, not a boolean, more NTP servers than
   slots); any refusal fails the step naming each setting, and nothing is written;
2. the settings that differ written with the apply time the BMC supports (``Immediate``
   where offered; ``OnReset`` followed by ``Manager.Reset``), the apply time in the
   servicing record and the node's history;
3. the BMC waited for: it must answer ``bmc_good_reads`` reads in a row (a BMC restarts
   its network stack, or itself, for some of these), within ``task_timeout_s``;
4. read back: a setting the BMC did not take fails the step with its value and the
   wanted one. The values read are kept in ``facts["bmc_settings"]`` (the fleet's drift
   reads them).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Final

from provisioner.errors import DriverError, FatalError
from provisioner.lifecycle.service_record import now
from provisioner.lifecycle.service_step import STEP_EVENT, BmcGetter, _record, _write
from provisioner.validation.bmc_settings import (
    MANAGER,
    PROTOCOL,
    BmcValue,
    BmcView,
    as_facts,
    bmc_changes,
    check_bmc,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from provisioner.lifecycle.service_ports import ServiceBmc
    from provisioner.lifecycle.steps import StepContext

BMC_KEY: Final = "bmc_settings"


def _text(changes: Mapping[str, BmcValue]) -> str:
    return ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v!r}"
                     for k, v in sorted(changes.items()))


async def keep_bmc(ctx: StepContext, wanted: Mapping[str, BmcValue], view: BmcView) -> None:
    """The baseline's settings as last read, in ``facts["bmc_settings"]``."""
    await ctx.merge_facts({BMC_KEY: {"at": now(), "values": as_facts(
        {name: view.value(name) for name in wanted})}})


async def bmc_settings(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    wanted = ctx.ports.servicing.baseline(ctx.node).bmc
    if not wanted:
        return f"profile {ctx.node.profile} has no BMC settings baseline"
    applied = f"{name}:applied"
    vendor = any(not k.startswith((PROTOCOL, MANAGER)) for k in wanted)

    async def apply() -> None:
        service = await bmc()
        view = await service.bmc_view(registry=vendor)
        errors = check_bmc(wanted, view)
        if errors:
            raise FatalError("BMC settings baseline refused, nothing applied: "
                             + "; ".join(errors))
        changes = bmc_changes(wanted, view)
        if not changes:
            await ctx.record(STEP_EVENT, "bmc_settings: already at the baseline")
            return
        how = await service.apply_bmc(changes)
        reset = f"; Manager.Reset {await service.reset_bmc()}" if how.reset else ""
        await _write(ctx, _record(ctx).with_result(applied, how.when + reset))
        await ctx.record(STEP_EVENT, f"bmc_settings: {_text(changes)} written (apply time "
                         f"{how.when}{reset})")

    await ctx.substep(applied, apply)
    pending = any(step == applied for step, _, _ in _record(ctx).results)
    if pending:
        await ctx.substep(f"{name}:back", lambda: _back(ctx, bmc))
    view = await (await bmc()).bmc_view(registry=False)
    await keep_bmc(ctx, wanted, view)
    left = bmc_changes(wanted, view)
    if left:
        raise FatalError("BMC settings not in effect after they were applied: " + ", ".join(
            f"{k}={view.value(k)!r} (wanted {list(v) if isinstance(v, tuple) else v!r})"
            for k, v in sorted(left.items())))
    return f"{len(wanted)} BMC settings at the baseline" + (" after applying them"
                                                            if pending else "")


async def _back(ctx: StepContext, bmc: BmcGetter) -> None:
    """The BMC answers ``good_reads`` reads of its settings in a row (after a reset, or a
    change that restarts its services), within the task timeout."""
    limits = ctx.ports.servicing.limits
    deadline = time.monotonic() + limits.timeout_s
    service: ServiceBmc = await bmc()
    good = 0
    while good < limits.good_reads:
        try:
            await service.bmc_view(registry=False)
            good += 1
        except DriverError as exc:
            good = 0
            if time.monotonic() > deadline:
                raise FatalError(f"the BMC did not come back after its settings were "
                                 f"applied ({limits.timeout_s:g} s): {exc}") from exc
        await asyncio.sleep(limits.poll_s if good < limits.good_reads else 0)
    await ctx.record(STEP_EVENT, f"bmc_settings: the BMC answered {good} reads in a row")
