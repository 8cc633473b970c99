"""Why a policy test failed, for ``semgov policy test --explain``.

- A case (``*_test.yaml``): the deny set (each gate that did not pass, with its detail), the
  facts of the input document that gate reads, and the rule that decided it: the ``policy.yaml``
  line of the setting (YAML), or the ``file:line`` of each ``deny`` rule that fired (Rego,
  found by evaluating a copy of each ``deny`` rule alone on the case's input with regorus).
- A Rego ``test_*`` rule: the first statement of its body that does not hold (``file:line`` and
  its text, found by evaluating the body's prefixes with regorus), the local variables it reads
  as the statements before it bound them, and, when that statement evaluates under
  ``with input as ...``, the package's deny set under the same input.

Explanations are diagnostics: they never change a test's outcome, and a part that cannot be
computed says so instead of failing the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from semgov._internal.yamlload import load_yaml_with_lines
from semgov.policy.engine import EngineResult
from semgov.policy.rego.loader import PACKAGE, RegoPolicy
from semgov.wire.models import GateName
from semgov.wire.policy_input import PolicyInput, to_json_dict

# NOTE: the input fields each gate reads (docs/policy.md "Gates", column "facts used", spelled
# out per field); tests hold every path to the policy input schema.
GATE_FACTS: dict[GateName, tuple[str, ...]] = {
    "tenant": ("request.tenant", "facts.donor.tenant", "facts.donor.visibility"),
    "namespace": ("request.namespace", "facts.donor.namespace"),
    "provenance": ("candidate.key_id", "facts.provenance"),
    "expiry": ("now", "facts.donor.created_at", "facts.donor.expires_at"),
    "policy_version": ("facts.donor.policy_version",),
    "pii": ("facts.pii",),
    "task": ("request.task", "facts.donor.task"),
    "response_contract": ("request.response_contract", "facts.donor.response_contract"),
    "similarity": ("candidate.similarity",),
    "token_verification": ("request.prompt_tokens", "facts.tokens"),
}

# YAML: the setting that decides each gate (a gate with none is decided by semgov's built-in rule).
_YAML_SETTING: dict[GateName, tuple[str | int, ...] | None] = {
    "tenant": ("tenant",),
    "namespace": ("namespace", "sharing"),
    "provenance": None,
    "expiry": ("expiry",),
    "policy_version": ("accepted_policy_versions",),
    "pii": ("pii",),
    "task": ("task", "compatible_groups"),
    "response_contract": None,
    "similarity": ("similarity", "min"),
    "token_verification": ("token_verification",),
}
_INDEXED = re.compile(r"\b(tenant\.public_donors_for|namespace\.sharing|quality\.rules)\[(\d+)\]")
_SHOW = 240
_EXPLAIN = "__semgov_explain"


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def gate_facts(doc: dict[str, Any], gate: GateName) -> str:
    """``path=value`` for each input field ``gate`` reads (``facts.tokens`` without its span list)."""
    parts = []
    for path in GATE_FACTS[gate]:
        value = _get(doc, path)
        if path == "facts.tokens" and isinstance(value, dict) and isinstance(value.get("spans"), list):
            spans = value["spans"]
            value = {**value, "spans": [f"{s.get('kind')} {s.get('recipient_role')} x{s.get('length')}"
                                        for s in spans if isinstance(s, dict)]}  # fmt: skip
        parts.append(f"{path}={_short(value)}")
    return ", ".join(parts)


# ---- where a gate's decision comes from -------------------------------------------------


def yaml_rule(policy_path: Path, gate: GateName, detail: str) -> str:
    """``policy.yaml:LINE (setting)`` for the setting that decided ``gate``, or the built-in rule."""
    file = policy_path / "policy.yaml" if policy_path.is_dir() else policy_path
    setting: tuple[str | int, ...] | None = _YAML_SETTING[gate]
    m = _INDEXED.search(detail)
    if m is not None:
        section, key = m.group(1).split(".")
        setting = (section, key, int(m.group(2)))
    if setting is None:
        return f"semgov's built-in {gate} rule (docs/policy.md#gates; no policy setting)"
    try:
        _, lines = load_yaml_with_lines(file.read_text(encoding="utf-8"), str(file))
    except Exception:  # noqa: BLE001 - an explanation never fails the run
        return f"{file} ({'.'.join(map(str, setting))})"
    for n in range(len(setting), 0, -1):
        line = lines.get(setting[:n])
        if line is not None:
            return f"{file}:{line} ({_dotted(setting[:n])})"
    return f"{file} ({_dotted(setting)}: not set, the default applies)"


def _by_line(where: str) -> tuple[str, int]:
    path, _, line = where.rpartition(":")
    return path, int(line) if line.isdigit() else 0


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _spans(entry: dict[str, Any]) -> tuple[int, int, int]:
    span = entry["span"]
    return int(span["line"]), int(span["start"]), int(span["end"])


@lru_cache(maxsize=32)
def _rego_ast(path: str, text: str) -> dict[str, Any]:
    """regorus's AST of one module, parsed once per (path, text): an explanation of each failed
    case reads every module three times (deny rules, gate rules, settings).

    NOTE: callers only read the result (it is shared)."""
    import regorus

    eng = regorus.Engine()
    eng.add_policy(path, text)
    [entry] = json.loads(eng.get_ast_as_json())
    ast: dict[str, Any] = entry["ast"]
    return ast


def head_var(rule: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(name, span) of a rule head that is a plain variable (``deny contains``, ``test_x if``)."""
    head = rule.get("Spec", {}).get("head", {})
    for kind in head.values():
        ref = kind.get("refr") if isinstance(kind, dict) else None
        var = ref.get("Var") if isinstance(ref, dict) else None
        if isinstance(var, dict) and isinstance(var.get("value"), str):
            return var["value"], var["span"]
    return None


