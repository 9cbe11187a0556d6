"""The BMC settings baseline against a recorded iDRAC and Dell's manager attribute registry
(provisioner.validation.bmc_settings, pure), the settings drift (validation.drift) and the
``[servicing.profiles.<p>.bmc]`` section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from provisioner.config.servicing import BmcSettings
from provisioner.validation.bmc_settings import (
    BmcView,
    bmc_changes,
    check_bmc,
    normalise,
    patch_bodies,
)
from provisioner.validation.drift import Difference, combine, settings_drift

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish-bmc-settings"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def idrac() -> BmcView:
    attributes: dict[str, object] = {}
    for name in ("attributes_idrac.json", "attributes_system.json", "attributes_lc.json"):
        attributes.update(load(name)["Attributes"])
    return BmcView(attributes, load("manager_attribute_registry.json"),
                   load("network_protocol.json"), load("manager.json"))


def test_the_recorded_idrac_reads_as_the_step_names_it() -> None:
    view = idrac()
    assert view.value("NetworkProtocol.IPMI.ProtocolEnabled") is True
    assert view.value("NetworkProtocol.NTP.NTPServers") == ()  # three empty slots
    assert view.value("Manager.DateTimeLocalOffset") == "-05:00"
    assert view.value("LCD.1.ChassisIdentifyDuration") == -1
    assert view.value("NetworkProtocol.Telnet.Nope") is None


def test_every_refusal_at_once() -> None:
    wanted = normalise({"LCD.1.ChassisIdentifyDuration": "thirty",
                        "PCIeSlotLFM.3.MaxLFM": 2, "No.Such.Thing": 1,
                        "LCAttributes.1.AutoBackup": "Sometimes",
                        "NetworkProtocol.IPMI.ProtocolEnabled": "no",
                        "NetworkProtocol.RDP.ProtocolEnabled": False,
                        "NetworkProtocol.NTP.NTPServers": ["a", "b", "c", "d"],
                        "Manager.DateTimeLocalOffset": "UTC"})
    assert check_bmc(wanted, idrac()) == [
        "LCAttributes.1.AutoBackup: 'Sometimes' not allowed (allowed: 0, 1)",
        "LCD.1.ChassisIdentifyDuration: 'thirty' is not an integer",
        "No.Such.Thing: unknown attribute (not in registry OEMAttributeRegistry)",
        "PCIeSlotLFM.3.MaxLFM: read-only in the registry",
        "NetworkProtocol.IPMI.ProtocolEnabled: 'no' is not a boolean",
        "NetworkProtocol.RDP.ProtocolEnabled: the BMC's NetworkProtocol has no RDP",
        "NetworkProtocol.NTP.NTPServers: 4 servers, the BMC has 3 slots",
        "Manager.DateTimeLocalOffset: 'UTC' is not an offset like +00:00"]


def test_accepted_values_and_the_changes() -> None:
    wanted = normalise({"LCAttributes.1.AutoBackup": "Enabled",  # Dell's display name
                        "LCD.1.ChassisIdentifyDuration": -1,
                        "NetworkProtocol.SSH.ProtocolEnabled": True,
                        "NetworkProtocol.NTP.NTPServers": ["10.0.0.1"],
                        "Manager.DateTimeLocalOffset": "+00:00"})
    view = idrac()
    assert check_bmc(wanted, view) == []
    changes = bmc_changes(wanted, view)
    assert changes == {"LCAttributes.1.AutoBackup": "Enabled",
                       "NetworkProtocol.NTP.NTPServers": ("10.0.0.1",),
                       "Manager.DateTimeLocalOffset": "+00:00"}
    assert patch_bodies(changes) == ({"LCAttributes.1.AutoBackup": "Enabled"},
                                     {"NTP": {"NTPServers": ["10.0.0.1"]}},
                                     {"DateTimeLocalOffset": "+00:00"})


def test_a_bmc_without_manager_attributes_or_network_protocol() -> None:
    bare = BmcView(manager={"DateTimeLocalOffset": "+00:00"})
    assert check_bmc({"IPMILan.1.Enable": "Disabled",
                      "NetworkProtocol.IPMI.ProtocolEnabled": False}, bare) == [
        "IPMILan.1.Enable: this BMC has no Redfish manager attributes (no attribute "
        "resource on its Manager)",
        "NetworkProtocol.IPMI.ProtocolEnabled: this BMC has no Redfish NetworkProtocol "
        "resource"]


def test_settings_drift_and_the_node_status() -> None:
    wanted = {"ProcTurboMode": "Enabled", "QuietBoot": True}
    assert settings_drift("active", None, wanted, "bios").status == "unknown"
    assert settings_drift("servicing", {}, wanted, "bios").status == "updating"
    assert settings_drift("service_failed", {}, wanted, "bios").status == "failed"
    off = settings_drift("active", {"ProcTurboMode": "Disabled", "QuietBoot": True}, wanted,
                         "bios")
    assert off.status == "drifted"
    assert off.differences == (Difference("ProcTurboMode", "Disabled", "Enabled", "bios"),)
    ntp = settings_drift("active", {"NetworkProtocol.NTP.NTPServers": ["10.0.0.1"]},
                         {"NetworkProtocol.NTP.NTPServers": ("10.0.0.1",)}, "bmc")
    assert ntp.status == "conforming"
    ok = settings_drift("active", wanted, wanted, "bios")
    assert combine([ok, ok]).status == "conforming"
    assert combine([ok, off]).differences == off.differences
    assert combine([settings_drift("active", None, wanted, "bios"), off]).status == "drifted"
    assert combine([ok, settings_drift("active", None, wanted, "bmc")]).status == "unknown"


def test_the_config_section() -> None:
    section = BmcSettings.model_validate({"attributes": {"IPMILan.1.Enable": "Disabled"},
                                          "ssh": False, "ntp_servers": ["10.0.0.1"],
                                          "time_offset": "+01:00"})
    assert section.flat() == {"IPMILan.1.Enable": "Disabled",
                              "NetworkProtocol.SSH.ProtocolEnabled": False,
                              "NetworkProtocol.NTP.ProtocolEnabled": True,
                              "NetworkProtocol.NTP.NTPServers": ["10.0.0.1"],
                              "Manager.DateTimeLocalOffset": "+01:00"}
    with pytest.raises(ValidationError, match="time_offset"):
        BmcSettings.model_validate({"time_offset": "CET"})
    with pytest.raises(ValidationError, match="ssh"):
        BmcSettings.model_validate({"ssh": "maybe"})
