"""Kernel log (``dmesg``, ``dmesg -T``, ``journalctl -k``, ``/var/log/messages``) → findings.

The lines we read, wherever they sit in a line (any timestamp or syslog prefix before them)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 ...)
    NVRM: Xid (PCI:0000:dc:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node
      Reboot Required)                                                  (one line in the log)
    nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV
    NVRM: GPU at PCI:0000:18:00.0 has fallen off the bus.          (no XID: newer drivers, at probe)
    NVRM: The NVIDIA GPU 0000:b3:00.0 ... fallen off the bus and is not responding to commands.
"""

from __future__ import annotations

import re

from provisioner.health import xid
from provisioner.health.model import Action, Finding, HealthClass, Source, dedupe

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")
_SXID = re.compile(r"(nvidia-nvswitch\d*): SXid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")
_OFF_BUS = re.compile(r"NVRM: .*fallen off the bus")
_GPU_AT = re.compile(r"NVRM: (?:GPU at |The NVIDIA GPU )(?:PCI:)?([0-9a-fA-F:.]+)")
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)
_FATAL = re.compile(r"\bfatal\b", re.IGNORECASE)
_NVLINK5 = frozenset(range(144, 151))


def classify_kernel_log(text: str) -> list[Finding]:
    findings: list[Finding] = []
    lost: set[str] = set()
    pending_gpu = ""
    for raw in text.splitlines():
        line = raw.strip()
        if (match := _XID.search(line)) is not None:
            finding = _xid_finding(match[1], int(match[2]), match[3], line)
            findings.append(finding)
            if finding.cls is HealthClass.GPU_LOST:
                lost.add(_short(match[1]))
        elif (match := _SXID.search(line)) is not None:
            findings.append(_sxid_finding(match[1], match[2], int(match[3]), match[4], line))
        elif "NVRM:" in line:
            if (gpu := _GPU_AT.search(line)) is not None:
                pending_gpu = gpu[1]
            if _OFF_BUS.search(line) and _short(pending_gpu) not in lost:
                # the multi-line form names the GPU a line or two before "fallen off the bus"
                evidence = line if pending_gpu in line else f"GPU {pending_gpu or '?'}: {line}"
                findings.append(Finding(HealthClass.GPU_LOST, xid.lookup(79).action, evidence,
                                        Source.KERNEL_LOG, f"{pending_gpu} off the bus"))
                lost.add(_short(pending_gpu))
    return dedupe(findings)


def _short(pci: str) -> str:
    """``0000:3b:00.0`` and ``0000:3b:00`` are one GPU: domain:bus:device."""
    return ":".join(pci.lower().split(".")[0].split(":")[:3])


def _xid_finding(pci: str, code: int, message: str, line: str) -> Finding:
    entry = xid.lookup(code)
    action = entry.action
    if code == 154:
        named = xid.recovery_action(message.rsplit(" to ", 1)[-1])
        action = named if named is not None else Action.DRAIN
    elif (code in _NVLINK5 or code == 74) and _NONFATAL.search(message):
        action = Action.NONE
    return Finding(entry.cls, action, line, Source.KERNEL_LOG, f"{_short(pci)} xid {code}")


def _sxid_finding(switch: str, pci: str, code: int, message: str, line: str) -> Finding:
    """NVSwitch SXids (Fabric Manager guide): a fatal one takes the switch and its GPUs'
    partition down until they are reset, which on a node means a reboot; non-fatal ones are
    recorded only."""
    fatal = _FATAL.search(message) is not None and _NONFATAL.search(message) is None
    action = Action.RESTART_OS if fatal else Action.NONE
    return Finding(HealthClass.FABRIC, action, line, Source.KERNEL_LOG,
                   f"{switch} {_short(pci)} sxid {code}")
