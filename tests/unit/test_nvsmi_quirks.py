"""Quirks of real nvidia-smi output: terminal escapes in ``topo -m``, the empty
``nvlink --status`` of a GPU without NVLink."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.topology.model import TopologyParseError
from provisioner.topology.parse_nvsmi_topo import parse_nvidia_smi_topo, parse_nvlink_status

TOPO = (Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "synthetic" /
        "topo-m-h100x8.txt").read_text()


@pytest.mark.parametrize(("start", "end"), [
    ("\x1b[4m", "\x1b[0m"),             # what nvidia-smi writes (the committed fixture)
    ("\x1b[1;4m", "\x1b(B\x1b[m"),      # bold+underline, ended the way tput sgr0 does
    ("\x1b]0;nvidia-smi\x07\x1b[4m", "\x1b[24m"),  # a terminal-title OSC first
], ids=["underline", "sgr0", "osc"])
def test_topo_header_escapes_are_stripped(start: str, end: str) -> None:
    clean = TOPO.replace("\x1b[4m", "").replace("\x1b[0m", "")
    header, _, rest = clean.partition("\n")
    matrix = parse_nvidia_smi_topo(f"{start}{header}{end}\n{rest}")
    assert matrix == parse_nvidia_smi_topo(clean)
    assert matrix.devices[:2] == ("GPU0", "GPU1") and matrix.kind("GPU0", "GPU1") == "NV18"


@pytest.mark.parametrize("empty", ["", "\n", "  \n\n"])
def test_empty_nvlink_status_means_no_links(empty: str) -> None:
    assert parse_nvlink_status(empty) == ()


def test_nvlink_status_junk_is_still_an_error() -> None:
    with pytest.raises(TopologyParseError, match="not an nvlink --status line"):
        parse_nvlink_status("NVML: Driver/library version mismatch\n")
