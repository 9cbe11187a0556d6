"""The SKU gate on a real inspection: a qemu VM (TCG, SeaBIOS + iPXE) enrolled with a profile
that expects a GPU it cannot have PXE-boots the daemon's inspection ramdisk, reports its facts
(the agent's own collector), and ends held in ``inspected`` with the reason, not deployed,
although ``auto_deploy`` is on. An operator's deploy is refused with the reason; the override
(CLI) lets the deploy policy take it on.

The profile also expects 8 InfiniBand ports: the VM has no HCA, so the ramdisk loads no
InfiniBand stack, its facts say so (``infiniband_driver``), and the gate does not hold it as
"saw 0 ports" but notes "InfiniBand not checked at inspection: no driver" in the record and the
history. The built ramdisk carries the stack (``/etc/modules.infiniband``) for nodes with one."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemon_proc import free_port
from tests.e2e.test_cli_api import clean_env
from tests.e2e.test_pxe_qemu import VMS, _missing, _wait_for_http, build_ramdisk, qemu_command
from tests.peers.netns import Namespace, bridged_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.root]
VM = VMS[0]  # BIOS: the quicker boot
REASON = "gpu-count: saw 0 GPUs (PCI), expected 1"
NOT_CHECKED = "InfiniBand not checked at inspection: no driver (no Mellanox HCA on PCI)"


def cli(ns: Namespace, url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env() | {"PROVISIONER_URL": url, "PROVISIONER_TOKEN": token}
    return subprocess.run([*ns.exec_prefix(), sys.executable, "-m", "provisioner", *args],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def node_json(ns: Namespace, url: str, token: str) -> dict[str, Any]:
    done = cli(ns, url, token, "node", "show", VM.serial, "--json")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def test_a_vm_that_does_not_match_its_profile_is_held_in_inspected(tmp_path: Path) -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "state"
    build_ramdisk(state / "artefacts")
    stack = [Path(line).name for line in initrd_file(
        state / "artefacts/inspect/initrd.gz", "etc/modules.infiniband").splitlines()]
    assert {"ib_core.ko", "mlx5_ib.ko", "ib_uverbs.ko", "ib_umad.ko"} <= set(stack), stack
    with bridged_namespace() as ns:
        tap = ns.add_tap()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config = tmp_path / "provisioner.toml"
        config.write_text(
            f'state_dir = "{state}"\n[api]\nlisten = "127.0.0.1:{port}"\n'
            '[lifecycle]\nauto_inspect = true\nauto_deploy = true\n'
            '[dhcp]\nmode = "authoritative"\ninterface = "br0"\n'
            'server_address = "10.77.0.1"\npool = "10.77.0.100-10.77.0.199"\n'
            '[tftp]\nlisten = "10.77.0.1:69"\n[http]\nlisten = "10.77.0.1:8080"\n'
            '[validation.profiles.gpu-node]\ngpu_count = 1\ngpu_model = "H100"\n'
            'ib_port_count = 8\nib_rate_gbps = 400\n')
        made = subprocess.run([sys.executable, "-m", "provisioner", "--config", str(config),
                               "token", "create", "--role", "admin", "--name", "e2e"],
                              capture_output=True, text=True, timeout=60, env=clean_env(),
                              check=True)
        token = made.stdout.splitlines()[-1]
        log = (tmp_path / "daemon.log").open("wb")
        daemon = subprocess.Popen(
            [*ns.exec_prefix(), sys.executable, "-m", "provisioner", "--config", str(config),
             "serve"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        vm: subprocess.Popen[bytes] | None = None
        try:
            _wait_for_http(ns, daemon, tmp_path)
            enrolled = cli(ns, url, token, "node", "enroll", "--hostname", "sku-vm",
                           "--serial", VM.serial, "--mac", VM.mac, "--profile", "gpu-node")
            assert enrolled.returncode == 0, enrolled.stderr
            console = (tmp_path / f"{VM.name}.console").open("wb")
            vm = subprocess.Popen(qemu_command(ns, VM, tap, tmp_path), stdout=console,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            node = wait_state(ns, url, token, {"inspected", "inspect_failed"}, 300, tmp_path)
            time.sleep(3)  # the deploy policy had its chance
            node = node_json(ns, url, token)
            assert node["state"] == "inspected", _logs(tmp_path)
            assert node["facts"]["sku"]["failures"] == [REASON]  # a VM has no GPU
            # ... nor an HCA: no InfiniBand driver loaded, noted, not "saw 0 ports"
            assert node["facts"]["infiniband_driver"] == {
                "loaded": False, "modules": [], "mellanox_functions": 0}, _logs(tmp_path)
            assert node["facts"]["sku"]["notes"] == [NOT_CHECKED]
            assert "infiniband-not-checked" in node["facts"]["sku"]["checks"]
            assert [h["reason"] for h in node["history"]
                    if h["event"] == "sku_not_checked"] == [NOT_CHECKED]
            assert "no Mellanox HCA, InfiniBand stack not loaded" in (
                tmp_path / f"{VM.name}.console").read_text(errors="replace")
            held = [h for h in node["history"] if h["event"] == "sku_held"]
            assert held and REASON in held[0]["reason"]
            assert "sku-override" in node["allowed_actions"]

            refused = cli(ns, url, token, "node", "action", "sku-vm", "deploy")
            assert refused.returncode == 1 and "does not match profile gpu-node" in (
                refused.stderr), refused.stderr
            assert REASON in refused.stderr

            ok = cli(ns, url, token, "node", "action", "sku-vm", "sku-override", "--reason",
                     "lab VM without a GPU")
            assert ok.returncode == 0, ok.stderr
            node = wait_state(ns, url, token, {"deploying", "deploy_failed"}, 30, tmp_path)
            events = [h["event"] for h in node["history"]]
            assert events.index("sku_override") < events.index("deploy")
        finally:
            if vm is not None:
                vm.kill()
            daemon.terminate()
            daemon.wait(20)
            log.close()


def wait_state(ns: Namespace, url: str, token: str, states: set[str], timeout_s: float,
               tmp_path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node = node_json(ns, url, token)
        if node["state"] in states:
            return node
        time.sleep(1.0)
    pytest.fail(f"node never reached {states}: " + _logs(tmp_path))


def _logs(tmp_path: Path) -> str:
    parts = []
    for name in ("daemon.log", f"{VM.name}.console"):
        path = tmp_path / name
        if path.exists():
            parts.append(f"--- {name} ---\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def initrd_file(initrd: Path, name: str) -> str:
    """One file of a gzip'd newc cpio archive (the ramdisk)."""
    data, offset = gzip.decompress(initrd.read_bytes()), 0
    while data[offset:offset + 6] == b"070701":
        size, namesize = int(data[offset + 54:offset + 62], 16), int(
            data[offset + 94:offset + 102], 16)
        start = offset + 110 + namesize
        start += -start % 4
        path = data[offset + 110:offset + 110 + namesize - 1].decode()
        if path.lstrip("./") == name:
            return data[start:start + size].decode()
        offset = start + size + (-(start + size) % 4)
    raise AssertionError(f"{name} is not in {initrd}")
