"""``nvidia-smi topo -m`` (the GPU/NIC connection matrix) and ``nvidia-smi nvlink --status``.

topo -m (tab-separated; newer drivers underline the header with ANSI codes)::

            GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV18    PXB     0-55,112-167    0               N/A
    GPU1    NV18     X      SYS     0-55,112-167    0               N/A
    NIC0    PXB     SYS      X
    Legend: ...
    NIC Legend:
      NIC0: mlx5_0
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.topology.parse_common import check_text, fail, guarded, numbered

_CELL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|SOC|NV\d+|NV#)$")
_SPLIT = re.compile(r"\t+| {2,}")
_NIC = re.compile(r"^(NIC\d+)\s*:\s*(\S+)\s*$")
_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: (\S+)\)\s*$")
_NVLINK_LINK = re.compile(r"^Link (\d+): (?:([\d.]+) GB/s|<inactive>|(.*))\s*$")


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    devices: tuple[str, ...]                   # GPU0, GPU1, NIC0, ... in column order
    links: tuple[tuple[str, str, str], ...]    # (a, b, kind) once per pair, a before b
    nics: tuple[tuple[str, str], ...] = ()     # (NIC0, mlx5_0)
    affinity: tuple[tuple[str, str], ...] = ()  # (GPU0, "0-55,112-167")

    def kind(self, a: str, b: str) -> str | None:
        return next((k for x, y, k in self.links if {x, y} == {a, b}), None)

    def nvlinks(self, gpu: str) -> int:
        """Bonded NVLinks from ``gpu`` to the other GPUs (sum of the NV# cells)."""
        return sum(int(k[2:]) for x, y, k in self.links
                   if gpu in (x, y) and k[2:].isdigit() and k.startswith("NV"))


def parse_nvidia_smi_topo(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    check_text(source, text)
    return guarded(source, lambda: _topo(text, source))


def _topo(text: str, source: str) -> TopoMatrix:
    devices: list[str] = []
    rows: dict[str, list[str]] = {}
    nics: list[tuple[str, str]] = []
    affinity: list[tuple[str, str]] = []
    legend = False
    for number, line in numbered(text):
        cells = [c.strip() for c in _SPLIT.split(line.strip()) if c.strip()]
        if not cells:
            continue
        if cells[0].startswith("Legend") or cells[0].startswith("NIC Legend"):
            legend = True
        elif legend:
            if (nic := _NIC.match(line.strip())) is not None:
                nics.append((nic[1], nic[2]))
        elif not devices:
            devices = [c for c in cells if re.fullmatch(r"(GPU|NIC|mlx\w*)\d*", c)]
            if not devices or devices[0] != cells[0]:
                raise fail(source, number, "first line is not a GPU0 ... header")
        else:
            _row(cells, devices, rows, affinity, source, number)
    if not rows:
        raise fail(source, 0, "no matrix rows")
    links = tuple((a, b, rows[a][j]) for i, a in enumerate(devices) if a in rows
                  for j, b in enumerate(devices) if j > i)
    return TopoMatrix(tuple(devices), links, tuple(nics), tuple(affinity))


def _row(cells: list[str], devices: list[str], rows: dict[str, list[str]],
         affinity: list[tuple[str, str]], source: str, number: int) -> None:
    name, values = cells[0], cells[1:]
    if name not in devices:
        raise fail(source, number, f"row {name!r} is not a column of the header")
    if len(values) < len(devices):
        raise fail(source, number, f"{len(values)} cells, expected {len(devices)}")
    for value in values[: len(devices)]:
        if not _CELL.match(value):
            raise fail(source, number, f"unknown connection type {value!r}")
    if values[devices.index(name)] != "X":
        raise fail(source, number, f"{name} is not X on the diagonal")
    rows[name] = values[: len(devices)]
    if len(values) > len(devices):
        affinity.append((name, values[len(devices)]))


@dataclass(frozen=True, slots=True)
class NvlinkStatus:
    index: int
    product: str
    uuid: str
    links: tuple[tuple[int, float | None], ...]   # (link, GB/s) or None when inactive

    @property
    def inactive(self) -> tuple[int, ...]:
        return tuple(n for n, speed in self.links if speed is None)


def parse_nvlink_status(text: str, source: str = "nvidia-smi nvlink --status"
                        ) -> tuple[NvlinkStatus, ...]:
    """One record per GPU. Empty output (what a GPU without NVLink, a PCIe L4 or L40S, gives)
    is "no links": ``()``, not an error; other text without a ``GPU n:`` line is one."""
    check_text(source, text)
    if not text.strip():
        return ()
    return guarded(source, lambda: _nvlink(text, source))


def _nvlink(text: str, source: str) -> tuple[NvlinkStatus, ...]:
    gpus: list[NvlinkStatus] = []
    for number, line in numbered(text):
        stripped = line.strip()
        if not stripped:
            continue
        if (gpu := _NVLINK_GPU.match(stripped)) is not None:
            gpus.append(NvlinkStatus(int(gpu[1]), gpu[2], gpu[3], ()))
        elif gpus and (link := _NVLINK_LINK.match(stripped)) is not None:
            speed = float(link[2]) if link[2] else None
            last = gpus[-1]
            gpus[-1] = NvlinkStatus(last.index, last.product, last.uuid,
                                    (*last.links, (int(link[1]), speed)))
        else:
            raise fail(source, number, f"not an nvlink --status line: {stripped[:60]!r}")
    if not gpus:
        raise fail(source, 0, "no 'GPU n: ...' line")
    return tuple(gpus)
