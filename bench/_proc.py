"""CPU time of benchmarked processes, read from ``/proc/<pid>/stat`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str]:
    """The fields after ``pid (comm)``: ``[0]`` state, ``[1]`` ppid, ``[11:15]`` utime,
    stime, cutime, cstime (in clock ticks)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    """A process's own CPU (user + system)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(roots: list[int]) -> float:
    """CPU (user + system) of the processes ``roots`` and all their live descendants, the
    reaped ones' included (a process's ``cutime``/``cstime``: tftpd-hpa's forks)."""
    stats: dict[int, tuple[int, int]] = {}  # pid: (ppid, ticks with its reaped children)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(entry.name)
        except OSError:  # exited meanwhile
            continue
        stats[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    ticks, todo = 0, [pid for pid in roots if pid in stats]
    while todo:
        pid = todo.pop()
        ticks += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return ticks / CLOCK_TICKS
