"""The Debian package (issue 27): ``scripts/build-deb.sh`` builds it, ``apt install ./…deb``
installs it into a clean Debian 12 root booted with systemd as PID 1 (systemd-nspawn), and
from outside we see what an operator would: the unit ``active`` (``Type=notify``: READY=1
reached), the API answering, a simulated rack reaching ``active`` under the hardened unit as
shipped, ``systemd-analyze security`` no worse than the unit file's offline score allows; then
``apt remove`` keeps the state and ``apt purge`` says that it removes it, and does.

The root is debootstrap's minbase plus exactly the package's Depends (cached,
``debootstrap-bookworm-deb``): ``apt install`` inside it needs no network. The dependency
wheels come from the cached wheelhouse (tests/e2e/wheel_support.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from provisioner.store.db import head_revision
from tests.e2e.wheel_support import ROOT, pip_env, wheelhouse
from tests.integration.test_systemd_unit import EXPOSURE_MAX
from tests.peers.debootstrap import (
    cache_dir,
    debootstrap_unavailable_reason,
    ensure_debian_root,
)
from tests.peers.nspawn import BootedRoot, nspawn_unavailable_reason

# a package build (~60 s on 2 cores) and a boot, plus an onboarding for the upgrade
pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.timeout(900)]
TARGET_PYTHON = Path("/usr/bin/python3.11")
NODES = 6
DROP_IN = f"""[Service]
Environment=PROVISIONER_SIMULATION__NODES={NODES} PROVISIONER_SIMULATION__STEP_DELAY_S=0.05
Environment=PROVISIONER_API__LISTEN=127.0.0.1:8700
"""
CONFIG = "/etc/provisioner/provisioner.toml"


def _skip_reason() -> str | None:
    if reason := debootstrap_unavailable_reason() or nspawn_unavailable_reason():
        return reason
    if not TARGET_PYTHON.is_file() or shutil.which("dpkg-deb") is None:
        return f"{TARGET_PYTHON} (Debian's python3) and dpkg-deb build the package"
    return None


def build_deb(out: Path, source: Path | None = None, version: str | None = None) -> Path:
    env = pip_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse()),
                  PROVISIONER_DEB_OUT=str(out))
    if source is not None:
        env["PROVISIONER_SRC"] = str(source)
    if version is not None:
        env["PROVISIONER_DEB_VERSION"] = version
    done = subprocess.run(["bash", str(ROOT / "scripts" / "build-deb.sh")], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    deb = Path(done.stdout.strip().splitlines()[-1])
    assert deb.parent == out and re.fullmatch(r"provisioner_[^_]+_(amd64|arm64)\.deb", deb.name)
    return deb


def depends(deb: Path) -> tuple[str, ...]:
    """The package names in the .deb's Depends (versions and alternatives dropped)."""
    field = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True,
                           text=True, check=True).stdout
    names = {part.split("|")[0].split("(")[0].strip() for part in field.split(",")}
    return tuple(sorted(names | {"systemd"}))


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if reason := _skip_reason():
        pytest.skip(reason)
    return build_deb(tmp_path_factory.mktemp("deb"))


def booted(deb: Path, work: Path) -> BootedRoot:
    root = ensure_debian_root(packages=depends(deb), name="deb").path
    box = BootedRoot(root, work, binds_ro={deb.parent: "/mnt/dist"})
    drop_in = work / "upper" / "etc" / "systemd" / "system" / "provisioner.service.d"
    drop_in.mkdir(parents=True)
    (drop_in / "test.conf").write_text(DROP_IN)  # a simulated rack; the unit stays as shipped
    return box


def apt(box: BootedRoot, *args: str) -> subprocess.CompletedProcess[str]:
    return box.run("apt-get", "-y", "-q", "-o", "Dpkg::Use-Pty=0", *args, check=False,
                   env={"DEBIAN_FRONTEND": "noninteractive"})


def get(box: BootedRoot, path: str, token: str = "") -> tuple[int, dict[str, object]]:
    header = ["-H", f"Authorization: Bearer {token}"] if token else []
    done = box.host("curl", "-sS", "-w", "\n%{http_code}", *header, f"http://127.0.0.1:8700{path}")
    body, _, code = done.stdout.rpartition("\n")
    return int(code or 0), (json.loads(body) if body.startswith("{") else {"text": body})


def unit(box: BootedRoot) -> dict[str, str]:
    out = box.run("systemctl", "show", "provisioner.service", "-p", "ActiveState", "-p",
                  "SubState", "-p", "Type", "-p", "NRestarts", "-p", "WatchdogUSec", "-p",
                  "User", "-p", "FragmentPath", "-p", "MainPID").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_active_nodes(box: BootedRoot, token: str, want: int, timeout_s: float = 120) -> int:
    deadline, total = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        code, page = get(box, "/api/v1/nodes?state=active&limit=1000", token)
        total = int(str(page.get("total", -1))) if code == 200 else -1
        if total >= want:
            return total
        time.sleep(1)
    return total