def _package_line(text: str) -> str:
    m = re.search(r"^\s*package\s+[^\n#]+", text, re.M)
    return m.group(0).strip() if m else f"package {PACKAGE}"


def _imports(text: bytes, ast: dict[str, Any]) -> list[str]:
    out = []
    for imp in ast.get("imports", []):
        _, start, end = _spans(imp)
        out.append(text[start:end].decode())
    return out


def _static_gate(rule: dict[str, Any]) -> str | None:
    """The gate a ``deny contains {"gate": "<literal>", ...}`` rule names, if written literally."""
    key = rule.get("Spec", {}).get("head", {}).get("Set", {}).get("key", {})
    for field in key.get("Object", {}).get("fields", []) if isinstance(key, dict) else []:
        k, v = field[1], field[2]
        if k.get("String", {}).get("value") == "gate" and "String" in v:
            return str(v["String"]["value"])
    return None


def rego_gate_rules(policy: RegoPolicy) -> dict[str, list[str]]:
    """gate -> ``file:line`` of each ``deny`` rule naming that gate literally."""
    out: dict[str, list[str]] = {}
    for fname, text in policy.modules.items():
        path = str(policy.directory / fname)
        if _package_line(text) != f"package {PACKAGE}":
            continue
        for rule in _rego_ast(path, text).get("rules", []):
            head = head_var(rule)
            gate = _static_gate(rule) if head is not None and head[0] == "deny" else None
            if gate is not None:
                out.setdefault(gate, []).append(f"{path}:{_spans(rule['Spec'])[0]}")
    return out


def rego_settings_read(policy: RegoPolicy) -> dict[str, list[str]]:
    """``file:line`` of each ``deny`` rule -> the constant settings (``name := <literal>``, no
    body) it reads, directly or through the package's other rules: ``name = value (file:line)``."""
    refs: dict[str, set[str]] = {}
    settings: dict[str, str] = {}
    denies: dict[str, set[str]] = {}
    for fname, text in policy.modules.items():
        path = str(policy.directory / fname)
        if _package_line(text) != f"package {PACKAGE}":
            continue
        raw = text.encode()
        for rule in _rego_ast(path, text).get("rules", []):
            head = head_var(rule)
            if head is None:
                continue
            spec = rule["Spec"]
            used = set(_vars(spec.get("bodies"))) | set(_vars(spec.get("head"))) - {head[0]}
            refs.setdefault(head[0], set()).update(used)
            assign = spec.get("head", {}).get("Compr", {}).get("assign")
            if isinstance(assign, dict) and not spec.get("bodies") and not any(_vars(assign)):
                line, start, end = _spans(spec)
                settings[head[0]] = f"{' '.join(raw[start:end].decode().split())} ({path}:{line})"
            if head[0] == "deny":
                denies[f"{path}:{_spans(spec)[0]}"] = used
    out: dict[str, list[str]] = {}
    for where, used in denies.items():
        seen, todo = set(), list(used)
        while todo:  # NOTE: bounded by the package's rule names
            name = todo.pop()
            if name in seen or name == "deny":
                continue
            seen.add(name)
            todo += refs.get(name, ())
        out[where] = [settings[n] for n in sorted(seen) if n in settings]
    return out


