"""The in-band probe's evidence read under the daemon's cursor and bounds
(``provisioner.health.inband``), on real kernel logs and ibstat outputs
(tests/fixtures/health/README.md names their sources)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.errors import InvalidRequest
from provisioner.health import inband
from provisioner.health.inband import Cursor, parse, read
from provisioner.health.model import Action, HealthClass

HEALTH = Path(__file__).parents[1] / "fixtures" / "health"
BOOT, OTHER_BOOT = "0d5c1b3e-8a53-4b1c-9d8e-6a0c3f2e9b11", "7f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
OFF_BUS = (HEALTH / "nvsentinel-155-dmesg-fallen-off-bus.log").read_text().splitlines()
IBSTAT_DOWN = (HEALTH / "gpud-ibstat.47.0.h100.some.down.with.polling.1.txt").read_text()


def post(lines: list[str], boot: str = BOOT, **sections: str) -> inband.Evidence:
    return parse({"boot_id": boot, "kernel_log": lines, **sections})


def test_a_first_post_raises_what_the_ring_holds_and_sets_the_cursor() -> None:
    reading = read(post(OFF_BUS), Cursor())
    assert [(f.cls, f.action) for f in reading.events] == [(HealthClass.GPU_LOST,
                                                            Action.RESTART_OS)]
    assert "0000:b3:00.0" in reading.events[0].evidence  # the record's continuation lines
    assert (reading.cursor.boot_id, reading.cursor.after, reading.cursor.seen) == (
        BOOT, 1843.439669, 1)
    assert reading.lines_read == len(OFF_BUS) and reading.lines_skipped == 0


def test_a_line_is_never_read_twice_and_only_new_records_are() -> None:
    cursor = read(post(OFF_BUS), Cursor()).cursor
    again = read(post(OFF_BUS), Cursor.loads(cursor.dumps()))  # as stored between posts
    assert again.events == [] and again.lines_read == 0
    assert again.lines_skipped == len(OFF_BUS) and again.cursor == cursor
    xid = "[ 1900.000001] NVRM: Xid (PCI:0000:b3:00): 79, pid=7, GPU has fallen off the bus."
    later = read(post([*OFF_BUS, xid]), cursor)
    assert later.lines_read == 1 and later.cursor.after == 1900.000001
    assert [e.subject for e in later.events] == ["0000:b3:00 xid 79"]


def test_continuation_lines_stay_with_their_record() -> None:
    """The cursor on the record that names the GPU: its continuation lines (the "fallen
    off the bus" words) are skipped with it, never read as a new record."""
    reading = read(post(OFF_BUS), Cursor(BOOT, 1843.308145, (), 1))
    assert reading.events == [] and reading.lines_read == 2  # the two later records


def test_dmesg_t_stamps_of_one_second_lose_and_repeat_nothing() -> None:
    """``dmesg -T`` (one-second stamps): the GSP XID 119 excerpt has many records in one
    second; a post cut inside that second and the next post read each line once."""
    lines = (HEALTH / "gpud-dmesg-with-xid-119.log").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "Xid (PCI:0000:9b:00): 119" in line)
    first = read(post(lines[:cut]), Cursor())
    assert first.events == [] and first.cursor.seen > 1  # records of that second read
    rest = read(post(lines), Cursor.loads(first.cursor.dumps()))
    assert rest.lines_read == len(lines) - cut and rest.lines_skipped == cut
    assert [(f.cls, f.action) for f in rest.events] == [(HealthClass.GPU, Action.RESET_GPU)]
    assert read(post(lines), rest.cursor).lines_read == 0


def test_a_syslog_kern_log_is_stamped_by_its_kernel_stamps() -> None:
    lines = (HEALTH / "ubuntu-forum-syslog-xid79.log").read_text().splitlines()
    first = read(post(lines[:1]), Cursor())
    assert first.events == [] and first.cursor.after == 8659.726052
    rest = read(post(lines), first.cursor)
    assert rest.lines_skipped == 1
    assert (rest.cursor.after, rest.cursor.seen) == (8659.726078, 3)
    assert [(f.cls, f.action) for f in rest.events] == [(HealthClass.GPU_LOST,
                                                         Action.RESTART_OS)]


def test_a_log_without_stamps_is_read_once_per_boot() -> None:
    lines = (HEALTH / "ml-engineering-xid63.log").read_text().splitlines()
    first = read(post(lines), Cursor())
    assert len(first.events) == 1 and first.cursor.after == 0.0
    assert read(post(lines), first.cursor).events == []


def test_a_new_boot_reads_its_ring_from_the_start() -> None:
    cursor = read(post(OFF_BUS), Cursor()).cursor
    rebooted = read(post(OFF_BUS, boot=OTHER_BOOT), cursor)
    assert len(rebooted.events) == 1 and rebooted.cursor.boot_id == OTHER_BOOT


