"""semgov.stats: the Wilson interval and the one budget rule calibration and canaries share."""

from __future__ import annotations

import pytest

from semgov.stats import budget_verdict, wilson


def test_wilson_zero_of_n_is_not_zero() -> None:
    """0 regressions in 20 trials has a 95% upper bound of about 16%, not 0."""
    lo, hi = wilson(0, 20)
    assert lo == 0.0
    assert 0.160 < hi < 0.162


def test_within_needs_the_upper_bound_and_min_n() -> None:
    """A rate is within budget only when its upper bound is, with at least min_n trials."""
    assert budget_verdict(0, 20, 0.2).standing == "within"
    assert budget_verdict(0, 10, 0.2).standing == "unproven"  # upper bound 28%
    assert budget_verdict(0, 20, 0.2, min_n=30).standing == "unproven"
    assert budget_verdict(0, 73, 0.05).standing == "within"
    assert budget_verdict(0, 72, 0.05).standing == "unproven"


def test_over_needs_the_lower_bound_past_the_budget() -> None:
    """A rate is over budget only when its lower bound is past it; with a budget of 0, any regression."""
    assert budget_verdict(1, 1, 0.0).standing == "over"
    assert budget_verdict(1, 500, 0.0).standing == "over"
    assert budget_verdict(1, 10, 0.05).standing == "unproven"  # lower bound 1.8%
    assert budget_verdict(2, 10, 0.05).standing == "over"  # lower bound 5.7%


def test_budget_zero_is_never_within() -> None:
    """With a budget of 0, no finite run of matches proves the rate within it."""
    assert budget_verdict(0, 100_000, 0.0).standing == "unproven"


def test_no_trials_is_unproven() -> None:
    """Nothing measured is neither within nor over, whatever the budget."""
    assert budget_verdict(0, 0, 1.0).standing == "unproven"
    assert budget_verdict(0, 0, 0.0, min_n=0).standing == "unproven"


@pytest.mark.parametrize("args", [(-1, 3, 0.1), (4, 3, 0.1), (0, 3, 1.5), (0, 3, -0.1)])
def test_bad_counts_are_refused(args: tuple[int, int, float]) -> None:
    """Counts that are not counts, and budgets outside [0, 1], raise ValueError."""
    with pytest.raises(ValueError):
        budget_verdict(*args)


def test_verdict_says_what_it_measured() -> None:
    """The verdict's text names the counts, the interval, the budget and the standing."""
    text = str(budget_verdict(0, 20, 0.2, min_n=10))
    assert text == "0/20 regressions [95% 0.0-16.1%], budget 20% with n >= 10: within"
