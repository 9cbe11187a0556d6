"""The per-node history budget (``RowBudget``), the TFTP listener's drop log (``DropLog``),
the body depth check and which datagrams a TFTP listening port may answer, on a clock the
test moves (test_attacks_bounds.py runs the attacks they stop against the real servers)."""

from __future__ import annotations

import logging
import struct

import pytest

from provisioner.boot.http import MAX_JSON_DEPTH, json_depth
from provisioner.boot.tftp_packets import answerable, error_packet
from provisioner.boot.tftp_service import DropLog
from provisioner.lifecycle.agent_binding import RefusalLog
from provisioner.lifecycle.row_budget import RowBudget, with_skipped


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_row_budget_allows_a_burst_then_counts_what_it_leaves_out(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rows = RowBudget(burst=3, rate_per_s=0.1, clock=clock)
    caplog.set_level(logging.DEBUG, logger="provisioner.lifecycle.row_budget")
    assert [rows.admit("n1", "booted") for _ in range(3)] == [0, 0, 0]
    assert [rows.admit("n1", "booted") for _ in range(200)] == [None] * 200
    assert rows.admit("n1", "installed") == 0  # another event: its own budget
    assert rows.admit("n2", "booted") == 0  # another node likewise
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "n1" in warnings[0].getMessage()
    clock.now += 10  # one row's worth
    assert rows.admit("n1", "booted") == 200
    assert rows.admit("n1", "booted") is None
    assert with_skipped("hostname 'x'", 200).endswith("(200 more since the last row, over "
                                                      "the history budget)")
    assert with_skipped("hostname 'x'", 0) == "hostname 'x'"


def test_a_loop_that_never_stops_adds_a_few_dozen_rows_a_day() -> None:
    """One call a second for a day: the burst, then rows ever further apart (12 s, 24 s...
    up to an hour), every call counted; after a quiet spell the burst again."""
    clock = Clock()
    rows = RowBudget(clock=clock)
    written, counted = 0, 0
    for _ in range(86_400):
        clock.now += 1
        left_out = rows.admit("n1", "callback_ignored")
        if left_out is not None:
            written, counted = written + 1, counted + 1 + left_out
    assert 5 < written <= 40, written
    pending = rows._buckets[("n1", "callback_ignored")][2]
    assert counted + pending == 86_400
    clock.now += 3 * 3600  # quiet: the burst again, the first row counting what was left
    assert [rows.admit("n1", "callback_ignored") for _ in range(5)] == [pending, 0, 0, 0, 0]


def test_refusals_that_go_on_get_rows_ever_further_apart() -> None:
    clock = Clock()
    refusals = RefusalLog(interval_s=10, max_interval_s=3600, clock=clock)
    rows = 0
    for _ in range(86_400):
        clock.now += 1
        rows += refusals.note("n1", "boot_refused", "10.0.0.66") is not None
    assert 5 < rows <= 40, rows
    clock.now += 3 * 3600
    assert refusals.note("n1", "boot_refused", "10.0.0.66") is not None
    clock.now += 11  # one more after the first interval: back to every 10 s
    assert refusals.note("n1", "boot_refused", "10.0.0.66") == 0


def test_row_budget_remembers_a_bounded_number_of_keys() -> None:
    rows = RowBudget(burst=1, rate_per_s=0.001, max_keys=10, clock=Clock())
    for n in range(1000):
        assert rows.admit(f"node-{n}", "booted") == 0
    assert len(rows._buckets) == 10


def test_drop_log_counts_every_drop_and_logs_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    drops = DropLog(interval_s=60, clock=clock)
    caplog.set_level(logging.WARNING, logger="provisioner.boot.tftp")
    packet = error_packet(0, "spoofed")
    for _ in range(1000):
        drops.note(packet, ("10.0.0.2", 69))
    clock.now += 61
    drops.note(packet, ("10.0.0.3", 69))
    lines = [r.getMessage() for r in caplog.records]
    assert drops.total == 1001 and len(lines) == 2
    assert lines[0].startswith("TFTP: dropped 1 datagram(s)")
    assert lines[1].startswith("TFTP: dropped 1000 datagram(s)") and "10.0.0.3:69" in lines[1]


@pytest.mark.parametrize(("data", "answered"), [
    (b"\x00\x01probe\x00octet\x00", True),  # RRQ
    (b"\x00\x02probe\x00octet\x00", True),  # WRQ: refused with an ERROR
    (b"\x00\x07junk", True),  # unknown: an ERROR (which no server answers)
    (struct.pack("!HH", 3, 1) + b"x", False),  # DATA
    (struct.pack("!HH", 4, 1), False),  # ACK
    (error_packet(5, "unknown transfer ID"), False),  # ERROR
    (b"\x00\x06blksize\x001468\x00", False),  # OACK
    (b"\x00", False), (b"", False),  # runts
])
def test_a_listening_port_answers_requests_only(data: bytes, answered: bool) -> None:
    assert answerable(data) is answered


def test_json_depth_without_recursion() -> None:
    deep: object = 1
    for _ in range(100_000):  # far past the recursion limit: counted in a loop
        deep = [deep]
    assert json_depth(deep) == MAX_JSON_DEPTH + 1  # stops counting past the limit
    assert json_depth({"a": [{"b": 1}], "c": "x"}) == 3
    assert json_depth("scalar") == 0