def rego_deny_rules(policy: RegoPolicy, doc: PolicyInput) -> dict[tuple[str, str], list[str]]:
    """``(gate, detail) -> ["file:line", ...]``: the ``deny`` rules of package ``semgov.reuse``
    that produce each entry of the deny set for ``doc``, each evaluated alone (a renamed copy)."""
    import regorus

    eng = regorus.Engine()
    copies: dict[str, str] = {}
    for fname, text in policy.modules.items():
        path = str(policy.directory / fname)
        eng.add_policy(path, text)
        raw = text.encode()
        ast = _rego_ast(path, text)
        if _package_line(text) != f"package {PACKAGE}":
            continue
        extra = [_package_line(text), *_imports(raw, ast)]
        for rule in ast.get("rules", []):
            head = head_var(rule)
            if head is None or head[0] != "deny":
                continue
            line, start, end = _spans(rule["Spec"])
            h0, h1 = int(head[1]["start"]), int(head[1]["end"])
            name = f"{_EXPLAIN}_{len(copies)}"
            extra.append((raw[start:h0] + name.encode() + raw[h1:end]).decode())
            copies[name] = f"{path}:{line}"
        if len(extra) > 1 + len(_imports(raw, ast)):
            eng.add_policy(f"{path}#explain", "\n\n".join(extra))
    from semgov.policy.rego.engines import input_json

    eng.set_input_json(input_json(doc))
    found: dict[tuple[str, str], list[str]] = {}
    for name, where in copies.items():
        try:
            rows = json.loads(eng.eval_query_as_json(f"x := data.{PACKAGE}.{name}")).get("result") or []
        except Exception:  # noqa: BLE001 - an explanation never fails the run
            continue
        entries = rows[0]["bindings"]["x"] if rows else []
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, dict):
                found.setdefault((str(e.get("gate")), str(e.get("detail"))), []).append(where)
    return found


def explain_case(
    policy: Any, policy_path: Path, doc: PolicyInput, result: EngineResult | None, gates: dict[str, str]
) -> list[str]:
    """The explanation of one failed case: deny set, facts, and the rule behind each gate shown."""
    data = to_json_dict(doc)
    if result is None:
        return ["the engine decided nothing (see the error); facts of every gate:",
                *(f"  {g}: {gate_facts(data, g)}" for g in GATE_FACTS)]  # fmt: skip
    shown = [o for o in result.gates if o.result != "pass" or gates.get(o.gate, o.result) != o.result]
    denied = [f"{o.gate} {o.result}" for o in result.gates if o.result != "pass"]
    out = ["deny set: " + (", ".join(denied) if denied else "(empty: every gate passed)")]
    if not shown:
        shown = list(result.gates)  # an unexpected allow: why each gate passed
    where: dict[tuple[str, str], list[str]] = {}
    by_gate: dict[str, list[str]] = {}
    reads: dict[str, list[str]] = {}
    if isinstance(policy, RegoPolicy):
        try:
            where, by_gate, reads = (
                rego_deny_rules(policy, doc),
                rego_gate_rules(policy),
                rego_settings_read(policy),
            )
        except Exception as e:  # noqa: BLE001 - an explanation never fails the run
            out.append(f"(deny rules not located: {type(e).__name__}: {str(e)[:120]})")
    for o in shown:
        out.append(f"{o.gate} {o.result}: {o.detail}")
        out.append(f"  facts: {gate_facts(data, o.gate)}")
        if o.result == "error":
            errors = _short(data["facts"].get("errors"))
            out.append(f"  rule: none (a fact could not be computed: facts.errors={errors})")
        elif isinstance(policy, RegoPolicy):
            rules = sorted({w for (g, _), ws in where.items() if g == o.gate for w in ws}, key=_by_line)
            if rules:
                out.append("  rule: " + ", ".join(rules))
                used = sorted({x for r in rules for x in reads.get(r, ())})
                out += [f"  setting: {x}" for x in used]
            else:
                named = ", ".join(by_gate.get(o.gate, [])) or "none names it literally"
                out.append(f"  rule: no deny rule fired for this gate (deny rules for {o.gate}: {named})")
                used = sorted({x for r in by_gate.get(o.gate, []) for x in reads.get(r, ())})
                out += [f"  setting: {x}" for x in used]
        else:
            out.append(f"  rule: {yaml_rule(policy_path, o.gate, o.detail)}")
    return out


