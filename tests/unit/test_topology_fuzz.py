"""Every parser is total: random text and mutated fixtures give a record or a
TopologyParseError with a line number, never another exception (hypothesis)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.topology.model import TopologyParseError
from provisioner.topology.parse_ibdiag import (
    parse_ibqueryerrors,
    parse_ibroute,
    parse_ibtracert,
    parse_perfquery,
    parse_saquery_nodes,
    parse_sminfo,
)
from provisioner.topology.parse_iblinkinfo import parse_iblinkinfo
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover
from provisioner.topology.parse_ibstat import parse_ibstat, parse_ibstatus
from provisioner.topology.parse_nvsmi_text import parse_nvidia_smi
from provisioner.topology.parse_nvsmi_topo import parse_nvidia_smi_topo, parse_nvlink_status
from provisioner.topology.parse_sysfs import parse_sysfs
from tests.topology_support import nvsmi
from tests.topology_support.nvsmi import FIXTURES

Parser = Callable[[str], object]
EXAMPLES = int(os.environ.get("TOPO_FUZZ_EXAMPLES", "60"))   # raise it for a long local run
SMALL = 20_000   # mutate the first 20 kB of the big fixtures: enough structure, fast runs

PARSERS: dict[str, tuple[Parser, list[str]]] = {
    "ibnetdiscover": (parse_ibnetdiscover, [
        "infiniband-sim/healthy/ibnetdiscover.txt",
        "infiniband-sim/healthy/ibnetdiscover-ports.txt",
        "infiniband-sim/healthy/ibnetdiscover-list.txt", "infiniband-sim/fattree-hdr.net",
        "infiniband/topograph-ibnetdiscover-example.out",
        "infiniband/treydock-ibnetdiscover-ports-test2.out"]),
    "iblinkinfo": (parse_iblinkinfo, ["infiniband-sim/healthy/iblinkinfo.txt",
                                      "infiniband-sim/healthy/iblinkinfo-switches-only.txt"]),
    "ibstat": (parse_ibstat, ["infiniband/gpud-ibstat.47.0.h100.some.down.0.txt"]),
    "ibstatus": (parse_ibstatus, ["infiniband-sim/healthy/ibstatus.txt"]),
    "ibqueryerrors": (parse_ibqueryerrors, ["infiniband-sim/faults/ibqueryerrors.txt"]),
    "perfquery": (parse_perfquery, ["infiniband-sim/faults/perfquery-leaf02-p5.txt"]),
    "sminfo": (parse_sminfo, ["infiniband-sim/healthy/sminfo.txt"]),
    "saquery": (parse_saquery_nodes, ["infiniband-sim/healthy/saquery-nodes.txt"]),
    "ibroute": (parse_ibroute, ["infiniband-sim/healthy/ibroute-leaf01.txt"]),
    "ibtracert": (parse_ibtracert, ["infiniband-sim/healthy/ibtracert.txt"]),
    "nvidia-smi": (parse_nvidia_smi, ["nvidia-smi/telegraf-a100-sxm4-v12.xml",
                                      "nvidia-smi/telegraf-rtx-3080-v13.xml",
                                      "nvidia-smi/gpud-nvidia-smi-q.560.35.03.titanv.txt",
                                      "synthetic/nvidia-smi-nvl/gpu-node-02.csv"]),
    "topo-m": (parse_nvidia_smi_topo, ["synthetic/topo-m-h100x8.txt"]),
    "nvlink": (parse_nvlink_status, ["nvidia-smi/gpud-nvidia-smi-nvlink-status.a100.txt"]),
}


def assert_total(parse: Parser, text: str) -> None:
    """``parse(text)`` gives a record or a TopologyParseError with a line number and a
    reason; any other exception fails the test."""
    try:
        parse(text)
    except TopologyParseError as exc:
        assert exc.line >= 0 and exc.reason


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    lines = text.splitlines(keepends=True) or [""]
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, max(len(lines) - 1, 0)))
        action = draw(st.sampled_from(["drop", "dup", "swap", "char", "insert", "cut"]))
        line = lines[index] if lines else ""
        if action == "drop" and lines:
            lines.pop(index)
        elif action == "dup":
            lines.insert(index, line)
        elif action == "swap" and lines:
            other = draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        elif action in ("char", "cut") and line:
            at = draw(st.integers(0, len(line) - 1))
            junk = draw(st.text(min_size=0, max_size=3)) if action == "char" else ""
            lines[index] = line[:at] + junk + (line[at + 1:] if action == "char" else "\n")
        else:
            lines.insert(index, draw(st.text(max_size=30)) + "\n")
    return "".join(lines)


def _fixture(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")[:SMALL]


CASES = [(name, relative) for name, (_, files) in PARSERS.items() for relative in files]


@pytest.mark.parametrize(("name", "relative"), CASES, ids=[f"{n}:{Path(r).name}"
                                                          for n, r in CASES])
def test_mutated_fixtures(name: str, relative: str) -> None:
    parse, text = PARSERS[name][0], _fixture(relative)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mutated(text))
    def run(sample: str) -> None:
        assert_total(parse, sample)

    run()


@pytest.mark.parametrize("name", list(PARSERS))
def test_random_text(name: str) -> None:
    parse = PARSERS[name][0]

    @settings(max_examples=150, deadline=None)
    @given(st.text(max_size=300) | st.text(alphabet="[]()\"'#:;=<>-0x1aSWCHR \t\n", max_size=300))
    def run(sample: str) -> None:
        assert_total(parse, sample)

    run()


@settings(max_examples=100, deadline=None)
@given(st.builds(nvsmi.gpus, st.integers(0, 99), st.integers(0, 8),
                 clique=st.text(max_size=5), cluster=st.text(max_size=40),
                 state=st.text(max_size=12)), st.sampled_from([nvsmi.xml, nvsmi.text, nvsmi.csv]))
def test_generated_reports_with_odd_values(gpus: list[nvsmi.FakeGpu],
                                           render: Callable[[list[nvsmi.FakeGpu]], str]) -> None:
    assert_total(parse_nvidia_smi, render(gpus))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z0-9_]{1,6}(/ports/[0-9x]{1,2})?/[a-z_]{1,10}",
                                     fullmatch=True), st.text(max_size=40), max_size=12))
def test_sysfs_mappings(files: dict[str, str]) -> None:
    assert_total(lambda _text: parse_sysfs(files), "")


def test_huge_and_binary_inputs_are_refused_with_a_reason() -> None:
    with pytest.raises(TopologyParseError) as caught:
        parse_ibnetdiscover("Switch 36 \"S-01\"\n\x00")
    assert caught.value.line == 2 and "NUL" in caught.value.reason
