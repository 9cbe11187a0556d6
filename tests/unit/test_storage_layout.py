"""The storage layout's configuration and plan (issue 25): RAID levels against drive counts,
selectors, and ``plan_volumes`` over DMTF's public-localstorage mockup
(tests/fixtures/redfish-storage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from provisioner.config.servicing import RAID_MIN_DRIVES, ServicingProfile, StorageVolume
from provisioner.errors import FatalError
from provisioner.validation import storage
from provisioner.validation.storage import Drive, Volume, WantedVolume, plan_volumes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "redfish-storage"


def _mockup() -> tuple[list[Drive], list[Volume]]:
    files = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]
    drives = [Drive.from_redfish(f) for f in files if "Drive.v" in f["@odata.type"]]
    volumes = [Volume.from_redfish(f) for f in files if "Volume.v" in f["@odata.type"]]
    return drives, volumes


def test_the_config_and_the_plan_agree_on_raid_minimums() -> None:
    assert RAID_MIN_DRIVES == storage.RAID_MIN_DRIVES


@pytest.mark.parametrize(("volume", "error"), [
    ({"raid": "RAID5", "drives": 2}, "RAID5 needs at least 3 drives, drives = 2"),
    ({"raid": "RAID10", "drives": 6 - 1}, "RAID10 needs an even number of drives"),
    ({"raid": "RAID1", "drives": "some"}, "a count, or 'all', 'all NVMe'"),
    ({"raid": "RAID1", "drives": "all NVMe", "media": "HDD"}, "disagree"),
    ({"raid": "None", "drives": 1, "via": "mdadm"}, "mdadm makes RAID arrays"),
    ({"raid": "RAID7", "drives": 2}, "Input should be"),
])
def test_invalid_volumes_are_refused(volume: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        StorageVolume.model_validate({"name": "v", **volume})


def test_selectors_and_duplicate_names() -> None:
    nvme = StorageVolume.model_validate({"name": "d", "raid": "RAID10", "drives": "all NVMe",
                                         "via": "mdadm"})
    assert (nvme.count, nvme.kind) == (None, "NVMe")
    with pytest.raises(ValidationError, match="volume names used twice: d"):
        ServicingProfile.model_validate({"storage": [nvme.model_dump(), nvme.model_dump()]})


def test_mockup_drives_and_volumes_are_read_as_published() -> None:
    drives, volumes = _mockup()
    assert {(d.media, d.capacity_bytes) for d in drives} == {("HDD", 899527000064)}
    assert [(v.name, v.raid, len(v.drives)) for v in volumes] == [
        ("Virtual Disk 1", "RAID1", 2), ("Virtual Disk 2", "RAID0", 1),
        ("Virtual Disk 3", "RAID0", 1)]


def test_plan_keeps_what_is_there_and_builds_from_free_drives_only() -> None:
    drives, volumes = _mockup()
    boot = WantedVolume("boot", "RAID1", 2)
    plan = plan_volumes([boot], volumes, drives, replace=False)
    assert [v.name for _, v in plan.kept] == ["Virtual Disk 1"] and not plan.changes
    everything = WantedVolume("all", "RAID5", None, "HDD")
    with pytest.raises(FatalError, match="needs 3 free drives, 1 fit and are free; drives "
                       "held by volumes outside the layout: Virtual Disk 1"):
        plan_volumes([everything], volumes, drives, replace=False)
    plan = plan_volumes([everything], volumes, drives, replace=True)
    assert [v.name for v in plan.delete] == ["Virtual Disk 1", "Virtual Disk 2",
                                             "Virtual Disk 3"]
    assert [len(d) for _, d in plan.create] == [4]
    with pytest.raises(FatalError, match="needs 2 free drives, 0 fit"):
        plan_volumes([WantedVolume("fast", "RAID1", 2, "NVMe")], volumes, drives,
                     replace=True)
