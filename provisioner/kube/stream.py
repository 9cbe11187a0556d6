"""A streamed HTTP response (a watch) read line by line as it arrives, and cut from another
thread when its reader is no longer wanted. urllib3 only: no ``kubernetes`` import."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


def lines(raw: Any) -> Iterator[bytes]:
    """The lines of a streamed (chunked) urllib3 response, as they arrive."""
    rest = b""
    for chunk in raw.stream(amt=None, decode_content=False):
        rest += chunk
        *complete, rest = rest.split(b"\n")
        yield from complete
    if rest.strip():
        yield rest


def unblock(raw: Any) -> None:
    """Make a read blocked on ``raw`` in another thread return (the watch is over)."""
    try:
        shutdown = getattr(raw, "shutdown", None)  # urllib3 >= 2.3
        (shutdown or raw.close)()
    except Exception as exc:  # closing a finished or broken stream: nothing left to stop
        log.debug("kube: closing a watch: %s", exc)
