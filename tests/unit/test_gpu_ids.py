"""The PCI device ID -> model table, and the ramdisk collector naming GPUs with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.agent import gpu_ids
from provisioner.agent.collect import collect
from provisioner.agent.facts import validate
from provisioner.validation.checks import Expectation, evaluate

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_COPY = ROOT / "playbooks" / "roles" / "facts" / "module_utils" / "provisioner_gpu_ids.py"


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
    ("0x1234", "NVIDIA 0x1234"),  # unknown: never guessed
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
])
def test_model_matches_whole_words(expected: str, name: str, ok: bool) -> None:
    assert gpu_ids.matches(expected, name) is ok


def test_the_ansible_role_carries_the_same_table() -> None:
    assert ANSIBLE_COPY.read_bytes() == Path(gpu_ids.__file__).read_bytes(), (
        "copy provisioner/agent/gpu_ids.py to " + str(ANSIBLE_COPY.relative_to(ROOT)))


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
