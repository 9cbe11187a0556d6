"""Local admin commands: they open the store directly, with no daemon and no HTTP.

Used by the CLI for bootstrap tasks that cannot go through the API (the first token, the
schema upgrade before the daemon starts) and for ``config show``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from provisioner.config import Settings, effective_config
from provisioner.domain import Role, TokenInfo
from provisioner.errors import ProvisionerError
from provisioner.store import db
from provisioner.store.files import private_dir
from provisioner.store.store import open_store
from provisioner.store.tokens import expiry


def db_upgrade(settings: Settings) -> str:
    """Apply pending migrations; return a line naming the revision before and after."""
    with _store_errors(settings):
        private_dir(settings.state_dir)
        engine = db.make_engine(settings.sqlalchemy_url)
        try:
            before, after = db.upgrade(engine)
        finally:
            engine.dispose()
    if before == after:
        return f"database schema already at {after} (head)"
    return f"database schema upgraded from {before or 'empty'} to {after}"


def create_token(settings: Settings, role: str, name: str, *,
                 expires_in_s: float | None = None,
                 no_expiry: bool = False) -> tuple[TokenInfo, str]:
    """Create an API token (expiring after ``expires_in_s``, else the site default
    ``api.token_lifetime_days``); return its info and the plaintext, which is shown once
    and never stored."""
    try:
        wanted = Role(role)
    except ValueError:
        raise ProvisionerError(f"unknown role {role!r}") from None
    if wanted is Role.AGENT:
        raise ProvisionerError("agent tokens are issued by the daemon, per node")
    expires_at = expiry(settings.api.token_lifetime_s, expires_in_s=expires_in_s,
                        no_expiry=no_expiry)
    with _store_errors(settings):
        store = open_store(settings)
        try:
            return store.tokens.create_blocking(name, wanted, expires_at=expires_at)
        finally:
            store.close()


def list_tokens(settings: Settings) -> list[TokenInfo]:
    """The API tokens (names, roles, expiry; never a secret)."""
    with _store_errors(settings):
        store = open_store(settings)
        try:
            return store.tokens.list_blocking()
        finally:
            store.close()


def revoke_token(settings: Settings, key: str) -> TokenInfo:
    """Revoke (delete) the API token with this id or name: it stops working at once, and
    console sessions opened with it end at their next request."""
    with _store_errors(settings):
        store = open_store(settings)
        try:
            return store.tokens.revoke_blocking(key)
        finally:
            store.close()


def show_config(settings: Settings, *, as_json: bool = False) -> str:
    """The effective configuration (file, then environment) with every secret masked."""
    data = effective_config(settings)
    if as_json:
        return json.dumps(data, indent=2, sort_keys=True)
    return render_toml(data)


def render_toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """TOML for plain config data: scalars first, then one ``[table]`` per section (nested
    sections as ``[a.b]``). TOML has no null, so unset values are written as comments."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            tables.append((f"{prefix}{key}", value))
        else:
            lines.append(_toml_pair(key, value))
    for name, table in tables:
        lines.extend(["", f"[{name}]"])
        lines.append(render_toml(table, f"{name}."))
    return "\n".join(line for line in lines if line).lstrip("\n").replace("\n[", "\n\n[")


def _toml_pair(key: str, value: Any) -> str:
    if value is None:
        return f"# {key} = (unset)"
    return f"{key} = {_toml_value(value)}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


@contextmanager
def _store_errors(settings: Settings) -> Iterator[None]:
    """Database and file-system failures as one-line ProvisionerErrors (no tracebacks)."""
    try:
        yield
    except SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc
        first = str(cause).strip().splitlines()
        raise ProvisionerError(f"database error: {first[0] if first else type(cause).__name__}"
                               ) from None
    except OSError as exc:
        where = exc.filename or settings.state_dir
        raise ProvisionerError(f"{where}: {exc.strerror or exc}") from None
