"""NVIDIA data-centre GPUs by PCI device ID: the one table that names a GPU in every view.

Standard library only and no imports from the package: the inspection ramdisk carries it (the
agent names GPUs from sysfs with it), the Ansible ``facts`` role carries a byte-for-byte copy in
``playbooks/roles/facts/module_utils/provisioner_gpu_ids.py`` (a unit test keeps the two equal),
and the inventory and the validation gate import it.

Sources:

* Device IDs and the bracketed chip names (``pci_name``): the PCI ID database, ``pci.ids``
  version 2026.08.22 (https://pci-ids.ucw.cz/read/PC/10de; repository pciutils/pciids, commit
  c1c12547d626ebf05fd0223144ad87fab5e95d06), vendor ``10de``, e.g.
  ``2330  GH100 [H100 SXM5 80GB]``.
* ``name``: what ``nvidia-smi -q -x`` writes in ``<product_name>`` (NVML's
  ``nvmlDeviceGetName``), so the ramdisk (no driver) and the installed OS (driver up) name a GPU
  alike. Seen in real captures: ``NVIDIA H100 80GB HBM3`` (10de:2330, this project's capture
  ``h100-580.159.04-q-x.xml``, driver 580.159.04), ``NVIDIA A100-SXM4-80GB`` (telegraf's
  ``a100-sxm4-v12.xml``). The others are the names NVML reports as published in NVIDIA's data
  sheets and in public logs of those boards (``NVIDIA H200``, ``NVIDIA B200``, ``NVIDIA GB200``,
  ``NVIDIA B300 SXM6 AC``, ``NVIDIA GB300``...); where no such name was found the entry is
  ``"NVIDIA " + <pci.ids bracket name>``, marked ``# pci.ids`` below.

A device ID this table lacks is named ``NVIDIA 0x<device>`` (the pre-table name), never guessed.
"""

from __future__ import annotations

import re

NVIDIA_VENDOR = 0x10DE

# device ID -> (nvidia-smi product name, pci.ids name)
MODELS: dict[int, tuple[str, str]] = {
    # Ampere (GA100)
    0x20B0: ("NVIDIA A100-SXM4-40GB", "GA100 [A100 SXM4 40GB]"),
    0x20B1: ("NVIDIA A100-PCIE-40GB", "GA100 [A100 PCIe 40GB]"),
    0x20B2: ("NVIDIA A100-SXM4-80GB", "GA100 [A100 SXM4 80GB]"),
    0x20B3: ("NVIDIA A100-SXM-64GB", "GA100 [A100-SXM-64GB]"),
    0x20B5: ("NVIDIA A100 80GB PCIe", "GA100 [A100 PCIe 80GB]"),
    0x20B7: ("NVIDIA A30", "GA100GL [A30 PCIe]"),
    0x20F1: ("NVIDIA A100-PCIE-40GB", "GA100 [A100 PCIe 40GB]"),
    0x20F3: ("NVIDIA A800-SXM4-80GB", "GA100 [A800-SXM4-80GB]"),
    0x20F5: ("NVIDIA A800 80GB PCIe", "GA100 [A800 80GB PCIe]"),
    # Ada (AD10x)
    0x26B5: ("NVIDIA L40", "AD102GL [L40]"),
    0x26B9: ("NVIDIA L40S", "AD102GL [L40S]"),
    0x27B8: ("NVIDIA L4", "AD104GL [L4]"),
    # Hopper (GH100)
    0x2321: ("NVIDIA H100 NVL", "GH100 [H100L 94GB]"),
    0x2322: ("NVIDIA H800 PCIe", "GH100 [H800 PCIe]"),
    0x2324: ("NVIDIA H800", "GH100 [H800]"),
    0x2329: ("NVIDIA H20", "GH100 [H20]"),
    0x232C: ("NVIDIA H20 HBM3e", "GH100 [H20 HBM3e]"),  # pci.ids
    0x2330: ("NVIDIA H100 80GB HBM3", "GH100 [H100 SXM5 80GB]"),
    0x2331: ("NVIDIA H100 PCIe", "GH100 [H100 PCIe]"),
    0x2335: ("NVIDIA H200", "GH100 [H200 SXM 141GB]"),
    0x2339: ("NVIDIA H100 SXM5 94GB", "GH100 [H100 SXM5 94GB]"),  # pci.ids
    0x233B: ("NVIDIA H200 NVL", "GH100 [H200 NVL]"),
    0x2342: ("NVIDIA GH200 480GB", "GH100 [GH200 120GB / 480GB]"),
    0x2348: ("NVIDIA GH200 144G HBM3e", "GH100 [GH200 144G HBM3e]"),
    # Blackwell (GB100, GB110, GB202)
    0x2901: ("NVIDIA B200", "GB100 [B200]"),
    0x2909: ("NVIDIA HGX B200 168GB", "GB100 [HGX B200 168GB]"),  # pci.ids
    0x2941: ("NVIDIA GB200", "GB100 [HGX GB200]"),
    0x29BC: ("NVIDIA B100", "GB102 [B100]"),
    0x3182: ("NVIDIA B300 SXM6 AC", "GB110 [B300 SXM6 AC]"),
    0x31C2: ("NVIDIA GB300", "GB110 [GB300]"),
    0x31C3: ("NVIDIA GB300", "GB110 [GB300]"),
    0x2BB1: ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
             "GB202GL [RTX PRO 6000 Blackwell Workstation Edition]"),
    0x2BB4: ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
             "GB202GL [RTX PRO 6000 Blackwell Max-Q Workstation Edition]"),
    0x2BB5: ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
             "GB202GL [RTX PRO 6000 Blackwell Server Edition]"),
}

