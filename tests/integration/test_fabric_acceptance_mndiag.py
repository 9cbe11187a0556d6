"""``dcgmi mndiag`` in fabric acceptance end to end (GB200/GB300 NVL72): the same SSH nodes,
conductor, playbook and launcher as tests/integration/test_fabric_acceptance.py, with a
``dcgmi`` double that also answers ``--version`` and ``mndiag``.

- A failed mndiag (exit 1) holds the domain with the end of its output as the reason; it ran
  once, on the domain's first node, over every node's host engine; after the "repair" (exit
  0) a rerun releases the domain to ``active``, with the JSON kept verbatim in the result.
- A DCGM without mndiag, on a profile that requires it, holds the domain "not available".

``DCGMI`` is a stand-in, not a capture: no real ``dcgmi mndiag`` output is public. Its
``diag`` prints the recorded real document (``DCGM`` of the other e2e), its ``mndiag
--help`` exits 0 and a dcgmi without mndiag answers ``ERROR: Invalid subsystem.`` with exit
status 254, as NVIDIA/DCGM ``dcgmi/CommandLineParser.cpp`` does; ``--version`` prints the
line TCLAP writes; what ``mndiag`` prints is ``MNDIAG_JSON``, made up here (the judge only
checks that it is JSON).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from provisioner.acceptance.domain import DOMAIN
from provisioner.api.acceptance import acceptance_out
from provisioner.config import AcceptanceProfile, ValidationProfile, ValidationSettings
from provisioner.lifecycle.states import Event, NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from tests.integration.ansible_support import short_dir
from tests.integration.test_fabric_acceptance import (
    CLIQUE,
    DCGM,
    domain,
    enrol,
    put,
    rig,
    settle,
)
from tests.peers.debootstrap import debootstrap_unavailable_reason
from tests.peers.sshd import SshNode

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]
S = NodeState
DCGMI = """#!/bin/sh
# A stand-in for dcgmi (not a capture: no real `dcgmi mndiag` output is public).
d=/opt/doubles
case "$1" in
  --version) printf '\\ndcgmi  version: %s\\n\\n' "$(cat $d/dcgmi.version)" ;;
  mndiag)
    if [ ! -f $d/dcgmi.mndiag.rc ]; then  # a DCGM before 4.3: no such subsystem
      printf 'ERROR: Invalid subsystem.\\n\\nUsage: dcgmi\\n'; exit 254
    fi
    if [ "$2" = --help ]; then
      echo 'mndiag -- Used to run multi-node diagnostics across a cluster of nodes.'; exit 0
    fi
    printf '%s\\n' "$@" > $d/dcgmi.mndiag.args
    cat $d/dcgmi.mndiag.out; echo 'mnubergemm: stand-in stderr line' >&2
    exit "$(cat $d/dcgmi.mndiag.rc)" ;;
  *) cat $d/dcgmi.out ;;
