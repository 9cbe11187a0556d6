"""``Settings``: every section under one root, read from init values (the TOML file) and then
``PROVISIONER_*`` environment variables (``__`` between section and key), which win."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from provisioner.config.bmc import BmcSettings
from provisioner.config.boot import BootSettings, DhcpSettings, HttpSettings, TftpSettings
from provisioner.config.deploy import DeploySettings, ImageSettings, InstallerSettings
from provisioner.config.health import HealthSettings
from provisioner.config.install import InstallSettings
from provisioner.config.kube import KubeSettings
from provisioner.config.runtime import (
    ApiSettings,
    DaemonSettings,
    HaSettings,
    LifecycleSettings,
    LogSettings,
    SimulationSettings,
    StoreSettings,
)
from provisioner.config.servicing import ServicingSettings
from provisioner.config.slurm import SlurmSettings
from provisioner.config.topology import TopologySettings
from provisioner.config.validation import ValidationSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PROVISIONER_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    state_dir: Path = Field(
        Path("/var/lib/provisioner"), description="Database, secret key, agent artefacts"
    )
    database_url: SecretStr | None = Field(
        None, description="SQLAlchemy URL; default SQLite in state_dir (WAL)"
    )
    api: ApiSettings = ApiSettings()
    store: StoreSettings = StoreSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    simulation: SimulationSettings = SimulationSettings()
    dhcp: DhcpSettings = DhcpSettings()
    tftp: TftpSettings = TftpSettings()
    http: HttpSettings = HttpSettings()
    boot: BootSettings = BootSettings()
    bmc: BmcSettings = BmcSettings()
    kube: KubeSettings = KubeSettings()
    slurm: SlurmSettings = SlurmSettings()
    install: InstallSettings = InstallSettings()
    topology: TopologySettings = TopologySettings()
    images: dict[str, ImageSettings] = Field(
        default_factory=dict, description="Per profile: [images.<profile>] url, sha256, "
        "format, root_disk, root_disk_min_gb, root_disk_nonrotational")
    deploy: DeploySettings = DeploySettings()
    installers: dict[str, InstallerSettings] = Field(
        default_factory=dict, description="Per profile installed by an installer instead of "
        "an image: [installers.<profile>] method, kernel, initrd, repo_url, ...")
    validation: ValidationSettings = ValidationSettings()
    health: HealthSettings = HealthSettings()
    servicing: ServicingSettings = ServicingSettings()
    log: LogSettings = LogSettings()
    daemon: DaemonSettings = DaemonSettings()
    ha: HaSettings = HaSettings()

    @field_validator("installers")
    @classmethod
    def _check_one_method(cls, value: dict[str, InstallerSettings],
                          info: ValidationInfo) -> dict[str, InstallerSettings]:
        both = sorted(set(value) & set(info.data.get("images", {})))
        if both:
            raise ValueError(f"profile {both[0]!r} has both [images.{both[0]}] and "
                             f"[installers.{both[0]}]: pick one")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment overrides them.
        return (env_settings, init_settings)

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return f"sqlite:///{self.state_dir / 'provisioner.sqlite'}"