def test_stamps_that_go_back_are_skipped_and_never_move_the_cursor_back() -> None:
    cursor = Cursor(BOOT, 5000.0)
    reading = read(post(OFF_BUS), cursor)
    assert reading.events == [] and reading.cursor.after == 5000.0


def test_the_cursor_survives_storage_and_a_bad_one_starts_over() -> None:
    cursor = Cursor(BOOT, 12.5, (("infiniband", "mlx5_1/1"),), 3, "ab" * 16)
    assert Cursor.loads(cursor.dumps()) == cursor
    for junk in (None, "", "not json", "[1, 2]", '{"after": "x"}', '{"states": [1]}'):
        assert Cursor.loads(junk) == Cursor()


def test_states_are_read_and_keyed_in_the_cursor() -> None:
    reading = read(post([], ibstat=IBSTAT_DOWN), Cursor())
    assert reading.states and {f.cls for f in reading.states} == {HealthClass.INFINIBAND}
    assert reading.cursor.states == tuple(sorted((str(f.cls), f.subject)
                                                 for f in reading.states))


def test_a_section_that_does_not_parse_hides_nothing_else() -> None:
    reading = read(post(OFF_BUS, ibstat="CA 'mlx5_0'\nnot ibstat at all\n",
                        nvidia_smi=(HEALTH / "ml-engineering-nvsmi-q-a100-remap-pending.txt"
                                    ).read_text()), Cursor())
    assert len(reading.events) == 1 and "not an ibstat line" in reading.errors["ibstat"]
    assert [(f.cls, f.action) for f in reading.states] == [(HealthClass.GPU_MEMORY,
                                                            Action.RESET_GPU)]


def test_bounds_lines_and_line_length() -> None:
    lines = [f"[{i:>6}.000000] line {i}" for i in range(inband.MAX_LINES + 500)]
    lines[0] += "x" * 10_000
    evidence = post(lines)
    assert len(evidence.kernel_log) == inband.MAX_LINES
    assert max(len(line) for line in evidence.kernel_log) == inband.MAX_LINE_CHARS
    assert evidence.dropped == 500 + 1
    reading = read(evidence, Cursor())
    assert reading.cursor.after == inband.MAX_LINES - 1  # the rest comes next post


def test_bounds_sections_and_findings() -> None:
    too_big = "x" * (inband.MAX_SECTION_CHARS + 1)
    assert post([], nvidia_smi=too_big).sections == {}
    many = [f"[{i}.5] NVRM: Xid (PCI:0000:{i:02x}:00): 79, pid=1, GPU has fallen off the bus."
            for i in range(100)]
    reading = read(post(many), Cursor())
    assert len(reading.events) == inband.MAX_FINDINGS
    assert reading.dropped == 100 - inband.MAX_FINDINGS


@pytest.mark.parametrize("body", [
    [], "text", {"kernel_log": []}, {"boot_id": "../../etc"}, {"boot_id": "x" * 65},
    {"boot_id": BOOT, "kernel_log": "one string"}, {"boot_id": BOOT, "kernel_log": [1]},
    {"boot_id": BOOT, "node": "someone-else"}, {"boot_id": BOOT, "ibstat": ["a"]},
])
def test_malformed_posts_are_refused(body: object) -> None:
    with pytest.raises(InvalidRequest):
        parse(body)


def test_the_same_outputs_are_not_read_again() -> None:
    ibstat = IBSTAT_DOWN
    first = read(post([], ibstat=ibstat), Cursor())
    same = read(post([], ibstat=ibstat), first.cursor)
    assert same.unchanged and same.states == [] and same.cursor == first.cursor
    changed = read(post([], ibstat=(HEALTH / "gpud-ibstat.47.0.h100.some.down.1.txt"
                                    ).read_text()), first.cursor)
    assert not changed.unchanged and changed.states == [] and changed.cursor.states == ()
    rebooted = read(post([], boot=OTHER_BOOT, ibstat=ibstat), first.cursor)
    assert not rebooted.unchanged and rebooted.states


def test_the_real_probe_posts_of_a_healthy_h200_raise_nothing_and_are_read_once() -> None:
    """The bodies the shipped probe posted on a real H200 (its dmesg ring and nvidia-smi's
    ECC/remapper section), read in order with the cursor the daemon answered."""
    first_body, second_body = (json.loads((HEALTH / f"h200-580.159.04-probe-post-{n}.json")
                                          .read_text()) for n in (1, 2))
    first = read(parse(first_body), Cursor())
    assert first.events == [] and first.states == []
    assert first.lines_read == len(first_body["kernel_log"]) == 358
    assert first.cursor.after == 3.678986  # the ring's last stamp
    second = read(parse(second_body), first.cursor)
    assert second.events == [] and second.lines_read == 0
    assert second.unchanged  # the same nvidia-smi section: not parsed again
