"""``scripts/setup.sh --runtime``, which ``scripts/demo.sh`` runs, installs what the daemon
needs on the demo configuration and no test peer: read from the script's own arrays and from
its ``--dry-run`` (which installs nothing and creates no virtualenv)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"
DEMO = ROOT / "scripts" / "demo.sh"


def array(name: str) -> list[str]:
    """The words of the bash array ``name=( ... )`` in setup.sh, comments dropped."""
    match = re.search(rf"^{name}=\((.*?)^\)", SETUP.read_text(), re.M | re.S)
    assert match, name
    return [word for line in match.group(1).splitlines()
            for word in line.split("#", 1)[0].split()]


def dry_run(tmp_path: Path, *args: str) -> tuple[list[str], str]:
    """(stderr lines, the last stdout line) of ``setup.sh ARGS --dry-run``."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run(["bash", str(SETUP), *args, "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines(), done.stdout.splitlines()[-1]


def packages(log: list[str]) -> list[str]:
    (line,) = [line for line in log if line.startswith("setup.sh: packages: ")]
    return line.removeprefix("setup.sh: packages: ").split()


def test_runtime_lists_no_test_peer(tmp_path: Path) -> None:
    runtime, everything = array("RUNTIME_PACKAGES"), array("APT_PACKAGES")
    assert runtime == ["python3", "python3-venv"]
    peers = set(everything) - set(runtime)
    assert {"slurmctld", "qemu-system-x86", "kea-dhcp4-server", "postgresql-15"} <= peers
    log, venv = dry_run(tmp_path, "--runtime")
    assert packages(log) == runtime and not set(packages(log)) & peers
    assert "setup.sh: foreign architectures: none" in log
    assert not any("kube" in line.lower() for line in log), log
    assert re.fullmatch(rf"{tmp_path}/cache/provisioner/venv-runtime-[0-9a-f]{{12}}", venv)
    assert f"setup.sh: would create {venv} (pip install -e .)" in log
    assert not (tmp_path / "cache").exists()  # a dry run creates nothing


def test_full_setup_still_lists_the_test_peers(tmp_path: Path) -> None:
    log, venv = dry_run(tmp_path)
    assert packages(log) == array("APT_PACKAGES")
    assert "setup.sh: foreign architectures: arm64" in log
    assert re.fullmatch(rf"{tmp_path}/cache/provisioner/venv-[0-9a-f]{{12}}", venv)
    assert f"setup.sh: would create {venv} (pip install -e .[test])" in log


def test_demo_sets_up_the_runtime_only() -> None:
    calls = [line for line in DEMO.read_text().splitlines()
             if "scripts/setup.sh" in line and not line.lstrip().startswith("#")]
    assert calls and all('setup.sh" --runtime ' in line for line in calls), calls
    # and nothing else the runtime lacks: no curl (not on a fresh Debian)
    code = [line.split("#", 1)[0] for line in DEMO.read_text().splitlines()]
    assert not [line for line in code if re.search(r"\bcurl\b", line)]


def test_unknown_option_is_a_usage_error() -> None:
    done = subprocess.run(["bash", str(SETUP), "--runtme"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and "usage: bash scripts/setup.sh" in done.stderr
