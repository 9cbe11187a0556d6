"""The web console (``/ui/``) over HTTP on 127.0.0.1, against a real SQLite store and the fake
drivers: sign-in and sessions, CSRF and roles on every mutating form, escaping of untrusted
text, security headers, cached assets, and the ``/api/v1/events`` stream.
(The same pages in a real browser: ``tests/e2e/test_console_browser.py``.)"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from typing import Any

import pytest

from provisioner.api import EVENTS
from provisioner.config import ApiSettings
from provisioner.domain import BmcEndpoint, NewNode, NodeFilter, Role
from provisioner.lifecycle.states import NodeState
from provisioner.lifecycle.validation import DOMAIN_STATES as STATES
from provisioner.lifecycle.validation import DomainWatch
from provisioner.simulation.world import SimWorld
from provisioner.store.repo import NodeChange
from provisioner.store.store import Store
from provisioner.validation.domain import Standing
from tests.integration.test_api import SECRET, Api, running_api

XSS = "<img src=x onerror=alert(1)>"


class Elements(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str | None = None, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if (tag is None or t == tag)
                and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]

    def with_attr(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.tags if name in a]


class Browser:
    """One console session (its own cookie), driven over HTTP."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.cookie = ""
        self.csrf = ""

    async def request(self, method: str, path: str, data: dict[str, str] | None = None,
                      ) -> tuple[int, dict[str, str], str]:
        headers = {"Cookie": self.cookie} if self.cookie else {}
        self.api.client.session.cookie_jar.clear()
        async with self.api.client.request(method, path, data=data, headers=headers,
                                           allow_redirects=False) as resp:
            text = await resp.text()
            self.api.seen.append(text)
            found = re.search(r'name="csrf" value="([^"]+)"', text)
            if found:
                self.csrf = found.group(1)
            return resp.status, dict(resp.headers), text

    async def sign_in(self, role: Role) -> None:
        status, headers, _ = await self.request("POST", "/ui/signin",
                                                {"token": self.api.tokens[role],
                                                 "next": "/ui/"})
        assert status == 303, status
        self.cookie = headers["Set-Cookie"].split(";")[0]
        status, _, _ = await self.request("GET", "/ui/")  # picks up the CSRF token
        assert status == 200

    async def get(self, path: str) -> tuple[int, str]:
        status, _, text = await self.request("GET", path)
        return status, text


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


async def _rack(api: Api, count: int = 4) -> list[dict[str, Any]]:
    nodes = []
    for i in range(count):
        nodes.append(await api.enroll(
            hostname=f"gpu-{i:02d}", serial=f"SN{i}", macs=[f"52:54:00:00:01:{i:02x}"],
            rack="r1", position=f"u{i + 1}", profile="gpu-worker",
            bmc={"driver": "fake", "address": f"10.0.0.{i + 1}", "username": "root",
                 "password": SECRET}))
    return nodes


# -- sign-in and sessions -------------------------------------------------------------------


async def test_ui_redirects_to_a_sign_in_form_with_a_token_field(api: Api) -> None:
    browser = Browser(api)
    status, headers, _ = await browser.request("GET", "/ui/")
    assert status == 303 and headers["Location"].startswith("/ui/signin?next=")
    status, headers, text = await browser.request("GET", headers["Location"])
    assert status == 200
    assert Elements(text).find("input", name="token")
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp
    assert headers["X-Frame-Options"] == "DENY"
    assert "<script>" not in text and " on" not in re.sub(r"[^<]*", "", text)


async def test_sign_in_sets_an_httponly_strict_cookie_with_an_expiry(api: Api) -> None:
    browser = Browser(api)
    status, headers, _ = await browser.request(
        "POST", "/ui/signin", {"token": api.tokens[Role.VIEWER], "next": "/ui/nodes/x"})
    assert status == 303 and headers["Location"] == "/ui/nodes/x"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=28800" in cookie
    assert api.tokens[Role.VIEWER] not in cookie  # the token stays on the server


