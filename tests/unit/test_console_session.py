"""Console sessions: expiry, sign-out, CSRF comparison, the bound on their number."""

from __future__ import annotations

import pytest

from provisioner.api.ui import session as session_mod
from provisioner.api.ui.session import SessionStore
from provisioner.domain import Role


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_expires_after_its_ttl() -> None:
    clock = Clock()
    store = SessionStore(60, clock=clock)
    s = store.open("pvt_tok", "alice", Role.OPERATOR)
    assert store.get(s.id) is s and s.role is Role.OPERATOR
    clock.now += 59.9
    assert store.get(s.id) is s
    clock.now += 0.2
    assert store.get(s.id) is None and len(store) == 0


def test_sign_out_and_unknown_ids() -> None:
    store = SessionStore(60)
    s = store.open("pvt_tok", "bob", Role.VIEWER)
    assert store.get(None) is None and store.get("") is None and store.get("nope") is None
    store.close(s.id)
    assert store.get(s.id) is None


def test_csrf_tokens_are_per_session_and_compared_exactly() -> None:
    store = SessionStore(60)
    a, b = store.open("t1", "a", Role.OPERATOR), store.open("t2", "b", Role.OPERATOR)
    assert a.csrf != b.csrf and a.id != b.id
    assert a.csrf_ok(a.csrf) and not a.csrf_ok(b.csrf)
    assert not a.csrf_ok(None) and not a.csrf_ok("") and not a.csrf_ok(a.csrf[:-1])


def test_secrets_stay_out_of_repr() -> None:
    s = SessionStore(60).open("pvt_secret", "carol", Role.VIEWER)
    assert "pvt_secret" not in repr(s) and s.csrf not in repr(s) and s.id not in repr(s)


def test_the_number_of_sessions_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_mod, "MAX_SESSIONS", 3)
    store = SessionStore(60)
    first = store.open("t", "x", Role.VIEWER)
    for _ in range(3):
        store.open("t", "x", Role.VIEWER)
    assert len(store) == 3 and store.get(first.id) is None  # the oldest went
