"""The agent's disk work against the real tools: qcow2 images made by ``qemu-img`` (and
``qemu-io``) are converted as they stream and must equal ``qemu-img convert -O raw``; the
grown MBR/GPT tables must satisfy ``sfdisk --dump`` and ``sgdisk -v``; the seed partition
must be found by ``blkid`` as ``LABEL=cidata`` and its files read back with ``isoinfo``."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner.agent.deploy import write_seed
from provisioner.agent.partition import PartitionError, grow_and_add_seed
from provisioner.agent.qcow2 import Qcow2Error, Qcow2Writer
from provisioner.install.seed import SeedSpec, build_seed

TOOLS = ("qemu-img", "qemu-io", "sfdisk", "sgdisk", "blkid", "isoinfo")
pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS),
    reason=f"needs {', '.join(TOOLS)} (qemu-utils fdisk gdisk util-linux genisoimage: "
           "scripts/setup.sh)")
MIB = 1 << 20


def run(*args: str, data: bytes | None = None) -> str:
    return subprocess.run(args, input=data, capture_output=True, check=True).stdout.decode()


def source_image(path: Path) -> None:
    """3 MiB with data, zero runs and a hole-sized gap, not cluster-aligned at its end."""
    rng = random.Random(5)
    with path.open("wb") as out:
        for i in range(45):
            out.write(rng.randbytes(70_000) if i % 3 else bytes(70_000))


def convert(image: Path, disk: Path, disk_size: int, *, max_deferred: int = 256 * MIB,
            chunk: int = 0) -> int:
    """Stream ``image`` through the converter onto ``disk`` (old contents: 0xff)."""
    disk.write_bytes(b"\xff" * disk_size)
    data = image.read_bytes()
    rng = random.Random(1)
    with disk.open("r+b") as out:
        writer = Qcow2Writer(out, disk_size, max_deferred=max_deferred)
        at = 0
        while at < len(data):  # odd chunk sizes, as a network delivers them
            step = chunk or rng.randint(1, 300_000)
            writer.feed(data[at:at + step])
            at += step
        return writer.finish()


def assert_same_as_qemu_img(image: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference.raw"
    run("qemu-img", "convert", "-O", "raw", str(image), str(reference))
    expected = reference.read_bytes()
    disk = tmp_path / "disk"
    size = convert(image, disk, len(expected) + MIB)
    written = disk.read_bytes()
    assert size == len(expected)
    assert written[:size] == expected  # zeros included: the old 0xff never shows through
    assert written[size:] == b"\xff" * MIB  # nothing past the image's disk


@pytest.mark.parametrize("options", [
    ["-o", "compat=0.10"], [], ["-o", "cluster_size=512"], ["-o", "cluster_size=2M"],
    ["-o", "preallocation=metadata"],
], ids=["v2", "v3", "512B-clusters", "2M-clusters", "metadata-prealloc"])
def test_qcow2_from_qemu_img_convert_equals_its_raw(tmp_path: Path,
                                                    options: list[str]) -> None:
    source_image(tmp_path / "src.raw")
    image = tmp_path / "image.qcow2"
    run("qemu-img", "convert", "-O", "qcow2", *options, str(tmp_path / "src.raw"), str(image))
    assert_same_as_qemu_img(image, tmp_path)


def qemu_io(image: Path, *commands: str) -> None:
    run("qemu-io", *[arg for command in commands for arg in ("-c", command)], str(image))


def test_qcow2_written_out_of_order_with_zero_clusters(tmp_path: Path) -> None:
    """Guest order differs from file order; explicit zero clusters (v3 zero flag) over data
    that was written before them."""
    image = tmp_path / "image.qcow2"
    run("qemu-img", "create", "-f", "qcow2", "-o", "cluster_size=4096", str(image), "8M")
    qemu_io(image, "write -P 0xab 7M 64k", "write -P 0x11 0 4k", "write -P 0x22 3M 12k",
            "write -P 0x33 5M 1M", "write -z 5M 256k", "write -P 0x44 12k 4k")
    assert_same_as_qemu_img(image, tmp_path)


def test_qcow2_whose_tables_come_after_the_data(tmp_path: Path) -> None:
    """A resize moves the L1 table behind the data: held in RAM until the tables come,
    or refused with the fix when that is more than the bound."""
    image = tmp_path / "image.qcow2"
    run("qemu-img", "create", "-f", "qcow2", "-o", "cluster_size=4096", str(image), "1M")
    qemu_io(image, "write -P 0x5a 0 256k", "write -P 0x6b 512k 8k")
    run("qemu-img", "resize", str(image), "600M")
    qemu_io(image, "write -P 0x7c 599M 4k")  # a new L2 table, after the moved L1
    header = image.read_bytes()[:48]
    assert int.from_bytes(header[40:48], "big") > 256 * 1024  # L1 behind the data
    assert_same_as_qemu_img(image, tmp_path)
    with pytest.raises(Qcow2Error, match="MiB of data before the tables.*qemu-img convert"):
        convert(image, tmp_path / "small", 601 * MIB, max_deferred=64 * 1024)


def test_qcow2_refusals_name_the_reason(tmp_path: Path) -> None:
    source_image(tmp_path / "src.raw")
    compressed, overlay = tmp_path / "c.qcow2", tmp_path / "o.qcow2"
    run("qemu-img", "convert", "-c", "-O", "qcow2", str(tmp_path / "src.raw"), str(compressed))
    run("qemu-img", "create", "-f", "qcow2", "-b", str(compressed), "-F", "qcow2", str(overlay))
    with pytest.raises(Qcow2Error, match="compressed qcow2 clusters are not supported"):
        convert(compressed, tmp_path / "d", 4 * MIB)
    with pytest.raises(Qcow2Error, match="backing file"):
        convert(overlay, tmp_path / "d", 4 * MIB)
    with pytest.raises(Qcow2Error, match="target has only"):
        convert(overlay.with_name("c.qcow2"), tmp_path / "d", MIB)
    with pytest.raises(Qcow2Error, match="bad magic"):
        convert(tmp_path / "src.raw", tmp_path / "d", 4 * MIB)
    plain = tmp_path / "p.qcow2"
    run("qemu-img", "convert", "-O", "qcow2", str(tmp_path / "src.raw"), str(plain))
    plain.write_bytes(plain.read_bytes()[:200_000])
    with pytest.raises(Qcow2Error, match="truncated"):
        convert(plain, tmp_path / "d", 4 * MIB)


# -- partitions and the seed ---------------------------------------------------------------

def image_disk(path: Path, label: str, image_mib: int = 20, disk_mib: int = 100) -> None:
    """An image with two partitions made by sfdisk, on a larger disk."""
    path.write_bytes(b"")
    os.truncate(path, image_mib * MIB)
    run("sfdisk", "-q", str(path), data=f"label: {label}\n,4M\n,\n".encode())
    os.truncate(path, disk_mib * MIB)


def dump(path: Path) -> dict[str, object]:
    table = json.loads(run("sfdisk", "--json", str(path)))["partitiontable"]
    assert isinstance(table, dict)
    return table


SPEC = SeedSpec(instance_id="n1-7", hostname="gpu-007.example", mac="52:54:00:12:34:56",
                ssh_authorized_keys=("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA ops@mgmt",),
                callback_url="http://10.77.0.1:8080/agent/v1/callback", token="pvt_it's")


@pytest.mark.parametrize("label", ["dos", "gpt"])
def test_last_partition_grown_and_seed_added(tmp_path: Path, label: str) -> None:
    disk = tmp_path / "disk"
    image_disk(disk, label)
    before = dump(disk)["partitions"]
    layout = write_seed(disk, build_seed(SPEC))
    assert "seed partition 3" in layout
    table = dump(disk)
    parts = table["partitions"]
    assert isinstance(parts, list) and isinstance(before, list) and len(parts) == 3
    assert parts[0] == before[0]  # untouched
    assert parts[1]["start"] == before[1]["start"] and parts[1]["size"] > 90 * MIB // 512
    assert parts[2]["start"] == parts[1]["start"] + parts[1]["size"]  # right after it
    assert parts[2]["start"] % 2048 == 0 and parts[2]["size"] == 2048
    end = parts[2]["start"] + parts[2]["size"]
    if label == "gpt":
        assert table["lastlba"] == 100 * MIB // 512 - 34 and end - 1 <= table["lastlba"]
        assert "No problems found" in run("sgdisk", "-v", str(disk))
    else:
        assert end == 100 * MIB // 512
    offset = parts[2]["start"] * 512
    assert 'LABEL="cidata"' in run("blkid", "-p", "-O", str(offset), str(disk))
    iso = tmp_path / "seed.iso"
    with disk.open("rb") as raw:
        raw.seek(offset)
        iso.write_bytes(raw.read(parts[2]["size"] * 512))
    read = {name: run("isoinfo", "-R", "-i", str(iso), "-x", f"/{name}")
            for name in ("meta-data", "user-data", "network-config", "provisioner.env")}
    assert json.loads(read["meta-data"]) == {"instance-id": "n1-7",
                                             "local-hostname": "gpu-007.example"}
    user = read["user-data"]
    assert user.startswith("#cloud-config\n")
    config = json.loads(user.partition("\n")[2])
    assert config["hostname"] == "gpu-007" and config["fqdn"] == "gpu-007.example"
    assert config["ssh_authorized_keys"] == list(SPEC.ssh_authorized_keys)
    assert json.loads(read["network-config"])["ethernets"]["provisioning"] == {
        "match": {"macaddress": "52:54:00:12:34:56"}, "dhcp4": True}
    (tmp_path / "env").write_text(read["provisioner.env"])
    env = run("sh", "-c", f". {tmp_path}/env; printf '%s|%s' \"$PROVISIONER_TOKEN\" "
              "\"$PROVISIONER_CALLBACK_URL\"")
    assert env == "pvt_it's|http://10.77.0.1:8080/agent/v1/callback"  # quoting survives


def test_partition_refusals(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.write_bytes(bytes(4 * MIB))
    with disk.open("r+b") as raw, pytest.raises(PartitionError, match="no partition table"):
        grow_and_add_seed(raw, 70_000)
    os.truncate(disk, 20 * MIB)
    run("sfdisk", "-q", str(disk), data=b"label: dos\n,2M\n,2M\n,,E\n")
    with disk.open("r+b") as raw, pytest.raises(PartitionError, match="extended"):
        grow_and_add_seed(raw, 70_000)
    run("sfdisk", "-q", str(disk), data=b"label: dos\n,2M\n,2M\n,2M\n,2M,83\n")
    with disk.open("r+b") as raw, pytest.raises(PartitionError, match="four MBR"):
        grow_and_add_seed(raw, 70_000)
    image_disk(disk, "gpt", image_mib=20, disk_mib=20)
    with disk.open("r+b") as raw, pytest.raises(PartitionError, match="too small"):
        grow_and_add_seed(raw, 70_000)
