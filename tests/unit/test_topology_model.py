"""The model's pure rules: GFD's NVLink clique rule (table-driven), link rates, errors."""

from __future__ import annotations

import pytest

from provisioner.topology.model import (
    ZERO_UUID,
    Gpu,
    LinkRate,
    NvlinkScope,
    PortState,
    TopologyParseError,
    nvlink_domain,
)

U1 = "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91"
U2 = "11111111-2222-3333-4444-555555555555"


def gpu(n: int, state: str = "Completed", status: str = "Success", cluster: str = U1,
        clique: str = "1") -> Gpu:
    return Gpu(f"GPU-{n}", "NVIDIA GB200", fabric_state=state, fabric_status=status,
               cluster_uuid=cluster, clique_id=clique)


CASES = [
    ("all-agree", [gpu(0), gpu(1), gpu(2), gpu(3)], NvlinkScope.MULTI_NODE, f"{U1}.1"),
    ("one-gpu", [gpu(0, clique="32766")], NvlinkScope.MULTI_NODE, f"{U1}.32766"),
    ("uuid-case", [gpu(0, cluster=U1.upper()), gpu(1)], NvlinkScope.MULTI_NODE, f"{U1}.1"),
    ("in-progress", [gpu(0), gpu(1, state="In Progress")], NvlinkScope.NOT_READY, None),
    ("not-started", [gpu(0, state="Not Started", status="N/A")], NvlinkScope.NOT_READY, None),
    ("failure", [gpu(0), gpu(1, status="Failure")], NvlinkScope.NOT_READY, None),
    ("status-absent", [gpu(0, status="")], NvlinkScope.NOT_READY, None),
    ("zero-uuid", [gpu(0, cluster=ZERO_UUID), gpu(1, cluster=ZERO_UUID)],
     NvlinkScope.SINGLE_NODE, None),
    ("no-uuid-535-driver", [gpu(0, cluster="", clique="")], NvlinkScope.SINGLE_NODE, None),
    ("one-zero-uuid", [gpu(0), gpu(1, cluster=ZERO_UUID)], NvlinkScope.INCONSISTENT, None),
    ("uuids-disagree", [gpu(0), gpu(1, cluster=U2)], NvlinkScope.INCONSISTENT, None),
    ("cliques-disagree", [gpu(0), gpu(1, clique="2")], NvlinkScope.INCONSISTENT, None),
    ("clique-na", [gpu(0, clique="N/A")], NvlinkScope.INCONSISTENT, None),
    ("clique-unicode-digit", [gpu(0, clique="²")], NvlinkScope.INCONSISTENT, None),
    ("uuid-not-a-uuid", [gpu(0, cluster="abc,def[1]")], NvlinkScope.INCONSISTENT, None),
    ("fabric-na", [gpu(0, "N/A", "N/A", "N/A", "N/A")], NvlinkScope.NONE, None),
    ("fabric-absent", [gpu(0, "", "", "", "")], NvlinkScope.NONE, None),
    ("no-gpus", [], NvlinkScope.NONE, None),
]


@pytest.mark.parametrize(("gpus", "scope", "clique"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gfd_clique_rule(gpus: list[Gpu], scope: NvlinkScope, clique: str | None) -> None:
    domain = nvlink_domain(gpus)
    assert domain.scope is scope, domain.reason
    assert domain.clique == clique
    if clique is None and scope is not NvlinkScope.NONE:
        assert domain.reason


def test_not_ready_reason_names_the_gpu() -> None:
    domain = nvlink_domain([gpu(0), gpu(7, state="In Progress")])
    assert "GPU-7" in domain.reason and "In Progress" in domain.reason


@pytest.mark.parametrize(("token", "text", "gbps"), [
    ("4xHDR", "4xHDR", 200.0), ("4x HDR", "4xHDR", 200.0), ("4xNDR", "4xNDR", 400.0),
    ("1xSDR", "1xSDR", 2.0), ("12xEDR", "12xEDR", 300.0), ("4xFDR10", "4xFDR10", 40.0),
])
def test_rate_tokens(token: str, text: str, gbps: float) -> None:
    rate = LinkRate.from_token(token)
    assert rate is not None and str(rate) == text and rate.gbps == gbps


@pytest.mark.parametrize("token", ["4x ???", "3xHDR", "4xWAT", "", "HDR"])
def test_unknown_rate_tokens(token: str) -> None:
    assert LinkRate.from_token(token) is None


def test_rates_from_iblinkinfo_and_sysfs() -> None:
    assert str(LinkRate.from_signalling(4, 53.125)) == "4xHDR"
    assert str(LinkRate.from_signalling(4, 106.25)) == "4xNDR"
    assert LinkRate.from_signalling(4, 1.0) is None
    assert str(LinkRate.from_sysfs("400 Gb/sec (4X NDR)")) == "4xNDR"
    assert LinkRate.from_sysfs("100 Gb/sec") == LinkRate(100.0)
    assert LinkRate.from_sysfs("fast") is None


@pytest.mark.parametrize(("text", "state"), [
    ("Active", PortState.ACTIVE), ("4: ACTIVE", PortState.ACTIVE), ("Down", PortState.DOWN),
    ("1: DOWN", PortState.DOWN), ("Init", PortState.INIT), ("Armed", PortState.ARMED),
    ("weird", PortState.UNKNOWN),
])
def test_port_states(text: str, state: PortState) -> None:
    assert PortState.parse(text) is state


def test_parse_error_names_source_and_line() -> None:
    error = TopologyParseError("ibnetdiscover", 12, "not an ibnetdiscover line")
    assert str(error) == "ibnetdiscover: line 12: not an ibnetdiscover line"
    assert (error.source, error.line) == ("ibnetdiscover", 12)
