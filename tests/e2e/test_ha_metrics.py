"""Three daemons on one PostgreSQL, each scraped as Prometheus would: the fleet's gauges come
from the fleet leader alone (``sum()`` over the daemons is the fleet, not three times it),
each daemon counts the transitions it committed itself, and when the leader is SIGKILLed
the next leader exports the same counts (docs/ha.md, "Metrics")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.ha_support import Fleet
from tests.e2e.test_cli_api import running_daemon
from tests.peers.postgres import PostgresServer, postgres_unavailable_reason, running_postgres

pytestmark = pytest.mark.e2e

LEASE_S = 2
SETTINGS = ("[lifecycle]\nauto_inspect = false\nauto_deploy = false\n"
            f"[daemon]\nshutdown_timeout_s = 5\n[ha]\nlease_s = {LEASE_S}\n")
ENROLLED_BY = (2, 3, 1)  # nodes enrolled through daemon 0, 1, 2


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    """``/metrics`` as Prometheus parses it: family name -> [(labels, value)]."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        found[family.name] = [(dict(s.labels), s.value) for s in family.samples
                              if s.name in (family.name, f"{family.name}_total")]
    return found


def fleet_sum(views: list[Samples], family: str, **labels: str) -> float:
    """``sum(family{labels})`` over the daemons, as a PromQL ``sum()`` would give it."""
    return sum(value for view in views for got, value in view.get(family, [])
               if all(got.get(k) == v for k, v in labels.items()))


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _enroll(port: int, token: str, name: str, mac: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/nodes", method="POST",
        data=json.dumps({"hostname": name, "macs": [mac]}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


def leaders(ports: list[int]) -> list[int]:
    return [port for port in ports
            if fleet_sum([scrape(port)], "provisioner_fleet_leader") == 1]


@pytest.mark.postgres
def test_fleet_gauges_come_from_the_leader_alone(pg: PostgresServer, tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, pg.create_database("ha_metrics"), 3, SETTINGS)
    for i, daemon in enumerate(fleet.daemons):
        daemon.config.write_text(daemon.config.read_text() + f'instance = "metrics-{i}"\n')
    try:
        for daemon, port in zip(fleet.daemons, fleet.ports, strict=True):
            daemon.start()
            daemon.wait_ready(port, timeout_s=120)
        token = subprocess.run(
            [sys.executable, "-m", "provisioner", "--config", str(fleet.daemons[0].config),
             "token", "create", "--role", "operator", "--name", "ha-metrics"],
            capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()[-1]
        for i, count in enumerate(ENROLLED_BY):
            for n in range(count):
                _enroll(fleet.ports[i], token, f"ha-m{i}-{n}", f"52:54:00:4d:0{i}:{n:02x}")
        total = sum(ENROLLED_BY)
        _wait("one leader", lambda: len(leaders(fleet.ports)) == 1, 10 * LEASE_S)

        views = [scrape(port) for port in fleet.ports]
        (leader,) = leaders(fleet.ports)
        for port, view in zip(fleet.ports, views, strict=True):
            # every daemon describes the family; only the leader gives it samples
            assert "provisioner_nodes" in view and "provisioner_health_findings" in view
            assert bool(view["provisioner_nodes"]) == (port == leader), (port, view)
        assert fleet_sum(views, "provisioner_nodes", state="enrolled") == total
        assert fleet_sum(views, "provisioner_nodes") == total
        assert fleet_sum(views, "provisioner_fleet_leader") == 1
        # counters: each daemon's own transitions, which add up to the fleet's
        mine = [fleet_sum([view], "provisioner_transitions", to_state="enrolled")
                for view in views]
        assert mine == list(ENROLLED_BY), mine
        assert [fleet_sum([view], "provisioner_build_info") for view in views] == [1, 1, 1]

        killed = fleet.ports.index(leader)
        fleet.daemons[killed].kill()
        alive = [port for port in fleet.ports if port != leader]
        _wait("a new leader", lambda: len(leaders(alive)) == 1, 10 * LEASE_S)
        views = [scrape(port) for port in alive]
        assert fleet_sum(views, "provisioner_nodes", state="enrolled") == total
        assert fleet_sum(views, "provisioner_fleet_leader") == 1
    finally:
        codes = [daemon.stop() for daemon in fleet.daemons if daemon.proc is not None]
    assert sorted(codes)[1:] == [0, 0], fleet.logs()[-3000:]


def test_one_daemon_leads_and_exports_the_fleet(tmp_path: Path) -> None:
    """SQLite, one daemon: it leads the fleet singleton at once, so its /metrics has the
    node counts as before HA existed."""
    with running_daemon(tmp_path, "[simulation]\nnodes = 4\nstep_delay_s = 0.01\n") as daemon:
        port = int(daemon.url.rsplit(":", 1)[1])
        _wait("the lead", lambda: leaders([port]) == [port], 10)
        _wait("the simulated nodes counted",
              lambda: fleet_sum([scrape(port)], "provisioner_nodes") == 4, 10)
        assert fleet_sum([scrape(port)], "provisioner_fleet_leader") == 1