@pytest.mark.parametrize("token", ["", "pvt_not-a-token", "x" * 600, "\u00e9t\u00e9"])
async def test_a_wrong_token_is_refused_with_the_form_again(api: Api, token: str) -> None:
    status, headers, text = await Browser(api).request("POST", "/ui/signin",
                                                       {"token": token})
    assert status == 401 and "Set-Cookie" not in headers
    assert "unknown, expired or unusable token" in text and Elements(text).find(
        "input", name="token")


async def test_an_agent_token_cannot_open_the_console(api: Api) -> None:
    status, _, _ = await Browser(api).request("POST", "/ui/signin",
                                              {"token": api.tokens[Role.AGENT]})
    assert status == 401


async def test_next_never_redirects_off_the_console(api: Api) -> None:
    for target in ("https://evil.example/", "//evil.example/", "/api/v1/nodes"):
        status, headers, _ = await Browser(api).request(
            "POST", "/ui/signin", {"token": api.tokens[Role.VIEWER], "next": target})
        assert status == 303 and headers["Location"] == "/ui/"


async def test_sign_out_ends_the_session(api: Api) -> None:
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, _, _ = await browser.request("POST", "/ui/signout", {"csrf": browser.csrf})
    assert status == 303
    status, headers, _ = await browser.request("GET", "/ui/")
    assert status == 303 and headers["Location"].startswith("/ui/signin")


async def test_signing_in_again_replaces_the_session(api: Api) -> None:
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    old = browser.cookie
    await browser.sign_in(Role.OPERATOR)
    assert browser.cookie != old
    browser.cookie = old
    status, _, _ = await browser.request("GET", "/ui/")
    assert status == 303  # the first session is gone


async def test_a_forged_cookie_is_not_a_session(api: Api) -> None:
    browser = Browser(api)
    browser.cookie = "pv_session=forged"
    status, _, _ = await browser.request("GET", "/ui/")
    assert status == 303


# -- fleet ----------------------------------------------------------------------------------


async def test_fleet_shows_every_node_with_its_state_and_counts_failed_first(
        api: Api, make_node: Any) -> None:
    await _rack(api)
    await make_node(NodeState.DEPLOY_FAILED, hostname="bad-1", rack="r2", position="u1")
    held = await make_node(NodeState.ACTIVE, hostname="held-1", rack="r2", position="u2")
    await api.conductor.set_maintenance(held.id, True, actor="test", reason="fan",
                                        propagate=False)
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, text = await browser.get("/ui/")
    assert status == 200
    page = Elements(text)
    cells = {a["data-hostname"]: a["data-state"] for a in page.find("a") if "data-hostname" in a}
    assert cells == {"gpu-00": "enrolled", "gpu-01": "enrolled", "gpu-02": "enrolled",
                     "gpu-03": "enrolled", "bad-1": "deploy_failed", "held-1": "active"}
    rows = {a["data-hostname"] for a in page.find("tr") if "data-hostname" in a}
    assert rows == set(cells)
    counts = [a["data-count"] for a in page.with_attr("data-count")]
    assert counts[:2] == ["deploy_failed", "maintenance"]
    assert [a for a in page.find("a") if a.get("data-hostname") == "held-1"][0][
        "class"].endswith(" m")


async def test_fleet_view_follows_changes_rack_by_rack(api: Api, make_node: Any,
                                                     store: Store) -> None:
    a = await make_node(NodeState.ACTIVE, hostname="a1", rack="ra", position="u1")
    await make_node(NodeState.ACTIVE, hostname="b1", rack="rb", position="u1")
    await make_node(NodeState.ENROLLED, hostname="loose")
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)

    async def elevation() -> dict[str, list[tuple[str, str]]]:
        _, text = await browser.get("/ui/")
        out: dict[str, list[tuple[str, str]]] = {}
        rack = ""
        for tag, attrs in Elements(text).tags:
            if attrs.get("class") == "rack-name":
                rack = attrs["title"]
                out[rack] = []
            elif tag == "a" and "cell" in attrs.get("class", "") and "data-hostname" in attrs:
                out[rack].append((attrs["data-hostname"], attrs["class"]))
        return out

    assert await elevation() == {"ra": [("a1", "cell s-active")],
                                 "rb": [("b1", "cell s-active")],
                                 "(no rack)": [("loose", "cell s-enrolled")]}
    await api.conductor.set_maintenance(a.id, True, actor="test", reason="x",
                                        propagate=False)
    assert (await elevation())["ra"] == [("a1", "cell s-active m")]
    await store.nodes.update_meta(a.id, NodeChange(rack="rb", position="u2"))
    assert await elevation() == {"rb": [("b1", "cell s-active"), ("a1", "cell s-active m")],
                                 "(no rack)": [("loose", "cell s-enrolled")]}
    _, text = await browser.get("/ui/")
    counts = {a["data-count"]: a for a in Elements(text).with_attr("data-count")}
    assert set(counts) == {"maintenance", "enrolled", "active"}


