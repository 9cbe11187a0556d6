"""What every settings section shares: frozen, no unknown keys; ``HOST:PORT`` values."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too); raise ValueError naming what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.removeprefix("[").removesuffix("]")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 0-65535, got {port_text!r}")
    return host, int(port_text)


def check_optional_listen(value: str | None) -> str | None:
    """An optional ``listen`` value: unset, or a valid ``HOST:PORT``."""
    if value is not None:
        parse_host_port(value)
    return value


class Section(BaseModel):
    """One table of the TOML file: frozen once loaded, and an unknown key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")
