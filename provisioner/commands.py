"""Running an external command from the event loop: no shell, stdin closed, a deadline, and
the child killed (and reaped) on a timeout or when the caller is cancelled, so a stuck
``scontrol`` or reload command never outlives its caller."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str  # empty when stderr was merged into stdout


async def run_command(argv: Sequence[str], *, timeout_s: float,
                      env: Mapping[str, str] | None = None,
                      merge_stderr: bool = False) -> CommandResult:
    """Run ``argv``; OSError when it cannot start, TimeoutError after ``timeout_s``."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except BaseException:  # TimeoutError, CancelledError: leave no child behind
        if proc.returncode is None:
            proc.kill()
            await asyncio.shield(proc.wait())
        raise
    assert proc.returncode is not None
    return CommandResult(proc.returncode, out.decode(errors="replace"),
                         (err or b"").decode(errors="replace"))
