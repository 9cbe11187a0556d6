"""The agent's ``storage`` job (issue 25's software storage layout): md arrays built with
mdadm, as the daemon planned them (``{"name", "level", "members"}``: the RAID level's number
and the member disks' kernel names).

An array already there (``/proc/mdstat`` lists one at that level over exactly those members)
is left alone; a member held by another array fails that array, nothing created over it.
Otherwise ``mdadm --create /dev/md/<name> --run --metadata=1.2 --level=N --raid-devices=K
--name=<name> <members>``. Each array's report: ``array``, ``level``, ``members``, ``state``
(``mdadm --detail``'s State line), ``created`` (False: it was there), or ``error``; the job's
answer carries ``/proc/mdstat`` as it reads after the job.

Standard library only: it ships alone in the ramdisk.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MDADM = "mdadm"
_MDSTAT_LINE = re.compile(r"^(md\S+)\s*:\s*(\S+)\s+(?:\(\S+\)\s+)?(raid\d+|linear)?\s*(.*)$")
_MEMBER = re.compile(r"^(\S+?)\[\d+\](?:\([A-Z]\))?$")
Runner = Callable[[Sequence[str]], str]


@dataclass(frozen=True, slots=True)
class Detail:
    """What ``mdadm --detail`` says of an array."""

    array: str
    level: str
    state: str
    raid_devices: int | None
    name: str
    uuid: str
    members: tuple[tuple[str, str], ...]  # (device, its state: "active sync", "faulty"...)

    def to_report(self) -> dict[str, Any]:
        return {"array": self.array, "level": self.level, "state": self.state,
                "raid_devices": self.raid_devices, "md_name": self.name, "uuid": self.uuid,
                "members": [device for device, _ in self.members],
                "member_states": {device: state for device, state in self.members}}


def parse_detail(text: str) -> Detail:
    """``mdadm --detail /dev/mdX`` (mdadm 3.x/4.x). The member table's rows end with the
    device path; a removed slot has none and is left out."""
    lines = text.splitlines()
    array = lines[0].strip().rstrip(":") if lines else ""
    fields: dict[str, str] = {}
    members: list[tuple[str, str]] = []
    table = False
    for line in lines[1:]:
        if re.match(r"^\s*Number\s+Major\s+Minor\s+RaidDevice", line):
            table = True
            continue
        if table:
            parts = line.split()
            if len(parts) >= 5 and parts[-1].startswith("/dev/"):
                members.append((parts[-1], " ".join(parts[4:-1])))
            continue
        key, sep, value = line.partition(" : ")
        if sep:
            fields[key.strip()] = value.strip()
    devices = fields.get("Raid Devices", "")
    name = fields.get("Name", "").split("  (", 1)[0].strip()
    return Detail(array, fields.get("Raid Level", ""), fields.get("State", ""),
                  int(devices) if devices.isdigit() else None, name, fields.get("UUID", ""),
                  tuple(members))


def parse_mdstat(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """``/proc/mdstat``: each array's level (``raid1``...; '' for an inactive one) and its
    members' kernel names."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for line in text.splitlines():
        match = _MDSTAT_LINE.match(line)
        if match is None or match.group(1) == "md" or line.startswith("Personalities"):
            continue
        members = frozenset(m.group(1) for part in match.group(4).split()
                            if (m := _MEMBER.match(part)))
        found[match.group(1)] = (match.group(3) or "", members)
    return found


def create_args(name: str, level: str, members: Sequence[str],
                device_dir: Path = Path("/dev")) -> list[str]:
    return [MDADM, "--create", str(device_dir / "md" / name), "--run", "--metadata=1.2",
            f"--level={level}", f"--raid-devices={len(members)}", f"--name={name}",
            *(str(device_dir / m) for m in members)]


def _run(args: Sequence[str]) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])}: exit {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:400]}")
    return done.stdout


def build_arrays(arrays: Sequence[dict[str, Any]], *, device_dir: Path = Path("/dev"),
                 mdstat: Path = Path("/proc/mdstat"), run: Runner = _run) -> dict[str, Any]:
    """Make each wanted array unless it is there; the job's answer (``ok``, ``arrays``,
    ``mdstat``, ``error`` naming each array that failed)."""
    reports: list[dict[str, Any]] = []
    for wanted in arrays:
        name, level = str(wanted["name"]), str(wanted["level"])
        members = [str(m) for m in wanted["members"]]
        report: dict[str, Any] = {"name": name, "level": f"raid{level}", "members": members}
        try:
            present = parse_mdstat(mdstat.read_text()) if mdstat.exists() else {}
            same = [md for md, (lvl, held) in present.items()
                    if lvl == f"raid{level}" and held == set(members)]
            busy = {m: md for md, (_, held) in present.items() for m in held
                    if m in members and md not in same}
            if busy:
                raise RuntimeError("members held by other arrays: " + ", ".join(
                    f"{m} ({md})" for m, md in sorted(busy.items())))
            if same:
                array = str(device_dir / same[0])
                report["created"] = False
            else:
                run(create_args(name, level, members, device_dir))
                array = str(device_dir / "md" / name)
                report["created"] = True
            report |= parse_detail(run([MDADM, "--detail", array])).to_report()
            log.info("%s: %s %s (%s)", name, array, "created" if report["created"]
                     else "already there, left alone", report.get("state"))
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
            report["error"] = str(exc)[:500]
            log.error("%s: %s", name, report["error"])
        reports.append(report)
    failed = [f"{r['name']}: {r['error']}" for r in reports if r.get("error")]
    answer: dict[str, Any] = {"ok": not failed, "arrays": reports,
                              "mdstat": mdstat.read_text() if mdstat.exists() else ""}
    if failed:
        answer["error"] = "; ".join(failed)
    return answer
