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
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from semgov._internal.yamlload import load_yaml_with_lines
from semgov.engine import PolicyEngine
from semgov.errors import PolicyError
from semgov.models import GATES
from semgov.policy_input import PolicyInput
from semgov.rego_policy import lint_ast, rego_files, syntax_diagnostic


@dataclass(frozen=True)
class TestOutcome:
    name: str
    location: str
    status: str  # "PASS" | "FAIL" | "ERROR"
    message: str
    seconds: float


# ---- Rego -----------------------------------------------------------------


def discover_rego_tests(directory: Path) -> list[tuple[str, str, str]]:
    """(package, rule, file) of every ``test_*`` rule in the ``*_test.rego`` modules."""
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
        for rule in sorted(r for r in rules if r.startswith("test_")):
            found.append((str(pkg), rule, path))
    return found


def run_rego_tests(
    directory: Path, *, run: re.Pattern[str] | None = None, engine: str = "regorus"
) -> list[TestOutcome]:
    """Evaluate every Rego test rule (matching ``run`` on ``data.<pkg>.<rule>``)."""
    modules, tests = rego_files(directory)
    selected = [t for t in discover_rego_tests(directory) if run is None or run.search(f"data.{t[0]}.{t[1]}")]
    if not selected:
        return []
    evaluate = _rego_evaluator(directory, {**modules, **tests}, engine)
    out = []
    for pkg, rule, path in selected:
        name = f"data.{pkg}.{rule}"
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
        out.append(TestOutcome(name, path, status, msg, time.perf_counter() - t0))
    return out


def _rego_evaluator(directory: Path, sources: dict[str, str], engine: str) -> Any:
    if engine == "opa-inprocess":
        from opa_bindings import OpaEngine

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


@cache
def _input_adapter() -> TypeAdapter[PolicyInput]:
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


def run_case_file(
    path: Path, engine: PolicyEngine, *, run: re.Pattern[str] | None = None
) -> list[TestOutcome]:
    """Run the cases of one YAML case file through ``engine`` (with semgov's fail-closed checks)."""
    from semgov.decide import checked_result

    src = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"cannot read test file: {e}", source=src) from e
    data, lines = load_yaml_with_lines(text, src)
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or set(data) - {"base", "cases"}:
        raise PolicyError(
            "a case file is a mapping with `cases` (a list) and optionally `base`", source=src, line=1
        )
    base = data.get("base", {})
    out = []
    for i, case in enumerate(data["cases"]):
        line = lines.get(("cases", i))
        loc = f"{src}:{line}"
        if not isinstance(case, dict) or not isinstance(case.get("name"), str):
            raise PolicyError("each case needs a `name`", source=src, line=line)
        name = case["name"]
        if run is not None and not run.search(name):
            continue
        unknown = set(case) - {"name", "input", "patch", "expect", "gates"}
        if unknown or case.get("expect") not in ("allow", "deny"):
            raise PolicyError(
                f"case {name!r}: keys are name, input|patch, expect (allow|deny), gates; got {sorted(case)}",
                source=src,
                line=line,
            )
        t0 = time.perf_counter()
        try:
            raw = case["input"] if "input" in case else deep_merge(base, case.get("patch", {}))
            doc = _input_adapter().validate_python(raw)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            where = ".".join(map(str, err["loc"]))
            out.append(TestOutcome(name, loc, "ERROR", f"invalid input: {where}: {err['msg']}", 0.0))
            continue
        try:
            result = checked_result(engine.evaluate(doc), doc)
        except Exception as e:  # noqa: BLE001
            out.append(TestOutcome(name, loc, "ERROR", f"engine failed: {type(e).__name__}: {e}", 0.0))
            continue
        allow = all(g.result == "pass" for g in result.gates) and bool(result.approved_spans)
        got = {g.gate: g.result for g in result.gates}
        problems = []
        if ("allow" if allow else "deny") != case["expect"]:
            bad = [f"{g.gate} {g.result}: {g.detail}" for g in result.gates if g.result != "pass"]
            problems.append(
                f"expected {case['expect']}, got {'allow' if allow else 'deny'} ({'; '.join(bad)})"
            )
        for gate, want in (case.get("gates") or {}).items():
            if gate not in GATES:
                problems.append(f"unknown gate {gate!r}")
            elif got[gate] != want:
                problems.append(f"gate {gate}: expected {want}, got {got[gate]}")
        status = "FAIL" if problems else "PASS"
        out.append(TestOutcome(name, loc, status, "; ".join(problems), time.perf_counter() - t0))
    return out
