"""Shared value types: node ids and MAC addresses, parsed once and normalised."""

from __future__ import annotations

import re
import uuid
from typing import NewType

from provisioner.errors import InvalidRequest

NodeId = NewType("NodeId", str)

_MAC_HEX = re.compile(r"^[0-9a-f]{12}$")


def new_node_id() -> NodeId:
    return NodeId(str(uuid.uuid4()))


def normalize_mac(text: str) -> str:
    """Return ``aa:bb:cc:dd:ee:ff`` for any common MAC spelling, or raise InvalidRequest."""
    digits = re.sub(r"[\s:.\-]", "", text.strip().lower())
    if not _MAC_HEX.match(digits):
        raise InvalidRequest(f"invalid MAC address {text!r}")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def is_mac(text: str) -> bool:
    try:
        normalize_mac(text)
    except InvalidRequest:
        return False
    return True