# ---- Rego test rules --------------------------------------------------------------------


def _vars(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        var = node.get("Var")
        if isinstance(var, dict) and isinstance(var.get("value"), str):
            yield var["value"]
        for v in node.values():
            yield from _vars(v)
    elif isinstance(node, list):
        for v in node:
            yield from _vars(v)


def _assigned(stmt: dict[str, Any]) -> Iterable[str]:
    """Variables a statement binds with ``:=`` (or declares with ``some``)."""
    lit = stmt.get("literal", {})
    expr = lit.get("Expr", {}).get("expr", {}) if isinstance(lit, dict) else {}
    assign = expr.get("AssignExpr") if isinstance(expr, dict) else None
    if isinstance(assign, dict):
        yield from _vars(assign.get("lhs"))
    some = lit.get("SomeVars") if isinstance(lit, dict) else None
    if isinstance(some, dict):
        yield from _vars(some.get("vars"))


def explain_rego_test(directory: Path, sources: dict[str, str], test_path: str, rule: str) -> list[str]:
    """Where Rego test ``rule`` (in ``test_path``) stops holding, and the values it saw there."""
    import regorus

    text = next((t for f, t in sources.items() if str(directory / f) == test_path), None)
    if text is None:
        return ["(test module not found)"]
    raw = text.encode()
    ast = _rego_ast(test_path, text)
    bodies = [r["Spec"]["bodies"][0]["query"]["stmts"] for r in ast.get("rules", [])
              if (h := head_var(r)) is not None and h[0] == rule and r["Spec"].get("bodies")]  # fmt: skip
    if not bodies:
        return ["(the rule has no body to explain)"]
    stmts = bodies[0]
    texts = [raw[_spans(s)[1] : _spans(s)[2]].decode() for s in stmts]
    pkg = _package_line(text)
    head = [pkg, *_imports(raw, ast)]
    probes = [f"{_EXPLAIN}_{k} if {{\n" + "\n".join(texts[:k]) + "\n}" for k in range(1, len(stmts) + 1)]
    eng = regorus.Engine()
    for f, t in sources.items():
        eng.add_policy(str(directory / f), t)
    eng.add_policy(f"{test_path}#explain", "\n\n".join([*head, *probes]))
    eng.set_input_json("{}")
    ref = "data." + pkg.split(None, 1)[1].strip()
    failed = None
    for k in range(1, len(stmts) + 1):
        try:
            if eng.eval_rule(f"{ref}.{_EXPLAIN}_{k}") is not True:
                failed = k - 1
                break
        except Exception as e:  # noqa: BLE001
            line = _spans(stmts[k - 1])[0]
            return [f"{test_path}:{line}: `{_one_line(texts[k - 1])}` raised: {str(e).splitlines()[0][:200]}"]
    if failed is None:
        return ["every statement of the body holds on its own (the rule's value is not `true`?)"]
    line = _spans(stmts[failed])[0]
    out = [f"{test_path}:{line}: `{_one_line(texts[failed])}` is false or undefined"]
    bound = {v for s in stmts[:failed] for v in _assigned(s)}
    wanted = [v for v in dict.fromkeys(_vars(stmts[failed])) if v in bound]
    prior = "\n".join(texts[:failed])
    extra = [f"{_EXPLAIN}_v_{v} := {v} if {{\n{prior}\n}}" for v in wanted]
    mods = [raw[_spans(m)[1] : _spans(m)[2]].decode() for m in stmts[failed].get("with_mods") or []]
    if mods:
        body = prior + "\n" if prior else ""
        extra.append(f"{_EXPLAIN}_deny := d if {{\n{body}d := data.{PACKAGE}.deny {' '.join(mods)}\n}}")
    if extra:
        eng.add_policy(f"{test_path}#explain-values", "\n\n".join([*head, *extra]))
        for v in wanted:
            out.append(f"  {v} = {_value(eng, f'{ref}.{_EXPLAIN}_v_{v}')}")
        if mods:
            out.append(f"  deny set ({' '.join(mods)}) = {_value(eng, f'{ref}.{_EXPLAIN}_deny')}")
    return out


def _value(eng: Any, ref: str) -> str:
    try:
        rows = json.loads(eng.eval_query_as_json(f"x := {ref}")).get("result") or []
    except Exception as e:  # noqa: BLE001
        return f"(not computed: {str(e).splitlines()[0][:120]})"
    return _short(rows[0]["bindings"]["x"]) if rows else "undefined"


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 160 else flat[:157] + "..."
