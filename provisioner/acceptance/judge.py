"""The judge: each figure of a saved tool output against its fabric class's floor.

Rules (issue 26): all-reduce bus bandwidth at large messages (8-16 GiB; the largest size in
the run when it ran smaller, and the line says so) against ``floor x (1 - tolerance)``;
any ``#wrong`` value other than 0 fails, and so does a run with validation off (``N/A``:
nothing was checked); on a class that expects NVLS (NVL72), an algorithm other than NVLS
fails, and so does a run whose ``NCCL_DEBUG=INFO`` lines show no NVLS set up (or a device
without multicast) or that has no INFO lines to show it; a test that did not run, an empty
output or one cut before its end fails. A class with no floor for a test fails it too:
nothing is passed unjudged.
"""

from __future__ import annotations

from collections.abc import Iterable

from provisioner.acceptance.classes import FabricClass, Floor
from provisioner.acceptance.dcgm_diag import judge_dcgm
from provisioner.acceptance.model import AcceptanceInputError, Figure, fmt
from provisioner.acceptance.nccl import NcclRun, Row, looks_like_nccl, parse_nccl
from provisioner.acceptance.nvbandwidth import (
    NvbandwidthRun,
    looks_like_nvbandwidth,
    parse_nvbandwidth,
)
from provisioner.acceptance.perftest import BwReport, looks_like_perftest, parse_perftest

GIB = 1 << 30
LARGE = (8 * GIB, 16 * GIB)
HOST_CASES = ("host_to_device_memcpy_ce", "device_to_host_memcpy_ce")
P2P_CASE = "device_to_device_memcpy_read_ce"


def detect(text: str) -> str:
    """``dcgm``, ``nvbandwidth``, ``perftest`` or ``nccl``; raises on anything else."""
    stripped = text.strip()
    if not stripped:
        raise AcceptanceInputError("empty output: the test did not run")
    if stripped.startswith("{") or '"DCGM' in stripped[:4000]:
        return "dcgm"
    if looks_like_nvbandwidth(text):
        return "nvbandwidth"
    if looks_like_perftest(text):
        return "perftest"
    if looks_like_nccl(text):
        return "nccl"
    raise AcceptanceInputError("not an nccl-tests, nvbandwidth, dcgmi diag -j or perftest "
                               "output")


def judge_text(cls: FabricClass, text: str, source: str = "") -> list[Figure]:
    """Every figure of one saved output; an unreadable or empty one is one failed figure."""
    try:
        kind = detect(text)
    except AcceptanceInputError as exc:
        return [Figure(source or "output", "output", "-", "-", False, str(exc))]
    if kind == "dcgm":
        return [judge_dcgm_text(text)]
    if kind == "nvbandwidth":
        return judge_nvbandwidth(cls, parse_nvbandwidth(text))
    if kind == "perftest":
        return judge_perftest(cls, parse_perftest(text))
    return judge_nccl(cls, parse_nccl(text, source))


def passed(figures: Iterable[Figure]) -> bool:
    listed = list(figures)
    return bool(listed) and all(f.passed for f in listed)


def judge_dcgm_text(text: str) -> Figure:
    """A saved ``dcgmi diag -j`` document (no exit status: DCGM's own per-test verdicts)."""
    verdict = judge_dcgm(0, text, "")
    ok = bool(verdict["ran"]) and bool(verdict["passed"])
    return Figure("dcgmi-diag", "verdict", "pass" if ok else "fail", "-", ok,
                  str(verdict["summary"]))


def judge_nccl(cls: FabricClass, run: NcclRun) -> list[Figure]:
    test = run.test or "nccl-tests"
    if not run.rows:
        why = run.failures[0] if run.failures else "no result rows"
        return [Figure(test, "busbw", "-", _floor_text(cls.nccl_busbw), False,
                       f"the test did not run: {why}")]
    figures: list[Figure] = []
    if run.failures:
        figures.append(Figure(test, "errors", str(len(run.failures)), "-", False,
                              run.failures[0]))
    if not run.complete or run.cut_rows:
        figures.append(Figure(test, "complete", "no", "-", False,
                              "output ends before '# Avg bus bandwidth': the run did not "
                              "finish or the output was cut"))
    if cls.gpus and run.ranks and len(run.ranks) != cls.gpus:
        figures.append(Figure(test, "gpus", str(len(run.ranks)), str(cls.gpus), False,
                              f"{cls.name} is judged on a run over {cls.gpus} GPUs"))
    figures.append(_wrong(test, run))
    figures.append(_busbw(cls, test, run))
    if cls.algorithm is not None:
        figures.append(_algorithm(cls.algorithm, test, run))
    return figures


