"""Helpers shared by the parsers: line numbering, GUIDs, integers, failures that name a line.

Every parser is total: it returns a record or raises ``TopologyParseError``. A parser body
runs under ``guarded()``, which turns any other exception (a bug, or input we did not foresee)
into a ``TopologyParseError`` as well, so callers never see anything else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TypeVar

from provisioner.topology.model import IbLink, PortRef, PortState, TopologyParseError

T = TypeVar("T")

MAX_INPUT_CHARS = 64 * 1024 * 1024
_GUID = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,16})$")
# Terminal escapes (``nvidia-smi topo -m`` underlines its header): CSI (``ESC [ 4 m``,
# ``ESC [ ? 25 l``), OSC (``ESC ] … BEL``) and character-set selections (``ESC ( B``, which
# ``tput sgr0`` writes).
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z])")


def fail(source: str, line: int, reason: str) -> TopologyParseError:
    return TopologyParseError(source, line, reason)


def guarded(source: str, parse: Callable[[], T]) -> T:
    """Run a parser body; anything but a TopologyParseError becomes one (line 0)."""
    try:
        return parse()
    except TopologyParseError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError,
            RecursionError, OverflowError, UnicodeError) as exc:
        raise TopologyParseError(source, 0, f"unreadable input ({type(exc).__name__})") from None


def check_text(source: str, text: str) -> None:
    if not isinstance(text, str):
        raise TopologyParseError(source, 0, "input is not text")
    if len(text) > MAX_INPUT_CHARS:
        raise TopologyParseError(source, 0, f"input larger than {MAX_INPUT_CHARS} characters")
    if "\x00" in text:
        raise TopologyParseError(source, text[: text.index("\x00")].count("\n") + 1,
                                 "NUL byte in input")


def numbered(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline and without ANSI colour codes)."""
    for number, line in enumerate(text.splitlines(), start=1):
        yield number, _ANSI.sub("", line) if "\x1b" in line else line


def guid(text: str, source: str, line: int) -> str:
    """``0x2c5eab0300b87b40`` / ``2c5eab0300b87b40`` / ``200003`` → 16 lower-case hex digits."""
    match = _GUID.match(text.strip())
    if match is None:
        raise fail(source, line, f"not a GUID: {text.strip()[:40]!r}")
    return match[1].lower().rjust(16, "0")


def integer(text: str, source: str, line: int, what: str, *, low: int = 0,
            high: int = 2**32) -> int:
    value = text.strip()
    base = 16 if value.lower().startswith("0x") else 10
    try:
        number = int(value, base)
    except ValueError:
        raise fail(source, line, f"{what} is not a number: {value[:40]!r}") from None
    if not low <= number <= high:
        raise fail(source, line, f"{what} {number} out of range {low}-{high}")
    return number


def key_value(line: str, sep: str = ":") -> tuple[str, str] | None:
    """``Key : value`` → (key, value) with surrounding blanks removed; None without ``sep``."""
    if sep not in line:
        return None
    key, _, value = line.partition(sep)
    return key.strip(), value.strip()


def add_link(links: dict[tuple[PortRef, PortRef], IbLink], link: IbLink) -> None:
    """Record a link seen from one end; seen from both, keep the worse state and rate."""
    key = link.key()
    known = links.get(key)
    if known is None:
        links[key] = link
        return
    state = known.state if known.state is not PortState.ACTIVE else link.state
    rates = [r for r in (known.rate, link.rate) if r is not None]
    rate = min(rates, key=lambda r: r.gbps) if rates else None
    links[key] = IbLink(known.a, known.b, rate, state)
