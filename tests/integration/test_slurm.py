"""The Slurm hand-off against a real Slurm 22.05 (PEERS.md §7): slurmctld with auth/jwt, a
dynamic ``slurmd -Z``, and slurmrestd (JWT) as ``nobody``. The registrar sees the node through
slurmrestd (API negotiated: v0.0.38) and through scontrol; drains flow both ways."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from provisioner.config import SlurmSettings
from provisioner.slurm.handoff import SlurmHandoff
from provisioner.slurm.model import (
    SlurmAuthFailed,
    SlurmClient,
    SlurmTimeout,
    SlurmUnavailable,
)
from provisioner.slurm.rest import RestSlurm
from provisioner.slurm.scontrol import ScontrolSlurm
from provisioner.slurm.sync import SlurmSync
from tests.integration.kube_support import domain_node
from tests.peers.ports import free_tcp_port
from tests.peers.slurm import (
    Slurm,
    jwt_extra,
    open_workdir,
    running_munged,
    running_slurmctld,
    running_slurmd,
    running_slurmrestd,
    slurm_token,
    slurm_unavailable_reason,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]
NODE = "gpu-node-01"


@dataclass
class Cluster:
    slurm: Slurm
    workdir: Path
    url: str
    token: str


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if (reason := slurm_unavailable_reason()) is not None:
        pytest.skip(reason)
    with open_workdir("slurm-handoff-") as workdir, running_munged() as sock, \
            running_slurmctld(workdir, [], None, sock, plugin="topology/none",
                              extra=jwt_extra(workdir)) as slurm, \
            running_slurmrestd(slurm, workdir) as url:
        yield Cluster(slurm, workdir, url, slurm_token(slurm))


@pytest.fixture
def slurmd(cluster: Cluster) -> Iterator[None]:
    with running_slurmd(cluster.slurm, cluster.workdir, NODE):
        yield


def settings(**overrides: object) -> SlurmSettings:
    values: dict[str, object] = {"register_timeout_s": 30.0, "drain_timeout_s": 20.0,
                                 "poll_interval_s": 0.2}
    values.update(overrides)
    return SlurmSettings.model_validate(values)


def scontrol(cluster: Cluster) -> ScontrolSlurm:
    return ScontrolSlurm(slurm_conf=cluster.slurm.conf, timeout_s=20.0)


@pytest.fixture
async def rest(cluster: Cluster) -> AsyncIterator[RestSlurm]:
    client = RestSlurm(cluster.url, user="root", token=SecretStr(cluster.token),
                       writer=scontrol(cluster))
    yield client
    await client.aclose()


async def test_rest_negotiates_v0038_and_register_waits_for_slurmd(
        cluster: Cluster, rest: RestSlurm) -> None:
    assert await rest.version() == "v0.0.38"
    assert await rest.node(NODE) is None
    handoff = SlurmHandoff(rest, settings())
    register = asyncio.create_task(handoff.register(domain_node(NODE)))
    await asyncio.sleep(1.0)
    assert not register.done()  # registering ends only when Slurm reports the node
    with running_slurmd(cluster.slurm, cluster.workdir, NODE):
        await asyncio.wait_for(register, 30)
        found = await rest.node(NODE)
        assert found is not None and found.registered and found.state == "IDLE"
        assert "DYNAMIC_NORM" in found.flags
        assert [n.name for n in await rest.nodes()] == [NODE]
        via_scontrol = await scontrol(cluster).node(NODE)
        assert via_scontrol is not None
        assert (via_scontrol.state, via_scontrol.flags) == (found.state, found.flags)


async def test_register_times_out_naming_what_slurm_says(cluster: Cluster) -> None:
    handoff = SlurmHandoff(scontrol(cluster), settings(register_timeout_s=1.0))
    with pytest.raises(SlurmTimeout, match="gpu-node-01: not registered after 1 s: "
                                           "not known to slurmctld"):
        await handoff.register(domain_node(NODE))


@pytest.mark.parametrize("backend", ["rest", "scontrol"])
async def test_daemon_maintenance_drains_and_resumes_in_slurm(
        cluster: Cluster, slurmd: None, rest: RestSlurm, backend: str) -> None:
    client: SlurmClient = rest if backend == "rest" else scontrol(cluster)
    handoff = SlurmHandoff(client, settings())
    node = domain_node(NODE)
    await handoff.register(node)
    reports: list[tuple[str, bool, str]] = []

    async def on_change(host: str, on: bool, reason: str) -> None:
        reports.append((host, on, reason))

    sync = SlurmSync(client, on_change, interval_s=0.1, reason_prefix="provisioner: ")
    await sync.sync_once()
    await handoff.maintenance(node, True, "swap PSU")
    found = await client.node(NODE)
    assert found is not None and found.drained
    assert found.reason == "provisioner: swap PSU"
    assert "State=IDLE+DRAIN" in cluster.slurm.scontrol("show", "node", NODE)
    await sync.sync_once()
    assert reports == []  # our own drain is not reported back
    await handoff.maintenance(node, False, "")
    found = await client.node(NODE)
    assert found is not None and not found.draining and found.state == "IDLE"
    await sync.sync_once()
    assert reports == []


@pytest.mark.parametrize("backend", ["rest", "scontrol"])
async def test_operator_drain_in_slurm_reaches_the_daemon(
        cluster: Cluster, slurmd: None, rest: RestSlurm, backend: str) -> None:
    client: SlurmClient = rest if backend == "rest" else scontrol(cluster)
    await SlurmHandoff(client, settings()).register(domain_node(NODE))
    reports: list[tuple[str, bool, str]] = []

    async def on_change(host: str, on: bool, reason: str) -> None:
        reports.append((host, on, reason))

    sync = SlurmSync(client, on_change, interval_s=0.1, reason_prefix="provisioner: ")
    await sync.sync_once()
    cluster.slurm.scontrol("update", f"nodename={NODE}", "state=drain",
                           "reason=ib link flapping")
    await sync.sync_once()
    await sync.sync_once()  # reported once
    assert reports == [(NODE, True, "drained in Slurm by root: ib link flapping")]
    cluster.slurm.scontrol("update", f"nodename={NODE}", "state=resume")
    await sync.sync_once()
    assert reports[1:] == [
        (NODE, False, "resumed in Slurm (was: drained in Slurm by root: ib link flapping)")]


async def test_remove_drains_and_deletes_the_dynamic_node(
        cluster: Cluster, rest: RestSlurm) -> None:
    handoff = SlurmHandoff(rest, settings())
    node = domain_node(NODE)
    with running_slurmd(cluster.slurm, cluster.workdir, NODE):
        await handoff.register(node)
        await handoff.remove(node)
        assert await rest.node(NODE) is None
        assert NODE not in cluster.slurm.scontrol("show", "node")
        await handoff.remove(node)  # idempotent


async def test_rest_errors_map_onto_the_error_tree(cluster: Cluster, tmp_path: Path) -> None:
    # 22.05 answers a bad JWT with HTTP 500, errno -1 (slurmctld: "Protocol authentication
    # error"): retryable, with a hint; a token file is read again first.
    bad = RestSlurm(cluster.url, user="root", token=SecretStr("not-a-jwt"))
    with pytest.raises(SlurmUnavailable, match="refused JWT"):
        await bad.nodes()
    await bad.aclose()
    token_file = tmp_path / "jwt"
    token_file.write_text("SLURM_JWT=expired-token\n")
    from_file = RestSlurm(cluster.url, user="root", token_file=token_file)
    with pytest.raises(SlurmUnavailable):
        await from_file.nodes()
    token_file.write_text(f"SLURM_JWT={cluster.token}\n")  # renewed by the operator
    assert await from_file.version() == "v0.0.38"
    assert await from_file.nodes() == []
    await from_file.aclose()
    down = RestSlurm(f"http://127.0.0.1:{free_tcp_port()}", user="root",
                     token=SecretStr(cluster.token), timeout_s=2.0)
    with pytest.raises(SlurmUnavailable):
        await down.nodes()
    await down.aclose()
    with pytest.raises(SlurmAuthFailed, match="needs a JWT"):
        RestSlurm(cluster.url, user="root")
