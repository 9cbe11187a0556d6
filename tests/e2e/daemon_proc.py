"""Run ``provisioner serve`` as a subprocess: config file, free port, readiness, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from tests.peers.ports import free_tcp_port


def free_port() -> int:
    return free_tcp_port()


def write_config(path: Path, state_dir: Path, port: int, extra: str = "") -> Path:
    path.write_text(f'state_dir = "{state_dir}"\n[api]\nlisten = "127.0.0.1:{port}"\n{extra}')
    return path


class DaemonProcess:
    def __init__(self, config: Path, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTHONASYNCIODEBUG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "provisioner", "--config", str(self.config), "serve"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, port: int, timeout_s: float = 30.0, poll_s: float = 0.1) -> None:
        """Until ``/healthz`` answers: the API is up; the daemon may still be resuming
        its nodes (it logs ``ready`` once it has)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}: "
                                     f"{self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(poll_s)
        raise AssertionError("daemon not ready in time")

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; return the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close()
        return self.proc.returncode

    def tail(self, chars: int = 4000) -> str:
        """The end of the daemon's log, for an assertion's message."""
        return f"--- {self.log_path.name}:\n{self.log_path.read_text()[-chars:]}"

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
