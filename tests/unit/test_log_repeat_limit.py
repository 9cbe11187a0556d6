"""The journal stays bounded under any rate of bad input (provisioner.log.RepeatLimit)."""

from __future__ import annotations

import io
import logging

from provisioner.log import OneLineFormatter, RepeatLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _logger(limit: RepeatLimit) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(message)s"))
    handler.addFilter(limit)
    logger = logging.getLogger(f"test.repeat.{id(limit)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def test_one_source_repeating_is_cut_to_its_burst_and_counted() -> None:
    clock = Clock()
    logger, out = _logger(RepeatLimit(burst=3, window_s=60, clock=clock))
    for _ in range(1000):
        logger.warning("agent call from %s refused", "10.0.0.66")
    assert out.getvalue().count("refused") == 3
    clock.now = 61.0
    logger.warning("agent call from %s refused", "10.0.0.66")
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[-1] == "WARNING agent call from 10.0.0.66 refused (997 more like this were " \
        "not logged)"


def test_other_sources_and_templates_still_pass() -> None:
    logger, out = _logger(RepeatLimit(burst=2, window_s=60, clock=Clock()))
    for _ in range(50):
        logger.warning("agent call from %s refused", "10.0.0.66")
    logger.warning("agent call from %s refused", "10.0.0.7")
    logger.info("node %s: served inspect script", "n-1")
    text = out.getvalue()
    assert text.count("10.0.0.66") == 2
    assert "10.0.0.7 refused" in text and "node n-1: served inspect script" in text


def test_invented_arguments_cannot_grow_the_table() -> None:
    limit = RepeatLimit(burst=1, window_s=60, max_kinds=100, clock=Clock())
    logger, out = _logger(limit)
    for n in range(10_000):
        logger.warning("report from %s refused", f"mac-{n}")
    assert len(limit._kinds) == 100
    assert out.getvalue().count("refused") == 10_000  # each new kind logs once
