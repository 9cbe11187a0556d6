"""Each parser on the recorded fixtures, and its errors (line number and reason)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.topology.model import NodeKind, PortState, TopologyParseError
from provisioner.topology.parse_ibdiag import (
    parse_ibqueryerrors,
    parse_ibroute,
    parse_ibtracert,
    parse_perfquery,
    parse_saquery_nodes,
    parse_sminfo,
)
from provisioner.topology.parse_iblinkinfo import parse_iblinkinfo
from provisioner.topology.parse_ibnetdiscover import parse_ibnetdiscover, parse_topology_file
from provisioner.topology.parse_ibstat import parse_ibstat, parse_ibstatus
from provisioner.topology.parse_nvsmi_text import (
    parse_nvidia_smi,
    parse_nvidia_smi_csv,
    parse_nvidia_smi_text,
)
from provisioner.topology.parse_nvsmi_topo import parse_nvidia_smi_topo, parse_nvlink_status
from provisioner.topology.parse_nvsmi_xml import parse_nvidia_smi_xml
from provisioner.topology.parse_sysfs import parse_sysfs, read_sysfs_tree
from tests.topology_support import nvsmi
from tests.topology_support.nvsmi import FIXTURES

IB, SIM, NV = FIXTURES / "infiniband", FIXTURES / "infiniband-sim", FIXTURES / "nvidia-smi"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# -- ibnetdiscover --------------------------------------------------------------------------


def test_ibnetdiscover_default_form() -> None:
    scan = parse_ibnetdiscover(read(SIM / "healthy/ibnetdiscover.txt"))
    kinds = [n.kind for n in scan.nodes]
    assert kinds.count(NodeKind.SWITCH) == 6 and kinds.count(NodeKind.CA) == 16
    assert len(scan.links) == 24          # 16 HCA links + 8 leaf-spine, each seen twice
    leaf4 = next(n for n in scan.nodes if n.description == "ib-leaf-04")
    assert (leaf4.guid, leaf4.ports, leaf4.lid) == ("0000000000200003", 36, 6)
    assert {str(link.rate) for link in scan.links} == {"4xHDR"}


def test_ibnetdiscover_ports_and_list_forms_describe_the_same_fabric() -> None:
    ports = parse_ibnetdiscover(read(SIM / "healthy/ibnetdiscover-ports.txt"))
    listed = parse_ibnetdiscover(read(SIM / "healthy/ibnetdiscover-list.txt"))
    assert len(ports.links) == 24 and len(ports.idle_ports) == 6 * 36 - 6 * 4 - 8
    assert sorted(n.description for n in ports.nodes) == sorted(n.description
                                                                for n in listed.nodes)
    assert not listed.links
    assert all(p.state is PortState.DOWN for p in ports.idle_ports)


def test_ibsim_net_files_use_the_same_grammar() -> None:
    for name in ("fattree.net", "fattree-hdr.net"):
        scan = parse_topology_file(read(SIM / name))
        assert len(scan.nodes) == 22 and len(scan.links) == 24
        assert any(n.guid == "id:gpu-node-01 mlx5_0" for n in scan.nodes)


def test_real_ndr_superpod() -> None:
    scan = parse_ibnetdiscover(read(IB / "topograph-ibnetdiscover-example.out"))
    switches = [n for n in scan.nodes if n.kind is NodeKind.SWITCH]
    assert len(switches) == 40
    assert "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" in {s.description for s in switches}
    assert {str(link.rate) for link in scan.links} == {"4xNDR"}


def test_treydock_ports_forms() -> None:
    first = parse_ibnetdiscover(read(IB / "treydock-ibnetdiscover-ports-test.out"))
    assert {n.description for n in first.nodes} >= {"o0001 HCA-1", "ib-i1l1s01"}
    assert {str(link.rate) for link in first.links} == {"4xEDR"}
    second = parse_ibnetdiscover(read(IB / "treydock-ibnetdiscover-ports-test2.out"))
    assert "5FB0406-spine-IB02" in {n.description for n in second.nodes}   # blanks stripped


def test_ibhosts_and_ibswitches_read_as_lists() -> None:
    assert len(parse_ibnetdiscover(read(SIM / "healthy/ibhosts.txt")).nodes) == 16
    switches = parse_ibnetdiscover(read(SIM / "healthy/ibswitches.txt")).nodes
    assert {n.lid for n in switches} == {2, 3, 4, 6, 7, 9}


@pytest.mark.parametrize(("text", "line", "reason"), [
    ("Switch 36 \"S-0000000000200000\"\n[1] garbage\n", 2, "not an ibnetdiscover line"),
    ("[1]\t\"S-01\"[1]\n", 1, "before any Switch/Ca"),
    ("Switch 36 \"\"\n", 1, "empty device id"),
    ("Ca 1 \"H-01\"\n[7](1)\t\"S-02\"[1]\n", 2, "beyond the device's port count"),
    ("Ca 1 \"H-01\"\nCa 1 \"H-01\"\n", 2, "listed twice"),
    ("# only a comment\n", 0, "no Switch, Ca or Rt record"),
    ("Switch 999 \"S-01\"\n", 1, "out of range"),
])
def test_ibnetdiscover_errors(text: str, line: int, reason: str) -> None:
    with pytest.raises(TopologyParseError) as caught:
        parse_ibnetdiscover(text)
    assert caught.value.line == line and reason in caught.value.reason


# -- iblinkinfo, ibstat, sysfs, ibdiag ------------------------------------------------------


def test_iblinkinfo_both_forms() -> None:
    grouped = parse_iblinkinfo(read(SIM / "healthy/iblinkinfo.txt"))
    per_port = parse_iblinkinfo(read(SIM / "healthy/iblinkinfo-switches-only.txt"))
    for scan in (grouped, per_port):
        assert len(scan.links) == 24 and {str(x.rate) for x in scan.links} == {"4xHDR"}
        assert all(link.state is PortState.ACTIVE for link in scan.links)
        assert len(scan.idle_ports) == 6 * 36 - 32
    assert {n.description for n in per_port.nodes if n.kind is NodeKind.SWITCH} == {
        "ib-leaf-01", "ib-leaf-02", "ib-leaf-03", "ib-leaf-04", "ib-spine-01", "ib-spine-02"}


def test_iblinkinfo_faults() -> None:
    scan = parse_iblinkinfo(read(SIM / "faults/iblinkinfo.txt"))
    assert len(scan.links) == 22
    assert "gpu-node-16 mlx5_0" not in {n.description for n in scan.nodes}


def test_iblinkinfo_error_line() -> None:
    with pytest.raises(TopologyParseError) as caught:
        parse_iblinkinfo("Switch: 0x01 sw:\n  6  1[ ] ==( 4X 53.125 Gbps Active/ LinkUp)==> ??\n")
    assert caught.value.line == 2


def test_ibstat_h100() -> None:
    cas = parse_ibstat(read(IB / "gpud-ibstat.47.0.h100.all.active.0.txt"))
    assert len(cas) == 12 and cas[0].name == "mlx5_0" and cas[0].ca_type == "MT4129"
    assert cas[0].ports[0].rate is not None and cas[0].ports[0].rate.gbps == 400
    down = parse_ibstat(read(IB / "gpud-ibstat.47.0.h100.some.down.0.txt"))
    states = {ca.name: ca.ports[0].state for ca in down}
    assert list(states.values()).count(PortState.DOWN) == 3
    assert all(p.is_infiniband for ca in down if ca.ca_type == "MT4129" for p in ca.ports)
    sim = parse_ibstat(read(SIM / "healthy/ibstat.txt"))
    assert sim[0].name == "ibsim0" and sim[0].ports[0].port_guid == "0000000000100001"


def test_ibstatus_failure_is_a_parse_error() -> None:
    with pytest.raises(TopologyParseError) as caught:
        parse_ibstatus(read(SIM / "healthy/ibstatus.txt"))
    assert caught.value.line == 1 and "No devices" in caught.value.reason
    ok = parse_ibstatus("Infiniband device 'mlx5_0' port 1 status:\n\tstate:\t 4: ACTIVE\n"
                        "\tphys state:\t 5: LinkUp\n\trate:\t 400 Gb/sec (4X NDR)\n"
                        "\tbase lid:\t 0x4b\n\tlink_layer:\t InfiniBand\n")
    port = ok[0].ports[0]
    assert (port.state, port.physical, str(port.rate), port.lid) == (
        PortState.ACTIVE, "LinkUp", "4xNDR", 0x4B)


def test_sysfs_tree(tmp_path: Path) -> None:
    files = {"mlx5_0/node_guid": "a088:c203:00e3:142a\n", "mlx5_0/node_desc": "gpu-node-01 mlx5_0",
             "mlx5_0/hca_type": "MT4129", "mlx5_0/fw_ver": "28.39.1002",
             "mlx5_0/ports/1/state": "4: ACTIVE", "mlx5_0/ports/1/phys_state": "5: LinkUp",
             "mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)", "mlx5_0/ports/1/lid": "0x4b",
             "mlx5_0/ports/1/link_layer": "InfiniBand",
             "mlx5_1/node_guid": "e8eb:d303:0033:07da", "mlx5_1/ports/1/state": "1: DOWN",
             "mlx5_1/ports/1/phys_state": "3: Disabled",
             "mlx5_1/ports/1/rate": "40 Gb/sec (4X QDR)",
             "mlx5_1/ports/1/link_layer": "InfiniBand"}
    for relative, content in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(content)
    (tmp_path / "mlx5_0/ports/1/counters").mkdir()
    cas = parse_sysfs(read_sysfs_tree(tmp_path))
    first, second = cas
    assert (first.name, first.node_guid, first.description) == (
        "mlx5_0", "a088c20300e3142a", "gpu-node-01 mlx5_0")
    assert first.ports[0].state is PortState.ACTIVE and first.ports[0].lid == 0x4B
    assert str(first.ports[0].rate) == "4xNDR" and first.ports[0].is_infiniband
    assert second.ports[0].state is PortState.DOWN and second.ports[0].physical == "Disabled"
    assert read_sysfs_tree(tmp_path / "missing") == {}
    with pytest.raises(TopologyParseError):
        parse_sysfs({})


def test_ibdiag_outputs() -> None:
    errors = parse_ibqueryerrors(read(SIM / "faults/ibqueryerrors.txt"))
    assert [(e.port, dict(e.counters)["SymbolErrorCounter"]) for e in errors] == [
        (None, 1234), (5, 1234)]
    assert parse_ibqueryerrors(read(SIM / "healthy/ibqueryerrors.txt")) == ()
    counters = parse_perfquery(read(SIM / "faults/perfquery-leaf02-p5.txt"))
    assert (counters.lid, counters.port) == (3, 5)
    assert counters.errors() == {"SymbolErrorCounter": 1234, "LinkDownedCounter": 7}
    assert parse_perfquery(read(SIM / "healthy/perfquery.txt")).errors() == {}
    assert parse_sminfo(read(SIM / "healthy/sminfo.txt")).is_master
    nodes = parse_saquery_nodes(read(SIM / "healthy/saquery-nodes.txt")).nodes
    assert nodes[0].description == "gpu-node-01 mlx5_0" and nodes[0].kind is NodeKind.CA
    routes = parse_ibroute(read(SIM / "healthy/ibroute-leaf01.txt"))
    assert len(routes) == 22 and routes[0].port == 1
    hops = parse_ibtracert(read(SIM / "healthy/ibtracert.txt"))
    assert [h.description for h in hops][1:4] == ["ib-leaf-01", "ib-spine-02", "ib-leaf-04"]
    with pytest.raises(TopologyParseError):
        parse_ibqueryerrors("Errors for 0x1 \"x\"\n")   # no summary: cut short


# -- nvidia-smi -----------------------------------------------------------------------------


def test_nvidia_smi_xml_v12_mig_and_v13() -> None:
    a100 = parse_nvidia_smi_xml(read(NV / "telegraf-a100-sxm4-v12.xml"), "a")
    gpu = a100.gpus[0]
    assert (gpu.product, gpu.mig_enabled, gpu.mig_devices) == ("NVIDIA A100-SXM4-80GB", True, 4)
    assert gpu.fabric_state == "N/A" and gpu.cluster_uuid == "" and a100.driver_version
    for name in ("telegraf-rtx-3060-v12.xml", "telegraf-rtx-3080-v13.xml"):
        report = parse_nvidia_smi_xml(read(NV / name))
        assert report.gpus[0].clique_id == "N/A" and report.gpus[0].uuid.startswith("GPU-")


def test_nvidia_smi_text() -> None:
    h100 = parse_nvidia_smi_text(read(NV / "gpud-nvidia-smi-q.535.161.08.h100x8.txt"), "h")
    assert len(h100.gpus) == 8 and h100.driver_version == "535.161.08"
    assert {(g.fabric_state, g.fabric_status, g.cluster_uuid) for g in h100.gpus} == {
        ("Completed", "Success", "")}
    assert [g.index for g in h100.gpus] == list(range(8))
    titan = parse_nvidia_smi_text(read(NV / "gpud-nvidia-smi-q.560.35.03.titanv.txt"))
    assert titan.gpus[0].clique_id == "N/A" and titan.gpus[0].product == "NVIDIA TITAN V"


@pytest.mark.parametrize("render", [nvsmi.xml, nvsmi.text, nvsmi.csv,
                                    lambda g: nvsmi.csv(g, header=True)],
                         ids=["xml", "text", "csv", "csv-header"])
def test_all_report_formats_agree(render: object) -> None:
    assert callable(render)
    report = parse_nvidia_smi(render(nvsmi.gpus(3, clique="5")), "gpu-node-03")
    assert report.hostname == "gpu-node-03" and len(report.gpus) == 4
    assert {(g.fabric_state, g.fabric_status, g.cluster_uuid, g.clique_id)
            for g in report.gpus} == {("Completed", "Success", nvsmi.CLUSTER_A, "5")}


def test_csv_custom_fields_and_errors() -> None:
    report = parse_nvidia_smi_csv("GPU-1, Completed\n", fields=("uuid", "fabric.state"))
    assert report.gpus[0].fabric_state == "Completed"
    with pytest.raises(TopologyParseError) as caught:
        parse_nvidia_smi_csv("0, GPU-1, x\n")
    assert caught.value.line == 1 and "3 columns" in caught.value.reason
    with pytest.raises(TopologyParseError):
        parse_nvidia_smi_csv("0, not-a-uuid, a, b, c, d, e\n")


@pytest.mark.parametrize(("document", "reason"), [
    ('<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n]>\n<nvidia_smi_log>'
     '&lol;</nvidia_smi_log>', "internal subset"),
    ('<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
     '<nvidia_smi_log>&xxe;</nvidia_smi_log>', "internal subset"),
    ("<nvidia_smi_log>&undefined;</nvidia_smi_log>", "not well-formed"),
    ("<nvidia_smi_log><gpu></nvidia_smi_log>", "not well-formed"),
    ("<other/>", "not <nvidia_smi_log>"),
    ("<nvidia_smi_log><gpu id='1'></gpu></nvidia_smi_log>", "has no <uuid>"),
])
def test_xml_is_refused_safely(document: str, reason: str) -> None:
    with pytest.raises(TopologyParseError) as caught:
        parse_nvidia_smi_xml(document)
    assert reason in caught.value.reason


def test_topo_matrix_and_nvlink_status() -> None:
    matrix = parse_nvidia_smi_topo(read(FIXTURES / "synthetic/topo-m-h100x8.txt"))
    assert matrix.devices[:2] == ("GPU0", "GPU1") and len(matrix.devices) == 12
    assert matrix.kind("GPU3", "NIC1") == "PIX" and matrix.nvlinks("GPU0") == 7 * 18
    assert dict(matrix.nics)["NIC2"] == "mlx5_2"
    status = parse_nvlink_status(read(NV / "gpud-nvidia-smi-nvlink-status.a100.txt"))
    assert len(status) == 8 and all(len(g.links) == 12 and not g.inactive for g in status)
    with pytest.raises(TopologyParseError) as caught:
        parse_nvidia_smi_topo("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\tWAT\n")
    assert caught.value.line == 3
