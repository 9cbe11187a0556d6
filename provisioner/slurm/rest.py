"""``SlurmClient`` over slurmrestd (aiohttp, JWT), negotiating the API version.

slurmrestd serves one path prefix per loaded OpenAPI plugin (``/slurm/v0.0.38/...`` on Slurm
22.05, ``v0.0.40``-``v0.0.44`` on 23.11-25.11) and answers 404 for the others. The client
reads the server's own listing (``GET /openapi/v3``), picks the newest version it knows,
confirms it with ``GET /slurm/vX/ping`` (probing newest-first when there is no listing) and
caches it; a 404 later (slurmrestd upgraded under us) negotiates again once.

v0.0.38 has no node update: drain/resume/delete go to ``writer`` (``ScontrolSlurm``). From
v0.0.40 on they are ``POST``/``DELETE /slurm/vX/node/NAME``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from pydantic import SecretStr

from provisioner.slurm.model import (
    SlurmAuthFailed,
    SlurmClient,
    SlurmNode,
    SlurmParseError,
    SlurmRejected,
    SlurmUnavailable,
)
from provisioner.slurm.parse import api_errors, nodes_from_openapi

log = logging.getLogger(__name__)
KNOWN_VERSIONS: Final = ("v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.39",
                         "v0.0.38", "v0.0.37")
_REST_WRITES: Final = frozenset(KNOWN_VERSIONS[:5])  # v0.0.40+: POST/DELETE node
_PATH_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")
_INVALID_NODE = 2018  # ESLURM_INVALID_NODE_NAME


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: Any  # parsed JSON, or the text when it is not JSON


class RestSlurm:
    def __init__(self, url: str, *, user: str | None, token: SecretStr | None = None,
                 token_file: Path | None = None, timeout_s: float = 30.0,
                 writer: SlurmClient | None = None,
                 versions: tuple[str, ...] = KNOWN_VERSIONS) -> None:
        if token is None and token_file is None:
            raise SlurmAuthFailed("slurmrestd needs a JWT: set slurm.jwt_token or "
                                  "slurm.jwt_token_file")
        self._url = url.rstrip("/")
        self._user = user
        self._token = token
        self._token_file = token_file
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._writer = writer
        self._versions = versions
        self._version: str | None = None
        self._lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None

    async def version(self) -> str:
        """The API version in use, negotiated on first use and cached."""
        if self._version is None:
            async with self._lock:
                if self._version is None:
                    self._version = await self._negotiate()
                    log.info("slurmrestd %s: using API %s", self._url, self._version)
        return self._version

    async def nodes(self) -> list[SlurmNode]:
        answer = await self._versioned("GET", "nodes")
        return nodes_from_openapi(self._checked(answer, "list nodes"))

    async def node(self, name: str) -> SlurmNode | None:
        answer = await self._versioned("GET", f"node/{name}")
        if _invalid_node(answer):
            return None
        found = nodes_from_openapi(self._checked(answer, f"get node {name}"))
        return next((n for n in found if n.name == name), None)

    async def drain(self, name: str, reason: str) -> None:
        await self._update(name, {"state": ["DRAIN"], "reason": reason}, "drain")

    async def resume(self, name: str) -> None:
        current = await self.node(name)
        if current is None or not current.draining and current.state != "DOWN":
            return
        await self._update(name, {"state": ["RESUME"]}, "resume")

    async def delete(self, name: str) -> bool:
        if await self.version() not in _REST_WRITES:
            return await self._write_delegate("delete").delete(name)
        answer = await self._versioned("DELETE", f"node/{name}")
        if _invalid_node(answer):
            return False
        self._checked(answer, f"delete node {name}")
        return True

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._writer is not None:
            await self._writer.aclose()

    async def _update(self, name: str, body: dict[str, Any], what: str) -> None:
        if await self.version() not in _REST_WRITES:
            writer = self._write_delegate(what)
            await (writer.drain(name, body["reason"]) if what == "drain"
                   else writer.resume(name))
            return
        answer = await self._versioned("POST", f"node/{name}", body)
        self._checked(answer, f"{what} node {name}")

    def _write_delegate(self, what: str) -> SlurmClient:
        if self._writer is None:
            raise SlurmRejected(f"slurmrestd API {self._version} cannot {what} a node and no "
                                "scontrol is configured (slurm.scontrol)")
        return self._writer

    async def _negotiate(self) -> str:
        offered = await self._offered()
        for version in self._versions:
            if offered is not None and version not in offered:
                continue
            answer = await self._call("GET", f"/slurm/{version}/ping")
            if answer.status == 200:
                return version
            if answer.status != 404:
                self._checked(answer, f"ping {version}")
        listing = ", ".join(sorted(offered)) if offered else "no listing"
        raise SlurmRejected(f"slurmrestd at {self._url} offers none of the API versions "
                            f"{', '.join(self._versions)} ({listing})")

    async def _offered(self) -> set[str] | None:
        """Versions in the server's OpenAPI listing; None when it has none to give."""
        for path in ("/openapi/v3", "/openapi"):
            answer = await self._call("GET", path)
            if answer.status == 200 and isinstance(answer.body, dict):
                paths = answer.body.get("paths")
                if isinstance(paths, dict):
                    return {m.group(1) for p in paths if (m := _PATH_VERSION.match(p))}
        return None

    async def _versioned(self, method: str, tail: str,
                         body: dict[str, Any] | None = None) -> _Answer:
        for attempt in range(2):
            version = await self.version()
            answer = await self._call(method, f"/slurm/{version}/{tail}", body)
            if answer.status == 404 and not isinstance(answer.body, dict) and attempt == 0:
                log.warning("slurmrestd %s: API %s gone, negotiating again", self._url, version)
                self._version = None
                continue
            return answer
        raise AssertionError("unreachable")

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
                    *, reload_token: bool = True) -> _Answer:
        headers = {"X-SLURM-USER-TOKEN": await self._jwt(), "Accept": "application/json"}
        if self._user:
            headers["X-SLURM-USER-NAME"] = self._user
        with _mapped(f"{method} {self._url}{path}"):
            async with self._session().request(method, self._url + path, headers=headers,
                                               json=body) as resp:
                text = await resp.text()
                status = resp.status
        try:
            answer = _Answer(status, json.loads(text))
        except ValueError:
            answer = _Answer(status, text)
        refused = status in (401, 403) or _maybe_refused(answer)
        if refused and reload_token and self._token_file is not None:
            self._token = None  # the file may hold a renewed token
            return await self._call(method, path, body, reload_token=False)
        if status in (401, 403):
            raise SlurmAuthFailed(f"slurmrestd {self._url} refused the JWT for user "
                                  f"{self._user or '(from token)'}: HTTP {status}")
        return answer

    def _checked(self, answer: _Answer, what: str) -> dict[str, Any]:
        errors = api_errors(answer.body)
        if answer.status >= 500:
            hint = (" (Slurm 22.05 answers a refused JWT this way too: check the token and "
                    "slurm.user)") if _maybe_refused(answer) else ""
            raise SlurmUnavailable(f"slurmrestd {what}: HTTP {answer.status}: "
                                   f"{'; '.join(errors) or str(answer.body)[:200]}{hint}")
        if answer.status >= 400 or errors:
            raise SlurmRejected(f"slurmrestd {what}: HTTP {answer.status}: "
                                f"{'; '.join(errors) or str(answer.body)[:200]}")
        if not isinstance(answer.body, dict):
            raise SlurmParseError(f"slurmrestd {what}: answer is not a JSON object")
        return answer.body

    async def _jwt(self) -> str:
        if self._token is None:
            assert self._token_file is not None
            path = self._token_file
            try:
                text = await asyncio.to_thread(path.read_text)
            except OSError as exc:
                raise SlurmAuthFailed(f"JWT file {path}: {exc.strerror}") from exc
            token = text.strip().removeprefix("SLURM_JWT=")
            if not token:
                raise SlurmAuthFailed(f"JWT file {path} is empty")
            self._token = SecretStr(token)
        return self._token.get_secret_value()

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        return self._http


def _maybe_refused(answer: _Answer) -> bool:
    """slurmrestd v0.0.38 turns slurmctld's "Protocol authentication error" (a bad or foreign
    JWT) into HTTP 500 with errno -1 and nothing more specific."""
    if answer.status != 500 or not isinstance(answer.body, dict):
        return False
    errors = answer.body.get("errors") or []
    return bool(errors) and all(
        isinstance(e, dict) and e.get("errno", e.get("error_number")) == -1 for e in errors)


def _invalid_node(answer: _Answer) -> bool:
    if not isinstance(answer.body, dict):
        return False
    for err in answer.body.get("errors") or []:
        if isinstance(err, dict) and (
                err.get("errno", err.get("error_number")) == _INVALID_NODE
                or "invalid node name" in str(err.get("error", "")).lower()
                or "invalid node name" in str(err.get("description", "")).lower()):
            return True
    return False


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """aiohttp's exceptions never leave this module."""
    try:
        yield
    except TimeoutError as exc:
        raise SlurmUnavailable(f"{what}: timed out") from exc
    except aiohttp.ClientError as exc:
        raise SlurmUnavailable(f"{what}: {exc}") from exc
