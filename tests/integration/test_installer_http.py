"""The installer path on the real boot HTTP server, a real store and real agent tokens: a
deploying node gets its installer's iPXE script, the installer fetches its documents with the
token in the path, and each document is checked by the installer world's own tools
(pykickstart's ``ksvalidator``, debconf's ``debconf-set-selections --checkonly``, Subiquity's
autoinstall JSON schema). The callback each document ends with is run by a real shell and
curl against a real HTTP server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from aiohttp import web

from provisioner.boot.http import BootHttp, BootHttpConfig
from provisioner.boot.install_http import InstallerHttp
from provisioner.boot.render import Renderer
from provisioner.config import InstallerSettings, LifecycleSettings
from provisioner.domain import NewNode, Node, Role
from provisioner.errors import ConfigError
from provisioner.install.unattended import (
    DOCUMENTS,
    INSTALLED_SUBSTEP,
    InstallPlan,
    UnattendedInstalls,
)
from provisioner.lifecycle.agents import AgentService, FactsMailbox
from provisioner.lifecycle.conductor import Conductor
from provisioner.lifecycle.discovery import Discovery, TokenBucket
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.conftest import fake_ports
from tests.peers.ports import free_tcp_port
from tests.unit.test_installer_plan import node as unit_node

S = NodeState
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "installer"
KEYS = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0a2V5 ops@mgmt",
        "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY= backup"]
DISKS = [{"name": "vda", "size_bytes": 64 * 10**9, "rotational": False}]
PROFILES = {
    "ubuntu": InstallerSettings(
        method="autoinstall", kernel="ubuntu/vmlinuz", initrd="ubuntu/initrd",
        repo_url="http://10.77.0.1:8080/artefacts/ubuntu-24.04.2-live-server-amd64.iso",
        ssh_authorized_keys=KEYS, time_server="ntp.example.org", kernel_args="console=ttyS0",
        kernel_arm64="ubuntu/vmlinuz-arm64", initrd_arm64="ubuntu/initrd-arm64",
        repo_url_arm64="http://10.77.0.1:8080/artefacts/ubuntu-24.04.2-live-server-arm64.iso"),
    "debian": InstallerSettings(
        method="preseed", kernel="debian/linux", initrd="debian/initrd.gz",
        repo_url="http://deb.debian.org/debian", ssh_authorized_keys=KEYS,
        time_server="10.77.0.1", timezone="Europe/Paris"),
    "rocky": InstallerSettings(
        method="kickstart", kernel="rocky/vmlinuz", initrd="rocky/initrd.img",
        repo_url="https://dl.rockylinux.org/pub/rocky/9/BaseOS/x86_64/os",
        ssh_authorized_keys=KEYS),
}
MACS = {"ubuntu": "52:54:00:10:00:01", "debian": "52:54:00:10:00:02",
        "rocky": "52:54:00:10:00:03", "imaged": "52:54:00:10:00:04"}


class Boot:
    def __init__(self, url: str, store: Store) -> None:
        self.url = url
        self.store = store

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, \
                session.get(f"{self.url}{path}") as response:
            return response.status, await response.text()

    async def node(self, profile: str, state: NodeState = S.DEPLOYING,
                   hostname: str | None = None) -> Node:
        """A node row written directly in ``state`` (as tests/conftest.py make_node does),
        with inspected disks."""
        node = await self.store.nodes.create(NewNode(
            state=state, hostname=hostname or f"{profile}-01.lab.example",
            serial=f"SER-{profile}", macs=(MACS[profile],), profile=profile), actor="test")
        return await self.store.nodes.merge_facts(node.id, {"disks": DISKS})

    async def script_token(self, mac: str) -> tuple[str, str]:
        status, script = await self.get(f"/boot/{mac}.ipxe")
        assert status == 200 and script.startswith("#!ipxe")
        found = re.search(r"/install/([A-Za-z0-9_-]+)/", script)
        assert found is not None, script
        return script, found.group(1)


@pytest.fixture
async def boot(store: Store, world: SimWorld, tmp_path: Path) -> AsyncIterator[Boot]:
    base = fake_ports(world)
    conductor = Conductor(store.nodes, base, LifecycleSettings(auto_deploy=False,
                                                                auto_inspect=False))
    agents = AgentService(conductor, store.nodes, store.tokens, FactsMailbox(), token_ttl_s=600)
    discovery = Discovery(store.nodes, conductor, TokenBucket(rate_per_s=1, burst=5))
    port = free_tcp_port()  # the scripts name the server's URL, so it is known first
    url = f"http://127.0.0.1:{port}"
    renderer = Renderer()
    installer = InstallerHttp(UnattendedInstalls(PROFILES, base_url=url), base_url=url,
                              nodes=store.nodes, tokens=store.tokens, renderer=renderer)
    http = BootHttp(BootHttpConfig(base_url=url, artefacts_dir=tmp_path, assets_dir=tmp_path,
                                   kernel="inspect/vmlinuz", initrd="inspect/initrd.gz",
                                   kernel_args="console=ttyS0"),
                    discovery=discovery, agents=agents, tokens=store.tokens,
                    renderer=renderer, installer=installer)
    runner = web.AppRunner(http.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield Boot(url, store)
    await conductor.stop()
    await runner.cleanup()


# -- what the installers' own tools say ---------------------------------------------------------

def ksvalidator() -> str:
    beside = Path(sys.executable).parent / "ksvalidator"
    found = str(beside) if beside.exists() else shutil.which("ksvalidator")
    assert found, "ksvalidator (pykickstart, the dev extra) is missing"
    return found


async def run(*argv: str, stdin: bytes | None = None,
              env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env)
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def check_document(name: str, text: str, tmp_path: Path) -> None:
    """The installer's own validator accepts the document (and refuses a broken one)."""
    path = tmp_path / name
    if name == "ks.cfg":
        path.write_text(text)
        rc, out = await run(ksvalidator(), "-v", "RHEL9", str(path))
        assert rc == 0, out
    elif name == "preseed.cfg":
        path.write_text(text)
        rc, out = await run("debconf-set-selections", "--checkonly", str(path))
        assert rc == 0 and "warning" not in out, out
    elif name == "user-data":
        assert text.startswith("#cloud-config\n")
        data = yaml.safe_load(text)
        schema = json.loads((FIXTURES / "autoinstall-schema.json").read_text())
        jsonschema.validate(data["autoinstall"], schema)
        assert data["autoinstall"]["version"] == 1
    else:
        assert isinstance(yaml.safe_load(text), dict)


