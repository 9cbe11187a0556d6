"""The CPU of each store call a node's lifecycle makes, one call type at a time, in this
process on a SQLite store (the rack bench's daemon makes ~55 of them per node: its CPU per
node is mostly these; docs/performance.md, "Rack"), or with ``--postgres`` on a PostgreSQL
server the bench starts (the HA fleet's store: then PostgreSQL's CPU per call too, its
postmaster and backends read from /proc).

    python3 bench/store_calls_bench.py [--nodes 1000] [--calls 3000] [--postgres]

``--nodes``: the fleet already in the store (each node with an inspected node's facts), to
see whether a call's cost grows with the fleet. Reported: CPU microseconds per call
(``time.process_time``: every thread of this process, the event loop's hop included).
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import math
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.rack_bench import tree_cpu_seconds
from provisioner.config import Settings, SimulationSettings
from provisioner.domain import Node
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.drivers import simulated_facts
from provisioner.simulation.rack import simulated_nodes
from provisioner.store.store import Store, open_store
from tests.peers.postgres import PostgresServer, running_postgres

STEPS = ("pxe", "power-on", "agent", "write", "power-cycle", "callback")


async def timed(calls: int, call: Callable[[int], Awaitable[object]],
                server: int | None = None) -> tuple[float, float]:
    """CPU microseconds per ``call(i)``, over ``calls`` of them: ours, and the database
    server's (``server``: PostgreSQL's postmaster; nan on SQLite, which runs in ours)."""
    started = time.process_time()
    server_before = tree_cpu_seconds(server) if server else 0.0
    for i in range(calls):
        await call(i)
    ours = (time.process_time() - started) / calls * 1e6
    theirs = (tree_cpu_seconds(server) - server_before) / calls * 1e6 if server else math.nan
    return ours, theirs


async def fleet(store: Store, count: int) -> list[Node]:
    nodes = []
    for new in simulated_nodes(SimulationSettings(nodes=count, racks=max(1, count // 40))):
        node = await store.nodes.create(new, actor="bench")
        nodes.append(await store.nodes.merge_facts(node.id, simulated_facts(
            node.serial or node.id, node.serial)))
    return nodes


async def run(nodes: int, calls: int, pg: PostgresServer | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="pv-store-calls-"))
    url = pg.create_database("store_calls") if pg is not None else None
    store = open_store(Settings(state_dir=work / "state") if url is None
                       else Settings(state_dir=work / "state", database_url=url))
    try:
        fleet_nodes = await fleet(store, nodes)
        repo, own = store.nodes, store.ownership
        pick = [fleet_nodes[i % len(fleet_nodes)] for i in range(calls)]
        fences = {n.id: await own.claim(n.id) for n in fleet_nodes}
        current = {n.id: await repo.get(n.id) for n in fleet_nodes}

        async def get(i: int) -> object:
            return await repo.get(pick[i].id)

        async def checkpoint(i: int) -> object:
            node = current[pick[i].id]
            return await repo.save_checkpoint(node, STEPS[: i % len(STEPS) + 1],
                                              power_state="on" if i % 3 == 0 else None,
                                              fence=fences[node.id])

        async def transition(i: int) -> object:
            node = current[pick[i].id]
            target = NodeState.INSPECTING if node.state is NodeState.ENROLLED \
                else NodeState.ENROLLED
            node = await repo.transition(node, to_state=target, event="bench", actor="bench",
                                         fence=fences[node.id])
            current[node.id] = node
            return node

        async def merge(i: int) -> object:
            return await repo.merge_facts(pick[i].id, {"bench": i})

        async def credentials(i: int) -> object:
            return await repo.credentials(pick[i].id)

        async def claim(i: int) -> object:
            fence = await own.claim(pick[i].id)
            fences[pick[i].id] = fence or fences[pick[i].id]
            return fence

        where = "PostgreSQL" if pg is not None else "SQLite"
        print(f"| store call ({nodes:,} nodes in the store, {where}) | CPU per call | "
              "database server's CPU per call |")
        print("|---|---|---|")
        for name, call in (("get", get), ("save_checkpoint", checkpoint),
                           ("transition", transition), ("merge_facts", merge),
                           ("credentials", credentials), ("claim", claim)):
            await timed(min(calls, 200), call)  # warm: statement caches, pool
            ours, theirs = await timed(calls, call, pg.pid if pg is not None else None)
            print(f"| {name} | {ours:.0f} µs | "
                  f"{'n/a' if math.isnan(theirs) else f'{theirs:.0f} µs'} |")
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--postgres", action="store_true",
                        help="on a PostgreSQL server the bench starts (else SQLite)")
    args = parser.parse_args()
    if not args.postgres:
        asyncio.run(run(args.nodes, args.calls, None))
        return
    with running_postgres() as pg:
        asyncio.run(run(args.nodes, args.calls, pg))


if __name__ == "__main__":
    main()
