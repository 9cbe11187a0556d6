"""Settings: a TOML file, then ``PROVISIONER_*`` environment variables; frozen and validated.

Only ``daemon.py`` and ``cli.py`` load settings; each component gets its own section.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from provisioner.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/provisioner/provisioner.toml")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too); raise ValueError naming what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.removeprefix("[").removesuffix("]")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 0-65535, got {port_text!r}")
    return host, int(port_text)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ApiSettings(_Section):
    listen: str = Field("127.0.0.1:8700", description="HOST:PORT of the REST API, web UI, metrics")
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 beyond)"
    )
    page_size_max: int = Field(1000, ge=1, description="Largest page a list call may ask for")
    session_ttl_s: float = Field(
        8 * 3600.0, gt=0, description="Web console: a session's lifetime from sign-in")
    events_queue_max: int = Field(
        256, ge=1, description="Events a slow /api/v1/events client may lag before it is dropped")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_host_port(value)
        return value

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_host_port(self.listen)


class StoreSettings(_Section):
    auto_migrate: bool = Field(
        True, description="Apply pending migrations at start (a newer schema is always refused)"
    )
    pool_size: int = Field(4, ge=1, le=64, description="Store threads (SQLite uses one writer)")


class LifecycleSettings(_Section):
    auto_inspect: bool = Field(True, description="Inspect discovered and enrolled nodes at once")
    auto_deploy: bool = Field(
        True, description="Deploy inspected nodes that have a profile, without an operator"
    )
    max_inspecting: int = Field(50, ge=1, description="Nodes inspecting at once; more queue")
    max_deploying: int = Field(20, ge=1, description="Nodes deploying at once; more queue")
    max_in_flight: int = Field(200, ge=1, description="Steps running at once, all kinds")
    step_timeout_s: float = Field(3600.0, gt=0, description="A step running longer fails")


class SimulationSettings(_Section):
    nodes: int = Field(0, ge=0, le=100_000, description="Simulated nodes enrolled at start")
    racks: int = Field(1, ge=1, description="Racks the simulated nodes are spread over")
    profile: str = Field("gpu-worker", description="Profile given to simulated nodes")
    step_delay_s: float = Field(
        0.5, ge=0, description="Simulated duration of each fake driver operation"
    )
    fail_rate: float = Field(0.0, ge=0, le=1, description="Share of fake operations that fail")


def _check_optional_listen(value: str | None) -> str | None:
    if value is not None:
        parse_host_port(value)
    return value


class DhcpSettings(_Section):
    mode: Literal["authoritative", "proxy", "off"] = Field(
        "off", description="authoritative: our subnet and leases; proxy: PXE-only beside "
        "the site's DHCP; off: site DHCP points at us")
    interface: str | None = Field(None, description="Interface to serve on (SO_BINDTODEVICE)")
    server_address: str | None = Field(None, description="Our address on the boot network")
    pool: str | None = Field(None, description="FIRST-LAST addresses for discovery leases")
    netmask: str = Field("255.255.255.0", description="Subnet mask handed out")
    router: str | None = Field(None, description="Default gateway handed out (option 3)")
    dns_servers: list[str] = Field(default_factory=list, description="Option 6")
    domain_name: str | None = Field(None, description="Option 15")
    lease_time_s: int = Field(3600, ge=60, description="Lease time handed out")
    port: int = Field(67, ge=1, le=65535, description="Server port (tests use a high one)")
    proxy_port: int = Field(4011, ge=1, le=65535, description="PXE proxy port")
    discovery_rate_per_s: float = Field(
        5.0, gt=0, description="Unknown MACs turned into discovered nodes per second")
    discovery_burst: int = Field(50, ge=1, description="Burst of new MACs accepted at once")
    router_advertisements: bool = Field(
        True, description="Answer IPv6 router solicitations on `interface` (ends iPXE's "
        "13 s IPv6 wait; announces no router)")
    decline_hold_s: int = Field(
        600, ge=0, description="An address a client declined (in use) is not offered again "
        "for this long")


class TftpSettings(_Section):
    listen: str | None = Field(None, description="HOST:PORT for TFTP (e.g. 0.0.0.0:69); "
                               "unset: no TFTP server")
    timeout_s: float = Field(2.0, gt=0, description="Retransmit timeout per block")
    retries: int = Field(5, ge=1, description="Retransmits before a transfer is dropped")
    max_transfers: int = Field(1000, ge=1, description="Concurrent transfers")
    workers: int | None = Field(None, ge=1, description="Processes that serve transfers; "
                                "default: one per CPU, at most 8; 1: in the daemon's "
                                "process")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        return _check_optional_listen(value)


class HttpSettings(_Section):
    listen: str | None = Field(None, description="HOST:PORT of the boot HTTP server (iPXE "
                               "scripts, kernels, images, agent); unset: no boot HTTP")
    public_url: str | None = Field(None, description="URL nodes use to reach it; default "
                                   "http://<dhcp.server_address>:<port>")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        return _check_optional_listen(value)


class BootSettings(_Section):
    assets_dir: Path | None = Field(None, description="iPXE binaries for TFTP; default "
                                    "Debian's /usr/lib/ipxe")
    artefacts_dir: Path | None = Field(None, description="Kernels, initrds, images served "
                                       "over HTTP; default <state_dir>/artefacts")
    arm64_bootfile: str = Field("grubaa64.efi", description="Boot file for UEFI arm64 clients")
    inspection_kernel: str = Field("inspect/vmlinuz", description="Under artefacts_dir")
    inspection_initrd: str = Field("inspect/initrd.gz", description="Under artefacts_dir")
    kernel_args: str = Field("console=ttyS0", description="Extra kernel command line")
    inspection_kernel_arm64: str = Field("inspect/arm64/vmlinuz",
                                         description="arm64 (Grace) ramdisk kernel, under "
                                         "artefacts_dir")
    inspection_initrd_arm64: str = Field("inspect/arm64/initrd.gz",
                                         description="arm64 (Grace) ramdisk, under "
                                         "artefacts_dir")
    kernel_args_arm64: str = Field("console=ttyAMA0", description="Extra kernel command "
                                   "line of arm64 nodes (Grace and qemu virt: PL011 UART)")
    ramdisk_build: Literal["auto", "off"] = Field(
        "auto", description="auto: serve builds a missing or stale inspection ramdisk in the "
        "background at start (when the Debian packages are present); off: never")
    ramdisk_arches: list[Literal["x86_64", "arm64"]] = Field(
        ["x86_64", "arm64"], description="Architectures whose ramdisk serve builds")
    cache_dir: Path | None = Field(None, description="Downloaded .debs and unpacked sysroots "
                                   "of foreign-architecture ramdisks; default <state_dir>/cache")
    agent_token_ttl_s: int = Field(3600, ge=60, description="Lifetime of a node's agent token")


class BmcProfile(_Section):
    """Per node profile (``bmc.profiles.<name>``); a node without one gets the defaults."""

    soft_off_timeout_s: float = Field(
        300.0, gt=0, description="How long a soft power-off (ACPI, GracefulShutdown) may take")
    hard_off_fallback: bool = Field(
        False, description="After the soft-off timeout (or on a BMC with no soft off at "
        "all), power off hard (ForceOff) instead of failing")
    rotate_credentials: bool = Field(
        False, description="Inspection ends by rotating the node's BMC password (a per-node "
        "generated one, or bmc.rotation_password), verified by a fresh login")


class BmcSettings(_Section):
    timeout_s: float = Field(20.0, gt=0, description="Per-call BMC timeout")
    max_concurrency: int = Field(64, ge=1, description="BMC calls in flight, all BMCs")
    per_bmc_concurrency: int = Field(1, ge=1, description="Calls in flight per BMC")
    retries: int = Field(3, ge=0, description="Retries of a retryable BMC error")
    retry_backoff_s: float = Field(1.0, ge=0, description="First retry delay (doubles)")
    confirm_timeout_s: float = Field(60.0, gt=0, description="Wait for power read-back")
    breaker_threshold: int = Field(5, ge=1, description="Failures that open a BMC's breaker")
    breaker_reset_s: float = Field(30.0, gt=0, description="First probe of an open breaker")
    breaker_max_reset_s: float = Field(
        600.0, gt=0, description="Longest wait between probes of an open breaker (doubles)")
    confirm_poll_s: float = Field(1.0, gt=0, description="Power read-back polling interval")
    per_rack_concurrency: int | None = Field(
        None, ge=1, description="BMCs of one rack the lifecycle steps drive at once; unset: "
        "no limit (GB200/GB300 racks: see the operator guide)")
    profile_rack_concurrency: dict[str, int] = Field(
        default_factory=dict, description="Per profile, a lower per-rack limit for its nodes "
        "(`[bmc.profile_rack_concurrency]`, profile = N)")
    power_on_per_rack_per_s: float = Field(
        2.0, gt=0, description="Power-ons per rack per second (inrush stagger)")
    power_sync_interval_s: float = Field(
        300.0, ge=0, description="Power-state sync period; 0 disables it")
    power_sync_concurrency: int = Field(16, ge=1, description="BMCs polled at once in a sync")
    discovered_driver: Literal["ipmi", "redfish", "none"] = Field(
        "ipmi", description="Driver for a BMC learned from an inspection report (zero-touch "
        "linking, with the site default credentials); none: never link")
    default_username: str | None = Field(None, description="Site default BMC user")
    default_password: SecretStr | None = Field(None, description="Site default BMC password")
    redfish_verify_tls: bool = Field(
        True, description="Verify Redfish BMC certificates; false accepts any (lab only)")
    redfish_ca_file: Path | None = Field(
        None, description="CA bundle for Redfish BMC certificates; default the system's")
    profiles: dict[str, BmcProfile] = Field(
        default_factory=dict, description="Soft-off and credential rotation per node "
        "profile name")
    rotation_password: SecretStr | None = Field(
        None, description="Site BMC password that rotation sets; unset: a generated "
        "password per node (16 letters and digits)")
    ipmi_workers: int = Field(4, ge=1, description="IPMI worker processes (pyghmi); each "
                              "owns a share of the BMCs and their sessions")
    ipmi_worker_threads: int = Field(16, ge=1, description="IPMI calls in flight per worker")
    ipmi_heartbeat_timeout_s: float = Field(
        10.0, gt=0, description="An IPMI worker silent this long is killed and replaced "
        "(it beats every 0.5 s; a starved machine delays beats by seconds)")
    ipmi_hang_grace_s: float = Field(
        15.0, gt=0, description="An IPMI worker that leaves a call unanswered this long past "
        "its deadline (timeout_s) is killed and replaced")

    def profile(self, name: str | None) -> BmcProfile:
        return self.profiles.get(name or "", BmcProfile())


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


class KubeProfile(_Section):
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


class KubeSettings(_Section):
    kubeconfig: Path | None = Field(
        None, description="Admin kubeconfig of the cluster nodes join; unset: no Kubernetes")
    context: str | None = Field(None, description="Context in the kubeconfig; default current")
    qps: float = Field(20.0, gt=0, description="Client-side request rate limit (requests/s)")
    burst: int = Field(40, ge=1, description="Requests allowed at once above the rate")
    max_concurrency: int = Field(8, ge=1, description="Threads of the \"kube\" pool "
                                 "(requests in flight)")
    request_timeout_s: float = Field(30.0, gt=0, description="Per-request timeout")
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
        30.0, ge=0, description="Period of the Kubernetes to daemon sync; 0 disables it")
    profiles: dict[str, KubeProfile] = Field(
        default_factory=dict, description="Labels, annotations, taints per profile name")


_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
_LABEL_KEY = (r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
              r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class SlurmSettings(_Section):
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


class InstallSettings(_Section):
    """Ansible configuration of deployed nodes (``configuring``) and ``kubeadm join``."""

    playbooks_dir: Path | None = Field(
        None, description="Playbooks and roles (site.yml, join.yml); default the ones shipped "
        "with provisioner")
    ssh_user: str = Field("root", description="SSH user Ansible logs in as on a node")
    ssh_private_key_file: Path | None = Field(
        None, description="SSH private key for the nodes (referenced, never copied); unset: "
        "ssh's own defaults and agent")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port of the nodes")
    ssh_common_args: str = Field(
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10",
        description="Extra ssh options (ansible_ssh_common_args); the default trusts a freshly "
        "imaged node's new host key")
    address_fallback: Literal["hostname", "none"] = Field(
        "hostname", description="Address of a node without facts.address: its hostname "
        "(resolved by DNS), or none (the step fails)")
    max_concurrency: int = Field(
        4, ge=1, description="Threads of the \"install\" pool: playbook runs at once; more wait")
    run_timeout_s: float = Field(3600.0, gt=0, description="A playbook run longer than "
                                 "this is killed and fails the step (retryable)")
    forks: int = Field(5, ge=1, description="Ansible forks per run")
    keep_failed_runs: int = Field(
        3, ge=0, description="Private data dirs of failed runs kept per node for debugging "
        "(<state_dir>/ansible/<node>/); successful ones are removed")
    kubernetes_version: str = Field(
        "1.34.2", pattern=r"^\d+\.\d+\.\d+$",
        description="kubelet/kubeadm version installed from pkgs.k8s.io (pinned and held)")
    install_packages: bool = Field(
        True, description="Install packages (apt, pkgs.k8s.io); false: configure only what "
        "the image ships")
    extra_vars: dict[str, JsonValue] = Field(
        default_factory=dict, description="Extra variables for every run (never secrets)")
    profile_vars: dict[str, dict[str, JsonValue]] = Field(
        default_factory=dict, description="Extra variables per profile name, e.g. "
        "{ gpu-worker = { containerd_nvidia_toolkit = true } }")


class ImageSettings(_Section):
    """The OS image a profile deploys, and the disk it goes to."""

    url: str = Field(description="http(s) URL, or a path under boot.artefacts_dir")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Of the file as served")
    format: Literal["raw", "raw.gz", "raw.zst", "qcow2"] | None = Field(
        None, description="Default: from the file name's suffix")
    root_disk: str = Field(
        "smallest", description="smallest | largest | name:<dev> | serial:<s> | wwn:<w>")
    root_disk_min_gb: float = Field(0, ge=0, description="Ignore disks smaller than this")
    root_disk_nonrotational: bool = Field(False, description="Only SSD/NVMe disks")


class DeploySettings(_Section):
    """What every image deploy adds: the cloud-init NoCloud seed and the wait for the
    deployed OS to call back."""

    ssh_authorized_keys: list[str] = Field(
        default_factory=list, description="Public keys the seed gives the image's default "
        "user (Ansible logs in with them)")
    callback_timeout_s: float = Field(
        1800.0, ge=0, description="How long the deploy step waits for the deployed OS's "
        "booted (or an installer's installed) callback; 0: do not wait. Keep it under half "
        "of boot.agent_token_ttl_s (the callback uses the node's agent token)")

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        return [check_ssh_key(key) for key in value]


class TopologySettings(_Section):
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


_SAFE_URL = re.compile(r"^https?://[A-Za-z0-9._~:/?=%+,@-]+$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$")
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [A-Za-z0-9@._+:-]{1,100})?$")
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_TIMEZONE = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+){0,2}$")


def check_installer_url(value: str, *, paths: bool = True) -> str:
    """An http(s) URL (or a path under the artefacts dir) that is safe on a kernel command
    line, in an iPXE script and in every installer format: no spaces, quotes, ``$``, ``;``,
    ``&``, ``#`` or backslashes, no ``..``."""
    safe = _SAFE_URL.fullmatch(value) or (paths and _SAFE_PATH.fullmatch(value))
    if safe and ".." not in value.split("/"):
        return value
    what = "an http(s) URL" + (" or a path under boot.artefacts_dir" if paths else "")
    raise ValueError(f"{value!r}: expected {what} of letters, digits and ._~:/?=%+,@- only")


