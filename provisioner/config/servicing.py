"""``[servicing]``: runbooks (named, ordered lists of steps) and each profile's baseline
(BIOS settings, firmware components) that the steps bring a node to (issue 25)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from provisioner.config.section import Section

ServiceStepName = Literal["firmware_inventory", "bios_settings", "bmc_settings",
                          "firmware_update", "storage_layout", "reboot", "sanitise"]
SERVICE_STEPS: tuple[str, ...] = ("firmware_inventory", "bios_settings", "bmc_settings",
                                  "firmware_update", "storage_layout", "reboot", "sanitise")
SANITISE = "sanitise"
RaidType = Literal["None", "RAID0", "RAID1", "RAID5", "RAID6", "RAID10"]
# the fewest drives each level is made of (provisioner.validation.storage keeps the same)
RAID_MIN_DRIVES: dict[str, int] = {"None": 1, "RAID0": 2, "RAID1": 2, "RAID5": 3,
                                   "RAID6": 4, "RAID10": 4}
_MEDIA = ("NVMe", "SSD", "HDD")


class Runbook(Section):
    """``[servicing.runbooks.<name>]``: the steps, run in order, each checkpointed."""

    steps: list[ServiceStepName] = Field(
        min_length=1, description="In order: firmware_inventory (read the BMC's "
        "UpdateService/FirmwareInventory), bios_settings (the profile's BIOS baseline, "
        "validated against the BMC's attribute registry), bmc_settings (the profile's BMC "
        "settings baseline: manager attributes against the BMC's manager attribute "
        "registry, NetworkProtocol, time offset), firmware_update (each baseline "
        "component below its version, through UpdateService.SimpleUpdate or its "
        "MultipartHttpPushUri, see firmware_transfer), storage_layout "
        "(the profile's storage volumes: Redfish Storage/Volumes, or mdadm through the "
        "agent), reboot (a power cycle through the BMC; an active node's OS waited for), "
        "sanitise (every disk erased by the agent in the ramdisk, as on retire: only as the "
        "last step, and the node then goes to deploying, re-installed)")

    @field_validator("steps")
    @classmethod
    def _sanitise_last(cls, value: list[str]) -> list[str]:
        """After ``sanitise`` the node has no OS: nothing may run after it, and the node is
        re-deployed rather than handed back through the validation gate."""
        if SANITISE in value[:-1]:
            raise ValueError("sanitise erases the node's disks, OS included: it must be the "
                             "runbook's last step (the node is then re-deployed), got "
                             f"steps = {value}")
        return value


class FirmwareComponent(Section):
    """One component of a profile's firmware baseline."""

    id: str = Field(min_length=1, description="FirmwareInventory member Id, a shell pattern "
                    "(`BIOS*`, `*HGX_FW_GPU_*`)")
    version: str = Field(min_length=1, description="The version the component must report")
    image: str = Field(min_length=1, description="Image file, fetched by the BMC as "
                       "<image_base_url>/<image> (our boot HTTP server serves "
                       "boot.artefacts_dir under /artefacts/), or a full http(s) URL")


class BmcSettings(Section):
    """``[servicing.profiles.<p>.bmc]``: the BMC's own settings, each checked against what
    the BMC offers before anything is applied, then read back."""

    attributes: dict[str, str | int | bool] = Field(
        default_factory=dict, description="Vendor manager attributes (name = value; Dell "
        "iDRAC: \"IPMILan.1.Enable\" = \"Disabled\"), checked against the BMC's manager "
        "attribute registry")
    ipmi_over_lan: bool | None = Field(
        None, description="NetworkProtocol IPMI.ProtocolEnabled; unset: left alone")
    ssh: bool | None = Field(None, description="NetworkProtocol SSH.ProtocolEnabled")
    ntp: bool | None = Field(None, description="NetworkProtocol NTP.ProtocolEnabled (on "
                             "when ntp_servers is set and this is not)")
    ntp_servers: list[str] | None = Field(
        None, max_length=8, description="NetworkProtocol NTP.NTPServers, in order (no more "
        "than the BMC has slots for)")
    time_offset: str | None = Field(
        None, pattern=r"^[+-](0\d|1[0-4]):[0-5]\d$",
        description="Manager DateTimeLocalOffset, e.g. +00:00")

    def flat(self) -> dict[str, object]:
        """The settings as the step names them (``validation.bmc_settings``)."""
        out: dict[str, object] = dict(self.attributes)
        for proto, value in (("IPMI", self.ipmi_over_lan), ("SSH", self.ssh),
                             ("NTP", True if self.ntp is None and self.ntp_servers else
                              self.ntp)):
            if value is not None:
                out[f"NetworkProtocol.{proto}.ProtocolEnabled"] = value
        if self.ntp_servers is not None:
            out["NetworkProtocol.NTP.NTPServers"] = list(self.ntp_servers)
        if self.time_offset is not None:
            out["Manager.DateTimeLocalOffset"] = self.time_offset
        return out