async def test_fleet_filters_are_the_apis_and_paginate(api: Api, make_node: Any) -> None:
    await _rack(api)
    await make_node(NodeState.DEPLOY_FAILED, hostname="bad-1", rack="r2")
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)

    async def rows(query: str) -> list[str]:
        status, text = await browser.get("/ui/?" + query)
        assert status == 200, text
        return [a["data-hostname"] for a in Elements(text).find("tr")
                if "data-hostname" in a]

    assert await rows("state=deploy_failed") == ["bad-1"]
    assert await rows("rack=r1&q=gpu-0") == ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]
    assert await rows("q=gpu-01&state=&rack=") == ["gpu-01"]
    assert await rows("maintenance=true") == []
    assert await rows("limit=2&offset=2") == ["gpu-02", "gpu-03"]
    status, text = await browser.get("/ui/?limit=2")
    assert 'rel="next"' in text and "1–2 of 5" in text
    status, text = await browser.get("/ui/?state=bogus")
    assert status == 422 and "invalid filter: state" in text


# -- node page and actions ------------------------------------------------------------------


async def test_node_page_shows_identity_bmc_facts_history_but_never_the_password(
        api: Api) -> None:
    node = (await _rack(api, 1))[0]
    await api.post(f"/api/v1/nodes/{node['id']}/actions/inspect")
    for _ in range(200):
        if (await api.store.nodes.get(node["id"])).state is NodeState.INSPECTED:
            break
        await asyncio.sleep(0.02)
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, text = await browser.get("/ui/nodes/gpu-00")
    assert status == 200
    page = Elements(text)
    body = " ".join(page.text)
    assert "10.0.0.1" in body and "set (never shown)" in body and SECRET not in text
    assert "NVIDIA H100 80GB HBM3" in body and "Intel Xeon Platinum 8480+" in body
    assert "InfiniBand (8)" in body and "2,048 GiB" in body
    events = [a["data-event"] for a in page.find("li") if "data-event" in a]
    assert events[:3] == ["done", "inspect", "enroll"]  # newest first
    links = [a["data-link"] for a in page.find("li") if "data-link" in a]
    assert links[0] == "bmc" and links[-1] == "slurm"
    assert not page.find("form", class_="action")  # a viewer gets no action
    assert "Actions" not in body


async def test_unknown_node_and_page_are_404_pages(api: Api) -> None:
    browser = Browser(api)
    status, headers, _ = await browser.request("GET", "/ui/typo")
    assert status == 303  # not signed in: the sign-in form first
    await browser.sign_in(Role.VIEWER)
    status, text = await browser.get("/ui/nodes/nope")
    assert status == 404 and "nope" in text
    status, text = await browser.get("/ui/typo/deeper")
    assert status == 404 and "no console page at /ui/typo/deeper" in text


async def test_operator_action_needs_confirmation_then_runs_through_the_conductor(
        api: Api) -> None:
    node = (await _rack(api, 1))[0]
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    status, text = await browser.get("/ui/nodes/gpu-00")
    buttons = {a["data-action"] for a in Elements(text).with_attr("data-action")}
    assert {"inspect", "retire", "maintenance-on", "power", "bootdev"} <= buttons
    form = {"csrf": browser.csrf, "action": "maintenance-on", "reason": "swap PSU"}
    status, _, text = await browser.request("POST", "/ui/nodes/gpu-00/action", form)
    assert status == 200 and "swap PSU" in text and Elements(text).find(
        "input", name="confirm", value="yes")
    assert not (await api.store.nodes.get(node["id"])).maintenance  # not yet
    status, headers, _ = await browser.request("POST", "/ui/nodes/gpu-00/action",
                                               {**form, "confirm": "yes"})
    assert status == 303 and headers["Location"].startswith("/ui/nodes/gpu-00?done=")
    stored = await api.store.nodes.get(node["id"])
    assert stored.maintenance and stored.maintenance_reason == "swap PSU"
    last = (await api.store.nodes.history(node["id"]))[-1]
    assert (last.event, last.actor) == ("maintenance_on", "token:operator-tok")
    _, text = await browser.get(headers["Location"])
    assert "Done: maintenance-on (swap PSU)" in text


