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

The GPU types accepted (``gres_types``) are the ones Slurm itself registers for the node's GPUs:
``AutoDetect=nvml`` (and ``nvidia``) names a GPU by its device name, lower-cased with spaces
turned to ``_`` and nothing else changed (``gpu_common_underscorify_tolower``, SchedMD/slurm
``src/plugins/gpu/common/gpu_common.c``, applied to ``nvmlDeviceGetName`` in
``gpu/nvml/gpu_nvml.c`` and to ``/proc/driver/nvidia/gpus/*/information`` ``Model:`` in
``gpu/nvidia/gpu_nvidia.c``): ``NVIDIA H100 80GB HBM3`` → ``nvidia_h100_80gb_hbm3``,
``NVIDIA A100-SXM4-80GB`` → ``nvidia_a100-sxm4-80gb``. A gres.conf ``Type`` beside
AutoDetect "should match or be a substring of the value that is detected" (gres.conf(5)), so a
part of that name cut at ``_``/``-`` that holds the model number (``h100``, ``h100_80gb``,
``a100-sxm4``) is Slurm's too; so are the short type the daemon writes and the types the site
configures per profile (``slurm.gres_types``). Compared case-insensitively, like Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.agent.gpu_ids import device_id, model_name

LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
RESOURCE_GPU = "nvidia.com/gpu"
_FLAGS = re.compile(r"\([^()]*\)$")  # (S:0-1), (IDX:0-3), (IDX:N/A)
_SLUG = re.compile(r"[^a-z0-9]+")
_CUT = re.compile(r"[_-]")


@dataclass(frozen=True, slots=True)
class Inventory:
    """The GPUs the node has, from its facts."""

    gpus: int
    model: str = ""
    names: tuple[str, ...] = field(default=(), compare=False)  # every distinct GPU name

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

    @property
    def nvml_types(self) -> tuple[str, ...]:
        """The types Slurm's AutoDetect registers for the node's GPUs."""
        return tuple(dict.fromkeys(nvml_type(n) for n in self.names or (self.model,) if n))

    def __str__(self) -> str:
        return f"{self.gpus}× {self.model}" if self.model else f"{self.gpus} GPUs"


def nvml_type(name: str) -> str:
    """Slurm's AutoDetect type for a GPU named ``name``: lower case, spaces to ``_``."""
    return name.lower().replace(" ", "_")


def _slurm_substring(kind: str, detected: str) -> bool:
    """``kind`` is ``detected`` or a part of it cut at ``_``/``-`` holding its model number
    (the first cut piece with a digit): ``h100`` of ``nvidia_h100_80gb_hbm3``, not ``80gb``,
    ``nvidia``, nor ``h20`` of ``nvidia_h200``."""
    pieces = _CUT.split(detected)
    model = next((p for p in pieces if any(ch.isdigit() for ch in p)), None)
    start = detected.find(kind)
    while model is not None and kind and start >= 0:
        end = start + len(kind)
        if (start == 0 or detected[start - 1] in "_-") \
                and (end == len(detected) or detected[end] in "_-") \
                and model in _CUT.split(kind):
            return True
        start = detected.find(kind, start + 1)
    return False


def gres_types(have: Inventory, configured: Collection[str] = ()) -> tuple[str, ...]:
    """The types named in a message: the daemon's short type, Slurm's AutoDetect names of
    the node's GPUs, the site's configured types (lower case, in that order)."""
    listed = [have.gpu_type, *have.nvml_types, *(c.lower() for c in configured)]
    return tuple(dict.fromkeys(t for t in listed if t))


def type_accepted(kind: str, have: Inventory, configured: Collection[str] = ()) -> bool:
    """Whether Slurm's GRES type ``kind`` names the node's GPUs (see the module's text)."""
    kind = kind.lower()
    return kind in gres_types(have, configured) \
        or any(_slurm_substring(kind, detected) for detected in have.nvml_types)


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
    return Inventory(len(gpus), model, tuple(sorted(set(names) - {""})))


def _name(gpu: Mapping[str, Any]) -> str:
    name = str(gpu.get("name") or "")
    device = str(gpu.get("device") or "")
    if (not name or name.lower() == f"nvidia {device.lower()}") and device_id(device):
        return model_name(device)
    return name


def gres_gpus(gres: str) -> dict[str, int]:
    """GPUs per type in a GRES string as Slurm 22.05–25.11 print it: ``gpu:h100:8(S:0-1),nic:2``
    → ``{"h100": 8}``; ``gpu:nvidia_h100_80gb_hbm3:4(S:0-1),shard:…`` → ``{"nvidia_h100_80gb_hbm3":
    4}``; ``gpu:4`` → ``{"": 4}``; ``gpu:(null):3(IDX:0-7)`` → ``{"": 3}``; ``(null)`` or
    empty → ``{}``. Other GRES (``shard``, ``mps``, ``nic``) are not GPUs."""
    found: dict[str, int] = {}
    for item in gres.split(","):
        name, *rest = _FLAGS.sub("", item.strip()).split(":")
        if name.strip() != "gpu":
            continue
        count = rest.pop() if rest and rest[-1].isdigit() else "1"
        kind = rest[0] if rest and rest[0] != "(null)" else ""
        found[kind] = found.get(kind, 0) + int(count)
    return found


def slurmd_conf(have: Inventory, features: Sequence[str] = (), kind: str | None = None) -> str:
    """The dynamic node's ``--conf`` additions: ``Gres=gpu:h100:8 Feature=gpu-worker,h100``
    (``kind``: the site's type for the profile instead of the short type)."""
    kind = kind or have.gpu_type
    words = []
    if have.gpus:
        words.append(f"Gres=gpu:{kind}:{have.gpus}")
    listed = [*features, *([kind] if have.gpus else [])]
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


def gres_conf_line(have: Inventory, node: str, files: str = "/dev/nvidia[0-{last}]",
                   kind: str | None = None) -> str:
    """gres.conf for the node: ``NodeName=gpu-01 Name=gpu Type=h100 File=/dev/nvidia[0-7]``."""
    return (f"NodeName={node} Name=gpu Type={kind or have.gpu_type} "
            f"File={files.format(last=have.gpus - 1)}")


def slurm_disagreement(have: Inventory, gres: str, features: frozenset[str] = frozenset(),
                       want_features: Sequence[str] = (),
                       types: Collection[str] = ()) -> list[str]:
    """What Slurm registered against what the node has (nothing to say without GPUs); the
    GRES types must name the node's GPUs (``type_accepted``; ``types``: the site's own for
    the node's profile)."""
    if not have.gpus:
        return []
    registered = gres_gpus(gres)
    total = sum(registered.values())
    shown = gres or "(null)"
    problems = []
    if total != have.gpus:
        problems.append(f"Slurm registered Gres={shown}, node has {have}")
    elif wrong := sorted(k for k in registered if k and not type_accepted(k, have, types)):
        problems.append(f"Slurm registered Gres={shown} (type {', '.join(wrong)}), node has "
                        f"{have} (type {' or '.join(gres_types(have, types))})")
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
