"""Registration proof: what the node has (its facts), what Slurm registered (``Gres``,
``Features``) and what Kubernetes shows (``nvidia.com/gpu.count``, ``nvidia.com/gpu.product``,
allocatable ``nvidia.com/gpu``) must agree before a node goes ``active``. Pure.

The most reported Slinky problem is a GPU node registered with ``Gres=(null)``: the dynamic
``slurmd`` came up without the GPUs the node has and nobody notices until a job fails
(SlinkyProject/slurm-operator#106, #101, #57; Kubernetes and Slurm disagreeing: #45). Here the
disagreement is spelled out (``Slurm registered Gres=(null), node has 8× NVIDIA H100 80GB
HBM3``) and the node is held in ``register_failed``.

What the daemon writes for Slurm to register (``slurmd_conf``): ``Gres=gpu:<type>:<count>``
and ``Feature=<profile>,<type>``, the ``--conf`` of a dynamic ``slurmd -Z`` (the classic
node, or a Slinky NodeSet's extra slurmd arguments), with ``gres_conf_line`` for gres.conf.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.agent.gpu_ids import device_id, model_name

LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
RESOURCE_GPU = "nvidia.com/gpu"
_GRES = re.compile(r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?(?::(?P<count>\d+))?")
_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class Inventory:
    """The GPUs the node has, from its facts."""

    gpus: int
    model: str = ""

    @property
    def gpu_type(self) -> str:
        """The GRES type: the model's words up to its first with a digit, lower-case
        (``NVIDIA H100 80GB HBM3`` → ``h100``, ``NVIDIA A100-SXM4-80GB`` → ``a100``,
        ``NVIDIA RTX PRO 6000 Blackwell…`` → ``rtx_pro_6000``)."""
        words = re.split(r"[\s-]+", self.model.removeprefix("NVIDIA ").strip())
        picked: list[str] = []
        for word in words:
            picked.append(word)
            if any(ch.isdigit() for ch in word):
                break
        return _SLUG.sub("_", "_".join(picked).lower()).strip("_") or "gpu"

    def __str__(self) -> str:
        return f"{self.gpus}× {self.model}" if self.model else f"{self.gpus} GPUs"


def validated_clique(facts: Mapping[str, Any]) -> str | None:
    """The NVLink clique the validation gate recorded (``facts["validation"]["clique"]``)."""
    record = facts.get("validation")
    clique = record.get("clique") if isinstance(record, Mapping) else None
    return clique if isinstance(clique, str) and clique else None


def inventory(facts: Mapping[str, Any]) -> Inventory:
    """The node's GPUs: its last OS-level report's (driver view) when there is one, else
    the inspection's; the most common name (named from the device ID when unnamed)."""
    report = facts.get("last_report")
    listed = report.get("gpus") if isinstance(report, Mapping) else None
    if not isinstance(listed, list):
        listed = facts.get("gpus")
    gpus = [g for g in listed if isinstance(g, Mapping)] if isinstance(listed, list) else []
    names = [_name(g) for g in gpus]
    model = max(set(names), key=names.count) if names else ""
    return Inventory(len(gpus), model)


def _name(gpu: Mapping[str, Any]) -> str:
    name = str(gpu.get("name") or "")
    device = str(gpu.get("device") or "")
    if (not name or name.lower() == f"nvidia {device.lower()}") and device_id(device):
        return model_name(device)
    return name


def gres_gpus(gres: str) -> dict[str, int]:
    """``gpu:h100:8(S:0-1),nic:2`` → ``{"h100": 8}``; ``gpu:4`` → ``{"": 4}``; ``(null)`` or
    empty → ``{}``."""
    found: dict[str, int] = {}
    for item in gres.split(","):
        match = _GRES.match(item.strip())
        if match is None or match["name"].strip() != "gpu":
            continue
        kind, count = match["type"] or "", match["count"]
        if count is None and kind.isdigit():  # gpu:4
            kind, count = "", kind
        found[kind] = found.get(kind, 0) + int(count or 1)
    return found


