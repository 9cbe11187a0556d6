"""100 simulated IPMI BMCs (pyghmi's Bmc class, 10 per process) behind the real ipmi
driver, driven through the real conductor's inspect step: 10 are dead (5 silent UDP
sockets, 5 ports that refuse), 5 flap (their first 2 commands answer "node
busy"). The 85 healthy nodes finish about as fast as 85 nodes with no faults (measured in a
process of its own); the dead ones end ``inspect_failed`` with the reason; the flapping
ones succeed after retries.

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
from pathlib import Path

import pytest

from provisioner.bmc.ipmi import IpmiDriver
from provisioner.bmc.ipmi_pool import IpmiWorkers
from provisioner.bmc.managed import BmcManager
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

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = BmcSettings(timeout_s=2.0, max_concurrency=32, retries=2, retry_backoff_s=0.1,
                       confirm_timeout_s=5, confirm_poll_s=0.05, breaker_threshold=3,
                       breaker_reset_s=30)
LIFECYCLE = LifecycleSettings(auto_inspect=False, auto_deploy=False, max_inspecting=100)
DONE = (NodeState.INSPECTED, NodeState.INSPECT_FAILED)


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
    """85 healthy BMCs and nothing else, in a process of its own: pyghmi's client keeps
    process-wide state (login cache, shared sockets), so a run before the faulty one in the
    same process was seen to disturb it.

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
        with SimBmcs(count=85) as clean:
            nodes, took = await inspect_all(store, world, "base", clean.ports, clean)
        assert {node.state for node in nodes.values()} == {NodeState.INSPECTED}
        print(json.dumps({"baseline_s": max(took.values())}), flush=True)
        os._exit(0)  # do not wait for pyghmi's threads


async def inspect_all(store: Store, world: SimWorld, tag: str, ports: list[int],
                      sim: SimBmcs) -> tuple[dict[int, Node], dict[int, float]]:
    """Enroll one node per port, fire inspect on all, wait; (port -> node, port -> seconds).
    IPMI in worker processes, as in the daemon (4 workers of 8 threads: 32 calls at once)."""
    workers = IpmiWorkers(count=4, threads=SETTINGS.max_concurrency // 4)
    ipmi = IpmiDriver(workers, timeout_s=SETTINGS.timeout_s)
    bmcs = BmcManager(BmcRegistry({"ipmi": ipmi}, closers=[ipmi.aclose]), SETTINGS)
    kw = {"delay_s": 0.0, "fail_rate": 0.0}
    ports_ = Ports(bmc=bmcs, inspector=FakeInspector(world, **kw),
                   installer=FakeInstaller(world, **kw), kube=FakeKube(world, **kw),
                   slurm=FakeSlurm(world, **kw))
    conductor = Conductor(store.nodes, ports_, LIFECYCLE)
    nodes = {}
    for i, port in enumerate(ports):
        nodes[port] = await store.nodes.create(NewNode(
            state=NodeState.ENROLLED, hostname=f"{tag}-{i:03d}", serial=f"{tag}{i:05d}",
            bmc=BmcEndpoint(driver="ipmi", address="127.0.0.1", port=port,
                            username=sim.user),
            bmc_password=sim.password), actor="test")
    started = time.monotonic()
    for node in nodes.values():
        await conductor.fire(node.id, Event.INSPECT, actor="test")
    finished: dict[int, float] = {}
    async with asyncio.timeout(45):
        while len(finished) < len(nodes):
            for port, node in nodes.items():
                if port not in finished:
                    current = await store.nodes.get(node.id)
                    if current.state in DONE:
                        nodes[port], finished[port] = current, time.monotonic() - started
            await asyncio.sleep(0.05)
    await conductor.stop()
    await bmcs.aclose()
    return nodes, finished


async def test_dead_and_flapping_bmcs_do_not_slow_the_healthy_ones(
        store: Store, world: SimWorld) -> None:
    baseline_s = await asyncio.to_thread(baseline_in_a_fresh_process)
    with SimBmcs(count=90, flap=5, flap_calls=2, silent=5) as sim, refusing_ports(5) as closed:
        flapping, healthy = sim.ports[:5], sim.ports[5:]
        silent = sim.silent
        dead = silent + closed
        nodes, took = await inspect_all(store, world, "flt", sim.ports + dead, sim)
        stats = sim.stats()

    failed = {p: nodes[p].last_error for p in healthy + flapping
              if nodes[p].state is not NodeState.INSPECTED}
    order = {p: i for i, p in enumerate(sim.ports)}
    assert not failed, (len(failed), sorted(order[p] for p in failed), failed)
    for port in dead:
        node = nodes[port]
        assert node.state is NodeState.INSPECT_FAILED
        why = "no answer" if port in silent else "Connection refused"
        assert f"BMC 127.0.0.1:{port}: " in node.last_error, node.last_error
        assert why in node.last_error, node.last_error
    assert all(stats[p]["power"] == "off" and stats[p]["opened"] == 1 for p in healthy)
    healthy_s = max(took[p] for p in healthy)
    assert healthy_s <= 1.5 * baseline_s + 2.0, (healthy_s, baseline_s)
    # the dead ones fail on our deadlines (3 attempts of 2 s, plus queueing for the pool
    # while 100 nodes start at once), not after pyghmi's own ~5 s per login and retries.
    # The queueing grows with the machine's load as the reference run does (seen: 14.9 s
    # against a fixed 14 s bound at load 50 on 2 cores, every healthy BMC answered)
    dead_s = max(took[p] for p in dead)
    bound_s = (SETTINGS.retries + 1) * SETTINGS.timeout_s + max(8.0, 2 * baseline_s)
    assert dead_s < bound_s, (dead_s, bound_s, baseline_s)


if __name__ == "__main__":
    asyncio.run(_baseline())
