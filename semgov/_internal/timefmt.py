"""RFC 3339 helpers: one UTC rendering everywhere (``...Z``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from semgov.errors import InputError


def rfc3339(dt: datetime) -> str:
    """UTC RFC 3339 with a ``Z`` suffix; microseconds only when present."""
    s = dt.astimezone(UTC).replace(tzinfo=None).isoformat()
    return s + "Z"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def unix_us(dt: datetime) -> int:
    """Exact microseconds since the Unix epoch (no float rounding)."""
    return (dt - _EPOCH) // timedelta(microseconds=1)


def parse_rfc3339(value: str, *, what: str = "time") -> datetime:
    """Parse an RFC 3339 timestamp that carries a zone (``Z`` or ``+hh:mm``)."""
    try:
        dt = datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError as e:
        raise InputError(f"{what} {value!r} is not an RFC 3339 timestamp") from e
    if dt.tzinfo is None:
        raise InputError(f"{what} {value!r} has no time zone; add 'Z' or an offset")
    return dt
