"""InfiniBand facts, one truth per port: the sysfs reader and the ibstat parser give a port
the same rate (the nominal rate both print), ``State: Initializing`` is known, and an ibstat
that stops on a device is an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.topology.model import PortState, TopologyParseError
from provisioner.topology.parse_ibstat import parse_ibstat, parse_ibstatus
from provisioner.topology.rate import LinkRate
from provisioner.validation.checks import Expectation, check_infiniband, evaluate

IBSTAT = (Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "infiniband" /
          "gpud-ibstat.47.0.h100.all.active.0.txt").read_text()

# sysfs /sys/class/infiniband/*/ports/*/rate (kernel ib_rate text) and ibstat's Rate line
RATES = [("10 Gb/sec (4X SDR)", "10", 10.0), ("20 Gb/sec (4X DDR)", "20", 20.0),
         ("40 Gb/sec (4X QDR)", "40", 40.0), ("40 Gb/sec (4X FDR10)", "40", 40.0),
         ("56 Gb/sec (4X FDR)", "56", 56.0), ("100 Gb/sec (4X EDR)", "100", 100.0),
         ("200 Gb/sec (4X HDR)", "200", 200.0), ("400 Gb/sec (4X NDR)", "400", 400.0),
         ("25 Gb/sec (1X EDR)", "25", 25.0), ("800 Gb/sec (4X XDR)", "800", 800.0)]


def ibstat_port(rate: str, state: str = "Active") -> str:
    return ("CA 'mlx5_0'\n\tCA type: MT4129\n\tNode GUID: 0xa088c20300e3142a\n\tPort 1:\n"
            f"\t\tState: {state}\n\t\tPhysical state: LinkUp\n\t\tRate: {rate}\n"
            "\t\tBase lid: 7\n\t\tPort GUID: 0xa288c2fffee3142a\n\t\tLink layer: InfiniBand\n")


@pytest.mark.parametrize(("sysfs", "ibstat", "nominal"), RATES, ids=[r[0] for r in RATES])
def test_sysfs_and_ibstat_agree_on_a_port(sysfs: str, ibstat: str, nominal: float) -> None:
    from_sysfs = LinkRate.from_sysfs(sysfs)
    (ca,) = parse_ibstat(ibstat_port(ibstat))
    assert from_sysfs is not None and ca.ports[0].rate is not None
    assert from_sysfs.nominal_gbps == ca.ports[0].rate.nominal_gbps == nominal
    # and the gate judges both the same way, in that unit
    want = Expectation(ib_rate_gbps=nominal, ib_port_count=1)
    facts = {"infiniband": [{"device": "mlx5_0", "ports": [
        {"port": 1, "state": "Active", "phys_state": "LinkUp", "rate": sysfs,
         "link_layer": "InfiniBand"}]}]}
    assert evaluate(facts, want).passed
    assert check_infiniband(parse_ibstat(ibstat_port(ibstat)), want) == []


def test_the_issues_qdr_and_fdr_ports() -> None:
    """QDR read 32 Gb/s from sysfs but 40 from ibstat; FDR 54.56 vs 56."""
    for sysfs, ibstat in (("40 Gb/sec (4X QDR)", "40"), ("56 Gb/sec (4X FDR)", "56")):
        want = Expectation(ib_rate_gbps=float(ibstat))
        facts = {"infiniband": [{"device": "mlx4_0", "ports": [
            {"port": 1, "state": "Active", "phys_state": "LinkUp", "rate": sysfs}]}]}
        assert evaluate(facts, want).passed
        assert check_infiniband(parse_ibstat(ibstat_port(ibstat)), want) == []
    slow = {"infiniband": [{"device": "mlx4_0", "ports": [
        {"port": 1, "state": "Active", "phys_state": "LinkUp", "rate": "40 Gb/sec (4X QDR)"}]}]}
    assert evaluate(slow, Expectation(ib_rate_gbps=56)).failures == (
        "ib-rate: mlx4_0 port 1 runs at 40 Gb/s (4xQDR), expected 56 Gb/s",)


def test_ibstat_initializing_is_a_known_state() -> None:
    (ca,) = parse_ibstat(ibstat_port("400", state="Initializing"))
    assert ca.ports[0].state is PortState.INIT
    assert check_infiniband((ca,), Expectation(ib_rate_gbps=400)) == [
        "ib-ports: mlx5_0 port 1 is Init (LinkUp), expected Active (LinkUp)"]


def test_ibstatus_and_ibstat_agree() -> None:
    (by_status,) = parse_ibstatus("Infiniband device 'mlx5_0' port 1 status:\n"
                                  "\tstate:\t\t 4: ACTIVE\n\trate:\t\t 56 Gb/sec (4X FDR)\n")
    (by_stat,) = parse_ibstat(ibstat_port("56"))
    assert by_status.ports[0].rate is not None and by_stat.ports[0].rate is not None
    assert by_status.ports[0].rate.nominal_gbps == by_stat.ports[0].rate.nominal_gbps == 56


@pytest.mark.parametrize(("tail", "reason"), [
    ("ibpanic: [4242] main: stat of IB device 'mlx5_9' failed: No such file or directory",
     "ibstat failed on device mlx5_9: stat of IB device 'mlx5_9' failed: No such file or "
     "directory"),
    ("stat of IB device 'mlx5_3' failed", "ibstat failed on device mlx5_3: stat of IB device "
                                          "'mlx5_3' failed"),
], ids=["ibpanic", "bare"])
def test_ibstat_that_stops_on_a_device_is_an_error_naming_it(tail: str, reason: str) -> None:
    text = IBSTAT.rstrip("\n") + "\n" + tail + "\n"
    with pytest.raises(TopologyParseError) as caught:
        parse_ibstat(text)
    assert caught.value.reason == reason
    assert caught.value.line == text.count("\n")