def check_ssh_key(value: str) -> str:
    """One OpenSSH public key line (type, base64, optional comment without quotes or spaces)."""
    if not _SSH_KEY.fullmatch(value):
        raise ValueError(f"not an OpenSSH public key line (type base64 [comment]; the comment "
                         f"without spaces or quotes): {value[:40]!r}")
    return value


class InstallerSettings(_Section):
    """A profile installed by its distribution's installer instead of an image: Ubuntu
    autoinstall, Debian preseed or kickstart (RHEL/Rocky 9), rendered per node from
    ``pxe/install/``."""

    method: Literal["autoinstall", "preseed", "kickstart"] = Field(
        description="autoinstall (Ubuntu Subiquity), preseed (Debian installer) or kickstart "
        "(Anaconda, RHEL/Rocky 9)")
    kernel: str = Field(description="Installer kernel: http(s) URL, or a path under "
                        "boot.artefacts_dir")
    initrd: str = Field(description="Installer initrd: http(s) URL, or a path under "
                        "boot.artefacts_dir")
    repo_url: str = Field(description="autoinstall: the live-server ISO (url=); preseed: the "
                          "Debian mirror; kickstart: the BaseOS repository (inst.repo=)")
    kernel_arm64: str | None = Field(None, description="arm64 (Grace) installer kernel: URL "
                                     "or path; unset: arm64 nodes of the profile are refused")
    initrd_arm64: str | None = Field(None, description="arm64 installer initrd: URL or path")
    repo_url_arm64: str | None = Field(None, description="repo_url for arm64 nodes (e.g. "
                                       "the arm64 live-server ISO); default repo_url")
    kernel_args: str = Field("", description="Extra kernel command line (e.g. console=ttyS0)")
    ssh_authorized_keys: list[str] = Field(
        default_factory=list, description="Public keys installed for root, after "
        "deploy.ssh_authorized_keys (Ansible logs in with them)")
    time_server: str | None = Field(None, description="NTP server; unset: the distribution's")
    timezone: str = Field("UTC", description="Time zone of the installed system")
    root_disk: str = Field(
        "smallest", description="smallest | largest | name:<dev> | serial:<s> | wwn:<w>")
    root_disk_min_gb: float = Field(0, ge=0, description="Ignore disks smaller than this")
    root_disk_nonrotational: bool = Field(False, description="Only SSD/NVMe disks")

    @field_validator("kernel", "initrd")
    @classmethod
    def _check_artefact(cls, value: str) -> str:
        return check_installer_url(value)

    @field_validator("kernel_arm64", "initrd_arm64")
    @classmethod
    def _check_arm64_artefact(cls, value: str | None) -> str | None:
        return None if value is None else check_installer_url(value)

    @field_validator("repo_url")
    @classmethod
    def _check_repo(cls, value: str) -> str:
        return check_installer_url(value, paths=False)

    @field_validator("repo_url_arm64")
    @classmethod
    def _check_arm64_repo(cls, value: str | None) -> str | None:
        return None if value is None else check_installer_url(value, paths=False)

    @field_validator("kernel_args")
    @classmethod
    def _check_args(cls, value: str) -> str:
        if any(ch in value for ch in "\n\r\"'`$;&|#\\") or not value.isprintable():
            raise ValueError("kernel_args: no quotes, $, ;, &, |, # or line breaks")
        return value

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        return [check_ssh_key(key) for key in value]

    @field_validator("time_server")
    @classmethod
    def _check_time_server(cls, value: str | None) -> str | None:
        if value is not None and not _HOST.fullmatch(value):
            raise ValueError(f"{value!r}: expected a host name or IPv4 address")
        return value

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        if not _TIMEZONE.fullmatch(value):
            raise ValueError(f"{value!r}: expected an Olson name such as Europe/Paris or UTC")
        return value