async def test_power_and_boot_device_forms_use_the_bmc(api: Api, world: SimWorld) -> None:
    await _rack(api, 1)
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    await browser.get("/ui/nodes/gpu-00")
    status, headers, _ = await browser.request(
        "POST", "/ui/nodes/gpu-00/power", {"csrf": browser.csrf, "power": "on",
                                            "confirm": "yes"})
    assert status == 303 and "done=" in headers["Location"]
    status, headers, _ = await browser.request(
        "POST", "/ui/nodes/gpu-00/bootdev", {"csrf": browser.csrf, "device": "pxe",
                                              "persistent": "yes", "confirm": "yes"})
    assert status == 303 and "done=" in headers["Location"]
    events = [h.event for h in await api.store.nodes.history(
        (await api.store.nodes.find("gpu-00")).id)]
    assert events[-2:] == ["power_on", "bootdev"]


async def test_a_refused_action_says_why_on_the_node_page(api: Api) -> None:
    await _rack(api, 1)
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    await browser.get("/ui/nodes/gpu-00")
    status, headers, _ = await browser.request(
        "POST", "/ui/nodes/gpu-00/action", {"csrf": browser.csrf, "action": "deploy",
                                             "confirm": "yes"})
    assert status == 303
    _, text = await browser.get(headers["Location"])
    assert "Refused: deploy" in text and "enrolled" in text


@pytest.mark.parametrize("fields", [{"action": "explode"}, {"action": "maintenance-on"}])
async def test_an_invalid_action_form_is_a_422(api: Api, fields: dict[str, str]) -> None:
    await _rack(api, 1)
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    await browser.get("/ui/nodes/gpu-00")
    status, _, _ = await browser.request("POST", "/ui/nodes/gpu-00/action",
                                         {"csrf": browser.csrf, **fields, "confirm": "yes"})
    assert status == 422


async def test_viewer_post_and_missing_or_wrong_csrf_are_403(api: Api) -> None:
    node = (await _rack(api, 1))[0]
    viewer, operator = Browser(api), Browser(api)
    await viewer.sign_in(Role.VIEWER)
    await operator.sign_in(Role.OPERATOR)
    form = {"action": "maintenance-on", "reason": "x", "confirm": "yes"}
    for browser, sent in ((viewer, {**form, "csrf": viewer.csrf}),  # right CSRF, wrong role
                          (operator, form),                          # no CSRF
                          (operator, {**form, "csrf": viewer.csrf}),  # another session's
                          (Browser(api), {**form, "csrf": operator.csrf})):  # no session
        status, _, text = await browser.request("POST", "/ui/nodes/gpu-00/action", sent)
        assert status == 403, (status, text)
    assert not (await api.store.nodes.get(node["id"])).maintenance


# -- escaping -------------------------------------------------------------------------------


async def test_untrusted_text_is_escaped_everywhere(api: Api, make_node: Any,
                                                    store: Store) -> None:
    node = await make_node(NodeState.DEPLOY_FAILED, hostname=XSS, rack=XSS, position=XSS,
                           serial=XSS, bmc=BmcEndpoint("fake", XSS, username=XSS))
    await store.nodes.merge_facts(node.id, {"cpu": {"model": XSS}, XSS: [{XSS: XSS}]})
    await api.conductor.set_maintenance(node.id, True, actor="test", reason=XSS,
                                        propagate=False)
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    for path in ("/ui/", f"/ui/?q={XSS}", f"/ui/nodes/{node.id}", "/ui/fabric"):
        status, text = await browser.get(path)
        assert status == 200, path
        assert XSS not in text and "<img" not in text, path
        assert not [a for _, a in Elements(text).tags if "onerror" in a], path
    _, text = await browser.get(f"/ui/nodes/{node.id}")
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert XSS in " ".join(Elements(text).text)  # shown, as text


