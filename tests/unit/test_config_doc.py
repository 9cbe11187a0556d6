"""The operator guide's table of configuration keys says what ``Settings`` accepts: every key
the model has is a row, every row is a key, with the model's default; a per-profile table
(``[bmc.profiles.<profile>]``, ``[images.<profile>]``, ...) names each of its keys."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from provisioner.config import Settings

GUIDE = Path(__file__).parents[2] / "docs" / "operator-guide.md"
_ROW = re.compile(r"^\| `(?P<key>[a-z0-9_.]+)` \| (?P<default>.*?) \| (?P<meaning>.*) \|$")
_UNSET = ("none", "unset")


class Row(typing.NamedTuple):
    default: str
    meaning: str


def documented(text: str) -> dict[str, Row]:
    """The rows of the table under ``## Configure``, by key; a key twice is an error."""
    section = text.split("\n## Configure\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, Row] = {}
    for line in section.splitlines():
        if (match := _ROW.match(line)) is None:
            continue
        assert match["key"] not in rows, f"{match['key']} has two rows"
        rows[match["key"]] = Row(match["default"].strip(), match["meaning"])
    return rows


def setting_keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every key a TOML file may set, dotted, with the model of its per-profile tables (a
    ``dict[str, Model]`` field) or None. A nested section is walked, not a key itself."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from setting_keys(annotation, f"{prefix}{name}.")
            continue
        per_profile = None
        if typing.get_origin(annotation) is dict:
            value_type = typing.get_args(annotation)[1]
            if isinstance(value_type, type) and issubclass(value_type, BaseModel):
                per_profile = value_type
        yield prefix + name, per_profile


def parse_default(text: str) -> object:
    """A row's default as data: ``none``/``unset`` → None; JSON where it parses; else text."""
    if len(text) >= 2 and text[0] == text[-1] == "`":
        text = text[1:-1]
    if text in _UNSET:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def same_default(documented_value: object, actual: object) -> bool:
    """Equal data; ``20`` documents ``20.0``, but ``1`` does not document ``true``."""
    if isinstance(documented_value, bool) or isinstance(actual, bool):
        return documented_value is actual
    if isinstance(documented_value, int | float) and isinstance(actual, int | float):
        return float(documented_value) == float(actual)
    return documented_value == actual


def default_of(key: str) -> object:
    """The model's own default as JSON data (model_construct: no PROVISIONER_* variables)."""
    data: Any = Settings.model_construct().model_dump(mode="json")
    for part in key.split("."):
        data = data[part]
    return data


ROWS = documented(GUIDE.read_text())
KEYS = dict(setting_keys(Settings))


def test_every_setting_has_a_row() -> None:
    missing = sorted(set(KEYS) - set(ROWS))
    assert missing == [], f"add rows to {GUIDE.name}'s Configure table for: {missing}"


def test_every_row_is_a_setting() -> None:
    unknown = sorted(set(ROWS) - set(KEYS))
    assert unknown == [], f"{GUIDE.name} documents keys Settings does not accept: {unknown}"


@pytest.mark.parametrize("key", sorted(set(ROWS) & set(KEYS)))
def test_documented_default_is_the_models(key: str) -> None:
    documented_value = parse_default(ROWS[key].default)
    actual = default_of(key)
    assert same_default(documented_value, actual), (
        f"{key}: the guide says {ROWS[key].default}, the model's default is {actual!r}")


@pytest.mark.parametrize("key", sorted(key for key, model in KEYS.items() if model is not None))
def test_per_profile_row_names_every_key(key: str) -> None:
    model = KEYS[key]
    unnamed = [name for name in model.model_fields if f"`{name}`" not in ROWS[key].meaning]
    assert unnamed == [], f"{key}: the guide's row does not name {unnamed}"


def test_a_drifted_guide_is_caught() -> None:
    text = GUIDE.read_text()
    drifted = documented(text.replace("| `bmc.retries` |", "| `bmc.retry_count` |", 1))
    assert sorted(set(KEYS) - set(drifted)) == ["bmc.retries"]
    assert sorted(set(drifted) - set(KEYS)) == ["bmc.retry_count"]


def test_defaults_parse_like_the_table_writes_them() -> None:
    assert parse_default("`none`") is None
    assert parse_default("unset") is None
    assert parse_default("`28800`") == 28800
    assert parse_default('`["x86_64", "arm64"]`') == ["x86_64", "arm64"]
    assert parse_default("`provisioner: `") == "provisioner: "
    assert same_default(20, 20.0)
    assert not same_default(True, 1)
    assert not same_default(None, {})