def _wrong(test: str, run: NcclRun) -> Figure:
    checked = [r for r in run.rows if r.wrong is not None]
    bad = [r for r in checked if r.wrong]
    if bad:
        sizes = ", ".join(sorted({_size(r.size) for r in bad}))
        total = sum(r.wrong or 0 for r in bad)
        return Figure(test, "#wrong", f"{total:g}", "0", False,
                      f"{len(bad)} rows with wrong values (sizes {sizes})")
    if not checked or run.validation is False:
        return Figure(test, "#wrong", "N/A", "0", False,
                      "not checked: the run had validation off (-c 0)")
    return Figure(test, "#wrong", "0", "0", True, f"{len(checked)} rows checked")


def _busbw(cls: FabricClass, test: str, run: NcclRun) -> Figure:
    floor = cls.nccl_busbw
    if floor is None or not test.startswith(("all_reduce", "nccl-tests")):
        return Figure(test, "busbw", "-", "-", False,
                      f"class {cls.name} has no bus-bandwidth floor for {test}")
    large = [r for r in run.rows if LARGE[0] <= r.size <= LARGE[1]]
    note = f"at {_size(LARGE[0])}-{_size(LARGE[1])}"
    if not large:
        top = max(r.size for r in run.rows)
        large = [r for r in run.rows if r.size == top]
        note = f"at the run's largest size {_size(top)} (below {_size(LARGE[0])})"
    slowest = min(large, key=lambda r: r.busbw)
    ok = slowest.busbw >= floor.effective
    where = f"lowest of {len(large)} rows {note}: {_size(slowest.size)} {slowest.placement}"
    why = "" if ok else f"below {fmt(floor.effective, floor.unit)}; "
    return Figure(test, "busbw", fmt(slowest.busbw, "GB/s"), floor.text(), ok,
                  f"{why}{where} [{floor.source}]")


def _algorithm(expected: str, test: str, run: NcclRun) -> Figure:
    excluded = [a for a in run.algorithms if a.startswith("^") and expected in a]
    others = [a for a in run.algorithms if expected not in a]
    if others or excluded:
        return Figure(test, "algorithm", ",".join(run.algorithms), expected, False,
                      f"the run used {','.join(others or excluded)}, not {expected}")
    if expected == "NVLS":
        return _nvls(test, run)
    if not run.algorithms:
        return Figure(test, "algorithm", "unnamed", expected, True,
                      "the output names no algorithm (NCCL_DEBUG=INFO shows it)")
    return Figure(test, "algorithm", expected, expected, True, "as expected")


