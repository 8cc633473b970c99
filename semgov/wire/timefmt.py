"""RFC 3339 helpers: one UTC rendering everywhere (``...Z``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from semgov.errors import InputError


class Instant(datetime):
    """An aware datetime that also keeps the nanoseconds past its microsecond (``sub_us_ns``).

    NOTE: times are compared exactly, in integer nanoseconds (:func:`unix_ns`): rounding a start
    or a clock either way turns some comparison toward allow (a start rounded up shortens an
    age, a clock rounded down delays an expiry), so nothing is rounded at all.
    """

    __slots__ = ("sub_us_ns",)
    sub_us_ns: int


def sub_us_ns(dt: datetime) -> int:
    """The nanoseconds past ``dt``'s microsecond (0 for a plain datetime)."""
    return int(getattr(dt, "sub_us_ns", 0))


def rfc3339(dt: datetime) -> str:
    """UTC RFC 3339 with a ``Z`` suffix; the fraction only when present (nanoseconds if any)."""
    s = dt.astimezone(UTC).replace(tzinfo=None).isoformat()
    ns = sub_us_ns(dt)
    if ns:
        s = (s if dt.microsecond else s + ".000000") + f"{ns:03d}"
    return s + "Z"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def unix_us(dt: datetime) -> int:
    """Microseconds since the Unix epoch, truncated (display and metrics; never for a decision)."""
    return (dt - _EPOCH) // timedelta(microseconds=1)


def unix_ns(dt: datetime) -> int:
    """Exact nanoseconds since the Unix epoch (no float rounding, an :class:`Instant`'s nanoseconds kept)."""
    return unix_us(dt) * 1000 + sub_us_ns(dt)


def parse_rfc3339(value: str, *, what: str = "time") -> datetime:
    """Parse an RFC 3339 timestamp that carries a zone (``Z`` or ``+hh:mm``)."""
    try:
        dt = datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError as e:
        raise InputError(f"{what} {value!r} is not an RFC 3339 timestamp") from e
    if dt.tzinfo is None:
        raise InputError(f"{what} {value!r} has no time zone; add 'Z' or an offset")
    return dt
