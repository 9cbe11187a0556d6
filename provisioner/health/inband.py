"""The in-band probe's evidence → findings (pure): what a node's OS posts to
``/agent/v1/health`` (``playbooks/roles/health_probe``), read under fixed bounds and
classified by the same code as ``provisioner health classify``.

The payload (JSON; every key optional but ``boot_id``)::

    {"boot_id": "<the kernel's /proc/sys/kernel/random/boot_id>",
     "kernel_log": ["[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, ...", "  NVRM: ...", ...],
     "nvidia_smi": "<nvidia-smi -q>", "ibstat": "<ibstat>", "dcgm_health": "<dcgmi health -c>"}

Kernel-log lines are ``dmesg``'s: a stamp, raw (``[ 1843.308145]``, seconds since boot)
or ``dmesg -T``'s (``[Sun Feb 23 16:24:18 2025]``), maybe after a syslog prefix
(``Dec  6 17:49:03 host kernel: [ 8659.726062]``: a ``kern.log``), starts a record; a
line without one continues the record before it (the driver's multi-line messages). The
cursor is the daemon's, per node: the boot, the last stamp read and how many records bore
it (``-T`` stamps have one-second grain: more may come in that second). A record at or
before the cursor in the same boot is never read again; a new boot starts over (the
kernel's ring is per boot: what it holds is this boot's evidence, so a node's first post
raises what its ring already holds). A log with no stamp at all is read once per boot.
The other sections are states: what is wrong now; the cursor keeps their keys so a state
that went away is cleared, and a digest of the sections: the same outputs as last time
(the usual case: error counters do not move) are not read again (``Reading.unchanged``).

A node may lie. It can only speak of itself (its identity is the token's binding, never the
payload), and what it sends is bounded: ``MAX_LINES`` lines of ``MAX_LINE_CHARS`` each,
``MAX_SECTION_CHARS`` per section, ``MAX_FINDINGS`` findings per post; the rest is counted
as dropped, not read.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from provisioner.errors import InvalidRequest
from provisioner.health.classify import classify
from provisioner.health.ib import classify_ibstat
from provisioner.health.kernel_log import classify_kernel_log
from provisioner.health.model import Finding, dedupe
from provisioner.health.nvsmi import classify_nvsmi

MAX_BODY_BYTES: Final = 512 * 1024
MAX_LINES: Final = 2000
MAX_LINE_CHARS: Final = 1024
MAX_SECTION_CHARS: Final = 128 * 1024
MAX_FINDINGS: Final = 64
MAX_BOOT_ID: Final = 64

SECTIONS: Final[dict[str, Callable[[str], list[Finding]]]] = {
    "nvidia_smi": classify_nvsmi,
    "ibstat": classify_ibstat,
    "dcgm_health": classify,  # dcgmi health -c: JSON (-j) or its table
}
_STAMP = re.compile(r"^(?:[^\[]{0,200}?\bkernel: )?\[\s*(?:(\d{1,12}(?:\.\d{1,9})?)|"
                    r"((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d "
                    r"\d{4}))\]")
_BOOT_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the daemon stopped reading a node: its boot, the last stamp, the states."""

    boot_id: str = ""
    after: float = -1.0
    states: tuple[tuple[str, str], ...] = ()
    seen: int = 0  # records stamped ``after`` already read
    digest: str = ""  # of the state sections last read

    def dumps(self) -> str:
        return json.dumps({"boot": self.boot_id, "after": self.after, "seen": self.seen,
                           "states": [list(k) for k in self.states], "digest": self.digest},
                          separators=(",", ":"))

    @classmethod
    def loads(cls, stored: str | None) -> Cursor:
        """The stored cursor; an empty one when there is none or it does not parse."""
        try:
            value = json.loads(stored) if stored else {}
            states = tuple((str(c), str(s)) for c, s in value.get("states", ()))
            return cls(str(value.get("boot", "")), float(value.get("after", -1.0)), states,
                       int(value.get("seen", 0)), str(value.get("digest", "")))
        except (ValueError, TypeError, AttributeError):
            return cls()


@dataclass(frozen=True, slots=True)
class Evidence:
    boot_id: str
    kernel_log: tuple[str, ...] = ()
    sections: dict[str, str] = field(default_factory=dict)
    dropped: int = 0  # lines and sections cut by the bounds


@dataclass(frozen=True, slots=True)
class Reading:
    events: list[Finding]  # from kernel-log lines after the cursor: raised once
    states: list[Finding]  # from the sections: what is wrong now
    cursor: Cursor
    lines_read: int = 0
    lines_skipped: int = 0  # at or before the cursor
    dropped: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # section -> why it was not read
    unchanged: bool = False  # the sections are those of the cursor: ``states`` not read


