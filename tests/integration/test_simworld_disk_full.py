"""The simulator's world on a full disk (issue 23, "Low": in the demo a full disk sent half
the simulated nodes to ``inspect_failed``). SQLite rolls a transaction back itself when the
disk is full; the world must neither roll back a second time (which raised "cannot rollback
- no transaction is active" in place of the real reason) nor fail the step: it answers
``StoreUnavailable``, as the store does, so the step stops and resumes once space is back.
The world lives on a 256 KiB tmpfs in a private mount namespace (``unshare -m``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent("""
    import asyncio, json, os, sys
    from pathlib import Path
    from provisioner.simulation.world import SimWorld

    async def main(root: Path) -> dict[str, object]:
        world = SimWorld(root / "simworld.sqlite")
        await world.ensure("m1", "power_on", "power", "on")
        filler = root / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:
            pass
        os.close(fd)
        failures = []
        for i in range(20):  # rows until the pages the WAL still had are gone too
            try:
                await world.ensure(f"m{i}", "configure", "configured", "g" * 2000)
            except Exception as exc:
                failures.append([type(exc).__name__, str(exc)])
        filler.unlink()
        after = await world.ensure("m99", "power_on", "power", "on")
        world.close()
        return {"failures": failures, "after": after}

    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
""")


def test_a_full_disk_is_store_unavailable_not_a_failed_step(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) missing")
    mount = tmp_path / "world"
    mount.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs -o size=256k,mode=0700 simworld "$0" && exec "$1" "$2" "$0"',
         str(mount), sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {done.stderr}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    failures = result["failures"]
    assert failures, "the disk never filled"
    for kind, message in failures:
        assert kind == "StoreUnavailable", failures
        assert "disk is full" in message and "cannot rollback" not in message, failures
    assert result["after"] is True  # space back: the world writes again
