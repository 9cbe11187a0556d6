"""What a BMC says, as findings (``provisioner.health.bmc``): recorded Redfish answers
(tests/fixtures/health/redfish/, provenance in its README) and SEL records in the shape the
IPMI worker returns them (pyghmi's decode, as read from ipmi_sim in
tests/integration/test_bmc_health.py); the cursors that keep an old record from being
raised twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from provisioner.bmc.base import HealthReader, health_reader
from provisioner.bmc.fake import FakeBmc
from provisioner.bmc.redfish import RedfishDriver
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.health.bmc import (
    leak_finding,
    log_cursor,
    log_events,
    new_log_entries,
    new_sel,
    sel_cursor,
    sel_events,
    sel_line,
    sel_unchanged,
    status_finding,
)
from provisioner.health.model import Action, HealthClass

TREES = Path(__file__).parents[1] / "fixtures" / "health" / "redfish"
DETECTORS = "Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors"


def tree(name: str, path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TREES / name / path / "index.json").read_text())
    return data


def record(rid: int, event_id: str, event: str, *, kind: str = "Memory",
           deassertion: bool = False, asserted: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"record_id": rid, "timecode": 1000 + rid,
                             "timestamp": "2026-11-27T15:56:00", "component": "Sensor 32.2.0",
                             "component_type": kind, "event_id": event_id, "event": event,
                             "deassertion": deassertion}
    if asserted:
        entry["asserted_event"] = asserted
    return entry


UE = record(1, "111.1", "Uncorrectable error")
CE = record(2, "111.0", "Correctable error")
UE_OFF = record(3, "111.1", "Uncorrectable error deasserted", deassertion=True,
                asserted="Uncorrectable error")
HOT = record(4, "1.9", "Upper critical", kind="Temperature")
PSU = record(5, "111.1", "Failure", kind="Power Supply")
WARM = record(6, "1.7", "Upper non-critical", kind="Temperature")


def test_sel_records_read_as_ipmitool_lines_through_the_sel_rules() -> None:
    assert sel_line(UE) == ("1 | 2026-11-27 | 15:56:00 | Memory Sensor 32.2.0 | "
                            "Uncorrectable error | Asserted")
    assert "Upper Critical going high" in sel_line(HOT)  # threshold offsets as ipmitool
    events = sel_events([UE, CE, HOT, PSU, WARM])
    assert [(e.finding.cls, e.finding.action, e.clears) for e in events] == [
        (HealthClass.HOST_MEMORY, Action.SERVICE_REQUIRED, False),
        (HealthClass.THERMAL, Action.DRAIN, False),
        (HealthClass.POWER, Action.SERVICE_REQUIRED, False)]
    cleared = sel_events([UE_OFF])
    assert len(cleared) == 1 and cleared[0].clears
    assert cleared[0].finding.subject == events[0].finding.subject  # clears that one


def test_sel_cursor_first_read_is_a_baseline_then_only_new_records() -> None:
    info = {"entries": 2, "last_add": 500, "last_erase": 0}
    assert new_sel([UE, CE], None) == []
    cursor = sel_cursor(info, [UE, CE])
    assert sel_unchanged(info, cursor)
    assert not sel_unchanged({**info, "entries": 3}, cursor)  # same second, one more
    assert new_sel([UE, CE, HOT], cursor) == [HOT]
    assert new_sel([HOT], cursor) == [HOT]  # cleared SEL: the cursor's record is gone
    reused = dict(CE, timecode=9999)  # a cleared SEL that reused the id
    assert new_sel([UE, reused, HOT], cursor) == [UE, reused, HOT]


def test_catfish_sel_log_entries_are_thermal_findings() -> None:
    entries = tree("dmtf-catfish", "Systems/1/LogServices/SEL/Entries")["Members"]
    events = log_events(entries)
    assert [(e.finding.cls, e.finding.action) for e in events] == [
        (HealthClass.THERMAL, Action.DRAIN)] * 2
    assert "Temperature threshold exceeded" in events[0].finding.evidence
    assert log_events([{**entries[0], "Resolved": True}])[0].clears
    assert log_events([{**entries[0], "Severity": "OK", "SensorType": "",
                        "EntryCode": "", "Message": "Log cleared"}]) == []


def test_log_cursor_is_order_blind() -> None:
    entries = tree("dmtf-catfish", "Systems/1/LogServices/SEL/Entries")["Members"]
    assert new_log_entries(entries, None) == []
    cursor = log_cursor(entries, None)
    assert cursor == {"created": "2012-03-07T14:45:00Z", "ids": ["2"]}
    newer = {**entries[0], "Id": "3", "Created": "2012-03-07T14:45:00Z"}
    assert new_log_entries([newer, *reversed(entries)], cursor) == [newer]
    assert log_cursor([newer, *entries], cursor)["ids"] == ["2", "3"]


def test_gb200_leak_detectors_and_system_status() -> None:
    leak = leak_finding(tree("gb200-leak", f"{DETECTORS}/Chassis_0_LeakDetector_1_Manifold"))
    assert leak is not None
    assert (leak.cls, leak.action, leak.subject) == (
        HealthClass.LEAK, Action.SERVICE_REQUIRED, "Chassis_0_LeakDetector_1_Manifold")
    assert "DetectorState LeakDetected" in leak.evidence
    assert leak_finding(tree("gb200-leak", f"{DETECTORS}/Chassis_0_LeakDetector_0_ColdPlate")) \
        is None
    assert leak_finding({"Id": "Moisture", "DetectorState": "Warning"}) is not None
    system = tree("dmtf-catfish", "Systems/1")
    assert status_finding("system", system) is None
    critical = status_finding("system", {**system, "Status": {"Health": "Critical"}})
    warning = status_finding("system", {**system, "Status": {"Health": "OK",
                                                             "HealthRollup": "Warning"}})
    assert critical is not None and critical.action is Action.DRAIN
    assert warning is not None and warning.action is Action.NONE  # recorded, no ladder


async def test_health_reader_agrees_with_the_protocol_check() -> None:
    """``health_reader`` (the poll's cheap check) says what ``isinstance(.., HealthReader)``
    says: the simulation's BMC reads no health, Redfish's does."""
    class World:
        async def get(self, key: str, attr: str) -> str:
            return "on"

        async def ensure(self, key: str, op: str, attr: str, value: str) -> bool:
            return False

    fake = FakeBmc(World(), BmcEndpoint("fake", "SN1"))
    driver = RedfishDriver(timeout_s=1)
    redfish = driver("n1", BmcEndpoint("redfish", "http://127.0.0.1:1"),
                     BmcCredentials("admin", "pw"))
    try:
        assert health_reader(fake) is None and not isinstance(fake, HealthReader)
        assert health_reader(redfish) is redfish and isinstance(redfish, HealthReader)
    finally:
        await driver.aclose()
