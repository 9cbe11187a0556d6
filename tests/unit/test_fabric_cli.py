"""``provisioner fabric judge`` offline: real outputs in, one line per figure out, exit 0 only
on a pass (issue 26). No daemon and no config file: the command runs from the files alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli.entry import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "acceptance"
H200 = FIXTURES / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt"
NVBW = FIXTURES / "nvbandwidth.gh200.v0.6.superbench.txt"


def test_healthy_run_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fabric", "judge", "--class", "hgx-h200", str(H200)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("all_reduce_perf busbw 476.96GB/s floor 431GB/s PASS ")
    assert out[-1] == "hgx-h200: PASS (0 of 2 figures failed)"


def test_any_failed_figure_exits_1_and_lines_name_their_file(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fabric", "judge", "--class", "gb200-nvl72", str(H200), str(NVBW)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{NVBW}: nvbandwidth:device_to_device_memcpy_read_ce min - floor 335GB/s FAIL " \
           "the testcase did not run (missing from the output)" in out
    assert any(line.startswith(f"{H200}: all_reduce_perf busbw 476.96GB/s floor "
                               "770GB/sx(1-0.1) FAIL below 693.00GB/s") for line in out)


def test_tolerance_override(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    slow = tmp_path / "all_reduce_perf.log"
    slow.write_text(H200.read_text().replace("476.96", "420.00").replace("476.98", "420.00"))
    assert main(["fabric", "judge", "--class", "hgx-h200", str(slow)]) == 1
    assert main(["fabric", "judge", "--class", "hgx-h200", "--tolerance", "0.05",
                 str(slow)]) == 0
    assert "floor 431GB/sx(1-0.05) PASS" in capsys.readouterr().out


def test_empty_file_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "nccl.log"
    empty.write_text("")
    assert main(["fabric", "judge", "--class", "rail-400g", str(empty)]) == 1
    assert "FAIL empty output: the test did not run" in capsys.readouterr().out


def test_list_classes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fabric", "judge", "--list-classes"]) == 0
    out = capsys.readouterr().out
    for name in ("hgx-a100", "hgx-h100", "hgx-h200", "hgx-b200", "hgx-b300", "gb200-nvl72",
                 "gb300-nvl72", "rail-200g", "rail-400g", "rail-800g"):
        assert f"\n{name}: " in f"\n{out}"
    assert "all_reduce busbw >= 460GB/s [AZ-H100" in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["fabric", "judge", str(H200)]) == 2
    assert main(["fabric", "judge", "--class", "hgx-z900", str(H200)]) == 2
    assert main(["fabric", "judge", "--class", "hgx-h100"]) == 2
    assert main(["fabric", "judge", "--class", "hgx-h100", str(tmp_path / "absent")]) == 2
    assert main(["fabric", "judge", "--class", "hgx-h100", "--tolerance", "2", str(H200)]) == 2
    assert "unknown class 'hgx-z900'" in capsys.readouterr().err


def test_runs_without_config_or_daemon(tmp_path: Path) -> None:
    """As an operator runs it: a fresh interpreter, a config path that does not exist."""
    result = subprocess.run(
        [sys.executable, "-m", "provisioner", "--config", str(tmp_path / "none.toml"),
         "fabric", "judge", "--class", "hgx-h100", str(H200)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "hgx-h100: PASS (0 of 2 figures failed)"
