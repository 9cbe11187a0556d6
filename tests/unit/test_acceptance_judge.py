"""Fabric acceptance (issue 26): the parsers and the judge against real tool outputs
(tests/fixtures/acceptance, provenance in its README). Cases the public captures lack (a slow
run, a ``#wrong`` row, a cut output, a ring all-reduce on NVL72) are the real texts with one
figure or line changed, and each test says which."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.acceptance.classes import CLASSES
from provisioner.acceptance.judge import detect, judge_text, passed
from provisioner.acceptance.nccl import parse_nccl
from provisioner.acceptance.nvbandwidth import parse_nvbandwidth
from provisioner.acceptance.perftest import parse_perftest
from provisioner.errors import ProvisionerError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "acceptance"
H200 = (FIXTURES / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt").read_text()
A100 = (FIXTURES / "nccl-all_reduce.a100x8.superbench.validation-off.txt").read_text()
NVBW = (FIXTURES / "nvbandwidth.gh200.v0.6.superbench.txt").read_text()
IB_MB = (FIXTURES / "ib_write_bw.loopback-8M.mbytes.superbench.txt").read_text()
IB_GB = (FIXTURES / "ib_write_bw.8B.gbits.perftest-273.txt").read_text()
DCGM = (ROOT / "tests" / "fixtures" / "dcgm" / "dcgmi-diag-r1-j.dcgm-4.2.3.gb10.json").read_text()
H200_ROW = "8589934592    2147483648     float     sum      -1    31517  272.55  476.96      0"


def failed(figures: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {f.figure: f.reason for f in figures if not f.passed}


def test_nccl_parser_reads_the_h200_run() -> None:
    run = parse_nccl(H200)
    assert [(r.rank, r.host, r.device, r.gpu) for r in run.ranks][:2] == [
        (0, "test-h200-deb", 0, "NVIDIA H200"), (1, "test-h200-deb", 1, "NVIDIA H200")]
    assert len(run.ranks) == 8
    assert [(r.size, r.placement, r.busbw, r.wrong) for r in run.rows] == [
        (8589934592, "out-of-place", 476.96, 0.0), (8589934592, "in-place", 476.98, 0.0)]
    assert run.avg_busbw == 476.967 and run.complete and run.validation is True
    assert run.max_bytes == 8589934592 and run.out_of_bounds == 0


def test_nccl_parser_reads_the_old_layout_without_root_and_with_na() -> None:
    run = parse_nccl(A100)  # nccl-tests before 2.13: no Group, no root, "error" column
    assert len(run.ranks) == 8 and run.ranks[7].gpu == "A100-SXM4-40GB"
    assert len(run.rows) == 2 * 34  # the NCCL INFO line inside the table is skipped
    assert run.rows[-1].busbw == 235.03 and run.rows[-1].wrong is None
    assert run.validation is False and run.avg_busbw == 68.4048


def test_healthy_h200_run_passes_its_class() -> None:
    figures = judge_text(CLASSES["hgx-h200"], H200, "all_reduce_perf.txt")
    assert passed(figures), [f.line() for f in figures]
    busbw = next(f for f in figures if f.figure == "busbw")
    assert busbw.line().startswith("all_reduce_perf busbw 476.96GB/s floor 431GB/s PASS")
    assert "8GiB" in busbw.reason and "AZ-H200" in busbw.reason


def test_one_gpu_run_captured_on_a_lent_h200_fails_the_8_gpu_class() -> None:
    """Our own capture (nccl-tests 2.19.6 built on the lent H200, one rank): read whole,
    validated, no wrong value, and still a failure for an HGX class: one GPU is not eight,
    and a single rank's bus bandwidth is 0."""
    text = (FIXTURES / "nccl-all_reduce.h200x1.lent-2026-11-27.txt").read_text()
    run = parse_nccl(text)
    assert [(r.rank, r.host, r.gpu) for r in run.ranks] == [(0, "vm", "NVIDIA H200")]
    assert run.complete and run.validation is True and run.max_bytes == 8 << 30
    assert len(run.rows) == 2 * 31 and all(r.wrong == 0 and r.busbw == 0 for r in run.rows)
    reasons = failed(judge_text(CLASSES["hgx-h200"], text, "all_reduce_perf.txt"))
    assert reasons, "a one-GPU run passed an 8-GPU class"
    assert any("8" in reason and "1" in reason for reason in reasons.values()), reasons