class StorageVolume(Section):
    """One volume of a profile's storage layout (``[[servicing.profiles.<p>.storage]]``)."""

    name: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="The volume's name (Redfish Name; the md array's name)")
    raid: RaidType = Field(description="RAID0, RAID1, RAID5, RAID6, RAID10, or None (one "
                           "drive, no RAID: Redfish only)")
    drives: int | str = Field(
        description="How many drives: a count, or \"all\" / \"all NVMe\" / \"all SSD\" / "
        "\"all HDD\" (every drive of that kind)")
    media: Literal["NVMe", "SSD", "HDD"] | None = Field(
        None, description="Only drives of this kind (Redfish Protocol NVMe or MediaType; for "
        "mdadm, nvme* disks or the disk's rotational flag)")
    min_size_gb: float = Field(0, ge=0, description="Only drives at least this large")
    via: Literal["redfish", "mdadm"] = Field(
        "redfish", description="redfish: a volume of the BMC's RAID controller "
        "(Storage/Volumes); mdadm: a software array built by the node's agent")

    @model_validator(mode="after")
    def _enough_drives(self) -> StorageVolume:
        if isinstance(self.drives, str):
            word, _, kind = self.drives.partition(" ")
            if word != "all" or (kind and kind not in _MEDIA):
                raise ValueError(f"volume {self.name}: drives {self.drives!r}: a count, or "
                                 "'all', 'all NVMe', 'all SSD', 'all HDD'")
            if kind and self.media is not None and kind != self.media:
                raise ValueError(f"volume {self.name}: drives {self.drives!r} and media "
                                 f"{self.media!r} disagree")
        elif self.drives < RAID_MIN_DRIVES[self.raid]:
            raise ValueError(f"volume {self.name}: {self.raid} needs at least "
                             f"{RAID_MIN_DRIVES[self.raid]} drives, drives = {self.drives}")
        elif self.raid == "RAID10" and self.drives % 2:
            raise ValueError(f"volume {self.name}: RAID10 needs an even number of drives")
        elif self.raid == "None" and self.drives != 1:
            raise ValueError(f"volume {self.name}: raid None is one drive")
        if self.via == "mdadm" and self.raid == "None":
            raise ValueError(f"volume {self.name}: mdadm makes RAID arrays: raid None is "
                             "for a Redfish pass-through volume")
        return self

    @property
    def count(self) -> int | None:
        return self.drives if isinstance(self.drives, int) else None

    @property
    def kind(self) -> str | None:
        if isinstance(self.drives, str) and " " in self.drives:
            return self.drives.partition(" ")[2]
        return self.media


