"""Config: file then environment, frozen, one-line errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from provisioner.config import (
    Settings,
    effective_config,
    load_settings,
    mask_url,
    parse_host_port,
)
from provisioner.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "provisioner.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    settings = load_settings(Path("/nonexistent/provisioner.toml"), explicit=False)
    assert settings.api.listen == "127.0.0.1:8700"
    assert settings.sqlalchemy_url.startswith("sqlite:///")


def test_file_values_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, 'state_dir = "/srv/pv"\n[api]\nlisten = "0.0.0.0:9000"\n'
                           "[lifecycle]\nmax_deploying = 3\n")
    monkeypatch.setenv("PROVISIONER_API__LISTEN", "127.0.0.1:9100")
    settings = load_settings(path)
    assert settings.state_dir == Path("/srv/pv")
    assert settings.api.listen == "127.0.0.1:9100"
    assert settings.api.host_port == ("127.0.0.1", 9100)
    assert settings.lifecycle.max_deploying == 3


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.state_dir = Path("/tmp")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[api]\nlisten = "nohostport"\n', "api.listen"),
        ('[api]\nlisten = "h:99999"\n', "api.listen"),
        ("[lifecycle]\nmax_deploying = 0\n", "lifecycle.max_deploying"),
        ('[api]\nlistn = "1.2.3.4:5"\n', "api.listn: unknown key"),
        ("bogus = 1\n", "bogus: unknown key"),
        ('[log]\nlevel = "LOUD"\n', "log.level"),
        ("[api\n", "not valid TOML"),
    ],
    ids=["listen-format", "port-range", "bound", "unknown-nested", "unknown-top", "enum", "toml"],
)
def test_invalid_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_invalid_env_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_LIFECYCLE__MAX_DEPLOYING", "many")
    with pytest.raises(ConfigError, match="lifecycle.max_deploying"):
        load_settings(None)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "absent.toml")


def test_secrets_are_masked(tmp_path: Path) -> None:
    path = write(tmp_path, 'database_url = "postgresql+psycopg://pv:s3cret@db:5432/pv"\n')
    shown = effective_config(load_settings(path))
    assert shown["database_url"] == "postgresql+psycopg://pv:***@db:5432/pv"
    assert "s3cret" not in repr(load_settings(path))


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:8700", ("::1", 8700)),
    ("host.example:0", ("host.example", 0)),
])
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


def test_mask_url_without_password() -> None:
    assert mask_url("sqlite:////var/lib/pv.sqlite") == "sqlite:////var/lib/pv.sqlite"


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += _keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_operator_guide_documents_every_key() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md").read_text()
    example = (Path(__file__).resolve().parents[2] / "examples" / "provisioner.toml").read_text()
    for key in _keys(Settings):
        assert f"| `{key}` |" in guide, f"docs/operator-guide.md lacks {key}"
        assert key.rpartition(".")[2] in example, f"examples/provisioner.toml lacks {key}"
    load_settings(Path(__file__).resolve().parents[2] / "examples" / "provisioner.toml")
