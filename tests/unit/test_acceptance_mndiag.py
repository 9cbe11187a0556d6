"""``dcgmi mndiag`` in fabric acceptance (GB200/GB300 NVL72): judged by its exit status only,
its output kept verbatim. Each case of the judge (passed, failed, not available, required but
not available, dcgmi missing, killed at its deadline, never reported), which profiles get it,
how the launcher reads it back, and the node-side runner's probe.

No output of a real ``dcgmi mndiag`` run is public, so ``STAND_IN`` below is a stand-in, not a
capture: the judge does not read it beyond checking that it is JSON. ``INVALID`` is the answer
of a dcgmi without the subsystem as NVIDIA/DCGM ``dcgmi/CommandLineParser.cpp`` writes it
(``ERROR: Invalid subsystem.``, then the usage; exit status DCGM_ST_BADPARAM, -2: 254).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.acceptance.classes import CLASSES
from provisioner.acceptance.domain import DOMAIN, ToolRun, judge_domain
from provisioner.acceptance.mndiag import KEEP_BYTES
from provisioner.config import AcceptanceProfile, ValidationProfile, ValidationSettings
from provisioner.errors import ConfigError
from provisioner.install.acceptance import read_results
from provisioner.lifecycle.acceptance import check_fabric_classes, expected_tests, with_mndiag

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "playbooks" / "files" / "acceptance_tool.py"
GB200 = CLASSES["gb200-nvl72"]
NODES = ["gb-01", "gb-02"]
EXPECTED = {"gb-01": [], "gb-02": [], DOMAIN: ["mndiag"]}
# A stand-in (not a capture: no real mndiag output is public); any JSON document would do.
STAND_IN = json.dumps({"stand-in": "not a dcgmi mndiag capture", "hosts": NODES}, indent=1)
INVALID = "ERROR: Invalid subsystem.\n\nUsage: dcgmi\n"
VERSION = "dcgmi  version: 4.2.3"  # as TCLAP's StdOutput::version writes it


def verdict(run: ToolRun, *, required: bool = False):  # type: ignore[no-untyped-def]
    return judge_domain("d1", GB200, NODES, EXPECTED, [run], mndiag_required=required)


def domain_figure(run: ToolRun, *, required: bool = False):  # type: ignore[no-untyped-def]
    v = verdict(run, required=required)
    (figure,) = [f for n in v.nodes if n.node == DOMAIN for f in n.figures]
    return v, figure


def test_exit_0_passes_and_its_json_is_kept_verbatim() -> None:
    v, figure = domain_figure(ToolRun(DOMAIN, "mndiag", 0, STAND_IN, version=VERSION))
    assert v.passed and figure.passed and (figure.test, figure.value) == ("dcgmi-mndiag", "0")
    assert figure.reason == "mnubergemm passed; its JSON kept"
    kept = v.to_json()["reports"]["mndiag"]
    assert kept == {"output": STAND_IN, "valid_json": True, "bytes": len(STAND_IN),
                    "truncated": False}


def test_a_non_zero_exit_fails_with_the_end_of_its_output() -> None:
    out = STAND_IN + "\nmnubergemm: " + "x" * 400 + " rank 37 on gb-02 lost its peer"
    v, figure = domain_figure(ToolRun(DOMAIN, "mndiag", 1, out, "mpirun noticed"))
    assert not v.passed and not figure.passed and (figure.value, figure.floor) == ("1", "0")
    assert figure.reason.startswith("dcgmi mndiag exited 1: ...")
    assert figure.reason.endswith("rank 37 on gb-02 lost its peer")
    assert len(figure.reason) < 340
    assert "(domain): dcgmi-mndiag exit 1 (floor 0): dcgmi mndiag exited 1" in v.summary()
    assert v.to_json()["reports"]["mndiag"]["valid_json"] is False  # kept all the same


def test_a_dcgm_without_mndiag_is_not_available_and_does_not_fail() -> None:
    run = ToolRun(DOMAIN, "mndiag", 254, "", available=False, version=VERSION, probe=INVALID)
    v, figure = domain_figure(run)
    assert v.passed and figure.passed and figure.value == "not available"
    assert figure.reason.startswith("not available: DCGM 4.2.3 has no mndiag "
                                    "(`dcgmi mndiag --help`: ERROR: Invalid subsystem.")
    assert v.to_json()["reports"] == {}


def test_required_mndiag_fails_where_dcgm_has_none() -> None:
    run = ToolRun(DOMAIN, "mndiag", 254, "", available=False, probe=INVALID)
    v, figure = domain_figure(run, required=True)
    assert not v.passed and not figure.passed
    assert figure.reason.startswith("not available: DCGM (version unknown) has no mndiag")
    assert figure.reason.endswith('the profile requires it (mndiag = "require")')


def test_missing_dcgmi_killed_run_and_silence_each_fail() -> None:
    _, missing = domain_figure(ToolRun(DOMAIN, "mndiag", 127, "", "dcgmi: command not found"))
    assert not missing.passed and missing.reason.startswith("dcgmi not found on the node")
    _, killed = domain_figure(ToolRun(DOMAIN, "mndiag", -15, "{", timed_out=True,
                                      deadline_s=30))
    assert not killed.passed and (killed.figure, killed.floor) == ("deadline", "30s")
    silent = judge_domain("d1", GB200, NODES, EXPECTED, [])
    (figure,) = [f for n in silent.nodes if n.node == DOMAIN for f in n.figures]
    assert not silent.passed and figure.reason == "no result came back: the test did not run"


def test_an_exit_0_output_that_is_not_json_passes_and_a_long_one_is_bounded() -> None:
    long = "mnubergemm " * (KEEP_BYTES // 5)
    v, figure = domain_figure(ToolRun(DOMAIN, "mndiag", 0, long))
    assert figure.passed and figure.reason.endswith("its output kept; it is not valid JSON")
    kept = v.to_json()["reports"]["mndiag"]
    assert kept["truncated"] and kept["bytes"] == len(long)
    assert kept["output"] == long[:KEEP_BYTES]


def profile(cls: str, **values: object) -> AcceptanceProfile:
    return AcceptanceProfile(fabric_class=cls, **values)  # type: ignore[arg-type]


def test_nvl72_classes_get_mndiag_unless_off_and_it_runs_for_the_domain() -> None:
    assert GB200.mndiag and CLASSES["gb300-nvl72"].mndiag
    assert not any(c.mndiag for n, c in CLASSES.items() if not n.endswith("-nvl72"))
    on = with_mndiag(profile("gb200-nvl72"), GB200)
    assert on.tests == ["dcgm", "nvbandwidth", "nccl", "mndiag"]
    assert expected_tests(on, NODES, "domain")[DOMAIN] == ["nccl", "mndiag"]
    assert expected_tests(on, NODES, "node")[DOMAIN] == ["mndiag"]
    off = with_mndiag(profile("gb200-nvl72", mndiag="off", tests=["dcgm", "mndiag"]), GB200)
    assert off.tests == ["dcgm"] and DOMAIN not in expected_tests(off, NODES, "node")
    h200 = profile("hgx-h200")
    assert with_mndiag(h200, CLASSES["hgx-h200"]) is h200


@pytest.mark.parametrize("values", [{"mndiag": "require"}, {"tests": ["dcgm", "mndiag"]}])
def test_mndiag_on_a_class_without_it_is_a_config_error(values: dict[str, object]) -> None:
    settings = ValidationSettings(profiles={"hgx": ValidationProfile(
        acceptance=profile("hgx-h200", **values))})
    with pytest.raises(ConfigError, match="GB200/GB300 NVL72 classes only"):
        check_fabric_classes(settings)


def test_the_launcher_reads_mndiag_back_as_the_domains(tmp_path: Path) -> None:
    (tmp_path / "gb-01.json").write_text(json.dumps({
        "dcgm": {"rc": 0, "stdout": "{}"},
        "mndiag": {"rc": 254, "stdout": "", "available": False, "version": VERSION,
                   "probe": {"rc": 254, "stdout": INVALID, "stderr": ""}}}))
    runs = {(r.node, r.test): r for r in read_results(tmp_path, ["gb-01"])}
    mndiag = runs[DOMAIN, "mndiag"]
    assert (mndiag.available, mndiag.version, mndiag.probe) == (False, VERSION, INVALID)
    assert runs["gb-01", "dcgm"].available  # no probe: available


def run_tool(tmp_path: Path, probe: list[str], tool: list[str]) -> dict[str, object]:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(TOOL), "run", "--probe", json.dumps(probe),
                           "--about", json.dumps(["echo", VERSION]), str(out), "mndiag", "20",
                           "r1", "--", *tool], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads((out / "mndiag.json").read_text())
    return result


def test_the_node_side_runner_runs_the_tool_only_where_the_probe_passes(
        tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tool = ["sh", "-c", f"touch {marker}; echo '{{}}'; exit 3"]
    absent = run_tool(tmp_path, ["sh", "-c", f"printf '{INVALID}'; exit 254"], tool)
    assert absent["available"] is False and absent["rc"] == 254 and not marker.exists()
    assert absent["version"] == " ".join(VERSION.split())
    assert absent["probe"] == {"rc": 254, "stdout": INVALID, "stderr": ""}
    present = run_tool(tmp_path, ["true"], tool)
    assert present["available"] is True and present["rc"] == 3 and marker.exists()
    assert present["stdout"] == "{}\n"
    missing = run_tool(tmp_path, ["true"], ["no-such-dcgmi-here", "mndiag"])
    assert missing["rc"] == 127 and "available" not in missing
