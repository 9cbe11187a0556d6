"""The in-band probe's cost to the daemon (issue 24; docs/architecture.md, "In-band health").

``--nodes`` active nodes, each with its probe token, post to the real boot HTTP server's
``POST /agent/v1/health`` from another process, one period after another: the first post
(an 8-GPU ``nvidia-smi -q -d ECC,...`` section, ibstat, 50 new kernel lines), two quiet
periods (the same sections, no new line: what most nodes send most periods) and a busy
one (20 new kernel lines). Prints the daemon's CPU (this process: HTTP, JSON, token,
intake, SQLite) per post.

    python3 bench/inband_bench.py [--nodes 300]
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import json
import resource
import socket
import sys
import tempfile
from pathlib import Path

from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.render import Renderer
from provisioner.config import LifecycleSettings, Settings
from provisioner.config.health import HealthSettings
from provisioner.domain import NewNode, NodeState
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.health import HealthFindings
from provisioner.lifecycle.inband import InbandIntake
from provisioner.simulation.world import SimWorld
from provisioner.store.store import open_store
from tests.conftest import fake_ports

FIXTURES = _env.ROOT / "tests" / "fixtures" / "health"
CLIENT = r"""
import asyncio, json, sys, aiohttp
url, tokens, bodies = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
async def main():
    async with aiohttp.ClientSession() as s:
        for body in bodies:
            for t in tokens:
                async with s.post(url, data=body, headers={"Authorization": "Bearer " + t,
                                  "Content-Type": "application/json"}) as r:
                    assert r.status == 200, await r.text()
            print("period", flush=True)
            sys.stdin.readline()
asyncio.run(main())
"""


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def periods() -> list[tuple[str, str]]:
    ecc = (FIXTURES / "h200-580.159.04-nvsmi-q-ecc.txt").read_text() * 8  # 8 GPUs
    ib = (FIXTURES / "gpud-ibstat.47.0.h100.some.down.1.txt").read_text()

    def body(lines: list[str]) -> str:
        return json.dumps({"boot_id": "b", "kernel_log": lines, "nvidia_smi": ecc, "ibstat": ib})

    return [("first post (8-GPU ECC section, ibstat, 50 new kernel lines)",
             body([f"[{j}.5] mlx5_core: link up {j}" for j in range(50)])),
            ("quiet period (the same sections, no new line)", body([])),
            ("quiet period again", body([])),
            ("busy period (the same sections, 20 new kernel lines)",
             body([f"[{100 + j}.5] mlx5_core: link up {j}" for j in range(20)]))]


async def main(nodes: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="inband-bench"))
    store = open_store(Settings(state_dir=tmp))
    world = SimWorld(tmp / "world.db")
    conductor = Conductor(store.nodes, fake_ports(world),
                          LifecycleSettings(auto_inspect=False, auto_deploy=False))
    intake = InbandIntake(store.nodes, store.tokens, HealthFindings(store.findings, conductor),
                          HealthSettings(probe_min_interval_s=0))
    tokens = []
    for i in range(nodes):
        node = await store.nodes.create(NewNode(state=NodeState.ACTIVE, hostname=f"n{i}"),
                                        actor="bench")
        await store.nodes.merge_facts(node.id, {"address": "127.0.0.1"})
        tokens.append(await intake.issue_token(node.id))
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(), token_ttl_s=600)
    http = BootHttp(BootHttpConfig(base_url="", artefacts_dir=tmp, assets_dir=tmp, kernel="k",
                                   initrd="i", kernel_args=""),
                    discovery=Discovery(store.nodes, conductor, TokenBucket(0.001, 1)),
                    agents=agents, tokens=store.tokens, renderer=Renderer(), inband=intake)
    runner = web.AppRunner(http.app(), access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    plan = periods()
    (tmp / "tokens.json").write_text(json.dumps(tokens))
    (tmp / "bodies.json").write_text(json.dumps([body for _, body in plan]))
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT,
        f"http://127.0.0.1:{sock.getsockname()[1]}/agent/v1/health",
        str(tmp / "tokens.json"), str(tmp / "bodies.json"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None
    for label, _ in plan:
        started = cpu_s()
        await client.stdout.readline()
        print(f"{label}: {(cpu_s() - started) / nodes * 1000:.2f} ms of the daemon's CPU "
              "per post")
        client.stdin.write(b"\n")
        await client.stdin.drain()
    await client.wait()
    await runner.cleanup()
    await conductor.stop()
    store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    asyncio.run(main(parser.parse_args().nodes))
