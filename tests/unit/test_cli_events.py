"""What ``provisioner events`` prints and ``--wait`` waits for, and the journald fields of a
node's log lines (sent to a datagram socket as journald's would receive them)."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.cli import client
from provisioner.cli.events import _line
from provisioner.lifecycle.states import IN_FLIGHT
from provisioner.log import (
    JournalHandler,
    NodeNames,
    journal_datagram,
    node_fields,
    node_name,
)


def test_the_cli_waits_while_the_lifecycle_is_in_flight() -> None:
    assert {str(state) for state in IN_FLIGHT} == client.IN_FLIGHT


def test_one_line_per_transition_and_no_forged_second_line() -> None:
    event = {"transition": 57, "at": "2026-11-27T13:21:41.123+00:00", "hostname": "gpu-00",
             "id": "3f2a", "before": "enrolled", "state": "inspecting", "event": "inspect",
             "actor": "policy", "reason": "auto_inspect", "instance": "d0"}
    assert _line(event, as_json=False) == ("#57 2026-11-27T13:21:41 gpu-00 (3f2a) enrolled "
                                           "--inspect--> inspecting by policy: auto_inspect "
                                           "[d0]")
    note = event | {"before": "active", "state": "active", "event": "maintenance_on",
                    "reason": "line one\n#58 forged", "instance": None}
    text = _line(note, as_json=False)
    assert "\n" not in text and text.endswith("maintenance_on (active) by policy: "
                                              "line one\\n#58 forged")


def _parse(datagram: bytes) -> dict[str, str]:
    """journald's native protocol, read back (``KEY=value`` or the binary form)."""
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line, sep, after = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            rest = after
            continue
        (size,) = struct.unpack("<Q", after[:8])
        fields[line.decode()] = after[8:8 + size].decode()
        assert after[8 + size:9 + size] == b"\n"
        rest = after[9 + size:]
    return fields


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "journal.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_a_node_line_carries_node_state_and_event(journal: socket.socket,
                                                  tmp_path: Path) -> None:
    fallback = logging.StreamHandler()
    handler = JournalHandler(str(tmp_path / "journal.sock"), fallback)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("provisioner.test_journal")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        name = node_name("3f2a", "gpu-00")
        logger.error("node %s: %s --%s--> %s", name, "deploying", "fail", "deploy_failed",
                     extra=node_fields("3f2a", "gpu-00", "deploy_failed", "fail"))
        logger.info("two\nlines")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        handler.close()
    first, second = _parse(journal.recv(65536)), _parse(journal.recv(65536))
    assert first == {"MESSAGE": "node gpu-00 (3f2a): deploying --fail--> deploy_failed",
                     "PRIORITY": "3", "SYSLOG_IDENTIFIER": "provisioner",
                     "LOGGER": "provisioner.test_journal", "NODE": "gpu-00",
                     "NODE_ID": "3f2a", "STATE": "deploy_failed", "EVENT": "fail"}
    assert second["MESSAGE"] == "two\nlines" and "NODE" not in second
    assert journal_datagram({"A": "x\ny"}) == b"A\n" + struct.pack("<Q", 3) + b"x\ny\n"


def test_a_node_without_a_hostname_is_named_by_its_id() -> None:
    assert node_name("3f2a", None) == "3f2a"
    assert node_fields("3f2a", None, "enrolled")["journal"] == {
        "NODE": "3f2a", "NODE_ID": "3f2a", "STATE": "enrolled"}


def test_a_refused_datagram_goes_to_stderr(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    fallback = logging.StreamHandler(sys.stderr)
    fallback.setFormatter(logging.Formatter("fallback: %(message)s"))
    handler = JournalHandler(str(tmp_path / "absent.sock"), fallback)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    handler.emit(record)
    handler.close()
    assert capsys.readouterr().err == "fallback: hello world\n"


def test_node_lines_of_other_modules_name_the_hostname(journal: socket.socket,
                                                       tmp_path: Path) -> None:
    names = NodeNames(max_nodes=2)
    names.remember("id-1", "gpu-01")
    names.remember("id-2", None)  # no hostname yet: the id stays
    handler = JournalHandler(str(tmp_path / "journal.sock"), logging.StreamHandler())
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(names)
    logger = logging.getLogger("provisioner.boot.test_names")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("node %s: served %s to %s", "id-1", "inspection", "52:54:00:00:00:01")
        logger.info("node %s: served local boot", "id-2")
        names.remember("id-3", "gpu-03")
        names.remember("id-4", "gpu-04")  # over max_nodes: id-1 is forgotten
        logger.info("node %s: again", "id-1")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        handler.close()
    first, second, third = (_parse(journal.recv(65536)) for _ in range(3))
    assert first["MESSAGE"] == "node gpu-01 (id-1): served inspection to 52:54:00:00:00:01"
    assert (first["NODE"], first["NODE_ID"]) == ("gpu-01", "id-1")
    assert second["MESSAGE"] == "node id-2: served local boot" and "NODE" not in second
    assert third["MESSAGE"] == "node id-1: again"