esac
"""
# Made up (see the module docstring): any JSON document does, the judge reads none of it.
MNDIAG_JSON = json.dumps({"stand-in": "not a dcgmi mndiag capture", "test": "mnubergemm"},
                         indent=2) + "\n"


def doubles(version: str, mndiag_rc: int | None) -> dict[str, tuple[str, int]]:
    """``mndiag_rc`` None: a DCGM without mndiag."""
    files = {"/usr/local/bin/dcgmi": (DCGMI, 0o755), "/opt/doubles/dcgmi.out": (DCGM, 0o644),
             "/opt/doubles/dcgmi.version": (version + "\n", 0o644),
             "/opt/doubles/dcgmi.mndiag.out": (MNDIAG_JSON, 0o644)}
    if mndiag_rc is not None:
        files["/opt/doubles/dcgmi.mndiag.rc"] = (f"{mndiag_rc}\n", 0o644)
    return files


def settings(**acceptance: Any) -> ValidationSettings:
    values: dict[str, Any] = {"fabric_class": "gb200-nvl72", "tests": ["dcgm"],
                              "gpus_per_node": 4, "test_deadline_s": 60}
    values.update(acceptance)
    return ValidationSettings(profiles={"nvl": ValidationProfile(
        gpu_count=4, nvlink_domain=True, nvlink_domain_nodes=2,
        acceptance=AcceptanceProfile(**values))}, domain_poll_interval_s=0.2)


@pytest.fixture(autouse=True)
def _target() -> None:
    if (reason := debootstrap_unavailable_reason()) is not None:
        pytest.skip(reason)


async def test_a_failed_mndiag_holds_the_domain_until_it_passes(
        store: Store, world: SimWorld, make_node: Any) -> None:
    with domain_of(2, "4.3.0", 1) as (work, nodes):
        r = rig(store, world, work, nodes[0], settings())
        ids = await enrol(store, make_node, nodes)
        await r.conductor.recover()
        held = await settle(store, ids, {S.VALIDATE_FAILED, S.ACTIVE})
        for node in held.values():
            assert node.state is S.VALIDATE_FAILED, node.last_error
            assert "(domain): dcgmi-mndiag exit 1 (floor 0): dcgmi mndiag exited 1: " \
                   "mnubergemm: stand-in stderr line" in node.last_error, node.last_error
        args = nodes[0].run("cat", "/opt/doubles/dcgmi.mndiag.args").stdout.split("\n")
        hosts = ";".join(n.namespace for n in nodes)
        assert args[:6] == ["mndiag", "--hostList", hosts, "--run", "mnubergemm", "--json"]
        other = nodes[1].run("test", "-e", "/opt/doubles/dcgmi.mndiag.args")
        assert other.returncode == 1, "mndiag ran on a node other than the head"

        put(nodes[0], "/opt/doubles/dcgmi.mndiag.rc", "0\n")  # the domain is repaired

        async def retry(node_id: str) -> object:
            return await r.conductor.fire(node_id, Event.RETRY, actor="test")
        await r.acceptance.rerun(CLIQUE, retry)
        done = await settle(store, ids, {S.ACTIVE, S.VALIDATE_FAILED})
        assert all(n.state is S.ACTIVE for n in done.values()), done
        run = await r.acceptance.latest(CLIQUE)
        assert run is not None and run.status == "passed"
        shown = acceptance_out(run)
        (figure,) = [f for n in shown.results if n.node == DOMAIN for f in n.figures]
        assert (figure.test, figure.value, figure.passed) == ("dcgmi-mndiag", "0", True)
        kept = shown.reports["mndiag"]
        assert kept.output == MNDIAG_JSON and kept.valid_json and not kept.truncated
        await stop(r)


async def test_a_required_mndiag_fails_where_dcgm_has_none(
        store: Store, world: SimWorld, make_node: Any) -> None:
    with domain_of(2, "4.2.3", None) as (work, nodes):
        r = rig(store, world, work, nodes[0], settings(mndiag="require"))
        ids = await enrol(store, make_node, nodes)
        await r.conductor.recover()
        held = await settle(store, ids, {S.VALIDATE_FAILED, S.ACTIVE})
        assert all(n.state is S.VALIDATE_FAILED for n in held.values()), held
        run = await r.acceptance.latest(CLIQUE)
        assert run is not None and run.status == "failed"
        (figure,) = [f for n in run.result["nodes"] if n["node"] == DOMAIN
                     for f in n["figures"]]
        assert figure["value"] == "not available" and not figure["passed"]
        assert figure["reason"].startswith(
            "not available: DCGM 4.2.3 has no mndiag (`dcgmi mndiag --help`: ERROR: Invalid "
            "subsystem."), figure["reason"]
        assert all(f["passed"] for n in run.result["nodes"] if n["node"] != DOMAIN
                   for f in n["figures"])  # dcgmi diag itself passed on every node
        await stop(r)


@contextmanager
def domain_of(count: int, version: str, mndiag_rc: int | None
              ) -> Iterator[tuple[Path, list[SshNode]]]:
    with short_dir() as work, domain(work, [doubles(version, mndiag_rc)] * count) as nodes:
        yield work, nodes


async def stop(r: Any) -> None:
    await r.conductor.stop()
    await r.acceptance.aclose()
    r.pool.shutdown()
