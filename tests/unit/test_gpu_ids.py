"""The PCI device ID -> model table, and the ramdisk collector naming GPUs with it."""

from __future__ import annotations

import importlib.util
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from provisioner.agent import gpu_ids
from provisioner.agent.collect import collect
from provisioner.agent.facts import validate
from provisioner.validation.checks import Expectation, evaluate

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_COPY = ROOT / "playbooks" / "roles" / "facts" / "module_utils" / "provisioner_gpu_ids.py"
SOURCES = ROOT / "tests" / "fixtures" / "gpu_ids"
NVSMI = ROOT / "tests" / "fixtures" / "topology" / "nvidia-smi"


def generator() -> ModuleType:
    """scripts/gen_gpu_ids.py (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("gen_gpu_ids", ROOT / "scripts" /
                                                  "gen_gpu_ids.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("text", "expected"), [
    ("0x2330", 0x2330),          # sysfs
    ("2330", 0x2330),            # lspci -n
    ("10de:2330", 0x2330),       # lspci -nn
    ("0x233010DE", 0x2330),      # nvidia-smi DTD v12 pci_device_id
    ("233010DE", 0x2330),        # driver 580 (DTD v13): no 0x
    (" 233010de\n", 0x2330),
    ("0x233015B3", None),        # combined ID of another vendor
    ("15b3:1021", None),
    ("H100", None),
    ("", None),
], ids=lambda v: repr(v))
def test_device_id_spellings(text: str, expected: int | None) -> None:
    assert gpu_ids.device_id(text) == expected


@pytest.mark.parametrize(("device", "name"), [
    ("0x20b2", "NVIDIA A100-SXM4-80GB"),
    ("0x2330", "NVIDIA H100 80GB HBM3"),
    ("233010DE", "NVIDIA H100 80GB HBM3"),
    ("0x2331", "NVIDIA H100 PCIe"),
    ("0x2321", "NVIDIA H100 NVL"),
    ("0x2335", "NVIDIA H200"),
    ("0x2329", "NVIDIA H20"),
    ("0x2901", "NVIDIA B200"),
    ("0x3182", "NVIDIA B300 SXM6 AC"),
    ("0x2941", "NVIDIA GB200"),
    ("0x31c2", "NVIDIA GB300"),
    ("0x26b9", "NVIDIA L40S"),
    ("0x27b8", "NVIDIA L4"),
    ("0x2bb5", "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
    ("0x2bb1", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"),
    ("0x2bb4", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"),
    ("0x1eb8", "Tesla T4"),           # was "NVIDIA 0x1eb8": held by the SKU gate
    ("0x2236", "NVIDIA A10"),
    ("0x2237", "NVIDIA A10G"),
    ("0x25b6", "NVIDIA A2 / A16"),    # NVIDIA names the boards apart, by subsystem
    ("0x20b7", "NVIDIA A30"),
    ("0x2235", "NVIDIA A40"),
    ("0x20b5", "NVIDIA A100 80GB PCIe"),
    ("0x20f1", "NVIDIA A100-PCIE-40GB"),
    ("0x2339", "NVIDIA H100"),
    ("0x233b", "NVIDIA H200 NVL"),
    ("0x2342", "NVIDIA GH200 120GB / 480GB"),
    ("0x2348", "NVIDIA GH200 144G HBM3e"),
    ("0x26b1", "NVIDIA RTX 6000 Ada Generation"),
    ("0x26b5", "NVIDIA L40"),
    ("0x2909", "NVIDIA HGX B200 168GB"),
    ("0x31c3", "NVIDIA GB300"),
    ("0x1db1", "Tesla V100-SXM2-16GB"),
    ("0x1db5", "Tesla V100-SXM2-32GB"),
    ("0x1df6", "Tesla V100S-PCIE-32GB"),
    ("0x1db2", "NVIDIA Tesla V100 DGXS 16GB"),  # not in NVIDIA's legacy list: pci.ids
    ("0x3021", "NVIDIA PCIe Faber"),  # Rubin GR100: pci.ids has no marketing name yet
    ("0x22a3", "NVIDIA 0x22a3"),      # H100 NVSwitch: not a GPU
    ("0x1234", "NVIDIA 0x1234"),      # unknown: never guessed
])
def test_model_names(device: str, name: str) -> None:
    assert gpu_ids.model_name(device) == name


@pytest.mark.parametrize(("expected", "name", "ok"), [
    ("H100", "NVIDIA H100 80GB HBM3", True),
    ("h100", "NVIDIA H100 80GB HBM3", True),
    ("H100 SXM5", "NVIDIA H100 80GB HBM3", True),   # through its pci.ids name
    ("H100 80GB HBM3", "NVIDIA H100 80GB HBM3", True),
    ("H100", "NVIDIA H100 NVL", True),
    ("H20", "NVIDIA H200", False),
    ("H20", "NVIDIA H20", True),
    ("H200", "NVIDIA H200 NVL", True),
    ("B200", "NVIDIA GB200", False),
    ("GB200", "NVIDIA GB200", True),
    ("A100", "NVIDIA A100-SXM4-80GB", True),
    ("L4", "NVIDIA L40S", False),
    ("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
    ("H100", "NVIDIA A100-SXM4-80GB", False),
    ("T4", "Tesla T4", True),
    ("A10", "NVIDIA A10G", False),
    ("A10G", "NVIDIA A10G", True),
    ("A2", "NVIDIA A2 / A16", True),
    ("A16", "NVIDIA A2 / A16", True),
    ("A16", "NVIDIA A2", False),          # nvidia-smi's name of an A2 board
    ("A100", "NVIDIA PG509-210", True),   # a board name NVIDIA gives 10de:20b2 (VARIANTS)
    ("A100 SXM4", "NVIDIA PG509-210", True),
    ("GH200 480GB", "NVIDIA GH200 480GB", True),
    ("V100", "Tesla V100-SXM2-32GB", True),
    ("V100 SXM2 32GB", "Tesla V100-SXM2-32GB", True),   # pci.ids' spelling
    ("V100", "Tesla V100S-PCIE-32GB", False),
    ("V100S", "Tesla V100S-PCIE-32GB", True),
    ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", True),
    ("L40", "NVIDIA L40S", False),
    ("GR100", "NVIDIA PCIe Faber", True),
])
def test_model_matches_whole_words(expected: str, name: str, ok: bool) -> None:
    assert gpu_ids.matches(expected, name) is ok


def test_the_ansible_role_carries_the_same_table() -> None:
    assert ANSIBLE_COPY.read_bytes() == Path(gpu_ids.__file__).read_bytes(), (
        "run python3 scripts/gen_gpu_ids.py (it writes both files)")


def test_the_table_is_what_the_generator_makes_of_the_sources() -> None:
    """Both copies are the generator's output for the committed pci.ids and NVIDIA tables:
    no entry was added or changed by hand."""
    gen = generator()
    text = gen.generate(SOURCES / "pci.ids-10de",
                        SOURCES / "open-gpu-kernel-modules-compatible-gpus.md",
                        SOURCES / "nvGpus-legacy-580.h")
    assert Path(gpu_ids.__file__).read_text() == text, "run python3 scripts/gen_gpu_ids.py"
    assert ANSIBLE_COPY.read_text() == text
    assert gen.main(["--check"]) == 0


def test_the_table_cites_its_pci_ids_version() -> None:
    head = (SOURCES / "pci.ids-10de").read_text().splitlines()[:6]
    assert "#\tVersion: 2026.08.22" in head and gpu_ids.PCI_IDS_VERSION == "2026.08.22"
    assert "# pci.ids Version: 2026.08.22, Date: 2026-08-22 03:15:01" in \
        Path(gpu_ids.__file__).read_text()


def test_selection_follows_the_families_not_a_list() -> None:
    """Every pci.ids device of the families is in, whatever its ID; NVSwitches, reserved and
    engineering IDs and consumer boards are not."""
    gen = generator()
    _, pci = gen.read_pci_ids((SOURCES / "pci.ids-10de").read_text())
    picked = {device for device, name in pci.items() if gen.wanted(name)}
    assert picked == set(gpu_ids.MODELS)
    for device in (0x1EB8, 0x2236, 0x2237, 0x2235, 0x25B6, 0x26B1, 0x26B5, 0x1DB1, 0x1DB5,
                   0x1DF6, 0x20B7, 0x2330, 0x2335, 0x233B, 0x2342, 0x2901, 0x3182, 0x2941,
                   0x31C2, 0x2BB5, 0x27B8, 0x26B9, 0x2329, 0x3021):
        assert device in picked, hex(device)
    for device in (0x22A3, 0x1AF1, 0x2900, 0x3000, 0x2F95, 0x2B85, 0x1D81, 0x2345, 0x20C0):
        assert device not in picked, (hex(device), pci.get(device))
    assert {hex(d) for d in picked if pci[d].startswith("GR1")} == {"0x3021", "0x30c0"}


def _captured() -> list[tuple[str, int, str]]:
    """(file, device ID, product name) from real nvidia-smi answers."""
    found: list[tuple[str, int, str]] = []
    for path in (NVSMI / "h100-580.159.04-q-x.xml", NVSMI / "telegraf-a100-sxm4-v12.xml",
                 SOURCES / "telegraf-tesla-t4.xml"):
        gpu = ET.parse(path).getroot().find("gpu")
        assert gpu is not None
        device = gpu_ids.device_id(gpu.findtext("pci/pci_device_id") or "")
        assert device is not None
        found.append((path.name, device, gpu.findtext("product_name") or ""))
    # an AWS guest: the device ID reads 000000DE, the name is the A10G's (10de:2237)
    a10g = ET.parse(SOURCES / "telegraf-a10g.xml").getroot().find("gpu")
    assert a10g is not None and a10g.findtext("pci/pci_device_id") == "000000DE"
    found.append(("telegraf-a10g.xml", 0x2237, a10g.findtext("product_name") or ""))
    lines = (SOURCES / "h200-580.159.04-query.csv").read_text().splitlines()
    row = dict(zip(lines[1].split(", "), lines[2].split(", "), strict=True))
    device = gpu_ids.device_id(row["pci.device_id"])
    assert device is not None
    found.append(("h200-580.159.04-query.csv", device, row["name"]))
    return found


def test_names_are_what_nvidia_smi_printed_on_real_gpus() -> None:
    seen = {(name, hex(device), product) for name, device, product in _captured()}
    assert {(name, hex(device), gpu_ids.model_name(device))
            for name, device, _ in _captured()} == seen
    assert {product for *_, product in seen} == {
        "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA A10G",
        "NVIDIA H200"}


def test_a_t4_node_passes_the_sku_gate_from_pci_alone(tmp_path: Path) -> None:
    """The issue's T4 node: held as ``saw 'NVIDIA 0x1eb8'`` before the table knew it."""
    root = sysfs_tree(tmp_path, {f"0000:{17 + i:02x}:00.0": ("0x10de", "0x1eb8", "0x030200")
                                 for i in range(4)})
    facts = validate(collect(root))
    assert [g["name"] for g in facts["gpus"]] == ["Tesla T4"] * 4
    assert evaluate(facts, Expectation(gpu_count=4, gpu_model="T4")).passed
    assert evaluate({"gpus": [{"vendor": "0x10de", "device": "0x1eb8",
                               "name": "NVIDIA 0x1eb8"}] * 4},
                    Expectation(gpu_count=4, gpu_model="T4")).passed