def test_healthy_h200_run_also_clears_the_h100_floor() -> None:
    assert passed(judge_text(CLASSES["hgx-h100"], H200))


def test_run_below_its_floor_fails_naming_the_floor() -> None:
    slow = H200.replace("476.96", "301.20")  # the real run with its out-of-place busbw lowered
    figures = judge_text(CLASSES["hgx-h200"], slow)
    assert not passed(figures)
    assert failed(figures)["busbw"].startswith("below 431.00GB/s; lowest of 2 rows")
    assert "8GiB out-of-place" in failed(figures)["busbw"]


def test_tolerance_lowers_the_floor() -> None:
    slow = H200.replace("476.96", "420.00").replace("476.98", "420.00")
    assert not passed(judge_text(CLASSES["hgx-h200"], slow))
    assert passed(judge_text(CLASSES["hgx-h200"].with_tolerance(0.05), slow))


def test_a_wrong_row_fails() -> None:
    wrong = H200.replace(H200_ROW, H200_ROW[:-1] + "12")  # out-of-place #wrong 0 -> 12
    figures = judge_text(CLASSES["hgx-h200"], wrong)
    assert failed(figures) == {"#wrong": "1 rows with wrong values (sizes 8GiB)"}
    assert next(f for f in figures if f.figure == "#wrong").value == "12"


def test_validation_off_fails_wrong_but_judges_bandwidth() -> None:
    figures = judge_text(CLASSES["hgx-a100"], A100)
    assert failed(figures) == {"#wrong": "not checked: the run had validation off (-c 0)"}
    busbw = next(f for f in figures if f.figure == "busbw")
    assert busbw.passed and busbw.value == "235.03GB/s"  # lowest of 8 GiB out/in-place


def test_smaller_run_is_judged_at_its_largest_size_and_says_so() -> None:
    lines = [ln for ln in A100.splitlines()
             if not ln.strip().startswith(("2147483648", "4294967296", "8589934592"))]
    figures = judge_text(CLASSES["hgx-a100"], "\n".join(lines))
    busbw = next(f for f in figures if f.figure == "busbw")
    assert "largest size 1GiB (below 8GiB)" in busbw.reason and busbw.value == "229.81GB/s"


def test_truncated_output_fails() -> None:
    cut = H200.split("# Out of bounds")[0]  # killed before the summary lines
    assert "did not finish" in failed(judge_text(CLASSES["hgx-h200"], cut))["complete"]
    mid_row = H200.split(H200_ROW)[0] + H200_ROW[:40]  # cut inside the only row
    figures = judge_text(CLASSES["hgx-h200"], mid_row)
    assert "the test did not run" in failed(figures)["busbw"]


def test_empty_and_unknown_outputs_fail() -> None:
    for text in ("", "   \n", "Segmentation fault (core dumped)\n"):
        figures = judge_text(CLASSES["hgx-h100"], text, "run.log")
        assert not passed(figures) and figures[0].test == "run.log"
    with pytest.raises(ProvisionerError):
        detect("")


def test_nvl72_fails_a_run_that_used_another_algorithm() -> None:
    ring = "mpirun -x NCCL_ALGO=Ring all_reduce_perf -b 8G -e 16G\n" + H200
    figures = judge_text(CLASSES["gb200-nvl72"], ring)
    assert failed(figures)["algorithm"] == "the run used RING, not NVLS"
    assert "gpus" in failed(figures) and "busbw" in failed(figures)
    nvls = "mpirun -x NCCL_ALGO=NVLS all_reduce_perf\n" + H200
    algo = next(f for f in judge_text(CLASSES["gb200-nvl72"], nvls) if f.figure == "algorithm")
    assert algo.passed


