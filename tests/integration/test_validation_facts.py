"""The facts the validation gate reads: the Ansible ``facts`` module carries ``nvidia-smi -q -x``
verbatim and its own verdict on ``dcgmi diag -r 1``; the daemon's agent API accepts them (up to
the size cap) and keeps them under ``node.facts["last_report"]``.

No GPU here: ``nvidia-smi`` and ``dcgmi`` are stand-in scripts that print a real capture
(tests/fixtures/topology/nvidia-smi/) and DCGM's JSON layout; the module itself runs for real,
as Ansible runs it on a node (a Python process given ``ANSIBLE_MODULE_ARGS``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.agent.facts import MAX_NVIDIA_SMI_XML_BYTES, FactsError, validate
from tests.integration.test_boot_http import (  # noqa: F401  (boot is a fixture)
    MAC,
    Boot,
    agent_args,
    boot,
    get_script,
    host_facts,
    post_facts,
)

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "playbooks" / "roles" / "facts" / "library" / "provisioner_node_facts.py"
A100_XML = (ROOT / "tests" / "fixtures" / "topology" / "nvidia-smi" /
            "telegraf-a100-sxm4-v12.xml").read_text()
DCGM_FAILED = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"status": "Pass"}]},
        {"name": "Permissions and OS Blocks", "results": [{"status": "Pass"}]}]},
    {"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Fail",
                                            "warnings": [{"warning": "DBE error"}]}]}]}]}}
DCGM_PASSED = {"DCGM Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "software", "test_summary": {"status": "Pass"},
                                          "results": [{"status": "Pass"}]}]}]}}


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def run_module(tmp_path: Path, **args: Any) -> dict[str, Any]:
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    done = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True,
                          text=True, timeout=120, check=False)
    result: dict[str, Any] = json.loads(done.stdout)
    assert not result.get("failed"), result
    return result


def fake_tools(tmp_path: Path, dcgm: dict[str, Any] | None, dcgm_rc: int) -> dict[str, str]:
    (tmp_path / "a100.xml").write_text(A100_XML)
    (tmp_path / "dcgm.json").write_text(json.dumps(dcgm) if dcgm is not None else "")
    smi = script(tmp_path / "nvidia-smi",
                 f'#!/bin/sh\n[ "$1 $2" = "-q -x" ] || exit 9\ncat {tmp_path}/a100.xml\n')
    dcgmi = script(tmp_path / "dcgmi", "#!/bin/sh\n"
                   '[ "$*" = "diag -r 1 -j" ] || { echo "unexpected: $*" >&2; exit 9; }\n'
                   f"cat {tmp_path}/dcgm.json\n"
                   "echo 'Error: unable to connect to host engine' >&2\n"
                   f"exit {dcgm_rc}\n")
    return {"nvidia_smi": str(smi), "dcgmi": str(dcgmi)}


@pytest.mark.parametrize(("dcgm", "rc", "expected"), [
    (DCGM_FAILED, 226, {"ran": True, "passed": False, "level": 1,
                        "summary": "failed: GPU Memory (GPU 0: DBE error)"}),
    (DCGM_PASSED, 0, {"ran": True, "passed": True, "level": 1,
                      "summary": "all tests passed"}),
    (None, 255, {"ran": False, "passed": False, "level": 1,
                 "summary": "Error: unable to connect to host engine"}),
], ids=["test-failed", "passed", "no-host-engine"])
def test_module_reports_nvidia_smi_xml_and_judges_dcgm(
        tmp_path: Path, dcgm: dict[str, Any] | None, rc: int, expected: dict[str, Any]) -> None:
    result = run_module(tmp_path, **fake_tools(tmp_path, dcgm, rc))
    report = result["report"]
    assert report["nvidia_smi_xml"] == A100_XML
    assert report["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"
    assert report["dcgm_diag"] == expected
    validate(report)  # the daemon's schema accepts what the module writes


def test_module_without_dcgmi_or_driver_reports_neither(tmp_path: Path) -> None:
    result = run_module(tmp_path, nvidia_smi=str(tmp_path / "absent-smi"),
                        dcgmi=str(tmp_path / "absent-dcgmi"))
    assert "nvidia_smi_xml" not in result["report"] and "dcgm_diag" not in result["report"]
    assert result["driver_up"] is False
    validate(result["report"])


def test_schema_caps_the_xml_and_checks_dcgm_fields() -> None:
    base = {"system": {"serial": "S"}, "cpu": {"cores": 1}, "memory_mib": 1, "nics": []}
    with pytest.raises(FactsError, match="nvidia_smi_xml: larger than"):
        validate(base | {"nvidia_smi_xml": "x" * (MAX_NVIDIA_SMI_XML_BYTES + 1)})
    with pytest.raises(FactsError, match="dcgm_diag.passed: missing"):
        validate(base | {"dcgm_diag": {"ran": True}})
    with pytest.raises(FactsError, match="dcgm_diag.ran: must be true or false"):
        validate(base | {"dcgm_diag": {"ran": "yes", "passed": True}})


async def test_the_daemon_keeps_a_multi_mib_report_under_last_report(boot: Boot) -> None:  # noqa: F811
    args = agent_args(await get_script(boot, MAC))
    node = await boot.store.nodes.find(MAC)
    # A big node's report: the real capture padded to 3 MiB (above the old 1 MiB body cap).
    padded = A100_XML.replace("</nvidia_smi_log>", "<!-- " + "p" * (3 << 20) + " -->\n"
                              "</nvidia_smi_log>")
    facts = host_facts(MAC, "S-XML") | {"nvidia_smi_xml": padded,
                                        "dcgm_diag": {"ran": True, "passed": True,
                                                      "summary": "all tests passed"}}
    status, _ = await post_facts(boot, args["token"], {"mac": MAC, "facts": facts})
    assert status == 200
    kept = (await boot.store.nodes.get(node.id)).facts["last_report"]
    assert kept["nvidia_smi_xml"] == padded and kept["dcgm_diag"]["passed"] is True

    too_big = facts | {"nvidia_smi_xml": "x" * (MAX_NVIDIA_SMI_XML_BYTES + 1)}
    status, body = await post_facts(boot, args["token"], {"mac": MAC, "facts": too_big})
    assert status == 422 and "nvidia_smi_xml: larger than 8388608 bytes" in body["detail"]
