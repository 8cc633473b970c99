"""Calibration: turn measured regressions into a quality overlay for a policy (pure, no engine).

``semgov calibrate`` runs sampled captured requests cold and warm on an engine and records one
:class:`Trial` per (request, realization method): did the warm answer regress against cold? This
module aggregates them per scope (task id, response contract id) and span kind, with a 95% Wilson
interval, picks per scope the first method (in the order given: cheapest first) whose regression
rate's *upper* bound stays within the budget (doubt counts against reuse: 0 of 10 is not 0%), and
writes the result as quality rules into a copy of the YAML policy (and, given one, of the Rego
policy) that ``semgov policy check`` loads like any other: ``allow_shifted: true`` with the
method's plan where one passed, ``allow_shifted: false`` where shifted trials were measured and
none did. Prefix reuse is exact by construction and is reported, never restricted.

A method is a realization a policy can plan (:func:`plan_settings`): ``none``, ``leading:P%``,
``leading:N`` (or ``boundary:N``), ``trailing:N`` and ``bookend:H+T``; the reference engine can try
others (``selective:P%``), which no policy can sign and which are refused here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from semgov.errors import PolicyError
from semgov.policy.yaml.model import parse_policy
from semgov.stats import BudgetVerdict, budget_verdict, wilson

Kind = Literal["prefix", "shifted"]

_PLANS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"none"), lambda m: (0, 0, 0)),
    (re.compile(r"leading:(\d{1,3})%"), lambda m: (int(m[1]), 0, 0)),
    (re.compile(r"(?:leading|boundary):(\d{1,6})"), lambda m: (0, int(m[1]), 0)),
    (re.compile(r"trailing:(\d{1,6})"), lambda m: (0, 0, int(m[1]))),
    (re.compile(r"bookend:(\d{1,6})\+(\d{1,6})"), lambda m: (0, int(m[1]), int(m[2]))),
)


def plan_settings(method: str) -> dict[str, int]:
    """The quality settings that plan ``method`` (``shifted_recompute_percent``,
    ``min_recompute_tokens``, ``shifted_recompute_tail_tokens``); ``ValueError`` for a method no
    policy can plan."""
    for rx, settings in _PLANS:
        m = rx.fullmatch(method)
        if m is not None:
            pct, head, tail = settings(m)
            if pct > 100:
                raise ValueError(f"{method!r}: a percent above 100")
            return {"shifted_recompute_percent": pct, "min_recompute_tokens": head,
                    "shifted_recompute_tail_tokens": tail}  # fmt: skip
    raise ValueError(
        f"{method!r} is not a plan a policy can sign: none, leading:P%, leading:N, boundary:N, trailing:N "
        "or bookend:H+T"
    )


@dataclass(frozen=True, slots=True)
class Trial:
    """One warm run of one sampled request against its cold run."""

    task: str
    contract: str
    kind: Kind  # "shifted" when any approved span was shifted
    method: str  # the realization the warm run used (prefix trials: "as approved")
    regressed: bool  # by the response contract's comparison: the answer, or its required values
    changed_answer: bool | None = None  # the greedy answer differs at all (None: as ``regressed``)
    changed_values: bool | None = None  # its required values differ (None: as ``regressed``)


@dataclass(slots=True)
class Cell:
    """Trials of one scope, kind and method: regressions (what the contract counts), and both
    figures a comparison gives: changed answers and changed required values."""

    n: int = 0
    regressions: int = 0
    changed_answers: int = 0
    changed_values: int = 0

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson(self.regressions, self.n)

    def add(self, t: Trial) -> None:
        self.n += 1
        self.regressions += t.regressed
        self.changed_answers += t.regressed if t.changed_answer is None else t.changed_answer
        self.changed_values += t.regressed if t.changed_values is None else t.changed_values

    def verdict(self, budget: float, min_n: int) -> BudgetVerdict:
        return budget_verdict(self.regressions, self.n, budget, min_n)

    def doc(self) -> dict[str, Any]:
        """The cell as ``calibration.json`` writes it."""
        return {
            "n": self.n,
            "regressions": self.regressions,
            "ci95": self.ci95,
            "changed_answers": self.changed_answers,
            "changed_answers_ci95": wilson(self.changed_answers, self.n),
            "changed_required_values": self.changed_values,
            "changed_required_values_ci95": wilson(self.changed_values, self.n),
        }


@dataclass(slots=True)
class ScopeResult:
    """What calibration found for one (task, contract) scope, and what it recommends."""

    task: str
    contract: str
    prefix: Cell = field(default_factory=Cell)
    shifted: dict[str, Cell] = field(default_factory=dict)
    chosen: str | None = None  # the method kept; None with trials: shifted forbidden

    @property
    def measured_shifted(self) -> bool:
        return any(c.n for c in self.shifted.values())

    def rule(self) -> dict[str, Any] | None:
        """The quality rule for this scope, or None (nothing shifted was measured)."""
        if not self.measured_shifted:
            return None
        base: dict[str, Any] = {"task": self.task, "response_contract": self.contract}
        if self.chosen is None:
            return {**base, "allow_shifted": False}
        return {**base, "allow_shifted": True, **plan_settings(self.chosen)}


def aggregate(
    trials: Iterable[Trial], methods: Sequence[str], budget: float, min_n: int = 1
) -> list[ScopeResult]:
    """Per scope, sorted: counts per kind and method, and the first method within ``budget``
    (:func:`semgov.stats.budget_verdict`: at least ``min_n`` trials and the 95% upper bound within
    it; the rule canaries end probation by)."""
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget {budget} is not a rate in [0, 1]")
    for m in methods:
        plan_settings(m)
    scopes: dict[tuple[str, str], ScopeResult] = {}
    for t in trials:
        s = scopes.setdefault((t.task, t.contract), ScopeResult(t.task, t.contract))
        (s.prefix if t.kind == "prefix" else s.shifted.setdefault(t.method, Cell())).add(t)
    for s in scopes.values():
        s.chosen = next(
            (
                m
                for m in methods
                if (c := s.shifted.get(m)) is not None and c.verdict(budget, min_n).standing == "within"
            ),
            None,
        )
    return [scopes[k] for k in sorted(scopes)]


def overlay_yaml(base: bytes, source: str, results: Sequence[ScopeResult], note: str) -> bytes:
    """``base`` (a YAML policy) with the calibrated rules put first in ``quality.rules``.

    The result is parsed as a policy before it is returned (:class:`PolicyError` otherwise); YAML
    comments of the base are not kept (``note`` heads the file instead).
    """
    parse_policy(base, source)
    data = yaml.safe_load(base.decode("utf-8"))
    quality = dict(data.get("quality") or {})
    mine = [r for s in results if (r := s.rule()) is not None]
    scoped = {(r["task"], r["response_contract"]) for r in mine}
    kept = [r for r in quality.get("rules", []) if (r.get("task"), r.get("response_contract")) not in scoped]
    quality["rules"] = mine + kept
    data["quality"] = quality
    header = "".join(f"# {line}\n" for line in note.splitlines())
    out = (header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, explicit_end=True)).encode(
        "utf-8"
    )
    parse_policy(out, f"{source} (calibrated)")
    return out


def overlay_rego(text: str, source: str, results: Sequence[ScopeResult]) -> str:
    """A Rego policy module with its ``quality_rules := [...]`` line (one line) holding the
    calibrated rules first; :class:`PolicyError` when the module has no such line."""
    mine = [r for s in results if (r := s.rule()) is not None]
    scoped = {(r["task"], r["response_contract"]) for r in mine}
    return _with_rego_rules(
        text, source, lambda existing: mine + [r for r in existing if _scope_of(r) not in scoped]
    )


def _scope_of(rule: Any) -> tuple[Any, Any]:
    return (rule.get("task"), rule.get("response_contract")) if isinstance(rule, dict) else (None, None)


def _with_rego_rules(text: str, source: str, change: Any) -> str:
    """``text`` with its one-line ``quality_rules := [...]`` replaced by ``change(existing)``."""
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith("quality_rules := ")]
    if len(at) != 1:
        raise PolicyError(
            "no single one-line `quality_rules := [...]` parameter to calibrate (found "
            f"{len(at)}); the shipped policies/rego/default/policy.rego has one",
            source=source,
        )
    current = lines[at[0]].removeprefix("quality_rules := ").strip()
    try:
        existing = json.loads(current)
    except ValueError as e:
        raise PolicyError(
            f"quality_rules is not a JSON-style array on one line: {current[:80]}", source=source
        ) from e
    if not isinstance(existing, list):
        raise PolicyError(f"quality_rules is not an array: {current[:80]}", source=source)
    lines[at[0]] = f"quality_rules := {json.dumps(change(existing))}\n"
    return "".join(lines)


# ---- the policy a calibration run's recipients are decided by --------------------------------------

TRIAL_MARK = "+calibrate:"


def trial_rule(plan: str) -> dict[str, Any]:
    """The quality rule a calibration recipient is decided under: shifted reuse on, ``plan``'s
    realization, for every scope (first, so it is the one that applies)."""
    return {"allow_shifted": True, **plan_settings(plan)}


def trial_revision(revision: str, plan: str) -> str:
    """The revision a calibration recipient's decision records: the live revision, then the plan
    (``sha256:...+calibrate:bookend:16+256``): what decided it, readable from the record alone."""
    return f"{revision}{TRIAL_MARK}{plan}"


def trial_source(source: Any, plan: str) -> Any:
    """``source`` (a loaded YAML or Rego policy) with :func:`trial_rule` first in its quality rules,
    under :func:`trial_revision`: the policy a calibration run's recipients are decided by, the live
    one in every other respect. ``ValueError`` for a plan no policy can sign; :class:`PolicyError`
    when the policy forbids shifted reuse (``token_verification.allow_shifted: false``) or, for Rego,
    has no single one-line ``quality_rules := [...]`` to put the rule in."""
    import dataclasses

    from semgov.policy.rego.loader import RegoPolicy
    from semgov.policy.yaml.model import Policy, QualityRule

    rule = trial_rule(plan)
    revision = trial_revision(source.revision, plan)
    if isinstance(source, Policy):
        if not source.token_verification.allow_shifted:
            raise PolicyError(
                "token_verification.allow_shifted is false: this policy forbids shifted reuse, and "
                "no quality rule can turn it on; there is nothing to calibrate",
                source=f"{source.name}@{source.version}",
            )
        q = source.quality
        trial = source.model_copy(
            update={"quality": q.model_copy(update={"rules": [QualityRule(**rule), *q.rules]})}
        )
        trial._revision = revision
        return trial
    if isinstance(source, RegoPolicy):
        holders = [
            n
            for n, t in source.modules.items()
            if any(x.startswith("quality_rules := ") for x in t.splitlines())
        ]
        if len(holders) != 1:
            raise PolicyError(
                "no single module holds a one-line `quality_rules := [...]` parameter",
                source=str(source.directory),
            )
        name = holders[0]
        text = _with_rego_rules(source.modules[name], name, lambda existing: [rule, *existing])
        return dataclasses.replace(source, modules={**source.modules, name: text}, revision=revision)
    raise PolicyError(f"cannot calibrate a {type(source).__name__} policy", source=str(source))


def table(results: Sequence[ScopeResult], methods: Sequence[str], budget: float, min_n: int = 1) -> str:
    """The terminal summary: per scope, prefix trials and shifted regressions per method, with the
    changed answers and changed required values beside each."""
    width = max(24, *(len(m) + 2 for m in methods))
    head = " ".join(f"{m:>{width}}" for m in methods)
    out = [f"{'task':<22}{'contract':<16}{'prefix':>10} shifted regressions [95% interval] a/v: {head}  rule"]
    for s in results:
        cells = []
        for m in methods:
            c = s.shifted.get(m)
            if c is None or not c.n:
                cells.append(f"{'-':>{width}}")
            else:
                lo, hi = c.ci95
                counts = f"{c.changed_answers}/{c.changed_values}"
                text = f"{c.regressions}/{c.n} [{100 * lo:.0f}-{100 * hi:.0f}%] {counts}"
                cells.append(f"{text:>{width}}")
        r = s.rule()
        what = (
            "none (no shifted trial)"
            if r is None
            else json.dumps({k: v for k, v in r.items() if k not in ("task", "response_contract")})
        )
        out.append(
            f"{s.task:<22}{s.contract:<16}{f'{s.prefix.regressions}/{s.prefix.n}':>10} "
            f"{' '.join(cells)}  {what}"
        )
    out.append(
        "a/v: changed answers / changed required values (a regression is what the response contract "
        'compares: docs/policy.md "Comparing answers")'
    )
    out.append(
        f"budget: the first method with at least {min_n} trials whose regression rate's 95% upper bound "
        f"is <= {100 * budget:g}% is kept"
    )
    return "\n".join(out)
