"""The agent's ``storage`` job (mdadm): ``mdadm --detail`` and ``/proc/mdstat`` as real
systems print them (tests/fixtures/storage), the create command, and an array already there
left alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from provisioner.agent.storage import build_arrays, create_args, parse_detail, parse_mdstat

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "storage"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_detail_of_a_clean_whole_disk_raid1() -> None:
    detail = parse_detail(_text("mdadm-detail-raid1-whole.txt"))
    assert (detail.array, detail.level, detail.state, detail.raid_devices) == (
        "/dev/md0", "raid1", "clean", 2)
    assert detail.name == "abc.xyz.com:0" and detail.uuid == "83143055:2781ddf5:2c8f44c7:9b45d92e"
    assert detail.members == (("/dev/vde", "active sync"), ("/dev/vdf", "active sync"))


def test_detail_of_nvme_and_of_a_poisoned_name() -> None:
    nvme = parse_detail(_text("mdadm-detail-raid1-nvme.txt"))
    assert [m for m, _ in nvme.members] == ["/dev/nvme0n1p1", "/dev/nvme1n1p1"]
    assert nvme.name == "rescue:0" and nvme.state == "clean"
    poisoned = parse_detail(_text("mdadm-detail-raid1-poisoned-name.txt"))
    assert poisoned.name == "box:/dev/md0" and poisoned.members == (
        ("/dev/vda1", "active sync"), ("/dev/vdb1", "active sync"))


def test_detail_of_an_inactive_broken_raid0() -> None:
    broken = parse_detail(_text("mdadm-detail-raid0-inactive.txt"))
    assert (broken.array, broken.level, broken.state, broken.raid_devices) == (
        "/dev/md126", "raid0", "inactive", None)
    assert broken.members == (("/dev/sda2", ""),)
    assert broken.to_report()["members"] == ["/dev/sda2"]


def test_mdstat_levels_and_members() -> None:
    four = parse_mdstat(_text("mdstat-four-arrays.txt"))
    assert four["md1"] == ("raid1", frozenset({"sda2", "sdb2"}))
    assert four["md3"][0] == "raid5" and len(four["md3"][1]) == 10
    spares = parse_mdstat(_text("mdstat-inactive-spares.txt"))
    assert spares["md2"] == ("", frozenset({"sda", "sdb", "sdc", "sdd"}))
    assert sorted(spares) == ["md0", "md1", "md2"]


def test_create_command() -> None:
    assert create_args("data", "10", ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"]) == [
        "mdadm", "--create", "/dev/md/data", "--run", "--metadata=1.2", "--level=10",
        "--raid-devices=4", "--name=data", "/dev/nvme0n1", "/dev/nvme1n1", "/dev/nvme2n1",
        "/dev/nvme3n1"]


class Replay:
    """``mdadm`` as recorded: ``--detail`` answers the recording; any other call is an
    error here (the layout is already there: nothing may be created)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> str:
        self.calls.append(list(args))
        if args[1] != "--detail":
            raise AssertionError(f"unexpected {args}")
        return self.detail


def test_an_array_already_there_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "mdstat").write_text(_text("mdstat-four-arrays.txt"))
    mdadm = Replay(_text("mdadm-detail-raid1-whole.txt"))
    answer = build_arrays([{"name": "boot", "level": "1", "members": ["sdb1", "sda1"]}],
                          device_dir=Path("/dev"), mdstat=tmp_path / "mdstat", run=mdadm)
    assert mdadm.calls == [["mdadm", "--detail", "/dev/md0"]]
    assert answer["ok"] and answer["arrays"][0]["created"] is False
    assert answer["arrays"][0]["state"] == "clean"
    assert answer["mdstat"].startswith("Personalities : [raid1]")


@pytest.mark.parametrize(("members", "error"), [
    (["sda1", "sdz"], "members held by other arrays: sda1 (md0)"),
])
def test_a_member_of_another_array_fails_that_array(tmp_path: Path, members: list[str],
                                                     error: str) -> None:
    (tmp_path / "mdstat").write_text(_text("mdstat-four-arrays.txt"))
    mdadm = Replay("")
    answer = build_arrays([{"name": "x", "level": "1", "members": members}],
                          mdstat=tmp_path / "mdstat", run=mdadm)
    assert not answer["ok"] and error in answer["error"] and mdadm.calls == []
