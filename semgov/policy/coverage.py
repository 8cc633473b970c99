"""What a policy's case files exercised, for ``semgov policy test --coverage`` and ``--threshold``.

The items a policy's ``*_test.yaml`` cases can exercise:

- each gate's ``pass`` and ``fail`` outcome (a gate no case fails is not tested to deny);
- each rule the policy writes: for a YAML policy every ``tenant.public_donors_for`` scope, every
  ``namespace.sharing`` rule, every ``task.compatible_groups`` group, every entity of
  ``pii.forbidden_entities`` and every ``quality.rules`` rule; for a Rego policy the same
  constants of the Rego convention (``public_donors_for``, ``namespace_sharing``,
  ``compatible_task_groups``, ``forbidden_entities``; policies/rego/default).

A rule is exercised by a decided case whose input it decides, as the YAML engine applies it: the
first scope that lets a public donor of another tenant through, the first sharing rule that lets a
donor of another namespace through (its scope included), a group holding two different tasks of
a case, a forbidden entity a donor carries, the quality rule a request selects. Rules are read
from the policy and each case's input document, whatever engine decided the case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semgov.policy.rego.loader import PACKAGE, RegoPolicy
from semgov.policy.rules import RequestScope, SharingRule, namespace_matches
from semgov.policy.yaml.model import POLICY_FILE, Policy, task_pair
from semgov.wire.models import GATES
from semgov.wire.policy_input import PolicyInput

if TYPE_CHECKING:
    from semgov.policy.testing import TestOutcome


@dataclass(frozen=True)
class Item:
    """One thing the cases can exercise, where it is written, and how many decided cases did."""

    name: str  # "gate tenant: fail", "namespace.sharing[0]", "pii.forbidden_entities: PERSON"
    where: str  # "policy.yaml:40", or "" (a gate outcome, a default)
    cases: int


@dataclass(frozen=True)
class CaseCoverage:
    items: tuple[Item, ...]
    decided: int  # cases the engine decided

    @property
    def covered(self) -> int:
        return sum(i.cases > 0 for i in self.items)

    @property
    def share(self) -> float:
        return self.covered / len(self.items) if self.items else 1.0

    def rules(self) -> list[Item]:
        return [i for i in self.items if not i.name.startswith("gate ")]


def _first(matches: list[bool]) -> int | None:
    return next((i for i, m in enumerate(matches) if m), None)


@dataclass(frozen=True)
class RuleSet:
    """The rules a policy writes, whatever its language, and where: each list is a policy setting
    (``names``: its name per section, ``where``: ``file:line`` per rule)."""

    allow_public_donors: bool
    public_donors_for: list[RequestScope]
    sharing: list[SharingRule]
    groups: list[list[str]]
    forbidden_entities: list[str]
    quality_rule: Any  # (task id, contract id) -> the quality rule's index or None; None: no rules
    quality_rules: int
    names: dict[str, str]  # section -> "namespace.sharing" | "namespace_sharing" ...
    where: dict[tuple[str, int], str]


def rules_used(rs: RuleSet, doc: PolicyInput) -> list[tuple[str, int]]:
    """``(section, index)`` of each rule that decides ``doc`` (see the module's docstring)."""
    used: list[tuple[str, int]] = []
    r, d = doc.request, doc.facts.donor
    ident = (r.tenant, r.namespace, r.task.id, r.task.version)
    if d is not None and d.tenant != r.tenant and d.visibility == "public" and not rs.allow_public_donors:
        i = _first([s.matches(*ident) for s in rs.public_donors_for])
        used += [("public_donors_for", i)] if i is not None else []
    if d is not None and d.namespace != r.namespace:
        i = _first(
            [
                namespace_matches(s.donor, d.namespace)
                and any(namespace_matches(x, r.namespace) for x in s.recipients)
                and (s.scope is None or s.scope.matches(*ident))
                for s in rs.sharing
            ]
        )
        used += [("sharing", i)] if i is not None else []
    if d is not None and (d.task.id, d.task.version) != (r.task.id, r.task.version):
        pair = {(r.task.id, r.task.version), (d.task.id, d.task.version)}
        used += [("groups", i) for i, g in enumerate(rs.groups) if pair <= {task_pair(t) for t in g}]
    if doc.facts.pii is not None:
        found = set(doc.facts.pii.provenance_entities) | set(doc.facts.pii.text_entities)
        used += [("pii", j) for j, e in enumerate(rs.forbidden_entities) if e in found]
    rule = rs.quality_rule(r.task.id, r.response_contract.id) if rs.quality_rules else None
    used += [("quality", rule)] if rule is not None else []
    return used


def _all_rules(rs: RuleSet) -> list[tuple[str, int]]:
    sizes = {
        "public_donors_for": len(rs.public_donors_for),
        "sharing": len(rs.sharing),
        "groups": len(rs.groups),
        "pii": len(rs.forbidden_entities),
        "quality": rs.quality_rules,
    }
    return [(section, i) for section, n in sizes.items() for i in range(n)]


def _rule_name(rs: RuleSet, rule: tuple[str, int]) -> str:
    section, i = rule
    if section == "pii":
        return f"{rs.names['pii']}: {rs.forbidden_entities[i]}"
    return f"{rs.names[section]}[{i}]"


def yaml_rules(p: Policy, directory: Path) -> RuleSet:
    """A YAML policy's rules, each at its ``policy.yaml`` line."""
    from semgov._internal.yamlload import load_yaml_with_lines

    file = directory / POLICY_FILE if directory.is_dir() else directory
    try:
        lines = load_yaml_with_lines(file.read_text(encoding="utf-8"), str(file))[1]
    except Exception:  # noqa: BLE001 - locations are a courtesy; the policy loaded already
        lines = {}
    paths = {"public_donors_for": ("tenant", "public_donors_for"), "sharing": ("namespace", "sharing"),
             "groups": ("task", "compatible_groups"), "pii": ("pii", "forbidden_entities"),
             "quality": ("quality", "rules")}  # fmt: skip
    rs = RuleSet(
        p.tenant.allow_public_donors, list(p.tenant.public_donors_for), list(p.namespace.sharing),
        [list(g) for g in p.task.compatible_groups], list(p.pii.forbidden_entities),
        lambda task, contract: p.quality_plan(task, contract).rule, len(p.quality.rules),
        {k: ".".join(v) for k, v in paths.items()}, {},
    )  # fmt: skip
    for section, i in _all_rules(rs):
        line = lines.get((*paths[section], i))
        rs.where[(section, i)] = f"{file.name}:{line}" if line is not None else f"{file.name} (default)"
    return rs


def rego_rules(policy: RegoPolicy) -> RuleSet:
    """A Rego policy's rule constants (``public_donors_for``, ``namespace_sharing``,
    ``compatible_task_groups``, ``forbidden_entities``), each at its constant's line."""
    import json

    import regorus

    eng = regorus.Engine()
    for fname, text in policy.modules.items():
        eng.add_policy(str(policy.directory / fname), text)
    eng.set_input_json("{}")

    def constant(name: str, default: Any) -> Any:
        try:
            rows = json.loads(eng.eval_query_as_json(f"x := data.{PACKAGE}.{name}")).get("result") or []
        except Exception:  # noqa: BLE001 - a setting that needs input is not a rule list
            return default
        return rows[0]["bindings"]["x"] if rows else default

    names = {
        "public_donors_for": "public_donors_for",
        "sharing": "namespace_sharing",
        "groups": "compatible_task_groups",
        "pii": "forbidden_entities",
        "quality": "quality_rules",
    }
    rs = RuleSet(
        constant("allow_public_donors", False) is True,
        [RequestScope.model_validate(x) for x in constant("public_donors_for", [])],
        [SharingRule.model_validate(x) for x in constant("namespace_sharing", [])],
        [list(g) for g in constant("compatible_task_groups", [])],
        [str(e) for e in constant("forbidden_entities", [])],
        None, 0, names, {},
    )  # fmt: skip
    for section, i in _all_rules(rs):
        rs.where[(section, i)] = _rego_line(policy, names[section])
    return rs


def _rego_line(policy: RegoPolicy, name: str) -> str:
    """``file:line`` of the first definition of the constant ``name`` in the policy's modules."""
    pattern = re.compile(rf"^{re.escape(name)}\s*:?=", re.M)
    for fname, text in sorted(policy.modules.items()):
        m = pattern.search(text)
        if m is not None:
            return f"{fname}:{text.count(chr(10), 0, m.start()) + 1}"
    return ""


def case_coverage(policy: Any, directory: Path, outcomes: list[TestOutcome]) -> CaseCoverage:
    """The gate outcomes and policy rules the decided cases of ``outcomes`` exercised."""
    decided = [o for o in outcomes if o.gates]
    items = []
    for gate in GATES:
        for result in ("pass", "fail"):
            n = sum((gate, result) in o.gates for o in decided)
            items.append(Item(f"gate {gate}: {result}", "", n))
    rs = yaml_rules(policy, directory) if isinstance(policy, Policy) else rego_rules(policy)
    counts: dict[tuple[str, int], int] = {}
    for o in decided:
        for rule in set(rules_used(rs, o.doc)) if o.doc is not None else ():
            counts[rule] = counts.get(rule, 0) + 1
    for rule in _all_rules(rs):
        items.append(Item(_rule_name(rs, rule), rs.where[rule], counts.get(rule, 0)))
    return CaseCoverage(tuple(items), len(decided))
