"""Rego engines behind the one PolicyEngine interface.

- :class:`RegorusEngine` (``regorus``, from ``gordon-to-regorus``): embedded, the default;
- :class:`OpaInProcessEngine` (``opa-golib-python-bindings``): the real OPA evaluator
  in-process, used as the conformance oracle;
- ``semgov.policy.rego.opa_server.OpaServerEngine``: an OPA server over HTTP.

All three return the package's ``allow``, ``deny`` and ``approved_spans``, which
:func:`interpret` turns into gate outcomes, identically for every engine. Any
malformed engine output raises; the evaluator then denies (fail closed).
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

from semgov.policy.engine import ApprovedSpan, EngineResult, GateOutcome, fact_error
from semgov.policy.rego.loader import PACKAGE, RegoPolicy
from semgov.wire.models import GATES
from semgov.wire.policy_input import PolicyInput, to_json_dict

# One query for the three rules semgov reads.
QUERY = (
    f'x := {{"allow": data.{PACKAGE}.allow, "deny": data.{PACKAGE}.deny, '
    f'"approved_spans": data.{PACKAGE}.approved_spans}}'
)
_SPAN_KEYS = frozenset({"recipient_start", "donor_start", "length", "kind"})
_KINDS = ("prefix", "shifted")


class EngineOutputError(Exception):
    """The policy's result does not follow the convention."""


def interpret(raw: Any, doc: PolicyInput) -> EngineResult:
    """Turn ``{"allow", "deny", "approved_spans"}`` into gate outcomes, checking its shape.

    NOTE: a gate is ``error`` when the fact it depends on could not be computed,
    ``fail`` when a deny entry names it, else ``pass``: the same mapping the YAML
    engine applies, so engines can only differ in what the policy says.
    """
    if not isinstance(raw, dict):
        raise EngineOutputError(f"policy result is not an object: {raw!r:.200}")
    allow, deny, spans = raw.get("allow"), raw.get("deny"), raw.get("approved_spans")
    if not isinstance(allow, bool):
        raise EngineOutputError(f"`allow` is not a boolean: {allow!r:.100}")
    if not isinstance(deny, list):
        raise EngineOutputError(f"`deny` is not a set: {deny!r:.100}")
    if not isinstance(spans, list):
        raise EngineOutputError(f"`approved_spans` is not an array: {spans!r:.100}")
    details: dict[str, list[str]] = {}
    for d in deny:
        if not isinstance(d, dict) or set(d) != {"gate", "detail"}:
            raise EngineOutputError(f"deny entry is not {{gate, detail}}: {d!r:.200}")
        gate, detail = d["gate"], d["detail"]
        if gate not in GATES or not isinstance(detail, str):
            raise EngineOutputError(f"deny entry names no known gate or has no string detail: {d!r:.200}")
        details.setdefault(gate, []).append(detail)
    if allow == bool(deny):
        raise EngineOutputError(f"`allow` is {allow} but `deny` has {len(deny)} entries")
    outcomes = []
    for gate in GATES:
        err = fact_error(gate, doc)
        if err is not None:
            outcomes.append(GateOutcome(gate=gate, result="error", detail=err))
        elif gate in details:
            outcomes.append(GateOutcome(gate=gate, result="fail", detail="; ".join(sorted(details[gate]))))
        else:
            outcomes.append(GateOutcome(gate=gate, result="pass", detail="no deny rule fired"))
    approved = []
    for s in spans:
        # NOTE: `recompute` (leading tokens the engine must compute) is optional: absent, none.
        if not (
            isinstance(s, dict)
            and _SPAN_KEYS <= set(s) <= _SPAN_KEYS | {"recompute"}
            and all(type(s[k]) is int for k in ("recipient_start", "donor_start", "length"))
            and type(s.get("recompute", 0)) is int
            and 0 <= s.get("recompute", 0) <= s["length"]
            and s["kind"] in _KINDS
        ):
            raise EngineOutputError(f"approved span is malformed: {s!r:.200}")
        approved.append(
            ApprovedSpan(
                s["recipient_start"], s["donor_start"], s["length"], s["kind"], s.get("recompute", 0)
            )
        )
    return EngineResult(outcomes, approved)


def input_json(doc: PolicyInput) -> str:
    return json.dumps(to_json_dict(doc), separators=(",", ":"))


# Each thread's compiled regorus engines: {id(RegorusEngine): (weakref to it, regorus.Engine)}.
_PER_THREAD = threading.local()


class RegorusEngine:
    """Embedded Rego evaluation with regorus. Thread-safe: one engine per thread.

    NOTE: a regorus ``Engine`` is unsendable: pyo3 panics when another thread so much as touches
    it (a ``clone()`` included), and refuses to free it there. So each thread compiles its own from
    the modules, once, and keeps it in that thread's own table (not in this object, which a policy
    reload may drop on any thread); a thread frees the engines of dropped policies the next time it
    compiles one, on itself. The constructor compiles one on its own thread, so a policy that does
    not load fails here.
    """

    name = "regorus"

    def __init__(self, policy: RegoPolicy) -> None:
        self._modules = [(str(policy.directory / fname), text) for fname, text in policy.modules.items()]
        self._engine()

    def _engine(self) -> Any:
        table: dict[int, tuple[weakref.ref[RegorusEngine], Any]] | None = getattr(
            _PER_THREAD, "engines", None
        )
        if table is None:
            table = _PER_THREAD.engines = {}
        entry = table.get(id(self))
        if entry is not None and entry[0]() is self:
            return entry[1]
        for key in [k for k, (owner, _) in table.items() if owner() is None]:
            del table[key]  # NOTE: dropped on the thread that compiled it
        import regorus

        eng = regorus.Engine()
        for path, text in self._modules:
            eng.add_policy(path, text)
        table[id(self)] = (weakref.ref(self), eng)
        return eng

    def evaluate(self, doc: PolicyInput) -> EngineResult:
        eng = self._engine()
        eng.set_input_json(input_json(doc))
        out = json.loads(eng.eval_query_as_json(QUERY))
        rows = out.get("result") or []
        if not rows:
            raise EngineOutputError("the policy's allow, deny or approved_spans is undefined for this input")
        return interpret(rows[0]["bindings"]["x"], doc)


class OpaInProcessEngine:
    """The real OPA evaluator, in-process (``opa-golib-python-bindings``)."""

    name = "opa-inprocess"

    def __init__(self, policy: RegoPolicy) -> None:
        from opa_bindings import OpaEngine

        self._opa = OpaEngine()
        for fname, text in policy.modules.items():
            self._opa.add_policy(str(policy.directory / fname), text)

    def evaluate(self, doc: PolicyInput) -> EngineResult:
        rows = self._opa.eval_query(QUERY, input=to_json_dict(doc))
        if not rows:
            raise EngineOutputError("the policy's allow, deny or approved_spans is undefined for this input")
        return interpret(rows[0]["x"], doc)

    def close(self) -> None:
        self._opa.close()
