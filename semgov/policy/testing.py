"""Policy unit tests: Rego ``test_*`` rules and YAML case files, for ``semgov policy test``.

Rego tests follow the ``opa test`` convention: every rule whose name starts with
``test_`` in a ``*_test.rego`` module passes when it evaluates to ``true``.

YAML case files (``*_test.yaml`` in the policy directory) are engine-agnostic:
policy input documents and the decision expected for them::

    base: {<a full policy input document>}      # optional
    cases:
      - name: another tenant is denied
        patch: {facts: {donor: {tenant: globex}}}   # deep-merged into base
        # or: input: {<a full document>}
        expect: deny                               # allow | deny
        gates: {tenant: fail, similarity: pass}    # optional: outcomes to check

A whole case file is validated before any case runs (``semgov policy check`` does
only that): each case's document strictly, as JSON types (``"0.9"`` is not a
number, ``"true"`` not a boolean). A malformed case is a ``PolicyError`` naming
``file:line`` and the field, never a decision.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from semgov._internal.yamlload import Path_, line_for, load_yaml_with_lines
from semgov.errors import PolicyError
from semgov.intake.limits import Limits
from semgov.policy.checks import checked_result
from semgov.policy.engine import EngineResult, PolicyEngine
from semgov.policy.explain import _head_var, explain_rego_test
from semgov.policy.rego.loader import lint_ast, rego_files, syntax_diagnostic
from semgov.wire.models import GATES
from semgov.wire.policy_input import PolicyInput

OPA_INPROCESS_HINT = (
    "--engine opa-inprocess needs opa-golib-python-bindings "
    "(pip install --no-deps --ignore-requires-python opa-golib-python-bindings==0.4.4)"
)


@dataclass(frozen=True)
class TestOutcome:
    name: str
    location: str
    status: str  # "PASS" | "FAIL" | "ERROR"
    message: str
    seconds: float
    explanation: tuple[str, ...] = ()  # --explain: why it failed (semgov.policy.explain)
    gates: tuple[tuple[str, str], ...] = ()  # a case's (gate, outcome) pairs, for --coverage


# ---- Rego -----------------------------------------------------------------


def discover_rego_tests(directory: Path) -> list[tuple[str, str, str]]:
    """(package, rule, ``file:line``) of every ``test_*`` rule in the ``*_test.rego`` modules (the
    line of its first definition)."""
    import regorus

    _, tests = rego_files(directory)
    found = []
    for fname, text in tests.items():
        eng = regorus.Engine()
        path = str(directory / fname)
        try:
            eng.add_policy(path, text)
        except Exception as e:  # noqa: BLE001
            raise PolicyError(syntax_diagnostic(path, e).message, source=path) from e
        [entry] = json.loads(eng.get_ast_as_json())
        pkg, rules, _ = lint_ast(path, entry["ast"])
        lines: dict[str, int] = {}
        for r in entry["ast"].get("rules", []):
            head = _head_var(r)
            if head is not None:
                lines.setdefault(head[0], int(head[1]["line"]))
        for rule in sorted(r for r in rules if r.startswith("test_")):
            found.append((str(pkg), rule, f"{path}:{lines[rule]}" if rule in lines else path))
    return found


def run_rego_tests(
    directory: Path, *, run: re.Pattern[str] | None = None, engine: str = "regorus", explain: bool = False
) -> list[TestOutcome]:
    """Evaluate every Rego test rule (matching ``run`` on ``data.<pkg>.<rule>``); with ``explain``,
    a failed one says where its body stopped holding (:func:`semgov.policy.explain.explain_rego_test`)."""
    modules, tests = rego_files(directory)
    selected = [t for t in discover_rego_tests(directory) if run is None or run.search(f"data.{t[0]}.{t[1]}")]
    if not selected:
        return []
    evaluate = _rego_evaluator(directory, {**modules, **tests}, engine)
    out = []
    for pkg, rule, where in selected:
        name = f"data.{pkg}.{rule}"
        path = where.rsplit(":", 1)[0] if where.rsplit(":", 1)[-1].isdigit() else where
        t0 = time.perf_counter()
        try:
            value = evaluate(name)
            status = "PASS" if value is True else "FAIL"
            msg = (
                ""
                if value is True
                else f"evaluated to {json.dumps(value)}"
                if value is not None
                else "undefined"
            )
        except Exception as e:  # noqa: BLE001
            status, msg = "ERROR", str(e).split("Stack backtrace:")[0].strip().splitlines()[0]
        seconds = time.perf_counter() - t0
        why: tuple[str, ...] = ()
        if explain and status != "PASS":
            why = _explained(explain_rego_test, directory, {**modules, **tests}, path, rule)
        out.append(TestOutcome(name, where, status, msg, seconds, why))
    return out


def gate_coverage(outcomes: list[TestOutcome]) -> dict[str, dict[str, int]]:
    """Per gate, how many decided cases saw it pass, fail and error (Rego test rules decide no
    gates and count nothing)."""
    table: dict[str, dict[str, int]] = {g: dict.fromkeys(GATE_RESULTS, 0) for g in GATES}
    for o in outcomes:
        for gate, result in o.gates:
            table[gate][result] += 1
    return table


@dataclass(frozen=True)
class FileCoverage:
    """Lines of one policy module the tests evaluated (``covered``) and did not (``not_covered``)."""

    path: str
    covered: tuple[int, ...]
    not_covered: tuple[int, ...]

    @property
    def share(self) -> float:
        n = len(self.covered) + len(self.not_covered)
        return len(self.covered) / n if n else 1.0


def rego_coverage(directory: Path, *, run: re.Pattern[str] | None = None) -> list[FileCoverage]:
    """Line coverage of the policy modules (not the ``*_test.rego`` ones) by the selected Rego tests,
    measured by regorus (the real OPA's coverage is not reachable through its Python bindings)."""
    import regorus

    modules, tests = rego_files(directory)
    eng = regorus.Engine()
    for fname, text in {**modules, **tests}.items():
        eng.add_policy(str(directory / fname), text)
    eng.set_enable_coverage(True)
    eng.set_input_json("{}")
    for pkg, rule, _ in discover_rego_tests(directory):
        name = f"data.{pkg}.{rule}"
        if run is None or run.search(name):
            try:
                eng.eval_rule(name)
            except Exception:  # noqa: BLE001 - a test that errors covers what it reached
                pass
    report = json.loads(eng.get_coverage_report_as_json())
    wanted = {str(directory / f) for f in modules}
    return [
        FileCoverage(f["path"], tuple(f["covered"]), tuple(f["not_covered"]))
        for f in report.get("files", [])
        if f.get("path") in wanted
    ]


def _explained(make: Callable[..., list[str]], *args: Any) -> tuple[str, ...]:
    """``make(*args)``: an explanation, or why there is none: explaining never fails a run."""
    try:
        return tuple(make(*args))
    except Exception as e:  # noqa: BLE001
        return (f"(no explanation: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})",)


def _rego_evaluator(directory: Path, sources: dict[str, str], engine: str) -> Any:
    if engine == "opa-inprocess":
        try:
            from opa_bindings import OpaEngine
        except ImportError as e:
            raise PolicyError(OPA_INPROCESS_HINT) from e

        opa = OpaEngine()
        for fname, text in sources.items():
            opa.add_policy(str(directory / fname), text)

        def ev_opa(ref: str) -> Any:
            rows = opa.eval_query(f"x := {ref}")
            return rows[0]["x"] if rows else None

        return ev_opa
    import regorus

    eng = regorus.Engine()
    for fname, text in sources.items():
        eng.add_policy(str(directory / fname), text)

    def ev_regorus(ref: str) -> Any:
        return eng.eval_rule(ref)

    return ev_regorus


# ---- YAML case files ----------------------------------------------------

CASE_KEYS = ("name", "input", "patch", "expect", "gates")
GATE_RESULTS = ("pass", "fail", "error")


@cache
def input_adapter() -> TypeAdapter[PolicyInput]:
    """Validates a policy input document (strict JSON types, as case files are)."""
    return TypeAdapter(PolicyInput)


def deep_merge(base: Any, patch: Any) -> Any:
    """``patch`` over ``base``: mappings merge recursively, anything else replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = deep_merge(base.get(k), v) if k in base else v
        return out
    return patch


def case_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*_test.yaml")) if directory.is_dir() else []


@dataclass(frozen=True)
class Case:
    """One validated case: its policy input document and the expected outcomes."""

    name: str
    line: int
    doc: PolicyInput
    expect: str  # "allow" | "deny"
    gates: dict[str, str]


def _show(value: Any) -> str:
    """A short rendering of a wrong value, for a message."""
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


def _doc_error(
    e: ValidationError, lines: dict[Path_, int], sources: list[Path_], case_line: int
) -> tuple[str, str, int]:
    """(field, message, line) of a document's first validation error; the line is that of the
    deepest part of the field's path written in ``sources`` (the case's patch or input first, then
    the base), else the case's."""
    errors = e.errors(include_url=False)
    err = errors[0]
    loc = tuple(err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    elif not isinstance(err.get("input"), dict | list):
        msg = f"{msg} (got {_show(err.get('input'))})"
    if len(errors) > 1:
        msg += f" [and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''}]"
    best, line = 0, case_line
    for prefix in sources:
        for n in range(len(loc), best, -1):
            hit = lines.get((*prefix, *loc[:n]))
            if hit is not None:
                best, line = n, hit
                break
    return ".".join(map(str, loc)), msg, line


def load_case_file(path: Path, *, limits: Limits | None = None) -> list[Case]:
    """Read and validate every case of a YAML case file; any problem is a ``PolicyError`` at ``file:line``.

    Types are exact: each case's document is validated strictly as a policy input document
    (no ``"0.9"`` for a number, no ``"true"`` for a boolean).
    """
    src = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"cannot read test file: {e}", source=src) from e
    data, lines = load_yaml_with_lines(text, src, limits=limits)

    def fail(msg: str, where: Path_, field: str | None = None) -> PolicyError:
        return PolicyError(msg, source=src, line=line_for(lines, where) or 1, field=field)

    shape = "a case file is a mapping with `cases` (a list) and optionally `base` (a mapping)"
    if not isinstance(data, dict):
        raise fail(shape, ())
    for key in data:
        if key not in ("base", "cases"):
            raise fail(f"unknown key ({shape})", (key,), key)
    if not isinstance(data.get("cases"), list):
        raise fail(shape, ("cases",), "cases")
    base = data.get("base", {})
    if not isinstance(base, dict):
        raise fail(f"must be a mapping (a policy input document), got {_show(base)}", ("base",), "base")
    out = []
    for i, case in enumerate(data["cases"]):
        at: Path_ = ("cases", i)
        here = f"cases.{i}"
        if not isinstance(case, dict):
            raise fail(f"a case is a mapping with keys {', '.join(CASE_KEYS)}, got {_show(case)}", at, here)
        name = case.get("name")
        if not isinstance(name, str) or not name.strip():
            raise fail(
                f"each case needs a `name` (a non-empty string), got {_show(name)}", at, here + ".name"
            )
        for key in case:
            if key not in CASE_KEYS:
                raise fail(
                    f"case {name!r}: unknown key (keys: {', '.join(CASE_KEYS)})", (*at, key), f"{here}.{key}"
                )
        if "input" in case and "patch" in case:
            raise fail(f"case {name!r}: give `input` or `patch`, not both", at, here)
        for key in ("input", "patch"):
            if key in case and not isinstance(case[key], dict):
                raise fail(
                    f"case {name!r}: must be a mapping, got {_show(case[key])}", (*at, key), f"{here}.{key}"
                )
        expect = case.get("expect")
        if expect not in ("allow", "deny"):
            raise fail(f"case {name!r}: `expect` must be allow or deny, got {_show(expect)}", (*at, "expect"),
                       f"{here}.expect")  # fmt: skip
        gates = case.get("gates", {})
        if not isinstance(gates, dict):
            raise fail(f"case {name!r}: must be a mapping of gate to outcome, got {_show(gates)}",
                       (*at, "gates"), f"{here}.gates")  # fmt: skip
        for gate, want in gates.items():
            if gate not in GATES:
                raise fail(f"case {name!r}: unknown gate (gates: {', '.join(GATES)})", (*at, "gates", gate),
                           f"{here}.gates.{gate}")  # fmt: skip
            if want not in GATE_RESULTS:
                raise fail(f"case {name!r}: a gate outcome is pass, fail or error, got {_show(want)}",
                           (*at, "gates", gate), f"{here}.gates.{gate}")  # fmt: skip
        case_line = line_for(lines, at) or 1
        if "input" in case:
            raw, sources = case["input"], [(*at, "input")]
        else:
            raw, sources = deep_merge(base, case.get("patch", {})), [(*at, "patch"), ("base",)]
        try:
            doc = input_adapter().validate_python(raw)
        except ValidationError as e:
            field, msg, line = _doc_error(e, lines, sources, case_line)
            raise PolicyError(
                f"case {name!r}: not a valid policy input document: {msg}", source=src, line=line, field=field
            ) from e
        out.append(Case(name, case_line, doc, expect, dict(gates)))
    return out


