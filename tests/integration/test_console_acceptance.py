"""Fabric acceptance in the console (issue 26) over HTTP against the real app and a SQLite
store: the fabric page says per domain whether its last acceptance passed, failed (held by a
Slurm maintenance reservation) or never ran; the domain page lists each test's figure
against its floor with the slowest node named, and its re-run form goes through the
console's own-origin, CSRF and role checks, then ``DomainAcceptance.rerun`` (the held nodes
of a domain still validating are retried through the conductor).

The runs are the judge's verdicts on recorded real outputs (tests/fixtures/acceptance: the
Azure ND H200 v5 all-reduce; the slow node's copy has its bus bandwidth lowered below
hgx-h200's floor), stored as the daemon stores them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from provisioner.acceptance.classes import fabric_class
from provisioner.acceptance.domain import DOMAIN, ToolRun, judge_domain
from provisioner.config import AcceptanceProfile, ValidationProfile, ValidationSettings
from provisioner.domain import Node, Role
from provisioner.lifecycle.acceptance import DomainAcceptance
from provisioner.lifecycle.acceptance_active import reservation_name, reservation_result
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.validation.record import ValidationRecord
from tests.integration.test_api import Api, running_api
from tests.integration.test_console import CLIQUE, Browser, Elements, nvl_domain

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "acceptance"
NCCL = (FIXTURES / "nccl-all_reduce.h200x8.azure-ndv5.nccl-2.19.3.txt").read_text()
SLOW_NCCL = (NCCL.replace("476.96", "301.12").replace("476.98", "301.14")
             .replace("476.967", "301.130"))  # below hgx-h200's 431 GB/s floor
PASSED_CLIQUE = "9a9a9a9a-0000-1111-2222-333344445555.7"
HELD_CLIQUE = "7b7b7b7b-0000-1111-2222-333344445555.3"
NEVER_CLIQUE = "6c6c6c6c-0000-1111-2222-333344445555.2"
VALIDATION = ValidationSettings(profiles={"nvl": ValidationProfile(
    nvlink_domain=True, acceptance=AcceptanceProfile(fabric_class="hgx-h200", tests=["nccl"],
                                                     nccl_scope="node"))})


class NotLaunched:
    def budget_s(self, profile: AcceptanceProfile) -> float:
        return 60.0

    async def launch(self, run_id: str, domain: str, nodes: Sequence[Node],
                     profile: AcceptanceProfile, class_gpus: int | None) -> list[ToolRun]:
        raise AssertionError(f"the console test launches nothing ({domain})")


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    acceptance = DomainAcceptance(store.nodes, store.acceptance, NotLaunched(), VALIDATION)
    try:
        async with running_api(aiohttp_client, store, world, acceptance=acceptance) as started:
            yield started
    finally:
        await acceptance.aclose()


async def active_domain(store: Store, make_node: Any, clique: str, prefix: str) -> list[Node]:
    nodes = []
    for i in range(2):
        node = await make_node(NodeState.ACTIVE, profile="nvl", hostname=f"{prefix}-{i}")
        record = ValidationRecord(passed=True, at="2026-11-01T00:00:00+00:00", clique=clique,
                                  domain_nodes=2)
        await store.nodes.merge_facts(node.id, {"validation": record.to_facts()})
        nodes.append(node)
    return nodes


# A stand-in for dcgmi mndiag's --json (not a capture: none is public), with markup that
# the page must show as text.
MNDIAG = '{"stand-in": "<not a capture>"}'


async def judged(store: Store, domain: str, nodes: Sequence[Node], slow: set[str], *,
                 held: bool, mndiag: str | None = None) -> None:
    """One finished run of ``domain`` as ``DomainAcceptance`` stores it (with a domain-wide
    ``dcgmi mndiag`` that exited 0 and printed ``mndiag``, when given)."""
    cls = fabric_class("hgx-h200")
    assert cls is not None
    names = [n.hostname or n.id for n in nodes]
    expected: dict[str, list[str]] = {n: ["nccl"] for n in names}
    runs = [ToolRun(n, "nccl", 0, SLOW_NCCL if n in slow else NCCL) for n in names]
    if mndiag is not None:
        expected[DOMAIN] = ["mndiag"]
        runs.append(ToolRun(DOMAIN, "mndiag", 0, mndiag))
    verdict = judge_domain(domain, cls, names, expected, runs)
    run = await store.acceptance.start(
        uuid.uuid4().hex, domain, cls.name, [(n.id, n.hostname or n.id) for n in nodes],
        deadline_at=datetime.now(UTC) + timedelta(hours=1),
        requested_by=f"ops (reservation {reservation_name(domain)})", instance=None)
    await store.acceptance.finish(
        run.id, "passed" if verdict.passed else "failed", summary=verdict.summary(),
        slowest=verdict.slowest,
        result=verdict.to_json() | reservation_result(reservation_name(domain), held))


async def test_fabric_page_shows_passed_held_and_never_run_domains(
        api: Api, store: Store, make_node: Any) -> None:
    good = await active_domain(store, make_node, PASSED_CLIQUE, "good")
    await judged(store, PASSED_CLIQUE, good, set(), held=False)
    bad = await active_domain(store, make_node, HELD_CLIQUE, "bad")
    await judged(store, HELD_CLIQUE, bad, {"bad-1"}, held=True, mndiag=MNDIAG)
    await active_domain(store, make_node, NEVER_CLIQUE, "new")
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, text = await browser.get("/ui/fabric")
    assert status == 200
    page = Elements(text)
    lines = {a["data-acceptance"]: a for a in page.find("p") if "data-acceptance" in a}
    assert set(lines) == {"passed", "failed", "never"}
    assert lines["failed"].get("data-held") == "yes" and "data-held" not in lines["passed"]
    body = " ".join(" ".join(page.text).split())
    name = reservation_name(HELD_CLIQUE)
    assert f"slowest bad-1 · held by Slurm reservation {name}" in body
    assert "Fabric acceptance: never run." in body

    status, text = await browser.get(f"/ui/fabric/domains/{HELD_CLIQUE}")
    assert status == 200
    page = Elements(text)
    (section,) = page.find("section", id="acceptance")
    assert section["data-acceptance"] == "failed" and section["data-held"] == "yes"
    rows = page.find("tr", data_test="nccl-tests")
    busbw = [r for r in rows if "slowest" in r["class"].split()]
    assert {r["data-node"] for r in busbw} == {"bad-1"}
    assert {r["data-passed"] for r in busbw} >= {"no"}
    body = " ".join(" ".join(page.text).split())
    assert "301.12GB/s" in body and "431" in body and "476.96GB/s" in body
    assert f"Held: Slurm maintenance reservation {name} keeps jobs off bad-0, bad-1" in body
    assert f"provisioner fabric accept {HELD_CLIQUE}" in body
    assert not page.find("form", action=f"/ui/fabric/domains/{HELD_CLIQUE}/accept")  # viewer
    assert page.find("details", data_report="mndiag")
    assert MNDIAG in page.text and "&lt;not a capture&gt;" in text  # verbatim, escaped

    status, text = await browser.get(f"/ui/fabric/domains/{PASSED_CLIQUE}")
    page = Elements(text)
    assert page.find("section", id="acceptance")[0]["data-acceptance"] == "passed"
    assert not page.find("details", data_report="mndiag")  # none ran there
    assert all(r["data-passed"] == "yes" for r in page.find("tr") if "data-passed" in r)
    status, text = await browser.get(f"/ui/fabric/domains/{NEVER_CLIQUE}")
    page = Elements(text)
    assert page.find("section", id="acceptance")[0]["data-acceptance"] == "never"
    assert "Never run for this domain." in " ".join(page.text)


async def test_rerun_from_the_console_confirms_then_retries_the_held_nodes(
        api: Api, store: Store, make_node: Any) -> None:
    """A domain held in ``validate_failed``: the operator's form asks to confirm, then
    retries its failed node through the conductor (as ``provisioner fabric accept``)."""
    await nvl_domain(store, make_node)  # nvl-03 validate_failed
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    status, text = await browser.get(f"/ui/fabric/domains/{CLIQUE}")
    assert status == 200
    action = f"/ui/fabric/domains/{CLIQUE}/accept"
    assert Elements(text).find("form", action=action)
    status, _, text = await browser.request("POST", action, {"csrf": browser.csrf})
    assert status == 200 and 'name="confirm" value="yes"' in text  # asks first
    assert (await store.nodes.find("nvl-03")).state is NodeState.VALIDATE_FAILED
    status, headers, _ = await browser.request("POST", action,
                                               {"csrf": browser.csrf, "confirm": "yes"})
    assert status == 303 and "done=retried+nvl-03" in headers["Location"], headers
    node = await store.nodes.find("nvl-03")
    assert node.state is not NodeState.VALIDATE_FAILED  # retried by the conductor
    history = await store.nodes.history(node.id)
    assert any(h.reason == f"fabric acceptance of {CLIQUE} rerun" for h in history)


async def test_an_active_domain_without_slurm_is_refused_with_the_reason(
        api: Api, store: Store, make_node: Any) -> None:
    nodes = await active_domain(store, make_node, PASSED_CLIQUE, "good")
    await judged(store, PASSED_CLIQUE, nodes, set(), held=False)
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    await browser.get(f"/ui/fabric/domains/{PASSED_CLIQUE}")
    status, headers, _ = await browser.request(
        "POST", f"/ui/fabric/domains/{PASSED_CLIQUE}/accept",
        {"csrf": browser.csrf, "confirm": "yes"})
    assert status == 303
    _, text = await browser.get(headers["Location"])
    assert "Refused: fabric accept: domain" in text and "has no Slurm" in text


async def test_the_rerun_form_needs_csrf_same_origin_and_an_operator(
        api: Api, store: Store, make_node: Any) -> None:
    await nvl_domain(store, make_node)
    action = f"/ui/fabric/domains/{CLIQUE}/accept"
    viewer = Browser(api)
    await viewer.sign_in(Role.VIEWER)
    status, _, text = await viewer.request("POST", action,
                                           {"csrf": viewer.csrf, "confirm": "yes"})
    assert status == 403 and "operator" in text
    operator = Browser(api)
    await operator.sign_in(Role.OPERATOR)
    status, _, _ = await operator.request("POST", action, {"csrf": "wrong", "confirm": "yes"})
    assert status == 403
    api.client.session.cookie_jar.clear()
    async with api.client.post(action, data={"csrf": operator.csrf, "confirm": "yes"},
                               headers={"Cookie": operator.cookie,
                                        "Origin": "https://evil.example"},
                               allow_redirects=False) as resp:
        assert resp.status == 403
    assert (await store.nodes.find("nvl-03")).state is NodeState.VALIDATE_FAILED


async def test_a_domain_of_one_node_is_listed_and_has_its_page(
        api: Api, store: Store, make_node: Any) -> None:
    """An HGX node names no NVLink clique: its domain is its hostname."""
    node = await make_node(NodeState.ACTIVE, profile="nvl", hostname="hgx-07")
    await judged(store, "hgx-07", [node], {"hgx-07"}, held=True)
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    _, text = await browser.get("/ui/fabric")
    page = Elements(text)
    assert page.find("div", data_clique="hgx-07")
    assert "Single-node domains" in " ".join(page.text)
    status, text = await browser.get("/ui/fabric/domains/hgx-07")
    assert status == 200
    page = Elements(text)
    assert page.find("section", id="acceptance")[0]["data-held"] == "yes"
    assert page.find("tr", data_hostname="hgx-07")  # the explainer's row of the node
    assert page.find("form", action="/ui/fabric/domains/hgx-07/accept")