def token(box: BootedRoot) -> str:
    out = box.run("runuser", "-u", "provisioner", "--", "provisioner", "--config", CONFIG,
                  "token", "create", "--role", "admin", "--name", "pkgtest").stdout
    return out.strip().splitlines()[-1]


def test_the_package_carries_the_man_page(deb: Path, tmp_path: Path) -> None:
    """``man provisioner``: the page setup.py generated (argparse-manpage) from the CLI's
    parser, gzipped where man-db looks."""
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    entry = next(line for line in listing.splitlines()
                 if line.endswith("./usr/share/man/man1/provisioner.1.gz"))
    assert entry.startswith("-rw-r--r-- root/root")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    page = subprocess.run(["zcat", str(tmp_path / "usr/share/man/man1/provisioner.1.gz")],
                          capture_output=True, text=True, check=True).stdout
    assert page.startswith(".TH PROVISIONER \"1\"")
    for command in ("serve", "node replace", "import", "events", "completion"):
        assert f".SH COMMAND \\fI\\,'provisioner {command}'\\/\\fR" in page, command


def test_install_boot_serve_remove_purge(deb: Path, tmp_path: Path) -> None:
    with booted(deb, tmp_path / "box") as box:
        # Recommends (grub-common: the arm64 GRUB image) would need the network here
        installed = apt(box, "install", "--no-install-recommends", f"/mnt/dist/{deb.name}")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert "database schema" in installed.stdout

        state = unit(box)
        assert state["ActiveState"] == "active", state  # Type=notify: after READY=1 only
        assert (state["Type"], state["User"], state["WatchdogUSec"], state["NRestarts"]) == (
            "notify", "provisioner", "30s", "0")
        assert state["FragmentPath"] == "/lib/systemd/system/provisioner.service"
        shipped = (box.merged / "lib/systemd/system/provisioner.service").read_text()
        assert shipped == (ROOT / "systemd" / "provisioner.service").read_text()
        assert box.run("systemctl", "is-enabled", "provisioner.service").stdout.strip() == \
            "enabled"

        code, _ = get(box, "/healthz")
        assert code == 200
        secret = token(box)
        assert wait_active_nodes(box, secret, NODES) == NODES, box.run(
            "journalctl", "-u", "provisioner", "-n", "40", "--no-pager", check=False).stdout
        main_pid = state["MainPID"]
        assert unit(box)["MainPID"] == main_pid  # no restart on the way (watchdog kept fed)

        security = box.run("systemd-analyze", "security", "--no-pager", "provisioner.service")
        score = re.search(r"Overall exposure level for provisioner\.service: ([0-9.]+)",
                          security.stdout)
        assert score is not None and float(score.group(1)) < EXPOSURE_MAX, security.stdout
        print(f"systemd-analyze security provisioner (installed, running): {score.group(1)}")

        state_dir = box.merged / "var/lib/provisioner"
        assert (state_dir / "provisioner.sqlite").is_file()
        assert oct(state_dir.stat().st_mode & 0o777) == "0o700"

        removed = apt(box, "remove", "provisioner")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert "its state stays in /var/lib/provisioner" in removed.stdout
        assert box.run("systemctl", "is-active", "provisioner.service",
                       check=False).stdout.strip() in ("inactive", "unknown")
        assert (state_dir / "provisioner.sqlite").is_file()
        assert not (box.merged / "usr/lib/provisioner").exists()

        purged = apt(box, "purge", "provisioner")
        assert purged.returncode == 0, purged.stdout + purged.stderr
        said = purged.stdout.find("removing /var/lib/provisioner")
        assert said >= 0, purged.stdout
        assert not state_dir.exists()
        assert not (box.merged / "etc/provisioner").exists()




#: main just before migration 0006 (issue 13's merge, 871d5bf): upgrading from it migrates
PREVIOUS_RELEASE = "afde308"
PAST_INSPECTION = {"deploying", "configuring", "joining", "validating", "registering"}
SLOW_DROP_IN = DROP_IN.replace("STEP_DELAY_S=0.05", "STEP_DELAY_S=1.0")