Explain = Callable[[PolicyInput, EngineResult | None, dict[str, str]], list[str]]


def run_case_file(
    path: Path, engine: PolicyEngine, *, run: re.Pattern[str] | None = None, explain: Explain | None = None
) -> list[TestOutcome]:
    """Run the cases of one YAML case file through ``engine`` (with semgov's fail-closed checks);
    ``explain`` (``--explain``) is asked why each case that did not pass failed.

    The whole file is validated first (:func:`load_case_file`), whatever ``run`` selects: a
    malformed case is a ``PolicyError``, never a decision.
    """
    src = str(path)
    out = []
    for case in load_case_file(path):
        if run is not None and not run.search(case.name):
            continue
        loc = f"{src}:{case.line}"
        t0 = time.perf_counter()
        try:
            result = checked_result(engine.evaluate(case.doc), case.doc)
        except Exception as e:  # noqa: BLE001
            why = _explained(explain, case.doc, None, case.gates) if explain else ()
            msg = f"engine failed: {type(e).__name__}: {e}"
            out.append(TestOutcome(case.name, loc, "ERROR", msg, time.perf_counter() - t0, why))
            continue
        allow = all(g.result == "pass" for g in result.gates) and bool(result.approved_spans)
        got: dict[str, str] = {g.gate: g.result for g in result.gates}
        problems = []
        if ("allow" if allow else "deny") != case.expect:
            bad = [f"{g.gate} {g.result}: {g.detail}" for g in result.gates if g.result != "pass"]
            problems.append(f"expected {case.expect}, got {'allow' if allow else 'deny'} ({'; '.join(bad)})")
        for gate, want in case.gates.items():
            if got.get(gate) != want:
                problems.append(f"gate {gate}: expected {want}, got {got.get(gate, 'nothing')}")
        status = "FAIL" if problems else "PASS"
        seconds = time.perf_counter() - t0
        why = _explained(explain, case.doc, result, case.gates) if explain and problems else ()
        out.append(TestOutcome(case.name, loc, status, "; ".join(problems), seconds, why, tuple(got.items())))
    return out
