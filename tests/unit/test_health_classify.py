"""Health findings from real saved outputs (tests/fixtures/health/README.md names each one's
source): every fixture is classified to the class and action its content calls for, healthy
captures to nothing, and ``provisioner health classify`` prints and exits accordingly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import cli
from provisioner.errors import InvalidRequest
from provisioner.health import xid
from provisioner.health.classify import classify, detect
from provisioner.health.model import Action, Finding, HealthClass, Source, worst

FIXTURES = Path(__file__).parents[1] / "fixtures"
HEALTH = FIXTURES / "health"
H, A = HealthClass, Action


def found(path: Path) -> list[tuple[HealthClass, Action]]:
    return [(f.cls, f.action) for f in classify(path.read_text())]


@pytest.mark.parametrize("path", [
    HEALTH / "h200-580.159.04-nvsmi-q.txt",
    HEALTH / "h200-580.159.04-nvsmi-q-ecc.txt",
    HEALTH / "h200-580.159.04-dmesg-nvrm.txt",
    FIXTURES / "topology/nvidia-smi/gpud-nvidia-smi-q.535.161.08.h100x8.txt",
    FIXTURES / "topology/infiniband/gpud-ibstat.47.0.h100.all.active.0.txt",
    FIXTURES / "topology/infiniband/gpud-ibstat.47.0.h100.some.down.0.txt",
    HEALTH / "gpud-ibstat.47.0.h100.some.down.1.txt",
    HEALTH / "supermicro-x10dru-sel-fans.txt",
], ids=lambda p: p.name)
def test_healthy_captures_give_no_finding(path: Path) -> None:
    assert classify(path.read_text()) == []


@pytest.mark.parametrize(("name", "expected"), [
    ("ml-engineering-xid63.log", [(H.GPU_MEMORY, A.NONE)]),
    ("gpud-dmesg-with-xid-119.log", [(H.GPU, A.RESET_GPU)]),
    ("gpud-pr46-dmesg-ctime-xid13-109.log", [(H.APPLICATION, A.NONE), (H.GPU, A.RESET_GPU)]),
    ("gpud-pr1160-pr1174-kmsg-xid-nvlink5.log", [
        (H.NVLINK, A.NONE), (H.NVLINK, A.RESET_GPU), (H.NVLINK, A.RESET_GPU),
        (H.NVLINK, A.NONE), (H.GPU_MEMORY, A.NONE)]),
    ("open-gpu-kernel-modules-1150-journal-xid45.log", [(H.APPLICATION, A.NONE)] * 4),
    ("nvsentinel-155-dmesg-fallen-off-bus.log", [(H.GPU_LOST, A.RESTART_OS)]),
    ("ml-engineering-nvsmi-q-a100-remap-pending.txt", [(H.GPU_MEMORY, A.RESET_GPU)]),
    ("ml-engineering-nvsmi-q-sram-uncorrectable.txt", [(H.GPU_MEMORY, A.RESET_GPU)]),
    ("ml-engineering-dcgmi-diag-deployment-error.txt", [(H.GPU_MEMORY, A.RESET_GPU)]),
    ("ml-engineering-dcgmi-diag-r2-gpu-memory-fail.txt",
     [(H.GPU_MEMORY, A.RESET_GPU), (H.THERMAL, A.NONE)]),
    ("supermicro-sel-psu-failure.txt", [(H.POWER, A.SERVICE_REQUIRED)] * 2),
    ("gpud-ibstat.47.0.h100.some.down.with.polling.1.txt", [(H.INFINIBAND, A.DRAIN)]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_real_outputs_classify(name: str, expected: list[tuple[HealthClass, Action]]) -> None:
    assert found(HEALTH / name) == expected


def test_dcgm_diag_json_software_failure_is_a_driver_finding() -> None:
    findings = classify((FIXTURES / "dcgm/dcgmi-diag-r1-j.dcgm-4.2.3.gb10.json").read_text())
    assert [(f.cls, f.action, f.source) for f in findings] == [
        (H.DRIVER, A.REIMAGE, Source.DCGM)]
    assert "Persistence mode for GPU 0 is disabled" in findings[0].evidence


def test_the_evidence_is_the_line_and_the_subject_names_the_gpu() -> None:
    lost = classify((HEALTH / "nvsentinel-155-dmesg-fallen-off-bus.log").read_text())
    assert lost[0].evidence.startswith("GPU 0000:b3:00.0: NVRM: fallen off the bus")
    pending = classify((HEALTH / "ml-engineering-nvsmi-q-a100-remap-pending.txt").read_text())
    assert pending[0].evidence == "GPU 00000000:10:1C.0: remapped rows / pending: Yes"
    sel = classify((HEALTH / "supermicro-sel-psu-failure.txt").read_text())
    # "Redundancy Lost" was deasserted at 539; the failed PSU's entries stand
    assert [f.evidence.split(" | ")[0] for f in sel] == ["536", "537"]


@pytest.mark.parametrize(("name", "source"), [
    ("gpud-dmesg-with-xid-119.log", Source.KERNEL_LOG),
    ("h200-580.159.04-nvsmi-q-ecc.txt", Source.NVIDIA_SMI),
    ("ml-engineering-nvsmi-q-sram-uncorrectable.txt", Source.NVIDIA_SMI),
    ("supermicro-sel-psu-failure.txt", Source.IPMI_SEL),
    ("ml-engineering-dcgmi-diag-deployment-error.txt", Source.DCGM),
    ("gpud-ibstat.47.0.h100.some.down.1.txt", Source.IBSTAT),
])
def test_the_kind_of_input_is_detected_from_its_content(name: str, source: Source) -> None:
    assert detect((HEALTH / name).read_text()) is source


def test_xid_catalogue_covers_the_issue_xids_with_nvidia_resolutions() -> None:
    named = (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, *range(144, 151),
             154)
    assert all(code in xid.CATALOG for code in named)
    assert (xid.lookup(79).cls, xid.lookup(79).action) == (H.GPU_LOST, A.RESTART_OS)
    assert xid.lookup(79).resolution == "RESTART_BM"
    assert (xid.lookup(48).cls, xid.lookup(48).action) == (H.GPU_MEMORY, A.RESET_GPU)
    assert xid.lookup(13).mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION"
    assert xid.lookup(54).action is A.SERVICE_REQUIRED   # CHECK_MECHANICALS
    assert xid.lookup(999).action is A.DRAIN             # unknown: look at it


def test_xid_154_takes_the_recovery_action_it_names() -> None:
    line = ("[  42.1] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 "
            "(None) to 0x2 (Node Reboot Required)")
    assert [(f.cls, f.action) for f in classify(line)] == [(H.GPU, A.RESTART_OS)]
    back = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 " \
           "(GPU Reset Required) to 0x0 (None)"
    assert [f.action for f in classify(back)] == [A.NONE]


def test_worst_and_line_format() -> None:
    findings = classify((HEALTH / "gpud-pr46-dmesg-ctime-xid13-109.log").read_text())
    assert worst(findings) is A.RESET_GPU and worst([]) is A.NONE
    line = Finding(H.LEAK, A.SERVICE_REQUIRED, "a\tb  c", Source.IPMI_SEL).line()
    assert line == "leak\tservice_required\ta b c"


def test_unparseable_input_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        classify('{"DCGM Diagnostic": ')
    with pytest.raises(InvalidRequest):
        classify("CA 'mlx5_0'\n\tgarbage line here\n")


def test_cli_prints_tab_separated_findings_and_exits_by_what_it_found(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sick = str(HEALTH / "gpud-dmesg-with-xid-119.log")
    healthy = str(HEALTH / "h200-580.159.04-nvsmi-q.txt")
    assert cli.main(["health", "classify", healthy]) == 0
    assert capsys.readouterr().out == ""
    assert cli.main(["health", "classify", healthy, sick]) == 1
    cls, action, evidence = capsys.readouterr().out.splitlines()[0].split("\t")
    assert (cls, action) == ("gpu", "reset_gpu") and "Xid (PCI:0000:9b:00): 119" in evidence
    binary = tmp_path / "core"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert cli.main(["health", "classify", str(tmp_path / "absent"), str(binary), sick]) == 2
    out = capsys.readouterr()
    assert out.out.startswith("gpu\treset_gpu\t") and out.err.count("provisioner: ") == 2


def test_cli_runs_offline_without_config_and_reads_stdin() -> None:
    text = (HEALTH / "nvsentinel-155-dmesg-fallen-off-bus.log").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "provisioner", "--config", "/nonexistent.toml", "health",
         "classify", "-"], input=text, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("gpu-lost\trestart_os\tGPU 0000:b3:00.0: ")
