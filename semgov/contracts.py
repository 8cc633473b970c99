"""Response contracts: how two answers to one request are compared.

A request names its response contract as ``{id, schema_sha256}`` (the gateway's claim, the context
token, ``response_contract`` of a captured request). A contracts file says how two answers under
each contract are compared::

    version: 1
    contracts:
      - id: financials                 # the request's response_contract.id
        schema_sha256: 3a6e...          # optional: only that revision of the contract (else any)
        compare: required_values
        json_schema: {type: object, required: [metric, value]}     # JSON answers
      - id: risk_summary
        compare: required_values
        patterns:                      # free text: the values that must survive, by name
          percent: '[0-9]+(?:\\.[0-9]+)?%'
      - id: chat
        compare: exact

:meth:`Contracts.spec` finds a request's entry (one with ``schema_sha256`` matches only that
revision and wins over one without; a contract not listed compares ``exact``), and
:meth:`ContractSpec.compare_answers` compares a cold and a warm answer into a :class:`Comparison`:
whether the answer changed at all (token ids when both are given, else the text), and whether its
required values did:

- ``exact``: the whole answer is the required value (values change exactly when the answer does);
- ``patterns``: per name, the *set* of the pattern's matches in each answer (its whitespace runs
  collapsed to one space first) must be equal;
- ``json_schema``: the JSON value of each answer (the whole stripped text, else the first
  ```` ```json ```` fenced block, else the outermost ``{...}``) is read at every path the schema
  marks required (through ``properties`` of required objects; a (sub)schema that marks nothing
  required, an array for one, is compared whole), compared as JSON (``1 == 1.0``, key order
  ignored, a missing field a value of its own). Neither answer has a JSON value: the texts are
  compared exactly; only one has: changed.

Doubt counts against reuse: whatever cannot be examined within the bounds below counts as changed,
never as unchanged. The model's output is untrusted, so every computation it can trigger is
bounded: :data:`MAX_ANSWER_CHARS` examined per answer (two different answers, one of them longer:
changed), JSON nested at most :data:`MAX_JSON_DEPTH` deep (deeper: no JSON value), at most
:data:`MAX_MATCHES` matches per pattern and answer (more: changed) and :data:`MATCH_BUDGET_S` of
pattern matching per comparison (past it: changed; patterns run on the ``regex`` module, which can
stop a search).

Loading is strict and pure (no I/O besides reading the file): every problem is an
:class:`~semgov.errors.InputError` naming the file and its line.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from semgov._internal import answers
from semgov._internal.answers import MATCH_BUDGET_S, MAX_JSON_DEPTH, MAX_MATCHES, Path_
from semgov._internal.yamlload import line_for, load_yaml_with_lines
from semgov.errors import InputError, PolicyError
from semgov.wire.models import Hex64, Id

__all__ = [
    "MATCH_BUDGET_S",
    "MAX_ANSWER_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_MATCHES",
    "Compare",
    "Comparison",
    "ContractSpec",
    "Contracts",
    "load_contracts",
]

Compare = Literal["exact", "required_values"]

MAX_CONTRACTS_FILE_BYTES = 1 << 20
MAX_CONTRACTS = 4096
MAX_PATTERNS = 64
MAX_PATTERN_CHARS = 512
MAX_REQUIRED_PATHS = 256
MAX_ANSWER_CHARS = 64 * 1024  # characters of each answer examined for its required values
MAX_LISTED = 32  # lost and gained values listed (the detail counts them all)
MAX_DETAIL_CHARS = 300

PatternName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
PatternText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATTERN_CHARS)]


# ---- comparisons -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two answers compared under a contract (:meth:`ContractSpec.compare_answers`).

    ``lost`` / ``gained``: required values in cold's answer and not in warm's, and the reverse, as
    short printable ``name=value`` strings (at most :data:`MAX_LISTED` each; ``detail`` counts
    them all). ``regressed``: ``answer_changed`` under an ``exact`` contract, ``values_changed``
    under ``required_values``.
    """

    answer_changed: bool
    values_changed: bool
    lost: tuple[str, ...]
    gained: tuple[str, ...]
    detail: str
    regressed: bool

    def as_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data (``lost`` and ``gained`` as lists)."""
        return {
            "answer_changed": self.answer_changed,
            "values_changed": self.values_changed,
            "lost": list(self.lost),
            "gained": list(self.gained),
            "detail": self.detail,
            "regressed": self.regressed,
        }


# ---- a contract --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContractSpec:
    """How answers under one response contract are compared (an entry of a contracts file).

    ``schema_sha256`` None: any revision of contract ``id``. A ``required_values`` contract has
    ``patterns`` (free text: ``(name, regular expression)``) or ``json_paths`` (JSON answers: the
    required paths its schema marks; ``()`` is the whole value), never both. ``line``: where the
    entry is in its file.
    """

    id: str
    schema_sha256: str | None
    compare: Compare = "exact"
    patterns: tuple[tuple[str, str], ...] = ()
    json_paths: tuple[Path_, ...] | None = None
    line: int | None = None
    _compiled: tuple[tuple[str, Any], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.compare == "exact" and (self.patterns or self.json_paths is not None):
            raise ValueError("an exact contract compares the whole answer: no patterns or json_paths")
        if self.compare == "required_values" and bool(self.patterns) == (self.json_paths is not None):
            raise ValueError("a required_values contract has patterns or json_paths, exactly one of them")
        if self.json_paths is not None and not self.json_paths:
            raise ValueError("json_paths names at least one path (() is the whole value)")
        compiled = tuple((name, regex.compile(p)) for name, p in self.patterns)
        object.__setattr__(self, "_compiled", compiled)

    @property
    def kind(self) -> str:
        """``exact``, ``patterns`` or ``json_schema``: what the required values are."""
        return "exact" if self.compare == "exact" else ("patterns" if self.patterns else "json_schema")

    def describe(self) -> str:
        """One line: the contract, its revision and how it compares."""
        rev = f"@{self.schema_sha256[:12]}" if self.schema_sha256 else " (any revision)"
        if self.kind == "exact":
            how = "exact (the whole answer)"
        elif self.kind == "patterns":
            how = f"required_values, {len(self.patterns)} patterns: " + ", ".join(n for n, _ in self.patterns)
        elif self.json_paths == ((),):
            how = "required_values, JSON schema, the whole JSON value (it marks nothing required)"
        else:
            paths = self.json_paths or ()
            shown = ", ".join(answers.path_name(p) for p in paths[:8]) + (", ..." if len(paths) > 8 else "")
            how = f"required_values, JSON schema, {len(paths)} required path{'s' * (len(paths) > 1)}: {shown}"
        return f"{self.id}{rev}: {how}"

    def compare_answers(
        self,
        cold_text: str,
        warm_text: str,
        *,
        cold_ids: Sequence[int] | None = None,
        warm_ids: Sequence[int] | None = None,
    ) -> Comparison:
        """Compare warm's answer with cold's under this contract (see the module's docstring)."""
        if cold_ids is not None and warm_ids is not None:
            answer_changed = list(cold_ids) != list(warm_ids)
        else:
            answer_changed = cold_text != warm_text
        if self.compare == "exact":
            return self._exact(cold_text, warm_text, answer_changed)
        if cold_text == warm_text:
            values = answers.Values([], [], note=" (the same text)")
        elif max(len(cold_text), len(warm_text)) > MAX_ANSWER_CHARS:
            doubt = f"an answer is longer than {MAX_ANSWER_CHARS:,} characters: not examined, changed"
            values = answers.Values([], [], doubt=doubt)
        elif self._compiled:
            values = answers.pattern_values(self._compiled, cold_text, warm_text)
        else:
            values = answers.json_values(self.json_paths or ((),), cold_text, warm_text)
        head = "answer changed" if answer_changed else "answer unchanged"
        detail = answers.printable(f"{head}; {answers.describe(values)}", MAX_DETAIL_CHARS)
        lost, gained = tuple(values.lost[:MAX_LISTED]), tuple(values.gained[:MAX_LISTED])
        return Comparison(answer_changed, values.changed, lost, gained, detail, values.changed)

    @staticmethod
    def _exact(cold: str, warm: str, changed: bool) -> Comparison:
        if not changed:
            detail = "answer unchanged"
            lost: tuple[str, ...] = ()
            gained: tuple[str, ...] = ()
        else:
            at = answers.first_difference(cold, warm)
            detail = (
                "token ids changed, text identical (exact contract)"
                if cold == warm
                else f"answer changed at character {at} (exact contract: the whole answer is the value)"
            )
            lost, gained = ("answer=" + answers.printable(cold),), ("answer=" + answers.printable(warm),)
        return Comparison(changed, changed, lost, gained, detail, changed)


# ---- the contracts file ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contracts:
    """A loaded contracts file: its entries, where it came from (``source``) and its content's
    SHA-256 (``digest``)."""

    entries: tuple[ContractSpec, ...]
    source: str
    digest: str
    _by_key: dict[tuple[str, str | None], ContractSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {(e.id, e.schema_sha256): e for e in self.entries})

    @classmethod
    def empty(cls) -> Contracts:
        """No entries: every contract compares ``exact``."""
        return cls((), "(no contracts file)", "")

    def spec(self, contract: Mapping[str, str]) -> ContractSpec:
        """The entry for a request's ``{id, schema_sha256}``: one for that revision, else one for
        any revision of the id, else the default ``exact`` spec of the id."""
        cid = contract.get("id")
        if not isinstance(cid, str):
            raise ValueError("a response contract is a mapping with a string id")
        sha = contract.get("schema_sha256")
        if isinstance(sha, str) and (hit := self._by_key.get((cid, sha))) is not None:
            return hit
        return self._by_key.get((cid, None)) or ContractSpec(cid, None, "exact")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Entry(_Strict):
    id: Id
    schema_sha256: Hex64 | None = None
    compare: Compare
    json_schema: dict[str, Any] | None = None
    patterns: dict[PatternName, PatternText] | None = Field(
        default=None, min_length=1, max_length=MAX_PATTERNS
    )


class _File(_Strict):
    version: Literal[1]
    contracts: list[_Entry] = Field(max_length=MAX_CONTRACTS)


def _where(e: ValidationError, lines: dict[Any, int], source: str) -> InputError:
    """The first validation problem at its line, the others counted."""
    errors = e.errors(include_url=False)
    err = errors[0]
    loc = tuple(err["loc"])
    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
    dotted = ".".join(str(p) for p in loc) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return InputError(f"{dotted}: {msg}{more}", source=source, line=line_for(lines, loc))


class _Schema:
    """Reads the required paths of a contract's ``json_schema``, refusing what it cannot read."""

    def __init__(self, lines: dict[Any, int], source: str, base: tuple[str | int, ...]) -> None:
        self.lines, self.source, self.base = lines, source, base

    def error(self, message: str, loc: tuple[str | int, ...]) -> InputError:
        where = ".".join(str(p) for p in loc)
        return InputError(
            f"json_schema{'.' + where if where else ''}: {message}",
            source=self.source,
            line=line_for(self.lines, (*self.base, *loc)),
        )

    def check_json(self, value: Any, loc: tuple[str | int, ...]) -> None:
        """JSON data only (YAML can say more: dates, for one)."""
        stack = [(value, loc)]
        while stack:
            v, at = stack.pop()
            if isinstance(v, dict):
                stack.extend((x, (*at, k)) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend((x, (*at, i)) for i, x in enumerate(v))
            elif isinstance(v, float) and not math.isfinite(v):
                raise self.error(f"not JSON data ({v})", at)
            elif not (v is None or isinstance(v, str | int | float | bool)):
                raise self.error(f"not JSON data ({type(v).__name__})", at)

    def paths(self, schema: dict[str, Any], loc: tuple[str | int, ...], prefix: Path_) -> list[Path_]:
        """Every required path under ``schema`` (``[prefix]`` when it marks none)."""
        required = schema.get("required")
        if required is None or required == []:
            return [prefix]
        if not isinstance(required, list) or not all(isinstance(r, str) and r for r in required):
            raise self.error("required is a list of field names", (*loc, "required"))
        if len(set(required)) != len(required):
            raise self.error("required names a field twice", (*loc, "required"))
        kind = schema.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            raise self.error(f"required fields on a schema of type {kind!r} (not an object)", (*loc, "type"))
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise self.error("properties is a mapping of field names to schemas", (*loc, "properties"))
        out: list[Path_] = []
        for name in required:
            sub = props.get(name)
            if isinstance(sub, dict):
                out.extend(self.paths(sub, (*loc, "properties", name), (*prefix, name)))
            elif sub is None or isinstance(sub, bool):
                out.append((*prefix, name))
            else:
                raise self.error("a property's schema is a mapping", (*loc, "properties", name))
            if len(out) > MAX_REQUIRED_PATHS:
                raise self.error(f"more than {MAX_REQUIRED_PATHS} required paths", loc)
        return out


def _compile(name: str, text: str, line: int | None, source: str) -> None:
    try:
        pattern = regex.compile(text)
    except (regex.error, ValueError, OverflowError, RecursionError) as e:
        raise InputError(f"patterns.{name}: not a regular expression: {e}", source=source, line=line) from e
    if pattern.fullmatch("") is not None:
        raise InputError(f"patterns.{name}: matches the empty string", source=source, line=line)


def _spec(e: _Entry, i: int, lines: dict[Any, int], source: str) -> ContractSpec:
    """One entry's spec, its rules checked (each problem at its line)."""
    line = lines.get(("contracts", i))
    if e.compare == "exact":
        extra = "json_schema" if e.json_schema is not None else "patterns" if e.patterns is not None else None
        if extra is not None:
            raise InputError(
                f"{extra}: an exact contract compares the whole answer (use compare: required_values)",
                source=source,
                line=lines.get(("contracts", i, extra), line),
            )
        return ContractSpec(e.id, e.schema_sha256, "exact", line=line)
    if (e.json_schema is None) == (e.patterns is None):
        raise InputError(
            "compare: required_values takes exactly one of json_schema (JSON answers) or patterns "
            f"(free text){', not both' if e.json_schema is not None else ''}",
            source=source,
            line=line,
        )
    if e.patterns is not None:
        for name, text in e.patterns.items():
            _compile(name, text, lines.get(("contracts", i, "patterns", name), line), source)
        return ContractSpec(e.id, e.schema_sha256, "required_values", tuple(e.patterns.items()), line=line)
    assert e.json_schema is not None
    schema = _Schema(lines, source, ("contracts", i, "json_schema"))
    schema.check_json(e.json_schema, ())
    paths = tuple(schema.paths(e.json_schema, (), ()))
    return ContractSpec(e.id, e.schema_sha256, "required_values", json_paths=paths, line=line)


def _read(path: Path) -> tuple[bytes, str]:
    source = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONTRACTS_FILE_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read the contracts file ({e.strerror or e})", source=source) from e
    if len(raw) > MAX_CONTRACTS_FILE_BYTES:
        raise InputError(f"contracts file larger than {MAX_CONTRACTS_FILE_BYTES >> 20} MiB", source=source)
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"contracts file is not UTF-8 (byte {e.start})", source=source) from e


def load_contracts(path: Path) -> Contracts:
    """Read and check a contracts file (raises :class:`InputError` naming the file, line and problem)."""
    source = str(path)
    raw, text = _read(path)
    try:
        data, lines = load_yaml_with_lines(text, source)
    except PolicyError as e:
        raise InputError(e.message, source=source, line=e.line) from e
    if not isinstance(data, dict):
        raise InputError(
            "a contracts file is a mapping with `version: 1` and `contracts`", source=source, line=1
        )
    try:
        parsed = _File.model_validate(data)
    except ValidationError as e:
        raise _where(e, lines, source) from e
    specs: dict[tuple[str, str | None], ContractSpec] = {}
    for i, entry in enumerate(parsed.contracts):
        spec = _spec(entry, i, lines, source)
        key = (spec.id, spec.schema_sha256)
        if key in specs:
            rev = f"revision {spec.schema_sha256}" if spec.schema_sha256 else "any revision"
            raise InputError(
                f"contract {spec.id!r} ({rev}) is listed twice (first at line {specs[key].line})",
                source=source,
                line=spec.line,
            )
        specs[key] = spec
    return Contracts(tuple(specs.values()), source, hashlib.sha256(raw).hexdigest())
