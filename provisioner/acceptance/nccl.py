"""nccl-tests stdout (``all_reduce_perf``, ``all_gather_perf``, ...): the result table, the
ranks, the summary lines and the algorithm hints.

Layouts read (NVIDIA/nccl-tests ``src/common.cu``; captures in tests/fixtures/acceptance):

* header ``# nThread 1 nGpus 8 minBytes 8 maxBytes 17179869184 ... validation: 1 ...`` and,
  from 2.19 on, ``# Collective test starting: all_reduce_perf``;
* ranks ``#  Rank  0 Group  0 Pid  23690 on HOST device  0 [0x00] NVIDIA H200`` (before 2.13
  without ``Group``);
* rows ``size count type redop root time algbw busbw #wrong time algbw busbw #wrong``, the
  first four figures out of place, the last four in place; before 2.13 no ``root`` column and
  an ``error`` column (a float such as ``0e+00``); ``N/A`` where validation was off (``-c 0``)
  or the collective has no in-place check; ``[1,0]<stdout>:`` prefixes from ``mpirun
  --tag-output`` are dropped;
* the end ``# Out of bounds values : 0 OK`` and ``# Avg bus bandwidth    : 476.967``: a run
  without the average line did not finish (killed, crashed, or the output was cut);
* algorithm hints: ``NCCL_ALGO=NVLS`` where the command line or an environment dump is in the
  output, and NCCL's own INFO lines that name an algorithm (``... algorithm NVLS``,
  ``Algo NVLS`` under ``NCCL_DEBUG_SUBSYS=TUNING``);
* NVLS (NVLink SHARP) under ``NCCL_DEBUG=INFO``, as NCCL prints it at communicator set-up
  (src/transport/nvls.cc, src/init.cc; captures: aws-samples/aws-do-eks nccl-test README,
  NVIDIA/nccl issues 892 and 1538, aws/aws-ofi-nccl issue 715):
  ``NVLS multicast support is available on dev 3`` (or ``is not available``; 2.27+ add
  `` (NVLS_NCHANNELS 16)``), ``NVLS comm 0x... headRank 0 nHeads 8 ...``, ``Connected NVLS
  tree`` and ``24 coll channels, 16 nvls channels, 32 p2p channels, ...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_HEADER = re.compile(r"#\s*nThread\s+\d+\s+nGpus\s+\d+\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)"
                     r".*?validation:\s*(\d)")
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_RANK = re.compile(r"#\s+Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+"
                   r"(\d+)\s+\[([^\]]*)\]\s+(.+?)\s*$")
_ROW_START = re.compile(r"\s*\d+\s+\d+\s+[A-Za-z]")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s+(\S+)")
_ALGO_ENV = re.compile(r"\bNCCL_ALGO=([A-Za-z_,^]+)")
_ALGO_INFO = re.compile(r"NCCL INFO.*?\b(?:algorithm|Algo)\s+([A-Za-z_]+)")
_NVLS_SUPPORT = re.compile(r"NVLS multicast support is (not )?available on dev (\d+)")
_NVLS_SET_UP = re.compile(r"NCCL INFO (?:Connected NVLS|NVLS comm 0x)")
# NCCL 2.18–2.2x: "24 coll channels, 16 nvls channels, …"; 2.28 adds collnet between:
# "64 coll channels, 64 collnet channels, 0 nvls channels, …" (a real H200 log)
_NVLS_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels, (?:\d+ collnet channels, )?"
                            r"(\d+) nvls channels")
_FAILURE = re.compile(r"Test (?:NCCL |CUDA )?failure|NCCL WARN|Segmentation fault|Aborted|"
                      r"out of memory|Test FAILED", re.IGNORECASE)
# longest names first: "reduce" is in "all_reduce" and "reduce_scatter"
TEST_NAMES = ("all_reduce_perf", "all_gather_perf", "alltoall_perf", "broadcast_perf",
              "reduce_scatter_perf", "reduce_perf", "sendrecv_perf", "scatter_perf",
              "gather_perf", "hypercube_perf")


@dataclass(frozen=True, slots=True)
class Rank:
    rank: int
    host: str
    device: int
    bus_id: str
    gpu: str


@dataclass(frozen=True, slots=True)
class Row:
    """One size, one placement (``out-of-place`` or ``in-place``). ``wrong`` is ``None``
    where the run printed ``N/A`` (not checked)."""

    size: int
    dtype: str
    redop: str
    placement: str
    time_us: float
    algbw: float
    busbw: float
    wrong: float | None


@dataclass(frozen=True, slots=True)
class Nvls:
    """What NCCL's INFO lines say of NVLS. ``info``: the output has NCCL INFO lines at all
    (``NCCL_DEBUG=INFO`` was set); ``channels``: the largest ``N nvls channels`` seen."""

    info: bool = False
    available_on: tuple[int, ...] = ()
    unavailable_on: tuple[int, ...] = ()
    set_up: bool = False
    channels: int | None = None

    @property
    def used(self) -> bool:
        """Set up with channels, and no device without multicast."""
        return ((self.set_up or bool(self.channels)) and self.channels != 0
                and not self.unavailable_on)


@dataclass(frozen=True, slots=True)
class NcclRun:
    test: str | None
    ranks: tuple[Rank, ...]
    rows: tuple[Row, ...]
    max_bytes: int | None
    validation: bool | None
    avg_busbw: float | None
    out_of_bounds: int | None
    algorithms: tuple[str, ...]
    failures: tuple[str, ...]
    cut_rows: int
    nvls: Nvls = field(default_factory=lambda: Nvls())

    @property
    def complete(self) -> bool:
        """The run printed its closing ``# Avg bus bandwidth`` line."""
        return self.avg_busbw is not None


