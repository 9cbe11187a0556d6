"""``[topology]``: the live fabric topology and where it is published."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from provisioner.config.section import Section

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class TopologySettings(Section):
    """The live fabric topology (docs/topology.md): recomputed from the fabric scans and the
    nodes' nvidia-smi reports when nodes join or leave, published only when it changed."""

    format: Literal["tree", "block"] = Field(
        "tree", description="topology.conf plugin (topology/tree or topology/block) and the "
        "unit of the Slinky annotation")
    block_size: int = Field(0, ge=0, description="Planning base block size for topology/block; "
                            "0: the smallest block")
    recompute_interval_s: float = Field(
        300.0, ge=0, description="Safety recompute period besides joins and leaves; 0 disables it")
    debounce_s: float = Field(2.0, ge=0, description="Wait after a join or leave before "
                              "recomputing, so a rack coming up is one publication")
    publish_labels: bool = Field(
        True, description="Topograph labels and the Slinky annotation on Nodes (needs "
        "kube.kubeconfig)")
    publish_configmap: str | None = Field(
        None, description="NAMESPACE/NAME of a ConfigMap with topology.conf and topology.yaml "
        "(needs kube.kubeconfig); unset: none")
    slurm_topology_file: Path | None = Field(
        None, description="topology.conf for a classic slurmctld, written atomically when it "
        "changed; unset: none")
    reload_command: list[str] = Field(
        default_factory=list, description="argv run after the file changed, e.g. "
        "[\"scontrol\", \"reconfigure\"]; empty: none")
    reload_timeout_s: float = Field(60.0, gt=0, description="The reload command is killed "
                                    "after this")
    max_fabric_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024,
        description="Largest ibnetdiscover output a node may post (POST /agent/v1/fabric)")

    @field_validator("publish_configmap")
    @classmethod
    def _check_configmap(cls, value: str | None) -> str | None:
        if value is None:
            return None
        namespace, sep, name = value.partition("/")
        if not sep or not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"expected NAMESPACE/NAME, got {value!r}")
        return value