_BY_NAME: dict[str, list[str]] = {}
for _name, _pci in MODELS.values():
    _BY_NAME.setdefault(_name.lower(), []).append(_pci)

# sysfs "0x2330", lspci "2330", "10de:2330", nvidia-smi's pci_device_id "0x233010DE" or
# "233010DE" (device in the high 16 bits, vendor in the low 16)
_ID = re.compile(r"^(?:0x)?(?:(?P<vendor>[0-9a-f]{4}):)?(?P<id>[0-9a-f]{1,4})$")
_COMBINED = re.compile(r"^(?:0x)?(?P<id>[0-9a-f]{4})(?P<vendor>[0-9a-f]{4})$")


def device_id(text: str) -> int | None:
    """The PCI device ID in any of the spellings above; None when it is none of them, or when
    a combined ID names a vendor other than NVIDIA."""
    value = text.strip().lower()
    match = _COMBINED.match(value)
    if match:
        return int(match["id"], 16) if int(match["vendor"], 16) == NVIDIA_VENDOR else None
    match = _ID.match(value)
    if match is None or (match["vendor"] and int(match["vendor"], 16) != NVIDIA_VENDOR):
        return None
    return int(match["id"], 16)


def device_hex(text: str) -> str | None:
    """``0x2330`` (the facts schema's spelling) from any spelling, or None."""
    found = device_id(text)
    return None if found is None else f"0x{found:04x}"


def model_name(device: int | str) -> str:
    """nvidia-smi's product name for an NVIDIA device ID (``NVIDIA 0x<id>`` when unknown)."""
    found = device_id(device) if isinstance(device, str) else device
    if found is None:
        return f"NVIDIA {str(device).strip()[:16]}"
    known = MODELS.get(found)
    return known[0] if known else f"NVIDIA 0x{found:04x}"


def matches(expected: str, name: str) -> bool:
    """Whether a GPU called ``name`` is the model a profile expects: ``expected`` found in the
    name, or in the table's pci.ids name for it, as whole words (case-insensitive). So
    ``H100`` and ``H100 SXM5`` match ``NVIDIA H100 80GB HBM3``; ``H20`` does not match
    ``NVIDIA H200``, nor ``B200`` ``NVIDIA GB200``, nor ``H100`` ``NVIDIA GH100``."""
    want = expected.strip().lower()
    if not want:
        return True
    pattern = re.compile(r"(?<![0-9a-z])" + re.escape(want) + r"(?![0-9a-z])")
    names = [name.lower(), *(alias.lower() for alias in _BY_NAME.get(name.strip().lower(), []))]
    return any(pattern.search(candidate) for candidate in names)
