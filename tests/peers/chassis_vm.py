#!/usr/bin/env python3
"""``chassis_control`` for ipmi_sim that owns a qemu VM (PEERS.md §4), standard library only.

Called by ipmi_sim as ``chassis_vm.py WORKDIR 0x20 get power boot`` or ``... set power 1``.
Power on starts qemu (daemonized, serial to a file, QMP socket) with the stored boot device;
power off quits it over QMP; every call is logged to WORKDIR/chassis.log. The VM's qemu
arguments are in WORKDIR/vm.json (written by the test).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def alive(work: Path) -> bool:
    try:
        os.kill(int((work / "qemu.pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def qmp(work: Path, command: str) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(work / "qmp.sock"))
        sock.recv(4096)
        for message in ({"execute": "qmp_capabilities"}, {"execute": command}):
            sock.sendall(json.dumps(message).encode())
            sock.recv(4096)


def power_on(work: Path) -> None:
    if alive(work):
        return
    vm = json.loads((work / "vm.json").read_text())
    boot = (work / "boot").read_text().strip() if (work / "boot").exists() else "default"
    if "disk" in vm:  # UEFI (AAVMF): the firmware follows qemu's boot order
        nic_index, disk_index = (1, 2) if boot == "pxe" else (2, 1)
        devices = ["-device", f"{vm['nic']},bootindex={nic_index}",
                   "-device", f"{vm['disk']},bootindex={disk_index}"]
    else:  # SeaBIOS: no PXE ROM on the NIC = no netboot at all
        devices = ["-device", vm["nic"] + (",bootindex=1" if boot == "pxe" else ",romfile=")]
    subprocess.run([*vm["qemu"], *devices, "-daemonize", "-pidfile",
                    str(work / "qemu.pid"), "-display", "none", "-serial",
                    f"file:{work / 'serial.log'}", "-qmp",
                    f"unix:{work / 'qmp.sock'},server=on,wait=off"], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=open(work / "qemu.err", "ab"))  # noqa: SIM115


def power_off(work: Path) -> None:
    if not alive(work):
        return
    try:
        qmp(work, "quit")
    except OSError:
        os.kill(int((work / "qemu.pid").read_text()), 9)
    for _ in range(50):
        if not alive(work):
            return
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    work = Path(argv[1])
    args = argv[3:]  # argv[2] is the MC address
    with open(work / "chassis.log", "a") as log:
        log.write(" ".join(args) + "\n")
    if args[:1] == ["get"]:
        for what in args[1:]:
            if what == "power":
                print(f"power:{1 if alive(work) else 0}")
            elif what == "boot":
                boot = work / "boot"
                print(f"boot:{boot.read_text().strip() if boot.exists() else 'default'}")
        return 0
    pairs = list(zip(args[1::2], args[2::2], strict=False))
    for key, value in pairs:
        if key == "power" and value == "1":
            power_on(work)
        elif key == "power":
            power_off(work)
        elif key == "reset" and value == "1":
            power_off(work)
            power_on(work)
        elif key == "shutdown" and value == "1":
            power_off(work)  # the busybox guest ignores the ACPI button
        elif key == "boot":
            (work / "boot").write_text(value)
        elif key != "identify":
            print(f"Invalid parameter: {key}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