async def test_the_validators_refuse_broken_documents(tmp_path: Path) -> None:
    """The checks above have teeth: each tool rejects a document with a mistake in it."""
    broken = tmp_path / "broken.cfg"
    broken.write_text("d-i netcfg/get_hostname\n")
    assert (await run("debconf-set-selections", "--checkonly", str(broken)))[0] != 0
    broken.write_text("network --device=eth0 --bootproto=sometimes\n")
    assert (await run(ksvalidator(), "-v", "RHEL9", str(broken)))[0] != 0
    schema = json.loads((FIXTURES / "autoinstall-schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": 2, "late-commands": "curl"}, schema)


# -- serving --------------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["ubuntu", "debian", "rocky"])
async def test_deploying_node_gets_its_installer_and_valid_documents(
        boot: Boot, profile: str, tmp_path: Path) -> None:
    node = await boot.node(profile)
    script, token = await boot.script_token(MACS[profile])
    method = PROFILES[profile].method
    assert f"provisioner: {'autoinstall' if method == 'autoinstall' else method}" in script
    assert f"{boot.url}/artefacts/{PROFILES[profile].kernel}" in script
    assert "provisioner.token" not in script  # not the agent ramdisk
    for name in DOCUMENTS[method]:
        status, text = await boot.get(f"/install/{token}/{name}")
        assert status == 200, text
        await check_document(name, text, tmp_path)
        if name != "vendor-data":
            assert node.hostname is not None and node.hostname in text
    other = next(n for n in ("user-data", "preseed.cfg", "ks.cfg") if n not in DOCUMENTS[method])
    assert (await boot.get(f"/install/{token}/{other}"))[0] == 404


