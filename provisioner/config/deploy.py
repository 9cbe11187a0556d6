"""What goes on a node's disk: ``[images.<profile>]``, ``[installers.<profile>]`` and
``[deploy]``, and the checks that keep their values safe on a kernel command line."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from provisioner.config.section import Section

_SAFE_URL = re.compile(r"^https?://[A-Za-z0-9._~:/?=%+,@-]+$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$")
_SSH_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [A-Za-z0-9@._+:-]{1,100})?$")
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_TIMEZONE = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+){0,2}$")


def check_installer_url(value: str, *, paths: bool = True) -> str:
    """An http(s) URL (or a path under the artefacts dir) that is safe on a kernel command
    line, in an iPXE script and in every installer format: no spaces, quotes, ``$``, ``;``,
    ``&``, ``#`` or backslashes, no ``..``."""
    safe = _SAFE_URL.fullmatch(value) or (paths and _SAFE_PATH.fullmatch(value))
    if safe and ".." not in value.split("/"):
        return value
    what = "an http(s) URL" + (" or a path under boot.artefacts_dir" if paths else "")
    raise ValueError(f"{value!r}: expected {what} of letters, digits and ._~:/?=%+,@- only")


def check_ssh_key(value: str) -> str:
    """One OpenSSH public key line (type, base64, optional comment without quotes or spaces)."""
    if not _SSH_KEY.fullmatch(value):
        raise ValueError(f"not an OpenSSH public key line (type base64 [comment]; the comment "
                         f"without spaces or quotes): {value[:40]!r}")
    return value


class ImageSettings(Section):
    """The OS image a profile deploys, and the disk it goes to."""

    url: str = Field(description="http(s) URL, or a path under boot.artefacts_dir")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Of the file as served")
    format: Literal["raw", "raw.gz", "raw.zst", "qcow2"] | None = Field(
        None, description="Default: from the file name's suffix")
    root_disk: str = Field(
        "smallest", description="smallest | largest | name:<dev> | serial:<s> | wwn:<w>")
    root_disk_min_gb: float = Field(0, ge=0, description="Ignore disks smaller than this")
    root_disk_nonrotational: bool = Field(False, description="Only SSD/NVMe disks")


class DeploySettings(Section):
    """What every image deploy adds: the cloud-init NoCloud seed and the wait for the
    deployed OS to call back."""

    ssh_authorized_keys: list[str] = Field(
        default_factory=list, description="Public keys the seed gives the image's default "
        "user (Ansible logs in with them)")
    callback_timeout_s: float = Field(
        1800.0, ge=0, description="How long the deploy step waits for the deployed OS's "
        "booted (or an installer's installed) callback; 0: do not wait. Keep it under half "
        "of boot.agent_token_ttl_s (the callback uses the node's agent token)")

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        return [check_ssh_key(key) for key in value]


class InstallerSettings(Section):
    """A profile installed by its distribution's installer instead of an image: Ubuntu
    autoinstall, Debian preseed or kickstart (RHEL/Rocky 9), rendered per node from
    ``pxe/install/``."""

    method: Literal["autoinstall", "preseed", "kickstart"] = Field(
        description="autoinstall (Ubuntu Subiquity), preseed (Debian installer) or kickstart "
        "(Anaconda, RHEL/Rocky 9)")
    kernel: str = Field(description="Installer kernel: http(s) URL, or a path under "
                        "boot.artefacts_dir")
    initrd: str = Field(description="Installer initrd: http(s) URL, or a path under "
                        "boot.artefacts_dir")
    repo_url: str = Field(description="autoinstall: the live-server ISO (url=); preseed: the "
                          "Debian mirror; kickstart: the BaseOS repository (inst.repo=)")
    kernel_arm64: str | None = Field(None, description="arm64 (Grace) installer kernel: URL "
                                     "or path; unset: arm64 nodes of the profile are refused")
    initrd_arm64: str | None = Field(None, description="arm64 installer initrd: URL or path")
    repo_url_arm64: str | None = Field(None, description="repo_url for arm64 nodes (e.g. "
                                       "the arm64 live-server ISO); default repo_url")
    kernel_args: str = Field("", description="Extra kernel command line (e.g. console=ttyS0)")
    ssh_authorized_keys: list[str] = Field(
        default_factory=list, description="Public keys installed for root, after "
        "deploy.ssh_authorized_keys (Ansible logs in with them)")
    time_server: str | None = Field(None, description="NTP server; unset: the distribution's")
    timezone: str = Field("UTC", description="Time zone of the installed system")
    root_disk: str = Field(
        "smallest", description="smallest | largest | name:<dev> | serial:<s> | wwn:<w>")
    root_disk_min_gb: float = Field(0, ge=0, description="Ignore disks smaller than this")
    root_disk_nonrotational: bool = Field(False, description="Only SSD/NVMe disks")

    @field_validator("kernel", "initrd")
    @classmethod
    def _check_artefact(cls, value: str) -> str:
        return check_installer_url(value)

    @field_validator("kernel_arm64", "initrd_arm64")
    @classmethod
    def _check_arm64_artefact(cls, value: str | None) -> str | None:
        return None if value is None else check_installer_url(value)

    @field_validator("repo_url")
    @classmethod
    def _check_repo(cls, value: str) -> str:
        return check_installer_url(value, paths=False)

    @field_validator("repo_url_arm64")
    @classmethod
    def _check_arm64_repo(cls, value: str | None) -> str | None:
        return None if value is None else check_installer_url(value, paths=False)

    @field_validator("kernel_args")
    @classmethod
    def _check_args(cls, value: str) -> str:
        if any(ch in value for ch in "\n\r\"'`$;&|#\\") or not value.isprintable():
            raise ValueError("kernel_args: no quotes, $, ;, &, |, # or line breaks")
        return value

    @field_validator("ssh_authorized_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        return [check_ssh_key(key) for key in value]

    @field_validator("time_server")
    @classmethod
    def _check_time_server(cls, value: str | None) -> str | None:
        if value is not None and not _HOST.fullmatch(value):
            raise ValueError(f"{value!r}: expected a host name or IPv4 address")
        return value

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        if not _TIMEZONE.fullmatch(value):
            raise ValueError(f"{value!r}: expected an Olson name such as Europe/Paris or UTC")
        return value
