"""``nvbandwidth`` stdout: one matrix per testcase, with its SUM line.

Layout read (NVIDIA/nvbandwidth ``output.cpp``; v0.6 and v0.8 captures): ``Running
host_to_device_memcpy_ce.``, a title such as ``memcpy CE CPU(row) -> GPU(column) bandwidth
(GB/s)``, a line of column indices, one line per row (``N/A`` on the diagonal of GPU-to-GPU
matrices), then ``SUM host_to_device_memcpy_ce 1985.60``. ``Waived:`` marks a testcase the
system cannot run. A testcase without its SUM line did not finish.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RUNNING = re.compile(r"^Running\s+(\S+?)\.?\s*$")
_SUM = re.compile(r"^SUM\s+(\S+)\s+([0-9.eE+-]+)")
_VERSION = re.compile(r"nvbandwidth Version:\s*(\S+)")
_TITLE = re.compile(r"\((GB/s|ns)\)\s*$")


@dataclass(frozen=True, slots=True)
class Cell:
    row: int
    column: int
    value: float


@dataclass(frozen=True, slots=True)
class Testcase:
    name: str
    title: str
    unit: str
    cells: tuple[Cell, ...]
    total: float | None

    @property
    def complete(self) -> bool:
        return self.total is not None

    def slowest(self) -> Cell | None:
        return min(self.cells, key=lambda c: c.value) if self.cells else None


@dataclass(frozen=True, slots=True)
class NvbandwidthRun:
    version: str | None
    testcases: tuple[Testcase, ...]
    waived: int

    def testcase(self, name: str) -> Testcase | None:
        return next((t for t in self.testcases if t.name == name), None)


def looks_like_nvbandwidth(text: str) -> bool:
    return bool(_VERSION.search(text) or re.search(r"^Running \w+_(?:ce|sm)\.", text, re.M))


def parse_nvbandwidth(text: str) -> NvbandwidthRun:
    version = m.group(1) if (m := _VERSION.search(text)) else None
    cases: list[Testcase] = []
    waived = 0
    name: str | None = None
    title, unit = "", ""
    cells: list[Cell] = []
    header_seen = False

    def close(total: float | None) -> None:
        if name is not None:
            cases.append(Testcase(name, title, unit, tuple(cells), total))

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Waived"):
            waived += 1
        elif m := _RUNNING.match(line):
            close(None)
            name, title, unit, cells, header_seen = m.group(1), "", "", [], False
        elif name is None:
            continue
        elif m := _SUM.match(line):
            close(float(m.group(2)))
            name = None
        elif (t := _TITLE.search(line)) and not title:
            title, unit = line, t.group(1)
        elif title and not header_seen and line and all(f.isdigit() for f in line.split()):
            header_seen = True
        elif header_seen and line:
            fields = line.split()
            if fields[0].isdigit():
                cells.extend(Cell(int(fields[0]), col, float(v))
                             for col, v in enumerate(fields[1:]) if _number(v))
    close(None)
    return NvbandwidthRun(version, tuple(cases), waived)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
