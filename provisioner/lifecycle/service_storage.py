"""The ``storage_layout`` servicing step (issue 25): the profile's storage volumes
(``[[servicing.profiles.<p>.storage]]``) made on the node.

``via = "redfish"`` volumes: the BMC's storage controller (Redfish ``Storage`` → ``Drives``,
``Volumes``), planned by ``validation.storage.plan_volumes``: a volume already there (same
RAID type, over drives the selector accepts, in the wanted number) is left alone and the
result says so; the others are created by a POST to the controller's ``Volumes``; volumes
outside the layout are deleted only with ``storage_replace``. Each deletion and creation is
a checkpointed sub-step whose intent is written before the request (``_ask``), and the plan
is read again from the BMC on a resume, so a daemon killed mid-layout, even between the
BMC taking a change and its answer, never asks for a volume or a deletion twice. A BMC
answering with a task is followed as a firmware update's task is; an ``OnReset`` apply time
is followed by a power cycle; then the volumes are read back and a wanted one that is missing
fails the step.

``via = "mdadm"`` volumes: software arrays, built by the node's agent in the ramdisk
(``provisioner.agent.storage``), each array's result (array, level, members, state) in the
history and in ``facts["md_arrays"]`` with ``/proc/mdstat``; see ``_mdadm``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from provisioner.errors import FatalError
from provisioner.lifecycle.service_ports import ServiceBmc
from provisioner.lifecycle.service_record import ServiceRecord
from provisioner.lifecycle.service_step import (
    STEP_EVENT,
    BmcGetter,
    _reboot,
    _record,
    _wait_task,
    _write,
)
from provisioner.validation.storage import (
    MDADM_LEVELS,
    Controller,
    Drive,
    VolumePlan,
    WantedVolume,
    pick,
    plan_volumes,
)

if TYPE_CHECKING:
    from provisioner.lifecycle.steps import StepContext

TASK_PREFIX = "volume:"
ARRAYS_KEY = "md_arrays"  # facts: the agent's report on the arrays, /proc/mdstat with it


async def storage_layout(ctx: StepContext, name: str, bmc: BmcGetter) -> str:
    baseline = ctx.ports.servicing.baseline(ctx.node)
    if not baseline.storage:
        return f"profile {ctx.node.profile} has no storage layout"
    results: list[str] = []
    redfish = [w for w in baseline.storage if w.via == "redfish"]
    mdadm = [w for w in baseline.storage if w.via == "mdadm"]
    if redfish:
        results.append(await _redfish(ctx, name, await bmc(), redfish,
                                      baseline.storage_replace))
    if mdadm:
        results.append(await _mdadm(ctx, name, mdadm))
    return "; ".join(results)


async def _redfish(ctx: StepContext, name: str, service: ServiceBmc,
                   wanted: list[WantedVolume], replace: bool) -> str:
    controller, plan = await _plan(service, wanted, replace)
    deletes = [f"{name}:delete:{volume.ref}" for volume in plan.delete]
    for step, volume in zip(deletes, plan.delete, strict=True):
        await ctx.substep(step, _deleter(ctx, name, service, controller, volume.ref,
                                         volume.name))
    await _settle(ctx, name, "delete", deletes, service, controller)
    creates = [f"{name}:create:{item.name}" for item, _ in plan.create]
    for step, (item, drives) in zip(creates, plan.create, strict=True):
        await ctx.substep(step, _creator(ctx, name, service, controller, item,
                                         [d.ref for d in drives]))
    await _settle(ctx, name, "create", creates, service, controller)
    _, after = await _plan(service, wanted, replace=False, allow_missing=True)
    missing = [item.describe() for item, _ in after.create]
    if missing:
        raise FatalError("storage layout not in effect: the BMC does not show "
                         + ", ".join(missing))
    kept = {item.name for item, _ in plan.kept}
    parts = [f"{item.name}: {volume.raid} over {len(volume.drives)} drives ("
             + ("already there, left alone" if item.name in kept else "created") + ")"
             for item, volume in after.kept]
    parts += [f"deleted {v.name or v.ref} ({v.raid})" for v in plan.delete]
    return "redfish volumes: " + "; ".join([*parts, *plan.notes])


async def _plan(service: ServiceBmc, wanted: list[WantedVolume], replace: bool, *,
                allow_missing: bool = False) -> tuple[Controller, VolumePlan]:
    """The plan on the first controller that can hold the layout (the first one's error
    when none can); ``allow_missing``: the plan as it is, volumes to make and all."""
    found = await service.storage()
    failures: list[str] = []
    for controller in found:
        try:
            return controller, plan_volumes(wanted, controller.volumes, controller.drives,
                                            replace=replace)
        except FatalError as exc:
            if allow_missing:
                return controller, VolumePlan(create=tuple((w, ()) for w in wanted))
            failures.append(f"{controller.uri}: {exc}")
    raise FatalError("; ".join(failures))


def _deleter(ctx: StepContext, name: str, service: ServiceBmc, controller: Controller, uri: str,
             label: str) -> Callable[[], Awaitable[None]]:
    async def delete() -> None:
        key = f"{TASK_PREFIX}delete:{uri}"
        task = await _ask(ctx, service, key, "DELETE", uri, f"deletion of {label or uri}",
                          lambda: service.delete_volume(controller, uri))
        await _follow(ctx, service, controller, key, task)
        await _changed(ctx, name, f"deleted volume {label or uri} (not in the layout; "
                       f"storage_replace; apply time {controller.apply_time})")
    return delete


def _creator(ctx: StepContext, name: str, service: ServiceBmc, controller: Controller,
             item: WantedVolume, drives: list[str]) -> Callable[[], Awaitable[None]]:
    async def create() -> None:
        key = f"{TASK_PREFIX}create:{item.name}"
        task = await _ask(ctx, service, key, "POST", controller.volumes_uri,
                          f"creation of volume {item.name}",
                          lambda: service.create_volume(controller, item.name, item.raid,
                                                        drives))
        await _follow(ctx, service, controller, key, task)
        await _changed(ctx, name, f"created volume {item.name}: {item.raid} over "
                       f"{', '.join(d.rsplit('/', 1)[-1] for d in drives)} (apply time "
                       f"{controller.apply_time})")
    return create


async def _ask(ctx: StepContext, service: ServiceBmc, key: str, method: str, target: str,
               what: str, send: Callable[[], Awaitable[str]]) -> str:
    """A volume change asked for once: the intent (with the BMC's tasks from before it) is
    written first, so a daemon killed after the BMC took the request and before its answer
    was kept finds the change's task on resume (a task it did not know whose payload is
    ``method`` on ``target``) and follows it instead of asking twice (a second volume over
    the same drives, a second deletion, as a BMC that stages changes for the next reset
    would take them). A BMC without a TaskService makes its changes at once (201, 204):
    the plan read again on resume is then the truth, and a change it still lacks is asked
    for again."""
    record = _record(ctx)
    if key in record.tasks and not record.asking(key):
        return record.tasks[key]  # its task was written, the daemon stopped before the end
    if record.asking(key):
        found = await service.change_tasks(method, target, record.known(key) or ())
        if found:
            await ctx.record(STEP_EVENT, f"storage_layout: the {what} asked for before a "
                             f"restart is the BMC's task {found[-1]}: followed, not asked "
                             "for again")
            return found[-1]
    await _write(ctx, _record(ctx).with_intent(key, f"{method} {target}",
                                                await service.task_ids()))
    task = await send()
    await _write(ctx, _record(ctx).with_task(key, task))
    return task


async def _follow(ctx: StepContext, service: ServiceBmc, controller: Controller, key: str,
                  task: str) -> None:
    """The BMC's task for a change: followed now when it applies at once; with ``OnReset``
    it waits for the reset (a task the BMC keeps pending until then), see ``_settle``."""
    if task and controller.apply_time != "OnReset":  # _ask wrote the task
        await _wait_task(ctx, service, key)


async def _settle(ctx: StepContext, name: str, phase: str, steps: list[str],
                  service: ServiceBmc, controller: Controller) -> None:
    """After the deletions, then after the creations (``steps``, their sub-steps): with
    ``OnReset``, the power cycle that applies them (the creations need the drives the
    deletions free), then their tasks."""
    if controller.apply_time != "OnReset" or not any(ctx.finished(s) for s in steps):
        return
    await ctx.substep(f"{name}:{phase}:reboot", lambda: _reboot(ctx))
    prefix = f"{TASK_PREFIX}{phase}:"
    record = _record(ctx)
    for key in [k for k, uri in record.tasks.items() if k.startswith(prefix) and uri
                and not record.asking(k)]:
        await ctx.substep(f"{name}:{phase}:task:{key}", _task_waiter(ctx, service, key))


def _task_waiter(ctx: StepContext, service: ServiceBmc,
                 key: str) -> Callable[[], Awaitable[None]]:
    return lambda: _wait_task(ctx, service, key)


async def _changed(ctx: StepContext, name: str, what: str) -> None:
    record: ServiceRecord = _record(ctx)
    await _write(ctx, record.with_result(f"{name}:changed", what))
    await ctx.record(STEP_EVENT, f"storage_layout: {what}")


async def _mdadm(ctx: StepContext, name: str, wanted: list[WantedVolume]) -> str:
    """The arrays planned from the inspected disks (``facts["disks"]``: the selector's
    disks, smallest first), built by the agent in the ramdisk: the servicing record's
    ``netboot`` makes the boot server hand the node the ramdisk (``boot.http``), the node
    netboots, the agent's ``storage`` job (keyed by the step's run id: asked again after a
    restart, the agent answers from memory) builds what is missing, each array's result is
    recorded, ``netboot`` is cleared and the node power-cycled back to its own disk."""
    disks = ctx.node.facts.get("disks")
    drives = [Drive.from_disk(d) for d in disks if isinstance(d, dict)  # not the arrays
              and not str(d.get("name", "")).startswith("md")] if isinstance(disks, list) \
        else []
    taken: set[str] = set()
    arrays: list[dict[str, Any]] = []
    for item in wanted:
        members = [d.ref for d in pick(item, drives, taken)]
        taken |= set(members)
        arrays.append({"name": item.name, "level": MDADM_LEVELS[item.raid],
                       "members": members})
    from provisioner.lifecycle.steps import _netboot

    async def boot_ramdisk() -> None:
        await _write(ctx, _record(ctx).with_netboot(True))
    await ctx.substep(f"{name}:ramdisk", boot_ramdisk)
    await _netboot(ctx)

    async def build() -> None:
        report = await ctx.ports.installer.build_arrays(ctx.node, f"storage:{ctx.run_id}",
                                                        arrays)
        for array in report.get("arrays") or []:
            await ctx.record(STEP_EVENT, "storage_layout: " + _describe(array))
        await ctx.merge_facts({ARRAYS_KEY: {"arrays": report.get("arrays") or [],
                                            "mdstat": str(report.get("mdstat", ""))[:4000]}})
        if report.get("ok") is not True:
            raise FatalError(f"mdadm: {report.get('error') or 'failed'}")
    await ctx.substep(f"{name}:arrays", build)

    async def boot_disk() -> None:
        await _write(ctx, _record(ctx).with_netboot(False))
        await _reboot(ctx)
    await ctx.substep(f"{name}:disk", boot_disk)
    kept = ctx.node.facts.get(ARRAYS_KEY)
    built = kept.get("arrays") if isinstance(kept, dict) else []
    return "md arrays: " + "; ".join(_describe(a) for a in built or [] if isinstance(a, dict))


def _describe(array: dict[str, Any]) -> str:
    if array.get("error"):
        return f"{array.get('name')}: failed: {array['error']}"
    members = ", ".join(str(m) for m in array.get("members") or [])
    return (f"{array.get('name')}: {array.get('array')} {array.get('level')} over {members}, "
            f"state {array.get('state') or '?'} ("
            + ("created" if array.get("created") else "already there, left alone") + ")")
