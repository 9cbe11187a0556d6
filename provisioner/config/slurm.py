"""``[slurm]``: the hand-off to Slurm and the drain sync both ways."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from provisioner.config.kube import foreign_owner
from provisioner.config.section import Section

_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
_GRES_TYPE = r"^(?!\d+$)[A-Za-z0-9_.-]{1,64}$"
_LABEL_KEY = (r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
              r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class SlurmSettings(Section):
    """The hand-off to Slurm (``registering``) and the drain sync both ways."""

    enabled: bool = Field(
        False, description="Hand nodes to Slurm at registering; false: registering only "
        "releases the GPU operand hold (a Kubernetes-only cluster)")
    restd_url: str | None = Field(
        None, description="slurmrestd base URL (http://host:6820); unset: scontrol only")
    user: str | None = Field(
        "slurm", description="X-SLURM-USER-NAME sent with the JWT (an admin: drain needs it)")
    jwt_token: SecretStr | None = Field(None, description="JWT for slurmrestd")
    jwt_token_file: Path | None = Field(
        None, description="File holding the JWT (re-read when slurmrestd refuses it)")
    scontrol: str = Field(
        "scontrol", description="scontrol command: reads without slurmrestd, drain/resume/"
        "delete where slurmrestd cannot (API v0.0.38)")
    slurm_conf: Path | None = Field(
        None, description="slurm.conf for scontrol (SLURM_CONF); unset: scontrol's default")
    request_timeout_s: float = Field(30.0, gt=0, description="Per-request/command timeout")
    nodeset_label: str = Field(
        "provisioner.io/slurm-nodeset", description="Node label the Slinky NodeSet's "
        "nodeSelector matches; set at the hand-off, removed at retirement")
    nodesets: dict[str, str] = Field(
        default_factory=dict, description="Label value per profile name; a profile not "
        "listed uses its own name")
    register_timeout_s: float = Field(
        900.0, gt=0, description="Wait for Slurm to report the node registered")
    drain_timeout_s: float = Field(
        3600.0, gt=0, description="Wait for Slurm to report the node drained and idle")
    poll_interval_s: float = Field(5.0, gt=0, description="Period of the Slurm polls")
    sync_interval_s: float = Field(
        30.0, ge=0, description="Period of the Slurm to daemon drain sync; 0 disables it")
    drain_directly: bool = Field(
        True, description="Also set DRAIN in Slurm (besides the cordon Slinky acts on)")
    nodeset_namespace: str | None = Field(
        None, description="Namespace of the Slinky NodeSets: when set, the hand-off writes a "
        "GPU node's Gres=gpu:<type>:<count> and Feature into its NodeSet's extraConf (the "
        "NodeSet is named like the nodeset label value)")
    verify_gres: bool = Field(
        True, description="At registering, hold a GPU node whose Slurm Gres, Kubernetes "
        "nvidia.com/gpu.count/gpu.product labels or allocatable nvidia.com/gpu disagree with "
        "its facts (e.g. Gres=(null) on an 8-GPU node)")
    gres_types: dict[str, str] = Field(
        default_factory=dict, description="GPU GRES type per profile name, the site's own "
        "(e.g. \"tesla\"): the registration proof accepts it besides the daemon's short type "
        "(h100) and Slurm's AutoDetect names (nvidia_h100_80gb_hbm3), and the hand-off writes "
        "it as the Gres type")
    reason_prefix: str = Field(
        "provisioner: ", min_length=1, description="Prefix of the drain reasons the daemon "
        "sets; drains without it (or Slinky's slurm-operator:) are someone else's")

    @field_validator("nodesets")
    @classmethod
    def _check_nodesets(cls, value: dict[str, str]) -> dict[str, str]:
        for profile, label in value.items():
            if not re.match(_LABEL_VALUE, label):
                raise ValueError(f"{profile} = {label!r} is not a valid label value")
        return value

    @field_validator("gres_types")
    @classmethod
    def _check_gres_types(cls, value: dict[str, str]) -> dict[str, str]:
        for profile, kind in value.items():
            if not re.match(_GRES_TYPE, kind):
                raise ValueError(f"{profile} = {kind!r} is not a GRES type (letters, digits, "
                                 "'_', '-', '.'; not only digits)")
        return value

    @field_validator("nodeset_label")
    @classmethod
    def _check_label(cls, value: str) -> str:
        if not re.match(_LABEL_KEY, value) or foreign_owner(value) is not None:
            raise ValueError(f"{value!r} is not a label key we may set")
        return value

    @field_validator("restd_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http(s):// URL, got {value!r}")
        return value
