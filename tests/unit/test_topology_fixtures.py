"""Every file under tests/fixtures/topology/ has a parser, and parses (or, for the ones that
record a tool's failure, gives the parse error its README promises). A new fixture without
an entry here fails the suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest

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
from tests.topology_support.nvsmi import FIXTURES

OK = ""
COVERAGE: dict[str, tuple[Callable[[str], object], str]] = {
    "infiniband/topograph-ibnetdiscover-example.out": (parse_ibnetdiscover, OK),
    "infiniband/topograph-ibnetdiscover-example-bad.out": (parse_ibnetdiscover, OK),
    "infiniband/treydock-ibnetdiscover-ports-test.out": (parse_ibnetdiscover, OK),
    "infiniband/treydock-ibnetdiscover-ports-test2.out": (parse_ibnetdiscover, OK),
    "infiniband/gpud-ibstat.47.0.h100.all.active.0.txt": (parse_ibstat, OK),
    "infiniband/gpud-ibstat.47.0.h100.some.down.0.txt": (parse_ibstat, OK),
    "infiniband/hpc-notes-ibstat.h100.cx7-ndr-bond.txt": (parse_ibstat, OK),
    "infiniband/linux-rdma-ibstat.rdma-dev-19.bond.txt": (parse_ibstat, OK),
    "infiniband-sim/fattree.net": (parse_ibnetdiscover, OK),
    "infiniband-sim/fattree-hdr.net": (parse_ibnetdiscover, OK),
    "infiniband-sim/console-faults.txt": (lambda text: text.splitlines(), OK),  # ibsim input
    "infiniband-sim/healthy/ibhosts.txt": (parse_ibnetdiscover, OK),
    "infiniband-sim/healthy/ibswitches.txt": (parse_ibnetdiscover, OK),
    "infiniband-sim/healthy/ibnetdiscover.txt": (parse_ibnetdiscover, OK),
    "infiniband-sim/healthy/ibnetdiscover-ports.txt": (parse_ibnetdiscover, OK),
    "infiniband-sim/healthy/ibnetdiscover-list.txt": (parse_ibnetdiscover, OK),
    "infiniband-sim/healthy/iblinkinfo.txt": (parse_iblinkinfo, OK),
    "infiniband-sim/healthy/iblinkinfo-switches-only.txt": (parse_iblinkinfo, OK),
    "infiniband-sim/healthy/ibqueryerrors.txt": (parse_ibqueryerrors, OK),
    "infiniband-sim/healthy/ibroute-leaf01.txt": (parse_ibroute, OK),
    "infiniband-sim/healthy/ibstat.txt": (parse_ibstat, OK),
    "infiniband-sim/healthy/ibstatus.txt": (parse_ibstatus, "ibstatus reported"),
    "infiniband-sim/healthy/ibtracert.txt": (parse_ibtracert, OK),
    "infiniband-sim/healthy/perfquery.txt": (parse_perfquery, OK),
    "infiniband-sim/healthy/saquery-nodes.txt": (parse_saquery_nodes, OK),
    "infiniband-sim/healthy/sminfo.txt": (parse_sminfo, OK),
    "infiniband-sim/faults/iblinkinfo.txt": (parse_iblinkinfo, OK),
    "infiniband-sim/faults/ibnetdiscover.txt": (parse_ibnetdiscover, OK),
    "infiniband-sim/faults/ibqueryerrors.txt": (parse_ibqueryerrors, OK),
    "infiniband-sim/faults/perfquery-leaf02-p5.txt": (parse_perfquery, OK),
    "nvidia-smi/telegraf-a100-sxm4-v12.xml": (parse_nvidia_smi, OK),
    "nvidia-smi/telegraf-rtx-3060-v12.xml": (parse_nvidia_smi, OK),
    "nvidia-smi/telegraf-rtx-3080-v13.xml": (parse_nvidia_smi, OK),
    "nvidia-smi/h100-580.159.04-q-x.xml": (parse_nvidia_smi, OK),
    "nvidia-smi/gpud-nvidia-smi-q.535.161.08.h100x8.txt": (parse_nvidia_smi, OK),
    "nvidia-smi/gpud-nvidia-smi-q.560.35.03.titanv.txt": (parse_nvidia_smi, OK),
    "nvidia-smi/gpud-nvidia-smi-nvlink-status.a100.txt": (parse_nvlink_status, OK),
    "nvidia-smi/h200-580.159.04-q-x.xml": (parse_nvidia_smi, OK),
    "nvidia-smi/h200-580.159.04-q.txt": (parse_nvidia_smi, OK),
    "nvidia-smi/h200-580.159.04-topo-m.txt": (parse_nvidia_smi_topo, OK),
    "nvidia-smi/thamada-nvidia-smi-q.565.57.01.h100x8.txt": (parse_nvidia_smi, OK),
    **{f"nvidia-smi/{name}": (parse_nvidia_smi, OK) for name in (
        "h200-580.159.04-q-x.fabric-completed.xml", "h200-580.159.04-q-x.fabric-in-progress.xml",
        "h200-580.159.04-q-x.fabric-insufficient-resources.xml",
        "h200-580.159.04-q-x.recovery-gpu-reset.xml",
        "thamada-nvidia-smi-q.565.57.01.h100x8.fabric-in-progress.txt",
        "thamada-nvidia-smi-q.565.57.01.h100x8.fabric-insufficient-resources.txt")},
    "synthetic/topo-m-h100x8.txt": (parse_nvidia_smi_topo, OK),
    **{f"synthetic/nvidia-smi-nvl/gpu-node-{n:02d}{('.xml', '.txt', '.csv')[n % 3]}":
       (parse_nvidia_smi, OK) for n in range(1, 16)},
}


def test_every_fixture_has_a_parser() -> None:
    files = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*")
             if p.is_file() and p.name != "README.md"}
    assert files == set(COVERAGE)


@pytest.mark.parametrize("relative", sorted(COVERAGE))
def test_fixture_parses(relative: str) -> None:
    parse, expected_error = COVERAGE[relative]
    text = (FIXTURES / relative).read_text(encoding="utf-8")
    if not expected_error:
        assert parse(text) is not None
        return
    with pytest.raises(TopologyParseError) as caught:
        parse(text)
    assert expected_error in str(caught.value)


def test_every_copied_file_keeps_its_provenance() -> None:
    for directory in ("infiniband", "infiniband-sim", "nvidia-smi", "synthetic"):
        readme = (FIXTURES / directory / "README.md").read_text(encoding="utf-8")
        for path in (FIXTURES / directory).iterdir():
            if path.is_file() and path.name != "README.md" and directory != "infiniband-sim":
                assert path.name in readme, f"{path} has no provenance line"
