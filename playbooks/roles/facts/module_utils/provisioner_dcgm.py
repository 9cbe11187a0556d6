"""Judging ``dcgmi diag -r <level> -j`` (standard library only, runs on the node).

Two byte-for-byte copies: the ``facts`` role's ``module_utils/provisioner_dcgm.py`` (the facts
module runs it on the node) and ``provisioner/acceptance/dcgm_diag.py`` (fabric acceptance
judges saved outputs with it); tests/unit/test_acceptance_judge.py checks they are equal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

MAX_SUMMARY = 4000


def judge_dcgm(returncode: int, out: str, err: str) -> dict[str, Any]:
    """Passed: exit status 0 and no test with status Fail. No JSON at all: dcgmi did not get
    to run the diagnostic (no nv-hostengine, say); its own words are the summary. A failed
    test is named with DCGM's own reason (its warnings) and the GPUs it names.

    Layouts read (NVIDIA/DCGM, dcgmi/DcgmDiagOutput and testing/python3 NAME_FIELD/
    RESULTS_FIELD/WARNING_FIELD/GPU_FIELD): DCGM 3 ``{"DCGM GPU Diagnostic":
    {"test_categories": [{"category", "tests": [{"name", "results": [{"gpu_ids", "status",
    "warnings": [{"warning", "error_id", ...}], "info"}]}]}]}}``; DCGM 4 ``{"DCGM
    Diagnostic": {"test_categories": [... {"name", "test_summary": {"status"}, "results":
    [{"entity_group", "entity_id", "status", "warnings": [{"warning", "error_id",
    "error_category", "error_severity"}], "info"}]}]}, "metadata": {"version"}}``. DCGM 2's
    ``"status"`` keys sit at the same places."""
    start, end = out.find("{"), out.rfind("}")
    try:
        doc = json.loads(out[start:end + 1]) if 0 <= start < end else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        words = " ".join((err or out).split()[-60:])
        return {"ran": returncode == 0, "passed": returncode == 0,
                "summary": (words or f"exit status {returncode}")[:MAX_SUMMARY]}
    failed: dict[str, list[str]] = {}
    for name, reason in failed_tests(doc, ""):
        failed.setdefault(name, [])
        if reason and reason not in failed[name]:
            failed[name].append(reason)
    passed = returncode == 0 and not failed
    if passed:
        summary = "all tests passed"
    elif failed:
        summary = "failed: " + "; ".join(
            f"{name} ({' / '.join(reasons)})" if reasons else name
            for name, reasons in sorted(failed.items()))
    else:
        summary = f"exit status {returncode}"
    return {"ran": True, "passed": passed, "summary": summary[:MAX_SUMMARY]}


def failed_tests(value: object, name: str) -> Iterator[tuple[str, str]]:
    """(test name, DCGM's reason) of every result whose status is Fail, anywhere in DCGM's
    JSON; the reason is the result's warnings (``warning``, or ``message``) prefixed with
    the GPU (``gpu_ids`` in DCGM 3, ``entity_id`` in 4), "" when DCGM gave none."""
    if isinstance(value, list):
        for item in value:
            yield from failed_tests(item, name)
    elif isinstance(value, dict):
        here = value.get("name") or value.get("test_name") or name
        here = here if isinstance(here, str) else name
        status = value.get("status")
        if isinstance(status, str) and status.strip().lower() in ("fail", "failed", "error"):
            yield here or "unnamed test", dcgm_reason(value)
        for key, item in value.items():
            if key != "test_summary" and isinstance(item, (dict, list)):
                yield from failed_tests(item, here)


def dcgm_reason(result: dict[str, Any]) -> str:
    """DCGM writes ``warnings`` as a list of objects or of strings, and some versions as
    one string or one object: each is one warning (a string is never split up)."""
    texts: list[str] = []
    warnings = result.get("warnings") or []
    if not isinstance(warnings, list):
        warnings = [warnings]
    for warning in warnings:
        if isinstance(warning, dict):
            text = warning.get("warning") or warning.get("message")
        else:
            text = warning
        if isinstance(text, str) and text.strip():
            texts.append(" ".join(text.split()))
    gpu = result.get("gpu_ids", result.get("entity_id", result.get("gpu_id")))
    where = f"GPU {gpu}: " if isinstance(gpu, (int, str)) and str(gpu) != "" else ""
    return (where + "; ".join(texts))[:400] if texts else ""