# -- assets and events ----------------------------------------------------------------------


async def test_assets_are_versioned_and_cached(api: Api) -> None:
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    _, text = await browser.get("/ui/")
    src = Elements(text).find("script")[0]["src"]
    assert src.startswith("/ui/static/live.js?v=")
    async with api.client.get(src) as resp:
        assert resp.status == 200 and resp.content_type == "text/javascript"
        assert "immutable" in resp.headers["Cache-Control"]
        etag = resp.headers["ETag"]
        assert "innerHTML" not in await resp.text()
    async with api.client.get("/ui/static/live.js", headers={"If-None-Match": etag}) as resp:
        assert resp.status == 304
    async with api.client.get("/ui/static/nope.js") as resp:
        assert resp.status == 404


async def _read_events(resp: Any, count: int) -> list[str]:
    frames: list[str] = []
    buffer = ""
    async with asyncio.timeout(5):
        while len(frames) < count:
            buffer += (await resp.content.readany()).decode()
            while "\n\n" in buffer:
                frame, buffer = buffer.split("\n\n", 1)
                if "event: " in frame:
                    frames.append(frame)
    return frames


async def test_events_stream_transitions_with_a_token_or_a_session(api: Api) -> None:
    node = (await _rack(api, 1))[0]
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    async with api.client.get("/api/v1/events") as resp:
        assert resp.status == 401
    bearer = {"Authorization": f"Bearer {api.tokens[Role.VIEWER]}"}
    async with api.client.get("/api/v1/events", headers=bearer) as by_token, \
            api.client.get("/api/v1/events", headers={"Cookie": browser.cookie}) as by_session:
        assert by_token.status == by_session.status == 200
        assert by_token.content_type == "text/event-stream"
        await api.post(f"/api/v1/nodes/{node['id']}/actions/maintenance-on",
                       {"reason": "cable"})
        for resp in (by_token, by_session):
            frame = (await _read_events(resp, 1))[0]
            assert "event: transition" in frame and '"hostname": "gpu-00"' in frame
            assert '"maintenance": true' in frame and '"event": "maintenance_on"' in frame


async def test_a_session_cookie_never_authorises_a_rest_write(api: Api) -> None:
    browser = Browser(api)
    await browser.sign_in(Role.OPERATOR)
    async with api.client.post("/api/v1/nodes", json={"hostname": "x"},
                               headers={"Cookie": browser.cookie}) as resp:
        assert resp.status == 401


async def test_a_client_that_stops_reading_is_dropped_and_others_keep_up(
        aiohttp_client: Any, store: Store, world: SimWorld, make_node: Any) -> None:
    async with running_api(aiohttp_client, store, world,
                           settings=ApiSettings(events_queue_max=16)) as api:
        await assert_the_silent_one_is_dropped(api, make_node)


async def assert_the_silent_one_is_dropped(api: Api, make_node: Any) -> None:
    node = await make_node(NodeState.ACTIVE, hostname="busy")
    hub = api.client.app[EVENTS]
    bearer = f"Bearer {api.tokens[Role.VIEWER]}"
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small
    silent.setblocking(False)
    await asyncio.get_running_loop().sock_connect(silent, (api.client.host, api.client.port))
    _, writer = await asyncio.open_connection(sock=silent)  # it sends a request, reads nothing
    writer.write(f"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: {bearer}\r\n\r\n".encode())
    await writer.drain()
    async with api.client.get("/api/v1/events", headers={"Authorization": bearer}) as good:
        async with asyncio.timeout(5):
            while len(hub) < 2:  # noqa: ASYNC110  (the handlers subscribe when they run)
                await asyncio.sleep(0.01)
        # fat frames (64 KiB) fill the silent client's socket buffers within a few MiB
        fat = dataclasses.replace(node, maintenance_reason="r" * 65536)
        sent = 0
        async with asyncio.timeout(60):
            while len(hub) > 1:
                hub.observe(fat, "note", NodeState.ACTIVE)
                sent += 1
                frames = await _read_events(good, 1)
                assert all("event: transition" in f for f in frames)
        assert hub.dropped == 1 and len(hub) == 1  # the silent one went, not the reader
        assert sent >= 16  # it was dropped for falling behind, not at once
        await api.conductor.record(node.id, "after", actor="test", reason="still here")
        async with asyncio.timeout(5):
            while True:
                frames = await _read_events(good, 1)
                if any('"event": "after"' in f for f in frames):
                    break
    writer.close()


