"""``ipmitool sel elist`` (or ``sel list``) → findings::

       1 | 06/14/2023 | 10:01:17 | Power Supply PS2 Status | Power Supply AC lost | Asserted
      2b | 12/06/2024 | 10:07:58 PM EST | Fan #0x48 | Lower Non-recoverable going low  | Deasserted
      34 | 02/25/2025 | 04:50:09 PM | Memory #0x02 | Uncorrectable ECC (... |  DIMMD7) | Asserted

The sensor column starts with its IPMI sensor type (``Power Supply``, ``Fan``, ``Temperature``,
``Memory``, ``Processor``, ...). A ``Deasserted`` entry clears the same sensor's same event
asserted before it; what is still asserted at the end is a finding. Informational events (OS
boot, ACPI state, log cleared, correctable ECC, non-critical thresholds) are not.
"""

from __future__ import annotations

import re

from provisioner.health.model import Action, Finding, HealthClass, Source, dedupe

SEL_LINE = re.compile(r"^\s*[0-9a-fA-F]+\s*\|[^|]*\|[^|]*\|[^|]*\|")
_CRITICAL = re.compile(r"\b(?:critical|non-recoverable)\b going (?:high|low)", re.IGNORECASE)
_NONCRITICAL = re.compile(r"non-critical", re.IGNORECASE)
H, A = HealthClass, Action

# (sensor-type words, event words, class, action): first match wins; "" matches anything
_RULES: tuple[tuple[str, str, HealthClass, Action], ...] = (
    ("leak", "", H.LEAK, A.SERVICE_REQUIRED),
    ("", "leak", H.LEAK, A.SERVICE_REQUIRED),
    ("power supply", "failure detected", H.POWER, A.SERVICE_REQUIRED),
    ("power supply", "predictive failure", H.POWER, A.SERVICE_REQUIRED),
    ("power supply", "ac lost", H.POWER, A.SERVICE_REQUIRED),
    ("power supply", "configuration error", H.POWER, A.SERVICE_REQUIRED),
    ("power supply", "input lost", H.POWER, A.SERVICE_REQUIRED),      # pyghmi's words
    ("power supply", "failure", H.POWER, A.SERVICE_REQUIRED),
    ("power", "redundancy lost", H.POWER, A.SERVICE_REQUIRED),
    ("voltage", "critical", H.POWER, A.DRAIN),
    ("fan", "critical", H.THERMAL, A.SERVICE_REQUIRED),
    ("fan", "non-recoverable", H.THERMAL, A.SERVICE_REQUIRED),
    ("cooling", "redundancy lost", H.THERMAL, A.SERVICE_REQUIRED),
    ("temperature", "critical", H.THERMAL, A.DRAIN),
    ("temperature", "non-recoverable", H.THERMAL, A.DRAIN),
    ("processor", "thermal trip", H.THERMAL, A.SERVICE_REQUIRED),
    ("memory", "uncorrectable", H.HOST_MEMORY, A.SERVICE_REQUIRED),
    ("memory", "device disabled", H.HOST_MEMORY, A.SERVICE_REQUIRED),
    ("memory", "logging limit reached", H.HOST_MEMORY, A.DRAIN),
    ("memory", "parity", H.HOST_MEMORY, A.SERVICE_REQUIRED),
    ("processor", "ierr", H.HARDWARE, A.POWER_CYCLE),
    ("processor", "machine check", H.HARDWARE, A.RESTART_OS),
    ("critical interrupt", "uncorrectable", H.HARDWARE, A.RESTART_OS),
    ("critical interrupt", "fatal", H.HARDWARE, A.RESTART_OS),
    ("critical interrupt", "serr", H.HARDWARE, A.RESTART_OS),
    ("drive", "fault", H.HARDWARE, A.SERVICE_REQUIRED),
    ("drive", "predictive failure", H.HARDWARE, A.DRAIN),
)


def is_sel(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    hits = sum(1 for line in lines if SEL_LINE.match(line))
    return hits > 0 and hits * 2 >= len(lines)


def classify_sel(text: str) -> list[Finding]:
    asserted: dict[tuple[str, str], Finding] = {}
    for raw in text.splitlines():
        judged = _judge(raw)
        if judged is None:
            continue
        key, finding = judged
        if finding is None:
            asserted.pop(key, None)
        else:
            asserted[key] = finding
    return dedupe(list(asserted.values()))


def classify_line(line: str) -> tuple[Finding, bool] | None:
    """One SEL line: (its finding, whether the line deasserts it), None when informational
    or not a SEL line. A deassertion yields the finding its assertion would have."""
    if not SEL_LINE.match(line):
        return None
    sensor, event, deasserted = _fields(line)
    finding = _rule(sensor, event, line.strip())
    return None if finding is None else (finding, deasserted)


def _fields(raw: str) -> tuple[str, str, bool]:
    fields = [field.strip() for field in raw.split("|")]
    # id | date | time | sensor | event... | direction (the event may hold "|" itself)
    sensor, direction = fields[3], fields[-1]
    event = " ".join(fields[4:-1]) if direction.lower() in ("asserted", "deasserted") \
        else " ".join(fields[4:])
    return sensor, event, direction.lower() == "deasserted"


def _judge(raw: str) -> tuple[tuple[str, str], Finding | None] | None:
    """(sensor and event, the finding or None for a deassertion); None: nothing to do."""
    if not SEL_LINE.match(raw):
        return None
    sensor, event, deasserted = _fields(raw)
    key = (sensor.lower(), event.lower())
    if deasserted:
        return key, None
    finding = _rule(sensor, event, raw.strip())
    return None if finding is None else (key, finding)


def _rule(sensor: str, event: str, line: str) -> Finding | None:
    lowered_sensor, lowered_event = sensor.lower(), event.lower()
    if _NONCRITICAL.search(lowered_event):
        return None
    for sensor_words, event_words, cls, action in _RULES:
        if sensor_words and sensor_words not in lowered_sensor:
            continue
        if event_words and event_words not in lowered_event:
            continue
        if event_words in ("critical", "non-recoverable") and not _CRITICAL.search(event):
            continue
        return Finding(cls, action, line, Source.IPMI_SEL, f"{sensor}: {event}")
    return None
