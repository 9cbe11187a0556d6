"""The SKU gate and the validation gate give the same InfiniBand verdict on the same machine:
the same real ports (sysfs trees built from real ``ibstat`` captures, and procfs's sysfs tree;
provenance in the fixtures' READMEs) read by the ramdisk's collector
(``provisioner.agent.collect``) and by the Ansible facts module
(``playbooks/roles/facts/library/provisioner_node_facts.py``, imported as Ansible runs it: its
functions, on a root directory), judged by ``evaluate`` with the profile's SKU expectation and
with the profile itself.

The ramdisk's module lists: ``ib_core``, ``mlx5_ib``, ``ib_uverbs`` and ``ib_umad`` with their
dependencies, from the host's x86_64 kernel and from Debian's arm64 kernel package."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provisioner.agent.collect import infiniband, infiniband_driver
from provisioner.agent.facts import validate
from provisioner.ramdisk.build import module_order
from provisioner.ramdisk.sysroot import (
    RamdiskError,
    Sysroot,
    arch_named,
    host_arch,
    host_sysroot,
)
from provisioner.validation.checks import Expectation, evaluate
from provisioner.validation.sku import sku_expectation
from tests.topology_support.ib_sysfs import load_modules, pci_functions, sysfs_from_ibstat

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "playbooks" / "roles" / "facts" / "library" / "provisioner_node_facts.py"
IB = ROOT / "tests" / "fixtures" / "topology" / "infiniband"
SYSFS = ROOT / "tests" / "fixtures" / "infiniband-sysfs"
PROCFS = SYSFS / "procfs"
LSPCI = (SYSFS / "hpc-notes-lspci.h100.mellanox.txt").read_text()
CAPTURES = ["hpc-notes-ibstat.h100.cx7-ndr-bond.txt", "linux-rdma-ibstat.rdma-dev-19.bond.txt",
            "gpud-ibstat.47.0.h100.some.down.0.txt", "gpud-ibstat.47.0.h100.all.active.0.txt"]
PROFILES = [Expectation(ib_port_count=8, ib_rate_gbps=400), Expectation(ib_port_count=9),
            Expectation(ib_rate_gbps=100), Expectation(ib_port_count=2, ib_rate_gbps=100),
            Expectation(ib_port_count=3, ib_rate_gbps=40)]
IB_MODULES = ("ib_core.ko", "ib_uverbs.ko", "ib_umad.ko", "mlx5_core.ko", "mlx5_ib.ko")


@pytest.fixture(scope="module")
def facts_module() -> ModuleType:
    pytest.importorskip("ansible.module_utils.basic")
    spec = importlib.util.spec_from_file_location("provisioner_node_facts", MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def machine(root: Path, capture: str | None, *, driver: bool = True) -> Path:
    pci_functions(root, LSPCI)
    if driver:
        load_modules(root)
    if capture is None:
        return root
    if capture == "procfs":
        shutil.copytree(PROCFS / "sys/class/infiniband", root / "sys/class/infiniband")
        return root
    return sysfs_from_ibstat(root, (IB / capture).read_text())


def reports(root: Path, facts_module: ModuleType) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ramdisk's report, the facts module's report) of the InfiniBand sections."""
    base = {"system": {"serial": "S"}, "cpu": {"cores": 1}, "memory_mib": 1, "nics": []}
    ramdisk = {"infiniband": infiniband(root), "infiniband_driver": infiniband_driver(root)}
    module = {"infiniband": facts_module.infiniband(str(root)),
              "infiniband_driver": facts_module.infiniband_driver(str(root))}
    validate(base | ramdisk)
    validate(base | module)
    return ramdisk, module


@pytest.mark.parametrize("capture", [*CAPTURES, "procfs"])
def test_both_collectors_read_the_same_ports(tmp_path: Path, capture: str,
                                             facts_module: ModuleType) -> None:
    ramdisk, module = reports(machine(tmp_path, capture), facts_module)
    assert ramdisk == module
    assert all("link_layer" in port for hca in ramdisk["infiniband"] for port in hca["ports"])


