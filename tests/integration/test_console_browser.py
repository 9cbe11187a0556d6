"""The console in a real browser: Debian's headless Chromium driven by Selenium, against the
API server on 127.0.0.1 (a real SQLite store, the fake drivers). Sign-in with viewer and
operator tokens, the fleet of a simulated rack, a node's facts and history, live updates
without a reload, roles, CSRF, escaping, and the NVLink explainer.

Screenshots of each page go to ``$PROVISIONER_SCREENSHOTS`` (default: a ``console-shots``
folder under pytest's temporary directory); ``docs/console-*.png`` are copies of them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from provisioner.config import TopologySettings
from provisioner.domain import Role
from provisioner.lifecycle.states import NodeState
from provisioner.simulation.world import SimWorld
from provisioner.store.store import Store
from provisioner.topology_live.live import LiveTopology
from tests.conftest import wait_for_state
from tests.integration.test_api import Api, running_api
from tests.integration.test_console import CLIQUE, XSS, nvl_domain
from tests.peers.chromium import chromium_unavailable_reason, running_chromium

T = TypeVar("T")
FAULTS = (Path(__file__).parents[1] / "fixtures" / "topology" / "infiniband-sim" / "faults"
          / "ibnetdiscover.txt")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if (reason := chromium_unavailable_reason()) is not None:
        pytest.skip(reason)
    with running_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("PROVISIONER_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("console-shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
async def api(aiohttp_client: Any, store: Store, world: SimWorld) -> AsyncIterator[Api]:
    async with running_api(aiohttp_client, store, world) as started:
        yield started


class Page:
    """The browser, seen from the test's loop: every Selenium call runs in a thread."""

    def __init__(self, driver: Any, api: Api, shots: Path) -> None:
        self.driver = driver
        self.base = str(api.client.make_url("")).rstrip("/")
        self.api = api
        self.shots = shots

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def open(self, path: str) -> None:
        await self.run(self.driver.get, self.base + path)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.run(self.driver.execute_script, script, *args)

    async def until(self, script: str, *args: Any, timeout_s: float = 5.0) -> Any:
        """Poll a JavaScript expression until it is truthy (a live update arrived)."""
        async with asyncio.timeout(timeout_s):
            while not (value := await self.js(script, *args)):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        return value

    async def sign_in(self, role: Role, path: str = "/ui/") -> None:
        await self.run(self.driver.delete_all_cookies)
        await self.open(path)
        assert "/ui/signin" in await self.js("return location.pathname")
        await self.run(self._type_token, self.api.tokens[role])
        await self.until("return !location.pathname.startsWith('/ui/signin')")

    def _type_token(self, token: str) -> None:
        from selenium.webdriver.common.by import By

        field = self.driver.find_element(By.CSS_SELECTOR, "input[name=token]")
        field.send_keys(token)
        field.submit()

    async def shot(self, name: str) -> Path:
        """The whole page (the window grown to its height for the picture)."""
        path = self.shots / f"{name}.png"
        height = await self.js("return document.documentElement.scrollHeight")
        await self.run(self.driver.set_window_size, 1280, min(max(height, 600), 4000))
        try:
            await self.run(self.driver.save_screenshot, str(path))
        finally:
            await self.run(self.driver.set_window_size, 1280, 900)
        assert path.stat().st_size > 10_000
        return path

    async def no_alert(self) -> None:
        from selenium.common.exceptions import NoAlertPresentException

        def check() -> None:
            try:
                text = self.driver.switch_to.alert.text
            except NoAlertPresentException:
                return
            raise AssertionError(f"an alert opened: {text!r}")

        await self.run(check)


@pytest.fixture
def page(driver: Any, api: Api, shots: Path) -> Page:
    return Page(driver, api, shots)


