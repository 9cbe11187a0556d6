"""Console sessions: server-side, in memory, keyed by a random id in an HttpOnly,
SameSite=Strict cookie. A session holds the API token it was opened with (never sent back
to the browser), so every request re-checks that token (revoked or expired: signed out),
and a per-session CSRF token that every mutating form carries.

Sessions do not survive a daemon restart: the operator signs in again.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from provisioner.domain import Role

COOKIE: Final = "pv_session"
MAX_SESSIONS: Final = 10_000
"""The oldest session is dropped beyond this many (a sign-in flood cannot grow memory)."""


@dataclass(frozen=True, slots=True)
class Session:
    id: str = field(repr=False)
    token: str = field(repr=False)
    name: str
    role: Role
    csrf: str = field(repr=False)
    expires_at: float

    def csrf_ok(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(sent.encode(), self.csrf.encode())


class SessionStore:
    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def open(self, token: str, name: str, role: Role) -> Session:
        session = Session(id=secrets.token_urlsafe(32), token=token, name=name, role=role,
                          csrf=secrets.token_urlsafe(32), expires_at=self._clock() + self._ttl_s)
        self._sessions[session.id] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this cookie value; None when unknown or expired."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session.expires_at <= self._clock():
            del self._sessions[session_id]
            return None
        return session

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def __len__(self) -> int:
        return len(self._sessions)
