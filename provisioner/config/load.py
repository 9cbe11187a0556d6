"""Reading settings (the TOML file, then the environment) with one-line errors, and showing
them with every secret masked."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from pydantic import ValidationError

from provisioner.config.settings import Settings
from provisioner.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/provisioner/provisioner.toml")


def load_settings(path: Path | None, *, explicit: bool = True) -> Settings:
    """Read ``path`` (if given), then the environment; raise ConfigError with a one-line reason.

    A missing file is an error when the operator named it; the default path may be absent.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            if explicit:
                raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:  # TOML is UTF-8 (tomllib decodes before parsing)
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: "
                              f"{exc.reason})") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None


def _describe(exc: ValidationError, path: Path | None) -> str:
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(root)"
    where = f" in {path}" if path is not None else ""
    env_name = "PROVISIONER_" + key.upper().replace(".", "__")
    hint = f" (or {env_name})" if env_name in os.environ else ""
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    return f"invalid config{where}: {key}{hint}: {message}"


def effective_config(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data with every secret masked."""
    data: dict[str, Any] = json.loads(settings.model_dump_json())
    if settings.bmc.default_password is not None:
        data["bmc"]["default_password"] = "***"
    if settings.database_url is not None:
        data["database_url"] = mask_url(settings.database_url.get_secret_value())
    return data


def mask_url(url: str) -> str:
    """``url`` with its password masked, in the authority (``user:pw@``) and in the query
    (libpq's ``?password=``, ``sslpassword=``: any parameter whose name holds one of
    ``_SECRET_PARAMS``)."""
    base, qmark, query = url.partition("?")
    scheme, sep, rest = base.partition("://")
    creds, at, host = rest.rpartition("@")
    if sep and at:
        base = f"{scheme}://{creds.partition(':')[0]}:***@{host}"
    if not qmark:
        return base
    pairs = [_mask_pair(pair) for pair in query.split("&")]
    return f"{base}?{'&'.join(pairs)}"


_SECRET_PARAMS = ("password", "passwd", "secret", "token")


def _mask_pair(pair: str) -> str:
    name, eq, _value = pair.partition("=")
    if eq and any(word in unquote_plus(name).lower() for word in _SECRET_PARAMS):
        return f"{name}=***"
    return pair
