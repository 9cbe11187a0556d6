"""NVLS on NVL72 (issue 26): a domain-wide all-reduce on ``gb200-nvl72``/``gb300-nvl72`` must
show NVLS set up in NCCL's ``NCCL_DEBUG=INFO`` lines. Real runs: the two p5.48xlarge (8x
H100, NVLink SHARP) all_reduce_perf logs of aws-samples/aws-do-eks (tests/fixtures/
acceptance/README.md). NVLS absent is the two-node log with its three INFO lines replaced
by the real line NCCL printed where multicast was missing (NVIDIA/nccl-tests issue 188:
``user:16906:16952 [7] NCCL INFO NVLS multicast support is not available on dev 7``), or
with its ``16 nvls channels`` turned ``0 nvls channels``: each test says which."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.acceptance.classes import CLASSES
from provisioner.acceptance.judge import judge_text
from provisioner.acceptance.nccl import parse_nccl
from provisioner.cli.entry import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "acceptance"
ONE = FIXTURES / "nccl-all_reduce.h100x8.p5-eks.nvls-info.txt"
TWO = FIXTURES / "nccl-all_reduce.h100x16.p5-eks-2nodes.nvls-info.txt"
H200 = (FIXTURES / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt").read_text()
UNAVAILABLE = "user:16906:16952 [7] NCCL INFO NVLS multicast support is not available on dev 7"


def algorithm(cls: str, text: str) -> tuple[bool, str, str]:
    figure = next(f for f in judge_text(CLASSES[cls], text) if f.figure == "algorithm")
    return figure.passed, figure.value, figure.reason


def test_the_recorded_runs_show_nvls_set_up() -> None:
    for path, channels in ((ONE, 16), (TWO, 16)):
        run = parse_nccl(path.read_text())
        assert run.nvls.info and run.nvls.set_up and run.nvls.channels == channels
        assert run.nvls.used and run.nvls.unavailable_on == ()
        assert run.complete and [r.busbw for r in run.rows][:1] in ([468.60], [438.85])
    for cls in ("gb200-nvl72", "gb300-nvl72"):
        assert algorithm(cls, TWO.read_text()) == (True, "NVLS",
                                                  "NVLS set up, 16 nvls channels")


def test_the_per_device_multicast_lines_are_read() -> None:
    """The real line of NVIDIA/nccl issue 892 (an H800 with NVLS) before the two-node log."""
    text = "NCCL INFO NVLS multicast support is available on dev 3\n" + TWO.read_text()
    run = parse_nccl(text)
    assert run.nvls.available_on == (3,) and run.nvls.used
    assert algorithm("gb200-nvl72", text)[2] == (
        "NVLS set up, 16 nvls channels, multicast on 1 device(s)")


def test_a_device_without_multicast_fails_naming_it() -> None:
    lines = TWO.read_text().splitlines(keepends=True)
    text = UNAVAILABLE + "\n" + "".join(lines[3:])  # the three NVLS INFO lines replaced
    run = parse_nccl(text)
    assert run.nvls.unavailable_on == (7,) and not run.nvls.used
    ok, value, reason = algorithm("gb200-nvl72", text)
    assert (ok, value) == (False, "no NVLS")
    assert reason.startswith("NVLS absent: 'NVLS multicast support is not available' on dev 7")


def test_zero_nvls_channels_fail() -> None:
    text = TWO.read_text().replace("16 nvls channels", "0 nvls channels")  # one figure
    assert algorithm("gb300-nvl72", text) == (False, "no NVLS",
                                              "NVLS absent: NCCL set up 0 nvls channels")


def test_info_lines_without_nvls_fail() -> None:
    lines = TWO.read_text().splitlines(keepends=True)
    text = lines[1] + "".join(lines[3:])  # only the threadThresholds INFO line kept
    ok, value, reason = algorithm("gb200-nvl72", text)
    assert (ok, value) == (False, "no NVLS") and "show no NVLS set-up" in reason


def test_a_run_without_nccl_debug_cannot_show_nvls_and_fails() -> None:
    ok, value, reason = algorithm("gb200-nvl72", H200)
    assert (ok, value) == (False, "unshown") and "NCCL_DEBUG=INFO" in reason
    # an HGX class does not ask for NVLS: the same run passes there
    assert all(f.passed for f in judge_text(CLASSES["hgx-h200"], H200))


def test_nccl_algo_excluding_nvls_fails() -> None:
    text = "mpirun -x NCCL_ALGO=^NVLS all_reduce_perf\n" + TWO.read_text()  # one line added
    ok, _, reason = algorithm("gb200-nvl72", text)
    assert not ok and reason == "the run used ^NVLS, not NVLS"


def test_fabric_judge_reads_an_nccl_debug_log(capsys: pytest.CaptureFixture[str]) -> None:
    """Accepted and judged: NVLS passes; the 16-GPU run is below an NVL72 floor."""
    assert main(["fabric", "judge", "--class", "gb200-nvl72", str(TWO)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "all_reduce_perf algorithm NVLS floor NVLS PASS NVLS set up, 16 nvls channels" in out
    assert any(line.startswith("all_reduce_perf busbw 438.85GB/s floor 770GB/sx(1-0.1) FAIL")
               for line in out), out


def test_a_real_run_without_nvls_fails_the_nvl72_algorithm() -> None:
    """NCCL 2.28.9's whole INFO log of one H200 (captured on a lent machine): it sets up
    ``0 nvls channels`` and prints no multicast line; on an NVL72 class that is a failure
    that says so, whatever the bandwidth."""
    text = (FIXTURES / "nccl-all_reduce.h200x1.nccl-debug-info.lent-2026-11-27.txt").read_text()
    run = parse_nccl(text)
    assert run.nvls.info and run.nvls.channels == 0 and not run.nvls.used
    assert run.complete and {r.size for r in run.rows} == {1073741824}
    passed, _value, reason = algorithm("gb200-nvl72", text)
    assert not passed and "0 nvls channels" in reason, reason
