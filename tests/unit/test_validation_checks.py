"""Every validation check on the real captures under tests/fixtures/topology/ (provenance in
each directory's README): what passes, and the exact line a failure leaves."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from provisioner.topology.model import LocalCa
from provisioner.topology.parse_ibstat import parse_ibstat
from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi_text
from provisioner.topology.parse_nvsmi_xml import parse_nvidia_smi_xml
from provisioner.validation.checks import (
    Expectation,
    check_dcgm,
    check_fabric,
    check_gpus,
    check_infiniband,
    evaluate,
    facts_cas,
)
from tests.topology_support import nvsmi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
A100_XML = FIXTURES / "nvidia-smi" / "telegraf-a100-sxm4-v12.xml"
RTX_XML = FIXTURES / "nvidia-smi" / "telegraf-rtx-3080-v13.xml"
H100X8_TEXT = FIXTURES / "nvidia-smi" / "gpud-nvidia-smi-q.535.161.08.h100x8.txt"
NVL_XML = FIXTURES / "synthetic" / "nvidia-smi-nvl" / "gpu-node-03.xml"  # clique 1
SINGLE_XML = FIXTURES / "synthetic" / "nvidia-smi-nvl" / "gpu-node-15.xml"  # zero UUID
IBSTAT_IB = FIXTURES / "infiniband" / "gpud-ibstat.47.0.h100.some.down.0.txt"
IBSTAT_ETH = FIXTURES / "infiniband" / "gpud-ibstat.47.0.h100.all.active.0.txt"
CLUSTER = nvsmi.CLUSTER_A


def h100x8() -> Any:
    return parse_nvidia_smi_text(H100X8_TEXT.read_text())


def facts_ports(cas: tuple[LocalCa, ...]) -> list[dict[str, Any]]:
    """The ``infiniband`` section the facts role writes from sysfs for these HCAs (sysfs
    says ``4: ACTIVE``, ``5: LinkUp``, ``400 Gb/sec (4X NDR)``; the role keeps the words)."""
    return [{"device": ca.name, "ports": [
        {"port": p.number, "state": p.state.upper(), "phys_state": p.physical,
         "rate": f"{p.rate.gbps:g} Gb/sec" if p.rate else "", "link_layer": p.link_layer}
        for p in ca.ports]} for ca in cas]


# -- GPUs -----------------------------------------------------------------------------------


def test_h100x8_matches_an_8_gpu_h100_profile() -> None:
    assert check_gpus(h100x8(), [], Expectation(gpu_count=8, gpu_model="H100")) == []


def test_gpu_count_names_seen_and_expected() -> None:
    report = h100x8()
    seven = dataclasses.replace(report, gpus=report.gpus[:7])
    assert check_gpus(seven, [], Expectation(gpu_count=8)) == [
        "gpu-count: saw 7 GPUs (nvidia-smi), expected 8"]


def test_gpu_model_is_a_case_insensitive_substring() -> None:
    a100 = parse_nvidia_smi_xml(A100_XML.read_text())
    assert check_gpus(a100, [], Expectation(gpu_count=1, gpu_model="a100-sxm4")) == []
    assert check_gpus(a100, [], Expectation(gpu_model="H100")) == [
        "gpu-model: saw 'NVIDIA A100-SXM4-80GB' on 1 of 1 GPUs (nvidia-smi), expected a "
        "model containing 'H100'"]


def test_without_nvidia_smi_the_pci_list_is_used_and_unnamed_gpus_fail_the_model() -> None:
    expect = Expectation(gpu_count=8, gpu_model="H100")
    assert check_gpus(None, [None] * 8, expect) == [
        "gpu-model: saw '(no model name)' on 8 of 8 GPUs (PCI), expected a model "
        "containing 'H100'"]
    assert check_gpus(None, ["NVIDIA H100 80GB HBM3"] * 8, expect) == []


# -- NVLink fabric --------------------------------------------------------------------------


def test_multi_node_clique_passes() -> None:
    assert check_fabric(parse_nvidia_smi_xml(NVL_XML.read_text()),
                        Expectation(nvlink_domain=True)) == []


def test_hgx_single_node_nvlink_is_not_a_domain() -> None:
    (line,) = check_fabric(h100x8(), Expectation(nvlink_domain=True))
    assert line.startswith("nvlink-fabric: ClusterUUID zero or absent: single-node NVLink")
    (zero,) = check_fabric(parse_nvidia_smi_xml(SINGLE_XML.read_text()),
                           Expectation(nvlink_domain=True))
    assert "single-node NVLink only" in zero


def test_fabric_na_and_training_gpus_are_each_named() -> None:
    (line,) = check_fabric(parse_nvidia_smi_xml(RTX_XML.read_text()),
                           Expectation(nvlink_domain=True))
    assert line.startswith("nvlink-fabric: GPU 0 (GPU-") and line.endswith(
        "fabric state N/A, status N/A, expected Completed, Success")
    training = nvsmi.gpus(13, state="In Progress", status="N/A")
    lines = check_fabric(parse_nvidia_smi_xml(nvsmi.xml(training)),
                         Expectation(nvlink_domain=True))
    assert len(lines) == 4 and all("fabric state In Progress, status N/A" in x for x in lines)


def test_fabric_without_a_report_says_so() -> None:
    assert check_fabric(None, Expectation(nvlink_domain=True)) == [
        "nvlink-fabric: no nvidia-smi -q -x report (NVIDIA driver not up?), expected fabric "
        "state Completed, status Success and a non-zero ClusterUUID"]


# -- InfiniBand -----------------------------------------------------------------------------


def test_eight_ndr_ports_pass_and_ethernet_ports_are_not_counted() -> None:
    cas = parse_ibstat(IBSTAT_IB.read_text())  # 8 IB at 400, 3 Ethernet (one down)
    expect = Expectation(ib_rate_gbps=400, ib_port_count=8)
    assert check_infiniband(cas, expect) == []
    assert check_infiniband(facts_cas({"infiniband": facts_ports(cas)}), expect) == []


def test_wrong_rate_names_each_port() -> None:
    cas = parse_ibstat(IBSTAT_IB.read_text())
    lines = check_infiniband(cas, Expectation(ib_rate_gbps=200))
    assert len(lines) == 8
    assert "ib-rate: mlx5_0 port 1 runs at 400 Gb/s, expected 200 Gb/s" in lines


def test_a_roce_only_node_has_no_infiniband_port() -> None:
    cas = parse_ibstat(IBSTAT_ETH.read_text())  # every port Ethernet
    assert check_infiniband(cas, Expectation(ib_rate_gbps=400)) == [
        "ib-ports: no InfiniBand port found, expected ports at 400 Gb/s"]
    assert check_infiniband(cas, Expectation(ib_port_count=8)) == [
        "ib-ports: saw 0 InfiniBand ports (none), expected 8"]


def test_a_down_port_fails_with_its_physical_state() -> None:
    cas = parse_ibstat(IBSTAT_IB.read_text())
    report = {"infiniband": facts_ports(cas)}
    # mlx5_7 is Down/Disabled in the capture; as an InfiniBand port it must fail the node.
    (hca,) = [h for h in report["infiniband"] if h["device"] == "mlx5_7"]
    hca["ports"][0]["link_layer"] = "InfiniBand"
    lines = check_infiniband(facts_cas(report), Expectation(ib_rate_gbps=400, ib_port_count=8))
    assert lines == [
        "ib-ports: saw 9 InfiniBand ports (mlx5_0/1, mlx5_10/1, mlx5_11/1, mlx5_3/1, "
        "mlx5_4/1, mlx5_5/1, mlx5_6/1, mlx5_7/1, mlx5_9/1), expected 8",
        "ib-ports: mlx5_7 port 1 is Down (Disabled), expected Active (LinkUp)"]  # once


def test_sysfs_rate_words_and_hca_level_reports() -> None:
    report = {"infiniband": [
        {"device": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                                         "rate": "200 Gb/sec (4X HDR)"}]},
        {"device": "mlx5_1", "state": "ACTIVE", "rate_gbps": 400}]}
    assert check_infiniband(facts_cas(report), Expectation(ib_rate_gbps=400)) == [
        "ib-rate: mlx5_0 port 1 runs at 200 Gb/s (4xHDR), expected 400 Gb/s"]


# -- DCGM -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("dcgm", "required", "expected"), [
    (None, False, []),
    (None, True, ["dcgm: no DCGM diagnostic ran (dcgmi not installed?), the profile requires "
                  "a passing dcgmi diag -r 1"]),
    ({"ran": True, "passed": True, "summary": "all tests passed"}, True, []),
    ({"ran": True, "passed": False, "summary": "failed: Memory"}, False,
     ["dcgm: dcgmi diag -r 1 failed: failed: Memory, expected a pass"]),
    ({"ran": False, "passed": False, "summary": "host engine not running"}, True,
     ["dcgm: no DCGM diagnostic ran (host engine not running), the profile requires a "
      "passing dcgmi diag -r 1"]),
], ids=["absent", "absent-required", "passed", "failed", "did-not-run"])
def test_dcgm(dcgm: dict[str, Any] | None, required: bool, expected: list[str]) -> None:
    assert check_dcgm(dcgm, Expectation(require_dcgm=required)) == expected


# -- the whole report -----------------------------------------------------------------------


def nvl_report(**extra: Any) -> dict[str, Any]:
    cas = parse_ibstat(IBSTAT_IB.read_text())
    return {"nvidia_smi_xml": NVL_XML.read_text(), "infiniband": facts_ports(cas), **extra}


NVL72 = Expectation(gpu_count=4, gpu_model="GB200", ib_rate_gbps=400, ib_port_count=8,
                    nvlink_domain=True, nvlink_domain_nodes=18)


def test_evaluate_passes_and_names_the_clique() -> None:
    verdict = evaluate(nvl_report(), NVL72)
    assert verdict.passed and verdict.failures == ()
    assert verdict.clique == f"{CLUSTER}.1"
    assert verdict.checks == ("gpus", "nvlink-fabric", "infiniband")


def test_evaluate_reports_every_failure_at_once() -> None:
    expect = dataclasses.replace(NVL72, gpu_count=8, ib_rate_gbps=200, require_dcgm=True)
    verdict = evaluate(nvl_report(dcgm_diag={"ran": True, "passed": False,
                                             "summary": "failed: Diagnostic"}), expect)
    assert not verdict.passed
    kinds = [line.split(":")[0] for line in verdict.failures]
    assert kinds == ["gpu-count"] + ["ib-rate"] * 8 + ["dcgm"]
    assert verdict.clique == f"{CLUSTER}.1"  # its domain learns that it failed


def test_a_failed_node_whose_fabric_is_not_done_still_names_the_clique_it_claims() -> None:
    claimed = nvsmi.gpus(20, state="In Progress", status="N/A")  # ClusterUUID/CliqueId set
    verdict = evaluate({"nvidia_smi_xml": nvsmi.xml(claimed)}, Expectation(nvlink_domain=True))
    assert not verdict.passed and verdict.clique == f"{CLUSTER}.1"
    # A fabric still training holds a profile that did not ask for NVLink too (issue 22),
    # and the domain it claims learns it; a passing node names a clique by GFD's rule only.
    unasked = evaluate({"nvidia_smi_xml": nvsmi.xml(claimed)}, Expectation())
    assert not unasked.passed and unasked.settling and unasked.clique == f"{CLUSTER}.1"
    done = evaluate({"nvidia_smi_xml": nvsmi.xml(nvsmi.gpus(20))}, Expectation())
    assert done.passed and done.clique == f"{CLUSTER}.1"


@pytest.mark.parametrize("text", [
    A100_XML.read_text()[:5000],
    '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log/>',
    "<not_nvidia/>",
    "",
], ids=["truncated", "entity", "wrong-root", "empty"])
def test_an_unparsable_report_is_a_failure_with_the_parsers_message(text: str) -> None:
    verdict = evaluate({"nvidia_smi_xml": text}, Expectation(gpu_count=1))
    assert not verdict.passed
    assert verdict.failures[0].startswith("nvidia-smi: nvidia-smi -q -x: line ")
    assert verdict.failures[1] == "gpu-count: saw 0 GPUs (PCI), expected 1"


def test_a_profile_without_checks_passes_anything() -> None:
    assert evaluate({}, Expectation()).passed
    assert evaluate({"gpus": "nonsense", "infiniband": 7}, Expectation()).passed
    single = evaluate({"nvidia_smi_xml": H100X8_TEXT.read_text()}, Expectation())
    assert single.passed and single.clique is None  # text is not XML: unasked, not judged