def parse(body: object) -> Evidence:
    """The payload, bounded; ``InvalidRequest`` when its shape is wrong."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    boot_id = body.get("boot_id")
    if not isinstance(boot_id, str) or not _BOOT_ID.match(boot_id):
        raise InvalidRequest("boot_id: must be the kernel's boot id (1-64 of [0-9A-Za-z-])")
    unknown = set(body) - {"boot_id", "kernel_log", *SECTIONS}
    if unknown:
        raise InvalidRequest(f"unknown keys: {', '.join(sorted(unknown)[:5])}")
    lines = body.get("kernel_log", [])
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise InvalidRequest("kernel_log: must be a list of strings")
    dropped = max(0, len(lines) - MAX_LINES)
    kept = lines[:MAX_LINES]
    dropped += sum(1 for line in kept if len(line) > MAX_LINE_CHARS)
    sections: dict[str, str] = {}
    for name in SECTIONS:
        text = body.get(name)
        if text is None:
            continue
        if not isinstance(text, str):
            raise InvalidRequest(f"{name}: must be the tool's output, a string")
        if len(text) > MAX_SECTION_CHARS:
            dropped += 1  # a cut table would read as something else: not read at all
            continue
        sections[name] = text
    return Evidence(boot_id, tuple(line[:MAX_LINE_CHARS] for line in kept), sections, dropped)


def stamp_of(line: str) -> float | None:
    """A record's stamp: seconds since boot, or ``-T``'s local time as seconds since the
    epoch (only ever compared with the same node's own stamps); None: a continuation."""
    match = _STAMP.match(line)
    if match is None:
        return None
    if match[1] is not None:
        return float(match[1])
    try:
        return float(calendar.timegm(time.strptime(match[2], "%a %b %d %H:%M:%S %Y")))
    except ValueError:
        return None


def new_records(lines: tuple[str, ...], cursor: Cursor, boot_id: str
                ) -> tuple[list[str], int, Cursor]:
    """The lines after the cursor (a record's continuation lines stay with it), how many
    were skipped, and the cursor after them (its states unchanged)."""
    fresh = cursor.boot_id != boot_id
    after, seen = (-1.0, 0) if fresh else (cursor.after, cursor.seen)
    kept: list[str] = []
    skipped, at_after, last, last_seen = 0, 0, after, seen
    keep = after < 0  # lines before the first stamp: only on a boot's first read
    for line in lines:
        stamp = stamp_of(line)
        if stamp is not None:
            if stamp == after:
                at_after += 1
            keep = math.isfinite(stamp) and (stamp > after or (stamp == after
                                                               and at_after > seen))
            if keep and stamp > last:
                last, last_seen = stamp, 1
            elif keep and stamp == last:
                last_seen += 1
        if keep:
            kept.append(line)
        else:
            skipped += 1
    if kept and last < 0:
        last = 0.0  # a log with no stamp: read once this boot
    return kept, skipped, Cursor(boot_id, last, cursor.states, last_seen, cursor.digest)


def read(evidence: Evidence, cursor: Cursor) -> Reading:
    """The findings in a post, the cursor after it."""
    lines, skipped, moved = new_records(evidence.kernel_log, cursor, evidence.boot_id)
    events = dedupe(classify_kernel_log("\n".join(lines))) if lines else []
    digest = _digest(evidence.sections)
    if digest == cursor.digest and moved.boot_id == cursor.boot_id:
        return Reading(events[:MAX_FINDINGS], [], moved, len(lines), skipped,
                       evidence.dropped + max(0, len(events) - MAX_FINDINGS), unchanged=True)
    states: list[Finding] = []
    errors: dict[str, str] = {}
    for name, text in evidence.sections.items():
        try:
            states.extend(SECTIONS[name](text))
        except InvalidRequest as exc:  # one tool's odd output does not hide the others
            errors[name] = str(exc)[:200]
    events, states = dedupe(events), dedupe(states)
    dropped = evidence.dropped
    if len(events) + len(states) > MAX_FINDINGS:
        dropped += len(events) + len(states) - MAX_FINDINGS
        events = events[:MAX_FINDINGS]
        states = states[:MAX_FINDINGS - len(events)]
    keys = tuple(sorted({(str(f.cls), f.subject) for f in states}))
    return Reading(events, states,
                   Cursor(moved.boot_id, moved.after, keys, moved.seen, digest),
                   len(lines), skipped, dropped, errors)


# what changes on every run of a tool without its state changing: nvidia-smi -q's first
# line is "Timestamp : <now>" (seen on a real H200: every post parsed again without this)
_VOLATILE = re.compile(r"^[ \t]*Timestamp[ \t]*:.*$", re.MULTILINE)


def _digest(sections: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(sections):
        text = _VOLATILE.sub("", sections[name])
        h.update(f"{name}\0{len(text)}\0".encode())
        h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def summary(reading: Reading) -> dict[str, Any]:
    """The answer to the probe: where to start next time, and what was taken."""
    return {"accepted": True, "boot_id": reading.cursor.boot_id, "after": reading.cursor.after,
            "seen": reading.cursor.seen,
            "lines": reading.lines_read, "skipped": reading.lines_skipped,
            "findings": len(reading.events) + len(reading.states),
            "dropped": reading.dropped, "errors": reading.errors}
