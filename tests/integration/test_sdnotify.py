from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from provisioner.sdnotify import SystemdNotifier, watchdog_interval_s


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "n.sock")
    sock.bind(path)
    sock.settimeout(2)
    yield sock, path
    sock.close()


@pytest.mark.parametrize(
    ("send", "expected"),
    [
        (lambda n: n.ready(), b"READY=1"),
        (lambda n: n.ready("serving 3 nodes"), b"READY=1\nSTATUS=serving 3 nodes"),
        (lambda n: n.stopping(), b"STOPPING=1"),
        (lambda n: n.watchdog(), b"WATCHDOG=1"),
        (lambda n: n.status("two\nlines"), b"STATUS=two lines"),
        (lambda n: n.notify("EXTEND_TIMEOUT_USEC=5000000"), b"EXTEND_TIMEOUT_USEC=5000000"),
    ],
    ids=["ready", "ready-status", "stopping", "watchdog", "status-one-line", "raw"],
)
def test_sends_exact_datagram(
    receiver: tuple[socket.socket, str],
    send: Callable[[SystemdNotifier], bool],
    expected: bytes,
) -> None:
    sock, path = receiver
    notifier = SystemdNotifier(path)
    assert send(notifier) is True
    assert sock.recv(4096) == expected
    notifier.close()


def test_defaults_to_notify_socket_env(
    receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert SystemdNotifier().ready() is True
    assert sock.recv(4096) == b"READY=1"


def test_abstract_socket() -> None:
    name = f"provisioner-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        assert SystemdNotifier("@" + name).watchdog() is True
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_no_socket_is_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = SystemdNotifier()
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.notify("WATCHDOG=1") is False


def test_send_failure_is_swallowed_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SystemdNotifier(str(tmp_path / "absent.sock"))
    with caplog.at_level(logging.WARNING, logger="provisioner.sdnotify"):
        assert notifier.ready() is False
        assert notifier.watchdog() is False
    assert len(caplog.records) == 1
    assert "sd_notify" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, None),
    ],
    ids=["unset", "usec", "pid-match", "pid-mismatch", "zero", "garbage", "garbage-pid"],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval_s(env) == expected


def test_watchdog_interval_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval_s() == 0.5
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert watchdog_interval_s() is None