def looks_like_nccl(text: str) -> bool:
    return bool(_HEADER.search(text) or _AVG.search(text)
                or re.search(r"#\s+size\s+count\s+type", text))


def parse_nccl(text: str, name_hint: str = "") -> NcclRun:
    """Everything the judge needs from one nccl-tests run; never raises on a cut output
    (``complete`` is false and ``cut_rows`` counts rows that end early)."""
    test = next((n for n in TEST_NAMES if n.removesuffix("_perf") in name_hint), None)
    ranks: list[Rank] = []
    rows: list[Row] = []
    algorithms: list[str] = []
    failures: list[str] = []
    max_bytes: int | None = None
    validation: bool | None = None
    avg: float | None = None
    oob: int | None = None
    cut = 0
    info, set_up = False, False
    available: list[int] = []
    unavailable: list[int] = []
    channels: int | None = None
    for raw in text.splitlines():
        line = _TAG.sub("", raw).rstrip()
        if m := _STARTING.search(line):
            test = m.group(1)
        elif m := _HEADER.search(line):
            max_bytes, validation = int(m.group(2)), m.group(3) == "1"
        elif m := _RANK.match(line.strip()):
            ranks.append(Rank(int(m.group(1)), m.group(2), int(m.group(3)), m.group(4),
                              m.group(5)))
        elif m := _AVG.search(line):
            avg = float(m.group(1))
        elif m := _OOB.search(line):
            oob = int(m.group(1))
        else:
            parsed = _row(line)
            if parsed is None and _ROW_START.match(line):
                cut += 1  # a row that ends early: the output was cut mid-line
            rows.extend(parsed or ())
        algorithms.extend(a for m in _ALGO_ENV.finditer(line) for a in m.group(1).split(","))
        algorithms.extend(m.group(1) for m in _ALGO_INFO.finditer(line))
        if "NCCL INFO" in line:
            info = True
            if m := _NVLS_SUPPORT.search(line):
                (unavailable if m.group(1) else available).append(int(m.group(2)))
            set_up = set_up or bool(_NVLS_SET_UP.search(line))
            if m := _NVLS_CHANNELS.search(line):
                channels = max(channels or 0, int(m.group(2)))
        if _FAILURE.search(line):
            failures.append(" ".join(line.split())[:200])
    if test is None:  # before 2.19 the output names its test only on a command line
        test = next((n for n in TEST_NAMES if n in text), None)
    nvls = Nvls(info, tuple(sorted(set(available))), tuple(sorted(set(unavailable))), set_up,
                channels)
    return NcclRun(test, tuple(ranks), tuple(rows), max_bytes, validation, avg, oob,
                   tuple(dict.fromkeys(a.upper() for a in algorithms if a)),
                   tuple(failures), cut, nvls)


def _row(line: str) -> tuple[Row, Row] | None:
    fields = line.split()
    if len(fields) not in (12, 13) or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    if not fields[2][:1].isalpha():
        return None
    figures = fields[5:] if len(fields) == 13 else fields[4:]
    try:
        return (Row(int(fields[0]), fields[2], fields[3], "out-of-place", float(figures[0]),
                    float(figures[1]), float(figures[2]), _wrong(figures[3])),
                Row(int(fields[0]), fields[2], fields[3], "in-place", float(figures[4]),
                    float(figures[5]), float(figures[6]), _wrong(figures[7])))
    except ValueError:
        return None


def _wrong(text: str) -> float | None:
    return None if text.upper() == "N/A" else float(text)