async def test_a_node_with_an_image_profile_gets_the_agent(boot: Boot) -> None:
    await boot.node("imaged")
    status, script = await boot.get(f"/boot/{MACS['imaged']}.ipxe")
    assert status == 200 and "provisioner.token=" in script and "/install/" not in script
    token = re.search(r"provisioner.token=(\S+)", script)
    assert token is not None
    assert (await boot.get(f"/install/{token.group(1)}/user-data"))[0] == 404


async def test_missing_wrong_and_non_agent_tokens_are_refused(
        boot: Boot, caplog: pytest.LogCaptureFixture) -> None:
    await boot.node("debian")
    _, token = await boot.script_token(MACS["debian"])
    caplog.set_level(logging.WARNING, logger="provisioner.boot.install_http")
    _, operator = await boot.store.tokens.create("alice", Role.OPERATOR)
    for bad in ("pvt_nope", token[:-1], token + "x", operator, "%20"):
        status, body = await boot.get(f"/install/{bad}/preseed.cfg")
        assert status == 401, bad
        assert "preseed" not in body and "debian-01" not in body
    assert (await boot.get("/install//preseed.cfg"))[0] in (401, 404)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) >= 5
    assert all(token not in message and operator not in message for message in refused)


async def test_a_token_yields_only_its_own_nodes_documents(boot: Boot) -> None:
    await boot.node("debian", hostname="alpha.lab.example")
    _, token_a = await boot.script_token(MACS["debian"])
    await boot.node("rocky", hostname="bravo.lab.example")
    _, token_b = await boot.script_token(MACS["rocky"])
    status, text = await boot.get(f"/install/{token_a}/preseed.cfg")
    assert status == 200 and "alpha" in text and "bravo" not in text
    assert token_a in text and token_b not in text
    assert (await boot.get(f"/install/{token_a}/ks.cfg"))[0] == 404  # bravo's format
    status, text = await boot.get(f"/install/{token_b}/ks.cfg")
    assert status == 200 and "bravo" in text and "alpha" not in text


async def test_documents_are_only_served_while_deploying(boot: Boot) -> None:
    node = await boot.node("ubuntu")
    _, token = await boot.script_token(MACS["ubuntu"])
    await boot.store.nodes.transition(node, to_state=S.CONFIGURING, event="done", actor="test")
    status, body = await boot.get(f"/install/{token}/user-data")
    assert status == 409 and "not deploying" in body


async def test_after_the_installed_callback_the_node_boots_from_disk(boot: Boot) -> None:
    node = await boot.node("rocky")
    await boot.script_token(MACS["rocky"])
    await boot.store.nodes.save_checkpoint(node, ["bootdev-pxe", INSTALLED_SUBSTEP])
    status, script = await boot.get(f"/boot/{MACS['rocky']}.ipxe")
    assert status == 200 and "sanboot" in script and "inst.ks" not in script


async def test_a_node_with_a_bad_hostname_gets_a_retry_script_not_an_installer(
        boot: Boot) -> None:
    await boot.node("debian", hostname="bad host'; reboot")
    status, script = await boot.get(f"/boot/{MACS['debian']}.ipxe")
    assert status == 200 and script.startswith("#!ipxe")
    lines = script.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["#!ipxe", "echo", "sleep", "chain"]
    assert "cannot install" in lines[1] and "hostname" in lines[1]
    assert lines[1].endswith("; retrying in 60 s")  # the template's own ';', none of the name's
    assert not set("'$;&|") & set(lines[1].removesuffix("; retrying in 60 s"))


# -- the callback, run as the installer would run it ---------------------------------------------

