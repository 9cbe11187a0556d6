"""``--profile``/``--py-spy`` for the benches: py-spy sampling a daemon into collapsed stacks
(``--format raw``, one ``frame;frame;... count`` a line; ``bench/profile_top.py`` reads them),
in a process of its own, so a daemon's CPU figure stays its own."""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser, profile_help: str) -> None:
    parser.add_argument("--profile", type=Path, help=profile_help)
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy binary (--profile)")


def py_spy(args: argparse.Namespace) -> str | None:
    """The py-spy binary when ``--profile`` is given (it must be there), else None."""
    if args.profile is None:
        return None
    spy = shutil.which(args.py_spy)
    if spy is None:
        raise SystemExit(f"bench: --profile needs py-spy ({args.py_spy!r} not found)")
    return spy


def start(spy: str, pid: int, output: Path, *, rate: int,
          gil: bool = False) -> subprocess.Popen[bytes]:
    """Sample ``pid`` (every thread on CPU, or only the one holding the GIL) into ``output``."""
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", str(rate), *(["--gil"] if gil else []),
         "--format", "raw", "--output", str(output), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(samplers: Iterable[subprocess.Popen[bytes] | None]) -> None:
    """Stop the samplers; each writes its file then (py-spy writes on SIGINT)."""
    running = [s for s in samplers if s is not None]
    for sampler in running:
        sampler.send_signal(signal.SIGINT)
    for sampler in running:
        sampler.wait(60)
