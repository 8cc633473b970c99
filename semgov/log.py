"""structlog set-up: human text or JSON lines, always on stderr (stdout carries results).

NOTE: start-up: structlog (and what it pulls in) is imported on the first log line, not by
:func:`configure`: a command that logs nothing never loads it.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from typing import Any

_pending: str | None = None  # a format configure() was given, applied on the first get_logger()


def _text(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    msg = event.pop("event")
    event.pop("level", None)
    extra = " ".join(f"{k}={v}" for k, v in event.items() if k != "timestamp")
    return f"semgov: {msg}" + (f" ({extra})" if extra else "")


def _stderr_logger(*_: Any) -> Any:
    import structlog

    # NOTE: resolve sys.stderr at each call: it may have been replaced since configuration.
    return structlog.PrintLogger(file=sys.stderr)


def configure(fmt: str) -> None:
    """Configure structlog for the CLI: ``json`` for machine-readable logs, ``text`` for people
    (applied when the first line is logged)."""
    global _pending
    _pending = fmt


def _apply(fmt: str) -> None:
    import structlog

    processors: list[Any] = [structlog.processors.add_log_level]
    if fmt == "json":
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors.append(_text)
    structlog.configure(processors=processors, logger_factory=_stderr_logger, cache_logger_on_first_use=False)


def get_logger() -> Any:
    """semgov's logger: the host's structlog configuration if it has one, else text on stderr."""
    global _pending
    import structlog

    if _pending is not None:
        fmt, _pending = _pending, None
        _apply(fmt)
    if structlog.is_configured():
        return structlog.get_logger("semgov")
    return structlog.wrap_logger(_stderr_logger(), processors=[structlog.processors.add_log_level, _text])
