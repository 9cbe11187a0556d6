"""The Ansible ``facts`` module names GPUs from real ``nvidia-smi -q -x`` captures of DTD v12
and v13, with ``pci_device_id`` written with ``0x`` (driver 535) and without (driver 580).

No GPU here: ``nvidia-smi`` is a stand-in script printing a real capture
(tests/fixtures/topology/nvidia-smi/, provenance in its README); the module runs for real, once
as a plain Python process (as the other facts tests do) and once through ``ansible`` itself, so
the role's ``module_utils`` (the device ID table) is proven to travel with the module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent.facts import validate
from provisioner.validation.checks import Expectation, evaluate
from tests.integration.test_validation_facts import run_module, script

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "topology" / "nvidia-smi"
ROLE = ROOT / "playbooks" / "roles" / "facts"

CAPTURES = [
    # file, DTD, device (the module's spelling), name
    ("h100-580.159.04-q-x.xml", "v13", "0x2330", "NVIDIA H100 80GB HBM3"),
    ("telegraf-a100-sxm4-v12.xml", "v12", "0x20b2", "NVIDIA A100-SXM4-80GB"),
    ("telegraf-rtx-3060-v12.xml", "v12", "0x2487", "NVIDIA GeForce RTX 3060"),
    ("telegraf-rtx-3080-v13.xml", "v13", "0x2216", "NVIDIA GeForce RTX 3080"),
]


def fake_smi(tmp_path: Path, capture: str) -> str:
    shutil.copyfile(FIXTURES / capture, tmp_path / "capture.xml")
    return str(script(tmp_path / "nvidia-smi",
                      f'#!/bin/sh\n[ "$1 $2" = "-q -x" ] || exit 9\ncat {tmp_path}/capture.xml\n'))


@pytest.mark.parametrize(("capture", "dtd", "device", "name"), CAPTURES,
                         ids=[c[0] for c in CAPTURES])
def test_module_reads_device_id_and_name(tmp_path: Path, capture: str, dtd: str, device: str,
                                         name: str) -> None:
    assert f"nvsmi_device_{dtd}.dtd" in (FIXTURES / capture).read_text()
    result = run_module(tmp_path, nvidia_smi=fake_smi(tmp_path, capture), dcgm_diag=False)
    (gpu,) = result["report"]["gpus"]
    assert (gpu["vendor"], gpu["device"], gpu["name"]) == ("0x10de", device, name)
    validate(result["report"])


def test_h100_capture_passes_an_h100_profile_and_fails_another(tmp_path: Path) -> None:
    result = run_module(tmp_path, nvidia_smi=fake_smi(tmp_path, CAPTURES[0][0]),
                        dcgm_diag=False)
    report = validate(result["report"])
    assert evaluate(report, Expectation(gpu_count=1, gpu_model="H100")).passed
    failed = evaluate(report, Expectation(gpu_count=1, gpu_model="H200"))
    assert failed.failures == ("gpu-model: saw 'NVIDIA H100 80GB HBM3' on 1 of 1 GPUs "
                               "(nvidia-smi), expected a model containing 'H200'",)


def test_module_through_ansible_carries_the_table(tmp_path: Path) -> None:
    """``ansible -m provisioner_node_facts`` with the role's library and module_utils: the
    H100 capture's ``233010DE`` gives device 0x2330 (was 0x0000)."""
    ansible = Path(sys.executable).parent / "ansible"
    if not ansible.exists():
        pytest.skip("ansible-core is not installed in this venv")
    smi = fake_smi(tmp_path, CAPTURES[0][0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")} | {
        "ANSIBLE_LIBRARY": str(ROLE / "library"),
        "ANSIBLE_MODULE_UTILS": str(ROLE / "module_utils"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "minimal",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_HOME": str(tmp_path / "home"),
        "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(ansible), "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", "provisioner_node_facts", "-a", f"nvidia_smi={smi} dcgm_diag=false"],
        capture_output=True, text=True, timeout=180, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # minimal callback: "localhost | SUCCESS => {...}"
    result: dict[str, Any] = json.loads(done.stdout.partition("SUCCESS =>")[2])
    (gpu,) = result["report"]["gpus"]
    assert (gpu["device"], gpu["name"]) == ("0x2330", "NVIDIA H100 80GB HBM3")


def test_module_keeps_nvidia_smis_lost_gpu_line_and_the_gate_fails(tmp_path: Path) -> None:
    """A GPU fell off the bus: nvidia-smi prints its line, the report of the others, and
    exits non-zero. The report is kept, the line too, and the gate names the GPU."""
    shutil.copyfile(FIXTURES / CAPTURES[0][0], tmp_path / "capture.xml")
    smi = script(tmp_path / "nvidia-smi", "#!/bin/sh\n"
                 "echo 'Unable to determine the device handle for GPU 0000:3b:00.0: GPU is "
                 "lost.  Reboot the system to recover this GPU' >&2\n"
                 f"cat {tmp_path}/capture.xml\nexit 15\n")
    result = run_module(tmp_path, nvidia_smi=str(smi), dcgm_diag=False)
    report = validate(result["report"])
    assert result["driver_up"] is True and len(report["gpus"]) == 1
    assert report["nvidia_smi_errors"] == [
        "Unable to determine the device handle for GPU 0000:3b:00.0: GPU is lost. Reboot the "
        "system to recover this GPU"]
    verdict = evaluate(report, Expectation(gpu_count=1, gpu_model="H100"))
    assert verdict.failures == (
        "gpu-lost: nvidia-smi: Unable to determine the device handle for GPU 0000:3b:00.0: "
        "GPU is lost. Reboot the system to recover this GPU",)


# DCGM's JSON (layouts cited in the module's judge_dcgm): DCGM 3 names GPUs "gpu_ids" under
# "DCGM GPU Diagnostic"; DCGM 4 "entity_id" under "DCGM Diagnostic", with a test_summary.
DCGM3_FAIL = {"DCGM GPU Diagnostic": {"version": "3.3.9", "test_categories": [
    {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
    {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
        {"gpu_ids": "0", "status": "Pass"},
        {"gpu_ids": "3", "status": "Fail", "warnings": [
            {"warning": "Found 2 uncorrectable ECC errors (DBE) on GPU 3.", "error_id": 28,
             "error_category": 4, "error_severity": 2}],
         "info": "Allocated 95% of the framebuffer"}]}]},
    {"category": "Integration", "tests": [{"name": "PCIe", "results": [
        {"gpu_ids": "5", "status": "Fail", "warnings": [
            {"warning": "GPU 5 PCIe link width degraded: x8, expected x16", "error_id": 50}]}]}]},
]}}
DCGM4_FAIL = {"DCGM Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "software", "test_summary": {"status": "Pass"},
                                          "results": [{"status": "Pass"}]}]},
    {"category": "Stress", "tests": [{"name": "targeted_stress",
                                      "test_summary": {"status": "Fail"}, "results": [
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 2, "status": "Fail",
         "warnings": [{"warning": "GPU 2 failed to reach the target of 1500 GFLOPS: 900",
                       "error_id": 82, "error_category": 1, "error_severity": 2}]},
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Pass"}]}]}]},
    "metadata": {"version": "4.2.3"}}
DCGM4_PASS = {"DCGM Diagnostic": {"test_categories": [
    {"category": "Hardware", "tests": [{"name": "memory", "test_summary": {"status": "Pass"},
                                        "results": [{"entity_id": 0, "status": "Pass"}]}]}]},
    "metadata": {"version": "4.2.3"}}


@pytest.mark.parametrize(("level", "doc", "rc", "summary"), [
    (1, DCGM3_FAIL, 226,
     "failed: GPU Memory (GPU 3: Found 2 uncorrectable ECC errors (DBE) on GPU 3.); "
     "PCIe (GPU 5: GPU 5 PCIe link width degraded: x8, expected x16)"),
    (2, DCGM4_FAIL, 226,
     "failed: targeted_stress (GPU 2: GPU 2 failed to reach the target of 1500 GFLOPS: 900)"),
    (3, DCGM4_PASS, 0, "all tests passed"),
], ids=["dcgm3-r1", "dcgm4-r2", "dcgm4-r3"])
def test_dcgm_judge_keeps_dcgms_own_reason(tmp_path: Path, level: int, doc: dict[str, Any],
                                           rc: int, summary: str) -> None:
    (tmp_path / "dcgm.json").write_text(json.dumps(doc, indent=1))
    dcgmi = script(tmp_path / "dcgmi", "#!/bin/sh\n"
                   f'[ "$*" = "diag -r {level} -j" ] || {{ echo "unexpected: $*" >&2; exit 9; }}\n'
                   f"cat {tmp_path}/dcgm.json\nexit {rc}\n")
    result = run_module(tmp_path, nvidia_smi=fake_smi(tmp_path, CAPTURES[0][0]),
                        dcgmi=str(dcgmi), dcgm_level=level)
    report = validate(result["report"])
    assert report["dcgm_diag"] == {"ran": True, "passed": rc == 0, "level": level,
                                   "summary": summary}
    verdict = evaluate(report, Expectation(require_dcgm=True))
    if rc:
        assert verdict.failures == (f"dcgm: dcgmi diag -r {level} failed: {summary}, "
                                    "expected a pass",)
    else:
        assert verdict.passed


def fake_systemctl(tmp_path: Path, units: dict[str, tuple[str, str]]) -> str:
    """A systemctl answering ``is-enabled``/``is-active`` as systemd does (a unit not
    installed: ``is-enabled`` fails with "not-found" on stderr)."""
    cases = "".join(f'  "is-enabled {unit}") echo {enabled};;\n'
                    f'  "is-active {unit}") echo {active};;\n'
                    for unit, (enabled, active) in units.items())
    return str(script(tmp_path / "systemctl", "#!/bin/sh\ncase \"$1 $2\" in\n" + cases +
                      '  "is-enabled "*) echo "Failed to get unit file state for $2: No such '
                      'file or directory" >&2; exit 1;;\n'
                      '  *) echo inactive; exit 3;;\nesac\n'))


@pytest.mark.parametrize(("units", "imex_installed", "failures"), [
    ({"nvidia-imex.service": ("masked", "inactive")}, True, []),
    ({"nvidia-imex.service": ("enabled", "active"),
      "nvidia-fabricmanager.service": ("enabled", "active")}, True, [
        "imex: host nvidia-imex.service is enabled (active), expected masked: the NVIDIA DRA "
        "driver runs IMEX in its ComputeDomains",
        "imex: host nvidia-fabricmanager.service is enabled (active), expected none on a "
        "GB200/GB300 compute tray (its NVLink switch trays manage the fabric)"]),
    ({}, False, [
        "imex: the nvidia-imex package is not installed, expected it (multi-node NVLink "
        "needs IMEX)",
        "imex: host nvidia-imex.service is not-found (inactive), expected masked: the NVIDIA "
        "DRA driver runs IMEX in its ComputeDomains"]),
], ids=["ready-for-dra", "host-imex-and-fabric-manager", "no-imex"])
def test_imex_prerequisites_of_a_gb200_tray(tmp_path: Path, units: dict[str, tuple[str, str]],
                                            imex_installed: bool, failures: list[str]) -> None:
    imex = tmp_path / "nvidia-imex"
    if imex_installed:
        script(imex, "#!/bin/sh\nexit 0\n")
    result = run_module(tmp_path, nvidia_smi=fake_smi(tmp_path, CAPTURES[0][0]),
                        dcgm_diag=False, systemctl=fake_systemctl(tmp_path, units),
                        imex_binary=str(imex))
    report = validate(result["report"])
    verdict = evaluate(report, Expectation(imex="dra"))
    assert list(verdict.failures) == failures
    assert "imex" in verdict.checks


GB10_DIAG = ROOT / "tests" / "fixtures" / "dcgm" / "dcgmi-diag-r1-j.dcgm-4.2.3.gb10.json"
GB10_WARNING = ("Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence "
                'mode by running "nvidia-smi -i <gpuId> -pm 1 " as root.')


@pytest.mark.parametrize("shape", ["as-captured", "warnings-a-string"])
def test_dcgm_warnings_keep_their_words_whatever_their_shape(tmp_path: Path, shape: str) -> None:
    """A real ``dcgmi diag -r 1 -j`` (tests/fixtures/dcgm/README.md); a ``warnings`` that is
    one string (issue 22: summarised as ``C; a; n; n; o; t``) is one warning too."""
    doc = json.loads(GB10_DIAG.read_text())
    if shape == "warnings-a-string":
        (result,) = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"]
        result["warnings"] = result["warnings"][0]["warning"]
    (tmp_path / "dcgm.json").write_text(json.dumps(doc, indent=1))
    dcgmi = script(tmp_path / "dcgmi", f"#!/bin/sh\ncat {tmp_path}/dcgm.json\nexit 226\n")
    result = run_module(tmp_path, nvidia_smi=fake_smi(tmp_path, CAPTURES[0][0]),
                        dcgmi=str(dcgmi), dcgm_level=1)
    report = validate(result["report"])
    summary = f"failed: software (GPU 0: {GB10_WARNING})"
    assert report["dcgm_diag"] == {"ran": True, "passed": False, "level": 1,
                                   "summary": summary}
    assert evaluate(report, Expectation()).failures == (
        f"dcgm: dcgmi diag -r 1 failed: {summary}, expected a pass",)
