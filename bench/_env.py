"""Benches run as a new user types them after the README's set-up: ``python3 bench/X.py``
from the repository root (``sudo`` where a bench needs root). When this interpreter cannot
import ``provisioner``, the bench runs itself again under the project's virtualenv, the path
``scripts/setup.sh`` prints last (it installs nothing that is already there). The repository
root goes on ``sys.path`` too: some benches start the test peers under ``tests/``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_AGAIN = "PROVISIONER_BENCH_IN_VENV"


def ensure_project_python() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(1, str(ROOT))
    if importlib.util.find_spec("provisioner") is not None and \
            importlib.util.find_spec("aiohttp") is not None:
        return
    if os.environ.get(_AGAIN):
        raise SystemExit("bench: provisioner is not importable, even in the project's "
                         "virtualenv (run: bash scripts/setup.sh)")
    setup = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], text=True,
                           stdout=subprocess.PIPE, check=False)
    if setup.returncode != 0 or not setup.stdout.strip():
        raise SystemExit("bench: scripts/setup.sh failed; run it to see why")
    python = Path(setup.stdout.strip().splitlines()[-1]) / "bin" / "python"
    env = dict(os.environ, **{_AGAIN: "1"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    os.execve(python, [str(python), *sys.argv], env)
