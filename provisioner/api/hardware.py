"""One line that says what a machine is, from its inspected facts (pure): ``8× NVIDIA H100
80GB HBM3, 4× 400G IB, 2× 56-core, 2048 GiB RAM, 8× 3.8 TB disk``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any


def hardware_summary(facts: Mapping[str, Any]) -> str:
    """The parts the facts name, most telling first; "" before any inspection."""
    parts = [_gpus(facts.get("gpus")), _hcas(facts.get("infiniband")),
             _cpu(facts.get("cpu")), _memory(facts.get("memory_mib")), _disks(facts.get("disks"))]
    return ", ".join(part for part in parts if part)


def _counted(names: Counter[str]) -> str:
    return ", ".join(f"{count}× {name}" for name, count in names.most_common())


def _items(value: object) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] \
        if isinstance(value, list) else []


def _gpus(value: object) -> str:
    names = Counter(str(gpu.get("name") or f"GPU {gpu.get('vendor')}:{gpu.get('device')}")
                    for gpu in _items(value))
    return _counted(names)


def _hcas(value: object) -> str:
    rates: Counter[str] = Counter()
    for hca in _items(value):
        rate = hca.get("rate_gbps")
        rates[f"{rate:g}G IB" if isinstance(rate, int | float) and rate else "IB"] += 1
    return _counted(rates)


def _cpu(value: object) -> str:
    if not isinstance(value, Mapping) or not isinstance(value.get("cores"), int):
        return ""
    sockets = value.get("sockets")
    model = value.get("model")
    if isinstance(sockets, int) and sockets > 1 and value["cores"] % sockets == 0:
        text = f"{sockets}× {value['cores'] // sockets}-core"
    else:
        text = f"{value['cores']}-core"
    return f"{text} {model}" if isinstance(model, str) and model else text


def _memory(value: object) -> str:
    if not isinstance(value, int | float) or value <= 0:
        return ""
    return f"{round(value / 1024)} GiB RAM"


def _disks(value: object) -> str:
    sizes: Counter[str] = Counter()
    for disk in _items(value):
        size = disk.get("size_bytes")
        if isinstance(size, int) and size > 0:
            sizes[_bytes(size) + " disk"] += 1
    return _counted(sizes)


def _bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000:
            return f"{value:.3g} {unit}"
        value /= 1000
    return f"{value:.3g} PB"
