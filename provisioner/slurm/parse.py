"""Slurm answers → ``SlurmNode`` (pure, total: bad input raises ``SlurmParseError``).

Two spellings of a node's state exist:

- slurmrestd v0.0.37/v0.0.38 (Slurm 21.08/22.05): ``"state": "idle"`` (the base state,
  lower-case) and ``"state_flags": ["DRAIN", "DYNAMIC_NORM"]``;
- v0.0.39 and newer (23.02+): ``"state": ["IDLE", "DRAIN"]``, one list of the base state and
  the flags. ``reason_changed_at`` became ``{"set", "infinite", "number"}`` in v0.0.40; only
  ``reason`` and ``reason_set_by_user`` are read, which every version names alike.

``scontrol show node -o`` prints one ``Key=Value`` line per node (``State=IDLE+DRAIN``, a
``*`` after the base state means NOT_RESPONDING); ``Reason=`` is free text that comes last,
followed by ``[user@time]``. ``Gres=gpu:h100:8(S:0-1)`` (or ``(null)``) and
``AvailableFeatures=`` are read for the registration proof (``agree.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from provisioner.slurm.model import BASE_STATES, SlurmNode, SlurmParseError

_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP",
                 "%": "POWERING_DOWN", "!": "POWER_DOWN", "@": "REBOOT_REQUESTED",
                 "$": "MAINTENANCE", "^": "REBOOT_ISSUED", "-": "PLANNED"}
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z_]*)=")
_REASON_TAIL = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^\]@\s]*)@[^\]]*\]\s*(?P<rest>.*)$")


def state_from_flags(words: Iterable[str]) -> tuple[str, frozenset[str]]:
    """(base, flags) from a list of state words in any case; no base word → UNKNOWN."""
    upper = [w.strip().upper() for w in words if w and w.strip()]
    base = next((w for w in upper if w in BASE_STATES), "UNKNOWN")
    return base, frozenset(w for w in upper if w != base)


def state_from_text(text: str) -> tuple[str, frozenset[str]]:
    """``IDLE+DRAIN+DYNAMIC_NORM`` / ``DOWN*+DRAIN`` (scontrol's State=) → (base, flags)."""
    words = [w for w in text.strip().split("+") if w]
    if not words:
        raise SlurmParseError(f"empty node state {text!r}")
    head = words[0]
    suffix_flags = []
    while head and head[-1] in _SUFFIX_FLAGS:
        suffix_flags.append(_SUFFIX_FLAGS[head[-1]])
        head = head[:-1]
    base, flags = state_from_flags([head, *words[1:]])
    return base, flags | frozenset(suffix_flags)


def _text(raw: Mapping[str, object], key: str) -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SlurmParseError(f"node field {key!r} is {type(value).__name__}, expected string")
    return value


def node_from_openapi(raw: object) -> SlurmNode:
    """One element of ``nodes`` of any slurmrestd version (v0.0.37 … v0.0.44)."""
    if not isinstance(raw, Mapping):
        raise SlurmParseError(f"node entry is {type(raw).__name__}, expected object")
    name = _text(raw, "name")
    if not name:
        raise SlurmParseError("node entry without a name")
    state = raw.get("state")
    if isinstance(state, str):
        flags_raw = raw.get("state_flags") or []
        if not isinstance(flags_raw, list) or not all(isinstance(f, str) for f in flags_raw):
            raise SlurmParseError(f"node {name}: state_flags is not a list of strings")
        base, flags = state_from_flags([state, *flags_raw])
    elif isinstance(state, list) and all(isinstance(s, str) for s in state):
        base, flags = state_from_flags(state)
    else:
        raise SlurmParseError(f"node {name}: state {state!r} is neither a string nor a list")
    reason = _text(raw, "reason")
    user = _text(raw, "reason_set_by_user") if reason else ""  # 22.05 names one regardless
    return SlurmNode(name=name, state=base, flags=flags, reason=reason, reason_user=user,
                     gres=_gres(raw.get("gres")), features=_features(raw.get("features")))


def _gres(value: object) -> str:
    """``gres``: a string in every version ("gpu:h100:8", "" or "(null)" for none)."""
    text = value.strip() if isinstance(value, str) else ""
    return "" if text in ("(null)", "N/A") else text


def _features(value: object) -> frozenset[str]:
    """``features``: "h100,ib" (v0.0.37/38) or ["h100", "ib"] (v0.0.39+)."""
    if isinstance(value, str):
        words = value.split(",")
    elif isinstance(value, list):
        words = [w for w in value if isinstance(w, str)]
    else:
        words = []
    return frozenset(w.strip() for w in words if w.strip() and w.strip() != "(null)")


def api_errors(doc: object) -> list[str]:
    """The ``errors`` of a slurmrestd answer as text (v0.0.38: error/errno; newer:
    description/error/error_number)."""
    if not isinstance(doc, Mapping):
        return []
    found = doc.get("errors") or []
    if not isinstance(found, list):
        return [str(found)]
    out = []
    for err in found:
        if isinstance(err, Mapping):
            parts = [str(err[k]) for k in ("description", "error") if err.get(k)]
            number = err.get("error_number", err.get("errno"))
            text = ": ".join(dict.fromkeys(parts)) or "error"
            out.append(f"{text} (errno {number})" if number is not None else text)
        else:
            out.append(str(err))
    return out


def nodes_from_openapi(doc: object) -> list[SlurmNode]:
    """``GET /slurm/vX/nodes`` or ``/node/NAME`` → nodes."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
        raise SlurmParseError("slurmrestd answer has no 'nodes' list")
    nodes = doc["nodes"]
    assert isinstance(nodes, list)
    return [node_from_openapi(raw) for raw in nodes]


def _fields(line: str) -> dict[str, str]:
    # one split in C: [before the first key, key, value, key, value, ...]
    parts = _KEY.split(line)
    return {key: value.strip() for key, value in zip(parts[1::2], parts[2::2], strict=True)}


def node_from_scontrol(line: str) -> SlurmNode:
    """One line of ``scontrol show node -o``."""
    head, sep, tail = line.strip().partition(" Reason=")
    fields = _fields(head)
    reason, user = "", ""
    if sep:
        if (m := _REASON_TAIL.match(tail)) is not None:
            reason, user = m.group("text"), m.group("user")
            fields.update(_fields(m.group("rest")))
        else:
            reason = tail.strip()
    name = fields.get("NodeName", "")
    if not name:
        raise SlurmParseError(f"scontrol line without NodeName: {line[:120]!r}")
    if "State" not in fields:
        raise SlurmParseError(f"node {name}: scontrol line without State=")
    base, flags = state_from_text(fields["State"])
    return SlurmNode(name=name, state=base, flags=flags, reason=reason.strip(),
                     reason_user=user, gres=_gres(fields.get("Gres", "")),
                     features=_features(fields.get("AvailableFeatures",
                                                   fields.get("Features", ""))))


def nodes_from_scontrol(text: str) -> list[SlurmNode]:
    """All of ``scontrol show node -o`` (``No nodes in the system`` → [])."""
    return [node_from_scontrol(line) for line in text.splitlines()
            if line.strip().startswith("NodeName=")]
