"""perftest bandwidth reports (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``).

Layout read (linux-rdma/perftest ``src/perftest_resources.c`` ``print_report_bw`` and its
headers): a title (``RDMA_Write BW Test``), ``Device : mlx5_0``, then the table header
``#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]`` and one row per
size. With ``--report_gbits`` the unit is Gb/s (10^9 bits); without it MB/s, where perftest
divides by 0x100000 (``format_factor``), so MB/s here is MiB/s: Gb/s = MB/s x 1048576 x 8 /
10^9. A server and a client both print their table; each is one report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb|MB)/sec\]\s+BW average\[(Gb|MB)/sec\]")
_TITLE = re.compile(r"^\s*(\S.*?\bBW Test)\s*$")
_DEVICE = re.compile(r"Device\s*:\s*(\S+)")
MIB_PER_S_TO_GBITS = 1048576 * 8 / 1e9


@dataclass(frozen=True, slots=True)
class BwRow:
    size: int
    iterations: int
    peak_gbits: float
    average_gbits: float
    msg_rate_mpps: float


@dataclass(frozen=True, slots=True)
class BwReport:
    test: str
    device: str | None
    unit: str
    rows: tuple[BwRow, ...]


def looks_like_perftest(text: str) -> bool:
    return bool(_HEADER.search(text))


def parse_perftest(text: str) -> tuple[BwReport, ...]:
    reports: list[BwReport] = []
    title, device = "ib_bw", None
    unit: str | None = None
    rows: list[BwRow] = []

    def close() -> None:
        if unit is not None:
            reports.append(BwReport(title, device, unit, tuple(rows)))

    for line in text.splitlines():
        if m := _TITLE.match(line):
            close()
            title, device, unit, rows = m.group(1), None, None, []
        elif (m := _DEVICE.search(line)) and device is None:
            device = m.group(1)
        elif m := _HEADER.search(line):
            if unit is not None:
                close()
                rows = []
            unit = m.group(2) + "/s"
        elif unit is not None and (row := _row(line, unit)) is not None:
            rows.append(row)
    close()
    return tuple(reports)


def _row(line: str, unit: str) -> BwRow | None:
    fields = line.split()
    if len(fields) != 5 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    try:
        peak, average, rate = float(fields[2]), float(fields[3]), float(fields[4])
    except ValueError:
        return None
    factor = MIB_PER_S_TO_GBITS if unit == "MB/s" else 1.0
    return BwRow(int(fields[0]), int(fields[1]), peak * factor, average * factor, rate)
