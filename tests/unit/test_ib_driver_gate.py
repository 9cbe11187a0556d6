"""One InfiniBand truth from the ramdisk to the gate, on real sysfs trees: the procfs test
tree (tests/fixtures/infiniband-sysfs/, a real layout with HCAs whose GUID cannot be read) and
trees built from real ``ibstat`` captures (tests/fixtures/topology/infiniband/; an H100 node
with 8x ConnectX-7 NDR and a ConnectX-6 Dx ``mlx5_bond_0`` Ethernet bond).

Rules: only InfiniBand ports count; a report read without an InfiniBand driver is "not
checked at inspection" (a note, never a hold) and a failure at validation; a Down port is
named once; one unreadable field never loses the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent.collect import collect, infiniband, infiniband_driver
from provisioner.agent.facts import FactsError, validate
from provisioner.validation.checks import Expectation, evaluate
from provisioner.validation.record import ValidationRecord
from provisioner.validation.sku import sku_expectation
from tests.topology_support.ib_sysfs import load_modules, pci_functions, sysfs_from_ibstat
from tests.unit.test_gpu_ids import sysfs_tree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IB = FIXTURES / "topology" / "infiniband"
H100_BOND = (IB / "hpc-notes-ibstat.h100.cx7-ndr-bond.txt").read_text()
H100_LSPCI = (FIXTURES / "infiniband-sysfs" / "hpc-notes-lspci.h100.mellanox.txt"
              ).read_text()
RDMA_DEV = (IB / "linux-rdma-ibstat.rdma-dev-19.bond.txt").read_text()
GPUD_DOWN = (IB / "gpud-ibstat.47.0.h100.some.down.0.txt").read_text()
PROCFS = FIXTURES / "infiniband-sysfs" / "procfs"
HGX = Expectation(ib_port_count=8, ib_rate_gbps=400)
SKU = sku_expectation(HGX)


def node(root: Path, ibstat: str | None = None, *, driver: bool = True,
         lspci: str = H100_LSPCI) -> dict[str, Any]:
    """The ramdisk's report of a node: DMI, a NIC, the Mellanox PCI functions of ``lspci``,
    the InfiniBand stack loaded (or not) and the ports of ``ibstat``."""
    sysfs_tree(root, {})
    pci_functions(root, lspci)
    if driver:
        load_modules(root)
    if ibstat is not None:
        sysfs_from_ibstat(root, ibstat)
    return validate(collect(root))


# -- the collector ----------------------------------------------------------------------------


def test_unreadable_guids_are_left_out_and_the_report_kept(tmp_path: Path) -> None:
    """procfs's tree: mlx4_0 and hfi1_0 have no node_guid file. The collector wrote
    ``"node_guid": "0x"`` and the schema refused the whole report."""
    with pytest.raises(FactsError, match=r"infiniband\[0\]\.node_guid: '0x'"):
        validate({"system": {"serial": "S"}, "cpu": {"cores": 1}, "memory_mib": 1, "nics": [],
                  "infiniband": [{"device": "hfi1_0", "node_guid": "0x"}]})
    sysfs_tree(tmp_path, {})
    shutil.copytree(PROCFS / "sys/class/infiniband", tmp_path / "sys/class/infiniband")
    report = validate(collect(tmp_path))
    hcas = {h["device"]: h for h in report["infiniband"]}
    assert "node_guid" not in hcas["hfi1_0"] and "node_guid" not in hcas["mlx4_0"]
    assert hcas["mlx5_0"]["node_guid"] == "0x0a7fbc1245efd23b"
    assert hcas["mlx4_0"]["ports"] == [
        {"port": n, "state": "ACTIVE", "phys_state": "LinkUp", "rate": "40 Gb/sec (4X QDR)",
         "link_layer": "InfiniBand"} for n in (1, 2)]
    assert hcas["hfi1_0"]["ports"][0]["rate"] == "100 Gb/sec (4X EDR)"


def test_malformed_port_files_drop_the_field_not_the_report(tmp_path: Path) -> None:
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (tmp_path / "sys/class/infiniband/mlx5_0/node_guid").write_text("a088:c203:000d\n")
    (port / "lid").write_text("0xzz\n")
    (port / "state").write_text("\n")
    (port / "rate").write_text("4" * 100 + "\n")
    (hca,) = infiniband(tmp_path)
    assert hca == {"device": "mlx5_0", "ports": [{"port": 1, "state": "unknown",
                                                  "rate": "4" * 64}]}


def test_link_layer_is_recorded_for_every_port(tmp_path: Path) -> None:
    report = node(tmp_path, H100_BOND)
    layers = {h["device"]: h["ports"][0]["link_layer"] for h in report["infiniband"]}
    assert layers.pop("mlx5_bond_0") == "Ethernet"
    assert set(layers.values()) == {"InfiniBand"} and len(layers) == 8


def test_the_driver_fact(tmp_path: Path) -> None:
    loaded = node(tmp_path / "a", H100_BOND)["infiniband_driver"]
    assert loaded == {"loaded": True, "mellanox_functions": 10,
                      "modules": ["ib_core", "ib_umad", "ib_uverbs", "mlx5_ib"]}
    # mlx5_core alone (the ramdisk before this fix): HCAs on PCI, no InfiniBand device
    assert node(tmp_path / "b", driver=False)["infiniband_driver"] == {
        "loaded": False, "mellanox_functions": 10, "modules": []}
    assert node(tmp_path / "c", driver=False, lspci="")["infiniband_driver"] == {
        "loaded": False, "mellanox_functions": 0, "modules": []}
    load_modules(tmp_path / "d", ("ib_core",))  # the core without an HCA driver
    assert infiniband_driver(tmp_path / "d")["loaded"] is False


# -- the gates ------------------------------------------------------------------------------


def test_an_h100_with_a_bluefield_bond_passes_both_gates(tmp_path: Path) -> None:
    """The issue's node: 8x NDR and ``mlx5_bond_0`` at 100 Gb/s Ethernet read "saw 9
    InfiniBand ports" and "mlx5_bond_0 port 1 runs at 100 Gb/s, expected 400"."""
    report = node(tmp_path, H100_BOND)
    for expect in (SKU, HGX):
        verdict = evaluate(report, expect)
        assert verdict.passed, verdict.failures
        assert verdict.checks == ("infiniband",) and verdict.notes == ()


