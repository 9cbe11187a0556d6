"""The registration proof's pure half: Gres and features as Slurm writes them (real
recordings under tests/fixtures/slurm/), the GRES the daemon writes, the disagreements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.slurm.agree import (
    Inventory,
    gres_gpus,
    inventory,
    kube_disagreement,
    slurm_disagreement,
    slurmd_conf,
)
from provisioner.slurm.parse import nodes_from_openapi, nodes_from_scontrol

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
H100x8 = Inventory(8, "NVIDIA H100 80GB HBM3")


def test_recorded_answers_carry_gres_and_features() -> None:
    (line,) = nodes_from_scontrol((FIXTURES / "scontrol-22.05-show-node.txt").read_text())[:1]
    assert (line.gres, line.features) == ("", frozenset({"h100", "ib"}))
    (v38,) = nodes_from_openapi(json.loads((FIXTURES / "rest-v0.0.38-nodes-idle.json")
                                           .read_text()))[:1]
    assert v38.gres == "" and "h100" in v38.features
    (v42,) = nodes_from_openapi(json.loads((FIXTURES / "rest-v0.0.42-node-idle.json")
                                           .read_text()))
    assert v42.gres == "gpu:fake1:1(S:0),gpu:fake2:1(S:0)"
    assert gres_gpus(v42.gres) == {"fake1": 1, "fake2": 1}


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:h100:8(S:0-1)", {"h100": 8}), ("gpu:8", {"": 8}), ("gpu", {"": 1}),
    ("gpu:h100:4(S:0),gpu:h100:4(S:1),nic:2", {"h100": 8}), ("", {}), ("(null)", {}),
])
def test_gres_gpus(gres: str, gpus: dict[str, int]) -> None:
    assert gres_gpus(gres) == gpus


@pytest.mark.parametrize(("model", "kind"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GB200", "gb200"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx_pro_6000"),
])
def test_gres_type_from_the_model(model: str, kind: str) -> None:
    assert Inventory(8, model).gpu_type == kind


def test_inventory_prefers_the_driver_view_and_names_by_device() -> None:
    facts = {"gpus": [{"vendor": "0x10de", "device": "0x2330", "name": "NVIDIA 0x2330"}] * 8,
             "last_report": {"gpus": [{"vendor": "0x10de", "device": "0x2330",
                                       "name": "NVIDIA H100 80GB HBM3"}] * 7}}
    assert inventory(facts) == Inventory(7, "NVIDIA H100 80GB HBM3")
    assert inventory({"gpus": facts["gpus"]}) == H100x8
    assert inventory({}) == Inventory(0, "")


def test_disagreements_are_spelled_out() -> None:
    assert slurmd_conf(H100x8) == "Gres=gpu:h100:8 Feature=h100"
    assert slurm_disagreement(H100x8, "") == [
        "Slurm registered Gres=(null), node has 8× NVIDIA H100 80GB HBM3"]
    assert slurm_disagreement(H100x8, "gpu:h100:8(S:0-1)") == []
    assert slurm_disagreement(H100x8, "gpu:a100:8") == [
        "Slurm registered Gres=gpu:a100:8 (type a100), node has 8× NVIDIA H100 80GB HBM3 "
        "(type h100 or nvidia_h100_80gb_hbm3)"]
    assert slurm_disagreement(Inventory(0), "") == []
    labels = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert kube_disagreement(H100x8, labels, {"nvidia.com/gpu": "8"}) == []
    assert kube_disagreement(H100x8, {}, {}) == []  # not shown yet is no disagreement
    assert kube_disagreement(H100x8, labels | {"nvidia.com/gpu.product": "NVIDIA-A100"},
                             {"nvidia.com/gpu": "4"}) == [
        "Kubernetes label nvidia.com/gpu.product=NVIDIA-A100, node has 8× NVIDIA H100 80GB "
        "HBM3",
        "Kubernetes allocatable nvidia.com/gpu=4, node has 8× NVIDIA H100 80GB HBM3"]


def test_merge_conf_keeps_the_operators_words() -> None:
    from provisioner.slurm.agree import merge_conf

    assert merge_conf("Weight=10 Features=old", "Gres=gpu:h100:8 Feature=gpu,h100") == (
        "Weight=10 Gres=gpu:h100:8 Feature=gpu,h100")
    assert merge_conf("", "Gres=gpu:h100:8") == "Gres=gpu:h100:8"
    assert merge_conf("Gres=gpu:h100:8", "Gres=gpu:h100:8") == "Gres=gpu:h100:8"


def test_the_clique_kubernetes_shows_must_be_the_validated_one() -> None:
    from provisioner.slurm.agree import validated_clique

    clique = "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.1"
    facts = {"validation": {"passed": True, "clique": clique}}
    gb200 = Inventory(4, "NVIDIA GB200")
    assert validated_clique(facts) == clique and validated_clique({}) is None
    ok = {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.clique": clique}
    assert kube_disagreement(gb200, ok, {}, validated_clique(facts)) == []
    other = ok | {"nvidia.com/gpu.clique": "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.2"}
    assert kube_disagreement(gb200, other, {}, clique) == [
        "Kubernetes label nvidia.com/gpu.clique=7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.2, the "
        "node's NVLink clique is 7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.1"]
