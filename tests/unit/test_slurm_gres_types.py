"""Slurm GPU types in the registration proof, on real ``scontrol show node`` outputs of Slurm
24.05–25.05 (tests/fixtures/slurm/README.md): Slurm's AutoDetect names (``nvidia_h100_80gb_hbm3``),
the daemon's short type (``h100``), a site's own type configured per profile; a different
model or count still disagrees."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from provisioner.agent.gpu_ids import MODELS
from provisioner.config import SlurmSettings
from provisioner.slurm.agree import (
    Inventory,
    gres_conf_line,
    gres_gpus,
    inventory,
    nvml_type,
    slurm_disagreement,
    slurmd_conf,
    type_accepted,
)
from provisioner.slurm.model import SlurmNode
from provisioner.slurm.parse import nodes_from_scontrol

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def scontrol(name: str) -> list[SlurmNode]:
    """A published multi-line ``scontrol show node`` folded into the ``-o`` lines the daemon
    reads (the same ``Key=Value`` words, one node a line)."""
    blocks: list[list[str]] = []
    for line in (FIXTURES / name).read_text().splitlines():
        if line.startswith("NodeName="):
            blocks.append([])
        if blocks and line.strip():
            blocks[-1].append(line.strip())
    return nodes_from_scontrol("\n".join(" ".join(block) for block in blocks))


def facts(name: str, count: int, device: str = "") -> dict[str, object]:
    return {"last_report": {"gpus": [{"vendor": "0x10de", "device": device, "name": name}]
                            * count}}


@pytest.mark.parametrize(("fixture", "gpu", "count"), [
    ("scontrol-24.11.5-show-node-h100-nvml.txt", "NVIDIA H100 80GB HBM3", 4),
    ("scontrol-24.11.5-show-nodes-soperator-h100x8.txt", "NVIDIA H100 80GB HBM3", 8),
    ("scontrol-24.05.2-show-node-soperator-rtx2080ti.txt", "NVIDIA GeForce RTX 2080 Ti", 1),
])
def test_real_nodes_with_nvml_types_agree(fixture: str, gpu: str, count: int) -> None:
    nodes = scontrol(fixture)
    assert nodes and all(gres_gpus(n.gres) == {nvml_type(gpu): count} for n in nodes)
    have = inventory(facts(gpu, count))
    for node in nodes:
        assert not slurm_disagreement(have, node.gres)
        more = inventory(facts(gpu, count + 1))
        assert slurm_disagreement(more, node.gres) == [
            f"Slurm registered Gres={node.gres}, node has {count + 1}× {gpu}"]


def test_a_different_model_with_the_same_count_disagrees() -> None:
    (node,) = scontrol("scontrol-24.11.5-show-node-h100-nvml.txt")
    for other in ("NVIDIA H200", "NVIDIA H100 NVL", "NVIDIA H20", "NVIDIA A100-SXM4-80GB"):
        have = inventory(facts(other, 4))
        assert slurm_disagreement(have, node.gres) == [
            f"Slurm registered Gres=gpu:nvidia_h100_80gb_hbm3:4(S:0-1) (type "
            f"nvidia_h100_80gb_hbm3), node has 4× {other} (type {have.gpu_type} or "
            f"{nvml_type(other)})"]


def test_gres_strings_as_slurm_prints_them() -> None:
    rows = [line.split("\t") for line in (FIXTURES / "gres-strings.tsv").read_text()
            .splitlines() if not line.startswith("#")]
    parsed = {gres: gres_gpus(gres) for _, _, gres in rows}
    assert parsed == {
        "gpu:nvidia_h100_80gb_hbm3:4(S:0-1)": {"nvidia_h100_80gb_hbm3": 4},
        "gpu:nvidia_h100_80gb_hbm3:4(IDX:0-3)": {"nvidia_h100_80gb_hbm3": 4},
        "gpu:nvidia_h100_80gb_hbm3:0(IDX:N/A)": {"nvidia_h100_80gb_hbm3": 0},
        "gpu:0": {"": 0},
        "gpu:8(S:0-1)": {"": 8},
        "gpu:(null):3(IDX:0-7)": {"": 3},
        "gpu:A30:4(S:0-1),gpu:Q6K:40(S:0-1)": {"A30": 4, "Q6K": 40},
        "gpu:A30:4(IDX:0-3),gpu:Q6K:4(IDX:0-3)": {"A30": 4, "Q6K": 4},
        "gpu:l4:1(S:0)": {"l4": 1},
    }
    # the Slinky node of issue #57: the site's short type is the daemon's own
    assert not slurm_disagreement(inventory(facts("NVIDIA L4", 1)), "gpu:l4:1(S:0)")
    assert slurm_disagreement(inventory(facts("NVIDIA L4", 1)), "gpu:0") == [
        "Slurm registered Gres=gpu:0, node has 1× NVIDIA L4"]


def test_nvml_type_follows_slurms_rule() -> None:
    """gpu_common_underscorify_tolower: lower case, spaces to ``_``, ``-`` kept."""
    assert [nvml_type(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
                                   "NVIDIA B200", "NVIDIA GB200", "NVIDIA H200",
                                   "NVIDIA B300 SXM6 AC")] == [
        "nvidia_h100_80gb_hbm3", "nvidia_a100-sxm4-80gb", "nvidia_b200", "nvidia_gb200",
        "nvidia_h200", "nvidia_b300_sxm6_ac"]


@pytest.mark.parametrize(("kind", "gpu", "ok"), [
    ("nvidia_b200", "NVIDIA B200", True), ("nvidia_gb200", "NVIDIA GB200", True),
    ("nvidia_h200", "NVIDIA H200", True), ("NVIDIA_H200", "NVIDIA H200", True),
    ("b200", "NVIDIA B200", True), ("gb200", "NVIDIA GB200", True),
    ("h100", "NVIDIA H100 80GB HBM3", True), ("H100", "NVIDIA H100 80GB HBM3", True),
    ("h100_80gb", "NVIDIA H100 80GB HBM3", True), ("nvidia_h100", "NVIDIA H100 80GB HBM3", True),
    ("a100-sxm4", "NVIDIA A100-SXM4-80GB", True), ("nvidia_a100-sxm4-80gb",
                                                   "NVIDIA A100-SXM4-80GB", True),
    ("b200", "NVIDIA GB200", False), ("nvidia_b200", "NVIDIA GB200", False),
    ("h20", "NVIDIA H200", False), ("nvidia_h200", "NVIDIA H100 80GB HBM3", False),
    ("nvidia_h100_nvl", "NVIDIA H100 80GB HBM3", False), ("80gb", "NVIDIA H100 80GB HBM3", False),
    ("nvidia", "NVIDIA H100 80GB HBM3", False), ("a100_sxm4", "NVIDIA A100-SXM4-80GB", False),
    ("tesla", "Tesla T4", False),
])
def test_which_types_name_the_gpus(kind: str, gpu: str, ok: bool) -> None:
    assert type_accepted(kind, Inventory(8, gpu)) is ok


def test_every_table_gpu_is_known_by_its_slurm_name_from_the_inspection_alone() -> None:
    """Before the driver runs, the ramdisk names GPUs from the PCI table; its names are
    NVML's, so the type Slurm's AutoDetect will register is known from the device ID."""
    for device, (name, _) in MODELS.items():
        have = inventory({"gpus": [{"vendor": "0x10de", "device": f"0x{device:04x}",
                                    "name": f"NVIDIA 0x{device:04x}"}] * 2})
        assert have.model == name
        assert not slurm_disagreement(have, f"gpu:{nvml_type(name)}:2(S:0)")


def test_a_mixed_node_accepts_the_type_of_each_gpu() -> None:
    have = inventory({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 4
                      + [{"name": "NVIDIA L40S"}] * 2})
    assert not slurm_disagreement(have, "gpu:nvidia_h100_80gb_hbm3:4(S:0-1),gpu:nvidia_l40s:2")
    assert slurm_disagreement(have, "gpu:nvidia_h100_80gb_hbm3:4,gpu:nvidia_a40:2")


def test_the_sites_type_for_the_profile() -> None:
    t4 = inventory(facts("Tesla T4", 4))
    assert slurm_disagreement(t4, "gpu:tesla:4(S:0)") == [
        "Slurm registered Gres=gpu:tesla:4(S:0) (type tesla), node has 4× Tesla T4 (type "
        "tesla_t4)"]
    assert not slurm_disagreement(t4, "gpu:tesla:4(S:0)", types=["Tesla"])
    assert slurm_disagreement(t4, "gpu:tesla:2(S:0)", types=["tesla"])  # the count still counts
    assert slurmd_conf(t4, ["gpu-t4"], "tesla") == "Gres=gpu:tesla:4 Feature=gpu-t4,tesla"
    assert gres_conf_line(t4, "n1", kind="tesla") == (
        "NodeName=n1 Name=gpu Type=tesla File=/dev/nvidia[0-3]")
    assert SlurmSettings(gres_types={"gpu-t4": "tesla"}).gres_types == {"gpu-t4": "tesla"}
    for bad in ("gpu:tesla", "tesla,t4", "8", "", "a b"):
        with pytest.raises(ValidationError):
            SlurmSettings(gres_types={"gpu-t4": bad})
