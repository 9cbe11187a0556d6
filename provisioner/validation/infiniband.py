"""Whether a facts report can say anything about InfiniBand at all. Pure.

The ports under /sys/class/infiniband exist only once an InfiniBand driver (``ib_core`` and an
HCA driver such as ``mlx5_ib``) is loaded; ``mlx5_core`` alone gives Ethernet netdevs and no
InfiniBand device. A report read without such a driver lists no port whatever the hardware, so
"0 ports" there is not a finding:

- at inspection (the SKU gate) the check is not run and the record carries the note
  ``InfiniBand not checked at inspection: no driver (...)`` (the inspection ramdisk loads the
  stack only for the Mellanox HCAs it finds: a machine without one shows this state);
- at validation (the OS is up) a missing driver fails the node, naming it.

The report says so in ``infiniband_driver`` (both collectors write it); a report without that
field (an older ramdisk or facts module) counts as having a driver when it lists an HCA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

NOT_CHECKED: Final = "InfiniBand not checked at inspection: no driver"
NOT_CHECKED_CHECK: Final = "infiniband-not-checked"
"""The name the verdict's ``checks`` carry for the InfiniBand check that did not run."""


@dataclass(frozen=True, slots=True)
class IbDriver:
    loaded: bool
    reported: bool
    """The report has ``infiniband_driver`` (else ``loaded`` is inferred from its HCAs)."""
    modules: tuple[str, ...] = ()
    mellanox_functions: int | None = None

    def why(self) -> str:
        """What the report shows instead of a driver, for the operator."""
        if not self.reported:
            return "the report names no InfiniBand driver and lists no HCA"
        modules = f"; modules loaded: {', '.join(self.modules)}" if self.modules else ""
        if self.mellanox_functions == 0:
            return f"no Mellanox HCA on PCI{modules}"
        if self.mellanox_functions is None:
            return f"no HCA driver loaded{modules}"
        return (f"{self.mellanox_functions} Mellanox PCI network functions but no HCA driver "
                f"loaded{modules or '; modules loaded: none'}")


def ib_driver(report: Mapping[str, Any]) -> IbDriver:
    raw = report.get("infiniband_driver")
    if isinstance(raw, Mapping) and isinstance(raw.get("loaded"), bool):
        modules = raw.get("modules")
        functions = raw.get("mellanox_functions")
        return IbDriver(
            raw["loaded"], True,
            tuple(str(m) for m in modules) if isinstance(modules, list) else (),
            functions if isinstance(functions, int) and not isinstance(functions, bool)
            else None)
    hcas = report.get("infiniband")
    listed = isinstance(hcas, list) and any(isinstance(h, Mapping) for h in hcas)
    return IbDriver(listed, False)


def not_checked_note(driver: IbDriver) -> str:
    return f"{NOT_CHECKED} ({driver.why()})"


def no_driver_failure(driver: IbDriver, ports: int | None, rate: float | None) -> str:
    """The validation gate's line for a node whose OS loaded no InfiniBand driver."""
    want = [f"{ports} InfiniBand ports" if ports is not None else "InfiniBand ports"]
    if rate is not None:
        want.append(f"at {rate:g} Gb/s")
    return f"ib-driver: no InfiniBand driver loaded ({driver.why()}), expected {' '.join(want)}"
