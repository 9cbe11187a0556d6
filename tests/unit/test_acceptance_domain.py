"""The domain judge (provisioner.acceptance.domain) on recorded real outputs: the slowest
node is named, a missing tool, a killed test and a test that never reported each fail, a
profile's floor override applies, a domain-wide run is judged once for the domain."""

from __future__ import annotations

from pathlib import Path

from provisioner.acceptance.classes import CLASSES
from provisioner.acceptance.domain import DOMAIN, ToolRun, judge_domain, scope_of, with_overrides

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCCL = (FIXTURES / "acceptance" / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt"
        ).read_text()
# one figure changed: the capture's 476.96/476.98 GB/s lowered (a slow node)
SLOW = NCCL.replace("476.96", "401.50").replace("476.98", "401.52")
H200 = CLASSES["hgx-h200"]


def test_the_slowest_node_is_named_and_holds_the_domain() -> None:
    runs = [ToolRun("a", "nccl", 0, NCCL), ToolRun("b", "nccl", 0, SLOW)]
    verdict = judge_domain("d1", H200, ["a", "b"], {"a": ["nccl"], "b": ["nccl"]}, runs)
    assert not verdict.passed and verdict.slowest == "b"
    assert verdict.summary().startswith("fabric acceptance of d1 (hgx-h200) failed on 1 of 2: "
                                        "slowest b; b: nccl-tests busbw 401.50GB/s")
    assert verdict.to_json()["nodes"][0]["passed"] is True


def test_a_lower_floor_from_the_profile_passes_the_same_run() -> None:
    lower = with_overrides(H200, tolerance=None, floors={"nccl_busbw": 400.0},
                           source="profile nvl")
    runs = [ToolRun("a", "nccl", 0, NCCL), ToolRun("b", "nccl", 0, SLOW)]
    verdict = judge_domain("d1", lower, ["a", "b"], {"a": ["nccl"], "b": ["nccl"]}, runs)
    assert verdict.passed and verdict.slowest == "b"
    busbw = [f for n in verdict.nodes for f in n.figures if f.figure == "busbw"]
    assert {f.floor for f in busbw} == {"400GB/s"}
    assert all("[profile nvl]" in f.reason for f in busbw)


def test_missing_tool_killed_test_and_silence_each_fail() -> None:
    runs = [ToolRun("a", "dcgm", 127, "", "dcgmi: command not found"),
            ToolRun("b", "nccl", -15, "", timed_out=True, deadline_s=60)]
    verdict = judge_domain("d1", H200, ["a", "b"], {"a": ["dcgm"], "b": ["nccl", "dcgm"]},
                           runs)
    figures = {(n.node, f.test, f.figure): f for n in verdict.nodes for f in n.figures}
    assert not figures["a", "dcgm", "tool"].passed
    assert figures["a", "dcgm", "tool"].reason == ("dcgmi not found on the node: dcgmi: "
                                                   "command not found")
    assert figures["b", "nccl", "deadline"].floor == "60s"
    assert figures["b", "dcgm", "result"].reason == ("no result came back: the test did not "
                                                     "run")
    assert not verdict.passed


def test_a_domain_wide_run_is_judged_once_for_the_domain() -> None:
    assert scope_of(None, CLASSES["gb200-nvl72"].gpus) == "domain"
    assert scope_of(None, H200.gpus) == "node" and scope_of("domain", 8) == "domain"
    verdict = judge_domain("d1", H200, ["a", "b"], {"a": [], "b": [], DOMAIN: ["nccl"]},
                           [ToolRun(DOMAIN, "nccl", 0, NCCL)])
    (domain,) = [n for n in verdict.nodes if n.node == DOMAIN]
    assert domain.passed and verdict.passed and verdict.slowest is None
    nothing = judge_domain("d1", H200, ["a"], {"a": []}, [])
    assert not nothing.passed  # no figure at all is no pass
