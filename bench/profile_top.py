"""The top entries of a collapsed-stack profile (py-spy ``--format raw``, as
``bench/rack_bench.py --profile FILE`` writes it): each function's share of all samples,
inclusive (the function or anything it called was on the CPU) and self (the function itself).

    python3 bench/profile_top.py FILE [--top 40] [--under FUNCTION]

``--under`` keeps only the samples whose stack holds FUNCTION (a substring of a frame), to
see what one caller's time is made of. Frames are ``function (file)``, line numbers dropped.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


def frame_name(frame: str) -> str:
    name = _LINE.sub(")", frame.strip())
    for prefix in ("site-packages/", "/provisioner/", "/lib/python3"):
        head, sep, tail = name.partition(prefix)
        if sep:
            name = f"{head.split('(')[0]}({prefix.strip('/')}/{tail}"
            break
    return name


def read(path: Path, under: str | None) -> tuple[int, Counter[str], Counter[str]]:
    total, inclusive, own = 0, Counter[str](), Counter[str]()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame_name(frame) for frame in stack.split(";")]
        if under is not None and not any(under in frame for frame in frames):
            continue
        samples = int(count)
        total += samples
        for name in set(frames):
            inclusive[name] += samples
        own[frames[-1]] += samples
    return total, inclusive, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--under", help="only the stacks that hold this frame")
    args = parser.parse_args()
    total, inclusive, own = read(args.file, args.under)
    if not total:
        raise SystemExit("no samples")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title} (of {total} samples)")
        for name, samples in counter.most_common(args.top):
            print(f"{100 * samples / total:6.1f} %  {name}")


if __name__ == "__main__":
    main()
