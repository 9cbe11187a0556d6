"""``[validation]``: what a node of each profile must show before it goes to Slurm."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from provisioner.config.section import Section

AcceptanceTest = Literal["dcgm", "nvbandwidth", "nccl", "ib_write_bw", "mndiag"]
DEFAULT_TESTS: tuple[AcceptanceTest, ...] = ("dcgm", "nvbandwidth", "nccl")


class AcceptanceProfile(Section):
    """Fabric acceptance of a profile's NVLink domains (issue 26): once every node of a
    domain passed its own checks and before ``registering``, the site's tools run on the
    domain's nodes over SSH (``playbooks/acceptance.yml``) and are judged against the fabric
    class's floors (``provisioner fabric judge --list-classes``). A failed domain is held in
    ``validate_failed`` naming its slowest node; ``provisioner fabric accept DOMAIN`` reruns
    it after a repair, or accepts an active domain inside a Slurm maintenance reservation
    (kept on a failure: the domain is held, its block shrinks)."""

    fabric_class: str = Field(
        min_length=1, description="The class whose floors apply (hgx-h100, gb200-nvl72, "
        "rail-400g, ...; `provisioner fabric judge --list-classes`)")
    tests: list[AcceptanceTest] = Field(
        default_factory=lambda: list(DEFAULT_TESTS), min_length=1,
        description="What runs: `dcgmi diag -r <dcgm_level> -j` and `nvbandwidth` on every "
        "node, NCCL `all_reduce_perf` (see nccl_scope), `ib_write_bw` between neighbouring "
        "nodes on each of ib_devices, `dcgmi mndiag` over the domain (GB200/GB300 NVL72 "
        "classes only; added there unless mndiag = \"off\")")
    dcgm_level: int = Field(2, ge=1, le=4, description="`dcgmi diag -r` level")
    nccl_scope: Literal["node", "domain"] | None = Field(
        None, description="all_reduce_perf per node (HGX: `mpirun -np <gpus>` on the node) "
        "or once over every GPU of the domain (`mpirun` over the domain's nodes); unset: "
        "domain for a class of more than 8 GPUs (NVL72), else node")
    gpus_per_node: int = Field(8, ge=1, le=64, description="MPI ranks per node for NCCL")
    ib_devices: list[str] = Field(
        default_factory=list, description="HCAs (rails) `ib_write_bw` runs on, one "
        "`-d DEVICE` each, node i serving node i+1's client")
    mndiag: Literal["auto", "require", "off"] = Field(
        "auto", description="`dcgmi mndiag --hostList <every node> --run mnubergemm --json` "
        "from the domain's first node, on a class that has it (gb200-nvl72, gb300-nvl72): "
        "\"auto\" runs it where the node's DCGM has mndiag (4.3+) and records \"not "
        "available\" (not a failure) where not; \"require\" fails the domain then; "
        "\"off\" never runs it. Judged by its exit status only")
    test_deadline_s: float = Field(
        1800.0, gt=0, description="Each test is killed (with everything it started, on every "
        "node) when still running after this long, and fails")
    jobs_wait_s: float = Field(
        3600.0, gt=0, description="An active domain (`provisioner fabric accept`): how long "
        "the jobs on its nodes may run on inside the Slurm maintenance reservation before "
        "the run gives up (the reservation released, nothing tested)")
    tolerance: float | None = Field(
        None, ge=0, le=0.5, description="Tolerance for every floor (default: the class's)")
    floors: dict[Literal["nccl_busbw", "nvbw_host", "nvbw_p2p", "ib_bw"], float] = Field(
        default_factory=dict, description="Floor values that replace the class's: "
        "nccl_busbw and nvbw_* in GB/s, ib_bw in Gb/s")
    reaccept_interval_days: float = Field(
        0.0, ge=0, description="Re-accept an active domain whose last pass is older than "
        "this, inside a Slurm maintenance reservation as `provisioner fabric accept` does "
        "(the fleet's reaccept sweep; 0: never on a schedule)")


class ValidationProfile(Section):
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
    hold_domain_on_repair: bool = Field(
        False, description="A tray of this profile under repair (repairing, repair_failed, "
        "service_required) holds its whole NVLink domain out of the published topology (the "
        "domain's Slurm block gone); false: the block shrinks by the tray alone")
    acceptance: AcceptanceProfile | None = Field(
        None, description="Fabric acceptance of the node's NVLink domain (or of the node "
        "alone when it names none) before registering; unset: none")

    @field_validator("nvlink_domain_nodes")
    @classmethod
    def _check_domain_nodes(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("nvlink_domain"):
            raise ValueError("nvlink_domain_nodes needs nvlink_domain = true")
        return value


class ValidationSettings(Section):
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
    fabric_settle_timeout_s: float = Field(
        600.0, ge=0, description="A node whose only failures are its NVSwitch fabric still "
        "training (fabric state In Progress) gets its facts collected again and re-checked "
        "for up to this long before it is held (0: held at once)")
    fabric_settle_interval_s: float = Field(
        30.0, gt=0, description="Wait between two collections of a settling node's facts")
    reaccept_max_concurrent: int = Field(
        1, ge=1, le=64, description="Scheduled re-acceptance (a profile's "
        "acceptance.reaccept_interval_days): at most this many domains under a run at once, "
        "fleet-wide (runs started by operators count)")
    reaccept_retry_s: float = Field(
        21600.0, gt=0, description="A scheduled re-acceptance that was interrupted (jobs "
        "that did not end in jobs_wait_s, Slurm refused) is tried again after this long")
    reaccept_sweep_interval_s: float = Field(
        600.0, gt=0, description="How often the fleet's reaccept sweep looks for active "
        "domains due")
