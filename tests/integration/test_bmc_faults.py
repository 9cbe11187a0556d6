"""100 simulated BMCs driven through the real conductor's inspect step and one BmcManager
with the real ipmi and redfish drivers (issue 15): 80 healthy and 5 flapping IPMI BMCs
(pyghmi's Bmc class, 10 per process; flapping: the first 2 commands answer "node busy"),
10 dead IPMI BMCs (5 silent UDP sockets, 5 ports that refuse) and 5 slow Redfish BMCs
(tests/sim/redfish.py in a process of its own, every HTTP request answered 5 s late). The
80 healthy nodes finish within 1.2x (plus ``NOISE_S``) of 80 healthy nodes with no faults
(measured in a process of its own); the dead ones end ``inspect_failed`` with the reason;
the flapping ones succeed after retries; the slow ones succeed, slowly.

Why the slow ones are Redfish: an IPMI BMC that answers 5 s late looks dead to pyghmi (it
retransmits and logs in again after ~1-4 s), and real IPMI BMCs answer in milliseconds or
not at all; slow BMCs are Redfish ones (seconds per request on loaded BMCs). So the IPMI
calls keep a 2 s deadline (``bmc.timeout_s``: dead ones fail fast) and Redfish calls get
30 s (``bmc.driver_timeout_s``), what an operator with such BMCs sets: a first Redfish call
logs in and finds the System, 5 requests, 25 s here. The slow ones must end ``inspected``.

Before the driver pinged BMCs on its own socket ahead of each login, this test wedged
pyghmi's client for every BMC (dead logins timing out in its threads). The client now runs
pyghmi in worker processes (``bmc/ipmi_pool.py``), as the daemon does. It was ``xfail``
while a simulator process could wedge in pyghmi's ``wait_for_rsp`` (an unbounded Event
wait on a missed IO-thread wake-up; 2 of 7 CI runs): tests/sim/ipmi_bmc.py bounds that
wait (fix 5) and a watchdog dumps and ends a stalled simulator instead of hanging. It stayed
``xfail`` while, in about 1 run in 10 at machine load 8-12, a group of healthy BMCs went
unanswered for seconds (the reference run too): all BMCs of one simulator process, whose
pyghmi IO thread blocked in a ``recvfrom`` on an idle BMC socket that another thread had
switched back to blocking mode between pyghmi's ``setblocking(0)`` and its read (traced:
no datagram read by that process for 6.4 s while its listen loop ran, then the backlog at
once). ``ipmi_worker.no_blocking_toggle`` fixes that, in the simulator and in our IPMI
workers (fix 6)."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.bmc.ipmi import IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.bmc.managed import BmcManager
from provisioner.bmc.redfish import RedfishDriver
from provisioner.bmc.registry import BmcRegistry
from provisioner.config import BmcSettings, LifecycleSettings, Settings
from provisioner.domain import BmcEndpoint, NewNode, Node
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.ports import Ports
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.drivers import FakeInspector, FakeInstaller, FakeKube, FakeSlurm
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store, open_store
from tests.sim.ipmi_bmc import SimBmcs
from tests.sim.redfish import SimRedfish

ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 5.0
"""Each HTTP request to a slow Redfish BMC is answered this late."""
SETTINGS = BmcSettings(timeout_s=2.0, driver_timeout_s={"redfish": 30.0}, max_concurrency=32,
                       retries=2, retry_backoff_s=0.1, confirm_timeout_s=5,
                       confirm_poll_s=0.05, breaker_threshold=3, breaker_reset_s=30)
LIFECYCLE = LifecycleSettings(auto_inspect=False, auto_deploy=False, max_inspecting=100)
DONE = (NodeState.INSPECTED, NodeState.INSPECT_FAILED)
HEALTHY = 80
NOISE_S = 2.0
"""Slack on top of 1.2x: the healthy part is ~3 s of CPU-bound work (about 1,000 pyghmi
calls on 2 shared cores, at nice 19 beside other jobs), so two fault-free runs in a row
differ by up to 2.5 s (measured: 16 consecutive fault-free runs took 2.6-5.6 s at load
1-5, in and out of a subprocess); a slot held by a faulty BMC would cost the healthy ones
far more (a dead call holds its slot 2 s, a slow one 5-25 s)."""


@contextlib.contextmanager
def refusing_ports(count: int) -> Iterator[list[int]]:
    """Loopback UDP ports that refuse every datagram (ICMP port unreachable), held for the
    block: each bound by a socket connected to another port, which the kernel matches only
    for datagrams from that peer. A port merely bound and closed again refused twice, then
    went silent on the third try ("no answer", not "Connection refused"; no ICMP rate
    limit counted): most likely taken meanwhile by one of the many UDP sockets the machine
    opens."""
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sink.bind(("127.0.0.1", 0))
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            sock.bind(("127.0.0.1", 0))
            sock.connect(sink.getsockname())
            ports.append(sock.getsockname()[1])
        yield ports


def baseline_in_a_fresh_process() -> float:
    """80 healthy IPMI BMCs and nothing else (the healthy part of the fault run), in a
    process of its own: pyghmi's client kept process-wide state (login cache, shared
    sockets), so a run before the faulty one in the same process was seen to disturb it.

    This is the reference, not the system under test, so a failed reference run is made once
    more; both failures are shown. Seen twice in 7 CI runs, never in 20 runs by hand: a
    healthy simulated BMC left a request unanswered ("no answer to boot device status"), and
    the process then hung at exit on a pyghmi thread (hence the thread dump and ``os._exit``
    in ``_baseline``)."""
    failures = []
    for _attempt in range(2):
        done = subprocess.run([sys.executable, "-m", "tests.integration.test_bmc_faults"],
                              capture_output=True, text=True, timeout=150, cwd=ROOT)
        if done.returncode == 0:
            return float(json.loads(done.stdout.splitlines()[-1])["baseline_s"])
        failures.append(f"exit {done.returncode}:\n{done.stderr[-4000:]}")
    pytest.fail("the fault-free reference run failed twice:\n" + "\n---\n".join(failures))


async def _baseline() -> None:
    # a wedged pyghmi thread must not hang the reference run: dump every thread, exit 1
    faulthandler.dump_traceback_later(100, exit=True)
    try:
        await _measure_baseline()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait for pyghmi's threads


async def _measure_baseline() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Settings(state_dir=Path(tmp) / "state"))
        world = SimWorld(Path(tmp) / "world.sqlite")
        with SimBmcs(count=HEALTHY) as clean:
            nodes, took = await inspect_all(store, world, "base", ipmi_endpoints(clean.ports),
                                            clean.user, clean.password)
        assert {node.state for node in nodes.values()} == {NodeState.INSPECTED}
        print(json.dumps({"baseline_s": max(took.values())}), flush=True)
        os._exit(0)  # do not wait for pyghmi's threads


def ipmi_endpoints(ports: list[int]) -> dict[str, BmcEndpoint]:
    return {f"ipmi:{port}": BmcEndpoint(driver="ipmi", address="127.0.0.1", port=port)
            for port in ports}


def redfish_endpoints(urls: list[str]) -> dict[str, BmcEndpoint]:
    return {f"redfish:{url}": BmcEndpoint(driver="redfish", address=url) for url in urls}


async def inspect_all(store: Store, world: SimWorld, tag: str,
                      endpoints: dict[str, BmcEndpoint], user: str, password: str,
                      ) -> tuple[dict[str, Node], dict[str, float]]:
    """Enroll one node per BMC, fire inspect on all, wait; (key -> node, key -> seconds).
    IPMI in worker processes, as in the daemon (4 workers of 8 threads: 32 calls at once);
    Redfish on the real driver's HTTP client; both through one BmcManager, as the daemon's
    ``build_bmc`` does."""
    workers = IpmiWorkers(count=4, threads=SETTINGS.max_concurrency // 4)
    ipmi = IpmiDriver(workers, timeout_s=SETTINGS.timeout_for("ipmi"))
    redfish = RedfishDriver(timeout_s=SETTINGS.timeout_for("redfish"))
    bmcs = BmcManager(BmcRegistry({"ipmi": ipmi, "redfish": redfish},
                                  closers=[ipmi.aclose, redfish.aclose]), SETTINGS)
    kw = {"delay_s": 0.0, "fail_rate": 0.0}
    ports_ = Ports(bmc=bmcs, inspector=FakeInspector(world, **kw),
                   installer=FakeInstaller(world, **kw), kube=FakeKube(world, **kw),
                   slurm=FakeSlurm(world, **kw))
    conductor = Conductor(store.nodes, ports_, LIFECYCLE)
    nodes = {}
    for i, (key, endpoint) in enumerate(endpoints.items()):
        nodes[key] = await store.nodes.create(NewNode(
            state=NodeState.ENROLLED, hostname=f"{tag}-{i:03d}", serial=f"{tag}{i:05d}",
            bmc=replace(endpoint, username=user), bmc_password=password), actor="test")
    await workers.start()  # process starts (pyghmi's import: ~1 s, more under load) are
    started = time.monotonic()  # not BMC work: out of the timing, a large part of its noise
    for node in nodes.values():
        await conductor.fire(node.id, Event.INSPECT, actor="test")
    finished: dict[str, float] = {}
    async with asyncio.timeout(180):
        while len(finished) < len(nodes):
            for key, node in nodes.items():
                if key not in finished:
                    current = await store.nodes.get(node.id)
                    if current.state in DONE:
                        nodes[key], finished[key] = current, time.monotonic() - started
            await asyncio.sleep(0.05)
    await conductor.stop()
    await bmcs.aclose()
    return nodes, finished


async def test_dead_flapping_and_slow_bmcs_do_not_slow_the_healthy_ones(
        store: Store, world: SimWorld) -> None:
    baseline_s = await asyncio.to_thread(baseline_in_a_fresh_process)
    with (SimBmcs(count=HEALTHY + 5, flap=5, flap_calls=2, silent=5) as sim,
          refusing_ports(5) as closed, SimRedfish(count=5, latency_s=SLOW_S) as slow_sim):
        flapping, healthy = sim.ports[:5], sim.ports[5:]
        silent = sim.silent
        dead = silent + closed
        assert (sim.user, sim.password) == (slow_sim.user, slow_sim.password)
        endpoints = (ipmi_endpoints(sim.ports + dead)
                     | redfish_endpoints(slow_sim.urls))
        nodes, took = await inspect_all(store, world, "flt", endpoints, sim.user, sim.password)
        stats = sim.stats()
        slow_stats = slow_sim.stats()["bmcs"]

    def key(port: int) -> str:
        return f"ipmi:{port}"

    slow = [f"redfish:{url}" for url in slow_sim.urls]
    failed = {k: nodes[k].last_error for k in map(key, healthy + flapping)
              if nodes[k].state is not NodeState.INSPECTED}
    order = {key(p): i for i, p in enumerate(sim.ports)}
    assert not failed, (len(failed), sorted(order[k] for k in failed), failed)
    for port in dead:
        node = nodes[key(port)]
        assert node.state is NodeState.INSPECT_FAILED
        why = "no answer" if port in silent else "Connection refused"
        assert f"BMC 127.0.0.1:{port}: " in node.last_error, node.last_error
        assert why in node.last_error, node.last_error
    assert all(stats[p]["power"] == "off" and stats[p]["opened"] == 1 for p in healthy)
    # the slow ones succeed, slowly: every request took SLOW_S, and bmc.driver_timeout_s
    # gives a Redfish call (a first one logs in and finds the System: 5 requests) 30 s
    for k, port in zip(slow, slow_sim.ports, strict=True):
        assert nodes[k].state is NodeState.INSPECTED, (k, nodes[k].last_error)
        assert slow_stats[str(port)]["power"] == "Off", slow_stats[str(port)]
        requests = slow_stats[str(port)]["requests"] - 1  # the logout came after
        assert took[k] >= requests * SLOW_S * 0.9, (took[k], slow_stats)
    healthy_s = max(took[key(p)] for p in healthy)
    slow_s = max(took[k] for k in slow)
    dead_s = max(took[key(p)] for p in dead)
    print(json.dumps({"baseline_s": round(baseline_s, 2), "healthy_s": round(healthy_s, 2),
                      "ratio": round(healthy_s / baseline_s, 3), "dead_s": round(dead_s, 2),
                      "slow_s": round(slow_s, 2), "load": os.getloadavg()}), flush=True)
    assert healthy_s <= 1.2 * baseline_s + NOISE_S, (healthy_s, baseline_s)
    # the dead ones fail on our deadlines (3 attempts of 2 s, plus queueing for the pool
    # while 100 nodes start at once), not after pyghmi's own ~5 s per login and retries.
    # The queueing grows with the machine's load as the reference run does (seen: 14.9 s
    # against a fixed 14 s bound at load 50 on 2 cores, every healthy BMC answered)
    bound_s = (SETTINGS.retries + 1) * SETTINGS.timeout_for("ipmi") + max(8.0, 2 * baseline_s)
    assert dead_s < bound_s, (dead_s, bound_s, baseline_s)


if __name__ == "__main__":
    asyncio.run(_baseline())