async def simulated_rack(api: Api, store: Store, count: int = 8) -> dict[str, str]:
    """A rack of ``count`` nodes with fake BMCs, through the real lifecycle (fake drivers):
    some enrolled, some inspected, two deployed all the way to active."""
    ids = []
    for i in range(count):
        node = await api.enroll(
            hostname=f"gpu-{i:02d}", serial=f"SN{i:03d}", macs=[f"52:54:00:00:02:{i:02x}"],
            rack="r07", position=f"u{2 * i + 1}", profile="gpu-worker",
            bmc={"driver": "fake", "address": f"10.0.7.{i + 1}", "username": "root",
                 "password": "pw"})
        ids.append(node["id"])
    for node_id in ids[:6]:
        await api.post(f"/api/v1/nodes/{node_id}/actions/inspect")
        await wait_for_state(store, node_id, NodeState.INSPECTED)
    for node_id in ids[:2]:
        await api.post(f"/api/v1/nodes/{node_id}/actions/deploy")
        await wait_for_state(store, node_id, NodeState.ACTIVE)
    return {(await store.nodes.get(i)).hostname or i: str((await store.nodes.get(i)).state)
            for i in ids}


async def test_viewer_signs_in_and_the_fleet_shows_every_node_with_its_state(
        page: Page, api: Api, store: Store) -> None:
    expected = await simulated_rack(api, store)
    await page.sign_in(Role.VIEWER)
    assert await page.js("return location.pathname") == "/ui/"
    cells = await page.js("""return [...document.querySelectorAll('.rack [data-hostname]')]
        .map(e => [e.dataset.hostname, e.dataset.state])""")
    assert dict(cells) == expected
    rows = await page.js("""return [...document.querySelectorAll('tr[data-hostname]')]
        .map(e => [e.dataset.hostname, e.dataset.state])""")
    assert dict(rows) == expected
    assert await page.js("return document.querySelector('.role').textContent") == "viewer"
    await page.until("return document.getElementById('live').dataset.live === 'on'")
    await page.shot("console-fleet-rack")


async def test_fleet_puts_failed_and_maintenance_first_and_racks_in_position_order(
        page: Page, api: Api, store: Store, make_node: Any) -> None:
    states = [NodeState.ACTIVE] * 9 + [NodeState.DEPLOY_FAILED, NodeState.VALIDATE_FAILED,
                                        NodeState.DEPLOYING, NodeState.INSPECTED]
    for rack in ("r10", "r2", "r1"):
        for u in range(1, 14):
            node = await make_node(states[(u + len(rack)) % len(states)],
                                   hostname=f"{rack}-n{u:02d}", rack=rack, position=f"u{u}")
            if u == 4:
                await api.conductor.set_maintenance(node.id, True, actor="test",
                                                    reason="PSU", propagate=False)
    await page.sign_in(Role.VIEWER)
    counts = await page.js(
        "return [...document.querySelectorAll('[data-count]')].map(e => e.dataset.count)")
    assert counts[:3] == ["deploy_failed", "validate_failed", "maintenance"] or \
        counts[:3] == ["validate_failed", "deploy_failed", "maintenance"]
    racks = await page.js(
        "return [...document.querySelectorAll('.rack-name')].map(e => e.textContent)")
    assert racks == ["r1", "r2", "r10"]
    column = await page.js("""return [...document.querySelectorAll('.rack')[1]
        .querySelectorAll('[data-hostname]')].map(e => e.dataset.hostname)""")
    assert column == [f"r2-n{u:02d}" for u in range(1, 14)]  # u2 before u10
    marks = await page.js("""return [...document.querySelectorAll('.rack .cell.m')]
        .map(e => e.dataset.hostname)""")
    assert marks == ["r1-n04", "r2-n04", "r10-n04"]
    failed_validation = await page.js("""return [...document.querySelectorAll(
        '.rack .cell.vf')].map(e => e.dataset.state)""")
    assert failed_validation and set(failed_validation) == {"validate_failed"}
    await page.shot("console-fleet")


