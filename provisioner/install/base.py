"""What an installer reports and how installers compose. No Ansible types: ``ansible.py``
translates ansible-runner's events into these; nothing here does I/O."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from provisioner.domain import Node, Sanitised


class TaskStatus(StrEnum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNREACHABLE = "unreachable"
    RECAP = "recap"  # the play recap of one host (message: "ok=3 changed=1 ...")


@dataclass(frozen=True, slots=True)
class InstallEvent:
    """One task's outcome on one host, or a host's play recap. ``message`` never carries
    secrets: tasks handling them are ``no_log`` and Ansible censors their results."""

    task: str
    host: str
    status: TaskStatus
    message: str
    when: datetime

    @property
    def noteworthy(self) -> bool:
        """Worth a history row: changes, failures and recaps (not every ``ok``)."""
        return self.status in (TaskStatus.CHANGED, TaskStatus.FAILED, TaskStatus.UNREACHABLE,
                               TaskStatus.RECAP)

    def summary(self) -> str:
        """``<task>: <status> <message>``, as the node's history shows it."""
        return f"{self.task}: {self.status} {self.message}".rstrip()


@dataclass(frozen=True, slots=True)
class PlayRecap:
    """One host's counts from the play recap (``playbook_on_stats``)."""

    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    def __str__(self) -> str:
        return (f"ok={self.ok} changed={self.changed} unreachable={self.unreachable} "
                f"failed={self.failed} skipped={self.skipped} rescued={self.rescued} "
                f"ignored={self.ignored}")


@dataclass(frozen=True, slots=True)
class RunResult:
    """How one playbook run ended. ``status``: ansible-runner's (successful, failed,
    timeout, canceled)."""

    status: str
    rc: int
    recap: dict[str, PlayRecap] = field(default_factory=dict)
    failures: tuple[InstallEvent, ...] = ()
    private_data_dir: str = ""
    stdout_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    @property
    def changed(self) -> int:
        return sum(recap.changed for recap in self.recap.values())


#: ``on_event(node_id, event)``: the daemon writes noteworthy events into the node's history.
OnEvent = Callable[[str, InstallEvent], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    """Where the ``facts`` role posts a node's facts: the boot HTTP server's agent API
    (``<url>/agent/v1/facts``) with a node-bound agent token from ``issue_token``."""

    url: str
    issue_token: Callable[[str], Awaitable[str]]
    #: the in-band probe's token (``lifecycle.inband``); None: no probe is installed
    issue_probe_token: Callable[[str], Awaitable[str]] | None = None
    probe_period_s: float = 60.0  # the probe's timer (``health.probe_period_s``)


class ImageWriter(Protocol):
    """The part of an ``Installer`` that writes or erases disks."""

    async def deploy_image(self, node: Node, generation: str) -> None: ...

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        ...

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        ...


class Configurer(Protocol):
    """The part of an ``Installer`` that configures a written OS."""

    async def configure(self, node: Node, generation: str) -> None: ...

    async def collect_facts(self, node: Node, generation: str) -> None: ...


class ComposedInstaller:
    """An ``Installer`` made of an image writer and a configurer (e.g. the agent's image
    deploy and Ansible)."""

    def __init__(self, images: ImageWriter, configurer: Configurer) -> None:
        self._images = images
        self._configurer = configurer

    async def deploy_image(self, node: Node, generation: str) -> None:
        await self._images.deploy_image(node, generation)

    async def configure(self, node: Node, generation: str) -> None:
        await self._configurer.configure(node, generation)

    async def collect_facts(self, node: Node, generation: str) -> None:
        await self._configurer.collect_facts(node, generation)

    async def sanitise(self, node: Node, generation: str, skip: frozenset[str]) -> Sanitised:
        return await self._images.sanitise(node, generation, skip)

    async def build_arrays(self, node: Node, generation: str,
                           arrays: list[dict[str, Any]]) -> dict[str, Any]:
        return await self._images.build_arrays(node, generation, arrays)
