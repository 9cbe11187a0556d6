"""The one-line hardware summary of ``node list``/``show`` (issue 30 item 8)."""

from __future__ import annotations

from provisioner.api.hardware import hardware_summary
from provisioner.cli import formatting

H100 = {"vendor": "10de", "device": "2330", "name": "NVIDIA H100 80GB HBM3"}


def test_summary_counts_gpus_hcas_cpu_memory_disks() -> None:
    facts = {
        "gpus": [H100] * 8,
        "infiniband": [{"device": f"mlx5_{i}", "rate_gbps": 400} for i in range(2)]
        + [{"device": "mlx5_9"}],
        "cpu": {"model": "Intel Xeon Platinum 8480+", "sockets": 2, "cores": 112},
        "memory_mib": 2 * 1024 * 1024,
        "disks": [{"name": "nvme0n1", "size_bytes": 3_840_000_000_000}] * 2,
    }
    assert hardware_summary(facts) == (
        "8× NVIDIA H100 80GB HBM3, 2× 400G IB, 1× IB, 2× 56-core Intel Xeon Platinum 8480+, "
        "2048 GiB RAM, 2× 3.84 TB disk")


def test_summary_of_unnamed_gpus_and_no_facts() -> None:
    assert hardware_summary({}) == ""
    assert hardware_summary({"gpus": [{"vendor": "10de", "device": "2330"}] * 2,
                             "cpu": {"cores": 4}}) == "2× GPU 10de:2330, 4-core"


def test_facts_summary_names_what_it_counts() -> None:
    lines = formatting.facts_summary({"gpus": [H100] * 8, "nics": [{"mac": "x"}]})
    assert lines == ["gpus: 8× NVIDIA H100 80GB HBM3", "nics: 1 item"]
