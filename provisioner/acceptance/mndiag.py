"""Judging ``dcgmi mndiag`` (DCGM 4.3+, GB200/GB300 NVL72): by its exit status only.

No output of a real ``dcgmi mndiag`` run is public (searched: NVIDIA's docs, the code index,
issues, pages; DCGM's own unit tests build their responses in code), so nothing it prints is
parsed: a guessed layout would pass or fail a domain on words nobody has seen. What is
certain is enough to judge it:

* whether this DCGM has it: ``dcgmi mndiag --help`` exits 0 where the subsystem exists
  (TCLAP's help visitor), and a dcgmi without it answers ``ERROR: Invalid subsystem.`` with
  ``DCGM_ST_BADPARAM`` (NVIDIA/DCGM ``dcgmi/CommandLineParser.cpp``,
  ``dcgmi/NvcmTCLAP.h``). That probe is used rather than comparing ``dcgmi --version`` to
  4.3: it asks the binary itself, so a backport, a build without the module or a version
  string in another shape cannot mislead it; ``dcgmi --version`` only names the version in
  the reason;
* exit status 0 of the run passes, anything else fails with the end of what it printed;
* the JSON it printed (``--json``) is kept verbatim, bounded, for the console and the API,
  checked only for being JSON.

A DCGM without mndiag is "not available" and does not fail the domain, unless the profile
requires it (``mndiag = "require"``). A ``dcgmi`` that is missing altogether fails (exit
status 127, judged like every other missing tool).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from provisioner.acceptance.model import Figure

TEST: Final = "dcgmi-mndiag"
KEEP_BYTES: Final = 256 * 1024  # the output kept in the result, from its start
_TAIL: Final = 300


@dataclass(frozen=True, slots=True)
class MndiagRun:
    """``available``: the probe (``dcgmi mndiag --help``) exited 0; ``version``: what
    ``dcgmi --version`` printed (for the reason only)."""

    rc: int
    stdout: str
    stderr: str = ""
    available: bool = True
    version: str = ""
    probe: str = ""


def judge_mndiag(run: MndiagRun, *, required: bool) -> Figure:
    """One figure: passed (exit status 0), failed (anything else, with the end of its
    output), or not available (this DCGM has no mndiag: a pass unless ``required``)."""
    if not run.available:
        # TCLAP writes "dcgmi  version: 4.2.3": the words after "version:", else all
        version = " ".join(run.version.rsplit("version:", 1)[-1].split()) or "(version unknown)"
        probe = _tail(run.probe)
        why = (f"not available: DCGM {version} has no mndiag (`dcgmi mndiag --help`: "
               f"{probe or 'no output'})")
        if required:
            return Figure(TEST, "run", "not available", "exit 0", False,
                          f"{why}; the profile requires it (mndiag = \"require\")")
        return Figure(TEST, "run", "not available", "-", True, why)
    if run.rc == 0:
        kept = report(run.stdout)
        shape = ("its JSON kept" if kept["valid_json"]
                 else "its output kept; it is not valid JSON")
        return Figure(TEST, "exit", "0", "0", True, f"mnubergemm passed; {shape}")
    return Figure(TEST, "exit", str(run.rc), "0", False,
                  f"dcgmi mndiag exited {run.rc}: "
                  f"{_tail(run.stderr + chr(10) + run.stdout) or 'no output'}")


def report(stdout: str) -> dict[str, Any]:
    """What the result keeps of the run: its output verbatim (the first ``KEEP_BYTES``),
    whether it is valid JSON (nothing else is read from it), and its size."""
    raw = stdout.encode("utf-8", "replace")
    try:
        json.loads(stdout)
        valid = True
    except ValueError:
        valid = False
    kept = raw[:KEEP_BYTES].decode("utf-8", "ignore")
    return {"output": kept, "valid_json": valid, "bytes": len(raw),
            "truncated": len(raw) > KEEP_BYTES}


def _tail(text: str) -> str:
    words = " ".join(text.split())
    return words if len(words) <= _TAIL else "..." + words[-_TAIL:]
