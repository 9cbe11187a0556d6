"""``run_command``: output, exit status, a missing binary, and no child left behind after a
timeout or a cancellation (checked by the child's PID)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from provisioner.commands import run_command

SLEEPER = [sys.executable, "-c", "import os, sys, time; "
           "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def written(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def pid_from(path: Path) -> int:
    for _ in range(200):
        if text := written(path):
            return int(text)
        await asyncio.sleep(0.05)
    raise AssertionError("the child never started")


async def test_output_and_exit_status() -> None:
    result = await run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    merged = await run_command(["sh", "-c", "echo out; echo err >&2"], timeout_s=10,
                               merge_stderr=True)
    assert (merged.stdout, merged.stderr) == ("out\nerr\n", "")


async def test_a_missing_binary_is_an_os_error() -> None:
    with pytest.raises(OSError):
        await run_command(["/nonexistent/scontrol"], timeout_s=10)


async def test_a_timeout_kills_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        await run_command([*SLEEPER, str(pidfile)], timeout_s=1)
    assert not alive(await pid_from(pidfile))


async def test_cancellation_kills_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    task = asyncio.create_task(run_command([*SLEEPER, str(pidfile)], timeout_s=60))
    pid = await pid_from(pidfile)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not alive(pid)