class ServicingProfile(Section):
    """``[servicing.profiles.<profile>]``: what the runbooks bring this profile's nodes to."""

    onboarding_runbook: str | None = Field(
        None, description="Run between inspected and deploying on every new node; unset: none")
    wave_runbook: str | None = Field(
        None, description="The runbook a firmware wave runs on this profile's drifted "
        "nodes (`provisioner firmware wave start`); unset: the wave must name one")
    bios: dict[str, str | int | bool] = Field(
        default_factory=dict, description="BIOS attributes (name = value), checked against "
        "the BMC's attribute registry before anything is applied")
    bmc: BmcSettings | None = Field(
        None, description="The BMC settings baseline the bmc_settings step applies: "
        "attributes, ipmi_over_lan, ssh, ntp, ntp_servers, time_offset")
    firmware: list[FirmwareComponent] = Field(
        default_factory=list, description="The firmware baseline: [[servicing.profiles.<p>."
        "firmware]] id, version, image")
    sanitise_overwrite: bool = Field(
        False, description="When a disk offers no erase of its own (NVMe sanitize/format, "
        "ATA secure erase, SCSI sanitize), overwrite it with zeros instead of failing the "
        "sanitise step (retire); slow on large disks, and it cannot reach remapped blocks")
    storage: list[StorageVolume] = Field(
        default_factory=list, description="The storage layout the storage_layout step "
        "makes: [[servicing.profiles.<p>.storage]] name, raid, drives, media, min_size_gb, via")
    storage_replace: bool = Field(
        False, description="storage_layout deletes the BMC's volumes that are not in the "
        "layout when the layout needs their drives (unset: it fails, naming them)")
    firmware_transfer: Literal["auto", "simple", "multipart"] = Field(
        "auto", description="How firmware_update sends an image: simple (UpdateService."
        "SimpleUpdate: the BMC fetches <image_base_url>/<image> from our HTTP server), "
        "multipart (the daemon streams the image file from the artefact directory to the "
        "UpdateService's MultipartHttpPushUri: BMCs that cannot reach our HTTP server), or "
        "auto: SimpleUpdate where the BMC offers it for our URL's protocol, else the push")

    def bmc_settings(self) -> dict[str, object]:
        return self.bmc.flat() if self.bmc is not None else {}

    @field_validator("storage")
    @classmethod
    def _unique_volumes(cls, value: list[StorageVolume]) -> list[StorageVolume]:
        names = [v.name for v in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"storage: volume names used twice: {', '.join(twice)}")
        return value


class ServicingSettings(Section):
    runbooks: dict[str, Runbook] = Field(
        default_factory=dict, description="[servicing.runbooks.<name>] steps = [...]")
    profiles: dict[str, ServicingProfile] = Field(
        default_factory=dict, description="[servicing.profiles.<profile>] onboarding_runbook, "
        "bios, firmware")
    image_base_url: str | None = Field(
        None, description="Where BMCs fetch firmware images: our boot HTTP server's "
        "/artefacts/<dir> as the BMC network reaches it (e.g. "
        "http://10.0.0.1:8080/artefacts/firmware, the files in boot.artefacts_dir/firmware; "
        "`config check` then finds each image there), or another web server; unset: images "
        "must be full URLs")
    task_timeout_s: float = Field(
        3600.0, gt=0, description="A firmware update task that has not completed by then "
        "fails the step")
    task_poll_s: float = Field(5.0, gt=0, description="Task monitor poll interval")
    task_stall_s: float = Field(
        900.0, gt=0, description="A task whose PercentComplete does not move for this long "
        "fails the step (a stalled BMC task)")
    bmc_good_reads: int = Field(
        3, ge=1, description="After a BMC's own update: this many good reads in a row before "
        "it counts as back (as Ironic does)")
    drain_deadline_s: float = Field(
        3600.0, ge=0, description="An active node's jobs get this long to end after the "
        "drain before the runbook starts anyway")

    @field_validator("profiles")
    @classmethod
    def _known_runbooks(cls, value: dict[str, ServicingProfile],
                        info: ValidationInfo) -> dict[str, ServicingProfile]:
        runbooks = info.data.get("runbooks", {})
        for name, profile in value.items():
            for key, wanted in (("onboarding_runbook", profile.onboarding_runbook),
                                ("wave_runbook", profile.wave_runbook)):
                if wanted is not None and wanted not in runbooks:
                    raise ValueError(f"profile {name}: {key} {wanted!r} is not a "
                                     "[servicing.runbooks] entry "
                                     f"({', '.join(runbooks) or 'none'})")
            wave = runbooks.get(profile.wave_runbook or "")
            if wave is not None and SANITISE in wave.steps:
                raise ValueError(f"profile {name}: wave_runbook {profile.wave_runbook!r} "
                                 "has a sanitise step: a firmware wave must not erase the "
                                 "active nodes it brings to the baseline")
        return value

    @model_validator(mode="after")
    def _images_reachable(self) -> ServicingSettings:
        for name, profile in self.profiles.items():
            for part in profile.firmware:
                if self.image_base_url is None and not part.image.startswith(
                        ("http://", "https://")):
                    raise ValueError(f"profile {name}: firmware image {part.image!r} needs "
                                     "[servicing] image_base_url, or a full URL")
        return self

    def image_uri(self, image: str) -> str:
        if image.startswith(("http://", "https://")) or self.image_base_url is None:
            return image
        return f"{self.image_base_url.rstrip('/')}/{image.lstrip('/')}"
