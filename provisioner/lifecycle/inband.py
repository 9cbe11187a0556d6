"""The in-band health source (issue 24): each node's OS runs a probe on a systemd timer
(``playbooks/roles/health_probe``) that posts its evidence to the boot HTTP server's
``POST /agent/v1/health``; here it is checked, read (``health.inband``, the same
classifiers as ``provisioner health classify``) and reported through ``HealthFindings``
with origin ``in-band``. Why push and not an SSH pull: docs/architecture.md, "In-band
health".

Who is speaking: the probe token alone names the node, never the payload. A probe token
(``probe:<node>:…``) is single-purpose (this route only; the other agent routes refuse it),
delivered to the node over Ansible's SSH (``health-probe.yml``), never on a boot script, and
accepted only from the address the daemon reaches the node at (``facts.address``: the one
our DHCP server bound, or the deployed OS's callback came from). A stolen one can report
findings of that one node from that one address, no more; the breaker caps what drains.

Per node: one post at a time, none closer than ``health.probe_min_interval_s`` to the last
(``ProbeTooSoon``: 429), and the cursor (``health_cursor``, source ``in-band``) so a log line
is never raised twice, even across restarts.

A fleet posts every period, so a quiet post must cost little (docs/performance.md): the
probe token (``CACHE_S``; a revoked one may work that long), the node's address and state
(``CACHE_S``) and its cursor (written through, ``CURSOR_CACHE_S``: a post another daemon
took meanwhile may be read again, which reports an open finding as seen, nothing more) are
kept in memory; an unchanged post writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from provisioner.config.health import HealthSettings
from provisioner.domain import Role, TokenInfo
from provisioner.errors import NotFound, ProvisionerError
from provisioner.health import inband
from provisioner.health.model import HealthClass
from provisioner.health.records import Origin, Report
from provisioner.lifecycle.health import OBSERVED_STATES, HealthFindings
from provisioner.store.repo import NodeRepo
from provisioner.store.tokens import TokenRepo, hash_token

log = logging.getLogger(__name__)

PROBE_TOKEN_PREFIX: Final = "probe:"
CACHE_S: Final = 30.0
CURSOR_CACHE_S: Final = 300.0
MAX_CACHED: Final = 200_000
SOURCE: Final = str(Origin.IN_BAND)
ACTOR: Final = "inband-probe"


class ProbeRefused(ProvisionerError):
    """Not a probe token, or not from the node's address (403)."""


