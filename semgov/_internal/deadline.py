"""A monotonic deadline that long computations check between bounded steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


class DeadlineExceeded(TimeoutError):  # noqa: N818 - reads as what happened, like TimeoutError
    """Work was abandoned because its deadline passed (the message names the work and the timeout)."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """``timeout`` seconds after a reading of ``clock`` (``time.monotonic`` unless injected)."""

    at: float
    timeout: float
    clock: Clock = time.monotonic

    @classmethod
    def after(cls, timeout: float, clock: Clock = time.monotonic) -> Deadline:
        return cls(clock() + timeout, timeout, clock)

    def remaining(self) -> float:
        """Seconds left (zero or negative once passed)."""
        return self.at - self.clock()

    def passed(self) -> bool:
        return self.clock() >= self.at

    def check(self, what: str) -> None:
        """Raise :class:`DeadlineExceeded` naming ``what`` if the deadline has passed."""
        if self.passed():
            raise DeadlineExceeded(f"{what} exceeded {self.timeout:g} s")