@pytest.mark.parametrize("capture", CAPTURES)
def test_both_gates_give_the_same_verdict(tmp_path: Path, capture: str,
                                          facts_module: ModuleType) -> None:
    """On ports that are up (a subnet manager ran), the SKU gate on the ramdisk's report and
    the validation gate on the facts module's report hold and pass alike, with the same
    lines; Down ports fail validation only (the SKU gate does not judge port state)."""
    ramdisk, module = reports(machine(tmp_path, capture), facts_module)
    down = "some.down" in capture
    for profile in PROFILES:
        at_inspection = evaluate(ramdisk, sku_expectation(profile))
        at_validation = evaluate(module, profile)
        if not down:
            assert at_inspection.failures == at_validation.failures, profile
        else:
            assert set(at_inspection.failures) <= set(at_validation.failures), profile
        assert at_inspection.notes == at_validation.notes == ()
    # the node passes both: the Ethernet bond is neither counted nor rated
    if capture.startswith("hpc-notes"):
        assert evaluate(ramdisk, sku_expectation(PROFILES[0])).passed
        assert evaluate(module, PROFILES[0]).passed


def test_without_a_driver_the_gates_say_so(tmp_path: Path, facts_module: ModuleType) -> None:
    ramdisk, module = reports(machine(tmp_path, None, driver=False), facts_module)
    assert ramdisk == module and ramdisk["infiniband_driver"]["loaded"] is False
    profile = PROFILES[0]
    inspection = evaluate(ramdisk, sku_expectation(profile))
    assert inspection.passed and inspection.notes[0].startswith(
        "InfiniBand not checked at inspection: no driver (10 Mellanox PCI network functions")
    validation = evaluate(module, profile)
    assert not validation.passed and validation.failures[0].startswith(
        "ib-driver: no InfiniBand driver loaded (10 Mellanox")


def _names(paths: list[str]) -> list[str]:
    return [Path(p).name for p in paths]


def _order_problems(sysroot: Sysroot) -> list[str]:
    """What is wrong with the InfiniBand modules' load order (nothing: an empty list)."""
    order = _names(module_order(sysroot, sysroot.arch.infiniband_modules, required=True))
    problems = [f"{name} missing from {order}" for name in IB_MODULES if name not in order]
    if not problems and not (order.index("ib_core.ko") < order.index("mlx5_ib.ko")
                             and order.index("mlx5_core.ko") < order.index("mlx5_ib.ko")):
        problems.append(f"mlx5_ib loads before ib_core or mlx5_core: {order}")
    return problems


def test_the_x86_64_ramdisk_has_the_infiniband_stack() -> None:
    host = host_arch()
    if host is None or host.name != "x86_64" or shutil.which("modprobe") is None:
        pytest.skip("needs an x86_64 host with kmod")
    assert _order_problems(host_sysroot(host)) == []


def test_the_arm64_ramdisk_has_the_infiniband_stack(tmp_path: Path) -> None:
    """From Debian's arm64 kernel package (the .deb the arm64 ramdisk is built from)."""
    arch = arch_named("arm64")
    depends = subprocess.run(["apt-cache", "depends", "--important",
                              f"{arch.kernel_package}:{arch.deb}"], capture_output=True,
                             text=True, check=False).stdout
    package = next((line.split(":")[1].strip() for line in depends.splitlines()
                    if "Depends:" in line), None)
    if package is None or shutil.which("depmod") is None:
        pytest.skip("apt has no arm64 packages (dpkg --add-architecture arm64)")
    fetched = subprocess.run(["apt-get", "download", "-q", f"{package}:{arch.deb}"],
                             cwd=tmp_path, capture_output=True, text=True, check=False)
    if fetched.returncode != 0:
        pytest.skip(f"apt-get download {package}: {fetched.stderr.strip()[-200:]}")
    (deb,) = tmp_path.glob("*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "root")], check=True)
    kver = package.removeprefix("linux-image-")
    subprocess.run(["depmod", "-b", str(tmp_path / "root"), kver], check=True)
    sysroot = Sysroot(arch, tmp_path / "root", kver, "")
    assert _order_problems(sysroot) == []
    with pytest.raises(RamdiskError, match="has no module no_such_hca"):
        module_order(sysroot, ("no_such_hca",), required=True)