def test_no_driver_is_not_checked_at_inspection_and_fails_validation(tmp_path: Path) -> None:
    vm = node(tmp_path / "vm", driver=False, lspci="")  # a VM: no HCA, so no stack loaded
    held = evaluate(vm, SKU)
    assert held.passed and held.failures == ()
    assert held.checks == ("infiniband-not-checked",)
    assert held.notes == ("InfiniBand not checked at inspection: no driver (no Mellanox HCA "
                          "on PCI)",)
    assert evaluate(vm, HGX).failures == (
        "ib-driver: no InfiniBand driver loaded (no Mellanox HCA on PCI), expected 8 "
        "InfiniBand ports at 400 Gb/s",)

    hcas = node(tmp_path / "hcas", driver=False)  # HCAs on PCI, the driver did not load
    assert evaluate(hcas, SKU).notes == (
        "InfiniBand not checked at inspection: no driver (10 Mellanox PCI network functions "
        "but no HCA driver loaded; modules loaded: none)",)
    (line,) = evaluate(hcas, HGX).failures
    assert line.startswith("ib-driver: no InfiniBand driver loaded (10 Mellanox PCI")


def test_a_driver_that_sees_no_port_is_a_finding_at_both_gates(tmp_path: Path) -> None:
    report = node(tmp_path, None)  # the stack loaded, /sys/class/infiniband empty
    for expect in (SKU, HGX):
        assert evaluate(report, expect).failures == (
            "ib-ports: saw 0 InfiniBand ports (none), expected 8",)


def test_reports_without_the_driver_fact(tmp_path: Path) -> None:
    """An older ramdisk: HCAs listed mean a driver; none listed is not checked."""
    old = {"infiniband": []}
    assert evaluate(old, SKU).notes == (
        "InfiniBand not checked at inspection: no driver (the report names no InfiniBand "
        "driver and lists no HCA)",)
    assert evaluate(old, HGX).failures == ("ib-ports: saw 0 InfiniBand ports (none), "
                                           "expected 8",)
    listed = {k: v for k, v in node(tmp_path, RDMA_DEV).items() if k != "infiniband_driver"}
    assert evaluate(listed, sku_expectation(Expectation(ib_port_count=2))).passed


