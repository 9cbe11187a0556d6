"""How the Redfish health poll reads a chassis's leak detectors in the fewest GETs
(``provisioner.bmc.redfish_health``), on the real answers of tests/fixtures/health/redfish:
DMTF's cooling unit lists every detector's state in ``LeakDetection.LeakDetectorGroups``
(one GET), the Supermicro GB200 tray does not (one GET per detector); ``$expand`` only where
the service root offers it, and only when the answer carries the members."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from provisioner.bmc.redfish_health import expand_query, expanded_detectors, grouped_detectors
from provisioner.health.bmc import leak_finding

TREES = Path(__file__).parents[1] / "fixtures" / "health" / "redfish"
CDU = "ThermalEquipment/CDUs/1/LeakDetection"
GB200 = "Chassis/Chassis_0/ThermalSubsystem/LeakDetection"


def tree(name: str, path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TREES / name / path / "index.json").read_text())
    return data


def members(name: str, path: str) -> list[str]:
    return [m["@odata.id"] for m in tree(name, path)["Members"]]


def test_cooling_unit_groups_carry_every_detector_state_named_as_its_resource() -> None:
    detection = tree("dmtf-cooling-unit", CDU)
    uris = members("dmtf-cooling-unit", f"{CDU}/LeakDetectors")
    grouped = grouped_detectors(detection, uris)
    assert [(d["Id"], d["DetectorState"]) for d in grouped] == [("Moisture", "OK"),
                                                                ("Overflow", "OK")]
    assert all(leak_finding(d) is None for d in grouped)
    # a detector that reports a leak: the same finding (subject) from the group as from
    # the detector's own resource, so switching reads does not clear and reopen it
    detection["LeakDetectorGroups"][0]["Detectors"][0]["DetectorState"] = "Critical"
    inline = leak_finding(grouped_detectors(detection, uris)[0])
    own = leak_finding({**tree("dmtf-cooling-unit", f"{CDU}/LeakDetectors/Moisture"),
                        "DetectorState": "Critical"})
    assert inline is not None and own is not None
    assert (inline.cls, inline.action, inline.subject) == (own.cls, own.action, own.subject)
    assert "DetectorState Critical" in inline.evidence


def test_groups_that_leave_a_detector_out_or_no_groups_mean_reading_each() -> None:
    detection = tree("dmtf-cooling-unit", CDU)
    uris = members("dmtf-cooling-unit", f"{CDU}/LeakDetectors")
    assert grouped_detectors(detection, [*uris, f"{CDU}/LeakDetectors/Rope"]) == []
    stateless = json.loads(json.dumps(detection))
    del stateless["LeakDetectorGroups"][0]["Detectors"][1]["DetectorState"]
    assert grouped_detectors(stateless, uris) == []
    # the GB200 tray's LeakDetection has no groups: its four detectors are read one by one
    assert grouped_detectors(tree("gb200-leak", GB200),
                             members("gb200-leak", f"{GB200}/LeakDetectors")) == []


def test_expand_only_where_the_service_root_offers_it() -> None:
    assert expand_query(tree("dmtf-catfish", "")) == "$expand=.($levels=1)"
    assert expand_query(tree("dmtf-cooling-unit", "")) == "$expand=.($levels=1)"
    assert expand_query(tree("gb200-leak", "")) is None  # its root says nothing of $expand
    only_all = {"ProtocolFeaturesSupported": {"ExpandQuery": {"ExpandAll": True}}}
    assert expand_query(only_all) == "$expand=*"


def test_an_expanded_answer_counts_only_with_every_member_inline() -> None:
    uris = members("gb200-leak", f"{GB200}/LeakDetectors")
    as_links = tree("gb200-leak", f"{GB200}/LeakDetectors")  # what a BMC ignoring it sends
    assert expanded_detectors(as_links, uris) == []
    inline = {**as_links, "Members": [
        {**tree("gb200-leak", uri.removeprefix("/redfish/v1/")), "@odata.id": uri}
        for uri in uris]}
    read = expanded_detectors(inline, uris)
    assert len(read) == 4
    leaks = [f.subject for d in read if (f := leak_finding(d)) is not None]
    assert leaks == ["Chassis_0_LeakDetector_1_Manifold"]
    assert expanded_detectors({**inline, "Members": inline["Members"][:3]}, uris) == []
