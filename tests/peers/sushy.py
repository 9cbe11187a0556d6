"""sushy-tools' Redfish emulator with its fake driver (PEERS.md §6), on a free loopback
port, with HTTP basic auth (an htpasswd-style bcrypt file). Stopped by PID.

``with running_sushy(tmp_path, systems=2) as emu:`` then ``emu.url`` and ``emu.uuids``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.peers.ports import free_tcp_port, stop_process

USER: Final = "admin"
PASSWORD: Final = "password"
READY_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class Sushy:
    url: str
    uuids: tuple[str, ...]
    log: Path


def sushy_unavailable_reason() -> str | None:
    if shutil.which("sushy-emulator", path=str(Path(sys.executable).parent)) is None \
            and shutil.which("sushy-emulator") is None:
        return "sushy-emulator not found: pip install sushy-tools (the test extra)"
    return None



def _emulator() -> str:
    local = Path(sys.executable).parent / "sushy-emulator"
    return str(local) if local.exists() else "sushy-emulator"


@contextmanager
def running_sushy(workdir: Path, *, systems: int = 1) -> Iterator[Sushy]:
    import bcrypt  # a sushy-tools dependency

    workdir.mkdir(parents=True, exist_ok=True)
    port = free_tcp_port()
    uuids = tuple(f"00000000-0000-0000-0000-{1001 + i:012d}" for i in range(systems))
    fake = [{"uuid": uuid, "name": f"gpu-node-{i + 1:02d}", "power_state": "Off",
             "external_notifier": False, "nics": [{"mac": f"52:54:00:00:00:{i + 1:02x}",
                                                   "ip": f"127.0.2.{i + 1}"}]}
            for i, uuid in enumerate(uuids)]
    digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (workdir / "htpasswd").write_text(f"{USER}:{digest}\n")
    (workdir / "state").mkdir(exist_ok=True)
    (workdir / "emulator.conf").write_text(
        f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\n"
        f"SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        f"SUSHY_EMULATOR_STATE_DIR = '{workdir / 'state'}'\n"
        f"SUSHY_EMULATOR_AUTH_FILE = '{workdir / 'htpasswd'}'\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake!r}\n")
    log_path = workdir / "sushy.log"
    log = log_path.open("wb")
    proc = subprocess.Popen([_emulator(), "--config", str(workdir / "emulator.conf"),
                             "--fake"], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log_path)
        yield Sushy(url, uuids, log_path)
    finally:
        stop_process(proc)
        log.close()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sushy-emulator exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/redfish/v1/", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"sushy-emulator not ready after {READY_TIMEOUT_S} s")


@dataclass(frozen=True)
class SushyStatic:
    url: str
    root: Path
    """The served copy of the tree: edit it to change what the BMC answers."""

    def edit(self, path: str, **changes: object) -> None:
        """Set top-level fields of ``/redfish/v1/<path>`` (``Status={...}``...)."""
        file = self.root / path / "index.json"
        data = json.loads(file.read_text())
        data.update(changes)
        file.write_text(json.dumps(data, indent=2))

    def read(self, path: str) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.root / path / "index.json").read_text())
        return data

    def write(self, path: str, data: dict[str, object]) -> None:
        (self.root / path).mkdir(parents=True, exist_ok=True)
        (self.root / path / "index.json").write_text(json.dumps(data, indent=2))


def sushy_static_unavailable_reason() -> str | None:
    if shutil.which("sushy-static", path=str(Path(sys.executable).parent)) is None \
            and shutil.which("sushy-static") is None:
        return "sushy-static not found: pip install sushy-tools (the test extra)"
    return None


@contextmanager
def running_sushy_static(workdir: Path, tree: Path) -> Iterator[SushyStatic]:
    """sushy-tools' static emulator serving a copy of the mockup ``tree`` (read afresh on
    every GET, so an edit of the copy is what the next GET answers). The root's
    ``Links.Sessions`` is dropped in the copy: sushy-static answers a login without a
    token, so the driver must use basic auth."""
    root = workdir / "mockup"
    shutil.copytree(tree, root)
    service = json.loads((root / "index.json").read_text())
    if isinstance(service.get("Links"), dict):
        service["Links"].pop("Sessions", None)
    (root / "index.json").write_text(json.dumps(service, indent=2))
    port = free_tcp_port()
    local = Path(sys.executable).parent / "sushy-static"
    log = (workdir / "sushy-static.log").open("wb")
    proc = subprocess.Popen([str(local) if local.exists() else "sushy-static", "-i",
                             "127.0.0.1", "-p", str(port), "-m", str(root)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/redfish/v1/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("sushy-static did not start: " + (
                        workdir / "sushy-static.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        yield SushyStatic(url, root)
    finally:
        stop_process(proc)
        log.close()