def test_only_infiniband_ports_are_counted_and_rated(tmp_path: Path) -> None:
    """rdma-dev-19 (linux-rdma): an EDR and a QDR port and a 10 Gb/s Ethernet bond."""
    report = node(tmp_path, RDMA_DEV)
    assert evaluate(report, Expectation(ib_port_count=2, ib_rate_gbps=100)).failures == (
        "ib-rate: mlx5_3 port 1 runs at 40 Gb/s (4xQDR), expected 100 Gb/s",)


def test_a_down_port_is_named_once(tmp_path: Path) -> None:
    """gpud's capture: mlx5_7 Down/Disabled (Ethernet there; InfiniBand here), 10 Gb/s."""
    head, _, tail = GPUD_DOWN.partition("CA 'mlx5_7'")
    mlx5_7, _, rest = tail.partition("CA '")
    sysfs = (head + "CA 'mlx5_7'" + mlx5_7.replace("Rate: 40", "Rate: 10").replace(
        "Link layer: Ethernet", "Link layer: InfiniBand") + "CA '" + rest)
    assert sysfs != GPUD_DOWN
    report = node(tmp_path, sysfs)
    failures = evaluate(report, Expectation(ib_rate_gbps=400)).failures
    assert [f for f in failures if "mlx5_7" in f] == [
        "ib-ports: mlx5_7 port 1 is Down (Disabled), expected Active (LinkUp)"]
    assert evaluate(report, sku_expectation(Expectation(ib_rate_gbps=400))).passed


def test_at_inspection_a_trained_link_is_rated_before_the_subnet_manager(
        tmp_path: Path) -> None:
    """No subnet manager yet: ports are Init/LinkUp; their rate is real and judged."""
    init = H100_BOND.replace("State: Active", "State: Initializing")
    report = node(tmp_path, init)
    assert evaluate(report, SKU).passed
    slow = evaluate(report, sku_expectation(Expectation(ib_rate_gbps=800)))
    assert len(slow.failures) == 8 and slow.failures[0] == (
        "ib-rate: mlx5_0 port 1 runs at 400 Gb/s (4xNDR), expected 800 Gb/s")


def test_the_record_keeps_its_notes() -> None:
    record = ValidationRecord(passed=True, at="2025-01-01T00:00:00+00:00",
                              checks=("infiniband-not-checked",),
                              notes=("InfiniBand not checked at inspection: no driver (x)",))
    assert ValidationRecord.from_facts({"validation": record.to_facts()}) == record


def test_a_real_h200_with_the_ib_stack_and_no_hca_is_held_at_both_gates() -> None:
    """Captured on a lent H200 (fixtures/nvidia-smi/h200-2026-11-27): its kernel had ib_core
    and mlx5_ib loaded, no HCA on PCI. The driver was there to see ports and saw none: a
    profile that expects 8 holds it at inspection and at validation alike, naming 0 ports;
    one that expects none passes it."""
    where = FIXTURES / "nvidia-smi" / "h200-2026-11-27"
    ramdisk = validate(json.loads((where / "collect.with-ib-driver.json").read_text()))
    module = json.loads((where / "facts-module.with-ib-driver.json").read_text())["report"]
    assert ramdisk["infiniband_driver"] == module["infiniband_driver"] == {
        "loaded": True, "modules": ["ib_core", "mlx5_ib"], "mellanox_functions": 0}
    profile = Expectation(gpu_count=1, gpu_model="H200", ib_port_count=8, ib_rate_gbps=400)
    inspection = evaluate(ramdisk, sku_expectation(profile))
    validation = evaluate(module, profile)
    assert inspection.failures == validation.failures == (
        "ib-ports: saw 0 InfiniBand ports (none), expected 8",)
    assert evaluate(module, Expectation(gpu_count=1, gpu_model="H200")).passed
