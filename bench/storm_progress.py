"""A storm round second by second, from the clients' phase ends the storm bench keeps with
``--logs DIR`` (``DIR/<stack>/clients-N.json``): how many clients are in TFTP and in their
HTTP downloads, how many are done, and the artefact MiB finished by then.

It shows how a stack orders its work, which the last and median clients alone do not: a
stack that lets the late clients' DHCP and TFTP go first leaves many downloads half done
until the end; one that lets the downloads go first finishes clients steadily
(docs/performance.md, "Boot storm", session 18).

    python3 bench/storm_progress.py DIR/provisioner/clients-1.json DIR/dnsmasq/clients-1.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def progress(clients: list[dict[str, object]], kernel_mib: float,
             initrd_mib: float) -> list[tuple[int, int, int, int, int]]:
    """``(second, in TFTP, in HTTP, done, MiB finished)`` for each whole second."""
    ends = []
    for c in clients:
        phases = c.get("phases")
        start = c.get("start")
        if c.get("error") is None and isinstance(phases, dict) and isinstance(start, float) \
                and {"dhcp", "tftp", "script", "kernel", "initrd"} <= phases.keys():
            ends.append({p: start + float(phases[p]) for p in phases})
    last = max((e["initrd"] for e in ends), default=0.0)
    rows = []
    for t in range(math.ceil(last) + 1):
        tftp = sum(1 for e in ends if e["dhcp"] <= t < e["tftp"])
        http = sum(1 for e in ends if e["script"] <= t < e["initrd"])
        done = sum(1 for e in ends if e["initrd"] <= t)
        mib = sum((kernel_mib if e["kernel"] <= t else 0) + (initrd_mib if e["initrd"] <= t
                                                            else 0) for e in ends)
        rows.append((t, tftp, http, done, round(mib)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args()
    for path in args.files:
        run = json.loads(path.read_text())  # the round's artefact sizes and its clients
        print(f"{path}\n| s | in TFTP | in HTTP | done | MiB finished |\n|---|---|---|---|---|")
        for row in progress(run["clients"], run["kernel_bytes"] / (1 << 20),
                            run["initrd_bytes"] / (1 << 20)):
            print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
