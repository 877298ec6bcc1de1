import io
import json
import logging
from collections.abc import Iterator
from typing import TextIO

import pytest

from logging_setup import build_handler, configure_logging
from settings import LoggingSettings

# Built at run time, so that no traceback's source line shows them.
PHONE = "138" + "12345678"
EMAIL = "frank" + "@例子.中国"
SURROGATE = chr(0xD800)


class StrictStream(io.TextIOWrapper):
    """UTF-8 that raises on a lone surrogate, as a log file opened by the app would."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="strict", newline="\n", write_through=True)

    def lines(self) -> list[str]:
        buffer = self.buffer
        assert isinstance(buffer, io.BytesIO)
        return buffer.getvalue().decode("utf-8").splitlines()


def log_to(stream: TextIO, log_format: str) -> logging.Logger:
    logger = logging.getLogger(f"test.logging.{log_format}")
    logger.handlers[:] = [build_handler(LoggingSettings(format=log_format), stream)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def fail() -> None:
    raise LookupError(f"The model '{PHONE}{SURROGATE}' does not exist; ask {EMAIL}")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_exceptions_and_stacks_are_written_scrubbed(log_format: str) -> None:
    stream = StrictStream()
    logger = log_to(stream, log_format)
    try:
        fail()
    except LookupError:
        logger.exception("lookup for %s%s failed", PHONE, SURROGATE, stack_info=True)
    written = "\n".join(stream.lines())
    assert PHONE not in written and EMAIL not in written
    assert "Traceback" in written and "Stack (most recent call last)" in written
    if log_format == "json":
        [entry] = (json.loads(line) for line in stream.lines())
        assert entry["msg"] == "lookup for [PHONE]\\ud800 failed"
        assert entry["exc"].endswith("LookupError: The model '[PHONE]\\ud800' does not exist; ask [EMAIL]")
        assert "Stack (most recent call last)" in entry["stack"]
    else:
        assert "lookup for [PHONE]\\ud800 failed" in stream.lines()[0]
        assert "LookupError: The model '[PHONE]\\ud800' does not exist; ask [EMAIL]" in stream.lines()


def test_a_record_that_cannot_be_formatted_is_reported_without_its_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = StrictStream()
    log_to(stream, "text").info("%d messages", PHONE)
    report = capsys.readouterr().err
    assert stream.lines() == []
    assert report.startswith("--- Logging error: TypeError in test.logging.text at ")
    assert PHONE not in report


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Puts back what `configure_logging` changes on the process's loggers."""
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "Lark", "alembic", "apscheduler", "httpx")
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate) for name in names}
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, (handlers, propagate) in saved.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate
        logging.getLogger(name).setLevel(levels[name])


@pytest.mark.usefixtures("root_logging")
def test_every_logger_writes_through_the_scrubbing_handler(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(LoggingSettings(format="json"))
    logging.getLogger("uvicorn.error").error("client sent %s", f"{PHONE} {EMAIL}")
    [line] = capsys.readouterr().err.splitlines()
    assert json.loads(line)["msg"] == "client sent [PHONE] [EMAIL]"
