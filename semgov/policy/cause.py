"""Where in policy B a decision's change comes from, for ``semgov diff``'s CI formats.

For each change the deciding gate is the one whose result turned (``allow->deny``: a gate that
passes under A and not under B; ``deny->allow``: one that did not pass under A and passes under B;
span changes: ``token_verification``, whose spans the quality plan shapes). Its rule is found as
``semgov policy test --explain`` finds it (:mod:`semgov.policy.explain`): the ``policy.yaml``
setting of that gate (YAML), or the ``deny`` rules naming it and the settings they read (Rego).
Of that rule's lines, the one B changed from A is the cause; when B changed none of them, the rule's
own line; for a gate no setting decides, the first line B changed (line 1 when B changed nothing).

A location is diagnostic: when it cannot be computed it falls back to the policy file, line 1.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semgov._internal.yamlload import load_yaml_with_lines
from semgov.policy.diff import Change
from semgov.policy.explain import _YAML_SETTING, rego_gate_rules, rego_settings_read
from semgov.policy.rego.loader import RegoPolicy

# NOTE: settings beyond explain's one per gate that also decide it (the quality plan shapes which
# spans token verification approves; a renamed or bumped policy changes what policy_version accepts).
_ALSO: dict[str, tuple[tuple[str | int, ...], ...]] = {
    "token_verification": (("quality",),),
    "policy_version": (("name",), ("version",)),
    "tenant": (("allow_public_donors",),),
}
_INDEXED = re.compile(r"\b(tenant\.public_donors_for|namespace\.sharing|quality\.rules)\[(\d+)\]")
_WHERE = re.compile(r"\((?P<file>.+):(?P<line>\d+)\)$")


@dataclass(frozen=True, slots=True)
class Cause:
    """The policy line a change is attributed to, and the gate and setting behind it."""

    file: str
    line: int
    gate: str
    setting: str  # what the line is: "similarity.min", "deny rule", "changed line", ...


def deciding_gate(c: Change) -> tuple[str, str]:
    """(gate, detail) whose result turned for change ``c`` (see the module docstring)."""
    turned = [g for g in c.gates if g.a != g.b]
    if c.kind == "allow->deny":
        pick = [g for g in turned if g.b != "pass"]
    elif c.kind == "deny->allow":
        pick = [g for g in turned if g.a != "pass"]
    elif c.kind == "spans":
        return "token_verification", ""
    else:
        pick = turned
    if not (pick or turned):
        return "token_verification", ""
    g = (pick or turned)[0]
    return g.gate, g.b_detail if c.kind != "deny->allow" else g.a_detail


def _changed(a: Path, b: Path) -> set[int]:
    """Line numbers of ``b`` that are not in ``a`` (every line when ``a`` cannot be read)."""
    try:
        new = b.read_text(encoding="utf-8").splitlines()
    except OSError:
        return set()
    try:
        old = a.read_text(encoding="utf-8").splitlines()
    except OSError:
        return set(range(1, len(new) + 1))
    out: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1 + 1, j2 + 1))
    return out


class Locator:
    """Finds the :class:`Cause` of each change of a diff from policy A (``a_path``) to B."""

    def __init__(self, a_path: Path, b_path: Path, b_policy: Any) -> None:
        self.b_policy = b_policy
        self._memo: dict[tuple[str, str], Cause] = {}
        if isinstance(b_policy, RegoPolicy):
            a_dir = a_path if a_path.is_dir() else a_path.parent
            self.files = [b_policy.directory / f for f in sorted(b_policy.modules)]
            self.changed = {str(f): _changed(a_dir / f.name, f) for f in self.files}
        else:
            b_file = b_path / "policy.yaml" if b_path.is_dir() else b_path
            a_file = a_path / "policy.yaml" if a_path.is_dir() else a_path
            self.files = [b_file]
            self.changed = {str(b_file): _changed(a_file, b_file)}

    def cause(self, c: Change) -> Cause:
        gate, detail = deciding_gate(c)
        m = _INDEXED.search(detail)
        key = (gate, m.group(0) if m else "")
        if key not in self._memo:
            try:
                found = (
                    self._rego(gate) if isinstance(self.b_policy, RegoPolicy) else self._yaml(gate, detail)
                )
            except Exception:  # noqa: BLE001 - a location never fails the run
                found = None
            self._memo[key] = found or self._first_changed(gate)
        return self._memo[key]

    def _first_changed(self, gate: str) -> Cause:
        for f in self.files:
            if self.changed[str(f)]:
                return Cause(str(f), min(self.changed[str(f)]), gate, "changed line")
        return Cause(str(self.files[0]), 1, gate, "policy file")

    def _yaml(self, gate: str, detail: str) -> Cause | None:
        file = self.files[0]
        _, lines = load_yaml_with_lines(file.read_text(encoding="utf-8"), str(file))
        setting = _YAML_SETTING.get(gate)  # type: ignore[call-overload]
        m = _INDEXED.search(detail)
        if m is not None:
            section, k = m.group(1).split(".")
            setting = (section, k, int(m.group(2)))
        paths = ([setting] if setting else []) + list(_ALSO.get(gate, ()))
        changed = self.changed[str(file)]
        for p in paths:
            hit = sorted((ln, len(k), k) for k, ln in lines.items() if k[: len(p)] == p and ln in changed)
            if hit:
                return Cause(str(file), hit[0][0], gate, _dotted(hit[0][2]))
        for p in paths:
            for n in range(len(p), 0, -1):
                if p[:n] in lines:
                    return Cause(str(file), lines[p[:n]], gate, _dotted(p[:n]))
        return None

    def _rego(self, gate: str) -> Cause | None:
        rules = rego_gate_rules(self.b_policy).get(gate, [])
        reads = rego_settings_read(self.b_policy)
        places = [
            (w, f"setting {s.split(' (')[0]}")
            for r in rules
            for s in reads.get(r, ())
            if (w := _setting_at(s))
        ]
        places += [(r, "deny rule") for r in rules]
        for where, what in places:
            file, _, line = where.rpartition(":")
            if int(line) in self.changed.get(file, ()):
                return Cause(file, int(line), gate, what)
        if rules:
            file, _, line = rules[0].rpartition(":")
            return Cause(file, int(line), gate, "deny rule")
        return None


def _setting_at(text: str) -> str | None:
    m = _WHERE.search(text)
    return f"{m.group('file')}:{m.group('line')}" if m else None


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out
