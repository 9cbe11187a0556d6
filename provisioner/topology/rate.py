"""InfiniBand link rates: ``4xHDR`` from ibnetdiscover, ``4X 53.125 Gbps`` from iblinkinfo,
``400 Gb/sec (4X NDR)`` from sysfs/ibstatus, all compared by their data rate in Gb/s."""

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
    def from_sysfs(cls, text: str) -> LinkRate | None:
        """sysfs/ibstatus ``400 Gb/sec (4X NDR)``; the Gb/s alone when there is no name."""
        match = _SYSFS_RATE.match(text)
        if match is None:
            return None
        if match[2] is not None and (named := cls.of(int(match[2]), match[3].upper())):
            return named
        return cls(float(match[1]))
