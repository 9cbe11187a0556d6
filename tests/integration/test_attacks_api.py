"""Attacks on the REST API, the console and BMC credentials (issue 23, finding 8 and the
"Low" items), each against a real ``provisioner serve`` with real clients: the CLI,
``curl``, aiohttp, raw sockets. Each fails on acb1ab8 and passes after the fix.

- API tokens expire (a site default and a per-token lifetime), are listed without their
  secrets and revoked at once; what changes credentials (tokens, BMC rotation, a known
  node's BMC) needs ``admin``.
- A BMC re-pointed by an import never receives the stored password; the site default
  password is never sent to a Redfish BMC over plain http.
- Malformed HTTP is one rate-limited warning line, not a traceback per request.
- The console's sign-in form refuses a cross-origin POST (login CSRF).
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.test_cli_api import Daemon, clean_env, running_daemon
from tests.peers.ports import free_tcp_port

pytestmark = pytest.mark.e2e

BMC_PASSWORD = "Enrolled-BMC-pw-0x41"
SITE_PASSWORD = "Site-default-pw-0x42"
BOOT_PORT = free_tcp_port()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    settings = ("[lifecycle]\nauto_inspect = false\nauto_deploy = false\n\n"
                f'[http]\nlisten = "127.0.0.1:{BOOT_PORT}"\n\n'
                '[boot]\nramdisk_build = "off"\n\n'
                f'[bmc]\ndefault_username = "site"\ndefault_password = "{SITE_PASSWORD}"\n'
                "timeout_s = 3\nretries = 0\npower_sync_interval_s = 0\n")
    with running_daemon(tmp_path_factory.mktemp("attacks-api"), settings) as running:
        yield running


def cli(daemon: Daemon, *args: str, config: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "provisioner", "--config", str(config or daemon.config), *args],
        capture_output=True, text=True, timeout=60, env=clean_env(), check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def new_token(daemon: Daemon, role: str, name: str, *extra: str,
              config: Path | None = None) -> str:
    done = cli(daemon, "token", "create", "--role", role, "--name", name, *extra,
               config=config)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def call(daemon: Daemon, method: str, path: str, token: str | None,
         body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(daemon.url + path, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def admin(daemon: Daemon) -> str:
    return new_token(daemon, "admin", "attacks-admin")


# -- API tokens -----------------------------------------------------------------------------


def test_tokens_are_listed_without_secrets_and_revoked_at_once(daemon: Daemon,
                                                               admin: str) -> None:
    viewer = new_token(daemon, "viewer", "attacks-viewer", "--expires-in", "2h")
    listed = cli(daemon, "token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    names = {t["name"]: t for t in json.loads(listed.stdout)}
    assert {"attacks-admin", "attacks-viewer"} <= set(names)
    assert viewer not in listed.stdout and admin not in listed.stdout
    status, page = call(daemon, "GET", "/api/v1/tokens", admin)
    assert status == 200 and viewer not in json.dumps(page) and admin not in json.dumps(page)
    assert "token_hash" not in json.dumps(page)
    assert {t["name"] for t in page["items"]} >= {"attacks-admin", "attacks-viewer"}
    # revoked through the API: 401 from the next request on
    assert call(daemon, "GET", "/api/v1/nodes", viewer)[0] == 200
    status, revoked = call(daemon, "DELETE",
                           f"/api/v1/tokens/{names['attacks-viewer']['id']}", admin)
    assert status == 200 and revoked["name"] == "attacks-viewer"
    assert call(daemon, "GET", "/api/v1/nodes", viewer)[0] == 401
    # created through the API (its secret in that response only), revoked with the CLI
    status, created = call(daemon, "POST", "/api/v1/tokens", admin,
                           {"name": "attacks-api-made", "role": "operator"})
    assert status == 201 and created["token"].startswith("pvt_"), created
    assert call(daemon, "GET", "/api/v1/nodes", created["token"])[0] == 200
    status, page = call(daemon, "GET", "/api/v1/tokens", admin)
    assert created["token"] not in json.dumps(page)
    done = cli(daemon, "token", "revoke", "attacks-api-made")
    assert done.returncode == 0, done.stderr
    assert call(daemon, "GET", "/api/v1/nodes", created["token"])[0] == 401
    assert cli(daemon, "token", "revoke", "attacks-api-made").returncode == 1


def test_tokens_expire_by_default_and_by_their_own_lifetime(daemon: Daemon,
                                                            admin: str) -> None:
    now = datetime.now(UTC)
    status, made = call(daemon, "POST", "/api/v1/tokens", admin,
                        {"name": "attacks-default-life", "role": "viewer"})
    assert status == 201
    default_expiry = datetime.fromisoformat(made["expires_at"])
    assert abs(default_expiry - (now + timedelta(days=90))) < timedelta(minutes=5)
    status, made = call(daemon, "POST", "/api/v1/tokens", admin,
                        {"name": "attacks-own-life", "role": "viewer", "expires_in_s": 3600})
    assert status == 201
    assert abs(datetime.fromisoformat(made["expires_at"]) - (now + timedelta(hours=1))) \
        < timedelta(minutes=5)
    # a site whose default lifetime is 3 s: the token works, then is refused
    short = daemon.root / "short-lived.toml"
    short.write_text(daemon.config.read_text().replace(
        "[api]\n", "[api]\ntoken_lifetime_days = 0.000035\n", 1))
    brief = new_token(daemon, "viewer", "attacks-brief", config=short)
    assert call(daemon, "GET", "/api/v1/nodes", brief)[0] == 200
    time.sleep(3.5)
    status, problem = call(daemon, "GET", "/api/v1/nodes", brief)
    assert status == 401 and "expired" in problem["detail"]
    never = new_token(daemon, "viewer", "attacks-never", "--no-expiry")
    assert never.startswith("pvt_")
    listed = {t["name"]: t for t in json.loads(cli(daemon, "token", "list", "--json").stdout)}
    assert listed["attacks-never"]["expires_at"] is None
    assert listed["attacks-brief"]["expires_at"] is not None


def test_credentials_tokens_and_bmc_changes_need_admin(daemon: Daemon, admin: str) -> None:
    operator = new_token(daemon, "operator", "attacks-operator")
    for method, path, body in (("GET", "/api/v1/tokens", None),
                               ("POST", "/api/v1/tokens", {"name": "x", "role": "admin"})):
        status, problem = call(daemon, method, path, operator, body)
        assert status == 403 and "admin" in problem["detail"], (path, problem)
    status, node = call(daemon, "POST", "/api/v1/nodes", operator, {
        "serial": "ATK-ADMIN-1", "bmc": {"driver": "fake", "address": "SIM-ADMIN-1",
                                         "username": "root", "password": BMC_PASSWORD}})
    assert status == 201  # enrolling a new machine with its BMC stays an operator's act
    status, problem = call(daemon, "POST", f"/api/v1/nodes/{node['id']}/bmc/rotate", operator)
    assert status == 403 and "admin" in problem["detail"]
    # an operator's import may not re-point a known node's BMC
    csv = "serial,bmc_driver,bmc_address,bmc_username\nATK-ADMIN-1,fake,SIM-EVIL,root\n"
    status, report = call(daemon, "POST", "/api/v1/inventory/import", operator, csv,
                          "text/csv")
    assert status == 200 and report["updated"] == [], report
    assert "admin" in report["errors"][0]
    status, shown = call(daemon, "GET", f"/api/v1/nodes/{node['id']}", operator)
    assert shown["bmc"]["address"] == "SIM-ADMIN-1" and shown["bmc"]["password_set"]
    # the same row unchanged (a re-import) is fine for an operator
    same = "serial,bmc_driver,bmc_address,bmc_username\nATK-ADMIN-1,fake,SIM-ADMIN-1,root\n"
    status, report = call(daemon, "POST", "/api/v1/inventory/import", operator, same,
                          "text/csv")
    assert status == 200 and report["updated"] == [] and report["errors"] == [], report


# -- BMC credentials never follow a re-pointed or untrusted address -------------------------


class CredentialTrap:
    """An HTTP server posing as a Redfish BMC without a SessionService (so a client falls
    back to basic auth): it records every Authorization header and body it receives."""

    def __init__(self) -> None:
        seen = self.seen = []  # type: list[str]

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode(errors="replace") if length else ""
                seen.append(f"{self.headers.get('Authorization', '')} {body}")
                payload = json.dumps({"@odata.id": "/redfish/v1/", "Links": {}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def got(self, password: str) -> bool:
        encoded = base64.b64encode(f"root:{password}".encode()).decode()
        site = base64.b64encode(f"site:{password}".encode()).decode()
        return any(password in line or encoded in line or site in line for line in self.seen)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trap() -> Iterator[CredentialTrap]:
    trap = CredentialTrap()
    yield trap
    trap.close()


def test_a_repointed_bmc_never_gets_the_stored_password(daemon: Daemon, admin: str,
                                                        trap: CredentialTrap) -> None:
    status, node = call(daemon, "POST", "/api/v1/nodes", admin, {
        "serial": "ATK-REPOINT", "bmc": {"driver": "redfish", "address": "https://127.0.0.2:9",
                                         "username": "root", "password": BMC_PASSWORD}})
    assert status == 201
    row = f"serial,bmc_driver,bmc_address,bmc_username\nATK-REPOINT,redfish,{trap.url},root\n"
    status, report = call(daemon, "POST", "/api/v1/inventory/import", admin, row, "text/csv")
    assert status == 200, report
    assert report["updated"] == [] and "bmc_password" in report["errors"][0], report
    call(daemon, "POST", f"/api/v1/nodes/{node['id']}/power", admin, {"action": "status"})
    assert not trap.got(BMC_PASSWORD), trap.seen
    status, shown = call(daemon, "GET", f"/api/v1/nodes/{node['id']}", admin)
    assert shown["bmc"]["address"] == "https://127.0.0.2:9"


def test_the_site_default_password_never_goes_over_plain_http(daemon: Daemon, admin: str,
                                                              trap: CredentialTrap) -> None:
    status, node = call(daemon, "POST", "/api/v1/nodes", admin, {
        "serial": "ATK-SITE-DEFAULT", "bmc": {"driver": "redfish", "address": trap.url}})
    assert status == 201
    status, problem = call(daemon, "POST", f"/api/v1/nodes/{node['id']}/power", admin,
                           {"action": "status"})
    assert status == 502 and "plain http" in problem["detail"], problem
    assert not trap.got(SITE_PASSWORD), trap.seen


# -- malformed HTTP ---------------------------------------------------------------------------


GARBAGE = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)),  # TLS hello
           b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
           b"GET /\x00 HTTP/1.1\r\n\r\n",
           b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
           b"G\xffT / HTTP/1.1\r\n\r\n")


def _send_garbage(port: int, count: int) -> None:
    for i in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(GARBAGE[i % len(GARBAGE)])
            sock.shutdown(socket.SHUT_WR)
            try:
                while sock.recv(4096):
                    pass
            except OSError:
                pass


def test_malformed_http_is_a_bounded_warning_not_a_traceback_per_request(
        daemon: Daemon) -> None:
    api_port = int(daemon.url.rpartition(":")[2])
    before = daemon.log.read_text().count("\n")
    for port in (api_port, BOOT_PORT):
        _send_garbage(port, 100)
    time.sleep(0.5)
    added = daemon.log.read_text().splitlines()[before:]
    assert not any("Traceback" in line or "ERROR" in line for line in added), added[:40]
    assert len(added) <= 10, added
    assert any("malformed HTTP request" in line for line in added), added
    # the servers still answer
    with urllib.request.urlopen(f"{daemon.url}/healthz", timeout=5) as response:
        assert response.status == 200


# -- the console's sign-in form -----------------------------------------------------------------


async def test_a_cross_origin_sign_in_is_refused(daemon: Daemon) -> None:
    token = new_token(daemon, "viewer", "attacks-console")
    form = {"token": token, "next": "/ui/"}
    async with aiohttp.ClientSession() as session:
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"},
                        {"Referer": "http://evil.example/page.html"}):
            async with session.post(f"{daemon.url}/ui/signin", data=form, headers=headers,
                                    allow_redirects=False) as response:
                assert response.status == 403, headers
                assert "Set-Cookie" not in response.headers
        async with session.post(f"{daemon.url}/ui/signin", data=form,
                                headers={"Origin": daemon.url, "Sec-Fetch-Site": "same-origin"},
                                allow_redirects=False) as response:
            assert response.status == 303 and "pv_session=" in response.headers["Set-Cookie"]


def test_curl_cross_origin_sign_in_is_refused(daemon: Daemon) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    token = new_token(daemon, "viewer", "attacks-curl")
    done = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
         "Origin: https://attacker.example", "--data-urlencode", f"token={token}",
         f"{daemon.url}/ui/signin"], capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout == "403", done
