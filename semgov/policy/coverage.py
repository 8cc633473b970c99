"""What a policy's case files exercised, for ``semgov policy test --coverage`` and ``--threshold``.

The items a policy's ``*_test.yaml`` cases can exercise:

- each gate's ``pass`` and ``fail`` outcome (a gate no case fails is not tested to deny);
- for a YAML policy, each rule it writes: every ``tenant.public_donors_for`` scope, every
  ``namespace.sharing`` rule, every ``task.compatible_groups`` group, every entity of
  ``pii.forbidden_entities`` and every ``quality.rules`` rule.

A rule is exercised by a decided case whose input it decides, as the YAML engine applies it: the
first scope that lets a public donor of another tenant through, the first sharing rule that lets a
donor of another namespace through (its scope included), a group holding two different tasks of
a case, a forbidden entity a donor carries, the quality rule a request selects. Rules are read
from the policy and each case's input document, whatever engine decided the case.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def rules_used(p: Policy, doc: PolicyInput) -> list[tuple[str | int, ...]]:
    """The policy paths of the YAML rules that decide ``doc`` (see the module's docstring)."""
    used: list[tuple[str | int, ...]] = []
    r, d = doc.request, doc.facts.donor
    ident = (r.tenant, r.namespace, r.task.id, r.task.version)
    if (
        d is not None
        and d.tenant != r.tenant
        and d.visibility == "public"
        and not p.tenant.allow_public_donors
    ):
        i = _first([s.matches(*ident) for s in p.tenant.public_donors_for])
        used += [("tenant", "public_donors_for", i)] if i is not None else []
    if d is not None and d.namespace != r.namespace:
        from semgov.policy.rules import namespace_matches

        i = _first(
            [
                namespace_matches(s.donor, d.namespace)
                and any(namespace_matches(x, r.namespace) for x in s.recipients)
                and (s.scope is None or s.scope.matches(*ident))
                for s in p.namespace.sharing
            ]
        )
        used += [("namespace", "sharing", i)] if i is not None else []
    if d is not None and (d.task.id, d.task.version) != (r.task.id, r.task.version):
        pair = {(r.task.id, r.task.version), (d.task.id, d.task.version)}
        for i, group in enumerate(p.task.compatible_groups):
            if pair <= {task_pair(t) for t in group}:
                used.append(("task", "compatible_groups", i))
    if doc.facts.pii is not None:
        found = set(doc.facts.pii.provenance_entities) | set(doc.facts.pii.text_entities)
        used += [
            ("pii", "forbidden_entities", j) for j, e in enumerate(p.pii.forbidden_entities) if e in found
        ]
    rule = p.quality_plan(r.task.id, r.response_contract.id).rule
    used += [("quality", "rules", rule)] if rule is not None else []
    return used


def _yaml_rules(p: Policy) -> list[tuple[str | int, ...]]:
    """Every rule a YAML policy writes, as its path in the policy."""
    rules: list[tuple[str | int, ...]] = []
    rules += [("tenant", "public_donors_for", i) for i in range(len(p.tenant.public_donors_for))]
    rules += [("namespace", "sharing", i) for i in range(len(p.namespace.sharing))]
    rules += [("task", "compatible_groups", i) for i in range(len(p.task.compatible_groups))]
    rules += [("pii", "forbidden_entities", j) for j in range(len(p.pii.forbidden_entities))]
    rules += [("quality", "rules", i) for i in range(len(p.quality.rules))]
    return rules


def _rule_name(p: Policy, path: tuple[str | int, ...]) -> str:
    section, key, i = path
    if key == "forbidden_entities":
        return f"pii.forbidden_entities: {p.pii.forbidden_entities[int(i)]}"
    return f"{section}.{key}[{i}]"


def _policy_lines(directory: Path) -> dict[Any, int]:
    from semgov._internal.yamlload import load_yaml_with_lines

    file = directory / POLICY_FILE if directory.is_dir() else directory
    try:
        return load_yaml_with_lines(file.read_text(encoding="utf-8"), str(file))[1]
    except Exception:  # noqa: BLE001 - locations are a courtesy; the policy loaded already
        return {}


def case_coverage(policy: Any, directory: Path, outcomes: list[TestOutcome]) -> CaseCoverage:
    """The gate outcomes and (YAML) rules the decided cases of ``outcomes`` exercised."""
    decided = [o for o in outcomes if o.gates]
    items = []
    for gate in GATES:
        for result in ("pass", "fail"):
            n = sum((gate, result) in o.gates for o in decided)
            items.append(Item(f"gate {gate}: {result}", "", n))
    if isinstance(policy, Policy):
        counts: dict[tuple[str | int, ...], int] = {}
        for o in decided:
            if o.doc is not None:
                for path in set(rules_used(policy, o.doc)):
                    counts[path] = counts.get(path, 0) + 1
        lines = _policy_lines(directory)
        file = POLICY_FILE if directory.is_dir() else directory.name
        for path in _yaml_rules(policy):
            line = lines.get(path)
            where = f"{file}:{line}" if line is not None else f"{file} (default)"
            items.append(Item(_rule_name(policy, path), where, counts.get(path, 0)))
    return CaseCoverage(tuple(items), len(decided))
