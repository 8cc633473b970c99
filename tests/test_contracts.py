"""semgov.contracts: loading a contracts file strictly, finding a request's entry, and comparing
two answers the way the contract says (exact, named patterns, a JSON schema's required values)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.contracts import (
    MAX_ANSWER_CHARS,
    MAX_MATCHES,
    Comparison,
    Contracts,
    ContractSpec,
    load_contracts,
)
from semgov.errors import InputError

SHA_A = "a" * 64
SHA_B = "b" * 64
AMOUNT = r"\$[0-9][0-9,]*(?:\.[0-9]+)?(?: (?:million|billion))?"
PERCENT = r"[0-9]+(?:\.[0-9]+)?%"

GOOD = f"""\
version: 1
contracts:
  - id: financials
    schema_sha256: {SHA_A}
    compare: required_values
    json_schema:
      type: object
      required: [metric, value, period]
      properties:
        value: {{type: number}}
        period:
          type: object
          required: [year, quarter]
  - id: financials
    compare: exact
  - id: risk_summary
    compare: required_values
    patterns:
      amount: '{AMOUNT}'
      percent: '{PERCENT}'
  - id: records
    compare: required_values
    json_schema: {{type: array, items: {{type: object, required: [metric]}}}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "contracts.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def contracts(tmp_path: Path) -> Contracts:
    return load_contracts(_write(tmp_path, GOOD))


def _patterns(**named: str) -> ContractSpec:
    return ContractSpec("c", None, "required_values", tuple(named.items()))


def _json(*paths: tuple[str, ...]) -> ContractSpec:
    return ContractSpec("c", None, "required_values", json_paths=paths)


EXACT = ContractSpec("c", None, "exact")
MONEY = _patterns(amount=AMOUNT, percent=PERCENT)
METRIC = _json(("metric",), ("value",))


# ---- loading and finding entries ---------------------------------------------------------------


def test_a_good_file_loads_every_entry_with_its_line_and_digest(contracts: Contracts) -> None:
    """Each entry keeps its id, revision, comparison and line; the digest is the file's SHA-256."""
    got = [(e.id, e.schema_sha256, e.compare, e.kind, e.line) for e in contracts.entries]
    assert got == [
        ("financials", SHA_A, "required_values", "json_schema", 3),
        ("financials", None, "exact", "exact", 14),
        ("risk_summary", None, "required_values", "patterns", 16),
        ("records", None, "required_values", "json_schema", 21),
    ]
    assert contracts.entries[0].json_paths == (
        ("metric",),
        ("value",),
        ("period", "year"),
        ("period", "quarter"),
    )
    assert contracts.entries[3].json_paths == ((),)  # nothing required at the top: the whole value
    assert len(contracts.digest) == 64 and contracts.source.endswith("contracts.yaml")


def test_a_revision_entry_wins_and_other_revisions_get_the_any_revision_entry(contracts: Contracts) -> None:
    """{id, schema_sha256} finds that revision's entry first, else the id's entry for any revision."""
    assert contracts.spec({"id": "financials", "schema_sha256": SHA_A}).kind == "json_schema"
    assert contracts.spec({"id": "financials", "schema_sha256": SHA_B}).compare == "exact"
    assert contracts.spec({"id": "financials"}).compare == "exact"
    assert contracts.spec({"id": "risk_summary", "schema_sha256": SHA_B}).kind == "patterns"


def test_a_contract_not_listed_compares_exact(contracts: Contracts) -> None:
    """An id the file does not name, or a revision it pins without an any-revision entry: exact."""
    spec = contracts.spec({"id": "chat", "schema_sha256": SHA_A})
    assert (spec.id, spec.compare, spec.line) == ("chat", "exact", None)
    assert Contracts.empty().spec({"id": "financials", "schema_sha256": SHA_A}).compare == "exact"


def test_entries_are_found_by_structure_never_by_a_joined_string(tmp_path: Path) -> None:
    """An id that spells another entry's id@revision does not find that entry."""
    entry = f"{{id: x, schema_sha256: {SHA_A}, compare: required_values, patterns: {{p: 'a'}}}}"
    text = f"version: 1\ncontracts:\n  - {entry}\n"
    c = load_contracts(_write(tmp_path, text))
    assert c.spec({"id": "x", "schema_sha256": SHA_A}).kind == "patterns"
    assert c.spec({"id": f"x@{SHA_A}"}).compare == "exact"
    assert c.spec({"id": "x", "schema_sha256": ""}).compare == "exact"


def test_a_contract_without_a_string_id_is_refused(contracts: Contracts) -> None:
    """spec() of a mapping with no string id is a ValueError, never a default."""
    with pytest.raises(ValueError, match="string id"):
        contracts.spec({"schema_sha256": SHA_A})


_ENTRY = "version: 1\ncontracts:\n  - id: c\n"
_RV = _ENTRY + "    compare: required_values\n"
_SCHEMA = _RV + "    json_schema:\n      required: [a]\n"
_TWICE = f"  - {{id: c, schema_sha256: {SHA_A}, compare: exact}}\n"
REFUSALS = [
    ("version: 1\ncontracts: []\nextra: 1\n", 3, "extra: unknown key"),
    (_ENTRY + "    compare: exact\n    colour: red\n", 5, "colour: unknown key"),
    (_ENTRY + "    compare: 1\n", 4, "compare: Input should be 'exact' or 'required_values'"),
    (_ENTRY + "    compare: fuzzy\n", 4, "compare: Input should be"),
    (_ENTRY, 3, "compare: Field required"),
    ("version: 2\ncontracts: []\n", 1, "version: Input should be 1"),
    (_ENTRY + "    schema_sha256: ABC\n    compare: exact\n", 4, "schema_sha256: String should match"),
    (_RV + "    patterns: ['a']\n", 5, "patterns: Input should be a valid dictionary"),
    (_RV + "    patterns: {a: '(unclosed'}\n", 5, "patterns.a: not a regular expression"),
    (_RV + "    patterns:\n      a: 'x'\n      b: '[0-9]*'\n", 7, "patterns.b: matches the empty string"),
    (_RV + "    patterns: {'bad-name': 'x'}\n", 5, "String should match pattern"),
    (_RV, 3, "exactly one of json_schema (JSON answers) or patterns"),
    (_RV + "    patterns: {a: x}\n    json_schema: {}\n", 3, "or patterns (free text), not both"),
    (_ENTRY + "    compare: exact\n    patterns: {a: x}\n", 5, "patterns: an exact contract compares"),
    (_ENTRY + "    compare: exact\n    json_schema: {required: [a]}\n", 5, "json_schema: an exact contract"),
    (_ENTRY + "    compare: exact\n  - id: c\n    compare: exact\n", 5, "listed twice (first at line 3)"),
    (
        "version: 1\ncontracts:\n" + _TWICE + "  - {id: c, compare: exact}\n" + _TWICE,
        5,
        f"{SHA_A}) is listed twice",
    ),
    (_RV + "    json_schema: {required: metric}\n", 5, "json_schema.required: required is a list"),
    (_RV + "    json_schema: {required: [a, a]}\n", 5, "names a field twice"),
    (_SCHEMA + "      type: array\n", 7, "json_schema.type: required fields on a schema of type 'array'"),
    (_SCHEMA + "      properties: [a]\n", 7, "json_schema.properties: properties is a mapping"),
    (_SCHEMA + "      properties: {a: 3}\n", 7, "json_schema.properties.a: a property's schema is a mapping"),
    (_SCHEMA + "      default: 2026-01-01\n", 7, "json_schema.default: not JSON data (date)"),
    (_SCHEMA + "      maximum: .inf\n", 7, "json_schema.maximum: not JSON data (inf)"),
    ("- just a list\n", 1, "a contracts file is a mapping"),
    ("", 1, "a contracts file is a mapping"),
    ("version: 1\ncontracts:\n  - {id: c, compare: exact\n", 4, "YAML syntax error"),
    ("version: 1\ncontracts: []\nversion: 1\n", 3, "duplicate key 'version'"),
]


@pytest.mark.parametrize(("text", "line", "problem"), REFUSALS, ids=[r[2][:40] for r in REFUSALS])
def test_every_problem_is_refused_at_its_file_and_line(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    """A contracts file with a problem is an InputError whose diagnostic is file:line: problem."""
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as e:
        load_contracts(path)
    assert e.value.line == line, str(e.value)
    assert str(e.value).startswith(f"{path}:{line}: "), str(e.value)
    assert problem in str(e.value)


def test_pattern_count_and_length_are_bounded(tmp_path: Path) -> None:
    """65 patterns, or a pattern of 513 characters, is refused at its line; 64 and 512 load."""
    head = _ENTRY + "    compare: required_values\n    patterns:\n"
    ok = head + "".join(f"      p{i}: 'x{i}'\n" for i in range(64))
    assert len(load_contracts(_write(tmp_path, ok)).entries[0].patterns) == 64
    with pytest.raises(InputError, match=r":6: .*at most 64 items"):
        load_contracts(_write(tmp_path, ok + "      p64: 'y'\n"))
    assert load_contracts(_write(tmp_path, head + f"      p: '{'x' * 512}'\n")).entries
    with pytest.raises(InputError, match=r":6: .*at most 512 characters"):
        load_contracts(_write(tmp_path, head + f"      p: '{'x' * 513}'\n"))


def test_required_paths_are_bounded(tmp_path: Path) -> None:
    """A schema marking more than 256 required paths is refused."""
    names = ", ".join(f"f{i}" for i in range(257))
    text = _ENTRY + f"    compare: required_values\n    json_schema: {{required: [{names}]}}\n"
    with pytest.raises(InputError, match=r":5: json_schema: more than 256 required paths"):
        load_contracts(_write(tmp_path, text))


def test_the_file_is_bounded_and_must_be_utf8(tmp_path: Path) -> None:
    """A file over 1 MiB, one that is not UTF-8, or none at all: an InputError naming the file."""
    big = _write(tmp_path, "version: 1\ncontracts: []\n" + "#" * (1 << 20))
    with pytest.raises(InputError, match="larger than 1 MiB"):
        load_contracts(big)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"version: 1\n# caf\xe9\ncontracts: []\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_contracts(bad)
    with pytest.raises(InputError, match="cannot read the contracts file"):
        load_contracts(tmp_path / "missing.yaml")


def test_a_spec_built_in_code_keeps_the_rules() -> None:
    """ContractSpec itself refuses an exact contract with values, or required_values with both or none."""
    with pytest.raises(ValueError):
        ContractSpec("c", None, "exact", (("a", "x"),))
    with pytest.raises(ValueError):
        ContractSpec("c", None, "required_values")
    with pytest.raises(ValueError):
        ContractSpec("c", None, "required_values", (("a", "x"),), json_paths=(("a",),))


# ---- exact -----------------------------------------------------------------------------------------


def test_exact_the_whole_answer_is_the_value() -> None:
    """Under exact, any change of the text changes the required value, and regressed says so."""
    c = EXACT.compare_answers("Revenue was $4.2 million.", "Revenue was $4.2 million!")
    assert (c.answer_changed, c.values_changed, c.regressed) == (True, True, True)
    assert c.lost == ("answer=Revenue was $4.2 million.",) and c.gained == (
        "answer=Revenue was $4.2 million!",
    )
    assert "character 24" in c.detail
    same = EXACT.compare_answers("a", "a")
    assert same == Comparison(False, False, (), (), "answer unchanged", False)


def test_token_ids_decide_whether_the_answer_changed_when_both_are_given() -> None:
    """Given both answers' token ids, they decide answer_changed (same text, other ids: changed)."""
    c = EXACT.compare_answers("ab", "ab", cold_ids=[1, 2], warm_ids=[3])
    assert c.answer_changed and c.regressed and "token ids changed, text identical" in c.detail
    assert not EXACT.compare_answers("ab", "ab", cold_ids=[1, 2], warm_ids=(1, 2)).answer_changed
    assert EXACT.compare_answers("ab", "ac", cold_ids=[1, 2], warm_ids=None).answer_changed  # one side: texts
    m = MONEY.compare_answers("12%", "12%", cold_ids=[1], warm_ids=[2])
    assert m.answer_changed and not m.values_changed and not m.regressed


# ---- patterns ----------------------------------------------------------------------------------------


def test_patterns_compare_the_set_of_matches_per_name() -> None:
    """Order and repetition of the values do not matter; another value, or one gone, does."""
    cold = "Notes of $4,182.7 million come due; 12% of sales, 12% again."
    reworded = "About 12% of sales. Notes of $4,182.7 million come due."
    c = MONEY.compare_answers(cold, reworded)
    assert c.answer_changed and not c.values_changed and not c.regressed
    assert c.lost == () and c.gained == () and "required values unchanged" in c.detail
    d = MONEY.compare_answers(cold, "Notes of $4,182 million come due.")
    assert d.values_changed and d.regressed
    assert d.lost == ("amount=$4,182.7 million", "percent=12%")
    assert d.gained == ("amount=$4,182 million",)
    assert "2 lost (amount=$4,182.7 million, percent=12%); 1 gained (amount=$4,182 million)" in d.detail


def test_whitespace_runs_are_one_space_before_matching() -> None:
    """A line break or double space inside a value matches the pattern's single space."""
    c = MONEY.compare_answers("It was $4.2 million.", "It was\n$4.2  \t million.")
    assert not c.values_changed and c.answer_changed


def test_a_pattern_neither_answer_matches_is_unchanged() -> None:
    """No match in either answer is the same (empty) set of values."""
    c = _patterns(days=r"[0-9]+ days").compare_answers("Revenue rose.", "Revenue fell.")
    assert c.answer_changed and not c.values_changed


# ---- JSON --------------------------------------------------------------------------------------------


def test_json_values_compare_as_json_structures() -> None:
    """Key order, spacing and 1 vs 1.0 do not change a value; true is not 1; other fields are ignored."""
    cold = '{"metric": "revenue", "value": 12}'
    assert not METRIC.compare_answers(cold, '{"value":12.0,"metric":"revenue","note":"x"}').values_changed
    c = METRIC.compare_answers('{"metric": "m", "value": 1}', '{"metric": "m", "value": true}')
    assert c.values_changed and c.lost == ("value=1",) and c.gained == ("value=true",)


def test_the_json_value_is_the_text_else_a_json_fence_else_the_outermost_braces() -> None:
    """An answer's JSON value is found in the stripped text, a ```json block or its outermost {...}."""
    cold = '  {"metric": "revenue", "value": 12.5}\n'
    fenced = 'Here it is:\n```json\n{"metric": "revenue", "value": 12.5}\n```\nDone.'
    braces = 'The record is {"metric": "revenue", "value": 12.5} as asked.'
    for warm in (fenced, braces):
        c = METRIC.compare_answers(cold, warm)
        assert c.answer_changed and not c.values_changed, warm
    assert METRIC.compare_answers(cold, braces.replace("12.5", "12.6")).lost == ("value=12.5",)


def test_a_missing_required_field_is_a_value_of_its_own() -> None:
    """A required field missing on one side is a changed value; missing on both is unchanged."""
    c = METRIC.compare_answers('{"metric": "m", "value": 3}', '{"metric": "m"}')
    assert c.regressed and c.lost == ("value=3",) and c.gained == ("value=(missing)",)
    assert not METRIC.compare_answers('{"metric": "m"}', '{"metric": "m", "x": 1}').values_changed
    assert METRIC.compare_answers('{"metric": "m", "value": null}', '{"metric": "m"}').values_changed


def test_nested_required_fields_are_read_through_required_objects() -> None:
    """Paths through properties of required objects: a.b changed is lost; a not an object is a value too."""
    spec = _json(("period", "year"), ("period", "quarter"))
    cold = '{"period": {"year": 2026, "quarter": 3, "note": "a"}}'
    assert not spec.compare_answers(
        cold, '{"period": {"quarter": 3, "year": 2026, "note": "b"}}'
    ).values_changed
    c = spec.compare_answers(cold, '{"period": {"year": 2026, "quarter": 2}}')
    assert c.lost == ("period.quarter=3",) and c.gained == ("period.quarter=2",)
    d = spec.compare_answers('{"period": "Q3"}', '{"period": "Q4"}')
    assert d.values_changed and d.lost[0] == 'period.year=(missing: period is "Q3")'


def test_arrays_are_compared_whole_and_in_order() -> None:
    """A required array is one value: reordered or changed items change it."""
    spec = _json(("risks",))
    assert not spec.compare_answers('{"risks": [1, 2]}', '{"risks": [1.0, 2]}').values_changed
    assert spec.compare_answers('{"risks": [1, 2]}', '{"risks": [2, 1]}').values_changed
    whole = _json(())
    c = whole.compare_answers('[{"metric": "a"}]', '[{"metric": "b"}]')
    assert c.values_changed and c.lost == ('$=[{"metric":"a"}]',)


def test_without_json_in_either_answer_the_texts_are_compared_exactly() -> None:
    """Neither answer holds JSON: changed exactly when the texts differ (never unchanged by default)."""
    c = METRIC.compare_answers("Revenue was 12.", "Revenue was 12!")
    assert c.values_changed and c.regressed and "no JSON value in either answer" in c.detail
    assert c.lost == ("answer=Revenue was 12.",)


def test_json_on_one_side_only_is_changed() -> None:
    """Cold has a JSON value and warm none (or the reverse): the required values changed."""
    good, bad = '{"metric": "m", "value": 1}', "I cannot answer that."
    for cold, warm, who in ((good, bad, "cold's answer has"), (bad, good, "warm's answer has")):
        c = METRIC.compare_answers(cold, warm)
        assert c.values_changed and c.regressed and who in c.detail


def test_duplicate_keys_are_no_json_value() -> None:
    """A JSON object repeating a key has no one meaning: no JSON value (so against a good one: changed)."""
    c = METRIC.compare_answers('{"metric": "m", "value": 1}', '{"metric": "m", "value": 2, "value": 1}')
    assert c.values_changed and "warm's has none" in c.detail


# ---- hostile answers -----------------------------------------------------------------------------


def test_deep_json_is_no_json_value_and_cheap() -> None:
    """JSON nested 30,000 deep is refused without recursion: no JSON value, quickly."""
    deep = '{"metric": "m", "value": ' + "[" * 30_000 + "]" * 30_000 + "}"
    t0 = time.perf_counter()
    c = METRIC.compare_answers('{"metric": "m", "value": 1}', deep)
    assert time.perf_counter() - t0 < 2.0
    assert c.values_changed and "warm's has none" in c.detail


def test_an_answer_past_the_examined_length_counts_as_changed() -> None:
    """Two different answers, one over 64 KiB: not examined, changed; the same long answer: unchanged."""
    long = "12% " * (MAX_ANSWER_CHARS // 4 + 1)
    c = MONEY.compare_answers(long, long + "x")
    assert c.values_changed and f"longer than {MAX_ANSWER_CHARS:,} characters" in c.detail
    assert not MONEY.compare_answers(long, long).values_changed


def test_too_many_matches_count_as_changed() -> None:
    """More than 256 matches of one pattern in an answer (repeats counted): not compared, changed."""
    many = " ".join(f"{i}%" for i in range(MAX_MATCHES + 1))
    c = MONEY.compare_answers(many, many + " 1%")
    assert c.values_changed and f"more than {MAX_MATCHES} matches of pattern 'percent' in cold's" in c.detail
    fine = [f"{i}%" for i in range(MAX_MATCHES)]
    assert not MONEY.compare_answers(" ".join(fine), " ".join(reversed(fine))).values_changed


def test_a_pattern_search_that_runs_too_long_gives_up_and_counts_as_changed() -> None:
    """A backtracking pattern on a hostile answer stops at the time budget: changed, within seconds."""
    slow = _patterns(run=r"(?:[0-9]|[0-9][0-9])+(?:x|y)")
    t0 = time.perf_counter()
    c = slow.compare_answers("12x", "1" * 20_000)
    assert time.perf_counter() - t0 < 3.0
    assert c.values_changed and "gave up after 0.5 s on warm's answer" in c.detail


def test_the_shipped_kind_of_pattern_is_fast_on_a_wall_of_digits() -> None:
    """64 KiB of digits against the percent and amount patterns (quadratic in Python's re) is quick."""
    wall = "1" * (MAX_ANSWER_CHARS - 1)
    t0 = time.perf_counter()
    c = MONEY.compare_answers("12%", wall)
    assert time.perf_counter() - t0 < 1.0
    assert c.lost == ("percent=12%",)


def test_lost_gained_and_detail_stay_bounded_and_printable() -> None:
    """Hundreds of changed values list at most 32 each, every one short; the detail is one short line."""
    cold = " ".join(f"{i}%" for i in range(200))
    warm = " ".join(f"{i}.5%" for i in range(200))
    c = MONEY.compare_answers(cold, warm)
    assert len(c.lost) == len(c.gained) == 32
    assert "200 lost" in c.detail and "200 gained" in c.detail
    e = EXACT.compare_answers("a\nb" * 1000, "a\x00\nb" * 1000)
    assert len(e.lost[0]) <= len("answer=") + 80 and "\n" not in e.lost[0] and "\x00" not in e.gained[0]
    for x in (c, e):
        assert len(x.detail) <= 300 and x.detail.isprintable()


# ---- properties --------------------------------------------------------------------------------------

SPECS = [EXACT, MONEY, METRIC, _json(())]
WORDS = st.sampled_from(["$4.2 million", "12%", "1.5%", "and", " ", "\n", "{", "}"])
SCALARS = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.booleans(), st.none())
TEXTS = st.one_of(
    st.text(max_size=200),
    st.lists(WORDS, max_size=12).map("".join),
    st.dictionaries(st.sampled_from(["metric", "value", "x"]), SCALARS, max_size=3).map(json.dumps),
)


@settings(max_examples=150, deadline=None)
@given(text=TEXTS, spec=st.sampled_from(SPECS))
def test_an_answer_is_unchanged_against_itself(text: str, spec: ContractSpec) -> None:
    """Whatever the contract, an answer compared with itself changed nothing."""
    c = spec.compare_answers(text, text)
    assert not c.answer_changed and not c.values_changed and not c.regressed and c.lost == c.gained == ()


@settings(max_examples=200, deadline=None)
@given(cold=TEXTS, warm=TEXTS, spec=st.sampled_from(SPECS))
def test_a_regression_needs_a_difference_and_swapping_swaps_lost_and_gained(
    cold: str, warm: str, spec: ContractSpec
) -> None:
    """A regression needs differing texts, exact's figures are one, swapped answers swap lost and gained."""
    c = spec.compare_answers(cold, warm)
    if c.regressed:
        assert cold != warm
    assert c.answer_changed == (cold != warm)
    if spec.compare == "exact":
        assert c.values_changed == c.answer_changed == c.regressed
    else:
        assert c.regressed == c.values_changed
    r = spec.compare_answers(warm, cold)
    assert (r.lost, r.gained, r.values_changed) == (c.gained, c.lost, c.values_changed)


@settings(max_examples=100, deadline=None)
@given(
    doc=st.dictionaries(
        st.sampled_from(["metric", "value", "a", "b"]), st.integers(-(10**9), 10**9), max_size=4
    ),
    seed=st.randoms(),
)
def test_key_order_never_changes_a_json_value(doc: dict[str, int], seed: random.Random) -> None:
    """The same JSON object with its keys in another order and floats for its integers is unchanged."""
    keys = list(doc)
    seed.shuffle(keys)
    other = json.dumps({k: float(doc[k]) for k in keys})
    assert not METRIC.compare_answers(json.dumps(doc), other).values_changed