async def test_operator_sees_a_nodes_facts_history_and_confirms_an_action(
        page: Page, api: Api, store: Store) -> None:
    await simulated_rack(api, store, 3)
    await page.sign_in(Role.OPERATOR, "/ui/nodes/gpu-00")
    assert await page.js("return location.pathname") == "/ui/nodes/gpu-00"
    text = await page.js("return document.body.innerText")
    for seen in ("NVIDIA H100 80GB HBM3", "Intel Xeon Platinum 8480+", "mlx5_0",
                 "2,048 GiB", "set (never shown)", "10.0.7.1"):
        assert seen in text, seen
    events = await page.js(
        "return [...document.querySelectorAll('#history li')].map(e => e.dataset.event)")
    assert events[-1] == "enroll" and "inspect" in events and events[0] == "done"
    assert await page.js("return document.querySelectorAll('button[data-action]').length") > 3
    await page.shot("console-node")
    await page.js("""document.querySelector('form.action input[name=reason][required]')
        .value = 'replace PSU 2'""")
    await page.js("document.querySelector('button[data-action=\"maintenance-on\"]').click()")
    await page.until("return document.body.dataset.page === 'confirm'")
    assert "maintenance-on (replace PSU 2)" in await page.js("return document.body.innerText")
    await page.shot("console-confirm")
    await page.js("document.getElementById('confirm').click()")
    await page.until("return document.body.dataset.page === 'node'")
    assert "Done: maintenance-on (replace PSU 2)" in await page.js(
        "return document.body.innerText")
    assert await page.js(
        "return document.querySelector('#history li').dataset.event") == "maintenance_on"
    node = await store.nodes.find("gpu-00")
    assert node.maintenance and node.maintenance_reason == "replace PSU 2"


async def test_maintenance_on_by_the_operator_appears_without_a_reload(
        page: Page, api: Api, store: Store) -> None:
    await simulated_rack(api, store, 4)
    await page.sign_in(Role.VIEWER)
    await page.until("return document.getElementById('live').dataset.live === 'on'")
    await page.js("window.__notReloaded = true")
    node = await store.nodes.find("gpu-02")
    await api.post(f"/api/v1/nodes/{node.id}/actions/maintenance-on", {"reason": "fan 3"})
    await page.until("""return document.querySelector('.rack [data-hostname="gpu-02"]')
        .classList.contains('m')""")
    assert await page.js("return window.__notReloaded === true")
    assert await page.js(
        "return document.querySelector('[data-count=maintenance] b').textContent") == "1"
    row = await page.js("return document.querySelector('tr[data-hostname=\"gpu-02\"]')"
                        ".classList.contains('m')")
    assert row
    # the node's page: the history grows and the badge shows, no reload either
    await page.open("/ui/nodes/gpu-03")
    await page.until("return document.getElementById('live').dataset.live === 'on'")
    await page.js("window.__notReloaded = true")
    other = await store.nodes.find("gpu-03")
    await api.post(f"/api/v1/nodes/{other.id}/actions/maintenance-on",
                   {"reason": "reseat <b>GPU 5</b>"})
    await page.until("""return document.querySelector('#history li').dataset.event ===
        'maintenance_on'""")
    assert await page.js("return window.__notReloaded === true")
    first = await page.js("return document.querySelector('#history li .reason').textContent")
    assert first == "reseat <b>GPU 5</b>"  # text, not markup
    assert not await page.js("return document.getElementById('maintenance').hidden")
    await page.shot("console-node-live")


async def test_viewer_gets_no_buttons_and_forged_posts_are_refused(
        page: Page, api: Api, store: Store) -> None:
    await simulated_rack(api, store, 1)
    await page.sign_in(Role.VIEWER, "/ui/nodes/gpu-00")
    assert await page.js("return document.querySelectorAll('button[data-action]').length") == 0
    assert await page.js("return document.querySelectorAll('form.action').length") == 0
    forge = """const [csrf, done] = [arguments[0], arguments[arguments.length - 1]];
        const body = new URLSearchParams({action: 'maintenance-on', reason: 'x',
                                          confirm: 'yes'});
        if (csrf) body.set('csrf', document.querySelector('input[name=csrf]').value);
        fetch('/ui/nodes/gpu-00/action', {method: 'POST', body, redirect: 'manual'})
          .then(r => done(r.status), e => done(String(e)));"""
    assert await page.run(page.driver.execute_async_script, forge, True) == 403
    await page.sign_in(Role.OPERATOR, "/ui/nodes/gpu-00")
    assert await page.run(page.driver.execute_async_script, forge, False) == 403
    assert not (await store.nodes.find("gpu-00")).maintenance


