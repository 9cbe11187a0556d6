"""The maintenance reservation of an active domain's acceptance (issue 26): scontrol's
one-line ``show reservation`` as Slurm 22.05.8 printed it (tests/fixtures/slurm), and the
reservation's name."""

from __future__ import annotations

from pathlib import Path

from provisioner.lifecycle.acceptance_active import reservation_name
from provisioner.slurm.reservation import reservation_from_scontrol

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
           / "scontrol-22.05.8-show-reservation-maint.txt")
CLIQUE = "7f3c2a10-5b4e-4d6a-9c1e-2b8f0e6d4a91.1"


def test_a_recorded_maintenance_reservation_is_read() -> None:
    found = reservation_from_scontrol(FIXTURE.read_text())
    assert found is not None
    assert found.name == f"provisioner-acceptance-{CLIQUE}"
    assert found.nodes == "gpu-[01-02]"
    assert found.flags == {"MAINT", "IGNORE_JOBS", "SPEC_NODES"}
    assert found.state == "ACTIVE"


def test_an_answer_without_a_reservation_is_none() -> None:
    assert reservation_from_scontrol("") is None
    assert reservation_from_scontrol("No reservations in the system\n") is None


def test_the_name_keeps_a_clique_and_replaces_what_slurm_would_not_take() -> None:
    assert reservation_name(CLIQUE) == f"provisioner-acceptance-{CLIQUE}"
    assert reservation_name("gpu 01/x") == "provisioner-acceptance-gpu-01-x"
    assert len(reservation_name("n" * 200)) == len("provisioner-acceptance-") + 64
