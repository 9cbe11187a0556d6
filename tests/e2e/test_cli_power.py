"""``provisioner node power`` / ``node bootdev`` against a real daemon: a node on the shipped
``fake`` driver, and one enrolled with ``--bmc-driver ipmi`` whose BMC is pyghmi's server
class (tests/sim/ipmi_bmc.py): the daemon powers it through the real ipmi driver, and
``node action NODE inspect`` sets PXE and powers it on."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli_api import (
    BMC_PASSWORD,
    as_json,
    new_token,
    run_cli,
    running_daemon,
)
from tests.e2e.test_cli_api import cli as cli  # noqa: F401  (fixtures)
from tests.e2e.test_cli_api import daemon as daemon  # noqa: F401
from tests.e2e.test_cli_api import token as token  # noqa: F401
from tests.sim.ipmi_bmc import SimBmcs

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bmc() -> Iterator[SimBmcs]:
    with SimBmcs(count=3, password=BMC_PASSWORD) as sim:
        yield sim


def enroll_ipmi(cli: Any, bmc: SimBmcs, port: int, serial: str, mac: str,
                tmp_path: Path) -> Path:
    """``node enroll`` with the simulated BMC on ``port``; returns the password file."""
    secret = tmp_path / "bmc.pw"
    secret.write_text(BMC_PASSWORD + "\n")
    cli("node", "enroll", "--serial", serial, "--mac", mac, "--bmc-driver", "ipmi",
        "--bmc-address", "127.0.0.1", "--bmc-port", str(port), "--bmc-username", bmc.user,
        "--bmc-password-file", str(secret))
    return secret


def test_power_and_bootdev_on_a_fake_bmc(cli: Any) -> None:
    cli("node", "enroll", "--serial", "PWR1", "--mac", "52:54:00:aa:00:01", "--bmc-driver",
        "fake", "--bmc-address", "PWR1")
    assert cli("node", "power", "PWR1", "on").stdout.strip() == "PWR1: power on done; now on"
    assert as_json(cli("node", "power", "PWR1", "status", "--json"))["power_state"] == "on"
    out = cli("node", "bootdev", "PWR1", "pxe", "--persistent").stdout.strip()
    assert out == "PWR1: boot device pxe (persistent, UEFI)"
    history = as_json(cli("node", "history", "PWR1", "--json"))
    assert [(h["event"], h["actor"]) for h in history[1:]] == [
        ("power_on", "token:e2e-admin"), ("bootdev", "token:e2e-admin")]


def test_ipmi_enroll_power_bootdev_and_inspect(cli: Any, bmc: SimBmcs, tmp_path: Path) -> None:
    port = bmc.ports[0]
    enroll_ipmi(cli, bmc, port, "IPMI1", "52:54:00:aa:00:02", tmp_path)
    assert "now on" in cli("node", "power", "IPMI1", "on").stdout
    assert bmc.stats()[port]["power"] == "on"
    assert "now off" in cli("node", "power", "IPMI1", "off").stdout
    cli("node", "bootdev", "IPMI1", "disk", "--persistent")
    assert (bmc.stats()[port]["bootdev"], bmc.stats()[port]["boot_flags"] & 0x40) == (8, 0x40)

    cli("node", "action", "IPMI1", "inspect")  # boot device PXE, then power on
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = bmc.stats()[port]
        if stats["power"] == "on" and stats["bootdev"] == 4:
            break
        time.sleep(0.2)
    assert (stats["power"], stats["bootdev"], stats["opened"]) == ("on", 4, 1), stats
    cli("node", "action", "IPMI1", "abort")  # no inspection agent will ever report here
    shown = json.loads(cli("node", "show", "IPMI1", "--json").stdout)
    assert BMC_PASSWORD not in json.dumps(shown)


def test_power_sync_records_an_out_of_band_power_on(cli: Any, bmc: SimBmcs,
                                                    tmp_path: Path) -> None:
    """The daemon's periodic power sync (every second here) reads the BMC and records a
    change nobody asked the daemon for, with the power-sync actor."""
    port = bmc.ports[1]
    secret = enroll_ipmi(cli, bmc, port, "SYNC1", "52:54:00:aa:00:03", tmp_path)
    assert "now off" in cli("node", "power", "SYNC1", "off").stdout
    subprocess.run(["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(port), "-U",
                    bmc.user, "-f", str(secret), "chassis", "power", "on"],
                   check=True, capture_output=True, timeout=30)
    assert bmc.stats()[port]["power"] == "on"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        history = as_json(cli("node", "history", "SYNC1", "--json"))
        synced = [h for h in history if h["event"] == "power_sync"]
        if synced:
            break
        time.sleep(0.5)
    assert [(h["actor"], h["reason"]) for h in synced] == [
        ("power-sync", "power off\u2192on out of band")], history
    assert as_json(cli("node", "show", "SYNC1", "--json"))["power_state"] == "on"


def test_daemon_stop_logs_its_bmc_sessions_out(bmc: SimBmcs, tmp_path: Path) -> None:
    """SIGTERM: once the steps have stopped, every IPMI session the daemon kept is closed
    (Close Session reaches the BMC), so BMCs with few session slots are not left full."""
    secret = tmp_path / "bmc.pw"
    secret.write_text(BMC_PASSWORD + "\n")
    port = bmc.ports[2]
    with running_daemon(tmp_path) as own:
        admin = new_token(own, "admin", "stop-test")
        enrolled = run_cli(own, "node", "enroll", "--serial", "STOP1", "--mac",
                           "52:54:00:aa:00:04", "--bmc-driver", "ipmi", "--bmc-address",
                           "127.0.0.1", "--bmc-port", str(port), "--bmc-username", bmc.user,
                           "--bmc-password-file", str(secret), token=admin)
        assert enrolled.returncode == 0, enrolled.stderr
        status = run_cli(own, "node", "power", "STOP1", "status", token=admin)
        assert status.returncode == 0, status.stderr
        assert bmc.stats()[port]["opened"] >= 1
        assert bmc.stats()[port]["closed"] == 0
    stats = bmc.stats()[port]
    assert stats["closed"] == stats["opened"], stats


def test_bmc_rotate_from_the_cli(cli: Any, tmp_path: Path) -> None:
    """``provisioner node bmc NODE rotate`` on an ipmi_sim BMC: the old password stops
    working (ipmitool), the daemon keeps reaching the BMC with the new one, which no
    command output shows."""
    from tests.integration.test_bmc_rotation import ipmitool_logs_in
    from tests.peers import ipmi_sim

    if ipmi_sim.ipmi_sim_unavailable_reason():
        pytest.skip(ipmi_sim.ipmi_sim_unavailable_reason() or "")
    USER, PASSWORD = ipmi_sim.USER, ipmi_sim.PASSWORD  # noqa: N806
    with ipmi_sim.running_ipmi_sim(tmp_path / "sim") as sim:
        secret = tmp_path / "old.pw"
        secret.write_text(PASSWORD + "\n")
        cli("node", "enroll", "--serial", "ROT1", "--mac", "52:54:00:aa:00:09",
            "--bmc-driver", "ipmi", "--bmc-address", "127.0.0.1", "--bmc-port",
            str(sim.port), "--bmc-username", USER, "--bmc-password-file", str(secret))
        out = cli("node", "bmc", "ROT1", "rotate").stdout
        assert "BMC password rotated" in out and PASSWORD not in out
        assert not ipmitool_logs_in(sim.port, PASSWORD)
        assert "power is off" in cli("node", "power", "ROT1", "status").stdout
        history = as_json(cli("node", "history", "ROT1", "--json"))
        assert [h["event"] for h in history] == ["enroll", "bmc_password_rotated"]
