"""arm64 (Grace) netboot without qemu: the per-node GRUB scripts, their quoting, the URL form
GRUB needs, the configuration embedded in the GRUB image, the sysroot's symlink resolution
and the RamdiskBuilder's one-line advice when packages are missing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from provisioner.boot.policy import grub_url
from provisioner.boot.render import Renderer, grub_quote
from provisioner.ramdisk.netboot import embedded_config
from provisioner.ramdisk.service import BuildJob, RamdiskBuilder
from provisioner.ramdisk.sysroot import ARCHES, RamdiskError, Sysroot, arch_named

BASE = "http://10.77.0.1:8080"
VALUES = {"purpose": "inspect", "node_id": "n1", "mac": "52:54:00:77:00:b0",
          "base_url": BASE, "kernel_url": f"{BASE}/artefacts/inspect/arm64/vmlinuz",
          "initrd_url": f"{BASE}/artefacts/inspect/arm64/initrd.gz",
          "kernel_args": "console=ttyAMA0 quiet", "token": "pvt_x",
          "reason": "node is active", "seconds": 10}


def test_agent_grub_boots_the_arm64_ramdisk_with_the_token() -> None:
    lines = Renderer().render_grub("agent", **VALUES).splitlines()
    assert lines == [
        "echo 'provisioner: inspect node n1 (52:54:00:77:00:b0)'",
        "linux (http,10.77.0.1:8080)/artefacts/inspect/arm64/vmlinuz 'console=ttyAMA0' "
        "'quiet' provisioner.url='http://10.77.0.1:8080' provisioner.token='pvt_x' "
        "provisioner.mac='52:54:00:77:00:b0'",
        "initrd (http,10.77.0.1:8080)/artefacts/inspect/arm64/initrd.gz",
        "boot"]


def test_local_and_retry_scripts() -> None:
    assert Renderer().render_grub("local", **VALUES).splitlines() == [
        "echo 'provisioner: node is active'", "exit"]
    assert Renderer().render_grub("retry", **VALUES).splitlines() == [
        "echo 'provisioner: node is active; retrying in 10 s'", "sleep 10",
        "configfile (http,10.77.0.1:8080)/boot/52:54:00:77:00:b0.grub"]


@pytest.mark.parametrize("hostile", [
    "x'; reboot; echo '", "$(halt)", "a\nhalt", "a\rhalt", "${root}", "a\\'b", "#c", ""])
def test_untrusted_text_stays_one_word(hostile: str) -> None:
    """A reason or hostname can neither end its command nor expand a variable: the script has
    exactly the template's lines, and the value comes back from GRUB's quoting rules."""
    text = Renderer().render_grub("local", **{**VALUES, "reason": hostile})
    lines = text.splitlines()
    assert len(lines) == 2 and lines[1] == "exit"
    assert _grub_unquote(lines[0].removeprefix("echo ")) == \
        "provisioner: " + " ".join(hostile.splitlines())


def _grub_unquote(word: str) -> str:
    """GRUB's (and sh's) rules for one word made of '...' runs and \\-escaped characters;
    anything unquoted other than an escape fails the test."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "'":
            end = word.index("'", i + 1)
            out.append(word[i + 1:end])
            i = end + 1
        elif word[i] == "\\":
            out.append(word[i + 1])
            i += 2
        else:
            raise AssertionError(f"unquoted {word[i]!r} in {word!r}")
    return "".join(out)


def test_grub_quote_joins_lines() -> None:
    assert grub_quote("a\nb") == "'a b'"
    assert grub_quote("it's") == "'it'\\''s'"


@pytest.mark.parametrize(("url", "expected"), [
    ("http://10.0.0.1:8080/boot/x.grub", "(http,10.0.0.1:8080)/boot/x.grub"),
    ("http://boot.example/artefacts/k", "(http,boot.example:80)/artefacts/k"),
    ("http://[fd00::1]:8080/k", "(http,[fd00::1]:8080)/k"),
    ("http://[fd00::1]/k", "(http,[fd00::1]:80)/k"),
])
def test_grub_url(url: str, expected: str) -> None:
    assert grub_url(url) == expected


