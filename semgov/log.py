"""structlog set-up: human text or JSON lines, always on stderr (stdout carries results).

NOTE: start-up: structlog (and what it pulls in) is imported on the first log line, not by
:func:`configure`: a command that logs nothing never loads it.

NOTE: every line carries the fields bound with :func:`bound` on its thread (request id, tenant,
decision ids of the request being worked on), and never a secret: :func:`_redact` replaces the
value of any field named like prompt text, token ids or key material, and bounds every string
(an exception's message may quote its input: :func:`describe_error` keeps only its first line).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

# Field names whose values are never logged (prompt or donor text, token ids, key material).
SECRET_FIELDS = frozenset(
    {
        "text",
        "prompt",
        "donor_text",
        "token_ids",
        "tokens",
        "key",
        "private_key",
        "secret",
        "context_token",
        "api_key",
        "authorization",
    }
)
MAX_FIELD_CHARS = 400


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Secret fields replaced, long strings and containers bounded."""
    for k, v in list(event.items()):
        if k in SECRET_FIELDS:
            event[k] = "[redacted]"
        elif isinstance(v, str) and len(v) > MAX_FIELD_CHARS:
            event[k] = v[:MAX_FIELD_CHARS] + "...[truncated]"
        elif isinstance(v, list | tuple) and len(v) > 16:
            event[k] = [*v[:16], f"...[{len(v) - 16} more]"]
    return event


def describe_error(e: BaseException) -> str:
    """``Type: first line of the message`` (bounded): what a log line says about an exception.
    A validation error's input values are left out (they may be a prompt or a key)."""
    errors = getattr(e, "errors", None)
    if callable(errors) and type(e).__name__ == "ValidationError":
        try:
            parts = [f"{'.'.join(map(str, x['loc']))}: {x['type']}" for x in errors(include_input=False)]
            return f"ValidationError: {'; '.join(parts)}"[:300]
        except Exception:  # noqa: BLE001
            pass
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:300]


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Every line logged on this thread inside the block carries ``fields`` (structlog contextvars)."""
    import structlog

    with structlog.contextvars.bound_contextvars(**{k: v for k, v in fields.items() if v is not None}):
        yield


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


_quiet = False  # -q/--quiet: only errors are logged


def _only_errors(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    import structlog

    if method not in ("error", "critical", "exception"):
        raise structlog.DropEvent
    return event


def configure(fmt: str, *, quiet: bool = False) -> None:
    """Configure structlog for the CLI: ``json`` for machine-readable logs, ``text`` for people
    (applied when the first line is logged); ``quiet``: log errors only.

    NOTE: every call sets both: a ``--quiet`` run never leaves later configurations quiet (one
    process runs many commands in tests, and a host may configure again)."""
    global _pending, _quiet
    _pending = fmt
    _quiet = quiet


def _apply(fmt: str) -> None:
    import structlog

    processors: list[Any] = [
        *((_only_errors,) if _quiet else ()),
        structlog.contextvars.merge_contextvars,
        _redact,
        structlog.processors.add_log_level,
    ]
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
    return structlog.wrap_logger(
        _stderr_logger(),
        processors=[
            structlog.contextvars.merge_contextvars,
            _redact,
            structlog.processors.add_log_level,
            _text,
        ],
    )
