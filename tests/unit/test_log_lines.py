"""A log message that carries untrusted text (an agent's report, a hostname, a reason) cannot
forge a journal line: its control characters are escaped; a traceback keeps its lines."""

from __future__ import annotations

import logging
import sys

import pytest

from provisioner.log import JournalFormatter, OneLineFormatter


def record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("provisioner.boot.http", logging.INFO, __file__, 1, msg, args,
                             info)


@pytest.mark.parametrize("formatter", [JournalFormatter("%(name)s: %(message)s"),
                                       OneLineFormatter("%(levelname)s %(message)s")],
                         ids=["journal", "stderr"])
def test_untrusted_text_stays_on_one_line(formatter: logging.Formatter) -> None:
    forged = "deploy\n<3>provisioner.api: admin token created\r\x1b[2Kx\u2028y"
    text = formatter.format(record("node %s: agent ran %s: ok", "n1", forged))
    assert len(text.splitlines()) == 1, text
    assert "deploy\\n<3>provisioner.api: admin token created\\r\\x1b[2Kx\\u2028y" in text


def test_a_traceback_keeps_its_lines() -> None:
    text = JournalFormatter("%(name)s: %(message)s").format(record("crashed", exc=True))
    lines = text.splitlines()
    assert lines[0] == "<6>provisioner.boot.http: crashed"
    assert lines[1].startswith("<6>Traceback") and lines[-1] == "<6>ValueError: boom"
