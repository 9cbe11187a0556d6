"""GB200/GB300 (NVL72) compute trays: the IMEX prerequisites of multi-node NVLink. Pure.

IMEX (the Internode Memory Exchange service) must be installed. With the NVIDIA DRA driver
(``imex = "dra"``), the driver runs the IMEX daemons inside its ComputeDomains, so the host's
own ``nvidia-imex.service`` must be masked (two IMEX daemons on one tray fight over its
channels). With ``imex = "host"`` the host service runs it. Either way, a compute tray runs
no Fabric Manager: on NVL72 the NVLink switch trays manage the fabric.

Reads the ``imex`` section of a facts report (the Ansible ``facts`` role writes it from
``systemctl is-enabled/is-active``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODES = ("dra", "host")


def check_imex(report: Mapping[str, Any], mode: str) -> list[str]:
    facts = report.get("imex")
    if not isinstance(facts, Mapping):
        return ["imex: the facts report says nothing about IMEX (no systemctl, or a facts "
                f"role from before IMEX checks), expected IMEX set up for {mode}"]
    failures = []
    if facts.get("package") is not True:
        failures.append("imex: the nvidia-imex package is not installed, expected it "
                        "(multi-node NVLink needs IMEX)")
    enabled = str(facts.get("service_enabled", "unknown"))
    active = str(facts.get("service_active", "unknown"))
    if mode == "dra" and enabled != "masked":
        failures.append(f"imex: host nvidia-imex.service is {enabled} ({active}), expected "
                        "masked: the NVIDIA DRA driver runs IMEX in its ComputeDomains")
    if mode == "host" and active != "active":
        failures.append(f"imex: host nvidia-imex.service is {active} ({enabled}), expected "
                        "active")
    fm_enabled = str(facts.get("fabricmanager_enabled", "unknown"))
    fm_active = str(facts.get("fabricmanager_active", "unknown"))
    if fm_active == "active" or fm_enabled in ("enabled", "enabled-runtime"):
        failures.append(f"imex: host nvidia-fabricmanager.service is {fm_enabled} "
                        f"({fm_active}), expected none on a GB200/GB300 compute tray (its "
                        "NVLink switch trays manage the fabric)")
    return failures
