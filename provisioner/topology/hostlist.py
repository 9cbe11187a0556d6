"""Slurm hostlist expressions: ``gpu-node-[01-04,07],login1`` <-> the names.

Zero padding is kept the way Slurm's ``hostlist_create`` reads it: a range takes the width of
its lower bound (``[08-10]`` is 08 09 10, ``[8-10]`` is 8 9 10), so ``expand(compress(x))``
gives back exactly the names of ``x`` (sorted, duplicates dropped).
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable

MAX_NAMES = 1_000_000
_SUFFIX = re.compile(r"^(.*?)(\d+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_FORBIDDEN = re.compile(r"[\s,\[\]]")


class HostlistError(ValueError):
    """A name that cannot be put in a hostlist, or an expression that is not one."""


def compress(names: Iterable[str]) -> str:
    """One expression for all names, groups in prefix order: ``a[1-3],b07,c``."""
    return ",".join(compress_groups(names))


def compress_groups(names: Iterable[str]) -> list[str]:
    """One item per prefix: ``["gpu-node-[01-04,07]", "login1"]``."""
    numbered: dict[str, set[tuple[int, str]]] = defaultdict(set)
    plain: set[str] = set()
    for name in names:
        if not name or _FORBIDDEN.search(name):
            raise HostlistError(f"{name!r} cannot be part of a hostlist")
        match = _SUFFIX.match(name)
        if match is None:
            plain.add(name)
        else:
            numbered[match[1]].add((int(match[2]), match[2]))
    items = [(name, name) for name in plain]
    for prefix, numbers in numbered.items():
        ranges = _ranges(sorted(numbers, key=lambda n: (n[0], len(n[1]))))
        text = ranges[0] if len(ranges) == 1 and "-" not in ranges[0] else f"[{','.join(ranges)}]"
        items.append((prefix, prefix + text))
    return [text for _, text in sorted(items)]


def _ranges(numbers: list[tuple[int, str]]) -> list[str]:
    ranges: list[str] = []
    low: tuple[int, str] | None = None
    high = 0
    for value, digits in numbers:
        if low is not None and value == high + 1 and f"{value:0{len(low[1])}d}" == digits:
            high = value
            continue
        if low is not None:
            ranges.append(_range(low, high))
        low, high = (value, digits), value
    if low is not None:
        ranges.append(_range(low, high))
    return ranges


def _range(low: tuple[int, str], high: int) -> str:
    return low[1] if high == low[0] else f"{low[1]}-{high:0{len(low[1])}d}"


def expand(expression: str) -> list[str]:
    """The names of an expression, in its order; HostlistError if it is not one."""
    names: list[str] = []
    for item in _split(expression):
        names.extend(_expand_item(item))
        if len(names) > MAX_NAMES:
            raise HostlistError(f"more than {MAX_NAMES} names")
    return names


def _split(expression: str) -> list[str]:
    items, depth, start = [], 0, 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at {index} in {expression!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' at {index} in {expression!r}")
        elif char == "," and depth == 0:
            items.append(expression[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {expression!r}")
    items.append(expression[start:])
    if any(not item or item != item.strip() for item in items):
        raise HostlistError(f"empty name or blank in {expression!r}")
    return items


def _expand_item(item: str) -> list[str]:
    if "[]" in item:
        raise HostlistError(f"empty brackets in {item!r}")
    parts: list[list[str]] = []
    for literal, bracket in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
        if literal:
            parts.append([literal])
        if bracket:
            parts.append(_expand_bracket(bracket, item))
    total = 1
    for part in parts:
        total *= len(part)
        if total > MAX_NAMES:
            raise HostlistError(f"{item!r} expands to more than {MAX_NAMES} names")
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_bracket(bracket: str, item: str) -> list[str]:
    values: list[str] = []
    for piece in bracket.split(","):
        match = _RANGE.match(piece)
        if match is None:
            raise HostlistError(f"{piece!r} is not a number or range in {item!r}")
        low, high = match[1], match[2]
        if high is None:
            values.append(low)
            continue
        if int(high) < int(low) or int(high) - int(low) > MAX_NAMES:
            raise HostlistError(f"bad range {piece!r} in {item!r}")
        values.extend(f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1))
    return values
