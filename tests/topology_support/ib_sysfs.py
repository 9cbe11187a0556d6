"""A node's /sys as the kernel writes it for its InfiniBand HCAs, built from a real ``ibstat``
capture (tests/fixtures/topology/infiniband/, provenance in its README), so that both
collectors (the ramdisk's ``provisioner.agent.collect`` and the Ansible facts module) read the
same real ports.

The kernel's formats (drivers/infiniband/core/sysfs.c): ``state`` ``4: ACTIVE``,
``phys_state`` ``5: LinkUp``, ``rate`` ``400 Gb/sec (4X NDR)``, ``link_layer``
``InfiniBand``/``Ethernet``, ``lid`` ``0x31``, ``node_guid`` ``a088:c203:000d:58e8``. ibstat
prints only the rate's number: the width/speed words are the usual 4X ones for that number.
"""

from __future__ import annotations

from pathlib import Path

from provisioner.topology.parse_ibstat import parse_ibstat

STATES = {"down": "1: DOWN", "init": "2: INIT", "armed": "3: ARMED", "active": "4: ACTIVE"}
PHYS = {"sleep": "1: Sleep", "polling": "2: Polling", "disabled": "3: Disabled",
        "portconfigurationtraining": "4: PortConfigurationTraining", "linkup": "5: LinkUp",
        "linkerrorrecovery": "6: LinkErrorRecovery"}
RATES = {10.0: "10 Gb/sec (4X SDR)", 20.0: "20 Gb/sec (4X DDR)", 25.0: "25 Gb/sec (1X EDR)",
         40.0: "40 Gb/sec (4X QDR)", 56.0: "56 Gb/sec (4X FDR)", 100.0: "100 Gb/sec (4X EDR)",
         200.0: "200 Gb/sec (4X HDR)", 400.0: "400 Gb/sec (4X NDR)",
         800.0: "800 Gb/sec (4X XDR)"}
#: the IB modules /sys/module shows once the ramdisk (or the OS) loaded the stack for mlx5
LOADED = ("ib_core", "ib_uverbs", "ib_umad", "mlx5_core", "mlx5_ib")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def sysfs_from_ibstat(root: Path, ibstat: str, *, lids: bool = True) -> Path:
    """``root/sys/class/infiniband/<ca>/...`` for every CA and port of the capture."""
    base = root / "sys/class/infiniband"
    base.mkdir(parents=True, exist_ok=True)
    for ca in parse_ibstat(ibstat):
        dev = base / ca.name
        if ca.node_guid:
            guid = ca.node_guid.removeprefix("0x").rjust(16, "0")
            write(dev / "node_guid", ":".join(guid[i:i + 4] for i in range(0, 16, 4)))
        if ca.ca_type:
            write(dev / "hca_type", ca.ca_type)
        for port in ca.ports:
            where = dev / "ports" / str(port.number)
            write(where / "state", STATES[port.state.value])
            write(where / "phys_state", PHYS[port.physical.replace(" ", "").lower()])
            if port.rate is not None:
                write(where / "rate", RATES[port.rate.gbps])
            write(where / "link_layer", port.link_layer)
            if lids and port.lid is not None:
                write(where / "lid", f"0x{port.lid:x}")
    return root


def load_modules(root: Path, names: tuple[str, ...] = LOADED) -> Path:
    """``root/sys/module/<name>`` as the kernel makes it for a loaded module."""
    for name in names:
        write(root / "sys/module" / name / "initstate", "live")
    return root


def pci_functions(root: Path, lspci: str) -> Path:
    """``root/sys/bus/pci/devices/0000:<bdf>`` for the Mellanox functions of a real
    ``lspci`` listing (class 0x0207 InfiniBand, 0x0200 Ethernet; device IDs of pci.ids:
    MT2910 ConnectX-7 0x1021, MT2892 ConnectX-6 Dx 0x101d, BlueField-3 0xa2dc)."""
    devices = {"MT2910": "0x1021", "MT2892": "0x101d", "BlueField-3": "0xa2dc"}
    for line in lspci.splitlines():
        bdf, _, rest = line.partition(" ")
        if "Mellanox" not in rest:
            continue
        klass = "0x020700" if rest.startswith("Infiniband") else "0x020000"
        device = next((d for name, d in devices.items() if name in rest), "0x0000")
        where = root / "sys/bus/pci/devices" / f"0000:{bdf}"
        write(where / "vendor", "0x15b3")
        write(where / "device", device)
        write(where / "class", klass)
    return root
