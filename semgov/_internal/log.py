"""structlog set-up for the CLI: human text or JSON lines on stderr."""

from __future__ import annotations

import sys
from typing import Any

import structlog


def _text(_: Any, __: str, event: dict[str, Any]) -> str:
    msg = event.pop("event")
    event.pop("level", None)
    extra = " ".join(f"{k}={v}" for k, v in event.items() if k != "timestamp")
    return f"semgov: {msg}" + (f" ({extra})" if extra else "")


def configure(fmt: str) -> None:
    """Configure structlog: ``json`` for machine-readable logs, ``text`` for people."""
    processors: list[Any] = [structlog.processors.add_log_level]
    if fmt == "json":
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors.append(_text)
    structlog.configure(
        processors=processors,
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger() -> Any:
    return structlog.get_logger()
