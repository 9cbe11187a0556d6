"""What a BMC says of its machine, as findings (pure): new IPMI SEL records (as pyghmi reads
them), new Redfish ``LogServices`` entries, the ``Status.Health`` of the system and the
leak detectors of a liquid-cooled chassis (``ThermalSubsystem/LeakDetection``).

Log records are events: only those after the node's cursor count (``new_sel``,
``new_log_entries``), so a restart or a second daemon never raises an old record again; an
asserted critical event is a finding, its deassertion (or a Redfish entry marked
``Resolved``) clears it, an informational one is nothing. The first read of a node (no
cursor) sets the cursor and raises nothing: a machine enrolled with years of SEL history is
not drained for them; what is wrong *now* still shows in its status and its detectors.
Status and detectors are states: reported while they are not ``OK``, cleared when they are.

SEL records become ``ipmitool sel elist`` lines and go through the same rules as a saved
``sel elist`` (``sel.classify_line``): one code path for operators' files and the poller.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from provisioner.health.model import Action, Finding, HealthClass
from provisioner.health.sel import classify_line
from provisioner.health.sources import by_words

REDFISH_LOG: Final = "redfish-log"
REDFISH_STATUS: Final = "redfish-status"
LEAK: Final = "redfish-leak"

# IPMI threshold event offsets (event/reading type 01h) as ipmitool writes them
_THRESHOLD: Final = (
    "Lower Non-critical going low", "Lower Non-critical going high",
    "Lower Critical going low", "Lower Critical going high",
    "Lower Non-recoverable going low", "Lower Non-recoverable going high",
    "Upper Non-critical going low", "Upper Non-critical going high",
    "Upper Critical going low", "Upper Critical going high",
    "Upper Non-recoverable going low", "Upper Non-recoverable going high")
_BAD: Final = frozenset({"warning", "critical"})
_RANK: Final = {"ok": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True, slots=True)
class Event:
    """One log record judged: a finding, and whether the record clears it."""

    finding: Finding
    clears: bool = False


# -- IPMI SEL -------------------------------------------------------------------------------


def sel_cursor(info: Mapping[str, Any], entries: list[Mapping[str, Any]]) -> str:
    """The cursor after a read: the SEL's size and last add and erase times (Get SEL Info:
    the times have a one-second grain, the size tells two adds within one apart) and the
    last record read (its id and timecode: a cleared SEL reuses ids)."""
    last = entries[-1] if entries else {}
    return json.dumps({"n": info.get("entries"), "add": info.get("last_add"),
                       "erase": info.get("last_erase"),
                       "rid": last.get("record_id"), "tc": last.get("timecode")},
                      separators=(",", ":"))


def sel_unchanged(info: Mapping[str, Any], cursor: str | None) -> bool:
    """Nothing added or erased since ``cursor`` (one Get SEL Info, no record read)."""
    seen = _load(cursor)
    return bool(seen) and (seen.get("n"), seen.get("add"), seen.get("erase")) == (
        info.get("entries"), info.get("last_add"), info.get("last_erase"))


def new_sel(entries: list[Mapping[str, Any]], cursor: str | None) -> list[Mapping[str, Any]]:
    """The records after the cursor's; all of them when its record is gone (the SEL was
    cleared); none on a first read."""
    seen = _load(cursor)
    if not seen:
        return []
    for index, entry in enumerate(entries):
        if entry.get("record_id") == seen.get("rid") and entry.get("timecode") == seen.get("tc"):
            return entries[index + 1:]
    return entries


def sel_line(entry: Mapping[str, Any]) -> str:
    """A pyghmi SEL record as an ``ipmitool sel elist`` line."""
    stamp = str(entry.get("timestamp") or entry.get("timecode") or "")
    date, _, clock = stamp.partition("T")
    sensor = " ".join(str(p) for p in (entry.get("component_type"), entry.get("component"))
                      if p)
    event_type, _, offset = str(entry.get("event_id", "")).partition(".")
    if event_type == "1" and offset.isdigit() and int(offset) < len(_THRESHOLD):
        event = _THRESHOLD[int(offset)]
    else:
        event = str(entry.get("asserted_event") or entry.get("event") or "")
    if entry.get("event_data"):
        event = f"{event} ({entry['event_data']})"
    direction = "Deasserted" if entry.get("deassertion") else "Asserted"
    rid = entry.get("record_id")
    rid_text = f"{rid:x}" if isinstance(rid, int) else str(rid or "")
    return (f"{rid_text} | {date} | {clock} | {sensor or 'Unknown'} | {event or 'Unknown'} "
            f"| {direction}")


def sel_events(entries: Iterable[Mapping[str, Any]]) -> list[Event]:
    events: list[Event] = []
    for entry in entries:
        judged = classify_line(sel_line(entry))
        if judged is not None:
            events.append(Event(judged[0], clears=judged[1]))
    return events


# -- Redfish ------------------------------------------------------------------------------------


def new_log_entries(entries: list[Mapping[str, Any]], cursor: Mapping[str, Any] | None
                    ) -> list[Mapping[str, Any]]:
    """Entries of one log service newer than its cursor ``{"created", "ids"}`` (the newest
    ``Created`` seen and the ids that carried it): order-blind, as BMCs list newest first
    or last. None on a first read."""
    if cursor is None:
        return []
    newest, ids = str(cursor.get("created") or ""), set(cursor.get("ids") or ())
    return [e for e in entries if str(e.get("Created") or "") > newest
            or (str(e.get("Created") or "") == newest and str(e.get("Id")) not in ids)]


def log_cursor(entries: list[Mapping[str, Any]], before: Mapping[str, Any] | None
               ) -> dict[str, Any]:
    newest = max((str(e.get("Created") or "") for e in entries),
                 default=str((before or {}).get("created") or ""))
    ids = sorted({str(e.get("Id")) for e in entries if str(e.get("Created") or "") == newest})
    if before and str(before.get("created") or "") == newest:
        ids = sorted(set(ids) | {str(i) for i in before.get("ids") or ()})
    return {"created": newest, "ids": ids}


def log_events(entries: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Redfish ``LogEntry`` records: a SEL-type entry through the SEL rules (its
    ``SensorType`` and ``EntryCode``/``Message``); a ``Critical`` one no rule places, by
    its message's words (drain); ``OK`` and unplaced ``Warning`` entries are nothing."""
    events: list[Event] = []
    for entry in entries:
        severity = str(entry.get("Severity") or "").lower()
        message = " ".join(str(entry.get(k) or "") for k in ("EntryCode", "Message")).strip()
        message = message.replace(" - ", " ")
        sensor = str(entry.get("SensorType") or "")
        line = (f"{entry.get('Id', '')} | {entry.get('Created', '')} | | {sensor or 'Log'} "
                f"| {message} | {'Deasserted' if entry.get('Resolved') else 'Asserted'}")
        judged = classify_line(line) if sensor else None
        if judged is not None:
            events.append(Event(_redfish(judged[0]), clears=judged[1]))
        elif severity == "critical" and message:
            cls, action = by_words(f"{sensor} {message}", HealthClass.HARDWARE)
            events.append(Event(Finding(cls, action, line, REDFISH_LOG,
                                        f"{sensor or 'log'}: {message}"[:128]),
                                clears=bool(entry.get("Resolved"))))
    return events