class ValidationProfile(_Section):
    """What a node of one profile must show before it goes to Slurm (the ``validating``
    step, from the node's last facts report). Unset: not checked. The hardware part (GPU
    count and model, InfiniBand port count and rate, memory, disks) is also checked on the
    inspection ramdisk's facts before deployment (the SKU gate)."""

    gpu_count: int | None = Field(None, ge=0, description="GPUs the driver must see")
    gpu_model: str | None = Field(
        None, min_length=1, description="Every GPU's product name (or its pci.ids name) "
        "contains this as whole words (case-insensitive), e.g. \"H100\" (not \"H20\" in "
        "\"H200\")")
    ib_rate_gbps: float | None = Field(
        None, gt=0, description="Every InfiniBand port Active/LinkUp at this rate (Gb/s)")
    ib_port_count: int | None = Field(
        None, ge=0, description="InfiniBand ports (Ethernet ports of the HCAs not counted)")
    nvlink_domain: bool = Field(
        False, description="Multi-node NVLink (NVL72): every GPU's fabric Completed/Success "
        "with a non-zero ClusterUUID")
    nvlink_domain_nodes: int | None = Field(
        None, ge=1, description="Nodes per NVLink domain: the domain waits for that many "
        "passed nodes (e.g. 18 on an NVL72 rack)")
    require_dcgm: bool = Field(
        False, description="A passing `dcgmi diag -r 1` must be in the facts (a failing one "
        "always fails the node)")
    memory_min_gib: float | None = Field(
        None, gt=0, description="Least memory the kernel reports (MemTotal, below the "
        "installed size), GiB")
    disk_count: int | None = Field(
        None, ge=0, description="Disks (of at least disk_min_gb when set) the node has")
    disk_min_gb: float | None = Field(
        None, gt=0, description="Least size of a counted disk, GB (10^9 bytes)")
    imex: Literal["dra", "host"] | None = Field(
        None, description="GB200/GB300 compute trays: the IMEX package installed, no host "
        "Fabric Manager, and the host nvidia-imex service masked (\"dra\": the NVIDIA DRA "
        "driver's ComputeDomains run IMEX) or active (\"host\")")
    nvlink_accept_degraded_bandwidth: bool = Field(
        False, description="Accept a GPU whose NVLink fabric reports bandwidth Degraded (health "
        "summary Limited Capacity); unset, such a node is held like an unhealthy one")

    @field_validator("nvlink_domain_nodes")
    @classmethod
    def _check_domain_nodes(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("nvlink_domain"):
            raise ValueError("nvlink_domain_nodes needs nvlink_domain = true")
        return value


class ValidationSettings(_Section):
    """The validation gate between ``joining`` and ``registering``."""

    profiles: dict[str, ValidationProfile] = Field(
        default_factory=dict, description="Checks per profile name; a profile without an "
        "entry passes unchecked (its NVLink domain is still gated)")
    domain_poll_interval_s: float = Field(
        10.0, gt=0, description="How often a node that passed re-reads the store for the "
        "rest of its NVLink domain")
    domain_wait_timeout_s: float | None = Field(
        None, gt=0, description="Give up waiting for the NVLink domain after this long "
        "(validate_failed); unset: wait until it is complete or aborted")


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level")


class DaemonSettings(_Section):
    shutdown_timeout_s: float = Field(
        20.0, gt=0, description="Grace period for in-flight steps to checkpoint on SIGTERM"
    )


class HaSettings(_Section):
    """Several daemons on one PostgreSQL database (docs/ha.md)."""

    lease_s: float = Field(
        30.0, ge=1, le=3600,
        description="A node's lease (and the singletons' lead): renewed every third of it "
        "while a step runs; a dead daemon's nodes are taken over this long after it stopped",
    )
    instance: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="This daemon's name in history rows and /api/v1/instances; default "
        "hostname-pid-random (a new one at every start)",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PROVISIONER_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    state_dir: Path = Field(
        Path("/var/lib/provisioner"), description="Database, secret key, agent artefacts"
    )
    database_url: SecretStr | None = Field(
        None, description="SQLAlchemy URL; default SQLite in state_dir (WAL)"
    )
    api: ApiSettings = ApiSettings()
    store: StoreSettings = StoreSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    simulation: SimulationSettings = SimulationSettings()
    dhcp: DhcpSettings = DhcpSettings()
    tftp: TftpSettings = TftpSettings()
    http: HttpSettings = HttpSettings()
    boot: BootSettings = BootSettings()
    bmc: BmcSettings = BmcSettings()
    kube: KubeSettings = KubeSettings()
    slurm: SlurmSettings = SlurmSettings()
    install: InstallSettings = InstallSettings()
    topology: TopologySettings = TopologySettings()
    images: dict[str, ImageSettings] = Field(
        default_factory=dict, description="Per profile: [images.<profile>] url, sha256, "
        "format, root_disk, root_disk_min_gb, root_disk_nonrotational")
    deploy: DeploySettings = DeploySettings()
    installers: dict[str, InstallerSettings] = Field(
        default_factory=dict, description="Per profile installed by an installer instead of "
        "an image: [installers.<profile>] method, kernel, initrd, repo_url, ...")

    @field_validator("installers")
    @classmethod
    def _check_one_method(cls, value: dict[str, InstallerSettings],
                          info: ValidationInfo) -> dict[str, InstallerSettings]:
        both = sorted(set(value) & set(info.data.get("images", {})))
        if both:
            raise ValueError(f"profile {both[0]!r} has both [images.{both[0]}] and "
                             f"[installers.{both[0]}]: pick one")
        return value
    validation: ValidationSettings = ValidationSettings()
    log: LogSettings = LogSettings()
    daemon: DaemonSettings = DaemonSettings()
    ha: HaSettings = HaSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment overrides them.
        return (env_settings, init_settings)

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return f"sqlite:///{self.state_dir / 'provisioner.sqlite'}"


def load_settings(path: Path | None, *, explicit: bool = True) -> Settings:
    """Read ``path`` (if given), then the environment; raise ConfigError with a one-line reason.

    A missing file is an error when the operator named it; the default path may be absent.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            if explicit:
                raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None


def _describe(exc: ValidationError, path: Path | None) -> str:
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(root)"
    where = f" in {path}" if path is not None else ""
    env_name = "PROVISIONER_" + key.upper().replace(".", "__")
    hint = f" (or {env_name})" if env_name in os.environ else ""
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    return f"invalid config{where}: {key}{hint}: {message}"


def effective_config(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data with every secret masked."""
    data: dict[str, Any] = json.loads(settings.model_dump_json())
    if settings.bmc.default_password is not None:
        data["bmc"]["default_password"] = "***"
    if settings.database_url is not None:
        data["database_url"] = mask_url(settings.database_url.get_secret_value())
    return data


def mask_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user = creds.partition(":")[0]
    return f"{scheme}://{user}:***@{host}"
