"""Prometheus Alertmanager's webhook (``version: "4"``) as health reports (pure).

Each alert names its node by the label ``node``, else ``instance`` (``host:port``: the host,
``[v6]:port`` too), else ``Hostname`` (dcgm-exporter's own label). Its class is the label
``class`` when it names one of ours, else the alert name's words (dcgm-exporter metric names
such as ``DCGM_FI_DEV_XID_ERRORS``, ``..._ECC_DBE_...``, ``..._NVLINK_...``, ``..._GPU_TEMP``
are words too), with an XID number (label ``xid``/``err_code``, or in the name) looked up in
the catalogue. The action is the label ``action`` when it names one of ours or one of
NVIDIA's resolutions (``RESTART_BM``, ``RESET_GPU``...), else the XID's, else
``drain`` for a ``critical`` (or ``page``, ``error``) alert and ``none`` below. Evidence is
the alert name, severity, summary and description. ``resolved`` clears the finding.

https://prometheus.io/docs/alerting/latest/configuration/#webhook_config
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from provisioner.errors import InvalidRequest
from provisioner.health.model import Action, HealthClass
from provisioner.health.records import Report
from provisioner.health.sources import by_words
from provisioner.health.xid import RESOLUTION_ACTIONS, lookup

C = HealthClass
MAX_ALERTS = 1000
_DRAIN_SEVERITIES = frozenset({"critical", "page", "error", "fatal", "disaster"})
# dcgm-exporter's metric words, before the generic ones of ``by_words``
_METRIC: tuple[tuple[re.Pattern[str], HealthClass], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cls) for pattern, cls in (
        (r"fell.?off|fallen|gpu.?(lost|missing|down)", C.GPU_LOST),
        (r"ecc|dbe|sbe|remap|retired|_PAGE_", C.GPU_MEMORY),
        (r"nvlink", C.NVLINK),
        (r"nvswitch|fabric", C.FABRIC),
        (r"xid", C.GPU),
        (r"temp|therm|fan", C.THERMAL),
        (r"power|psu", C.POWER),
    ))
_XID_IN_NAME = re.compile(r"xid\D{0,3}(\d{1,3})(?!\d)", re.IGNORECASE)
_SUBJECT_LABELS = ("subject", "UUID", "gpu", "device", "port", "sensor", "pci_bus_id")


@dataclass(frozen=True, slots=True)
class Alert:
    node: str
    report: Report
    firing: bool


def node_name(labels: Mapping[str, str]) -> str | None:
    """The node an alert is about: ``node``, ``instance`` without its port, ``Hostname``."""
    if name := labels.get("node", "").strip():
        return name
    if instance := labels.get("instance", "").strip():
        if instance.startswith("["):  # [2001:db8::1]:9400
            return instance[1:].partition("]")[0] or None
        host, sep, port = instance.rpartition(":")
        return host if sep and port.isdigit() and ":" not in host else instance
    return labels.get("Hostname", "").strip() or None


def alert_report(labels: Mapping[str, str], annotations: Mapping[str, str], *,
                 starts_at: datetime | None = None) -> Report:
    name = labels.get("alertname", "") or "unnamed alert"
    severity = labels.get("severity", "").lower()
    cls, action = _class(name, labels)
    named = labels.get("action", "")
    if named.lower() in Action.__members__.values():
        action = Action(named.lower())
    elif named.upper() in RESOLUTION_ACTIONS:  # NVIDIA's names: RESTART_BM, RESET_GPU...
        action = RESOLUTION_ACTIONS[named.upper()]
    elif action is None:
        action = Action.DRAIN if severity in _DRAIN_SEVERITIES else Action.NONE
    parts = [name + (f" ({severity})" if severity else "")]
    parts += [annotations[key] for key in ("summary", "description") if annotations.get(key)]
    subject = next((f"{key}={labels[key]}" if key != "subject" else labels[key]
                    for key in _SUBJECT_LABELS if labels.get(key)), "")
    return Report(cls, action, ": ".join(parts), subject, starts_at).clipped()


def _class(name: str, labels: Mapping[str, str]) -> tuple[HealthClass, Action | None]:
    """The class, and the action an XID number implies (None: the severity decides)."""
    if (named := labels.get("class", "").lower()) in HealthClass.__members__.values():
        return HealthClass(named), None
    code = next((labels[key] for key in ("xid", "err_code", "xid_code")
                 if labels.get(key, "").isdigit()), None)
    if code is None and (found := _XID_IN_NAME.search(name)) is not None:
        code = found.group(1)
    if code is not None:
        entry = lookup(int(code))
        return entry.cls, entry.action
    for pattern, cls in _METRIC:
        if pattern.search(name):
            return cls, None
    return by_words(" ".join(filter(None, (name, labels.get("component", "")))))[0], None


def parse_webhook(payload: object) -> list[Alert]:
    """The alerts of one webhook notification; InvalidRequest when it is not one. Alerts
    that name no node are skipped (the caller counts them)."""
    if not isinstance(payload, dict):
        raise InvalidRequest("not an Alertmanager webhook: the body is not a JSON object")
    version = payload.get("version", "4")
    if str(version) != "4":
        raise InvalidRequest(f"Alertmanager webhook version {version!r}: only \"4\" is known")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise InvalidRequest("not an Alertmanager webhook: no \"alerts\" list")
    if len(alerts) > MAX_ALERTS:
        raise InvalidRequest(f"{len(alerts)} alerts in one notification; at most {MAX_ALERTS}")
    found: list[Alert] = []
    for index, alert in enumerate(alerts):
        if not isinstance(alert, dict):
            raise InvalidRequest(f"alerts[{index}] is not an object")
        labels, annotations = _strings(alert, "labels", index), _strings(alert, "annotations",
                                                                         index)
        status = alert.get("status", payload.get("status", "firing"))
        if status not in ("firing", "resolved"):
            raise InvalidRequest(f"alerts[{index}].status {status!r}: firing or resolved")
        node = node_name(labels)
        if node is None:
            continue
        found.append(Alert(node, alert_report(labels, annotations,
                                              starts_at=_time(alert.get("startsAt"))),
                           status == "firing"))
    return found


def _time(value: object) -> datetime | None:
    """An alert's ``startsAt`` (RFC 3339, nanoseconds allowed); None when absent, unset
    (Go's zero time) or not a time."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        return None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def _strings(alert: Mapping[str, object], key: str, index: int) -> dict[str, str]:
    value = alert.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidRequest(f"alerts[{index}].{key} must map names to strings")
    return {str(k): v for k, v in value.items()}
