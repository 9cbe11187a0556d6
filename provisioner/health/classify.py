"""Which tool printed this text, and its findings: what ``provisioner health classify`` runs.

Detection, first match wins: a JSON object → DCGM (``dcgmi diag -j``, ``dcgmi health -c -j``); an
``NVSMI LOG`` banner or ``ECC Errors``/``Remapped Rows``/``Retired Pages`` section → nvidia-smi
-q; ``CA '…'`` or ``Infiniband device '…'`` → ibstat/ibstatus; ``| … |`` table rows →
dcgmi text; ``id | date | time | sensor | event`` rows → ipmitool SEL; anything else is read
as a kernel log (which may well hold nothing).
"""

from __future__ import annotations

import json
import re

from provisioner.errors import InvalidRequest
from provisioner.health.dcgm import classify_dcgm_json, classify_dcgm_text
from provisioner.health.ib import classify_ibstat
from provisioner.health.kernel_log import classify_kernel_log
from provisioner.health.model import Finding, Source
from provisioner.health.nvsmi import classify_nvsmi
from provisioner.health.sel import classify_sel, is_sel

_NVSMI = re.compile(r"NVSMI LOG|^\s*(ECC Errors|Remapped Rows|Retired Pages)\s*$", re.MULTILINE)
_IBSTAT = re.compile(r"^(CA '[^']+'|Infiniband device '[^']+' port)", re.MULTILINE)
_TABLE = re.compile(r"^\|[^|]+\|[^|]*\|\s*$", re.MULTILINE)


def detect(text: str) -> Source:
    stripped = text.lstrip()
    if stripped.startswith("{") and _is_json(stripped):
        return Source.DCGM
    if _NVSMI.search(text):
        return Source.NVIDIA_SMI
    if _IBSTAT.search(text):
        return Source.IBSTAT
    if is_sel(text):
        return Source.IPMI_SEL
    if _TABLE.search(text):
        return Source.DCGM
    return Source.KERNEL_LOG


def classify(text: str) -> list[Finding]:
    """The findings in one saved output. ``InvalidRequest`` when it is not what it looks
    like (an ibstat that does not parse, JSON that is not DCGM's)."""
    kind = detect(text)
    if kind is Source.DCGM:
        if text.lstrip().startswith("{"):
            return classify_dcgm_json(text)
        return classify_dcgm_text(text)
    if kind is Source.NVIDIA_SMI:
        return classify_nvsmi(text)
    if kind is Source.IBSTAT:
        return classify_ibstat(text)
    if kind is Source.IPMI_SEL:
        return classify_sel(text)
    return classify_kernel_log(text)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"input looks like JSON but does not parse: {exc}") from exc
    return True
