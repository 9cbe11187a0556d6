"""What the comparative benches share to report what holds: their rounds run interleaved
(ours, theirs, ours, theirs, …), each round's ratio is taken within that round (their time /
ours, or our rate / theirs: higher is better for us), and the bench prints every round's
ratio, then the median with its spread (min–max). A figure from one lucky round is not a
figure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator`` (our rate / theirs, or their time / ours); nan where
    either is missing or the denominator is zero."""
    if not denominator or math.isnan(denominator) or math.isnan(numerator):
        return float("nan")
    return numerator / denominator


def median(values: Sequence[float]) -> float:
    """The median of the values that are numbers (nan when none is)."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else float("nan")


def cell(value: float) -> str:
    """A ratio as a table shows it: ``0.85×``, or ``n/a``."""
    return "n/a" if math.isnan(value) else f"{value:.2f}×"


def summary(label: str, ratios: Sequence[float]) -> str:
    """``label: round 1 0.85×, round 2 0.87×, round 3 0.83× → median 0.85× (0.83–0.87×)``."""
    known = [v for v in ratios if not math.isnan(v)]
    rounds = ", ".join(f"round {i} {cell(v)}" for i, v in enumerate(ratios, 1))
    if not known:
        return f"{label}: {rounds} → median n/a"
    return (f"{label}: {rounds} → median {cell(statistics.median(known))} "
            f"({min(known):.2f}–{max(known):.2f}×)")