# -- NVLink domains and the why-not-schedulable chain ---------------------------------------

CLIQUE = "5f2c0d4e-1111-2222-3333-444455556666.1"
GPU = {"vendor": "0x10de", "device": "0x2941", "name": "NVIDIA GB200"}


async def nvl_domain(store: Store, make_node: Any, *, size: int = 4, failing: int | None = 3,
                     prefix: str = "nvl-", first: int = 0) -> list[str]:
    """An NVLink domain of ``size`` nodes that passed validation (validating, waiting for
    the domain), except the ``failing``-th, whose InfiniBand rate failed it."""
    names = []
    for i in range(size):
        failed = i == failing
        name = f"{prefix}{first + i:02d}"
        node = await make_node(NodeState.VALIDATING, hostname=name, rack="nvl72-a",
                               position=f"u{i + 1}", bmc=BmcEndpoint("fake", f"10.9.0.{i + 1}"))
        failures = ["infiniband: mlx5_3 runs at 200 Gb/s, expected 400"] if failed else []
        record = {"passed": not failed, "at": "2026-11-25T10:00:00+00:00",
                  "failures": failures, "clique": CLIQUE, "domain_nodes": size,
                  "checks": ["gpu_count", "gpu_model", "ib_rate"]}
        await store.nodes.merge_facts(node.id, {
            "validation": record, "last_report": {"gpus": [GPU] * 4}})
        node = await store.nodes.get(node.id)
        if not failed:
            node = await store.nodes.save_checkpoint(node, ["validate-node"])
        else:
            node = await store.nodes.transition(
                node, to_state=NodeState.VALIDATE_FAILED, event="fail", actor="conductor",
                reason="validation failed: " + failures[0], last_error=(
                    "validation failed: " + failures[0]), reset_checkpoint=False)
        await store.nodes.note_power(node.id, "on")
        names.append(name)
    return names


async def test_domain_explainer_highlights_the_failing_nodes_validation_link(
        api: Api, store: Store, make_node: Any) -> None:
    await nvl_domain(store, make_node)
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, text = await browser.get("/ui/fabric")
    assert status == 200
    page = Elements(text)
    assert page.find("div", data_clique=CLIQUE)
    members = {a["data-hostname"]: a["data-state"] for a in page.find("li")
               if "data-hostname" in a}
    assert members == {"nvl-00": "validating", "nvl-01": "validating",
                       "nvl-02": "validating", "nvl-03": "validate_failed"}
    status, text = await browser.get(f"/ui/fabric/domains/{CLIQUE}")
    assert status == 200
    page = Elements(text)
    first = [(a.get("data-link"), a["class"]) for t, a in page.tags
             if "first-failing" in a.get("class", "").split()]
    assert ("validation", "first-failing") in first  # the column
    cells = [a for a in page.find("td") if "first-failing" in a["class"].split()]
    assert [c["data-link"] for c in cells] == ["validation"]
    rows = [a["data-hostname"] for a in page.find("tr") if "data-hostname" in a]
    failing_row = rows.index("nvl-03")
    tds = [a for a in page.find("td")]
    links_per_row = len(tds) // len(rows)
    assert cells[0] is tds[failing_row * links_per_row + 6]  # the failing node, link 7
    body = " ".join(page.text)
    assert "mlx5_3 runs at 200 Gb/s" in body and "What to do: fix or replace" in body
    # the other members wait for the domain because of it
    assert [a["data-status"] for a in page.find("td", data_link="domain")] == [
        "fail", "fail", "fail", "fail"]


