"""The ``repairing`` step: the repair ladder (``provisioner.health.ladder``) run like every
step, one checkpointed sub-step per rung, so a daemon killed mid-ladder resumes at the rung
it was on (and, under HA, fenced by the node's lease like every step).

Drain (Slurm and Kubernetes, the finding as the reason) → for each rung of the record's
plan: the rung (GPU reset, OS restart, power cycle through the BMC), then the validation
gate again (facts re-collected, the profile's checks) → pass: undrain, ``active``; no rung
left: ``service_required``; the reimage rung hands the node to the deploy path.

Each rung's result is written into the repair record (``facts["repair"]``) in the same
sub-step that ends it: a resumed or retried ladder never climbs a rung twice. A rung that
fails (the OS did not come back) is a result, and the next rung is climbed; only the drain,
the undrain and a lost database stop the step (``repair_failed``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from provisioner.bmc.base import PowerState
from provisioner.errors import DriverError, FatalError, StoreUnavailable
from provisioner.health.model import Action
from provisioner.health.record import KEY, PASSED, SKIPPED, RepairRecord
from provisioner.lifecycle.outcome import StepOutcome
from provisioner.lifecycle.states import Event
from provisioner.validation.record import KEY as VALIDATION_KEY

if TYPE_CHECKING:
    from provisioner.lifecycle.steps import StepContext

DRAINED: Final = "repair-drained"
UNDRAINED: Final = "repair-undrained"
RUNG_EVENT: Final = "repair_rung"
DRAIN_EVENT: Final = "repair_drain"


def rung_step(rung: str) -> str:
    return f"repair-rung:{rung}"


def gate_step(rung: str) -> str:
    return f"repair-gate:{rung}"


def drain_reason(record: RepairRecord) -> str:
    """The text Slurm and Kubernetes both show: the class, the part, the first evidence."""
    part = f" {record.subject}" if record.subject else ""
    evidence = " ".join((record.evidence[0] if record.evidence else "").split())
    return f"health {record.kind}{part}: {evidence}"[:200]


def _now() -> datetime:
    return datetime.now(UTC)


def _record(ctx: StepContext) -> RepairRecord:
    record = RepairRecord.from_facts(ctx.node.facts)
    if record is None:
        raise FatalError("no repair record in the node's facts (key 'repair'): start the "
                         "ladder with a finding (`provisioner node repair`)")
    return record


async def _write(ctx: StepContext, change: Callable[[RepairRecord], RepairRecord]) -> None:
    """``change`` applied to the record as stored now: an operator's skip or a finding's
    evidence written while a rung ran is kept, not overwritten by the step's older copy."""
    def apply(facts: dict[str, Any]) -> dict[str, Any]:
        record = RepairRecord.from_facts(facts)
        if record is None:
            raise FatalError("the repair record left the node's facts (key 'repair')")
        return facts | {KEY: change(record).to_facts()}

    await ctx.update_facts(apply)


def _result(rung: str, result: str) -> Callable[[RepairRecord], RepairRecord]:
    return lambda now: now.with_result(rung, result, _now())


async def repair(ctx: StepContext) -> None:
    record = _record(ctx)

    async def drain() -> None:
        wait = 0.0 if record.drain_at_once else record.drain_deadline_s
        still = await ctx.ports.repairs.drain(ctx.node, drain_reason(record), wait)
        await ctx.record(DRAIN_EVENT, f"drained: {drain_reason(record)}" + (
            f"; after {wait:g} s still running: {still}" if still else ""))

    await ctx.substep(DRAINED, drain)
    passed = any(r.passed for r in record.tried)
    for rung in record.plan:
        if passed:
            break
        record = _record(ctx)  # an operator may have skipped a rung meanwhile
        if record.result_of(rung) is not None and not ctx.finished(rung_step(rung)):
            continue  # tried in an earlier run of the ladder (a retry)
        if rung in record.skip and record.result_of(rung) is None:
            await _write(ctx, _result(rung, SKIPPED))
            await ctx.record(RUNG_EVENT, f"{rung}: skipped by an operator")
            continue
        if rung == Action.REIMAGE:
            await _write(ctx, lambda now: now.closed("reimage", _now()))
            raise StepOutcome(Event.REIMAGE, f"repair: {record.summary()}; reimaging")
        await _climb(ctx, rung)
        passed = await _gate(ctx, rung)
    record = _record(ctx)
    if not passed:
        await _write(ctx, lambda now: now.closed("service_required", _now()))
        raise StepOutcome(Event.ESCALATE, f"out of rungs: {record.summary()}")

    async def undrain() -> None:
        await ctx.ports.repairs.undrain(ctx.node)
        await _write(ctx, lambda now: now.closed(PASSED, _now()))

    await ctx.substep(UNDRAINED, undrain)


async def _climb(ctx: StepContext, rung: str) -> None:
    """One rung, checkpointed; its failure (a driver's error) is written as its result."""
    async def attempt() -> None:
        try:
            if rung == Action.RESET_GPU:
                await ctx.ports.repairs.reset_gpus(ctx.node)
            elif rung == Action.RESTART_OS:
                await ctx.ports.repairs.restart_os(ctx.node)
            elif rung == Action.POWER_CYCLE:
                await _power_cycle(ctx)
            else:
                raise FatalError(f"unknown rung {rung!r}")
        except StoreUnavailable:
            raise
        except DriverError as exc:
            await _write(ctx, _result(rung, f"error: {exc}"))
            await ctx.record(RUNG_EVENT, f"{rung}: error: {exc}")
            return
        await ctx.record(RUNG_EVENT, f"{rung}: done; validating again")

    await ctx.substep(rung_step(rung), attempt)


async def _power_cycle(ctx: StepContext) -> None:
    """Off and on through the BMC (each confirmed by read-back and checkpointed), then wait
    for the OS."""
    if ctx.node.bmc is None:
        raise FatalError("no BMC: no power cycle")

    async def power(state: PowerState) -> None:
        bmc = await ctx.bmc()
        if state is PowerState.ON:
            await ctx.ports.stagger.wait(ctx.node)
        await bmc.set_power(state)
        await ctx.note_power(str(state))

    await ctx.substep(f"{rung_step(Action.POWER_CYCLE)}:off", lambda: power(PowerState.OFF))
    await ctx.substep(f"{rung_step(Action.POWER_CYCLE)}:on", lambda: power(PowerState.ON))
    await ctx.ports.repairs.wait_os(ctx.node)


async def _gate(ctx: StepContext, rung: str) -> bool:
    """The validation gate after ``rung``: facts collected again, the profile's checks;
    the result written into the repair record (and the validation record)."""
    async def check() -> None:
        if _record(ctx).result_of(rung) is not None:
            return  # the rung itself failed: nothing to validate
        try:
            await ctx.ports.installer.collect_facts(ctx.node, f"{ctx.run_id}-{rung}")
        except StoreUnavailable:
            raise
        except DriverError as exc:
            result = f"failed: facts not collected: {exc}"
        else:
            await ctx.merge_facts({})  # the facts the node just reported
            checked = await ctx.ports.validator.check(ctx.node)
            await ctx.merge_facts({VALIDATION_KEY: checked.to_facts()})
            result = PASSED if checked.passed else f"failed: {checked.reason}"
        await _write(ctx, _result(rung, result))
        await ctx.record(RUNG_EVENT, f"{rung}: validation {result}")

    await ctx.substep(gate_step(rung), check)
    found = _record(ctx).result_of(rung)
    return found is not None and found.passed