class Callbacks:
    def __init__(self) -> None:
        self.received: list[tuple[str, str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((request.headers.get("Authorization", ""),
                              request.headers.get("Content-Type", ""), await request.json()))
        return web.json_response({"recorded": True})


@pytest.fixture
async def callbacks() -> AsyncIterator[tuple[str, Callbacks]]:
    sink = Callbacks()
    app = web.Application()
    app.router.add_post("/agent/v1/callback", sink.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", sink
    await runner.cleanup()


def rendered(method: str, base_url: str, hostname: str,
             login_user: str = "root") -> tuple[InstallPlan, str]:
    profile = next(p for p, s in PROFILES.items() if s.method == method)
    installs = UnattendedInstalls(PROFILES, base_url=base_url, login_user=login_user)
    plan = installs.plan(unit_node(profile=profile, hostname=hostname, facts={"disks": DISKS}),
                         token="pvt_" + "Zz9_" * 10 + "abc")
    name = {"autoinstall": "user-data", "preseed": "preseed.cfg", "kickstart": "ks.cfg"}[method]
    return plan, Renderer().render_document(f"install/{name}.j2", **plan.values())


@pytest.mark.parametrize("method", ["autoinstall", "preseed", "kickstart"])
async def test_the_final_step_posts_the_installed_callback(
        callbacks: tuple[str, Callbacks], method: str, tmp_path: Path) -> None:
    url, sink = callbacks
    plan, text = rendered(method, url, "gpu-042.lab.example")
    target = tmp_path / "target"
    target.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    in_target = bin_dir / "in-target"  # d-i's in-target chroots into /target: here, just run
    in_target.write_text('#!/bin/sh\nexec "$@"\n')
    in_target.chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    if method == "autoinstall":
        command = yaml.safe_load(text)["autoinstall"]["late-commands"][-1]
        assert command[:3] == ["curtin", "in-target", "--"]
        rc, out = await run(*command[3:], env=env)
    elif method == "preseed":
        line = next(x for x in text.splitlines() if x.startswith("d-i preseed/late_command "))
        command = line.split(" string ", 1)[1].replace("/target/", f"{target}/")
        rc, out = await run("sh", "-c", command, env=env)
    else:
        post = text.split("%post", 1)[1].split("\n", 1)[1].split("%end", 1)[0]
        # %post runs chrooted in the new system: here /root/ is the test's target
        rc, out = await run("bash", "-e", "-c", post.replace("/root/", f"{target}/root/"),
                            env=env)
    assert rc == 0, out
    if method != "autoinstall":  # autoinstall: cloud-init's users[root].ssh_authorized_keys
        keys = target / "root" / ".ssh" / "authorized_keys"
        assert keys.read_text().splitlines() == KEYS and keys.stat().st_mode & 0o777 == 0o600
    else:
        users = yaml.safe_load(text)["autoinstall"]["user-data"]["users"]
        assert users == [{"name": "root", "lock_passwd": True, "ssh_authorized_keys": KEYS}]
    assert sink.received == [(f"Bearer {plan.token}", "application/json",
                              {"event": "installed", "hostname": "gpu-042.lab.example"})]


@pytest.mark.parametrize("method", ["autoinstall", "preseed", "kickstart"])
async def test_a_non_root_ssh_user_is_created_with_the_keys_and_sudo(
        callbacks: tuple[str, Callbacks], method: str, tmp_path: Path) -> None:
    """``install.ssh_user = "ansible"``: the installed OS has that user, the keys and
    password-less sudo, so Ansible can log in and ``become``. The documents still pass their
    validators; the shell parts run with ``useradd``/``chown`` recorded, not done."""
    url, _sink = callbacks
    _plan, text = rendered(method, url, "gpu-043", login_user="ansible")
    name = {"autoinstall": "user-data", "preseed": "preseed.cfg", "kickstart": "ks.cfg"}[method]
    await check_document(name, text, tmp_path)
    if method == "autoinstall":
        users = yaml.safe_load(text)["autoinstall"]["user-data"]["users"]
        assert users[1] == {"name": "ansible", "lock_passwd": True, "shell": "/bin/bash",
                            "sudo": "ALL=(ALL) NOPASSWD:ALL", "ssh_authorized_keys": KEYS}
        return
    target, bin_dir, calls = tmp_path / "target", tmp_path / "bin", tmp_path / "calls"
    (target / "etc" / "sudoers.d").mkdir(parents=True)
    bin_dir.mkdir()
    for tool in ("useradd", "chown", "restorecon"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
    (bin_dir / "id").write_text("#!/bin/sh\nexit 1\n")  # no such user yet
    (bin_dir / "in-target").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")  # the callback has its own test
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    if method == "preseed":
        line = next(x for x in text.splitlines() if x.startswith("d-i preseed/late_command "))
        rc, out = await run("sh", "-c", line.split(" string ", 1)[1].replace(
            "/target/", f"{target}/"), env=env)
    else:
        post = text.split("%post", 1)[1].split("\n", 1)[1].split("%end", 1)[0]
        for prefix in ("/root/", "/home/", "/etc/"):
            post = post.replace(prefix, f"{target}{prefix}")
        rc, out = await run("bash", "-e", "-c", post, env=env)
    assert rc == 0, out
    keys = target / "home" / "ansible" / ".ssh" / "authorized_keys"
    assert keys.read_text().splitlines() == KEYS and keys.stat().st_mode & 0o777 == 0o600
    sudoers = target / "etc" / "sudoers.d" / "90-provisioner"
    assert sudoers.read_text() == "ansible ALL=(ALL) NOPASSWD:ALL\n"
    assert sudoers.stat().st_mode & 0o777 == 0o440
    recorded = calls.read_text().splitlines()
    assert "useradd -m -s /bin/bash ansible" in recorded, recorded
    assert any(c.startswith("chown -R ansible: ") for c in recorded), recorded


def test_an_unusable_ssh_user_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="install.ssh_user"):
        UnattendedInstalls(PROFILES, base_url="http://10.0.0.1:8080", login_user="bad user;")


async def test_an_arm64_node_gets_its_installer_as_a_grub_cfg(boot: Boot, tmp_path: Path) -> None:
    """Grace: the same plan in GRUB's words, with the profile's arm64 kernel, initrd and ISO."""
    node = await boot.node("ubuntu")
    status, cfg = await boot.get(f"/boot/{MACS['ubuntu']}.grub")
    assert status == 200, cfg
    lines = cfg.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["echo", "linux", "initrd", "boot"], cfg
    server = boot.url.removeprefix("http://")
    assert lines[1].startswith(f"linux (http,{server})/artefacts/ubuntu/vmlinuz-arm64 ")
    assert lines[2] == f"initrd (http,{server})/artefacts/ubuntu/initrd-arm64"
    assert "ubuntu-24.04.2-live-server-arm64.iso" in lines[1] and " autoinstall " in lines[1]
    found = re.search(r"/install/([A-Za-z0-9_-]+)/", lines[1])
    assert found is not None, cfg
    status, text = await boot.get(f"/install/{found.group(1)}/user-data")
    assert status == 200
    await check_document("user-data", text, tmp_path)
    await boot.store.nodes.save_checkpoint(node, ["bootdev-pxe", INSTALLED_SUBSTEP])
    status, cfg = await boot.get(f"/boot/{MACS['ubuntu']}.grub")
    assert cfg.splitlines()[-1] == "exit"  # installed: the firmware boots the disk


async def test_an_arm64_node_without_an_arm64_installer_is_told_why(boot: Boot) -> None:
    """Never an x86 kernel to an arm64 machine: the profile has no kernel_arm64, so the
    node's grub.cfg says so and asks again."""
    await boot.node("debian")
    status, cfg = await boot.get(f"/boot/{MACS['debian']}.grub")
    assert status == 200
    lines = cfg.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["echo", "sleep", "configfile"], cfg
    assert "no arm64 installer" in lines[0] and "kernel_arm64" in lines[0]
    assert "debian/linux" not in cfg
