"""Issue 22: a GPU's own NVSwitch fabric and its recovery action are judged whatever the
profile asks, on real captures (tests/fixtures/topology/nvidia-smi/README.md: the H200 of
2026-11-27, an 8x H100 HGX) and on fault states derived from them by editing only the fabric
or recovery fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.topology.emit import TOPOGRAPH_DOMAIN
from provisioner.topology.fleet import build_fleet
from provisioner.topology.model import Code, GpuReport, NvlinkScope, nvlink_domain
from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi
from provisioner.topology.snapshot import build_snapshot, read_gpu_report
from provisioner.validation.checks import Expectation, evaluate
from provisioner.validation.gpu_fabric import check_recovery, fabric_faults
from provisioner.validation.sku import inspection_facts, sku_expectation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMI = FIXTURES / "topology" / "nvidia-smi"
H200 = FIXTURES / "nvidia-smi" / "h200-2026-11-27"
HGX_TEXT = "thamada-nvidia-smi-q.565.57.01.h100x8"
H200_UUID = "GPU-1bcdffa9-0bbf-b6cf-8af8-d99b8a4236b4"
ONE_H200 = Expectation(gpu_count=1, gpu_model="H200")


def xml_report(name: str) -> dict[str, Any]:
    return {"nvidia_smi_xml": (SMI / f"h200-580.159.04-q-x.{name}.xml").read_text()}


def test_the_real_h200_with_fabric_na_passes_a_profile_of_one_h200() -> None:
    facts = json.loads((H200 / "facts-module.json").read_text())
    verdict = evaluate(facts["report"], ONE_H200)
    assert verdict.passed and not verdict.settling and verdict.clique is None
    assert verdict.checks == ("gpus", "gpu-recovery")  # no fabric to judge: N/A
    # The same machine at inspection (the ramdisk collector) passes the SKU gate alike.
    collected = json.loads((H200 / "collect.json").read_text())
    assert evaluate(inspection_facts(collected), sku_expectation(ONE_H200)).passed
    assert not evaluate(facts["report"], Expectation(gpu_count=1, gpu_model="H100")).passed


def test_an_hgx_whose_fabric_is_up_with_a_zero_cluster_uuid_passes() -> None:
    verdict = evaluate(xml_report("fabric-completed"), ONE_H200)
    assert verdict.passed and verdict.clique is None
    assert verdict.checks == ("gpus", "nvlink-fabric", "gpu-recovery")
    hgx = parse_nvidia_smi((SMI / f"{HGX_TEXT}.txt").read_text())  # 8x H100, real
    assert len(hgx.gpus) == 8 and fabric_faults(hgx) == [] and check_recovery(hgx) == []
    assert nvlink_domain(hgx.gpus).scope is NvlinkScope.SINGLE_NODE


def test_nvlink_domain_true_keeps_meaning_a_multi_node_domain() -> None:
    verdict = evaluate(xml_report("fabric-completed"), Expectation(nvlink_domain=True))
    assert verdict.failures == (
        "nvlink-fabric: ClusterUUID zero or absent: single-node NVLink only, expected a "
        "multi-node NVLink domain (non-zero ClusterUUID, one CliqueId)",)


def test_a_fabric_still_training_is_held_as_settling() -> None:
    verdict = evaluate(xml_report("fabric-in-progress"), ONE_H200)
    assert verdict.failures == (
        f"nvlink-fabric: GPU 0 ({H200_UUID}): fabric state In Progress, status N/A, "
        "expected Completed, Success",)
    assert verdict.settling
    hgx = parse_nvidia_smi((SMI / f"{HGX_TEXT}.fabric-in-progress.txt").read_text())
    faults = fabric_faults(hgx)
    assert len(faults) == 8 and all(f.transient for f in faults)


def test_insufficient_resources_is_held_at_once_with_state_and_status() -> None:
    verdict = evaluate(xml_report("fabric-insufficient-resources"), ONE_H200)
    assert verdict.failures == (
        f"nvlink-fabric: GPU 0 ({H200_UUID}): fabric state Completed, status Insufficient "
        "Resources, expected Completed, Success",) and not verdict.settling
    hgx = parse_nvidia_smi((SMI / f"{HGX_TEXT}.fabric-insufficient-resources.txt").read_text())
    assert [f.transient for f in fabric_faults(hgx)] == [False] * 8
    assert nvlink_domain(hgx.gpus).scope is NvlinkScope.NOT_READY


@pytest.mark.parametrize(("state", "status"), [
    ("Not Started", "N/A"), ("Completed", "Unknown Error"), ("In Progress", "Unknown Error"),
    ("Completed", "Not Supported")])
def test_every_other_state_holds_the_node_naming_it(state: str, status: str) -> None:
    text = xml_report("fabric-completed")["nvidia_smi_xml"]
    text = text.replace("<state>Completed</state>", f"<state>{state}</state>").replace(
        "<status>Success</status>", f"<status>{status}</status>")
    verdict = evaluate({"nvidia_smi_xml": text}, Expectation())
    assert verdict.failures == (f"nvlink-fabric: GPU 0 ({H200_UUID}): fabric state {state}, "
                                f"status {status}, expected Completed, Success",)
    assert not verdict.settling


def test_a_dcgm_failure_while_the_fabric_trains_is_settling_too() -> None:
    dcgm = {"ran": True, "passed": False, "summary": "failed: software (CUDA not ready)"}
    training = evaluate(xml_report("fabric-in-progress") | {"dcgm_diag": dcgm}, ONE_H200)
    assert len(training.failures) == 2 and training.settling
    up = evaluate(xml_report("fabric-completed") | {"dcgm_diag": dcgm}, ONE_H200)
    assert len(up.failures) == 1 and not up.settling
    wrong = evaluate(xml_report("fabric-in-progress"), Expectation(gpu_count=8))
    assert len(wrong.failures) == 2 and not wrong.settling  # a missing GPU does not settle


def test_a_pending_recovery_action_holds_the_node_and_gives_no_clique() -> None:
    report = xml_report("recovery-gpu-reset")
    verdict = evaluate(report, ONE_H200)
    assert verdict.failures == (
        f"gpu-recovery: GPU 0 ({H200_UUID}): recovery action GPU_RESET pending (reset the GPU "
        "(nvidia-smi --gpu-reset)), expected None",) and not verdict.settling
    gpus = parse_nvidia_smi(report["nvidia_smi_xml"], "gpu-01")
    domain = nvlink_domain(gpus.gpus)
    assert domain.scope is NvlinkScope.NOT_READY and domain.clique is None
    assert domain.reason == f"{H200_UUID}: GPU recovery action GPU_RESET pending"
    fleet = build_fleet(None, [gpus])
    (node,) = fleet.nodes
    assert node.clique is None
    assert [(f.code, f.detail) for f in fleet.findings] == [
        (Code.NVLINK, f"no NVLink clique: {H200_UUID}: GPU recovery action GPU_RESET pending")]


def test_a_stale_clique_waiting_for_a_reset_is_not_published() -> None:
    """A GB200 tray after a partition change: fabric up, old clique, GPU_RESET pending."""
    text = xml_report("recovery-gpu-reset")["nvidia_smi_xml"].replace(
        "<cliqueId>0</cliqueId>", "<cliqueId>1</cliqueId>").replace(
        "<clusterUuid>00000000-0000-0000-0000-000000000000</clusterUuid>",
        "<clusterUuid>7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91</clusterUuid>")
    gpus = parse_nvidia_smi(text, "tray-01")
    assert nvlink_domain(gpus.gpus).clique is None
    assert build_fleet(None, [gpus]).nodes[0].clique is None
    # The published topology (the live view's build): the tray that was reset keeps its
    # clique label, the one still waiting for its reset has none.
    reset = read_gpu_report("tray-02", text.replace(
        "<gpu_recovery_action>GPU_RESET</gpu_recovery_action>",
        "<gpu_recovery_action>None</gpu_recovery_action>"))
    assert isinstance(reset, GpuReport)
    snapshot = build_snapshot([], {"tray-01", "tray-02"}, [gpus, reset], kind="block")
    assert TOPOGRAPH_DOMAIN not in snapshot.labels.get("tray-01", {})
    assert snapshot.labels["tray-02"][TOPOGRAPH_DOMAIN] == (
        "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.1")
    verdict = evaluate({"nvidia_smi_xml": text}, Expectation(nvlink_domain=True))
    assert not verdict.passed and any("GPU_RESET" in f for f in verdict.failures)


@pytest.mark.parametrize(("action", "todo"), [
    ("NODE_REBOOT", "reboot the node"), ("DRAIN_P2P", "drain peer-to-peer work, then reset"),
    ("DRAIN_AND_RESET", "drain the GPU, then reset it"), ("Reset", "reset the GPU"),
    ("Drain and Reset", "drain the GPU, then reset it")])
def test_every_recovery_action_is_named(action: str, todo: str) -> None:
    text = (SMI / "h200-580.159.04-q-x.xml").read_text().replace(
        "<gpu_recovery_action>None</gpu_recovery_action>",
        f"<gpu_recovery_action>{action}</gpu_recovery_action>")
    (failure,) = evaluate({"nvidia_smi_xml": text}, Expectation()).failures
    assert failure.startswith(f"gpu-recovery: GPU 0 ({H200_UUID}): recovery action {action} "
                              f"pending ({todo}")


def test_the_text_report_reads_the_recovery_action() -> None:
    text = (SMI / "h200-580.159.04-q.txt").read_text()
    (gpu,) = parse_nvidia_smi(text).gpus
    assert gpu.recovery_action == "None" and gpu.pending_recovery() is None
    (gpu,) = parse_nvidia_smi(text.replace("GPU Recovery Action                                : "
                                           "None", "GPU Recovery Action                      "
                                           "          : NODE_REBOOT")).gpus
    assert gpu.pending_recovery() == "NODE_REBOOT"
