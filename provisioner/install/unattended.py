"""The installer path: profiles installed by Ubuntu autoinstall, Debian preseed or kickstart
instead of an image. This module decides which nodes take it and gathers, per node, the
values the ``pxe/install/`` templates need, each one validated so that no value can break
out of its format (a kernel command line, YAML, a debconf line, a kickstart line or a shell
word). No I/O: the boot HTTP server renders and serves, the deploy step waits for the
``installed`` callback the rendered installer posts at its end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from provisioner.config import InstallerSettings, check_installer_url, check_ssh_key
from provisioner.domain import Node, NodeState
from provisioner.errors import ConfigError, FatalError, RetryableError
from provisioner.install.images import choose_disk

#: The sub-step name under which the deploy step waits for the ``installed`` callback. Once
#: it is checkpointed, the node's iPXE script is a local boot: an installer that reboots
#: before the BMC's one-time disk boot lands must not install the node a second time.
INSTALLED_SUBSTEP = "installed"
#: Where the installer posts ``{"event": "installed", "hostname": ...}`` (Bearer token).
CALLBACK_PATH = "/agent/v1/callback"
#: The documents each method serves under ``/install/<token>/``.
DOCUMENTS: Mapping[str, tuple[str, ...]] = {
    "autoinstall": ("user-data", "meta-data", "vendor-data"),
    "preseed": ("preseed.cfg",),
    "kickstart": ("ks.cfg",),
}

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*(/[A-Za-z0-9_.:+-]+)*")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_LOGIN_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")
_PLACEHOLDER_TOKEN = "0" * 43  # for check(): the real token is issued at boot


def check_hostname(hostname: str | None, node_id: str) -> str:
    """The node's hostname, lower-cased, if it is a valid DNS name (RFC 1123 labels); a
    FatalError that names the node otherwise. Nothing else reaches the templates."""
    if not hostname:
        raise FatalError(f"node {node_id} has no hostname: an installer needs one")
    lowered = hostname.lower()
    if not _HOSTNAME.fullmatch(lowered):
        raise FatalError(f"node {node_id}: hostname {hostname!r} is not a valid DNS name "
                         "(letters, digits and hyphens in dot-separated labels of at most 63)")
    return lowered


@dataclass(frozen=True, slots=True)
class InstallPlan:
    """Everything one node's installer documents and iPXE script say. Every string here has
    been validated against a strict pattern, so templates may use them as they are."""

    method: str
    node_id: str
    hostname: str  # as stored for the node: the callback names it
    fqdn: str  # lower-cased
    short_name: str
    domain: str
    mac: str
    bootif: str  # 01-aa-bb-cc-dd-ee-ff (pxelinux's BOOTIF, read by d-i and dracut)
    disk: str  # /dev/<name>
    disk_name: str  # <name>, as kickstart's --drives wants it
    kernel_url: str
    initrd_url: str
    kernel_args: str
    repo_url: str
    mirror_scheme: str
    mirror_host: str
    mirror_dir: str
    ssh_keys: tuple[str, ...]
    login_user: str  # Ansible's ``install.ssh_user``: root, or a user made with sudo rights
    time_server: str | None
    timezone: str
    token: str
    seed_url: str  # <base>/install/<token>, without a trailing slash
    callback_url: str
    callback_body: str  # the JSON the installer posts

    def values(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


class UnattendedInstalls:
    """Which profiles use an installer, and each node's ``InstallPlan``."""

    def __init__(self, installers: Mapping[str, InstallerSettings], *, base_url: str,
                 site_keys: Sequence[str] = (), login_user: str = "root") -> None:
        """``site_keys``: ``deploy.ssh_authorized_keys``, installed before each profile's own.
        ``login_user``: ``install.ssh_user``; other than root, the installed OS gets that
        user, with the keys and password-less sudo (Ansible's ``become``)."""
        if not _LOGIN_USER.fullmatch(login_user):
            raise ConfigError(f"install.ssh_user: {login_user!r} is not a Linux user name "
                              "an installer can create")
        self._login_user = login_user
        base = base_url.rstrip("/")
        try:
            check_installer_url(base, paths=False)
        except ValueError as exc:
            raise ConfigError(f"http.public_url: unusable by installers: {exc}") from None
        self._installers = dict(installers)
        self._site_keys = tuple(check_ssh_key(key) for key in site_keys)
        self._base_url = base

    def uses_installer(self, node: Node) -> bool:
        """Whether the node's profile is installed by an installer (not an image)."""
        return (node.profile or "") in self._installers

    def method(self, node: Node) -> str | None:
        settings = self._installers.get(node.profile or "")
        return None if settings is None else settings.method

    def check(self, node: Node) -> None:
        """What the deploy step can check before it boots the node: FatalError (or
        RetryableError without inspected disks) with the reason, else nothing."""
        self.plan(node, token=_PLACEHOLDER_TOKEN)

    def plan(self, node: Node, *, token: str, mac: str | None = None,
             arch: str = "x86_64") -> InstallPlan:
        """The node's plan. ``mac``: the NIC it booted from (default its first MAC).
        ``arch``: ``arm64`` takes the profile's ``kernel_arm64``/``initrd_arm64``."""
        settings = self._installers.get(node.profile or "")
        if settings is None:
            raise FatalError(f"profile {node.profile!r} uses no installer ([installers.<p>])")
        kernel, initrd, repo_url = settings.kernel, settings.initrd, settings.repo_url
        if arch == "arm64":
            if settings.kernel_arm64 is None or settings.initrd_arm64 is None:
                raise FatalError(f"profile {node.profile!r} has no arm64 installer: set "
                                 f"installers.{node.profile}.kernel_arm64 and initrd_arm64")
            kernel, initrd = settings.kernel_arm64, settings.initrd_arm64
            repo_url = settings.repo_url_arm64 or repo_url
        if not _TOKEN.fullmatch(token):
            raise FatalError(f"node {node.id}: agent token has an unexpected form")
        fqdn = check_hostname(node.hostname, node.id)
        assert node.hostname is not None
        boot_mac = (mac or (node.macs[0] if node.macs else "")).lower()
        if not _MAC.fullmatch(boot_mac):
            raise FatalError(f"node {node.id} has no usable MAC for the installer's network")
        disk_name = self._disk(node, settings)
        short_name, _, domain = fqdn.partition(".")
        mirror = urlsplit(repo_url)
        seed_url = f"{self._base_url}/install/{token}"
        body = json.dumps({"event": "installed", "hostname": node.hostname})
        return InstallPlan(
            method=settings.method, node_id=node.id, hostname=node.hostname, fqdn=fqdn,
            short_name=short_name, domain=domain, mac=boot_mac,
            bootif="01-" + boot_mac.replace(":", "-"),
            disk=f"/dev/{disk_name}", disk_name=disk_name,
            kernel_url=self._artefact(kernel), initrd_url=self._artefact(initrd),
            kernel_args=settings.kernel_args, repo_url=repo_url,
            mirror_scheme=mirror.scheme, mirror_host=mirror.netloc,
            mirror_dir=mirror.path or "/", ssh_keys=tuple(dict.fromkeys(
                self._site_keys + tuple(map(check_ssh_key, settings.ssh_authorized_keys)))),
            login_user=self._login_user,
            time_server=settings.time_server, timezone=settings.timezone, token=token,
            seed_url=seed_url, callback_url=self._base_url + CALLBACK_PATH,
            callback_body=body)

    def serves(self, node: Node, document: str) -> bool:
        """Whether ``document`` is one of the node's installer's documents."""
        method = self.method(node)
        return method is not None and document in DOCUMENTS[method]

    @staticmethod
    def installed(node: Node) -> bool:
        """The deploy step has its ``installed`` callback: boot from disk from now on."""
        return node.state is NodeState.DEPLOYING and INSTALLED_SUBSTEP in node.checkpoint

    def _artefact(self, value: str) -> str:
        return value if "://" in value else f"{self._base_url}/artefacts/{value}"

    @staticmethod
    def _disk(node: Node, settings: InstallerSettings) -> str:
        disks = node.facts.get("disks")
        if not isinstance(disks, list) or not disks:
            raise RetryableError(f"node {node.id} has no inspected disks: inspect it first")
        name = choose_disk(disks, settings).removeprefix("/dev/")
        if not _DEVICE.fullmatch(name) or ".." in name.split("/"):
            raise FatalError(f"node {node.id}: disk name {name!r} is not a device name")
        return name
