"""How many processes answer DHCP beside the daemon's loop (``boot/dhcp_workers.worker_count``):
the setting when given, else one per CPU this process may run on less the loop's own, at
most four; never more answerers than the pool's addresses; proxy mode in the loop alone."""

from __future__ import annotations

import os

import pytest

from provisioner.boot.dhcp_workers import DEFAULT_MAX_WORKERS, worker_count
from provisioner.config import DhcpSettings


def _dhcp(**values: object) -> DhcpSettings:
    return DhcpSettings.model_validate({"mode": "authoritative", "server_address": "10.0.0.1",
                                        "pool": "10.0.0.10-10.0.0.99", **values})


@pytest.mark.parametrize(("cpus", "expected"),
                         [(1, 0), (2, 1), (3, 2), (5, 4), (64, DEFAULT_MAX_WORKERS)])
def test_the_default_is_one_a_cpu_less_the_loops_at_most_four(
        monkeypatch: pytest.MonkeyPatch, cpus: int, expected: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    assert worker_count(_dhcp()) == expected


def test_the_setting_wins_and_proxy_mode_stays_in_the_daemon() -> None:
    assert worker_count(_dhcp(workers=0)) == 0
    assert worker_count(_dhcp(workers=6)) == 6
    # a part of the pool each, the loop's too
    assert worker_count(_dhcp(workers=6, pool="10.0.0.10-10.0.0.12")) == 2
    assert worker_count(DhcpSettings.model_validate(
        {"mode": "proxy", "server_address": "10.0.0.1", "workers": 3})) == 0
