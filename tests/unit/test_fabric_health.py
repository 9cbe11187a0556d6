"""NVLink fabric health, not only state: the ``<fabric><health>`` block of DTD v13 and its
``nvidia-smi -q`` twin, read by the parsers, the clique rule (live topology) and the validation
gate; GPUs the driver lost.

Reports are synthetic (tests/topology_support/nvsmi.py: the layout of the real captures, no
public capture of a sick NVL72 tray exists); the real DTD v13 captures (N/A health) must stay
clean.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.topology.model import FabricHealth, NvlinkScope, nvlink_domain
from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi
from provisioner.validation.checks import Expectation, evaluate
from tests.topology_support.nvsmi import CLUSTER_A, FakeGpu, gpus, sick, text, xml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "nvidia-smi"
NVL = Expectation(gpu_count=4, gpu_model="GB200", nvlink_domain=True)
FORMATS = {"xml": xml, "text": text}


def tray(**changes: str) -> list[FakeGpu]:
    """A GB200 compute tray: 4 GPUs, fabric Completed/Success in clique 1, all healthy but
    GPU 2, which gets ``changes`` in its health block."""
    items = [FakeGpu(g.uuid, health=sick()) for g in gpus(7)]
    items[2] = FakeGpu(items[2].uuid, health=sick(**changes))
    return items


@pytest.mark.parametrize("fmt", FORMATS)
def test_parsers_read_the_whole_health_block(fmt: str) -> None:
    report = parse_nvidia_smi(FORMATS[fmt](tray(summary="Unhealthy", route_unhealthy="True")))
    assert report.gpus[0].health == FabricHealth(
        summary="Healthy", bandwidth="Full", route_recovery_in_progress="False",
        route_unhealthy="False", access_timeout_recovery="False",
        incorrect_configuration="None", partition_assigned="True")
    assert report.gpus[2].health.summary == "Unhealthy"
    assert report.gpus[2].health.route_unhealthy == "True"


@pytest.mark.parametrize("fmt", FORMATS)
def test_unhealthy_tray_completed_success_is_held_and_gets_no_clique(fmt: str) -> None:
    """The issue's GB200 tray: state Completed, status Success, summary Unhealthy,
    route_unhealthy True. It used to pass the NVLink check and get a clique."""
    items = tray(summary="Unhealthy", route_unhealthy="True")
    report = parse_nvidia_smi(FORMATS[fmt](items))
    domain = nvlink_domain(report.gpus)
    assert domain.scope is NvlinkScope.NOT_READY and domain.clique is None
    assert domain.reason == (f"{items[2].uuid}: fabric health summary Unhealthy, "
                             "route unhealthy")
    verdict = evaluate({"nvidia_smi_xml": xml(items)}, NVL)
    assert verdict.failures == (
        f"nvlink-fabric: GPU 2 ({items[2].uuid}): fabric health summary Unhealthy, route "
        "unhealthy, expected a healthy NVLink fabric",)
    # the domain still learns that one of its trays failed
    assert verdict.clique == f"{CLUSTER_A}.1"


@pytest.mark.parametrize(("changes", "reason"), [
    ({"route_recovery_in_progress": "True"}, "route recovery in progress"),
    ({"access_timeout_recovery": "True"}, "access timeout recovery"),
    ({"incorrect_configuration": "Insufficient NVLinks"},
     "incorrect configuration Insufficient NVLinks"),
    ({"partition_assigned": "False"}, "no NVLink partition assigned"),
], ids=["route-recovery", "access-timeout", "incorrect-config", "no-partition"])
def test_every_health_problem_holds_the_tray(changes: dict[str, str], reason: str) -> None:
    items = tray(**changes)
    verdict = evaluate({"nvidia_smi_xml": xml(items)}, NVL)
    assert (f"nvlink-fabric: GPU 2 ({items[2].uuid}): fabric {reason}, expected a healthy "
            "NVLink fabric") in verdict.failures


def test_degraded_bandwidth_holds_unless_the_profile_accepts_it() -> None:
    items = tray(bandwidth="Degraded", summary="Limited Capacity")
    report = {"nvidia_smi_xml": xml(items)}
    held = evaluate(report, NVL)
    assert held.failures == (
        f"nvlink-fabric: GPU 2 ({items[2].uuid}): fabric bandwidth Degraded, expected full "
        "NVLink bandwidth (the profile does not accept degraded bandwidth: "
        "nvlink_accept_degraded_bandwidth)",)
    accepted = evaluate(report, Expectation(gpu_count=4, gpu_model="GB200", nvlink_domain=True,
                                            nvlink_accept_degraded_bandwidth=True))
    assert accepted.passed and accepted.clique == f"{CLUSTER_A}.1"


def test_sick_fabric_fails_a_profile_that_did_not_ask_for_nvlink() -> None:
    items = tray(summary="Unhealthy", route_unhealthy="True")
    verdict = evaluate({"nvidia_smi_xml": xml(items)}, Expectation(gpu_count=4))
    assert "nvlink-health" in verdict.checks and len(verdict.failures) == 1
    assert "route unhealthy" in verdict.failures[0]


@pytest.mark.parametrize("capture", ["telegraf-rtx-3080-v13.xml", "h100-580.159.04-q-x.xml",
                                     "telegraf-rtx-3060-v12.xml"])
def test_real_captures_with_na_health_are_clean(capture: str) -> None:
    report = parse_nvidia_smi((FIXTURES / capture).read_text())
    assert all(not g.health.problems() and g.health.degraded() is None for g in report.gpus)
    assert report.gpus[0].health.bandwidth == "N/A"
    verdict = evaluate({"nvidia_smi_xml": (FIXTURES / capture).read_text()},
                       Expectation(gpu_count=1))
    assert verdict.passed and "nvlink-health" not in verdict.checks


def test_index_is_nvidia_smis_not_the_minor_number() -> None:
    items = gpus(3)
    report_xml = xml(items).replace("<minor_number>0</minor_number>",
                                    "<minor_number>7</minor_number>")
    report_text = text(items).replace("Minor Number                          : 0",
                                      "Minor Number                          : 7")
    for report in (report_xml, report_text):
        assert [g.index for g in parse_nvidia_smi(report).gpus] == [0, 1, 2, 3]


def test_a_gpu_the_driver_lost_fails_with_a_clear_reason() -> None:
    items = gpus(5)[:3]  # the driver lists 3 of the tray's 4 GPUs
    pci = [{"address": f"0008:0{n}:00.0", "vendor": "0x10de", "device": "0x2941",
            "class": "0x030200"} for n in range(1, 5)]
    verdict = evaluate({"nvidia_smi_xml": xml(items), "pci": pci}, Expectation())
    assert verdict.failures == ("gpu-lost: GPU 0008:04:00.0 is on PCI but nvidia-smi does not "
                                "list it (3 GPUs listed), expected every GPU usable",)
    line = ("Unable to determine the device handle for GPU 0008:04:00.0: GPU is lost.  "
            "Reboot the system to recover this GPU")
    verdict = evaluate({"nvidia_smi_xml": xml(items), "pci": pci,
                        "nvidia_smi_errors": [line]}, Expectation())
    assert verdict.failures == (
        "gpu-lost: nvidia-smi: Unable to determine the device handle for GPU 0008:04:00.0: "
        "GPU is lost. Reboot the system to recover this GPU",)


def test_live_topology_gives_no_clique_to_a_sick_tray_and_flags_degraded_bandwidth() -> None:
    from provisioner.topology.fleet import build_fleet

    sick_tray = tray(summary="Unhealthy", route_unhealthy="True")
    slow_tray = tray(bandwidth="Degraded")
    reports = [parse_nvidia_smi(xml(sick_tray), "gpu-node-07"),
               parse_nvidia_smi(text(slow_tray), "gpu-node-08")]
    fleet = build_fleet(None, reports)
    by_host = {node.hostname: node for node in fleet.nodes}
    assert by_host["gpu-node-07"].nvlink.clique is None
    assert by_host["gpu-node-08"].nvlink.clique == f"{CLUSTER_A}.1"
    details = sorted((f.subject, f.detail) for f in fleet.findings)
    assert details == [
        ("gpu-node-07", f"no NVLink clique: {sick_tray[2].uuid}: fabric health summary "
                        "Unhealthy, route unhealthy"),
        ("gpu-node-08", f"GPU 2 ({slow_tray[2].uuid}): NVLink bandwidth Degraded")]
