"""100 simulated BMCs driven through the real conductor's inspect step and one BmcManager
with the real ipmi and redfish drivers (issue 15): 80 healthy and 5 flapping IPMI BMCs
(pyghmi's Bmc class, 10 per process; flapping: the first 2 commands answer "node busy"),
10 dead IPMI BMCs (5 silent UDP sockets, 5 ports that refuse) and 5 slow Redfish BMCs
(tests/sim/redfish.py in a process of its own, every HTTP request answered 5 s late). The
80 healthy nodes finish within 1.2x (plus ``NOISE_S``) of a fault-free run of the same
fleet, 100 healthy IPMI BMCs (measured first, in the test's own process); the dead ones end
``inspect_failed`` with the reason; the flapping ones succeed after retries; the slow ones
succeed, slowly.

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
import json
import os
import socket
import tempfile
import time
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
FLEET = 100  # the fault-free reference: as many nodes as the fault run, all healthy
NOISE_S = 2.5
"""Slack on top of 1.2x: the healthy part is 1-3 s of CPU-bound work (about 1,000 pyghmi
calls on 2 shared cores, at nice 19 beside other jobs at nice 0, which take a core from us
whenever they run), so two fault-free runs in a row differ by up to 2.5 s: ~50 of them
took 2.1-5.6 s at load 0.3-35 (the worst pair: 2.56 s, then 5.56 s; 5.56 - 1.2 x 2.56 =
2.5). The figures printed with ``-s`` include how long the event loop thread waited for a
CPU. docs/performance.md ("BMC", "Faults") has 10 runs' figures."""


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


async def fault_free_baseline() -> float:
    """The fault-free run: as many nodes as the fault run (``FLEET``), all healthy IPMI
    BMCs, in this process, on a store and simulators of their own; seconds until the last
    is inspected. (A reference of only the 80 healthy ones measured something else too: 100
    nodes in flight cost the daemon more CPU than 80, whatever their BMCs do; 20 more healthy
    nodes slowed the first 80 as much as 20 faulty ones, docs/performance.md "BMC".)

    It ran in a subprocess while pyghmi ran in this process (its process-wide state, and
    threads that hung the exit); pyghmi now runs only in the IPMI workers and the simulators,
    and the subprocess was the less comparable reference: 15-20 % slower than the same run
    in the test's process (4 pairs: 2.54/2.08, 3.98/3.62, 5.16/4.26, 4.40/3.66 s).

    This is the reference, not the system under test, so a failed reference run is made once
    more; both failures are shown (seen twice in 7 CI runs with the subprocess: a healthy
    simulated BMC left a request unanswered)."""
    failures = []
    for _attempt in range(2):
        try:
            with tempfile.TemporaryDirectory() as tmp:
                store = open_store(Settings(state_dir=Path(tmp) / "state"))
                world = SimWorld(Path(tmp) / "world.sqlite")
                try:
                    with SimBmcs(count=FLEET) as clean:
                        nodes, took = await inspect_all(
                            store, world, "base", ipmi_endpoints(clean.ports), clean.user,
                            clean.password)
                finally:
                    world.close()
                    store.close()
            states = {node.state for node in nodes.values()}
            assert states == {NodeState.INSPECTED}, [
                node.last_error for node in nodes.values() if node.state in DONE[1:]][:3]
            base = sorted(took.values())
            print(json.dumps({"baseline_p50_s": round(base[len(base) // 2], 2),
                              "baseline_p90_s": round(base[len(base) * 9 // 10], 2),
                              "baseline_cpu_wait_s": round(max(WAITED.values()), 2)}))
            return base[-1]
        except (AssertionError, TimeoutError, RuntimeError) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
    pytest.fail("the fault-free reference run failed twice:\n" + "\n---\n".join(failures))


def ipmi_endpoints(ports: list[int]) -> dict[str, BmcEndpoint]:
    return {f"ipmi:{port}": BmcEndpoint(driver="ipmi", address="127.0.0.1", port=port)
            for port in ports}


def redfish_endpoints(urls: list[str]) -> dict[str, BmcEndpoint]:
    return {f"redfish:{url}": BmcEndpoint(driver="redfish", address=url) for url in urls}


WAITED: dict[str, float] = {}
"""Per node key: how long this process's event loop thread had waited for a CPU (runnable,
not running) when the node finished: the other jobs' share of the noise."""


def run_queue_wait_s() -> float:
    """The main thread's time runnable but not running (``/proc/self/schedstat``)."""
    with open("/proc/self/schedstat") as stat:
        return int(stat.read().split()[1]) / 1e9


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
    queued = run_queue_wait_s()
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
                        WAITED[key] = run_queue_wait_s() - queued
            await asyncio.sleep(0.05)
    await conductor.stop()
    await bmcs.aclose()
    return nodes, finished


async def test_dead_flapping_and_slow_bmcs_do_not_slow_the_healthy_ones(
        store: Store, world: SimWorld) -> None:
    baseline_s = await fault_free_baseline()
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
    healthy_all = sorted(took[key(p)] for p in healthy)
    healthy_s = healthy_all[-1]
    slowest = sorted(healthy, key=lambda p: took[key(p)])[-5:]
    print(json.dumps({"healthy_p50_s": round(healthy_all[len(healthy_all) // 2], 2),
                      "healthy_p90_s": round(healthy_all[len(healthy_all) * 9 // 10], 2),
                      "slowest": [(order[key(p)], round(took[key(p)], 2)) for p in slowest],
                      "healthy_cpu_wait_s": round(WAITED[key(slowest[-1])], 2)}))
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
