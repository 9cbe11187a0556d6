"""Settings: a TOML file, then ``PROVISIONER_*`` environment variables; frozen and validated.

Only ``daemon.py`` and ``cli.py`` load settings; each component gets its own section. One
module per subsystem holds its sections, named like the TOML tables they read:

- ``section``: what every section shares (frozen, unknown keys refused; ``HOST:PORT``)
- ``runtime``: ``[api]``, ``[store]``, ``[lifecycle]``, ``[simulation]``, ``[log]``,
  ``[daemon]``, ``[ha]``
- ``boot``: ``[dhcp]``, ``[tftp]``, ``[http]``, ``[boot]``
- ``bmc``: ``[bmc]`` and ``[bmc.profiles.<profile>]``
- ``kube``: ``[kube]`` and ``[kube.profiles.<profile>]``; label keys owned by others
- ``slurm``: ``[slurm]``
- ``install``: ``[install]`` (Ansible)
- ``deploy``: ``[images.<profile>]``, ``[installers.<profile>]``, ``[deploy]``
- ``topology``: ``[topology]``
- ``health``: ``[health]`` (the repair ladder, its circuit breaker)
- ``validation``: ``[validation]`` and ``[validation.profiles.<profile>]``
- ``settings``: ``Settings``, the root of them all, and where the environment wins
- ``load``: ``load_settings`` (one-line errors), ``effective_config`` (secrets masked)

The operator guide's table of keys (docs/operator-guide.md, "Configure") is checked against
``Settings`` by tests/unit/test_config_doc.py.
"""

from __future__ import annotations

from provisioner.config.bmc import BmcProfile, BmcSettings
from provisioner.config.boot import BootSettings, DhcpSettings, HttpSettings, TftpSettings
from provisioner.config.deploy import (
    DeploySettings,
    ImageSettings,
    InstallerSettings,
    check_installer_url,
    check_ssh_key,
)
from provisioner.config.install import InstallSettings
from provisioner.config.kube import KubeProfile, KubeSettings, foreign_owner, is_nfd_key
from provisioner.config.load import DEFAULT_CONFIG_PATH, effective_config, load_settings, mask_url
from provisioner.config.runtime import (
    ApiSettings,
    DaemonSettings,
    HaSettings,
    LifecycleSettings,
    LogSettings,
    SimulationSettings,
    StoreSettings,
)
from provisioner.config.section import parse_host_port
from provisioner.config.settings import Settings
from provisioner.config.slurm import SlurmSettings
from provisioner.config.topology import TopologySettings
from provisioner.config.validation import AcceptanceProfile, ValidationProfile, ValidationSettings

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ApiSettings",
    "BmcProfile",
    "BmcSettings",
    "BootSettings",
    "DaemonSettings",
    "DeploySettings",
    "DhcpSettings",
    "HaSettings",
    "HttpSettings",
    "ImageSettings",
    "InstallSettings",
    "InstallerSettings",
    "KubeProfile",
    "KubeSettings",
    "LifecycleSettings",
    "LogSettings",
    "Settings",
    "SimulationSettings",
    "SlurmSettings",
    "StoreSettings",
    "TftpSettings",
    "TopologySettings",
    "AcceptanceProfile",
    "ValidationProfile",
    "ValidationSettings",
    "check_installer_url",
    "check_ssh_key",
    "effective_config",
    "foreign_owner",
    "is_nfd_key",
    "load_settings",
    "mask_url",
    "parse_host_port",
]