def slurmd_conf(have: Inventory, features: Sequence[str] = ()) -> str:
    """The dynamic node's ``--conf`` additions: ``Gres=gpu:h100:8 Feature=gpu-worker,h100``."""
    words = []
    if have.gpus:
        words.append(f"Gres=gpu:{have.gpu_type}:{have.gpus}")
    listed = [*features, *([have.gpu_type] if have.gpus else [])]
    if listed:
        words.append("Feature=" + ",".join(dict.fromkeys(listed)))
    return " ".join(words)


def merge_conf(existing: str, ours: str) -> str:
    """``existing`` node parameters with ``ours`` (``Key=Value`` words) put in: our keys
    replace theirs (``Feature``/``Features`` alike), the others stay in their order."""
    def key(word: str) -> str:
        name = word.partition("=")[0].lower()
        return "feature" if name == "features" else name

    mine = ours.split()
    taken = {key(word) for word in mine}
    kept = [word for word in existing.split() if key(word) not in taken]
    return " ".join([*kept, *mine])


def gres_conf_line(have: Inventory, node: str, files: str = "/dev/nvidia[0-{last}]") -> str:
    """gres.conf for the node: ``NodeName=gpu-01 Name=gpu Type=h100 File=/dev/nvidia[0-7]``."""
    return (f"NodeName={node} Name=gpu Type={have.gpu_type} "
            f"File={files.format(last=have.gpus - 1)}")


def slurm_disagreement(have: Inventory, gres: str, features: frozenset[str] = frozenset(),
                       want_features: Sequence[str] = ()) -> list[str]:
    """What Slurm registered against what the node has (nothing to say without GPUs)."""
    if not have.gpus:
        return []
    registered = gres_gpus(gres)
    total = sum(registered.values())
    shown = gres or "(null)"
    problems = []
    if total != have.gpus:
        problems.append(f"Slurm registered Gres={shown}, node has {have}")
    elif (types := set(registered) - {""}) and types != {have.gpu_type}:
        problems.append(f"Slurm registered Gres={shown} (type {', '.join(sorted(types))}), "
                        f"node has {have} (type {have.gpu_type})")
    if missing := [f for f in want_features if f not in features]:
        problems.append(f"Slurm registered Features={','.join(sorted(features)) or '(null)'}, "
                        f"missing {','.join(missing)}")
    return problems


def kube_disagreement(have: Inventory, labels: Mapping[str, str],
                      allocatable: Mapping[str, str], clique: str | None = None) -> list[str]:
    """What Kubernetes shows (GPU feature discovery's labels, the device plugin's allocatable)
    against the node's GPUs and, on NVL72, the NVLink clique the validation gate found; what
    Kubernetes does not show yet is not a disagreement."""
    if not have.gpus:
        return []
    problems = []
    shown_clique = labels.get(LABEL_CLIQUE)
    if clique is not None and shown_clique is not None and shown_clique != clique:
        problems.append(f"Kubernetes label {LABEL_CLIQUE}={shown_clique}, the node's NVLink "
                        f"clique is {clique}")
    count = labels.get(LABEL_COUNT)
    if count is not None and count.strip() != str(have.gpus):
        problems.append(f"Kubernetes label {LABEL_COUNT}={count}, node has {have}")
    product = labels.get(LABEL_PRODUCT)
    if product is not None and have.model and _SLUG.sub("-", have.model.lower()).strip("-") \
            != _SLUG.sub("-", product.lower()).strip("-").removesuffix("-shared"):
        problems.append(f"Kubernetes label {LABEL_PRODUCT}={product}, node has {have}")
    allocated = allocatable.get(RESOURCE_GPU)
    if allocated is not None and allocated.strip() != str(have.gpus):
        problems.append(f"Kubernetes allocatable {RESOURCE_GPU}={allocated}, node has {have}")
    return problems
