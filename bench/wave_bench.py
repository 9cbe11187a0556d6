"""A firmware wave over a simulated fleet of active NVL72 trays (issue 25): 56 NVLink domains
of 18 trays (1,008) by default, driven by one ``WaveDriver`` on a real SQLite store with the
simulation's BMCs (``provisioner.simulation.firmware``), until it stops at its failure
threshold: three trays of the last domain fail every update, so the wave works through the
whole fleet first.

    python3 bench/wave_bench.py [--domains 56] [--max-nodes 10] [--share 0.25]

Checked from the nodes' history in commit order (``tests/integration/fleet_firmware.py``,
the same checks as the CI test, which stops the wave earlier): at no moment more than the
domain share or ``max_nodes`` in servicing, each node serviced at most once, the wave
stopped at the threshold and started nothing after. Reported: the wave's wall time, nodes
per second, the peaks, the counts.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from provisioner.bmc.redfish import RedfishDriver
from provisioner.config import Settings
from provisioner.simulation.world import SimWorld
from provisioner.store.store import open_store
from tests.integration.fleet_firmware import TRAYS, check_history, drive_wave, tray


async def bench(domains: int, max_nodes: int, share: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="wave-bench-") as tmp:
        store = open_store(Settings(state_dir=Path(tmp) / "state"))
        world = SimWorld(Path(tmp) / "world.sqlite")
        driver = RedfishDriver(timeout_s=5)
        last = domains - 1
        faulty = [tray(last, TRAYS - 3), tray(last, TRAYS - 2), tray(last, TRAYS - 1)]
        try:
            made = time.monotonic()
            run = await drive_wave(store, world, driver, domains=domains, faulty=faulty,
                                   max_nodes=max_nodes, share=share, timeout_s=3600)
            fleet_s = time.monotonic() - made - run.seconds - 0.5
            peaks = await check_history(store, run, max_nodes=max_nodes, share=share)
            await run.conductor.stop()
            assert run.wave.status == "failed" and "stopped after 3 failures" in run.wave.reason
            return {"trays": len(run.fleet), "max_nodes": max_nodes, "share": share,
                    "fleet_made_s": round(fleet_s, 1), "wave_s": round(run.seconds, 1),
                    "nodes_per_s": round(peaks["serviced"] / run.seconds, 1), **peaks}
        finally:
            await driver.aclose()
            world.close()
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", type=int, default=56)
    parser.add_argument("--max-nodes", type=int, default=10)
    parser.add_argument("--share", type=float, default=0.25)
    args = parser.parse_args()
    # debug=False: tests/conftest.py (imported through fleet_firmware) turns asyncio debug on
    result = asyncio.run(bench(args.domains, args.max_nodes, args.share), debug=False)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
