"""InfiniBand link rates: ``4xHDR`` from ibnetdiscover, ``4X 53.125 Gbps`` from iblinkinfo,
``400 Gb/sec (4X NDR)`` from sysfs/ibstatus, ``Rate: 400`` from ibstat.

Two units. ``gbps`` is the data rate (after line encoding) of a named rate: links of a fabric
are compared with it. ``nominal_gbps`` is the number ``ibstat`` and sysfs print (the IBTA
nominal rate: 4X QDR 40, 4X FDR 56, 4X EDR 100, 4X HDR 200, 4X NDR 400): profiles
(``ib_rate_gbps``) are written and checked in it, so a port reads the same whichever collector
ran (sysfs ``40 Gb/sec (4X QDR)`` and ibstat ``Rate: 40`` are both 40, where the data rates are
32 and, unnamed, 40). A bare number (ibstat, or sysfs without a name) is nominal."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Per-lane data rate in Gb/s (after encoding) and the signalling rate iblinkinfo prints.
_SPEEDS: dict[str, tuple[float, float]] = {
    "SDR": (2.0, 2.5), "DDR": (4.0, 5.0), "QDR": (8.0, 10.0), "FDR10": (10.0, 10.3125),
    "FDR": (13.64, 14.0625), "EDR": (25.0, 25.78125), "HDR": (50.0, 53.125),
    "NDR": (100.0, 106.25), "XDR": (200.0, 212.5),
}
_BY_SIGNAL = {signal: name for name, (_, signal) in _SPEEDS.items()}
# Per-lane nominal rate: what sysfs and ibstat print divided by the width
_NOMINAL: dict[str, float] = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0,
                              "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}
_TOKEN = re.compile(r"^(\d{1,2})\s*[xX]\s*([A-Za-z0-9]+)$")
_SYSFS_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec(?:\s*\((\d{1,2})X\s+([A-Za-z0-9]+)\))?")


@dataclass(frozen=True, slots=True)
class LinkRate:
    """A link's rate: width and speed name where known (``4xHDR``), always the data Gb/s."""

    gbps: float
    width: int | None = None
    speed: str | None = None

    def __str__(self) -> str:
        if self.width is not None and self.speed is not None:
            return f"{self.width}x{self.speed}"
        return f"{self.gbps:g}Gb/s"

    @property
    def nominal_gbps(self) -> float:
        """The rate as ``ibstat``/sysfs print it (see the module): ``4xQDR`` is 40, ``4xFDR``
        56; a bare number is already nominal."""
        if self.width is not None and self.speed in _NOMINAL:
            return round(self.width * _NOMINAL[self.speed], 2)
        return self.gbps

    @classmethod
    def from_token(cls, text: str) -> LinkRate | None:
        """``4xHDR`` / ``4x HDR`` (ibnetdiscover); None for ``???`` or an unknown speed."""
        match = _TOKEN.match(text.strip())
        if match is None:
            return None
        return cls.of(int(match[1]), match[2].upper())

    @classmethod
    def of(cls, width: int, speed: str) -> LinkRate | None:
        lane = _SPEEDS.get(speed)
        if lane is None or width not in (1, 2, 4, 8, 12):
            return None
        return cls(round(width * lane[0], 2), width, speed)

    @classmethod
    def from_signalling(cls, width: int, lane_gbps: float) -> LinkRate | None:
        """iblinkinfo's ``4X 53.125 Gbps``: the per-lane signalling rate names the speed."""
        speed = _BY_SIGNAL.get(lane_gbps)
        return None if speed is None else cls.of(width, speed)

    @classmethod
    def nominal(cls, value: float) -> LinkRate:
        """ibstat's ``Rate: 40``: a nominal number, kept as it is (its speed is ambiguous:
        4X QDR and 4X FDR10 are both 40)."""
        return cls(value)

    @classmethod
    def from_sysfs(cls, text: str) -> LinkRate | None:
        """sysfs/ibstatus ``400 Gb/sec (4X NDR)``; the Gb/s alone when there is no name."""
        match = _SYSFS_RATE.match(text)
        if match is None:
            return None
        if match[2] is not None and (named := cls.of(int(match[2]), match[3].upper())):
            return named
        return cls(float(match[1]))
