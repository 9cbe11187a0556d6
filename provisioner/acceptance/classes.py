"""Fabric classes and their floors: what one 8-GPU HGX node, one NVL72 domain or one
InfiniBand/RoCE rail must reach in acceptance. Judged by class, not by GPU count.

A floor passes at ``value x (1 - tolerance)``. Every figure names its source; where none was
published the comment says so and how the figure was derived (override it per profile).

Sources (read through the code index; commits are the stored versions):

* AZ-A100: Azure/azurehpc-health-checks ``conf/nd96asr_v4.conf`` (8x A100, HDR 200):
  ``check_nccl_allreduce 228.0 10 ... 8G``, ``check_cuda_bw 24``, ``check_ib_bw_gdr 185.0``,
  ``check_nccl_allreduce_ib_loopback 18.0 1 ... 8G`` (commit 120095246e74).
* AZ-H100: same repo, ``conf/nd96isr_h100_v5.conf`` (8x H100, NDR 400):
  ``check_nccl_allreduce 460.0 1 ... 16G``, ``check_ib_bw_gdr 375`` (commit 06114325109).
* AZ-H200: ``conf/nd96isr_h200_v5.conf`` (8x H200): ``check_gpu_bw 48 335``,
  ``check_nccl_allreduce 431.0 1 16G``, ``check_ib_bw_gdr 360`` (commit 13fa400b10f5).
  ``check_gpu_bw H2D/D2H P2P`` runs ``nvbandwidth -t host_to_device_memcpy_ce
  device_to_host_memcpy_ce device_to_device_memcpy_read_ce`` and holds every cell of the
  matrices to the floor (``customTests/azure_gpu_bandwidth.nhc``, commit 0295e2f1c29c).
* AZ-GB200: ``conf/nd128isr_ndr_gb200_v6.conf`` (one GB200 tray, 4 GPUs):
  ``check_gpu_bw 48 335``, ``check_nccl_allreduce 432.0 1 16G``, ``check_ib_bw_gdr 360``
  (commit 215c6445753b).
* NCCL-TESTS-212: NVIDIA/nccl-tests issue 212, S. Jeaugey (NVIDIA): 8x H100 with NVLink SHARP
  "should reach a peak busBw of ~480GB/s" at large sizes.
* NCCL-TESTS-290: NVIDIA/nccl-tests issue 290, D. Addison (NVIDIA): single-node H100 476 GB/s
  "in the expected range"; "For NDR @ 400Gbps you should see 46-48GB/s per NIC".
* ISSUE-26: the issue's own figures (GB200 NVL72 runs at 835-847 GB/s over 72 GPUs; NVIDIA's
  GB200 baseline about 770 GB/s with a 10 % tolerance). Not re-found in the index; the closest
  public measurement found is 811 GB/s all-reduce over two GB200 trays (8 GPUs) through
  multi-node NVLink (lixueduan.com/posts/ai/13-gb200-mnnvl-nccl-test).
* VERDA-GB300: verda.com/blog/gb300-nvl72-architecture: every Blackwell (B200, B300, GB200,
  GB300) GPU has fifth-generation NVLink at 1.8 TB/s, 900 GB/s each way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Floor:
    value: float
    unit: str
    tolerance: float
    source: str

    @property
    def effective(self) -> float:
        return self.value * (1 - self.tolerance)

    def text(self) -> str:
        tol = f"x(1-{self.tolerance:g})" if self.tolerance else ""
        return f"{self.value:g}{self.unit}{tol}"


@dataclass(frozen=True, slots=True)
class FabricClass:
    """``nccl_busbw``: all_reduce_perf bus bandwidth at 8-16 GB messages. ``nvbw_host``: every
    cell of nvbandwidth's host_to_device/device_to_host_memcpy_ce; ``nvbw_p2p``: every pair
    of device_to_device_memcpy_read_ce. ``ib_bw``: ib_write_bw average at its largest
    message, Gb/s. ``algorithm``: the NCCL algorithm all-reduce must use where the output
    names one. ``gpus``: the ranks an all-reduce over the whole class spans. ``mndiag``:
    DCGM's multi-node diagnostic (``dcgmi mndiag``, DCGM 4.3+) supports the class's
    systems (GB200 NVL, SKU 0x2941; GB300 NVL, SKU 0x31c2: NVIDIA's DCGM documentation)."""

    name: str
    description: str
    nccl_busbw: Floor | None = None
    nvbw_host: Floor | None = None
    nvbw_p2p: Floor | None = None
    ib_bw: Floor | None = None
    algorithm: str | None = None
    gpus: int | None = None
    mndiag: bool = False

    def with_tolerance(self, tolerance: float) -> FabricClass:
        """The same floors, each at ``tolerance`` (a profile's or the operator's override)."""
        def tol(floor: Floor | None) -> Floor | None:
            return None if floor is None else replace(floor, tolerance=tolerance)
        return replace(self, nccl_busbw=tol(self.nccl_busbw), nvbw_host=tol(self.nvbw_host),
                       nvbw_p2p=tol(self.nvbw_p2p), ib_bw=tol(self.ib_bw))


# nvbandwidth floors shared by the NVLink 4 and 5 classes: AZ-H200 and AZ-GB200 both gate at
# 48 GB/s host<->device per GPU and 335 GB/s per GPU pair.
_HOST_48 = Floor(48.0, "GB/s", 0.0, "AZ-H200/AZ-GB200 check_gpu_bw 48")
_P2P_335 = Floor(335.0, "GB/s", 0.0, "AZ-H200/AZ-GB200 check_gpu_bw 335")
# NVLink 5 all-reduce: NVIDIA's GB200 baseline, 10 % tolerance (ISSUE-26). HGX B200/B300 have
# the same NVLink 5 per GPU (VERDA-GB300); no published HGX B200/B300 floor was found, so they
# take the same figure: override per profile once a site has measured its own.
_NVLINK5 = Floor(770.0, "GB/s", 0.10, "ISSUE-26 NVIDIA GB200 baseline 770, 10%")

CLASSES: dict[str, FabricClass] = {c.name: c for c in (
    FabricClass("hgx-a100", "one 8x A100 HGX node (NVLink 3)",
                nccl_busbw=Floor(228.0, "GB/s", 0.0, "AZ-A100 check_nccl_allreduce 228 @8G"),
                nvbw_host=Floor(24.0, "GB/s", 0.0, "AZ-A100 check_cuda_bw 24"),
                gpus=8),
    FabricClass("hgx-h100", "one 8x H100 HGX node (NVLink 4, NVLink SHARP)",
                # AZ-H100 460 @16G; NCCL-TESTS-212 ~480 peak; NCCL-TESTS-290 476 expected
                nccl_busbw=Floor(460.0, "GB/s", 0.0, "AZ-H100 check_nccl_allreduce 460 @16G"),
                nvbw_host=_HOST_48, nvbw_p2p=_P2P_335, gpus=8),
    FabricClass("hgx-h200", "one 8x H200 HGX node (NVLink 4, NVLink SHARP)",
                nccl_busbw=Floor(431.0, "GB/s", 0.0, "AZ-H200 check_nccl_allreduce 431 @16G"),
                nvbw_host=_HOST_48, nvbw_p2p=_P2P_335, gpus=8),
    FabricClass("hgx-b200", "one 8x B200 HGX node (NVLink 5)",
                nccl_busbw=_NVLINK5, nvbw_host=_HOST_48, nvbw_p2p=_P2P_335, gpus=8),
    FabricClass("hgx-b300", "one 8x B300 HGX node (NVLink 5)",
                nccl_busbw=_NVLINK5, nvbw_host=_HOST_48, nvbw_p2p=_P2P_335, gpus=8),
    FabricClass("gb200-nvl72", "one GB200 NVL72 NVLink domain (72 GPUs, 18 trays)",
                nccl_busbw=_NVLINK5, nvbw_host=_HOST_48, nvbw_p2p=_P2P_335,
                algorithm="NVLS", gpus=72, mndiag=True),
    FabricClass("gb300-nvl72", "one GB300 NVL72 NVLink domain (72 GPUs, 18 trays)",
                nccl_busbw=_NVLINK5, nvbw_host=_HOST_48, nvbw_p2p=_P2P_335,
                algorithm="NVLS", gpus=72, mndiag=True),
    # Rails: judged on a run over one rail (one HCA and one GPU per node, NCCL_IB_HCA set).
    FabricClass("rail-200g", "one HDR 200 Gb/s InfiniBand/RoCE rail",
                nccl_busbw=Floor(18.0, "GB/s", 0.0,
                                 "AZ-A100 check_nccl_allreduce_ib_loopback 18 @8G"),
                ib_bw=Floor(185.0, "Gb/s", 0.0, "AZ-A100 check_ib_bw_gdr 185")),
    FabricClass("rail-400g", "one NDR 400 Gb/s InfiniBand/RoCE rail",
                nccl_busbw=Floor(46.0, "GB/s", 0.0, "NCCL-TESTS-290 46-48 GB/s per NDR NIC"),
                # AZ-H100 gates at 375, AZ-H200/AZ-GB200 at 360 = 375 x (1 - 0.04)
                ib_bw=Floor(375.0, "Gb/s", 0.04, "AZ-H100 check_ib_bw_gdr 375, AZ-H200 360")),
    # No published XDR floor was found: rail-400g's figures scaled by the link rate (x2).
    FabricClass("rail-800g", "one XDR 800 Gb/s InfiniBand rail (scaled from rail-400g)",
                nccl_busbw=Floor(92.0, "GB/s", 0.0, "rail-400g x2 (no published XDR floor)"),
                ib_bw=Floor(750.0, "Gb/s", 0.04, "rail-400g x2 (no published XDR floor)")),
)}


def fabric_class(name: str) -> FabricClass | None:
    return CLASSES.get(name)
