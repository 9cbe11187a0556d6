"""OpenIPMI's ``ipmi_sim`` as a BMC on loopback (PEERS.md §4), with a ``chassis_control``
script that keeps power and boot device in files and logs every call it gets.

``with running_ipmi_sim(tmp_path) as bmc:`` then ``bmc.port``, ``bmc.power()``,
``bmc.calls()``. Users: ``admin``/``secret`` (admin). Stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.peers.ports import free_tcp_port, free_udp_port, stop_process

USER: Final = "admin"
PASSWORD: Final = "secret"
READY_TIMEOUT_S: Final = 20.0

_CHASSIS = """#!/bin/sh
# chassis_control for ipmi_sim: state in files, every call logged
D={d}
echo "$*" >> "$D/chassis.log"
shift   # the MC address
op=$1; shift
case "$op" in
get)
  for what in "$@"; do
    case "$what" in
      power) echo "power:$(cat "$D/power" 2>/dev/null || echo 0)" ;;
      boot) echo "boot:$(cat "$D/boot" 2>/dev/null || echo default)" ;;
    esac
  done ;;
set)
  while [ $# -gt 0 ]; do
    case "$1" in
      power) echo "$2" > "$D/power" ;;
      shutdown) [ "$2" = 1 ] && echo 0 > "$D/power" ;;
      reset|identify) ;;
      boot) echo "$2" > "$D/boot" ;;
      *) echo "Invalid parameter: $1"; exit 1 ;;
    esac
    shift 2
  done ;;
esac
exit 0
"""

_LAN = """name "bmc1"
set_working_mc 0x20
  startlan 1
    addr {address} {port}
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{d}/chassisctl.sh 0x20"
{console}  user 1 true  ""      "test"   user  10 none md2 md5 straight
  user 2 true  "{user}" "{password}" admin 10 none md2 md5 straight
"""

_EMU = """mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
{sel}mc_enable 0x20
"""
# a SEL of 1000 records; flags 0x0a: Reserve SEL and Get SEL Allocation Info supported
_SEL = "sel_enable 0x20 1000 0x0a\n"


def lan_conf(*, address: str, port: int, d: Path, user: str = USER, password: str = PASSWORD,
             console_port: int | None = None) -> str:
    """ipmi_sim's LAN configuration (``-c``); ``console_port``: its command console."""
    console = f"  console 127.0.0.1 {console_port}\n" if console_port else ""
    return _LAN.format(address=address, port=port, d=d, user=user, password=password,
                       console=console)


def emu_commands(*, sel: bool = False) -> str:
    """ipmi_sim's emulator commands (``-f``): one BMC; ``sel``: with a SEL."""
    return _EMU.format(sel=_SEL if sel else "")


@dataclass(frozen=True)
class IpmiSimBmc:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes]
    console_port: int | None = None

    def emu(self, command: str) -> str:
        """Run one emulator command on ipmi_sim's console (``running_ipmi_sim(...,
        console=True)``), e.g. ``sel_add 0x20 0x02 ...`` (ipmi_sim_cmd(5)); its output."""
        assert self.console_port is not None, "started without console=True"
        with socket.create_connection(("127.0.0.1", self.console_port), timeout=5) as conn:
            _read_prompt(conn)
            conn.sendall(command.encode() + b"\n")
            return _read_prompt(conn)

    def sel_add(self, record: bytes) -> None:
        """Add a system-event SEL record (record type 0x02, its 13 bytes: timestamp,
        generator, EvM revision, sensor type and number, event type, event data 1-3)."""
        assert len(record) == 13
        out = self.emu("sel_add 0x20 0x02 " + " ".join(f"0x{b:02x}" for b in record))
        if "error" in out.lower() or "invalid" in out.lower():
            raise RuntimeError(f"sel_add: {out}")

    def power(self) -> str:
        path = self.workdir / "power"
        return "on" if path.exists() and path.read_text().strip() == "1" else "off"

    def boot(self) -> str:
        path = self.workdir / "boot"
        return path.read_text().strip() if path.exists() else "default"

    def calls(self) -> list[str]:
        path = self.workdir / "chassis.log"
        return path.read_text().splitlines() if path.exists() else []


def ipmi_sim_unavailable_reason() -> str | None:
    for tool in ("ipmi_sim", "ipmitool"):
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install openipmi ipmitool (scripts/setup.sh)"
    return None



@contextmanager
def running_ipmi_sim(workdir: Path, address: str = "127.0.0.1",
                     port: int | None = None, *, console: bool = False
                     ) -> Iterator[IpmiSimBmc]:
    """``address``/``port``: a BMC at the standard port 623 needs its own loopback address
    (any of 127.0.0.0/8) so it cannot clash with another. ``console``: a SEL, and the
    emulator's command console on a loopback TCP port (``IpmiSimBmc.emu``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "state").mkdir(exist_ok=True)
    script = workdir / "chassisctl.sh"
    script.write_text(_CHASSIS.format(d=workdir))
    script.chmod(0o755)
    port = port or free_udp_port()
    console_port = free_tcp_port() if console else None
    (workdir / "lan.conf").write_text(lan_conf(address=address, port=port, d=workdir,
                                               console_port=console_port))
    (workdir / "bmc.emu").write_text(emu_commands(sel=console))
    log = (workdir / "ipmi_sim.log").open("wb")
    proc = subprocess.Popen(["ipmi_sim", "-c", str(workdir / "lan.conf"), "-f",
                             str(workdir / "bmc.emu"), "-s", str(workdir / "state"), "-n"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, address, port, workdir)
        yield IpmiSimBmc(port, workdir, proc, console_port)
    finally:
        stop_process(proc)
        log.close()


def _wait_ready(proc: subprocess.Popen[bytes], address: str, port: int,
                workdir: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    probe = ["ipmitool", "-I", "lanplus", "-C", "3", "-H", address, "-p", str(port),
             "-U", USER, "-P", PASSWORD, "-N", "1", "-R", "1", "mc", "info"]
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (workdir / "ipmi_sim.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"ipmi_sim exited with {proc.returncode}: {log}")
        if subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"ipmi_sim not ready after {READY_TIMEOUT_S} s")


def _read_prompt(conn: socket.socket) -> str:
    """ipmi_sim's console output up to its prompt ("> ")."""
    data = b""
    while not data.endswith(b"> "):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")
