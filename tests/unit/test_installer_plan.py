"""The installer path's per-node values and iPXE scripts: which profiles take it, the kernel
command line of each installer, and values that would inject commands refused up front."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from provisioner.boot.render import Renderer
from provisioner.config import InstallerSettings, load_settings
from provisioner.domain import Node
from provisioner.errors import ConfigError, FatalError, ProvisionerError, RetryableError
from provisioner.ids import NodeId
from provisioner.install.unattended import INSTALLED_SUBSTEP, UnattendedInstalls
from provisioner.lifecycle.states import NodeState

BASE = "http://10.77.0.1:8080"
TOKEN = "pvt_" + "A1b2" * 10 + "xyz"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0a2V5 ops@mgmt"
DISKS = [{"name": "sda", "size_bytes": 4 * 10**12, "rotational": True},
         {"name": "nvme0n1", "size_bytes": 960 * 10**9, "rotational": False},
         {"name": "nvme1n1", "size_bytes": 3840 * 10**9, "rotational": False}]
METHODS: dict[str, dict[str, Any]] = {
    "autoinstall": {"kernel": "ubuntu/casper/vmlinuz", "initrd": "ubuntu/casper/initrd",
                    "repo_url": "http://10.77.0.1:8080/artefacts/ubuntu-24.04-live-server.iso"},
    "preseed": {"kernel": "debian/linux", "initrd": "debian/initrd.gz",
                "repo_url": "http://deb.debian.org/debian"},
    "kickstart": {"kernel": "https://dl.rockylinux.org/pub/rocky/9/BaseOS/x86_64/os/images/"
                            "pxeboot/vmlinuz", "initrd": "rocky/initrd.img",
                  "repo_url": "https://dl.rockylinux.org/pub/rocky/9/BaseOS/x86_64/os"},
}


def node(**changes: Any) -> Node:
    now = datetime.now(UTC)
    base = Node(id=NodeId("n-7"), state=NodeState.DEPLOYING, hostname="gpu-007.r1.example",
                serial="S7", macs=("52:54:00:77:00:10",), maintenance=False,
                maintenance_reason="", profile="p", rack="r1", position=None,
                facts={"disks": DISKS}, last_error="", checkpoint=(), version=1,
                history_seq=1, bmc=None, created_at=now, updated_at=now)
    return replace(base, **changes)


def installs(method: str, **extra: Any) -> UnattendedInstalls:
    settings = InstallerSettings(method=method, **METHODS[method] | {
        "ssh_authorized_keys": [KEY], "root_disk": "smallest",
        "root_disk_nonrotational": True} | extra)
    return UnattendedInstalls({"p": settings}, base_url=BASE + "/")


def kernel_line(method: str, **extra: Any) -> list[str]:
    plan = installs(method, **extra).plan(node(), token=TOKEN)
    script = Renderer().render(f"install/{method}", **plan.values())
    lines = script.splitlines()
    assert lines[0] == "#!ipxe" and lines[-1] == "boot"
    assert "{" not in script and "$" not in script
    return next(line for line in lines if line.startswith("kernel ")).split(" ")


def test_only_profiles_with_an_installer_take_the_installer_path() -> None:
    chosen = installs("preseed")
    assert chosen.uses_installer(node()) and chosen.method(node()) == "preseed"
    assert not chosen.uses_installer(node(profile="gpu-worker"))
    assert not chosen.uses_installer(node(profile=None))
    assert chosen.serves(node(), "preseed.cfg") and not chosen.serves(node(), "ks.cfg")


def test_autoinstall_kernel_line() -> None:
    words = kernel_line("autoinstall", kernel_args="console=ttyS0")
    assert words[:4] == ["kernel", f"{BASE}/artefacts/ubuntu/casper/vmlinuz", "initrd=initrd",
                         "console=ttyS0"]
    assert "autoinstall" in words and "ip=dhcp" in words
    assert f"ds=nocloud-net;s={BASE}/install/{TOKEN}/" in words
    assert f"url={METHODS['autoinstall']['repo_url']}" in words


def test_preseed_kernel_line() -> None:
    words = kernel_line("preseed")
    assert words[1:3] == [f"{BASE}/artefacts/debian/linux", "initrd=initrd.gz"]
    for word in ("auto=true", "priority=critical", f"url={BASE}/install/{TOKEN}/preseed.cfg",
                 "interface=auto", "BOOTIF=01-52-54-00-77-00-10", "hostname=gpu-007",
                 "domain=r1.example"):
        assert word in words


def test_kickstart_kernel_line_takes_urls_as_they_are() -> None:
    words = kernel_line("kickstart")
    assert words[1] == METHODS["kickstart"]["kernel"]
    assert f"inst.ks={BASE}/install/{TOKEN}/ks.cfg" in words
    assert f"inst.repo={METHODS['kickstart']['repo_url']}" in words


def test_plan_uses_the_root_disk_rule_and_the_callback_contract() -> None:
    plan = installs("kickstart").plan(node(), token=TOKEN)
    assert (plan.disk, plan.disk_name) == ("/dev/nvme0n1", "nvme0n1")
    largest = installs("kickstart", root_disk="largest").plan(node(), token=TOKEN)
    assert largest.disk == "/dev/nvme1n1"
    assert plan.callback_url == f"{BASE}/agent/v1/callback"
    assert json.loads(plan.callback_body) == {"event": "installed",
                                              "hostname": "gpu-007.r1.example"}
    assert plan.mac == "52:54:00:77:00:10"
    booted = installs("kickstart").plan(node(), token=TOKEN, mac="52:54:00:77:00:11")
    assert booted.bootif == "01-52-54-00-77-00-11"


@pytest.mark.parametrize("hostname", [
    "gpu-1\nd-i preseed/late_command string reboot", "gpu-1'; reboot; '", 'gpu"1',
    "gpu-1 autoinstall", "gpu_1", "-gpu", "gpu-1.", "a" * 64, "gpu-$(reboot)", "gpu;1", "",
    None, "ŋpu-1",
], ids=["newline", "quote", "dquote", "space", "underscore", "leading-hyphen",
        "trailing-dot", "long-label", "subshell", "semicolon", "empty", "none", "unicode"])
def test_hostnames_that_could_inject_are_refused(hostname: str | None) -> None:
    with pytest.raises(FatalError, match="hostname"):
        installs("preseed").plan(node(hostname=hostname), token=TOKEN)


def test_uppercase_hostname_is_lowered_for_the_os_but_named_as_stored() -> None:
    plan = installs("autoinstall").plan(node(hostname="GPU-007"), token=TOKEN)
    assert (plan.fqdn, plan.short_name, plan.domain) == ("gpu-007", "gpu-007", "")
    assert json.loads(plan.callback_body)["hostname"] == "GPU-007"


@pytest.mark.parametrize(("changes", "error", "needle"), [
    ({"facts": {}}, RetryableError, "no inspected disks"),
    ({"facts": {"disks": [{"name": "sdb", "size_bytes": 10**9, "rotational": True}]}},
     FatalError, "no disk fits"),
    ({"facts": {"disks": [{"name": "sda; reboot", "size_bytes": 10**12,
                           "rotational": False}]}}, FatalError, "not a device name"),
    ({"macs": ()}, FatalError, "no usable MAC"),
    ({"profile": "other"}, FatalError, "uses no installer"),
], ids=["no-disks", "no-fit", "bad-disk-name", "no-mac", "other-profile"])
def test_nodes_the_installer_cannot_take_fail_with_the_reason(
        changes: dict[str, Any], error: type[ProvisionerError], needle: str) -> None:
    with pytest.raises(error, match=needle):
        installs("preseed").check(node(**changes))


def test_a_token_of_an_unexpected_form_never_reaches_a_template() -> None:
    with pytest.raises(FatalError, match="token"):
        installs("preseed").plan(node(), token="pvt_x' ; reboot")


def test_installed_checkpoint_means_boot_from_disk() -> None:
    assert not UnattendedInstalls.installed(node())
    assert UnattendedInstalls.installed(node(checkpoint=("bootdev-pxe", INSTALLED_SUBSTEP)))
    assert not UnattendedInstalls.installed(node(state=NodeState.ACTIVE,
                                                 checkpoint=(INSTALLED_SUBSTEP,)))


def test_unusable_public_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="http.public_url"):
        UnattendedInstalls({}, base_url="http://mgmt:8080/$(reboot)")


@pytest.mark.parametrize(("line", "needle"), [
    ('ssh_authorized_keys = ["ssh-ed25519 AAAA x\\nreboot"]', "OpenSSH public key"),
    ("ssh_authorized_keys = [\"ssh-ed25519 AAAA it's\"]", "OpenSSH public key"),
    ('ssh_authorized_keys = ["ssh-ed25519 AAAA a b"]', "OpenSSH public key"),
    ('kernel = "http://x/vmlinuz initrd=evil"', "installers.p.kernel"),
    ('repo_url = "debian/local-path"', "installers.p.repo_url"),
    ('kernel_args = "console=ttyS0 ${reboot}"', "installers.p.kernel_args"),
    ('time_server = "ntp;reboot"', "installers.p.time_server"),
    ('timezone = "UTC\\nd-i x"', "installers.p.timezone"),
    ('method = "image"', "installers.p.method"),
], ids=["key-newline", "key-quote", "key-spaces", "kernel-space", "repo-path", "args-dollar",
        "ntp-semicolon", "tz-newline", "method"])
def test_config_refuses_values_that_could_inject(tmp_path: Path, line: str,
                                                 needle: str) -> None:
    base = {"method": '"preseed"', "kernel": '"d/linux"', "initrd": '"d/initrd.gz"',
            "repo_url": '"http://deb.debian.org/debian"'}
    key = line.partition(" =")[0]
    body = "\n".join(f"{k} = {v}" for k, v in base.items() if k != key)
    path = tmp_path / "p.toml"
    path.write_text(f"[installers.p]\n{body}\n{line}\n")
    with pytest.raises(ConfigError, match="installers.p") as info:
        load_settings(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_profile_cannot_have_both_an_image_and_an_installer(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[images.p]\nurl = "x.raw"\nsha256 = "' + "0" * 64 + '"\n'
                    '[installers.p]\nmethod = "preseed"\nkernel = "k"\ninitrd = "i"\n'
                    'repo_url = "http://deb.debian.org/debian"\n')
    with pytest.raises(ConfigError, match="both"):
        load_settings(path)


def test_site_keys_come_first_and_once() -> None:
    site = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ site@ca"
    chosen = UnattendedInstalls({"p": InstallerSettings(method="preseed", **METHODS["preseed"],
                                                        ssh_authorized_keys=[KEY, site])},
                                base_url=BASE, site_keys=[site])
    assert chosen.plan(node(), token=TOKEN).ssh_keys == (site, KEY)
    with pytest.raises(ValueError, match="OpenSSH"):
        UnattendedInstalls({}, base_url=BASE, site_keys=["ssh-rsa AAAA\nx"])


def test_the_callback_path_is_the_one_the_boot_server_serves() -> None:
    from provisioner.install.seed import CALLBACK_PATH as SEED_CALLBACK
    from provisioner.install.unattended import CALLBACK_PATH

    assert CALLBACK_PATH == SEED_CALLBACK == "/agent/v1/callback"
