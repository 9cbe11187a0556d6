"""The ``redfish`` driver: aiohttp, no threads.

One Redfish session per BMC for the process lifetime: a SessionService login whose
``X-Auth-Token`` every request reuses, one re-login on a 401 (the BMC expired it), and a
DELETE of the session when the driver closes. A BMC without a SessionService gets HTTP
basic auth. The System is discovered once (its URI and its Reset target); the System
resource itself is read fresh each time, as power and boot settings change under us.

Vendor quirks tolerated: power actions that show seconds later (read-back confirmation
in ``base.ensure_power`` polls for them), boot overrides as each BMC offers them
(``redfish_boot.py``: ``Once``/``Continuous``, ``UefiHttp`` with ``HttpBootUri``, network
boot where there is no HTTP boot), ETags answered with ``If-Match``. The endpoint is a
host (``https://host[:port]``) or a base URL (``http://127.0.0.1:8000`` for emulators). TLS
is verified unless turned off (``bmc.redfish_verify_tls``) or given a CA bundle.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from provisioner.bmc.base import (
    BmcAuthFailed,
    BmcHealth,
    BmcUnsupported,
    BootDevice,
    BootSetting,
    PowerCycleUnsupported,
    PowerState,
)
from provisioner.bmc.redfish_boot import boot_patch, hides_uefi_http, read_boot
from provisioner.bmc.redfish_errors import _check, map_http_errors
from provisioner.bmc.redfish_health import read_health
from provisioner.bmc.redfish_reset import PREFERENCE, Intent, candidates, off_then_on, offered
from provisioner.domain import BmcCredentials, BmcEndpoint
from provisioner.errors import DriverError

log = logging.getLogger(__name__)

JsonObject = dict[str, object]
_ROOT: Final = "/redfish/v1/"
# PoweringOn is not on yet, PoweringOff not off yet: read-back keeps polling
_POWER: Final = {"On": PowerState.ON, "PoweringOff": PowerState.ON,
                 "Off": PowerState.OFF, "PoweringOn": PowerState.OFF}


def base_url(endpoint: BmcEndpoint) -> str:
    address = endpoint.address.rstrip("/")
    if address.startswith(("http://", "https://")):
        return address
    host = f"[{address}]" if ":" in address else address
    return f"https://{host}:{endpoint.port}" if endpoint.port else f"https://{host}"


class RedfishDriver:
    """The ``redfish`` BmcFactory: one HTTP client for all BMCs, one session per BMC."""

    def __init__(self, *, timeout_s: float, verify_tls: bool = True,
                 ca_file: Path | None = None) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._timeout_s = timeout_s
        self._ssl: ssl.SSLContext | bool = True
        if not verify_tls:
            self._ssl = False
        elif ca_file is not None:
            self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._http: aiohttp.ClientSession | None = None
        self._clients: dict[str, RedfishClient] = {}

    def __call__(self, node_id: str, endpoint: BmcEndpoint,
                 credentials: BmcCredentials) -> RedfishBmc:
        url = base_url(endpoint)
        client = self._clients.get(url)
        if client is None or client.credentials != credentials:
            client = self._clients[url] = RedfishClient(self, url, credentials)
        return RedfishBmc(client)

    @property
    def clients(self) -> Mapping[str, RedfishClient]:
        return self._clients

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:  # created on first use, inside the running loop
            connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl)
            self._http = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._http

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def client_timeout(self) -> aiohttp.ClientTimeout:
        return self._timeout

    async def aclose(self) -> None:
        """Log every session out (DELETE), then close the connections."""
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.logout() for client in clients), return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None


@dataclass(slots=True)
class _System:
    uri: str
    reset_uri: str
    reset_types: tuple[str, ...]


class RedfishClient:
    """One BMC: its session token and discovered System; requests with error mapping."""

    def __init__(self, driver: RedfishDriver, url: str, credentials: BmcCredentials) -> None:
        self._driver = driver
        self.url = url
        self.credentials = credentials
        self._token: str | None = None
        self._session_uri: str | None = None
        self._basic = False
        self._login_lock = asyncio.Lock()
        self._system: _System | None = None
        self.logins = 0

    async def request(self, method: str, path: str, body: JsonObject | None = None, *,
                      etag: str | None = None) -> tuple[JsonObject, str | None]:
        """(JSON body or {}, ETag). Logs in first if needed; re-logs in once on a 401."""
        status, data, headers = await self.exchange(method, path, body, etag=etag)
        _check(status, data, self.url, f"{method} {path}")
        return data, headers.get("ETag")

    async def exchange(self, method: str, path: str, body: JsonObject | None = None, *,
                       etag: str | None = None, form: aiohttp.MultipartWriter | None = None,
                       ) -> tuple[int, JsonObject, Mapping[str, str]]:
        """(status, body, headers) for a caller that judges the status itself (a task
        monitor's 202 and 404, an action's Location header); errors above 500 map.
        ``form``: a multipart body sent instead of ``body`` (a firmware push; streamed,
        no total time limit, only each read's)."""
        with map_http_errors(self.url, f"{method} {path}", self._driver.timeout_s):
            await self._ensure_login()
            token = self._token
            extra = {"If-Match": etag} if etag else {}
            status, data, headers = await self._raw(method, path, body, headers=extra, form=form)
            if status == 401 and not self._basic:
                log.info("redfish %s: session expired; logging in again", self.url)
                await self._login(stale=token)
                status, data, headers = await self._raw(method, path, body, headers=extra,
                                                        form=form)
            if status in (401, 403) or status >= 500:
                _check(status, data, self.url, f"{method} {path}")
            return status, data, headers

    async def system(self) -> _System:
        if self._system is None:
            members, _ = await self.request("GET", "/redfish/v1/Systems")
            first = _first_member(members, self.url)
            resource, _ = await self.request("GET", first)
            reset = _dig(resource, "Actions", "#ComputerSystem.Reset")
            if not isinstance(reset, dict) or not isinstance(reset.get("target"), str):
                raise BmcUnsupported(f"BMC {self.url}: System {first} has no Reset action")
            allowed = reset.get("ResetType@Redfish.AllowableValues")
            if not isinstance(allowed, list):
                allowed = await self._action_info(reset.get("@Redfish.ActionInfo"))
            self._system = _System(first, str(reset["target"]), offered(allowed))
        return self._system

    async def _action_info(self, uri: object) -> list[object]:
        """ResetType's allowable values from an ActionInfo resource (Supermicro lists them
        only there); [] when there is none or it cannot be read (every type is tried)."""
        if not isinstance(uri, str):
            return []
        try:
            info, _ = await self.request("GET", uri)
        except BmcUnsupported:
            return []
        params = info.get("Parameters")
        for param in params if isinstance(params, list) else []:
            if isinstance(param, dict) and param.get("Name") == "ResetType":
                values = param.get("AllowableValues")
                return values if isinstance(values, list) else []
        return []

    def forget_session(self) -> None:
        self._token = self._session_uri = None

    async def logout(self) -> None:
        if self._session_uri is None:
            return
        uri, self._session_uri = self._session_uri, None
        with map_http_errors(self.url, "logout", self._driver.timeout_s):
            await self._send("DELETE", uri, None, None)
        self._token = None

    async def _ensure_login(self) -> None:
        if self._token is None and not self._basic:
            await self._login(stale=None)

    async def _login(self, *, stale: str | None) -> None:
        """Log in unless a token other than ``stale`` exists (another request did it)."""
        async with self._login_lock:
            if self._basic or (self._token is not None and self._token != stale):
                return
            user, password = self.credentials.username, self.credentials.password
            if user is None or password is None:
                raise BmcAuthFailed(f"BMC {self.url}: no Redfish credentials (set them on "
                                    "the node, an inventory import, or bmc.default_*)")
            if self.credentials.site_default and self.url.startswith("http://"):
                # a login (or basic auth) over plain http shows the password to the
                # network: only a password entered for this very endpoint may go there
                raise BmcAuthFailed(f"BMC {self.url}: the site default credentials are not "
                                    "sent over plain http; enroll this BMC's own password "
                                    "or use https")
            sessions = await self._sessions_uri()
            if sessions is None:
                self._basic = True
                log.info("redfish %s: no SessionService; using basic auth", self.url)
                return
            status, data, headers = await self._raw("POST", sessions,
                                                    {"UserName": user, "Password": password})
            if status in (401, 403):
                raise BmcAuthFailed(f"BMC {self.url}: login refused (HTTP {status}): wrong "
                                    "user or password")
            _check(status, data, self.url, "login")
            self._token = headers.get("X-Auth-Token")
            self._session_uri = _path(headers.get("Location") or str(data.get("@odata.id", "")))
            if not self._token:
                raise BmcUnsupported(f"BMC {self.url}: login answered without X-Auth-Token")
            self.logins += 1
            log.debug("redfish %s: session %s", self.url, self._session_uri)

    async def _sessions_uri(self) -> str | None:
        status, root, _ = await self._raw("GET", _ROOT, None, auth=False)
        _check(status, root, self.url, "GET /redfish/v1/")
        sessions = _dig(root, "Links", "Sessions", "@odata.id")
        return str(sessions) if isinstance(sessions, str) else None

    async def _send(self, method: str, path: str, body: JsonObject | None,
                    etag: str | None) -> tuple[int, JsonObject, str | None]:
        extra = {"If-Match": etag} if etag else {}
        status, data, headers = await self._raw(method, path, body, headers=extra)
        return status, data, headers.get("ETag")

    async def _raw(self, method: str, path: str, body: JsonObject | None, *,
                   auth: bool = True, headers: Mapping[str, str] | None = None,
                   form: aiohttp.MultipartWriter | None = None,
                   ) -> tuple[int, JsonObject, Mapping[str, str]]:
        sent = {"Accept": "application/json", "OData-Version": "4.0", **(headers or {})}
        if auth and self._token:
            sent["X-Auth-Token"] = self._token
        elif auth and self._basic:
            pair = f"{self.credentials.username or ''}:{self.credentials.password or ''}"
            sent["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        each = self._driver.timeout_s
        async with self._driver.http().request(
                method, self.url + path, json=None if form else body, data=form, headers=sent,
                timeout=aiohttp.ClientTimeout(sock_connect=each, sock_read=each) if form
                else self._driver.client_timeout) as response:
            data: JsonObject = {}
            if response.status != 204 and response.content_type.endswith("json"):
                try:
                    parsed = await response.json()
                except ValueError:  # an error page labelled JSON (sushy-tools): its status
                    if response.status < 400:  # decides, its text is the message
                        raise
                    parsed = {"error": {"message": (await response.text())[:200]}}
                data = parsed if isinstance(parsed, dict) else {}
            else:
                await response.read()
            return response.status, data, response.headers


class RedfishBmc:
    def __init__(self, client: RedfishClient) -> None:
        self._client = client

    @property
    def client(self) -> RedfishClient:
        return self._client

    async def power_state(self) -> PowerState:
        resource = await self._resource()
        state = resource.get("PowerState")
        if not isinstance(state, str) or state not in _POWER:
            raise BmcUnsupported(f"BMC {self._client.url}: unknown PowerState {state!r}")
        return _POWER[state]

    async def set_power(self, state: PowerState, *, soft: bool = False) -> None:
        if state is PowerState.ON:
            await self._reset(Intent.ON)
        else:
            await self._reset(Intent.SOFT_OFF if soft else Intent.OFF)

    async def power_cycle(self) -> None:
        await self._reset(Intent.CYCLE)

    async def set_boot_device(self, device: BootDevice, *, persistent: bool = False,
                              uefi: bool = True, http_uri: str | None = None) -> None:
        system = await self._client.system()
        resource, etag = await self._client.request("GET", system.uri)
        boot = resource.get("Boot")
        if device is BootDevice.HTTP and isinstance(boot, dict) and hides_uefi_http(boot):
            # some BMCs (sushy-tools) list UefiHttp only while the override mode is UEFI
            log.info("redfish %s: boot mode %s; switching to UEFI to see UefiHttp",
                     self._client.url, boot.get("BootSourceOverrideMode"))
            await self._client.request("PATCH", system.uri,
                                       {"Boot": {"BootSourceOverrideMode": "UEFI"}}, etag=etag)
            resource, etag = await self._client.request("GET", system.uri)
            boot = resource.get("Boot")
        patch = boot_patch(boot if isinstance(boot, dict) else {}, device,
                           persistent=persistent, uefi=uefi, http_uri=http_uri,
                           where=self._client.url)
        for note in patch.notes:
            log.info("redfish %s: %s", self._client.url, note)
        try:
            await self._client.request("PATCH", system.uri, {"Boot": patch.body}, etag=etag)
        except BmcUnsupported as exc:
            if "HttpBootUri" not in patch.body:
                raise
            # some BMCs show HttpBootUri but refuse to set it (sushy-tools' fake driver,
            # read-only firmware settings): UEFI HTTP boot with the URI from DHCP
            log.info("redfish %s: HttpBootUri refused (%s); the firmware takes the boot "
                     "file URI from DHCP", self._client.url, exc)
            body = {k: v for k, v in patch.body.items() if k != "HttpBootUri"}
            _, etag = await self._client.request("GET", system.uri)
            await self._client.request("PATCH", system.uri, {"Boot": body}, etag=etag)

    async def boot_device(self) -> BootSetting:
        boot = (await self._resource()).get("Boot")
        return read_boot(boot if isinstance(boot, dict) else {})

    async def set_password(self, new_password: str) -> None:
        """PATCH ``Password`` of our user's ManagerAccount (AccountService, found by
        ``UserName``), with the account's ETag."""
        client = self._client
        root, _ = await client.request("GET", _ROOT)
        service = _dig(root, "AccountService", "@odata.id")
        if not isinstance(service, str):
            raise BmcUnsupported(f"BMC {client.url}: no AccountService")
        accounts = _dig((await client.request("GET", service))[0], "Accounts", "@odata.id")
        if not isinstance(accounts, str):
            raise BmcUnsupported(f"BMC {client.url}: AccountService lists no Accounts")
        members = (await client.request("GET", accounts))[0].get("Members")
        for member in members if isinstance(members, list) else []:
            uri = member.get("@odata.id") if isinstance(member, dict) else None
            if not isinstance(uri, str):
                continue
            account, etag = await client.request("GET", uri)
            if account.get("UserName") == client.credentials.username:
                await client.request("PATCH", uri, {"Password": new_password}, etag=etag)
                return
        raise BmcUnsupported(f"BMC {client.url}: no account named "
                             f"{client.credentials.username!r} in {accounts}")

    async def verify_login(self) -> None:
        """Drop the kept session, log in again, read the System (basic auth: the read is
        the login)."""
        with contextlib.suppress(DriverError):
            await self._client.logout()
        self._client.forget_session()
        await self.power_state()

    async def read_health(self, cursor: str | None) -> BmcHealth:  # redfish_health.py
        return await read_health(self._client, cursor)

    async def aclose(self) -> None:
        """Nothing: the BMC's session is kept for the process (``RedfishDriver.aclose``)."""

    async def _resource(self) -> JsonObject:
        system = await self._client.system()
        resource, _ = await self._client.request("GET", system.uri)
        return resource

    async def _reset(self, intent: Intent) -> None:
        """The best ResetType the BMC offers for ``intent``; one it refuses as invalid
        (a 4xx) moves on to the next candidate."""
        system = await self._client.system()
        kinds = candidates(intent, system.reset_types)
        cycle_by_off_on = intent is Intent.CYCLE and off_then_on(system.reset_types)
        if not kinds:
            error = PowerCycleUnsupported if cycle_by_off_on else BmcUnsupported
            raise error(f"BMC {self._client.url}: no ResetType for {intent} "
                        f"(offered: {', '.join(system.reset_types)})")
        refused: list[str] = []
        for kind in kinds:
            try:
                await self._client.request("POST", system.reset_uri, {"ResetType": kind})
            except BmcUnsupported as exc:
                refused.append(f"{kind}: {exc}")
                continue
            if kind != PREFERENCE[intent][0]:
                log.info("redfish %s: %s by ResetType %s", self._client.url, intent, kind)
            return
        error = PowerCycleUnsupported if cycle_by_off_on else BmcUnsupported
        raise error(f"BMC {self._client.url}: every ResetType for {intent} refused "
                    f"({'; '.join(refused)})")


def _dig(data: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _path(uri: str) -> str | None:
    if not uri:
        return None
    return "/" + uri.split("://", 1)[-1].split("/", 1)[-1] if "://" in uri else uri


def _first_member(collection: JsonObject, url: str) -> str:
    members = collection.get("Members")
    if isinstance(members, list) and members and isinstance(members[0], dict):
        uri = members[0].get("@odata.id")
        if isinstance(uri, str):
            return uri
    raise BmcUnsupported(f"BMC {url}: no ComputerSystem in /redfish/v1/Systems")