def sysfs_tree(root: Path, devices: dict[str, tuple[str, str, str]]) -> Path:
    """A minimal node: /proc, DMI, one NIC and the given PCI devices (address -> vendor,
    device, class), as the kernel writes them."""
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU\n")
    (root / "proc/meminfo").write_text("MemTotal:       2097152 kB\n")
    dmi = root / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    for name, value in (("sys_vendor", "QEMU"), ("product_name", "Standard PC"),
                        ("product_serial", "SKU-1"), ("product_uuid", "u")):
        (dmi / name).write_text(value + "\n")
    nic = root / "sys/class/net/eth0"
    (nic / "device").mkdir(parents=True)
    (nic / "address").write_text("52:54:00:12:34:56\n")
    for address, (vendor, device, klass) in devices.items():
        path = root / "sys/bus/pci/devices" / address
        path.mkdir(parents=True)
        (path / "vendor").write_text(vendor + "\n")
        (path / "device").write_text(device + "\n")
        (path / "class").write_text(klass + "\n")
    return root


def test_collector_names_an_h100_by_model(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path, {
        "0000:17:00.0": ("0x10de", "0x2330", "0x030200"),   # H100 SXM5 (3D controller)
        "0000:18:00.0": ("0x10de", "0x2330", "0x030200"),
        "0000:19:00.0": ("0x10de", "0x22a3", "0x068000"),   # NVSwitch: a bridge, no GPU
        "0000:1a:00.0": ("0x15b3", "0x1021", "0x020700"),   # ConnectX-7
    })
    facts = validate(collect(root))
    assert [g["name"] for g in facts["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert {g["device"] for g in facts["gpus"]} == {"0x2330"}
    # the SKU gate can judge these facts alone, before any OS or driver
    assert evaluate(facts, Expectation(gpu_count=2, gpu_model="H100")).passed
    verdict = evaluate(facts, Expectation(gpu_count=8, gpu_model="H200"))
    assert verdict.failures == (
        "gpu-count: saw 2 GPUs (PCI), expected 8",
        "gpu-model: saw 'NVIDIA H100 80GB HBM3' on 2 of 2 GPUs (PCI), expected a model "
        "containing 'H200'")


def test_pre_table_facts_are_named_by_the_gate(tmp_path: Path) -> None:
    """Facts recorded by an older ramdisk (``NVIDIA 0x2330``) still pass an H100 profile."""
    old = {"gpus": [{"vendor": "0x10de", "device": "0x2330", "name": "NVIDIA 0x2330"}] * 8}
    assert evaluate(old, Expectation(gpu_count=8, gpu_model="H100")).passed


def test_sku_override_counts_only_after_the_record() -> None:
    from provisioner.validation.sku import held_reasons

    record = {"passed": False, "at": "2026-11-25T10:00:21.500000+00:00",
              "failures": ["gpu-count: saw 0 GPUs (PCI), expected 8"], "checks": ["gpus"]}
    assert held_reasons({"sku": record}) == ("gpu-count: saw 0 GPUs (PCI), expected 8",)
    earlier = {"by": "alice", "at": "2026-11-25T10:00:21+00:00", "reason": "x"}
    later = dict(earlier, at="2026-11-25T10:00:22+00:00")
    assert held_reasons({"sku": record, "sku_override": earlier}) != ()
    assert held_reasons({"sku": record, "sku_override": later}) == ()
    assert held_reasons({"sku": dict(record, passed=True, failures=[])}) == ()
    assert held_reasons({}) == ()
