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
number, ``"true"`` not a boolean). Every problem is a ``PolicyError`` naming ``file:line`` and
the field, worded as the policy lint words its own (``unknown key (did you mean 'patch'?)``),
never a decision; all of a file's problems are reported together.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import typing
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
from semgov.policy.explain import explain_rego_test, head_var
from semgov.policy.rego.loader import lint_ast, rego_files, syntax_diagnostic
from semgov.policy.yaml.model import did_you_mean
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
    doc: PolicyInput | None = None  # a decided case's input document, for --coverage


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
            head = head_var(r)
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


def _dataclass_in(tp: Any) -> Any:
    """The dataclass a field's type holds (``X``, ``X | None``, ``list[X]``), if any."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        found = _dataclass_in(arg)
        if found is not None:
            return found
    return None


def _input_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys a policy input document allows in the mapping at ``loc``."""
    tp: Any = PolicyInput
    for part in loc:
        if isinstance(part, int):
            continue  # NOTE: a list's item: tp is already the item's dataclass
        hints = typing.get_type_hints(tp) if tp is not None else {}
        tp = _dataclass_in(hints[part]) if part in hints else None
    return [f.name for f in dataclasses.fields(tp)] if tp is not None else []


def _doc_errors(
    e: ValidationError, lines: dict[Path_, int], sources: list[Path_], case_line: int
) -> list[tuple[str, str, int]]:
    """(field, message, line) of each of a document's validation errors, worded as the policy lint
    words them (``unknown key (did you mean 'similarity'?)``); the line is that of the deepest part
    of the field's path written in ``sources`` (the case's patch or input first, then the base),
    else the case's."""
    out = []
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        msg = err["msg"]
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            msg = "unknown key" + did_you_mean(str(loc[-1]), _input_keys(loc[:-1]))
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif not isinstance(err.get("input"), dict | list):
            msg = f"{msg} (got {_show(err.get('input'))})"
        best, line = 0, case_line
        for prefix in sources:
            for n in range(len(loc), best, -1):
                hit = lines.get((*prefix, *loc[:n]))
                if hit is not None:
                    best, line = n, hit
                    break
        out.append((".".join(map(str, loc)), msg, line))
    return out


class _Problems:
    """The problems found in one case file, each a ``PolicyError`` at ``file:line`` and field."""

    def __init__(self, src: str, lines: dict[Path_, int]) -> None:
        self.src, self.lines, self.found = src, lines, list[PolicyError]()

    def add(self, msg: str, where: Path_, field: str | None = None, line: int | None = None) -> None:
        at = line if line is not None else line_for(self.lines, where) or 1
        self.found.append(PolicyError(msg, source=self.src, line=at, field=field))

    def raise_all(self) -> None:
        """Raise the first problem found (cases in file order, a document's problems in field
        order), carrying the others (``semgov policy check`` and ``semgov policy test`` list them
        all; the message says how many more there are)."""
        if not self.found:
            return
        found = self.found
        first, more = found[0], len(found) - 1
        if more:
            first.message += f" [and {more} more problem{'s' if more > 1 else ''}]"
        first.others = tuple(found[1:])
        raise first


def _check_case(case: Any, i: int, problems: _Problems) -> str | None:
    """The structure of case ``i`` (not its document): its name when well formed, else ``None``
    with each problem added."""
    at: Path_ = ("cases", i)
    here = f"cases.{i}"
    if not isinstance(case, dict):
        problems.add(f"a case is a mapping with keys {', '.join(CASE_KEYS)}, got {_show(case)}", at, here)
        return None
    name = case.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.add(f"each case needs a `name` (a non-empty string), got {_show(name)}", at, here + ".name")
        return None
    before = len(problems.found)
    for key in case:
        if key not in CASE_KEYS:
            problems.add(f"case {name!r}: unknown key{did_you_mean(str(key), CASE_KEYS)} (keys: "
                         f"{', '.join(CASE_KEYS)})", (*at, key), f"{here}.{key}")  # fmt: skip
    if "input" in case and "patch" in case:
        problems.add(f"case {name!r}: give `input` or `patch`, not both", at, here)
    for key in ("input", "patch"):
        if key in case and not isinstance(case[key], dict):
            problems.add(
                f"case {name!r}: must be a mapping, got {_show(case[key])}", (*at, key), f"{here}.{key}"
            )
    expect = case.get("expect")
    if expect not in ("allow", "deny"):
        problems.add(f"case {name!r}: `expect` must be allow or deny, got {_show(expect)}", (*at, "expect"),
                     f"{here}.expect")  # fmt: skip
    gates = case.get("gates", {})
    if not isinstance(gates, dict):
        problems.add(f"case {name!r}: must be a mapping of gate to outcome, got {_show(gates)}",
                     (*at, "gates"), f"{here}.gates")  # fmt: skip
        gates = {}
    for gate, want in gates.items():
        if gate not in GATES:
            problems.add(f"case {name!r}: unknown gate{did_you_mean(str(gate), GATES)} (gates: "
                         f"{', '.join(GATES)})", (*at, "gates", gate), f"{here}.gates.{gate}")  # fmt: skip
        elif want not in GATE_RESULTS:
            problems.add(f"case {name!r}: a gate outcome is pass, fail or error, got {_show(want)}",
                         (*at, "gates", gate), f"{here}.gates.{gate}")  # fmt: skip
    return name if len(problems.found) == before else None


def load_case_file(path: Path, *, limits: Limits | None = None) -> list[Case]:
    """Read and validate every case of a YAML case file; any problem is a ``PolicyError`` at
    ``file:line``, the first in file order carrying every other one found (``others``).

    Types are exact: each case's document is validated strictly as a policy input document
    (no ``"0.9"`` for a number, no ``"true"`` for a boolean).
    """
    src = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"cannot read test file: {e}", source=src) from e
    data, lines = load_yaml_with_lines(text, src, limits=limits)
    problems = _Problems(src, lines)
    shape = "a case file is a mapping with `cases` (a list) and optionally `base` (a mapping)"
    if not isinstance(data, dict):
        problems.add(shape, ())
        problems.raise_all()
    for key in data:
        if key not in ("base", "cases"):
            problems.add(f"unknown key{did_you_mean(str(key), ('base', 'cases'))} ({shape})", (key,), key)
    base = data.get("base", {})
    if not isinstance(base, dict):
        problems.add(f"must be a mapping (a policy input document), got {_show(base)}", ("base",), "base")
    if not isinstance(data.get("cases"), list):
        problems.add(shape, ("cases",), "cases")
        problems.raise_all()
    out = []
    for i, case in enumerate(data["cases"]):
        name = _check_case(case, i, problems)
        if name is None or not isinstance(base, dict):
            continue
        at: Path_ = ("cases", i)
        case_line = line_for(lines, at) or 1
        if "input" in case:
            raw, sources = case["input"], [(*at, "input")]
        else:
            raw, sources = deep_merge(base, case.get("patch", {})), [(*at, "patch"), ("base",)]
        try:
            doc = input_adapter().validate_python(raw)
        except ValidationError as e:
            for field, msg, line in _doc_errors(e, lines, sources, case_line):
                problems.add(f"case {name!r}: {msg}", (), field, line=line)
            continue
        out.append(Case(name, case_line, doc, case["expect"], dict(case.get("gates", {}))))
    problems.raise_all()
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
        gates = tuple(got.items())
        out.append(TestOutcome(case.name, loc, status, "; ".join(problems), seconds, why, gates, case.doc))
    return out
