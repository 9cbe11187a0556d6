"""Logging: under systemd, to journald's native socket with structured fields (``NODE=``,
``NODE_ID=``, ``STATE=``, ``EVENT=`` on a node's lines: ``journalctl NODE=gpu-00``), else
(or when that socket refuses a record) to stderr, journald-friendly under systemd (priority
prefix, no timestamps).

The native protocol is datagrams of ``KEY=value`` lines (a value with a newline: the key, a
newline, its length as 64-bit little-endian, the value, a newline), so the standard library
does it: no ``systemd`` binding to build.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x1b``): a message that
    carries untrusted text (an agent's report, a hostname) cannot forge a log line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


JOURNAL_SOCKET: Final = "/run/systemd/journal/socket"
SEND_TIMEOUT_S: Final = 0.1
#: the fields a node's log lines carry (``log.info(..., extra=node_fields(...))``)
NODE_FIELDS: Final = ("NODE", "NODE_ID", "STATE", "EVENT")


def node_name(node_id: str, hostname: str | None) -> str:
    """How a log line names a node: ``gpu-00 (3f2a…)``, or its id until it has a hostname."""
    return f"{hostname} ({node_id})" if hostname else node_id


def node_fields(node_id: str, hostname: str | None, state: str,
                event: str | None = None) -> dict[str, object]:
    """``extra=`` for a node's log line: its journald fields."""
    fields = {"NODE": hostname or node_id, "NODE_ID": node_id, "STATE": str(state)}
    if event is not None:
        fields["EVENT"] = str(event)
    return {"journal": fields}


def journal_datagram(fields: Mapping[str, str]) -> bytes:
    """``fields`` in journald's native protocol."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "backslashreplace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalHandler(logging.Handler):
    """Each record as one datagram to journald: ``MESSAGE``, ``PRIORITY``, the logger, and a
    node's fields. A record the socket refuses (gone, too big, full past
    ``SEND_TIMEOUT_S``) goes to ``fallback``."""

    def __init__(self, path: str, fallback: logging.Handler) -> None:
        super().__init__()
        self._path = path
        self._fallback = fallback
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # journald reads at once; its queue is short (net.unix.max_dgram_qlen, often 10), so
        # a burst waits for it a little, but one that lags stalls the event loop 0.1 s at
        # most: that record goes to stderr (the journal's stream, without the fields)
        self._sock.settimeout(SEND_TIMEOUT_S)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {"MESSAGE": self.format(record),
                      "PRIORITY": str(_PRIORITY.get(record.levelno, 6)),
                      "SYSLOG_IDENTIFIER": "provisioner", "LOGGER": record.name}
            extra = getattr(record, "journal", None)
            if isinstance(extra, dict):
                fields.update({k: str(v) for k, v in extra.items() if k in NODE_FIELDS})
            self._sock.sendto(journal_datagram(fields), self._path)
        except OSError:
            self._fallback.handle(record)

    def close(self) -> None:
        self._sock.close()
        super().close()


class NodeNames(logging.Filter):
    """Lines that start ``node %s`` with a node's id (the boot server's, the installer's,
    the step runner's…) name it ``hostname (id)`` and carry its ``NODE``/``NODE_ID``
    journald fields, from the hostnames the conductor's transitions taught it (``remember``,
    a conductor observer). A bounded LRU: at most ``max_nodes`` names."""

    def __init__(self, max_nodes: int = 100_000) -> None:
        super().__init__()
        self._max = max_nodes
        self._names: OrderedDict[str, str] = OrderedDict()

    def remember(self, node_id: str, hostname: str | None) -> None:
        if not hostname:
            self._names.pop(node_id, None)
            return
        self._names[node_id] = hostname
        self._names.move_to_end(node_id)
        while len(self._names) > self._max:
            self._names.popitem(last=False)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (isinstance(record.msg, str) and record.msg.startswith("node %s")
                and isinstance(args, tuple) and args and isinstance(args[0], str)
                and (hostname := self._names.get(args[0])) is not None):
            record.args = (node_name(args[0], hostname), *args[1:])
            if not hasattr(record, "journal"):
                record.journal = {"NODE": hostname, "NODE_ID": args[0]}
        return True


#: the daemon's one ``NodeNames`` (``setup_logging`` installs it; the daemon feeds it)
NODE_NAMES: Final = NodeNames()


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
    """Under systemd (``JOURNAL_STREAM``), to journald's socket when it is there
    (``PROVISIONER_JOURNAL_SOCKET`` names another), stderr for what it refuses."""
    stderr = logging.StreamHandler(sys.stderr)
    handler: logging.Handler = stderr
    if os.environ.get("JOURNAL_STREAM"):
        stderr.setFormatter(JournalFormatter("%(name)s: %(message)s"))
        path = os.environ.get("PROVISIONER_JOURNAL_SOCKET", JOURNAL_SOCKET)
        if os.path.exists(path):
            handler = JournalHandler(path, stderr)
            handler.setFormatter(OneLineFormatter("%(message)s"))
    else:
        stderr.setFormatter(OneLineFormatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(NODE_NAMES)  # "node <id>" → "node <hostname> (<id>)"
    handler.addFilter(RepeatLimit())  # bad input at any rate: a bounded journal
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
