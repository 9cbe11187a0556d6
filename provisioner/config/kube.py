"""``[kube]``: the cluster nodes join, and what a node of each profile carries
(``[kube.profiles.<profile>]``); which label keys belong to someone else."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from provisioner.config.section import Section

_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def is_nfd_key(key: str) -> bool:
    """Whether a label/annotation key belongs to node-feature-discovery (never ours to set)."""
    domain = key.partition("/")[0] if "/" in key else ""
    return domain in ("feature.node.kubernetes.io", "nfd.node.kubernetes.io") or domain.endswith(
        ".feature.node.kubernetes.io")


def foreign_owner(key: str) -> str | None:
    """Who owns a label key we must never write: node-feature-discovery's, and the NVIDIA DRA
    driver's ``resource.nvidia.com/*`` (``resource.nvidia.com/computeDomain`` marks the nodes
    of a ComputeDomain; writing it would join or leave one behind the driver's back)."""
    if is_nfd_key(key):
        return "node-feature-discovery"
    if "/" in key and key.partition("/")[0] == "resource.nvidia.com":
        return "the NVIDIA DRA driver (ComputeDomains)"
    return None


def _check_not_nfd(keys: dict[str, str]) -> None:
    for key in keys:
        if is_nfd_key(key):
            raise ValueError(f"{key!r}: NFD labels are set by node-feature-discovery, not us")
        if (owner := foreign_owner(key)) is not None:
            raise ValueError(f"{key!r}: set by {owner}, not us")


class KubeProfile(Section):
    """What a Kubernetes node of one profile carries, beyond what the daemon sets itself."""

    labels: dict[str, str] = Field(
        default_factory=dict, description="Node labels; never feature.node.kubernetes.io/*")
    annotations: dict[str, str] = Field(default_factory=dict, description="Node annotations")
    taints: list[str] = Field(
        default_factory=list, description="Taints as KEY[=VALUE]:EFFECT (NoSchedule, "
        "PreferNoSchedule, NoExecute)")
    host_driver: bool = Field(
        False, description="The image ships the NVIDIA driver: preset "
        "nvidia.com/gpu.deploy.driver=false so the GPU Operator skips its driver")
    gpu: bool = Field(True, description="Wait for the GPU stack (allocatable nvidia.com/gpu, "
                      "label nvidia.com/gpu.count) once validated")
    nvlink_multinode: bool = Field(
        False, description="Multi-node NVLink (NVL72): also wait for nvidia.com/gpu.clique")

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, value: dict[str, str]) -> dict[str, str]:
        _check_not_nfd(value)
        return value

    @field_validator("taints")
    @classmethod
    def _check_taints(cls, value: list[str]) -> list[str]:
        for taint in value:
            key, sep, effect = taint.rpartition(":")
            if not sep or not key or effect not in _TAINT_EFFECTS:
                raise ValueError(f"taint {taint!r}: expected KEY[=VALUE]:EFFECT with EFFECT "
                                 f"one of {', '.join(_TAINT_EFFECTS)}")
        return value


class KubeSettings(Section):
    kubeconfig: Path | None = Field(
        None, description="Admin kubeconfig of the cluster nodes join; unset: no Kubernetes")
    context: str | None = Field(None, description="Context in the kubeconfig; default current")
    qps: float = Field(20.0, gt=0, description="Client-side request rate limit (requests/s)")
    burst: int = Field(40, ge=1, description="Requests allowed at once above the rate")
    max_concurrency: int = Field(8, ge=1, description="Threads of the \"kube\" pool "
                                 "(requests in flight)")
    request_timeout_s: float = Field(30.0, gt=0, description="Per-request timeout")
    call_deadline_s: float = Field(
        120.0, gt=0, description="Watchdog: a client call still running after this fails "
        "the step (retryable); its \"kube\" thread is abandoned until it returns")
    retries: int = Field(5, ge=0, description="Retries of a 429, 5xx or connection error")
    retry_backoff_s: float = Field(0.5, ge=0, description="First retry delay (doubles, max 30 s)")
    token_ttl_s: int = Field(1800, ge=60, description="Lifetime of a node's bootstrap token")
    join_timeout_s: float = Field(
        900.0, gt=0, description="Wait for the Node object after kubeadm join")
    ready_timeout_s: float = Field(600.0, gt=0, description="Wait for the Ready condition")
    gpu_ready_timeout_s: float = Field(
        1800.0, gt=0, description="Wait for the GPU stack once operands are released")
    poll_interval_s: float = Field(2.0, gt=0, description="Period of the readiness polls")
    drain_timeout_s: float = Field(
        900.0, gt=0, description="Drain deadline; a PDB still blocking then fails the step")
    eviction_backoff_s: float = Field(
        5.0, gt=0, description="First delay after a PDB refused an eviction (doubles, max 60 s)")
    not_ready_grace_s: float = Field(
        300.0, ge=0, description="NotReady for longer than this puts the node in maintenance")
    sync_interval_s: float = Field(
        30.0, ge=0, description="Period of the Kubernetes to daemon sync (the length of each "
        "watch of the Nodes, after one list); 0 disables it")
    profiles: dict[str, KubeProfile] = Field(
        default_factory=dict, description="Labels, annotations, taints per profile name")
