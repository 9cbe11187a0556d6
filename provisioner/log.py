"""Logging to stderr: journald-friendly under systemd (priority prefix, no timestamps)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x1b``): a message that
    carries untrusted text (an agent's report, a hostname) cannot forge a log line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


class OneLineFormatter(logging.Formatter):
    """Each message on one line; a traceback, appended after it, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = one_line(record.message)
        return super().formatMessage(record)


class JournalFormatter(OneLineFormatter):
    """``<6>provisioner.lifecycle.conductor: node …``: journald reads the ``<N>`` prefix."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        priority = _PRIORITY.get(record.levelno, 6)
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines())


class RepeatLimit(logging.Filter):
    """At most ``burst`` records of one kind in each ``window_s``: a kind is the logger, the
    message template and its first argument (a node, a MAC, a source address), so a machine
    that repeats a bad request as fast as it can costs the journal a few lines a minute, never
    one per request, while other nodes' lines of the same template still pass. The first
    record after a quiet window says how many were dropped. Kinds are kept in a bounded LRU:
    arguments an attacker invents cannot grow it."""

    def __init__(self, *, burst: int = 10, window_s: float = 60.0, max_kinds: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._burst, self._window_s, self._max_kinds = burst, window_s, max_kinds
        self._clock = clock
        self._kinds: OrderedDict[tuple[str, str, str], list[float]] = OrderedDict()
        # kind -> [window start, records passed in it, records dropped since the last pass]

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        kind = (record.name, str(record.msg), str(args[0])[:128] if args else "")
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is None or now - seen[0] >= self._window_s:
            dropped = int(seen[2]) if seen is not None else 0
            self._kinds[kind] = [now, 1, 0]
            self._kinds.move_to_end(kind)
            while len(self._kinds) > self._max_kinds:
                self._kinds.popitem(last=False)
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this were not logged)"
            return True
        self._kinds.move_to_end(kind)
        if seen[1] < self._burst:
            seen[1] += 1
            return True
        seen[2] += 1
        return False


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(OneLineFormatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RepeatLimit())  # bad input at any rate: a bounded journal
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
