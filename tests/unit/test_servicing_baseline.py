"""The servicing baseline's pure parts: BIOS settings against a real attribute registry
(sushy-tools', tests/fixtures/redfish-servicing), firmware components against a baseline,
the servicing record's round trip, and the ``[servicing]`` configuration's checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from provisioner.config.servicing import ServicingSettings
from provisioner.lifecycle.service_record import ONBOARDING, ServiceRecord
from provisioner.validation.baseline import (
    MULTIPART_PUSH,
    SIMPLE_UPDATE,
    Component,
    UpdateImage,
    Wanted,
    bios_changes,
    check_bios,
    choose_transfer,
    match_firmware,
    registry_attributes,
)

REGISTRY: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "redfish-servicing"
     / "bios_registry.json").read_text())


def test_registry_lists_sushy_tools_attributes() -> None:
    assert {"ProcTurboMode", "BootMode", "NumCores", "QuietBoot"} <= set(
        registry_attributes(REGISTRY))


def test_valid_settings_pass() -> None:
    assert check_bios({"ProcTurboMode": "Disabled", "BootMode": "Uefi", "QuietBoot": True,
                       "SerialNumber": "QPX12345"}, REGISTRY) == []


def test_every_problem_named_at_once() -> None:
    errors = check_bios({"ProcTurboMode": "On", "Nope": 1, "NumCores": 12, "QuietBoot": "yes",
                         "BootMode": 3}, REGISTRY)
    assert errors == [
        "ProcTurboMode: 'On' not allowed (allowed: Enabled, Disabled)",
        "Nope: unknown attribute (not in registry BiosAttributeRegistryP89.v1_0_0)",
        "NumCores: read-only in the registry",
        "QuietBoot: 'yes' is not a boolean",
        "BootMode: 3 not allowed (allowed: Bios, Uefi)",
    ]


def test_empty_registry_refuses_everything() -> None:
    assert check_bios({"A": "b"}, {}) == ["the BMC's BIOS attribute registry lists no "
                                          "attributes"]


def test_only_differing_attributes_change() -> None:
    assert bios_changes({"A": "x", "B": True, "C": 3},
                        {"A": "x", "B": False, "D": 1}) == {"B": True, "C": 3}


def test_firmware_matched_by_pattern_first_entry_wins() -> None:
    inventory = [Component("BIOS", "1.0.0"), Component("NIC.Slot.1", "22.31.6"),
                 Component("NIC.Slot.2", "22.41.1"), Component("BMC", "5.10")]
    baseline = [Wanted("BIOS", "1.2.0", "b.bin"), Wanted("NIC.*", "22.41.1", "n.bin"),
                Wanted("*", "0", "never.bin"), Wanted("HGX_FW_*", "1.0", "h.bin")]
    view = match_firmware(inventory, baseline)
    assert [(m.component.id, m.conforming) for m in view.matches] == [
        ("BIOS", False), ("NIC.Slot.1", False), ("NIC.Slot.2", True), ("BMC", False)]
    assert [m.component.id for m in view.drifted] == ["BIOS", "NIC.Slot.1", "BMC"]
    assert view.unmatched == (Wanted("HGX_FW_*", "1.0", "h.bin"),)
    assert not view.conforming
    assert match_firmware(inventory[2:3], baseline[1:2]).conforming


def test_component_from_redfish_member() -> None:
    member = {"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/BMC", "Id": "BMC",
              "Name": "BMC Firmware", "Version": "5.10", "Updateable": False}
    assert Component.from_redfish(member) == Component(
        "BMC", "5.10", "/redfish/v1/UpdateService/FirmwareInventory/BMC", "BMC Firmware",
        False)


def test_record_round_trip_and_onboarded() -> None:
    record = ServiceRecord.open("onboard", ("bios_settings",), ONBOARDING, "op")
    record = record.with_task("BIOS", "/redfish/v1/TaskService/Tasks/1")
    record = record.with_result("bios_settings", "2 attributes").closed("passed")
    again = ServiceRecord.from_facts({"servicing": record.to_facts()})
    assert again == record and again.onboarded("onboard") and not again.onboarded("other")
    assert not again.drains


def test_config_checks_runbook_names_and_image_urls() -> None:
    with pytest.raises(ValidationError, match="onboarding_runbook 'missing'"):
        ServicingSettings.model_validate({"profiles": {"gpu": {
            "onboarding_runbook": "missing"}}})
    with pytest.raises(ValidationError, match="needs \\[servicing\\] image_base_url"):
        ServicingSettings.model_validate({"profiles": {"gpu": {"firmware": [
            {"id": "BIOS", "version": "1", "image": "bios.bin"}]}}})
    with pytest.raises(ValidationError):
        ServicingSettings.model_validate({"runbooks": {"x": {"steps": ["defrag"]}}})
    ok = ServicingSettings.model_validate({"image_base_url": "http://10.0.0.1/firmware/"})
    assert ok.image_uri("bios.bin") == "http://10.0.0.1/firmware/bios.bin"
    assert ok.image_uri("https://vendor/x.bin") == "https://vendor/x.bin"


def test_transfer_auto_prefers_simple_update_then_the_push() -> None:
    local = UpdateImage("http://10.0.0.1/artefacts/fw/bios.bin", "/srv/fw/bios.bin")
    assert choose_transfer(local, ["HTTP", "HTTPS"], "/push") == SIMPLE_UPDATE
    assert choose_transfer(local, [], None) == SIMPLE_UPDATE  # no AllowableValues: any
    # bmcweb: SimpleUpdate takes HTTPS only (often compiled out), a push URI
    assert choose_transfer(local, ["HTTPS"], "/push") == MULTIPART_PUSH
    assert choose_transfer(local, None, "/push") == MULTIPART_PUSH
    forced = UpdateImage(local.uri, local.path, "multipart")
    assert choose_transfer(forced, ["HTTP"], "/push") == MULTIPART_PUSH
    with pytest.raises(ValueError, match=r"firmware_transfer simple: .*: its SimpleUpdate "
                       r"does not take HTTP \(allowed: HTTPS\)$"):
        choose_transfer(UpdateImage(local.uri, local.path, "simple"), ["HTTPS"], "/push")
    with pytest.raises(ValueError, match=r"the UpdateService has no SimpleUpdate; a push "
                       r"needs the image in our artefact directory \(https://vendor"):
        choose_transfer(UpdateImage("https://vendor.example/bios.bin"), None, "/push")


def test_a_push_intent_keeps_the_tasks_from_before_it() -> None:
    record = ServiceRecord.open("fw", ("firmware_update",), "active", "op")
    simple = record.with_intent("BIOS", "http://x/bios.bin")
    assert simple.asking("BIOS") and simple.known("BIOS") is None
    pushed = record.with_intent("BIOS", "http://x/bios.bin", ["/T/1", "/T/2"])
    assert pushed.asking("BIOS") and pushed.known("BIOS") == ("/T/1", "/T/2")
    assert record.with_intent("BIOS", "u", []).known("BIOS") == ()
    again = ServiceRecord.from_facts({"servicing": pushed.to_facts()})
    assert again is not None and again.known("BIOS") == ("/T/1", "/T/2")
