"""docs/first-rack.md, run (issue 30, Proof): its ``sh`` blocks, exactly as written and in
order, in one bash (``set -euo pipefail``), against the wheel built from this checkout, and
each block's *output* (the ``text`` block after it) checked against what the block printed.

Substitutions, and only these: ``$WORK`` (a scratch dir) and ``$WHEEL`` (the built wheel) come
from the environment, pip installs from the cached wheelhouse (``PIP_NO_INDEX``,
``PIP_FIND_LINKS``: no network), and the API's ``127.0.0.1:8700`` becomes a free port. One
daemon, four nodes, fake drivers with a 0.05 s step: ~15 s after the wheel and the venv."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.wheel_support import ROOT, build_wheel, pip_env, wheelhouse
from tests.peers.ports import free_tcp_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DOC = ROOT / "docs" / "first-rack.md"
DOC_PORT = "127.0.0.1:8700"
MARK = "@@first-rack block "
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)


@dataclass(frozen=True)
class Block:
    line: int  # where it starts in the doc
    script: str
    expected: list[str]  # the *output* block's lines, or none


def doc_blocks(text: str) -> list[Block]:
    """The ``sh`` blocks, each with the ``text`` block that follows it under *output*."""
    blocks: list[Block] = []
    fences = list(FENCE.finditer(text))
    for index, fence in enumerate(fences):
        if fence.group(1) != "sh":
            continue
        expected: list[str] = []
        following = fences[index + 1] if index + 1 < len(fences) else None
        between = text[fence.end():following.start()] if following else ""
        if following and following.group(1) == "text" and between.strip() == "*output*":
            expected = following.group(2).splitlines()
        blocks.append(Block(text.count("\n", 0, fence.start()) + 1, fence.group(2), expected))
    return blocks


def _normal(line: str) -> str:
    return " ".join(line.split())


def matches(expected: list[str], printed: list[str]) -> str | None:
    """None when the expected lines appear in order among the printed ones (``…`` within a
    line matches anything, a line that is only ``…`` any number of lines); else what is
    missing."""
    lines = [_normal(line) for line in printed]
    at = 0
    for want in expected:
        if want.strip() == "…":
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in _normal(want).split("…"))
                             + r"\Z")
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def test_the_output_check_holds_the_doc_to_what_was_printed() -> None:
    printed = ["gpu-01: inspect accepted; state inspecting", "gpu-01:   active", "#7 x y z"]
    assert matches(["gpu-01: inspect accepted; state …", "…", "gpu-01: active"], printed) is None
    assert matches(["#… x … z"], printed) is None
    assert matches(["gpu-01: active", "gpu-01: inspect accepted; state …"], printed) == \
        "gpu-01: inspect accepted; state …"  # order counts
    assert matches(["gpu-01: retired"], printed) == "gpu-01: retired"
    assert matches(["gpu-01: act"], printed) == "gpu-01: act"  # whole lines


def test_the_doc_has_the_walkthrough_steps() -> None:
    """What the issue's Proof asks the walkthrough to show is in its commands."""
    scripts = "\n".join(block.script for block in doc_blocks(DOC.read_text()))
    for step in ('pip" install', "config check", "provisioner serve", "--dry-run",
                 "provisioner import", "provisioner events --since", "node replace",
                 "register-running"):
        assert step in scripts, step


def test_first_rack_walkthrough(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    work = tmp_path / "work"
    port = free_tcp_port()
    blocks = doc_blocks(DOC.read_text())
    script = ["set -euo pipefail"]
    for number, block in enumerate(blocks):
        script += [f"printf '\\n{MARK}%d\\n' {number}", block.script.replace(
            DOC_PORT, f"127.0.0.1:{port}")]
    env = {k: v for k, v in pip_env().items() if not k.startswith("PROVISIONER_")}
    # the doc's `python3` is this interpreter (the wheelhouse's wheels are built for it),
    # and nothing else of the test's virtualenv is on PATH: `provisioner` is the wheel's
    python = tmp_path / "python"
    python.mkdir()
    (python / "python3").symlink_to(sys.executable)
    path = [entry for entry in env.get("PATH", "").split(os.pathsep)
            if entry and not (Path(entry) / "provisioner").exists()]
    env.update(WORK=str(work), WHEEL=str(wheel), PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(wheelhouse()), HOME=str(tmp_path),
               PATH=os.pathsep.join([str(python), *path]))
    proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        # a serve the script left behind (it failed before `wait`) is in bash's process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    serve_log = work / "serve.log"
    context = (f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}\nserve.log:\n"
               + (serve_log.read_text()[-3000:] if serve_log.exists() else "(none)"))
    assert proc.returncode == 0, context
    printed = out.split(f"\n{MARK}")[1:]
    assert len(printed) == len(blocks), context
    for number, (block, text) in enumerate(zip(blocks, printed, strict=True)):
        head, _, body = text.partition("\n")
        assert head == str(number)
        missing = matches(block.expected, body.splitlines())
        assert missing is None, (f"docs/first-rack.md line {block.line}: no line "
                                 f"{missing!r} in what its block printed:\n{body}")
    assert "Traceback" not in err + serve_log.read_text()