def _nvls(test: str, run: NcclRun) -> Figure:
    """NVLS (NVLink SHARP) must be set up: NCCL's INFO lines say so (``Connected NVLS
    tree``, ``NVLS comm``, ``16 nvls channels``), no device lacks multicast, or the run
    asked for it (``NCCL_ALGO=NVLS``). Absent, or not shown at all, fails."""
    nvls = run.nvls
    if nvls.unavailable_on:
        devs = ",".join(map(str, nvls.unavailable_on))
        return Figure(test, "algorithm", "no NVLS", "NVLS", False,
                      f"NVLS absent: 'NVLS multicast support is not available' on dev {devs} "
                      "(IMEX channels, fabric manager or the NVSwitch multicast)")
    if nvls.channels == 0:
        return Figure(test, "algorithm", "no NVLS", "NVLS", False,
                      "NVLS absent: NCCL set up 0 nvls channels")
    if nvls.used:
        what = [w for w, seen in (("set up", nvls.set_up),
                                  (f"{nvls.channels} nvls channels", bool(nvls.channels)),
                                  (f"multicast on {len(nvls.available_on)} device(s)",
                                   bool(nvls.available_on))) if seen]
        return Figure(test, "algorithm", "NVLS", "NVLS", True, "NVLS " + ", ".join(what))
    if "NVLS" in run.algorithms:
        return Figure(test, "algorithm", "NVLS", "NVLS", True, "the run asked for NVLS "
                      "(NCCL_ALGO=NVLS)")
    if not nvls.info:
        return Figure(test, "algorithm", "unshown", "NVLS", False,
                      "the output has no NCCL INFO lines: NVLS cannot be shown (run "
                      "all_reduce_perf with NCCL_DEBUG=INFO)")
    return Figure(test, "algorithm", "no NVLS", "NVLS", False,
                  "NVLS absent: NCCL's INFO lines show no NVLS set-up ('Connected NVLS "
                  "tree', 'NVLS comm', 'N nvls channels')")


def judge_nvbandwidth(cls: FabricClass, run: NvbandwidthRun) -> list[Figure]:
    wanted = [(name, cls.nvbw_host) for name in HOST_CASES] + [(P2P_CASE, cls.nvbw_p2p)]
    figures = []
    for name, floor in wanted:
        if floor is None:
            continue
        case = run.testcase(name)
        test = f"nvbandwidth:{name}"
        if case is None:
            figures.append(Figure(test, "min", "-", floor.text(), False,
                                  "the testcase did not run (missing from the output)"))
            continue
        cell = case.slowest()
        if cell is None or not case.complete:
            figures.append(Figure(test, "min", "-", floor.text(), False,
                                  "the testcase did not finish (no SUM line)"))
            continue
        where = (f"GPU {cell.row} -> GPU {cell.column}" if name == P2P_CASE
                 else f"CPU {cell.row} / GPU {cell.column}")
        ok = cell.value >= floor.effective
        why = "" if ok else f"below {fmt(floor.effective, floor.unit)}; "
        figures.append(Figure(test, "min", fmt(cell.value, "GB/s"), floor.text(), ok,
                              f"{why}slowest {where} [{floor.source}]"))
    if not figures:
        figures.append(Figure("nvbandwidth", "min", "-", "-", False,
                              f"class {cls.name} has no nvbandwidth floor"))
    return figures


def judge_perftest(cls: FabricClass, reports: tuple[BwReport, ...]) -> list[Figure]:
    floor = cls.ib_bw
    figures = []
    for report in reports:
        test = _perftest_name(report.test) + (f"({report.device})" if report.device else "")
        if floor is None:
            figures.append(Figure(test, "bw_average", "-", "-", False,
                                  f"class {cls.name} has no InfiniBand bandwidth floor"))
            continue
        if not report.rows:
            figures.append(Figure(test, "bw_average", "-", floor.text(), False,
                                  "no result row: the test did not run"))
            continue
        top = max(report.rows, key=lambda r: r.size)
        ok = top.average_gbits >= floor.effective
        why = "" if ok else f"below {fmt(floor.effective, floor.unit)}; "
        unit = "" if report.unit == "Gb/s" else f", reported in {report.unit} (MiB/s)"
        figures.append(Figure(test, "bw_average", fmt(top.average_gbits, "Gb/s"), floor.text(),
                              ok, f"{why}at {_size(top.size)}{unit} [{floor.source}]"))
    if not figures:
        figures.append(Figure("ib_bw", "bw_average", "-", "-", False,
                              "no bandwidth report: the test did not run"))
    return figures


def _perftest_name(title: str) -> str:
    for word, name in (("Write", "ib_write_bw"), ("Read", "ib_read_bw"), ("Send", "ib_send_bw")):
        if word in title:
            return name
    return "ib_bw"


def _floor_text(floor: Floor | None) -> str:
    return "-" if floor is None else floor.text()


def _size(size: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


__all__ = ["Row", "detect", "judge_nccl", "judge_nvbandwidth", "judge_perftest", "judge_text",
           "passed"]
