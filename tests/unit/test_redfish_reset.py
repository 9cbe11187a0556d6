"""ResetType choice (``bmc/redfish_reset.py``) from the lists real BMCs publish."""

from __future__ import annotations

import pytest

from provisioner.bmc.redfish_reset import Intent, candidates, offered

ILO5 = ["On", "ForceOff", "ForceRestart", "Nmi", "PushPowerButton"]
SMC = ["On", "ForceOff", "GracefulShutdownGracefulRestart", "ForceRestart", "Nmi", "ForceOn"]


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
