"""ResetType choice (``bmc/redfish_reset.py``) from the lists real BMCs publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.bmc.redfish_reset import Intent, candidates, off_then_on, offered

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish"
ILO5 = ["On", "ForceOff", "ForceRestart", "Nmi", "PushPowerButton"]
SMC = ["On", "ForceOff", "GracefulShutdownGracefulRestart", "ForceRestart", "Nmi", "ForceOn"]


def action_info(vendor: str) -> list[str]:
    """ResetType's AllowableValues in a recorded ResetActionInfo."""
    info = json.loads((FIXTURES / vendor / "resetactioninfo.json").read_text())
    return next(p["AllowableValues"] for p in info["Parameters"] if p["Name"] == "ResetType")


CRAY_EX = action_info("hpe-cray-ex235n")
GIGABYTE = action_info("gigabyte")


def test_offered_splits_run_together_values_and_drops_garbage() -> None:
    assert offered(SMC) == ("On", "ForceOff", "GracefulShutdown", "GracefulRestart",
                            "ForceRestart", "Nmi", "ForceOn")
    assert offered(["forceoff", " On ", 7, None, "Onboard", "ForceOff"]) == ("ForceOff", "On")


@pytest.mark.parametrize(("intent", "allowed", "want"), [
    (Intent.SOFT_OFF, ILO5, ("PushPowerButton",)),
    (Intent.SOFT_OFF, SMC, ("GracefulShutdown",)),
    (Intent.SOFT_OFF, ["On", "ForceOff"], ()),
    (Intent.SOFT_OFF, [], ("GracefulShutdown",)),  # no list: try, never a toggle unasked
    (Intent.ON, ["ForceOn", "ForceOff"], ("ForceOn",)),
    (Intent.ON, ["PushPowerButton", "ForceOff"], ("PushPowerButton",)),
    (Intent.CYCLE, ["On", "PowerCycle", "ForceOff"], ("PowerCycle",)),
    (Intent.CYCLE, [], ("ForceRestart", "PowerCycle", "FullPowerCycle")),
    (Intent.OFF, ILO5, ("ForceOff",)),
], ids=["ilo5-soft", "supermicro-soft", "no-soft", "no-list", "force-on", "button-on",
        "power-cycle", "cycle-no-list", "ilo5-off"])
def test_candidates(intent: Intent, allowed: list[str], want: tuple[str, ...]) -> None:
    assert candidates(intent, offered(allowed)) == want


def test_recorded_action_infos() -> None:
    assert CRAY_EX == ["ForceOff", "On", "Off"]  # "Off" is no ResetType: dropped
    assert offered(CRAY_EX) == ("ForceOff", "On")
    assert offered(GIGABYTE) == ("GracefulShutdown", "ForceRestart", "ForceOff", "On")


@pytest.mark.parametrize(("allowed", "cycle", "by_off_on"), [
    (CRAY_EX, (), True),                       # HPE Cray EX235n: off, then on
    (GIGABYTE, ("ForceRestart",), True),
    (ILO5, ("ForceRestart",), True),
    (["On", "PowerCycle"], ("PowerCycle",), False),  # no way to power off
    (["ForceOff", "GracefulShutdown"], (), False),   # no way to power on again
    ([], ("ForceRestart", "PowerCycle", "FullPowerCycle"), True),  # unknown: try all
], ids=["cray-ex235n", "gigabyte", "ilo5", "no-off", "no-on", "no-list"])
def test_cycle_and_its_off_on_fallback(allowed: list[str], cycle: tuple[str, ...],
                                       by_off_on: bool) -> None:
    """The driver falls back to off-then-on only when the cycle types are missing or all
    refused, and only where the BMC can do both halves."""
    assert candidates(Intent.CYCLE, offered(allowed)) == cycle
    assert off_then_on(offered(allowed)) is by_off_on
