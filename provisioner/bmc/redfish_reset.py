"""Which Redfish ``ResetType`` to send for a power intent: no I/O.

BMCs list what they accept in ``ResetType@Redfish.AllowableValues`` (or an ActionInfo
resource), and not always well: HPE iLO 5 offers no ``GracefulShutdown`` but
``PushPowerButton``; some Supermicro firmware lists ``GracefulShutdownGracefulRestart``
(two values run together); some BMCs list nothing. ``offered`` reads such a list, splitting
run-together values into the ResetTypes they are made of; ``candidates`` orders what to try
for an intent: the preferred types the BMC offers, or, when it lists nothing usable, every
type for the intent (the BMC's 400 then moves on to the next). ``off_then_on``: a BMC with
no cycle type (HPE Cray EX: ``On``, ``ForceOff`` and the non-standard ``Off``) is cycled by
powering off and on (``base.PowerCycleUnsupported``).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Final

RESET_TYPES: Final = ("On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart",
                      "Nmi", "ForceOn", "PushPowerButton", "PowerCycle", "FullPowerCycle",
                      "Suspend", "Pause", "Resume")
_BY_LOWER: Final = {name.lower(): name for name in RESET_TYPES}


class Intent(StrEnum):
    ON = "on"
    OFF = "off"
    SOFT_OFF = "soft-off"
    CYCLE = "cycle"


# Best first. PushPowerButton toggles: it is only ever sent after a read said the power is
# the other way (base.ensure_power reads first), and only where the BMC offers it.
PREFERENCE: Final = {
    Intent.ON: ("On", "ForceOn", "PushPowerButton"),
    Intent.OFF: ("ForceOff",),
    Intent.SOFT_OFF: ("GracefulShutdown", "PushPowerButton"),
    Intent.CYCLE: ("ForceRestart", "PowerCycle", "FullPowerCycle"),
}
_ONLY_IF_OFFERED: Final = frozenset({"PushPowerButton"})


def offered(values: Iterable[object]) -> tuple[str, ...]:
    """The ResetTypes a BMC's list names, in its order, de-duplicated: exact names, names
    in another case, and run-together names split (unknown words are dropped)."""
    seen: dict[str, None] = {}
    for value in values:
        if not isinstance(value, str):
            continue
        for name in _split(value.strip()):
            seen.setdefault(name)
    return tuple(seen)


def candidates(intent: Intent, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """What to try for ``intent``, best first; empty when the BMC offers none of them."""
    preferred = PREFERENCE[intent]
    if allowed:
        return tuple(kind for kind in preferred if kind in allowed)
    return tuple(kind for kind in preferred if kind not in _ONLY_IF_OFFERED)


def off_then_on(allowed: tuple[str, ...]) -> bool:
    """Whether a cycle the BMC cannot do as one ResetType can be done as off, then on."""
    return bool(candidates(Intent.OFF, allowed)) and bool(candidates(Intent.ON, allowed))


def _split(value: str) -> list[str]:
    """``GracefulShutdownGracefulRestart`` -> both; a known name -> itself; else []."""
    exact = _BY_LOWER.get(value.lower())
    if exact is not None:
        return [exact]
    names: list[str] = []
    rest = value.lower()
    while rest:
        match = max((lower for lower in _BY_LOWER if rest.startswith(lower)), key=len,
                    default=None)
        if match is None:
            return []  # not made of ResetTypes: ignore it rather than guess
        names.append(_BY_LOWER[match])
        rest = rest[len(match):]
    return names