def previous_release(dest: Path) -> Path:
    if not (ROOT / ".git").exists() or subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", PREVIOUS_RELEASE],
            capture_output=True, check=False).returncode != 0:
        pytest.skip(f"needs the git history ({PREVIOUS_RELEASE})")
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def previous_deb(tmp_path: Path) -> Path:
    """The previous release's package, cached (key: the release, the packaging files, the
    wheelhouse): it changes only when they do, and saves a build (~60 s) per run."""
    digest = hashlib.sha256(PREVIOUS_RELEASE.encode())
    for path in sorted([ROOT / "scripts" / "build-deb.sh",
                        *(ROOT / "packaging" / "debian").iterdir()]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(str(wheelhouse()).encode())
    cached = cache_dir() / f"deb-{PREVIOUS_RELEASE}-{digest.hexdigest()[:12]}"
    found = sorted(cached.glob("provisioner_*.deb"))
    if found:
        return found[0]
    built = build_deb(tmp_path / "old", source=previous_release(tmp_path / "previous"),
                      version=f"0.1.0~{PREVIOUS_RELEASE}")
    for stale in cache_dir().glob(f"deb-{PREVIOUS_RELEASE}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    building = cached.with_name(f"{cached.name}.tmp-{os.getpid()}")
    building.mkdir(parents=True)
    shutil.copy(built, building / built.name)
    building.rename(cached)
    return cached / built.name


def nodes(box: BootedRoot, secret: str) -> dict[str, dict[str, object]]:
    """Every node by hostname, with its history."""
    code, page = get(box, "/api/v1/nodes?limit=1000", secret)
    assert code == 200, page
    found = {}
    for item in page["items"]:  # type: ignore[union-attr]
        code, detail = get(box, f"/api/v1/nodes/{item['id']}", secret)
        assert code == 200, detail
        found[str(item["hostname"])] = detail
    return found


def steps(node: dict[str, object]) -> list[tuple[object, ...]]:
    return [(row["seq"], row["event"], row["from_state"], row["to_state"])  # type: ignore[index]
            for row in node["history"]]  # type: ignore[attr-defined]


def test_upgrade_with_nodes_in_flight_then_a_downgrade_is_refused(deb: Path,
                                                                 tmp_path: Path) -> None:
    old = previous_deb(tmp_path)
    shutil.copy(old, deb.parent / old.name)  # beside the new one: the container's /mnt/dist
    box = booted(deb, tmp_path / "box")
    (box.work / "upper/etc/systemd/system/provisioner.service.d/test.conf").write_text(
        SLOW_DROP_IN)
    with box:
        first = apt(box, "install", "--no-install-recommends", f"/mnt/dist/{old.name}")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "upgraded from empty to 0005" in first.stdout, first.stdout
        secret = token(box)
        deadline = time.monotonic() + 180
        before: dict[str, dict[str, object]] = {}
        while time.monotonic() < deadline:  # part way: a node deploying or later, not all done
            before = nodes(box, secret)
            if len(before) == NODES and any(n["state"] in PAST_INSPECTION
                                            for n in before.values()):
                break
            time.sleep(0.5)
        in_flight = sorted(str(n["state"]) for n in before.values())
        assert len(before) == NODES and set(in_flight) & PAST_INSPECTION, in_flight
        assert in_flight.count("active") < NODES, in_flight
        print(f"upgrading {PREVIOUS_RELEASE} -> {deb.name} with nodes in {in_flight}")
        old_pid = unit(box)["MainPID"]

        upgraded = apt(box, "install", "--no-install-recommends", f"/mnt/dist/{deb.name}")
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert f"upgraded from 0005 to {head_revision()}" in upgraded.stdout, upgraded.stdout
        state = unit(box)
        assert state["ActiveState"] == "active" and state["MainPID"] != old_pid, state
        assert wait_active_nodes(box, secret, NODES, timeout_s=240) == NODES, box.run(
            "journalctl", "-u", "provisioner", "-n", "60", "--no-pager", check=False).stdout
        after = nodes(box, secret)
        assert set(after) == set(before)
        for name, node in after.items():
            old_rows, new_rows = steps(before[name]), steps(node)
            assert new_rows[:len(old_rows)] == old_rows, name  # history kept whole
            assert [row[0] for row in new_rows] == sorted({row[0] for row in new_rows})
            assert new_rows[-1][3] == "active", (name, new_rows)

        downgrade = apt(box, "install", "--no-install-recommends", "--allow-downgrades",
                        f"/mnt/dist/{old.name}")
        said = downgrade.stdout + downgrade.stderr
        assert downgrade.returncode != 0, said
        assert "is newer than this provisioner" in said, said
        assert "older than the schema of its database" in said, said
        print("downgrade refused:", [line for line in said.splitlines() if "newer" in line])
        assert box.run("systemctl", "is-active", "provisioner.service",
                       check=False).stdout.strip() != "active"
        started = box.run("systemctl", "start", "provisioner.service", check=False)
        assert started.returncode != 0  # the daemon itself refuses that schema too
        journal = box.run("journalctl", "-u", "provisioner", "--no-pager", check=False).stdout
        assert "is newer than this provisioner" in journal, journal[-2000:]