async def test_node_page_walks_the_chain_to_its_first_failing_link(
        api: Api, store: Store, make_node: Any) -> None:
    await nvl_domain(store, make_node)
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    _, text = await browser.get("/ui/nodes/nvl-00")
    page = Elements(text)
    chain = {a["data-link"]: a["data-status"] for a in page.find("li") if "data-link" in a}
    assert chain == {"bmc": "ok", "power": "ok", "boot": "ok", "callback": "ok",
                     "kube": "ok", "gpu": "ok", "validation": "ok", "domain": "fail",
                     "slurm": "wait"}
    first = [a for a in page.find("li") if "first-failing" in a.get("class", "")]
    assert [a["data-link"] for a in first] == ["domain"]
    assert "failed: nvl-03 (infiniband: mlx5_3 runs at 200 Gb/s" in " ".join(page.text)


async def test_an_unknown_domain_is_a_404(api: Api) -> None:
    browser = Browser(api)
    await browser.sign_in(Role.VIEWER)
    status, _ = await browser.get("/ui/fabric/domains/nope")
    assert status == 404


# -- the console's store reads, on SQLite and PostgreSQL ------------------------------------


async def test_console_reads_on_every_backend(any_store: Store) -> None:
    repo = any_store.nodes
    tricky = 'a%_"b\\.1'
    made = {}
    for name, clique, rack in (("x1", tricky, "r1"), ("x2", "a.1", "r1"), ("x3", None, None)):
        node = await repo.create(NewNode(state=NodeState.VALIDATING, hostname=name, rack=rack),
                                 actor="test")
        if clique is not None:
            await repo.merge_facts(node.id, {"validation": {"passed": True, "clique": clique}})
        made[name] = node
    assert [n.hostname for n in await repo.naming_clique(tricky)] == ["x1"]
    assert [n.hostname for n in await repo.naming_clique("a.1")] == ["x2"]
    assert await repo.naming_clique("a") == []
    named = await repo.clique_stamps(STATES)
    assert set(named) == {made["x1"].id, made["x2"].id}
    assert sorted(n.hostname or "" for n in await repo.get_many([*named, "nope"])) == [
        "x1", "x2"]
    stamps = await repo.rack_stamps()
    assert {k: v[0] for k, v in stamps.items()} == {"r1": 2, None: 1}
    assert sorted(n.hostname or "" for n in await repo.summaries([None])) == ["x3"]
    assert sorted(n.hostname or "" for n in await repo.summaries(["r1"])) == ["x1", "x2"]
    assert len(await repo.summaries()) == 3
    items, total = await repo.page(NodeFilter(rack="r1"), limit=1, offset=1)
    assert total == 2 and [n.hostname for n in items] == ["x2"]
    items, total = await repo.page(NodeFilter(query="x3", state="validating"), limit=5,
                                   offset=0)
    assert total == 1 and items[0].rack is None and items[0].last_error == ""
    before = stamps["r1"]
    await repo.merge_facts(made["x2"].id, {"cpu": {}})
    after = (await repo.rack_stamps())["r1"]
    assert after != before and (await repo.rack_stamps())[None] == stamps[None]


async def test_the_domain_index_reads_only_domain_nodes_and_follows_changes(
        store: Store, make_node: Any) -> None:
    await make_node(NodeState.ACTIVE, hostname="hgx-1")  # no NVLink domain: never read
    names = await nvl_domain(store, make_node, size=3, failing=None)
    stamps = await store.nodes.clique_stamps(STATES)
    assert sorted([(await store.nodes.get(i)).hostname or "" for i in stamps]) == names
    now = [0.0]
    index = DomainWatch(store.nodes, interval_s=5, now=lambda: now[0])
    assert {(m.name, m.standing) for m in await index.members()} == {
        (n, Standing.PASSED) for n in names}
    node = await store.nodes.find(names[0])
    await store.nodes.transition(node, to_state=NodeState.VALIDATE_FAILED, event="fail",
                                 actor="test", reason="x", last_error="x",
                                 reset_checkpoint=False)
    assert len([m for m in await index.members() if m.standing is Standing.FAILED]) == 0
    now[0] += 5  # the next refresh sees it
    failed = [m.name for m in await index.members() if m.standing is Standing.FAILED]
    assert failed == [names[0]]
