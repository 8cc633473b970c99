"""Small statistics the benchmarks and calibration share (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a rate of ``k`` in ``n``; (0, 1) for n = 0.

    NOTE: unlike the normal approximation it stays inside [0, 1] and is not empty at k = 0: 0
    regressions in 30 pairs is a rate of at most 11.4%, not "none".
    """
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


Standing = Literal["within", "unproven", "over"]


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """Where a measured regression rate stands against a budget (:func:`budget_verdict`)."""

    standing: Standing
    regressions: int
    n: int
    budget: float
    min_n: int
    ci95: tuple[float, float]

    def __str__(self) -> str:
        lo, hi = self.ci95
        return (
            f"{self.regressions}/{self.n} regressions [95% {100 * lo:.1f}-{100 * hi:.1f}%], "
            f"budget {100 * self.budget:g}% with n >= {self.min_n}: {self.standing}"
        )


def budget_verdict(regressions: int, n: int, budget: float, min_n: int = 1) -> BudgetVerdict:
    """Whether ``regressions`` in ``n`` trials keep a regression rate within ``budget``: the one rule
    calibration (which plan to keep) and canaries (when probation ends, when a scope turns off)
    decide by.

    - ``within``: at least ``min_n`` trials and the 95% Wilson *upper* bound at most ``budget``:
      shown to be within it (doubt counts against reuse: 0 of 10 is an upper bound of 28%, not 0%);
    - ``over``: the 95% Wilson *lower* bound above ``budget``: shown to be past it (with a budget
      of 0, any regression);
    - ``unproven``: neither yet.

    ``ValueError`` for counts that are not counts or a budget outside [0, 1].
    """
    if not 0 <= regressions <= n or min_n < 0:
        raise ValueError(f"not counts: {regressions} regressions in {n} trials, min_n {min_n}")
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget {budget} is not a rate in [0, 1]")
    lo, hi = wilson(regressions, n)
    if n and lo > budget:
        standing: Standing = "over"
    elif n >= min_n and n and hi <= budget:
        standing = "within"
    else:
        standing = "unproven"
    return BudgetVerdict(standing, regressions, n, budget, min_n, (lo, hi))
