"""The NVLink domain gate and the validation record (pure)."""

from __future__ import annotations

from pathlib import Path

from provisioner.validation.domain import Member, Standing, domain_status
from provisioner.validation.record import NODE_CHECKED, ValidationRecord, passed_now

C = "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.1"
ME = Member("n1", "gpu-01", C, Standing.PASSED)


def test_complete_only_when_nobody_is_pending_or_failed() -> None:
    others = [Member("n2", "gpu-02", C, Standing.PASSED),
              Member("n9", "gpu-09", "other.2", Standing.FAILED, "gpu-count")]
    status = domain_status(C, ME, others, None)
    assert status.complete and status.passed == ("gpu-01", "gpu-02")


def test_a_stale_snapshot_of_myself_does_not_hold_me() -> None:
    stale = [Member("n1", "gpu-01", C, Standing.PENDING)]
    assert domain_status(C, ME, stale, None).complete


def test_waiting_and_held_lines() -> None:
    others = [Member("n2", "gpu-02", C, Standing.PENDING),
              Member("n3", "gpu-03", C, Standing.FAILED, "gpu-count: saw 7 GPUs, expected 8")]
    status = domain_status(C, ME, others, 4)
    assert not status.complete
    assert status.waiting() == (f"NVLink domain {C}: 1 of 4 nodes passed; waiting for gpu-02 "
                                "still validating, gpu-03 failed validation, 1 node(s) not "
                                "yet seen")
    assert status.held() == [f"NVLink domain {C} held: gpu-03 failed validation: gpu-count: "
                             "saw 7 GPUs, expected 8"]


def test_expected_count_holds_an_incomplete_domain() -> None:
    others = [Member(f"n{i}", f"gpu-{i:02d}", C, Standing.PASSED) for i in range(2, 18)]
    assert not domain_status(C, ME, others, 18).complete  # 17 of 18
    others.append(Member("n18", "gpu-18", C, Standing.PASSED))
    assert domain_status(C, ME, others, 18).complete


def test_long_lists_are_cut() -> None:
    others = [Member(f"n{i}", f"gpu-{i:02d}", C, Standing.PENDING) for i in range(2, 20)]
    line = domain_status(C, ME, others, None).waiting()
    assert "gpu-02, gpu-03" in line and "and 10 more still validating" in line


def test_record_round_trip_and_malformed_records() -> None:
    record = ValidationRecord(passed=False, at="2026-01-01T00:00:00+00:00",
                              failures=("gpu-count: saw 7 GPUs, expected 8",), clique=C,
                              domain_nodes=18, checks=("gpus",))
    assert ValidationRecord.from_facts({"validation": record.to_facts()}) == record
    assert record.reason == "gpu-count: saw 7 GPUs, expected 8"
    for bad in (None, "yes", {"passed": "true"}, {}):
        assert ValidationRecord.from_facts({"validation": bad}) is None
    odd = ValidationRecord.from_facts({"validation": {"passed": True, "clique": "",
                                                      "domain_nodes": True}})
    assert odd is not None and odd.clique is None and odd.domain_nodes is None


def test_passed_now_ignores_a_record_from_an_earlier_provisioning() -> None:
    facts = {"validation": {"passed": True, "at": "x"}}
    assert passed_now("active", facts, ())
    assert passed_now("registering", facts, ())
    assert passed_now("validating", facts, ("run:1", NODE_CHECKED))
    assert not passed_now("validating", facts, ("run:1",))  # this run has not checked yet
    assert not passed_now("joining", facts, ())  # being provisioned again
    assert not passed_now("active", {"validation": {"passed": False}}, ())
    assert not passed_now("active", {}, ())


def test_validation_modules_are_pure() -> None:
    """Standard library, provisioner.errors, the topology parsers and the GPU ID table
    only (DESIGN §3)."""
    import sys

    import provisioner.validation
    from tests.unit.test_topology_purity import BLOCKING, imports

    # gpu_ids: the device ID table, standard library only (it runs in the ramdisk)
    allowed = ("provisioner.errors", "provisioner.topology", "provisioner.validation",
               "provisioner.agent.gpu_ids")
    package = Path(provisioner.validation.__file__).parent
    for path in sorted(package.glob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            if name == "__future__" or top in sys.stdlib_module_names:
                assert top not in BLOCKING, f"{path.name} imports {name}"
                continue
            assert name.startswith(allowed), f"{path.name} imports {name}"
