"""What the apiserver's ``Status`` body and headers on a refused request say: its message, the
PodDisruptionBudget that blocked an eviction, how long to wait (Retry-After). Reads only the
error's ``body`` and ``headers``: no ``kubernetes`` import."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

_PDB_CAUSE = re.compile(r"disruption budget (\S+)")


class ApiError(Protocol):
    body: Any
    headers: Mapping[str, str] | None


def status_body(exc: ApiError) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def status_message(exc: ApiError) -> str:
    return str(status_body(exc).get("message") or "")


def blocking_pdb(exc: ApiError) -> str:
    causes = (status_body(exc).get("details") or {}).get("causes") or []
    for cause in causes:
        match = _PDB_CAUSE.search(str(cause.get("message", "")))
        if match:
            return match.group(1)
    return ""  # not a PodDisruptionBudget: API priority and fairness, say


def retry_after(exc: ApiError, most_s: float) -> float | None:
    value = (exc.headers or {}).get("Retry-After")
    try:
        return min(float(value), most_s) if value is not None else None
    except ValueError:
        return None
