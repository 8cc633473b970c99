"""Rego reuse policies: the package convention, loading and linting.

A Rego policy directory holds ``*.rego`` modules (``*_test.rego`` files are unit
tests, not policy) in ``package semgov.reuse`` over the policy input document
(``schemas/policy_input.schema.json``). Required rules:

- ``metadata := {"name": ..., "version": ...}``: a constant object;
- ``deny``: a set of ``{"gate": <gate name>, "detail": <string>}`` objects;
- ``allow``: a boolean, true exactly when ``deny`` is empty;
- ``approved_spans``: the spans to copy on allow, each
  ``{"recipient_start", "donor_start", "length", "kind"}`` and optionally ``"recompute"``, the
  leading tokens the engine must compute instead of copying (the quality plan; absent: 0).

Optional: ``facts_config``, a constant object with the parameters of fact
computation (see :class:`semgov.facts.config.FactConfig`). Policies read the clock
from ``input.now``; non-deterministic builtins are refused at load.
See docs/rego.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from semgov.errors import PolicyError
from semgov.facts.config import DEFAULT_FORBIDDEN_PII, FactConfig
from semgov.facts.pii import DEFAULT_PHONE_REGIONS
from semgov.intake.limits import Limits, resolve
from semgov.policy.files import rego_paths
from semgov.policy.rules import RequestScope, SharingRule, TaskSection

PACKAGE = "semgov.reuse"
REQUIRED_RULES = ("metadata", "deny", "allow", "approved_spans")
# Builtins whose result depends on something other than the input document.
FORBIDDEN_BUILTINS = re.compile(
    r"^(time\.now_ns|http\.send|net\.lookup_ip_addr|opa\.runtime|rand\..+|uuid\..+|io\.jwt\.decode_verify)$"
)


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


class _FactsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    min_span_tokens: int = Field(default=32, ge=1)
    scan_donor_text: bool = True
    pii_min_score: float = Field(default=0.4, ge=0.0, le=1.0)
    phone_regions: list[str] = Field(default_factory=lambda: list(DEFAULT_PHONE_REGIONS), min_length=1)
    pii_entities: list[str] = Field(default_factory=lambda: list(DEFAULT_FORBIDDEN_PII))


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    version: str = Field(pattern=r"^[A-Za-z0-9_.+-]{1,64}$")


def syntax_diagnostic(name: str, err: Exception) -> Diagnostic:
    text = str(err).split("Stack backtrace:")[0].strip()
    m = re.search(r"-->\s*(.+?):(\d+):(\d+)", text)
    msg = re.search(r"error:\s*(.+)", text)
    message = msg.group(1).strip() if msg else text.splitlines()[-1] if text else "parse error"
    return Diagnostic(name, int(m.group(2)) if m else None, f"syntax error: {message}")


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _ref_name(ref: Any) -> str | None:
    """Dotted name of a reference AST node (``time.now_ns``), or None when not a plain path."""
    if not isinstance(ref, dict):
        return None
    if "Var" in ref:
        return str(ref["Var"]["value"])
    if "RefDot" in ref:
        base = _ref_name(ref["RefDot"]["refr"])
        field_ = ref["RefDot"]["field"]
        return f"{base}.{field_[1]}" if base is not None else None
    return None


def lint_ast(name: str, ast: dict[str, Any]) -> tuple[str | None, set[str], list[Diagnostic]]:
    """Package name, rule names defined, and forbidden-builtin diagnostics of one module."""
    pkg = _ref_name(ast.get("package", {}).get("refr"))
    rules: set[str] = set()
    for rule in ast.get("rules", []):
        head = rule.get("Spec", {}).get("head", {})
        for kind in head.values():  # {"Compr" | "Set" | "Func": {"refr": ...}}
            n = _ref_name(kind.get("refr")) if isinstance(kind, dict) else None
            if n:
                rules.add(n.split(".")[0])
        if "Default" in rule:
            n = _ref_name(rule["Default"].get("refr"))
            if n:
                rules.add(n.split(".")[0])
    diags = []
    for node in _walk(ast.get("rules", [])):
        call = node.get("Call")
        if isinstance(call, dict):
            fname = _ref_name(call.get("fcn"))
            if fname and FORBIDDEN_BUILTINS.match(fname):
                line = call.get("span", {}).get("line")
                diags.append(
                    Diagnostic(
                        name,
                        line,
                        f"{fname}() is not allowed: policies must be deterministic "
                        "functions of the input (read the clock from input.now)",
                    )
                )
    return pkg, rules, diags


@dataclass
class RegoPolicy:
    """A loaded Rego policy directory."""

    directory: Path
    modules: dict[str, str]  # file name -> source (policy files only)
    tests: dict[str, str]  # file name -> source (*_test.rego)
    name: str
    version: str
    revision: str
    fact_config: FactConfig
    engine_name: str = "regorus"
    extra: dict[str, Any] = field(default_factory=dict)


# Strings ("..." with escapes, `raw`), comments, brackets and newlines: all that nesting depends on.
_REGO_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|#[^\n]*|[\[\](){}]|\n')


def rego_nesting_error(text: str, source: str, limits: Limits) -> PolicyError | None:
    """A PolicyError at the first bracket nested deeper than ``max_rego_depth``, if any.

    NOTE: regorus parses nested ``[``/``{`` terms in time exponential in their depth (about
    x2 a level: 12 levels take ~0.3 s, 20 levels minutes), so a tiny module could hang a load.
    """
    depth = 0
    line = 1
    for m in _REGO_TOKEN.finditer(text):
        tok = m.group()
        if tok == "\n":
            line += 1
        elif tok in ("(", "[", "{"):
            depth += 1
            if depth > limits.max_rego_depth:
                return PolicyError(
                    f"brackets nested deeper than {limits.max_rego_depth} levels "
                    f"({limits.describe('max_rego_depth')})",
                    source=source,
                    line=line,
                )
        elif tok in (")", "]", "}"):
            depth = max(depth - 1, 0)
        elif tok[0] == "`":
            line += tok.count("\n")
    return None


def rego_files(directory: Path, *, limits: Limits | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Policy modules and test modules of a directory, by relative name.

    ``limits`` (default: :meth:`Limits.from_env`): each module, and all of them together, at
    most ``max_policy_bytes``; brackets nested at most ``max_rego_depth`` levels.
    """
    lim = resolve(limits)
    modules: dict[str, str] = {}
    tests: dict[str, str] = {}
    total = 0
    for path in rego_paths(directory):  # NOTE: never hidden entries or temporary copies
        rel = path.relative_to(directory).as_posix()
        try:
            with path.open("rb") as f:
                raw = f.read(lim.max_policy_bytes + 1)
            total += len(raw)
            if len(raw) > lim.max_policy_bytes:
                raise PolicyError(
                    f"Rego module is over {lim.max_policy_bytes} bytes ({lim.describe('max_policy_bytes')})",
                    source=str(path),
                )
            if total > lim.max_policy_bytes:
                raise PolicyError(
                    f"the policy's Rego modules total over {lim.max_policy_bytes} bytes by this one "
                    f"({lim.describe('max_policy_bytes')})",
                    source=str(path),
                )
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyError(f"cannot read policy module: {e}", source=str(path)) from e
        deep = rego_nesting_error(text, str(path), lim)
        if deep is not None:
            raise deep
        (tests if path.name.endswith("_test.rego") else modules)[rel] = text
    return modules, tests


def rego_revision(modules: dict[str, str]) -> str:
    """Content hash of a policy's modules: each name and text length-prefixed (an injective encoding:
    no text, NUL bytes included, can read as a module boundary)."""
    h = hashlib.sha256(b"semgov.rego-revision/v2\0")
    for name in sorted(modules):
        for part in (name.encode(), modules[name].encode("utf-8", "surrogatepass")):
            h.update(len(part).to_bytes(8, "big") + part)
    return "sha256:" + h.hexdigest()


def lint(directory: Path, *, with_tests: bool = True, limits: Limits | None = None) -> list[Diagnostic]:
    """Every problem found in a Rego policy directory (empty when it loads).

    Raises :class:`PolicyError` for a module that cannot be read or is over ``limits``.
    """
    import regorus

    modules, tests = rego_files(directory, limits=limits)
    if not modules:
        return [Diagnostic(str(directory), None, "no policy modules (*.rego, not *_test.rego) found")]
    diags: list[Diagnostic] = []
    rules: set[str] = set()
    saw_package = False
    for name, text in {**modules, **(tests if with_tests else {})}.items():
        eng = regorus.Engine()
        path = str(directory / name)
        try:
            eng.add_policy(path, text)
        except Exception as e:  # noqa: BLE001 - any parser failure is a diagnostic
            diags.append(syntax_diagnostic(path, e))
            continue
        [entry] = json.loads(eng.get_ast_as_json())
        pkg, defined, found = lint_ast(path, entry["ast"])
        diags.extend(found)
        if name in modules and pkg == PACKAGE:
            saw_package = True
            rules |= defined
    if not diags:
        if not saw_package:
            diags.append(Diagnostic(str(directory), None, f"no module declares `package {PACKAGE}`"))
        for r in REQUIRED_RULES:
            if saw_package and r not in rules:
                diags.append(
                    Diagnostic(str(directory), None, f"required rule `{r}` is not defined in {PACKAGE}")
                )
    return diags


def _constant(eng: Any, rule: str, source: str) -> Any:
    eng.set_input_json("{}")
    try:
        out = json.loads(eng.eval_query_as_json(f"x := data.{PACKAGE}.{rule}"))
    except Exception as e:  # noqa: BLE001
        raise PolicyError(
            f"`{rule}` cannot be evaluated without input: {str(e).splitlines()[0]}", source=source
        ) from e
    rows = out.get("result") or []
    return rows[0]["bindings"]["x"] if rows else None


def load_rego_policy(directory: Path, *, limits: Limits | None = None) -> RegoPolicy:
    """Load, lint and identify a Rego policy directory; raises PolicyError naming file:line."""
    import regorus

    lim = resolve(limits)
    diags = lint(directory, with_tests=False, limits=lim)
    if diags:
        d = diags[0]
        more = f" [and {len(diags) - 1} more problem(s)]" if len(diags) > 1 else ""
        others = tuple(PolicyError(x.message, source=x.file, line=x.line) for x in diags[1:])
        raise PolicyError(d.message + more, source=d.file, line=d.line, others=others)
    modules, tests = rego_files(directory, limits=lim)
    eng = regorus.Engine()
    for name, text in modules.items():
        eng.add_policy(str(directory / name), text)
    meta_raw = _constant(eng, "metadata", str(directory))
    try:
        meta = _Metadata.model_validate(meta_raw)
    except ValidationError as e:
        raise PolicyError(
            f"`metadata` must be a constant {{name, version}} object: {e.errors()[0]['msg']}",
            source=str(directory),
        ) from e
    fc_raw = _constant(eng, "facts_config", str(directory)) if _defines(eng, "facts_config") else {}
    try:
        fc = _FactsConfig.model_validate(fc_raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise PolicyError(
            f"`facts_config`: {err['msg']}", source=str(directory), field=".".join(map(str, err["loc"]))
        ) from e
    if _defines(eng, "namespace_sharing"):
        raw = _constant(eng, "namespace_sharing", str(directory))
        _check_rules(raw, "namespace_sharing", SharingRule, "{donor, recipients}", str(directory))
    if _defines(eng, "public_donors_for"):
        raw = _constant(eng, "public_donors_for", str(directory))
        _check_rules(raw, "public_donors_for", RequestScope, "{tenant, namespace, task}", str(directory))
    if _defines(eng, "compatible_task_groups"):
        _check_task_groups(_constant(eng, "compatible_task_groups", str(directory)), str(directory))
    _check_setting_types(eng, str(directory))
    config = FactConfig(
        min_span_tokens=fc.min_span_tokens,
        scan_donor_text=fc.scan_donor_text,
        pii_min_score=fc.pii_min_score,
        phone_regions=tuple(fc.phone_regions),
        pii_entities=tuple(sorted(set(fc.pii_entities))),
    )
    return RegoPolicy(directory, modules, tests, meta.name, meta.version, rego_revision(modules), config)


def _check_rules(raw: Any, constant: str, model: type[BaseModel], form: str, source: str) -> None:
    """A list constant (``namespace_sharing``, ``public_donors_for``), when a policy defines it,
    holds rules of the YAML policy's form (``model``): the same patterns and scopes in both."""
    if not isinstance(raw, list):
        raise PolicyError(f"`{constant}` must be a constant list of {form}", source=source)
    for i, rule in enumerate(raw):
        try:
            model.model_validate(rule)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            where = ".".join(map(str, err["loc"]))
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise PolicyError(f"`{constant}[{i}]`: {msg}", source=source, field=where or None) from e


def _check_task_groups(raw: Any, source: str) -> None:
    """``compatible_task_groups``: lists of ``"id@version"`` with exactly one ``@`` (split into pairs)."""
    try:
        TaskSection.model_validate({"compatible_groups": raw})
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = "compatible_task_groups" + "".join(f"[{p}]" for p in err["loc"][1:])
        raise PolicyError(
            f"`{where}`: {raw_at(raw, err['loc'][1:])!r} must be \"id@version\" with exactly one '@' "
            "(id and version are compared as a pair, never as one string)",
            source=source,
        ) from e


def raw_at(raw: Any, loc: tuple[Any, ...]) -> Any:
    """The element of ``raw`` at ``loc`` (for a message), or ``raw`` where it does not index."""
    for p in loc:
        try:
            raw = raw[p]
        except (LookupError, TypeError):
            return raw
    return raw


def _defines(eng: Any, rule: str) -> bool:
    eng.set_input_json("{}")
    try:
        out = json.loads(eng.eval_query_as_json(f"x := data.{PACKAGE}.{rule}"))
    except Exception:  # noqa: BLE001
        return True  # defined but failing: let _constant report it
    return bool(out.get("result"))


# The Rego convention's settings (policies/rego/default): the JSON type each must have when a
# policy defines it as a constant. A wrong type does not fail in Rego, it changes the meaning
# (`allow_shifted := "false"` is a defined, non-false value: shifted spans allowed).
SETTING_TYPES: dict[str, str] = {
    **dict.fromkeys(
        ("allow_public_donors", "pii_scan_donor_text", "pii_require_scan", "allow_shifted",
         "quality_allow_shifted"),
        "boolean",
    ),
    **dict.fromkeys(("similarity_min", "min_approved_fraction", "pii_min_score"), "number"),
    **dict.fromkeys(
        ("max_age_seconds", "min_span_tokens", "min_approved_tokens", "shifted_recompute_percent",
         "min_recompute_tokens", "shifted_recompute_tail_tokens"),
        "integer",
    ),
    **dict.fromkeys(
        ("accepted_policy_versions", "forbidden_entities", "pii_phone_regions", "reusable_roles"), "strings"
    ),
}  # fmt: skip


def _type_of(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "strings"
    return type(v).__name__ if not isinstance(v, list) else "a list of non-strings"


def _check_setting_types(eng: Any, source: str) -> None:
    """Every convention setting the policy defines has its type (all problems at once)."""
    found: list[PolicyError] = []
    for name, want in SETTING_TYPES.items():
        if not _defines(eng, name):
            continue
        v = _constant(eng, name, source)
        got = _type_of(v)
        if got == want or (want == "number" and got == "integer"):
            continue
        what = {"strings": "a list (or set) of strings", "integer": "an integer"}.get(want, f"a {want}")
        found.append(PolicyError(f"`{name}` must be {what}, got {v!r:.80}", source=source, field=name))
    if found:
        if len(found) > 1:
            found[0].message += f" [and {len(found) - 1} more problem(s)]"
        found[0].others = tuple(found[1:])
        raise found[0]