def test_nvbandwidth_parser_reads_matrices_and_sums() -> None:
    run = parse_nvbandwidth(NVBW)
    h2d = run.testcase("host_to_device_memcpy_ce")
    assert run.version == "v0.6" and h2d is not None and h2d.total == 1985.60
    assert h2d.unit == "GB/s" and len(h2d.cells) == 6
    assert h2d.slowest() is not None and h2d.slowest().value == 269.33  # type: ignore[union-attr]
    assert run.waived == 17 and len(run.testcases) == 15


def test_missing_nvbandwidth_testcase_fails() -> None:
    figures = judge_text(CLASSES["gb200-nvl72"], NVBW)
    assert [f.passed for f in figures] == [True, True, False]
    assert figures[2].test == "nvbandwidth:device_to_device_memcpy_read_ce"
    assert "did not run" in figures[2].reason


def test_nvbandwidth_slow_cell_names_the_gpu() -> None:
    slow = NVBW.replace("299.33", " 41.20")
    figure = judge_text(CLASSES["hgx-h100"], slow)[0]
    assert not figure.passed and "CPU 1 / GPU 1" in figure.reason


def test_perftest_mbytes_are_converted_to_gbits() -> None:
    reports = parse_perftest(IB_MB)
    assert len(reports) == 2 and reports[0].unit == "MB/s" and reports[0].device == "ib0"
    assert round(reports[0].rows[0].average_gbits, 2) == 201.80  # 24056.72 MiB/s
    assert passed(judge_text(CLASSES["rail-200g"], IB_MB))
    assert "below 360.00Gb/s" in failed(judge_text(CLASSES["rail-400g"], IB_MB))["bw_average"]


def test_perftest_gbits_report_small_message_fails() -> None:
    (report,) = parse_perftest(IB_GB)
    assert report.unit == "Gb/s" and report.rows[0].average_gbits == 0.48
    figures = judge_text(CLASSES["rail-400g"], IB_GB)
    assert figures[0].test == "ib_write_bw(ib0)" and "at 8B" in figures[0].reason


def test_class_without_a_floor_fails_the_test() -> None:
    assert "no InfiniBand" in failed(judge_text(CLASSES["hgx-h100"], IB_MB))["bw_average"]
    assert "no nvbandwidth" in failed(judge_text(CLASSES["rail-400g"], NVBW))["min"]


def test_dcgm_json_is_judged_with_dcgms_reason() -> None:
    (figure,) = judge_text(CLASSES["gb200-nvl72"], DCGM)
    assert not figure.passed and figure.reason.startswith("failed: software (GPU 0: ")
    healthy = DCGM.replace('"Fail"', '"Pass"')  # the real document with every Fail a Pass
    assert passed(judge_text(CLASSES["gb200-nvl72"], healthy))


def test_dcgm_judge_is_the_facts_roles_own_copy() -> None:
    role = ROOT / "playbooks" / "roles" / "facts" / "module_utils" / "provisioner_dcgm.py"
    ours = ROOT / "provisioner" / "acceptance" / "dcgm_diag.py"
    assert role.read_bytes() == ours.read_bytes()


def test_required_classes_exist_with_cited_floors() -> None:
    for name in ("hgx-a100", "hgx-h100", "hgx-h200", "hgx-b200", "hgx-b300", "gb200-nvl72",
                 "gb300-nvl72", "rail-200g", "rail-400g", "rail-800g"):
        cls = CLASSES[name]
        floors = [cls.nccl_busbw, cls.nvbw_host, cls.nvbw_p2p, cls.ib_bw]
        assert any(floors) and all(f.source for f in floors if f is not None), name
    assert CLASSES["gb200-nvl72"].algorithm == "NVLS" and CLASSES["gb300-nvl72"].gpus == 72


def test_acceptance_modules_are_pure() -> None:
    """Standard library, provisioner.errors and each other only (import-linter checks the
    I/O frameworks; this checks the rest), and nothing that blocks or spawns."""
    import ast
    import sys

    allowed = ("provisioner.errors", "provisioner.acceptance")
    for path in sorted((ROOT / "provisioner" / "acceptance").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names:
                    assert top not in {"asyncio", "socket", "subprocess", "threading"}, name
                elif top != "__future__":
                    assert name.startswith(allowed), f"{path.name} imports {name}"
