"""Publish ``topology.conf`` for a classic slurmctld: a file written atomically (a temporary
file in the same directory, fsync, rename) only when its content changed, then an optional
reload command (``scontrol reconfigure``) run as an asyncio subprocess with a deadline.

A reload that fails is retried at the next publication even though the file is then
unchanged: slurmctld must not keep running on the old topology silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

from provisioner.commands import run_command
from provisioner.errors import RetryableError
from provisioner.topology.snapshot import Snapshot

log = logging.getLogger(__name__)
_OUTPUT_CHARS = 500


class PublishFailed(RetryableError):
    """A publication that did not complete; the live topology retries it."""


def write_if_changed_blocking(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically unless it already holds it; True if written."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError):
        pass  # unreadable or not text: replace it
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return True


class FilePublisher:
    name = "file"

    def __init__(self, path: Path, reload_command: Sequence[str] = (), *,
                 reload_timeout_s: float = 60.0, executor: Executor | None = None) -> None:
        self._path = path
        self._reload = tuple(reload_command)
        self._timeout_s = reload_timeout_s
        self._executor = executor
        self._reload_due = False

    async def publish(self, snapshot: Snapshot) -> bool:
        loop = asyncio.get_running_loop()
        try:
            written = await loop.run_in_executor(
                self._executor, write_if_changed_blocking, self._path, snapshot.topology_conf)
        except OSError as exc:
            raise PublishFailed(f"{self._path}: {exc.strerror or exc}") from None
        if written:
            log.info("topology: %s written (%s)", self._path, snapshot.digest[:12])
            self._reload_due = bool(self._reload)
        if self._reload_due:
            await self._run_reload()
            self._reload_due = False
        return True

    async def _run_reload(self) -> None:
        command = " ".join(self._reload)
        try:
            result = await run_command(self._reload, timeout_s=self._timeout_s,
                                       merge_stderr=True)
        except OSError as exc:
            raise PublishFailed(f"reload command {command!r}: {exc.strerror or exc}") from None
        except TimeoutError:
            raise PublishFailed(f"reload command {command!r} killed after "
                                f"{self._timeout_s:g} s") from None
        text = result.stdout.strip()[-_OUTPUT_CHARS:]
        if result.returncode != 0:
            raise PublishFailed(f"reload command {command!r} exited {result.returncode}: "
                                f"{text or 'no output'}")
        log.info("topology: ran %s", command)