async def test_a_hostile_hostname_is_shown_as_text(page: Page, api: Api, store: Store,
                                                   make_node: Any) -> None:
    node = await make_node(NodeState.DEPLOY_FAILED, hostname=XSS, rack="r1", position="u1")
    await store.nodes.merge_facts(node.id, {"cpu": {"model": XSS}})
    await page.sign_in(Role.OPERATOR)
    await page.no_alert()
    assert await page.js("return document.querySelectorAll('img').length") == 0
    names = await page.js(
        "return [...document.querySelectorAll('[data-hostname]')].map(e => e.dataset.hostname)")
    assert names == [XSS, XSS]  # its rack cell and its table row
    await page.js("document.querySelector('tr[data-hostname] a').click()")
    await page.until("return document.body.dataset.page === 'node'")
    await page.no_alert()
    assert await page.js("return document.querySelector('h1 .hostname').textContent") == XSS
    assert await page.js("return document.querySelectorAll('img').length") == 0
    # a live update carrying the name changes nothing either
    await page.until("return document.getElementById('live').dataset.live === 'on'")
    await api.post(f"/api/v1/nodes/{node.id}/actions/maintenance-on", {"reason": XSS})
    await page.until("return document.querySelector('#history li .reason')?.textContent")
    await page.no_alert()
    assert await page.js("return document.querySelectorAll('img').length") == 0


async def test_the_nvlink_explainer_highlights_the_failing_nodes_validation(
        page: Page, api: Api, store: Store, make_node: Any) -> None:
    await nvl_domain(store, make_node, size=4, failing=2)
    await page.sign_in(Role.VIEWER, "/ui/fabric")
    members = await page.js("""return [...document.querySelectorAll('.domain li')]
        .map(e => [e.dataset.hostname, e.dataset.state])""")
    assert dict(members)["nvl-02"] == "validate_failed" and len(members) == 4
    await page.js("document.querySelector('.domain h3 a').click()")
    await page.until("return document.body.dataset.page === 'domain'")
    assert CLIQUE in await page.js("return document.querySelector('h1').textContent")
    hits = await page.js("""return [...document.querySelectorAll('td.first-failing')]
        .map(td => [td.closest('tr').dataset.hostname, td.dataset.link])""")
    assert hits == [["nvl-02", "validation"]]
    colour = await page.js("""return getComputedStyle(document.querySelector(
        'td.first-failing')).outlineStyle""")
    assert colour == "solid"  # highlighted, as the stylesheet says (CSP allowed it)
    await page.shot("console-domain")
    await page.js("document.querySelector('tr[data-hostname=\"nvl-00\"] a').click()")
    await page.until("return document.body.dataset.page === 'node'")
    first = await page.js("return document.querySelector('.chain .first-failing').dataset.link")
    assert first == "domain"
    await page.shot("console-node-chain")


async def test_fabric_page_shows_the_ib_tree_slurm_blocks_and_topology_conf(
        driver: Any, shots: Path, aiohttp_client: Any, store: Store, world: SimWorld,
        make_node: Any) -> None:
    live = LiveTopology(store.topology, TopologySettings())
    async with running_api(aiohttp_client, store, world, topology=live) as api:
        page = Page(driver, api, shots)
        await nvl_domain(store, make_node, size=4, failing=1, prefix="gpu-node-", first=1)
        for i in range(5, 17):
            await make_node(NodeState.ACTIVE, hostname=f"gpu-node-{i:02d}", rack="r2")
        await store.topology.save("default", FAULTS.read_text(), reporter_node_id=None)
        await live.refresh()
        await page.sign_in(Role.VIEWER, "/ui/fabric")
        switches = await page.js(
            "return [...document.querySelectorAll('.switch > b')].map(e => e.textContent)")
        assert {"ib-spine-01", "ib-leaf-01", "ib-leaf-04"} <= set(switches)
        leaf_hosts = await page.js("""return [...document.querySelectorAll('.hosts li')]
            .map(e => e.dataset.hostname)""")
        # members only (02 failed validation); 16's cable is down in this scan
        assert set(leaf_hosts) == {f"gpu-node-{i:02d}" for i in range(1, 16)} - {"gpu-node-02"}
        issues = await page.js("return document.querySelector('.issues').innerText")
        assert "gpu-node-16" in issues
        conf = await page.js("return document.querySelector('pre.conf').textContent")
        assert "SwitchName=ib-leaf-01" in conf
        text = await page.js("return document.body.innerText")
        assert "gpu-node-02" in text and "validation failed" in text
        await page.shot("console-fabric")
        await page.open("/ui/nodes/gpu-node-05")  # active: its Slurm link names its block
        slurm = await page.js(
            "return document.querySelector('.chain [data-link=slurm] .evidence').textContent")
        assert "in the published topology: ib-leaf-02" in slurm
    await live.aclose()
