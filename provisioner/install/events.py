"""ansible-runner's events and outcomes in provisioner's terms (pure: no I/O, no runner).

``translate`` turns runner's event dicts into ``InstallEvent``s; ``raise_for`` turns a run
that did not succeed into the step's error (retryable or fatal)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

from provisioner.errors import FatalError, RetryableError
from provisioner.install.base import InstallEvent, PlayRecap, RunResult, TaskStatus

_MESSAGE_MAX = 500
_TASK_EVENTS = {"runner_on_ok", "runner_on_failed", "runner_on_skipped",
                "runner_on_unreachable"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def translate(raw: Mapping[str, object]) -> list[InstallEvent]:
    """runner event → ``InstallEvent``s: task outcomes and play recaps; the rest is dropped."""
    name = str(raw.get("event", ""))
    data = _mapping(raw.get("event_data"))
    when = _when(raw.get("created"))
    if name == "playbook_on_stats":
        return [InstallEvent(task="PLAY RECAP", host=host, status=TaskStatus.RECAP,
                             message=str(recap), when=when)
                for host, recap in recap_from_stats(data).items()]
    if name not in _TASK_EVENTS:
        return []
    res = _mapping(data.get("res"))
    task = str(data.get("task") or data.get("task_action") or "?").strip()
    host = str(data.get("host") or data.get("remote_addr") or "?")
    status, message = _status(name, data, res)
    return [InstallEvent(task=task, host=host, status=status, message=message, when=when)]


def _status(name: str, data: Mapping[str, object],
            res: Mapping[str, object]) -> tuple[TaskStatus, str]:
    if name == "runner_on_ok":
        return (TaskStatus.CHANGED if res.get("changed") else TaskStatus.OK), ""
    if name == "runner_on_skipped":
        return TaskStatus.SKIPPED, ""
    if name == "runner_on_unreachable":
        return TaskStatus.UNREACHABLE, failure_message(res)
    if data.get("ignore_errors"):
        return TaskStatus.OK, "failed (ignored): " + failure_message(res)
    return TaskStatus.FAILED, failure_message(res)


def failure_message(res: Mapping[str, object]) -> str:
    """``msg``, plus the last stderr lines of a command, in one short line."""
    items = res.get("results")
    if isinstance(items, list):  # a loop: the first failed item speaks for the task
        failed = [item for item in items if isinstance(item, Mapping) and item.get("failed")]
        if failed:
            return failure_message(failed[0])
    parts = [str(res.get("msg") or "").strip()]
    stderr = str(res.get("stderr") or res.get("module_stderr") or "").strip()
    if stderr:
        parts.append(" / ".join(stderr.splitlines()[-3:]))
    rc = res.get("rc")
    if isinstance(rc, int) and rc != 0:
        parts.append(f"(rc {rc})")
    text = " ".join(" ".join(part for part in parts if part).split())
    return text if len(text) <= _MESSAGE_MAX else text[:_MESSAGE_MAX - 1] + "\u2026"


def recap_from_stats(stats: object) -> dict[str, PlayRecap]:
    """``playbook_on_stats`` data (or ``Runner.stats``): per-host ``PlayRecap``."""
    if not isinstance(stats, Mapping):
        return {}
    keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
            "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
    counts: dict[str, dict[str, int]] = {}
    for source, target in keys.items():
        per_host = stats.get(source)
        if isinstance(per_host, Mapping):
            for host, count in per_host.items():
                if isinstance(count, int):
                    counts.setdefault(str(host), {})[target] = count
    return {host: PlayRecap(**values) for host, values in counts.items()}


def _when(created: object) -> datetime:
    if isinstance(created, str):
        try:
            parsed = datetime.fromisoformat(created)
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return datetime.now(UTC)


def raise_for(result: RunResult, what: str) -> None:
    """Turn a run that did not succeed into the step's error: an unreachable host is
    retryable, so is a timeout; a failing task is fatal and names the task."""
    if result.ok:
        return
    unreachable = [e for e in result.failures if e.status is TaskStatus.UNREACHABLE]
    failed = [e for e in result.failures if e.status is TaskStatus.FAILED]
    if unreachable:
        event = unreachable[0]
        raise RetryableError(f"{what}: host {event.host} unreachable: {event.message}")
    if failed:
        event = failed[-1]
        raise FatalError(f"{what}: task {event.task!r} failed on {event.host}: "
                         f"{event.message}")
    if result.status == "timeout":
        raise RetryableError(f"{what}: ansible-playbook timed out")
    last = result.stdout_tail.splitlines()[-1:] or [f"status {result.status}"]
    raise FatalError(f"{what}: ansible-playbook exited with rc {result.rc}: {last[0]}")
