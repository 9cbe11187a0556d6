"""The ``servicing`` step: a runbook (issue 25) run like every step, one checkpointed
sub-step per piece of each runbook step, so a daemon killed mid-runbook resumes at the
piece it was on (and, under HA, is fenced by the node's lease like every step).

A new node (``origin = onboarding``): the steps, then ``deploying``. An active node: the
repair ladder's drain (Slurm and Kubernetes, one reason; ``Ports.repairs``), the steps,
the validation gate (facts collected again, the profile's checks), the undrain, ``active``.

Steps (``SERVICE_STEPS``):

* ``firmware_inventory``: the BMC's ``UpdateService/FirmwareInventory`` against the
  profile's firmware baseline, kept in ``facts["firmware"]``.
* ``bios_settings``: the profile's BIOS baseline checked against the BMC's attribute
  registry first (an unknown attribute or a disallowed value fails the step, nothing
  applied), the changed attributes written with the apply time the BMC supports, a power
  cycle, then read back (kept in ``facts["bios_settings"]``): a value the BMC did not take
  fails the step.
* ``bmc_settings``: the profile's BMC settings baseline, the same way
  (``service_bmc``): validated first, applied with the apply time the BMC offers, the BMC
  waited for, read back.
* ``firmware_update``: each baseline component whose version differs, by ``SimpleUpdate``
  with the image from our HTTP server, or by a push of the image file to the UpdateService's
  ``MultipartHttpPushUri`` (the profile's ``firmware_transfer``; ``auto``: SimpleUpdate
  where the BMC takes our URL, else the push); the intent is written before the request and
  the task URI after it, both before the checkpoint, so a resumed step polls that task, or
  finds it among the BMC's tasks (``tasks_for``: its payload names our image; for a push, a
  task the intent did not know whose payload is a POST to the push URI; else the one
  running) when the daemon stopped before the BMC's answer, and never asks twice. Reboot
  handling: a BMC component (Id containing ``BMC``) is waited for until the
  BMC answers ``bmc_good_reads`` reads in a row; any other component (BIOS, NIC, GPU)
  activates on the power cycle that follows the updates; then every component is read back.
* ``storage_layout``: the profile's storage volumes (``service_storage``): Redfish
  ``Storage/Volumes`` where the BMC offers them, left alone when already there.
* ``reboot``: a power cycle through the BMC, an active node's OS waited for
  (``service_reboot``).
* ``sanitise``: every disk erased in the agent's ramdisk as on ``retire``
  (``service_sanitise``); only a runbook's last step (config), after which the node, its OS
  gone, is re-deployed (``reimage``, or ``onboarded`` for a new node), not gated.

A step's failure carries the BMC's own message into ``service_failed``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final

from provisioner.bmc.base import PowerState
from provisioner.errors import DriverError, FatalError
from provisioner.lifecycle.outcome import StepOutcome
from provisioner.lifecycle.service_ports import ServiceBmc
from provisioner.lifecycle.service_record import KEY, PASSED, ServiceRecord, now
from provisioner.lifecycle.states import Event
from provisioner.validation.baseline import (
    MULTIPART_PUSH,
    Component,
    FirmwareMatch,
    bios_changes,
    check_bios,
    match_firmware,
)
from provisioner.validation.record import KEY as VALIDATION_KEY

if TYPE_CHECKING:
    from provisioner.lifecycle.steps import StepContext

DRAINED: Final = "service-drained"
GATE: Final = "service-gate"
UNDRAINED: Final = "service-undrained"
CLOSED: Final = "service-closed"
STEP_EVENT: Final = "service_step"
SANITISE: Final = "sanitise"
FIRMWARE_KEY: Final = "firmware"
BIOS_KEY: Final = "bios_settings"


def step_name(index: int, step: str) -> str:
    return f"service:{index}:{step}"


def drain_reason(record: ServiceRecord) -> str:
    return f"servicing: runbook {record.runbook} ({', '.join(record.steps)})"[:200]


def _record(ctx: StepContext) -> ServiceRecord:
    record = ServiceRecord.from_facts(ctx.node.facts)
    if record is None:
        raise FatalError("no servicing record in the node's facts (key 'servicing'): start "
                         "a runbook with `provisioner node service NODE RUNBOOK`")
    return record


async def _write(ctx: StepContext, record: ServiceRecord) -> None:
    await ctx.merge_facts({KEY: record.to_facts()})


async def service(ctx: StepContext) -> None:
    record = _record(ctx)
    if record.drains:
        async def drain() -> None:
            wait = ctx.ports.servicing.limits.drain_deadline_s
            still = await ctx.ports.repairs.drain(ctx.node, drain_reason(record), wait)
            await ctx.record("service_drain", drain_reason(record) + (
                f"; after {wait:g} s still running: {still}" if still else ""))

        await ctx.substep(DRAINED, drain)
    handle: list[ServiceBmc] = []

    async def bmc() -> ServiceBmc:
        if not handle:
            handle.append(await ctx.ports.servicing.bmc(ctx.node))
        return handle[0]

    try:
        for index, step in enumerate(record.steps):
            name = step_name(index, step)
            if ctx.finished(name):
                continue
            run = _STEPS.get(step)
            if run is None:
                raise FatalError(f"runbook {record.runbook}: unknown step {step!r}")
            try:
                result = await run(ctx, name, bmc)
            except DriverError as exc:
                await _write(ctx, _record(ctx).with_result(step, f"failed: {exc}"))
                await ctx.record(STEP_EVENT, f"{step}: failed: {exc}")
                raise FatalError(f"runbook {record.runbook}, step {step}: {exc}") from exc
            await _finish(ctx, name, step, result)
    finally:
        for held in handle:
            await held.aclose()

    async def close() -> None:
        await _write(ctx, _record(ctx).with_netboot(False).closed(PASSED))

    if record.steps and record.steps[-1] == SANITISE:  # no OS left to gate: re-deployed
        await ctx.substep(CLOSED, close)
        raise StepOutcome(Event.REIMAGE if record.drains else Event.ONBOARDED,
                          f"runbook {record.runbook} ended in sanitise: re-deploying")
    if record.drains:
        await ctx.substep(GATE, lambda: _gate(ctx))

        async def undrain() -> None:
            await ctx.ports.repairs.undrain(ctx.node)
            await _write(ctx, _record(ctx).closed(PASSED))

        await ctx.substep(UNDRAINED, undrain)
        return
    await ctx.substep(CLOSED, close)
    raise StepOutcome(Event.ONBOARDED, f"onboarding runbook {record.runbook} passed")


async def _finish(ctx: StepContext, name: str, step: str, result: str) -> None:
    async def keep() -> None:
        await _write(ctx, _record(ctx).with_result(step, result))
        await ctx.record(STEP_EVENT, f"{step}: {result}")

    await ctx.substep(name, keep)


async def _gate(ctx: StepContext) -> None:
    """The validation gate, as the repair ladder runs it after a rung."""
    await ctx.ports.installer.collect_facts(ctx.node, f"{ctx.run_id}-service")
    await ctx.merge_facts({})
    checked = await ctx.ports.validator.check(ctx.node)
    await ctx.merge_facts({VALIDATION_KEY: checked.to_facts()})
    if not checked.passed:
        raise FatalError(f"validation after servicing failed: {checked.reason}")
    await ctx.record(STEP_EVENT, "validation passed")


BmcGetter = Callable[[], Awaitable[ServiceBmc]]
Run = Callable[["StepContext", str, BmcGetter], Awaitable[str]]


async def firmware_inventory(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    components = await (await bmc()).firmware_inventory()
    baseline = ctx.ports.servicing.baseline(ctx.node)
    view = match_firmware(components, baseline.firmware)
    await _keep_inventory(ctx, components)
    if baseline.bios:
        await keep_bios(ctx, await (await bmc()).bios_attributes())
    if baseline.bmc:
        from provisioner.lifecycle.service_bmc import keep_bmc
        await keep_bmc(ctx, baseline.bmc, await (await bmc()).bmc_view(registry=False))
    drifted = ", ".join(f"{m.component.id} {m.component.version} (baseline "
                        f"{m.wanted.version})" for m in view.drifted)
    missing = ", ".join(w.pattern for w in view.unmatched)
    return (f"{len(components)} components; " + (f"drifted: {drifted}" if drifted else
                                                 "none drifted")
            + (f"; not reported by the BMC: {missing}" if missing else ""))


async def _keep_inventory(ctx: StepContext, components: list[Component]) -> None:
    """The inventory as last read, in ``facts["firmware"]`` (the node's firmware view and
    the fleet's drift read it)."""
    await ctx.merge_facts({FIRMWARE_KEY: {
        "at": now(), "components": [{"id": c.id, "name": c.name, "version": c.version,
                                     "updateable": c.updateable} for c in components]}})


async def keep_bios(ctx: StepContext, attributes: Mapping[str, object]) -> None:
    """The BIOS attributes as last read, in ``facts["bios_settings"]``."""
    await ctx.merge_facts({BIOS_KEY: {"at": now(), "attributes": dict(attributes)}})


async def bios_settings(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    wanted = ctx.ports.servicing.baseline(ctx.node).bios
    if not wanted:
        return f"profile {ctx.node.profile} has no BIOS baseline"
    applied = f"{name}:applied"

    async def apply() -> None:
        service = await bmc()
        errors = check_bios(wanted, await service.bios_registry())
        if errors:
            raise FatalError("BIOS baseline refused by the BMC's attribute registry, nothing "
                             "applied: " + "; ".join(errors))
        changes = bios_changes(wanted, await service.bios_attributes())
        if not changes:
            await ctx.record(STEP_EVENT, "bios_settings: already at the baseline")
            return
        when = await service.apply_bios(changes)
        await _write(ctx, _record(ctx).with_result(applied, when))
        await ctx.record(STEP_EVENT, "bios_settings: " + ", ".join(
            f"{k}={v}" for k, v in sorted(changes.items())) + f" written (apply time {when})")

    await ctx.substep(applied, apply)
    pending = any(step == applied for step, _, _ in _record(ctx).results)
    if pending:
        await ctx.substep(f"{name}:reboot", lambda: _reboot(ctx))
    current = await (await bmc()).bios_attributes()
    await keep_bios(ctx, current)
    left = bios_changes(wanted, current)
    if left:
        raise FatalError("BIOS settings not in effect after the reboot: " + ", ".join(
            f"{k}={current.get(k)!r} (wanted {v!r})" for k, v in sorted(left.items())))
    return f"{len(wanted)} attributes at the baseline" + (" after a reboot" if pending else "")


async def firmware_update(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    baseline = ctx.ports.servicing.baseline(ctx.node).firmware
    service = await bmc()
    inventory = await service.firmware_inventory()
    view = match_firmware(inventory, baseline)
    if view.unmatched:
        raise FatalError("the BMC does not report baseline components: "
                         + ", ".join(w.pattern for w in view.unmatched))
    started = [cid for cid in _record(ctx).tasks if ctx.finished(f"{name}:{cid}:started")]
    todo = {m.component.id: m for m in view.drifted if m.component.updateable}
    updated: list[str] = []
    for cid in sorted(set(todo) | set(started)):
        if ctx.finished(f"{name}:{cid}:done"):
            updated.append(cid)
            continue
        if cid in todo:
            await ctx.substep(f"{name}:{cid}:started", _starter(ctx, service, todo[cid]))
        await ctx.substep(f"{name}:{cid}:done", _waiter(ctx, service, cid))
        updated.append(cid)
    if not updated:
        await _keep_inventory(ctx, inventory)
        return "every component at the baseline"
    if any("bmc" not in cid.lower() for cid in updated):
        await ctx.substep(f"{name}:reboot", lambda: _reboot(ctx))
    inventory = await service.firmware_inventory()
    await _keep_inventory(ctx, inventory)
    view = match_firmware(inventory, baseline)
    if view.drifted:
        raise FatalError("firmware not at the baseline after the update: " + ", ".join(
            f"{m.component.id} reports {m.component.version} (wanted {m.wanted.version})"
            for m in view.drifted))
    return "updated " + ", ".join(updated)


def _starter(ctx: StepContext, service: ServiceBmc,
             part: FirmwareMatch) -> Callable[[], Awaitable[None]]:
    """Ask the BMC for the update, the intent written first: a daemon that stops after the
    BMC took the request and before its task was written looks for that task on resume
    (``tasks_for``: named by its image, else the one running) and follows it; it asks
    again only when the BMC shows none, and fails when the BMC cannot say."""
    cid = part.component.id

    async def start() -> None:
        wanted = ctx.ports.servicing.update_image(ctx.node, part.wanted.image)
        image = wanted.uri
        record = _record(ctx)
        if cid in record.tasks and not record.asking(cid):
            return  # its task was written, the daemon stopped before the checkpoint
        if record.asking(cid):
            found = await service.tasks_for(image, record.known(cid))
            if found is None:
                raise FatalError(
                    f"{cid}: the daemon stopped while asking the BMC for this update, and "
                    "the BMC has no TaskService to tell whether it started: look at the "
                    "BMC, then run the runbook again")
            if found:
                await _write(ctx, _record(ctx).with_task(cid, found[-1]))
                await ctx.record("firmware_update", f"{cid}: the update asked for before a "
                                 f"restart is the BMC's task {found[-1]}: followed, not "
                                 "asked for again")
                return
        how = await service.transfer(wanted)
        targets = [part.component.uri or cid]
        if how == MULTIPART_PUSH and wanted.path is not None:
            await _write(ctx, _record(ctx).with_intent(cid, image, await service.task_ids()))
            uri = await service.push_update(wanted.path, targets)
        else:
            await _write(ctx, _record(ctx).with_intent(cid, image))
            uri = await service.simple_update(image, targets)
        await _write(ctx, _record(ctx).with_task(part.component.id, uri))
        await ctx.record("firmware_update", f"{part.component.id}: {part.component.version}"
                         f" → {part.wanted.version} from {part.wanted.image} by {how}"
                         + (f"; task {uri}" if uri else ""))
    return start


def _waiter(ctx: StepContext, service: ServiceBmc, cid: str) -> Callable[[], Awaitable[None]]:
    return lambda: _wait_task(ctx, service, cid)


async def _wait_task(ctx: StepContext, service: ServiceBmc, cid: str) -> None:
    """Poll the task monitor until the task ends: Completed passes; Exception, a task that
    makes no progress for ``task_stall_s`` or runs past ``task_timeout_s`` fail; a task
    the BMC no longer knows (404) is judged by the component's version; a BMC updating
    itself must answer ``bmc_good_reads`` reads in a row."""
    limits = ctx.ports.servicing.limits
    uri = _record(ctx).tasks.get(cid, "")
    deadline = time.monotonic() + limits.timeout_s
    progress: tuple[int | None, float] = (None, time.monotonic())
    while uri:
        try:
            task = await service.task(uri)
        except DriverError as exc:  # the BMC restarting with its own new firmware
            if time.monotonic() > deadline:
                raise FatalError(f"{cid}: task {uri}: BMC unreachable: {exc}") from exc
            await asyncio.sleep(limits.poll_s)
            continue
        if task.gone:
            break  # judged by the version below
        if task.finished:
            if not task.ok:
                raise FatalError(f"{cid}: update task {task.state}: "
                                 + ("; ".join(task.messages) or "no message"))
            break
        if task.percent != progress[0]:
            progress = (task.percent, time.monotonic())
        elif time.monotonic() - progress[1] > limits.stall_s:
            raise FatalError(f"{cid}: update task {uri} made no progress for "
                             f"{limits.stall_s:g} s (at {task.percent}%)")
        if time.monotonic() > deadline:
            raise FatalError(f"{cid}: update task {uri} not done after {limits.timeout_s:g} s")
        await asyncio.sleep(limits.poll_s)
    if "bmc" in cid.lower():
        await _good_reads(service, limits.good_reads, limits.poll_s, deadline)
    await ctx.record("firmware_update", f"{cid}: task ended")


async def _good_reads(service: ServiceBmc, wanted: int, poll_s: float, deadline: float) -> None:
    good = 0
    while good < wanted:
        try:
            await service.firmware_inventory()
            good += 1
        except DriverError:
            good = 0
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(poll_s if good < wanted else 0)


async def _reboot(ctx: StepContext) -> None:
    """Power cycle through the BMC; a drained active node's OS is waited for (the gate
    collects its facts next): the repair ladder's own wait (``Repairer.wait_os``)."""
    await power_cycle(ctx)
    if _record(ctx).drains:
        await ctx.ports.repairs.wait_os(ctx.node)


async def power_cycle(ctx: StepContext) -> None:
    """A reset through the BMC, confirmed by read-back (a node that is off is powered on,
    after its rack's stagger)."""
    if ctx.node.bmc is None:
        raise FatalError("no BMC: no power cycle to apply firmware or settings, or reboot")
    handle = await ctx.bmc()
    if await handle.power_state() is PowerState.OFF:
        await ctx.ports.stagger.wait(ctx.node)
    await handle.power_cycle()
    await ctx.note_power(str(PowerState.ON))


async def storage_layout(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    """The profile's storage volumes (``service_storage``, imported here as it imports
    this module's helpers)."""
    from provisioner.lifecycle.service_storage import storage_layout as layout
    return await layout(ctx, name, bmc)


async def bmc_settings(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    """The profile's BMC settings (``service_bmc``, imported here as it imports this
    module's helpers)."""
    from provisioner.lifecycle.service_bmc import bmc_settings as settings
    return await settings(ctx, name, bmc)


async def reboot(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    from provisioner.lifecycle.service_reboot import reboot as run
    return await run(ctx, name, bmc)


async def sanitise(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    from provisioner.lifecycle.service_sanitise import sanitise as run
    return await run(ctx, name, bmc)


_STEPS: Final[Mapping[str, Run]] = {
    "firmware_inventory": firmware_inventory,
    "bios_settings": bios_settings,
    "bmc_settings": bmc_settings,
    "firmware_update": firmware_update,
    "storage_layout": storage_layout,
    "reboot": reboot,
    SANITISE: sanitise,
}
SERVICE_STEPS: Final = tuple(_STEPS)


def components_out(facts: Mapping[str, object]) -> list[Component]:
    """The components ``firmware_inventory`` kept in the facts."""
    raw = facts.get(FIRMWARE_KEY)
    members = raw.get("components") if isinstance(raw, dict) else None
    return [Component(id=str(m.get("id", "")), version=str(m.get("version", "")),
                      name=str(m.get("name", "")), updateable=m.get("updateable") is not False)
            for m in members or [] if isinstance(m, dict)]
