"""The console's node page and ``GET /api/v1/nodes/{id}/why`` give one answer (both from
``lifecycle.schedulable``): an active node with an open health finding that needs an action
is not schedulable, on the page (its holds above the chain) and in the JSON alike."""

from __future__ import annotations

from typing import Any

from provisioner.domain import BmcEndpoint, Role
from provisioner.lifecycle.states import NodeState
from provisioner.store.store import Store
from tests.integration.test_api import NODES, Api
from tests.integration.test_console import Browser, Elements
from tests.integration.test_console import api as api  # noqa: F401  (fixture)

PASSED = {"passed": True, "at": "2026-11-25T10:00:00+00:00", "failures": [], "checks": []}


async def test_page_and_api_agree_on_a_health_finding(
        api: Api, store: Store, make_node: Any) -> None:  # noqa: F811
    node = await make_node(NodeState.ACTIVE, hostname="why-00",
                           bmc=BmcEndpoint("fake", "10.7.0.1"))
    await store.nodes.merge_facts(node.id, {"validation": PASSED,
                                            "gpus": [{"name": "NVIDIA H100"}]})
    await store.nodes.note_power(node.id, "on")
    reply = await api.get(f"{NODES}/why-00/why")
    assert reply.status == 200 and reply.body["schedulable"] is True, reply.body

    found = await api.post("/api/v1/health/findings", {
        "node": "why-00", "findings": [{"class": "gpu-memory", "action": "reset_gpu",
                                        "subject": "GPU 3",
                                        "evidence": "XID 48: double-bit ECC error"}]})
    assert found.status == 200, found.text
    reply = await api.get(f"{NODES}/why-00/why")
    body = reply.body
    assert body["schedulable"] is False and body["first_blocking"] == "health"
    health = next(s for s in body["steps"] if s["key"] == "health")
    assert "GPU 3: XID 48: double-bit ECC error (reset_gpu)" in health["evidence"]

    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, text = await browser.get("/ui/nodes/why-00")
    assert status == 200
    page = Elements(text)
    holds = {a["data-hold"]: a["data-status"] for a in page.find("li") if "data-hold" in a}
    links = {a["data-link"]: a["data-status"] for a in page.find("li") if "data-link" in a}
    assert holds | links == {s["key"]: s["status"] for s in body["steps"]}
    words = " ".join(page.text)
    assert "double-bit ECC error" in words and "Not schedulable" in words
    assert "Schedulable: every link holds." not in words