@pytest.mark.parametrize("url", ["https://10.0.0.1/k", "tftp://10.0.0.1/k", "10.0.0.1/k",
                                 "http://10.0.0.1/k;reboot", "http://10.0.0.1/$x",
                                 "http://10.0.0.1/a b", "http:///k"])
def test_grub_url_refuses_what_grub_cannot_fetch_or_would_parse(url: str) -> None:
    with pytest.raises(ValueError, match="plain http"):
        grub_url(url)


def test_the_embedded_configuration_asks_for_the_mac_s_grub_cfg() -> None:
    lines = embedded_config(BASE + "/").splitlines()
    # net_default_mac: the NIC GRUB booted from (PXE and UEFI HTTP boot alike); asked 3 times
    assert lines.count("configfile (http,10.77.0.1:8080)/boot/${net_default_mac}.grub") == 3
    assert lines[-1] == "reboot"  # no configuration: back to DHCP, never a GRUB prompt
    # the rescue parser runs it: plain commands only
    assert {line.split()[0] for line in lines} <= {"set", "echo", "configfile", "sleep",
                                                   "reboot"}
    with pytest.raises(RamdiskError):
        embedded_config("https://10.77.0.1")


def test_arch_names() -> None:
    assert arch_named("aarch64") is ARCHES["arm64"] is arch_named("ARM64")
    assert arch_named("amd64") is ARCHES["x86_64"]
    with pytest.raises(RamdiskError, match="x86_64 or arm64"):
        arch_named("riscv64")


def test_sysroot_resolves_links_inside_the_sysroot(tmp_path: Path) -> None:
    """An arm64 .deb's absolute links (``/bin/busybox`` → ``/usr/bin/busybox``) point into
    the sysroot, never at the host's own files."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/busybox").write_text("arm64 busybox")
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/lib/aarch64-linux-gnu").mkdir(parents=True)
    (root / "lib").symlink_to("/usr/lib")  # absolute: relative to the sysroot
    (root / "usr/lib/aarch64-linux-gnu/libc.so.6").write_text("libc")
    (root / "usr/lib/aarch64-linux-gnu/ld.so").symlink_to("../aarch64-linux-gnu/./libc.so.6")
    (root / "loop").symlink_to("loop")
    sysroot = Sysroot(ARCHES["arm64"], root, "6.1.0-1-arm64", "")
    assert sysroot.busybox == root / "usr/bin/busybox"
    assert sysroot.resolve("/lib/aarch64-linux-gnu/ld.so") == \
        root / "usr/lib/aarch64-linux-gnu/libc.so.6"
    assert sysroot.resolve("/../../etc/passwd") == root / "etc/passwd"
    with pytest.raises(RamdiskError, match="too many symbolic links"):
        sysroot.resolve("/loop/x")


def test_builder_says_once_what_to_install(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """A build that cannot run (here: the cache dir is a file, so nothing can be fetched)
    ends in one warning naming the packages and the command, and the daemon goes on."""
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    job = BuildJob("arm64", tmp_path / "a/vmlinuz", tmp_path / "a/initrd.gz", blocker)
    builder = RamdiskBuilder([job])

    async def run() -> None:
        await builder.start()
        await asyncio.wait_for(builder.done.wait(), 120)
        await builder.stop()

    with caplog.at_level(logging.INFO, logger="provisioner.ramdisk.service"):
        asyncio.run(run(), debug=False)  # the child's build is what is slow, not the loop
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "provisioner.ramdisk.service"]
    assert len(warnings) == 1, caplog.text
    assert warnings[0].startswith("arm64 inspection ramdisk not built (")
    assert "provisioner ramdisk build --arch arm64" in warnings[0]
    assert "dpkg --add-architecture arm64" in warnings[0] or "apt-get" in warnings[0]
    assert not job.initrd.exists()
