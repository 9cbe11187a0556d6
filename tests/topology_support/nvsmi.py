"""Synthetic nvidia-smi reports (XML, -q text, --query-gpu CSV) in the layout of the real
captures under tests/fixtures/topology/nvidia-smi/, with the fabric fields filled in as a
GB200 NVL72 tray reports them. No public licence-clear capture with a populated
ClusterUUID/CliqueId exists (see that directory's README), so these are ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "topology"
CLUSTER_A = "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91"
ZERO = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class FakeGpu:
    uuid: str
    state: str = "Completed"
    status: str = "Success"
    cluster: str = CLUSTER_A
    clique: str = "1"
    product: str = "NVIDIA GB200"
    # the full DTD v13 <health> block (name, value) in nvidia-smi's order; () writes the
    # short Healthy/Full block of the committed fixtures
    health: tuple[tuple[str, str], ...] = ()


# <health> children (DTD v13) and their -q text labels
HEALTH_LABELS = {"summary": "Summary", "bandwidth": "Bandwidth",
                 "route_recovery_in_progress": "Route Recovery in progress",
                 "route_unhealthy": "Route Unhealthy",
                 "access_timeout_recovery": "Access Timeout Recovery",
                 "incorrect_configuration": "Incorrect Configuration",
                 "partition_assigned": "Partition Assigned"}
HEALTHY = (("summary", "Healthy"), ("bandwidth", "Full"), ("route_recovery_in_progress", "False"),
           ("route_unhealthy", "False"), ("access_timeout_recovery", "False"),
           ("incorrect_configuration", "None"), ("partition_assigned", "True"))


def sick(**changes: str) -> tuple[tuple[str, str], ...]:
    """The healthy DTD v13 block with some fields changed."""
    return tuple((name, changes.get(name, value)) for name, value in HEALTHY)


def gpus(host: int, count: int = 4, **fabric: str) -> list[FakeGpu]:
    return [FakeGpu(f"GPU-{host:08x}-0000-4000-8000-{i:012x}", **fabric) for i in range(count)]


def xml(items: list[FakeGpu], driver: str = "580.65.06") -> str:
    rows = []
    for index, gpu in enumerate(items):
        rows.append(f"""\t<gpu id="00000008:0{index + 1}:00.0">
\t\t<product_name>{gpu.product}</product_name>
\t\t<mig_mode>
\t\t\t<current_mig>Disabled</current_mig>
\t\t\t<pending_mig>Disabled</pending_mig>
\t\t</mig_mode>
\t\t<mig_devices>
\t\t\tNone
\t\t</mig_devices>
\t\t<uuid>{gpu.uuid}</uuid>
\t\t<minor_number>{index}</minor_number>
\t\t<fabric>
\t\t\t<state>{gpu.state}</state>
\t\t\t<status>{gpu.status}</status>
\t\t\t<cliqueId>{gpu.clique}</cliqueId>
\t\t\t<clusterUuid>{gpu.cluster}</clusterUuid>
\t\t\t<health>
{_xml_health(gpu)}
\t\t\t</health>
\t\t</fabric>
\t</gpu>""")
    body = "\n".join(rows)
    return f"""<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">
<nvidia_smi_log>
\t<timestamp>Sat Nov 21 06:00:00 2026</timestamp>
\t<driver_version>{driver}</driver_version>
\t<cuda_version>13.0</cuda_version>
\t<attached_gpus>{len(items)}</attached_gpus>
{body}
</nvidia_smi_log>
"""


def text(items: list[FakeGpu], driver: str = "580.65.06") -> str:
    blocks = []
    for index, gpu in enumerate(items):
        blocks.append(f"""GPU 00000008:0{index + 1}:00.0
    Product Name                          : {gpu.product}
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    GPU UUID                              : {gpu.uuid}
    Minor Number                          : {index}
    Fabric
        State                             : {gpu.state}
        Status                            : {gpu.status}
        CliqueId                          : {gpu.clique}
        ClusterUUID                       : {gpu.cluster}
        Health
{_text_health(gpu)}
    Processes                             : None
""")
    return f"""
==============NVSMI LOG==============

Timestamp                                 : Sat Nov 21 06:00:00 2026
Driver Version                            : {driver}
CUDA Version                              : 13.0

Attached GPUs                             : {len(items)}
""" + "\n".join(blocks)


def _xml_health(gpu: FakeGpu) -> str:
    pairs = gpu.health or (("summary", "Healthy"), ("bandwidth", "Full"))
    return "\n".join(f"\t\t\t\t<{name}>{value}</{name}>" for name, value in pairs)


def _text_health(gpu: FakeGpu) -> str:
    pairs = gpu.health or (("bandwidth", "Full"),)
    return "\n".join(f"            {HEALTH_LABELS[name]:<30}: {value}" for name, value in pairs)


def csv(items: list[FakeGpu], header: bool = False) -> str:
    """``--query-gpu=index,uuid,name,fabric.state,fabric.status,fabric.clusterUuid,
    fabric.cliqueId --format=csv[,noheader]``."""
    lines = (["index, uuid, name, fabric.state, fabric.status, fabric.clusterUuid, "
              "fabric.cliqueId"] if header else [])
    lines += [f"{i}, {g.uuid}, {g.product}, {g.state}, {g.status}, {g.cluster}, {g.clique}"
              for i, g in enumerate(items)]
    return "\n".join(lines) + "\n"


def write_nvl_dir(directory: Path) -> None:
    """The fleet used by docs/topology.md and the CLI tests, on the ibsim fat tree:
    gpu-node-01..08 NVLink clique 1, 09..12 clique 2 (same ClusterUUID), 13..14 fabric still
    training, 15 single-node NVLink (zero ClusterUUID), 16 no report."""
    directory.mkdir(parents=True, exist_ok=True)
    writers: dict[str, Callable[[list[FakeGpu]], str]] = {".xml": xml, ".txt": text,
                                                          ".csv": csv}
    for host in range(1, 16):
        if host <= 8:
            items = gpus(host, clique="1")
        elif host <= 12:
            items = gpus(host, clique="2")
        elif host <= 14:
            items = gpus(host, state="In Progress", status="N/A", cluster="N/A", clique="N/A")
        else:
            items = gpus(host, cluster=ZERO, clique="0", product="NVIDIA H100 80GB HBM3")
        suffix = (".xml", ".txt", ".csv")[host % 3]
        (directory / f"gpu-node-{host:02d}{suffix}").write_text(writers[suffix](items))


if __name__ == "__main__":
    write_nvl_dir(FIXTURES / "synthetic" / "nvidia-smi-nvl")