def status_finding(what: str, resource: Mapping[str, Any]) -> Finding | None:
    """A resource's ``Status.Health`` or ``HealthRollup`` (its parts), the worse, when not
    OK: ``Critical`` drains, ``Warning`` is recorded only."""
    status = resource.get("Status")
    if not isinstance(status, Mapping):
        return None
    own, rollup = str(status.get("Health") or "OK"), str(status.get("HealthRollup") or "OK")
    health = max(own, rollup, key=lambda h: _RANK.get(h.lower(), 0))  # a part's too
    if health.lower() not in _BAD:
        return None
    detail = f" (own {own}, rollup {rollup})" if own != rollup else ""
    action = Action.DRAIN if health.lower() == "critical" else Action.NONE
    name = str(resource.get("Id") or resource.get("Name") or what)
    return Finding(HealthClass.HARDWARE, action,
                   f"Redfish {what} {name}: Status.Health {health}{detail}", REDFISH_STATUS,
                   f"{what} {name}")


def leak_finding(detector: Mapping[str, Any]) -> Finding | None:
    """A leak detector whose ``DetectorState`` (or health) is not OK: a leak, for the
    vendor (values seen: ``Warning``, ``Critical``, and GB200's ``LeakDetected``)."""
    state = str(detector.get("DetectorState") or "OK")
    status = detector.get("Status")
    health = str(status.get("Health") or "OK") if isinstance(status, Mapping) else "OK"
    if state.lower() in ("ok", "absent", "unavailable") and health.lower() not in _BAD:
        return None
    name = str(detector.get("Id") or detector.get("Name") or "leak detector")
    kind = detector.get("LeakDetectorType")
    return Finding(HealthClass.LEAK, Action.SERVICE_REQUIRED,
                   f"Redfish leak detector {name}{f' ({kind})' if kind else ''}: "
                   f"DetectorState {state}, Status.Health {health}", LEAK, name)


def _redfish(finding: Finding) -> Finding:
    return Finding(finding.cls, finding.action, finding.evidence, REDFISH_LOG, finding.subject)


def _load(cursor: str | None) -> dict[str, Any]:
    if not cursor:
        return {}
    try:
        value = json.loads(cursor)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