class ProbeTooSoon(ProvisionerError):
    """A post closer to the last than ``probe_min_interval_s`` (429)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def is_probe_token(info: TokenInfo) -> bool:
    return info.name.startswith(PROBE_TOKEN_PREFIX)


async def issue_probe_token(tokens: TokenRepo, node_id: str, ttl_s: float, *,
                            now: datetime | None = None) -> str:
    """A probe token for the node (``health-probe.yml`` writes it, mode 0600)."""
    expires = (now or datetime.now(UTC)) + timedelta(seconds=ttl_s)
    _, token = await tokens.create(f"{PROBE_TOKEN_PREFIX}{node_id}:{secrets.token_hex(4)}",
                                   Role.AGENT, node_id=node_id, expires_at=expires)
    return token


class InbandIntake:
    def __init__(self, repo: NodeRepo, tokens: TokenRepo, health: HealthFindings,
                 settings: HealthSettings, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._repo = repo
        self._tokens = tokens
        self._health = health
        self._settings = settings
        self._monotonic = monotonic
        self._now = now
        self._last: dict[str, float] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._known: dict[str, tuple[float, TokenInfo]] = {}  # token hash ->
        self._nodes: dict[str, tuple[float, str, str]] = {}  # node -> (until, address, state)
        self._cursors: dict[str, tuple[float, str | None]] = {}

    async def authenticate(self, token: str) -> TokenInfo | None:
        """The probe token's info; None when it is unknown, expired or not a probe token."""
        digest, now = hash_token(token), self._monotonic()
        cached = self._known.get(digest)
        if cached is None or cached[0] < now:
            info = await self._tokens.lookup(token)
            if info is None or info.role is not Role.AGENT or not is_probe_token(info):
                return None
            cached = (now + CACHE_S, info)
            _put(self._known, digest, cached)
        info = cached[1]
        if info.expires_at is not None and _aware(info.expires_at) <= self._now():
            return None
        return info

    async def issue_token(self, node_id: str) -> str:
        return await issue_probe_token(self._tokens, node_id,
                                       self._settings.probe_token_ttl_s, now=self._now())

    async def accept(self, info: TokenInfo, remote: str | None, body: object
                     ) -> dict[str, Any]:
        """One post: checked, read, reported; the answer tells the probe where to start."""
        if not is_probe_token(info) or info.node_id is None:
            raise ProbeRefused("not a probe token: /agent/v1/health takes only those")
        node_id = info.node_id
        address, state = await self._node(node_id)
        if not address or remote != address:
            raise ProbeRefused(f"probe token of node {node_id} used from {remote or '?'}; it "
                               f"is bound to {address or 'no address (facts.address unset)'}")
        evidence = inband.parse(body)  # before the budget: a malformed post costs no slot
        async with self._locks[node_id]:
            self._admit(node_id)
            if state not in OBSERVED_STATES:
                return {"accepted": False, "reason": f"node is {state}, not in service"}
            reading = await self._apply(node_id, evidence)
        answer = inband.summary(reading)
        if (fresh := await self._rotate(info)) is not None:
            answer["token"] = fresh
        return answer

    async def _node(self, node_id: str) -> tuple[str, str]:
        now = self._monotonic()
        cached = self._nodes.get(node_id)
        if cached is None or cached[0] < now:
            try:
                node = await self._repo.get(node_id)
            except NotFound:
                raise ProbeRefused(f"node {node_id} is gone") from None
            address = node.facts.get("address")
            cached = (now + CACHE_S, address if isinstance(address, str) else "",
                      str(node.state))
            _put(self._nodes, node_id, cached)
        return cached[1], cached[2]

    async def _cursor(self, node_id: str) -> str | None:
        cached = self._cursors.get(node_id)
        if cached is not None and cached[0] >= self._monotonic():
            return cached[1]
        stored = await self._health.repo.cursor(node_id, SOURCE)
        _put(self._cursors, node_id, (self._monotonic() + CURSOR_CACHE_S, stored))
        return stored

    def _admit(self, node_id: str) -> None:
        now, last = self._monotonic(), self._last.get(node_id)
        wait = self._settings.probe_min_interval_s
        if last is not None and now - last < wait:
            raise ProbeTooSoon(f"node {node_id} posted {now - last:.1f} s ago; one post per "
                               f"{wait:g} s", wait - (now - last))
        self._last[node_id] = now

    async def _apply(self, node_id: str, evidence: inband.Evidence) -> inband.Reading:
        stored = await self._cursor(node_id)
        before = inband.Cursor.loads(stored)
        reading = inband.read(evidence, before)
        if reading.events:
            await self._health.report(node_id, Origin.IN_BAND,
                                      [Report.of(f).clipped() for f in reading.events],
                                      actor=ACTOR)
        now = [Report.of(f).clipped() for f in reading.states]
        if not reading.unchanged:  # the same outputs as last time: the same states
            if now:  # a state still wrong is seen again (last_seen), never opened twice
                await self._health.report(node_id, Origin.IN_BAND, now, actor=ACTOR)
            keys = tuple(sorted({(str(r.cls), r.subject) for r in now}))
            for cls, subject in before.states:
                if (cls, subject) not in keys:
                    await self._health.resolve(node_id, Origin.IN_BAND, HealthClass(cls),
                                               subject, actor=ACTOR)
            reading = replace(reading, cursor=replace(reading.cursor, states=keys))
        if (after := reading.cursor.dumps()) != stored:
            await self._health.repo.set_cursor(node_id, SOURCE, after)
            _put(self._cursors, node_id, (self._monotonic() + CURSOR_CACHE_S, after))
        if reading.events or reading.dropped or reading.errors:
            log.info("in-band: node %s: %d lines read (%d skipped), %d events, %d states, "
                     "%d dropped%s", node_id, reading.lines_read, reading.lines_skipped,
                     len(reading.events), len(now), reading.dropped,
                     f", unread: {reading.errors}" if reading.errors else "")
        return reading

    async def _rotate(self, info: TokenInfo) -> str | None:
        """The next token once the one in use is past half its life."""
        if info.expires_at is None or info.node_id is None:
            return None
        half = timedelta(seconds=self._settings.probe_token_ttl_s / 2)
        if _aware(info.expires_at) - self._now() > half:
            return None
        return await self.issue_token(info.node_id)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _put(cache: dict[str, Any], key: str, value: Any) -> None:
    """A bounded cache: past ``MAX_CACHED`` entries (more than a fleet has), start over."""
    if len(cache) >= MAX_CACHED and key not in cache:
        cache.clear()
    cache[key] = value
