"""An install from the wheel starts (issue 30, item 1): the built wheel carries ``pxe/``
(templates and the ramdisk's ``init``), ``playbooks/`` and ``inventory/`` as package data; a
clean virtualenv with nothing but that wheel and its dependencies runs ``provisioner serve``
on ``examples/demo.toml`` past the config and playbook lookups, answers ``/healthz`` and
finds every shipped file inside its own site-packages."""

from __future__ import annotations

import stat
import subprocess
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.wheel_support import ROOT, build_wheel, install_into_new_venv, pip_env
from tests.peers.ports import free_tcp_port, stop_process

pytestmark = pytest.mark.e2e
SHIPPED = ("pxe", "playbooks", "inventory")


def _source_files(name: str) -> set[str]:
    return {str(path.relative_to(ROOT)) for path in (ROOT / name).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    provisioner: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(base / "dist")
    venv = base / "venv"
    return Installed(wheel, venv, install_into_new_venv(venv, wheel))


def test_the_wheel_carries_every_shipped_file(installed: Installed) -> None:
    prefix = "provisioner/_shipped/"
    with zipfile.ZipFile(installed.wheel) as whl:
        infos = {info.filename[len(prefix):]: info for info in whl.infolist()
                 if info.filename.startswith(prefix)}
    expected = set().union(*(_source_files(name) for name in SHIPPED))
    assert set(infos) == expected
    for executable in ("pxe/ramdisk/init", "inventory/provisioner.py"):
        assert (ROOT / executable).stat().st_mode & stat.S_IXUSR
        assert (infos[executable].external_attr >> 16) & stat.S_IXUSR, executable


def test_the_installed_package_finds_its_files_in_site_packages(installed: Installed) -> None:
    probe = ("from provisioner.boot.render import default_templates_dir\n"
             "from provisioner.install.workdir import find_playbooks\n"
             "from provisioner.ramdisk.build import ramdisk_sources\n"
             "from provisioner import shipped\n"
             "print(default_templates_dir()); print(find_playbooks(None))\n"
             "print(ramdisk_sources()); print(shipped.find('inventory', 'provisioner.py'))\n")
    done = subprocess.run([str(installed.venv / "bin" / "python"), "-c", probe], cwd="/",
                          env=pip_env(), capture_output=True, text=True, timeout=60, check=True)
    site = next((installed.venv / "lib").glob("python3*/site-packages")).resolve()
    data = site / "provisioner" / "_shipped"
    assert [Path(line) for line in done.stdout.split()] == [
        data / "pxe", data / "playbooks", data / "pxe" / "ramdisk", data / "inventory"]
    assert (data / "pxe" / "ramdisk" / "init").stat().st_mode & stat.S_IXUSR


@pytest.fixture
def demo_config(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    port = free_tcp_port()
    text = (ROOT / "examples" / "demo.toml").read_text()
    text = text.replace('state_dir = "/tmp/provisioner-demo"', f'state_dir = "{tmp_path}/state"')
    text = text.replace('listen = "127.0.0.1:8700"', f'listen = "127.0.0.1:{port}"')
    assert str(tmp_path) in text and str(port) in text  # demo.toml still has those two lines
    config = tmp_path / "demo.toml"
    config.write_text(text)
    yield config, port


def test_serve_from_the_wheel_answers_healthz(installed: Installed,
                                              demo_config: tuple[Path, int],
                                              tmp_path: Path) -> None:
    config, port = demo_config
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(installed.provisioner), "--config", str(config), "serve"],
                                cwd="/", env=pip_env(PYTHONUNBUFFERED="1"), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        body = _healthz(proc, port, log)
        assert body, log.read_text()
        check = subprocess.run([str(installed.provisioner), "--config", str(config),
                                "config", "show"], cwd="/", env=pip_env(), capture_output=True,
                               text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stderr
    finally:
        stop_process(proc)
    assert "no shipped playbooks" not in log.read_text()


def _healthz(proc: subprocess.Popen[bytes], port: int, log: Path) -> bytes:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                return bytes(resp.read())
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"no /healthz in 60 s: {log.read_text()[-3000:]}")
