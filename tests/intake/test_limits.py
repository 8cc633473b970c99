"""Resource limits: each at its boundary (at the limit passes, one over fails with a named error),
their settings (environment, flags, errors), and fail-closed denies for requests over them."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator
from semgov._internal.yamlload import load_yaml_with_lines
from semgov.cli.main import main
from semgov.errors import PolicyError
from semgov.facts.pii import PiiScanner
from semgov.intake.capture import MalformedLine, parse_line, read_captured
from semgov.intake.limits import MAX_ID_CHARS, SETTINGS, LimitError, Limits
from semgov.policy.rego.loader import RegoPolicy, lint, load_rego_policy, rego_files
from semgov.policy.source import load_policy_source
from semgov.policy.yaml.model import Policy, load_policy
from semgov.signing.records import verify_record
from semgov.wire.models import GATES, CapturedRequest
from tests.conftest import DEFAULT_POLICY_DIR, ROOT, Keys, candidate, parse, request, segs, with_text

REGO_DIR = ROOT / "policies" / "rego" / "default"
EX = ROOT / "examples"


@pytest.fixture(scope="module")
def rego_policy() -> RegoPolicy:
    return load_rego_policy(REGO_DIR)


def ev_with(policy: Any, keys: Keys, scanner: PiiScanner, **limits: int) -> Evaluator:
    return Evaluator(policy, keys.keyring, keys.decision, pii_scanner=scanner, limits=Limits(**limits))


def cands(keys: Keys, n: int) -> list[dict[str, Any]]:
    return [candidate(keys, f"d-{i}") for i in range(n)]


def assert_refused(recs: list[dict[str, Any]], keys: Keys, *needles: str) -> None:
    """Every record is a signed deny whose ten gates are `error` naming the limit."""
    assert recs
    for r in recs:
        verify_record(r, keys.decision.public_key)
        assert r["decision"] == "deny" and r["approved_spans"] == [] and r["approved_tokens"] == 0
        assert [g["gate"] for g in r["gates"]] == list(GATES)
        for g in r["gates"]:
            assert g["result"] == "error" and g["detail"].startswith("input limit exceeded: ")
            for n in needles:
                assert n in g["detail"], g["detail"]


def records(ev: Evaluator, req: dict[str, Any]) -> list[dict[str, Any]]:
    return [d.record for d in ev.evaluate(parse(req))]


# ---- the Limits value and its settings -------------------------------------------------------


def test_defaults_are_documented_values() -> None:
    """The defaults are the values docs/limits.md lists."""
    d = Limits()
    assert (d.max_line_bytes, d.max_prompt_tokens, d.max_text_chars, d.max_candidates) == (
        64 * 1024 * 1024,
        262_144,
        2 * 1024 * 1024,
        64,
    )
    assert (d.max_policy_bytes, d.max_yaml_depth, d.max_yaml_nodes, d.max_rego_depth) == (
        1 << 20,
        64,
        100_000,
        12,
    )
    doc = (ROOT / "docs" / "limits.md").read_text()
    for s in SETTINGS:
        assert f"`{s.field}`" in doc and s.env in doc and (s.flag is None or s.flag in doc)


def test_from_env_reads_every_variable() -> None:
    """Each SEMGOV_MAX_* variable sets its limit; underscores and surrounding blanks are accepted."""
    env = {s.env: f" {i + 2} " for i, s in enumerate(SETTINGS)}
    got = Limits.from_env(env)
    for i, s in enumerate(SETTINGS):
        assert getattr(got, s.field) == i + 2
    assert Limits.from_env({"SEMGOV_MAX_LINE_BYTES": "1_000_000"}).max_line_bytes == 1_000_000
    assert Limits.from_env({}) == Limits()


@pytest.mark.parametrize("raw", ["", "abc", "0", "-1", "+5", "1.5", "1e6", "0x10", "5_", "１２"])
def test_bad_env_value_names_the_variable(raw: str) -> None:
    """A value that is not a positive decimal integer is an error naming the variable."""
    with pytest.raises(LimitError) as e:
        Limits.from_env({"SEMGOV_MAX_CANDIDATES": raw})
    assert e.value.field == "SEMGOV_MAX_CANDIDATES" and "positive integer" in str(e.value)


def test_depth_ceilings_are_enforced_with_the_variable_named() -> None:
    """YAML and Rego depth settings beyond their safe ceilings are refused, naming the variable."""
    assert Limits.from_env({"SEMGOV_MAX_YAML_DEPTH": "200"}).max_yaml_depth == 200
    with pytest.raises(LimitError) as e:
        Limits.from_env({"SEMGOV_MAX_YAML_DEPTH": "201"})
    assert e.value.field == "SEMGOV_MAX_YAML_DEPTH" and "at most 200" in str(e.value)
    with pytest.raises(LimitError) as e:
        Limits.from_env({"SEMGOV_MAX_REGO_DEPTH": "25"})
    assert e.value.field == "SEMGOV_MAX_REGO_DEPTH"


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "5"])
def test_limits_value_must_be_positive_ints(bad: object) -> None:
    """A Limits built in code refuses zero, negatives, booleans and non-integers."""
    with pytest.raises(LimitError, match="max_candidates must be a positive integer"):
        Limits(max_candidates=bad)  # type: ignore[arg-type]


def test_with_overrides_ignores_unset_flags() -> None:
    """None (a flag not given) keeps the current value; unknown names are an error."""
    base = Limits(max_candidates=3)
    assert base.with_overrides(max_candidates=None, max_line_bytes=10) == Limits(
        max_candidates=3, max_line_bytes=10
    )
    with pytest.raises(LimitError):
        base.with_overrides(max_bananas=1)


def test_id_limit_matches_the_wire_types() -> None:
    """MAX_ID_CHARS is the maxLength the captured-request schema publishes for ids."""
    schema = json.loads((ROOT / "schemas" / "captured_request.schema.json").read_text())
    assert schema["properties"]["request_id"]["maxLength"] == MAX_ID_CHARS


# ---- max_line_bytes -------------------------------------------------------------------------


def _padded_line(keys: Keys, size: int) -> bytes:
    raw = json.dumps(request([candidate(keys, "a"), candidate(keys, "b")])).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))  # JSON allows trailing blanks


def test_line_exactly_at_limit_parses(keys: Keys) -> None:
    """A line of exactly max_line_bytes (newline not counted) is read."""
    line = _padded_line(keys, 20_000)
    assert isinstance(parse_line(line + b"\n", 1, limits=Limits(max_line_bytes=20_000)), CapturedRequest)


def test_line_one_byte_over_is_malformed_naming_the_limit(keys: Keys) -> None:
    """One byte over: malformed, the reason names the size, the limit and how to raise it."""
    line = _padded_line(keys, 20_001)
    got = parse_line(line, 4, limits=Limits(max_line_bytes=20_000))
    assert isinstance(got, MalformedLine) and got.line == 4
    assert "20001 bytes" in got.reason and "max_line_bytes = 20000" in got.reason
    assert "SEMGOV_MAX_LINE_BYTES" in got.reason and "--max-line-bytes" in got.reason
    assert got.request_id == "r-17" and got.donor_ids == ("a", "b")


def test_long_line_in_file_is_never_read_whole(tmp_path: Path, keys: Keys, evaluator: Evaluator) -> None:
    """A long line (gzip too) is skipped in chunks, its prefix's donors denied, the next line read."""
    good = json.dumps(request([candidate(keys)])).encode()
    long_req = request([candidate(keys, "x1"), candidate(keys, "x2")], request_id="r-long")
    long_line = json.dumps(long_req).encode() + b" " * 3_000_000
    limit = long_line.index(b'"x2"') + 2  # the kept prefix ends inside the second donor id
    assert len(good) <= limit
    for name, opener in (("c.jsonl", open), ("c.jsonl.gz", gzip.open)):
        p = tmp_path / name
        with opener(p, "wb") as f:
            f.write(good + b"\n" + long_line + b"\n" + good + b"\n")
        items = list(read_captured(p, limits=Limits(max_line_bytes=limit)))
        assert [type(i).__name__ for i in items] == ["CapturedRequest", "MalformedLine", "CapturedRequest"]
        bad = items[1]
        assert isinstance(bad, MalformedLine) and bad.line == 2 and f"{len(long_line)} bytes" in bad.reason
        assert bad.request_id == "r-long" and bad.donor_ids == ("x1",)  # x2 lies past the kept prefix
        ds = evaluator.deny_malformed(bad, parse(long_req).received_at)
        assert [d.decision for d in ds] == ["deny"] and "max_line_bytes" in ds[0].record["gates"][0]["detail"]


# ---- max_candidates, max_prompt_tokens, max_text_chars ----------------------------------------


@pytest.mark.parametrize("engine", ["yaml", "rego"])
def test_candidates_at_limit_are_decided_one_over_all_denied(
    engine: str, keys: Keys, default_policy: Policy, rego_policy: RegoPolicy, pii_scanner: PiiScanner
) -> None:
    """max_candidates candidates are decided normally; one more denies every one, naming the limit."""
    ev = ev_with(default_policy if engine == "yaml" else rego_policy, keys, pii_scanner, max_candidates=3)
    assert [r["decision"] for r in records(ev, request(cands(keys, 3)))] == ["allow"] * 3
    recs = records(ev, request(cands(keys, 4)))
    assert [r["donor_id"] for r in recs] == ["d-0", "d-1", "d-2", "d-3"]
    assert_refused(recs, keys, "request has 4 candidates", "max_candidates = 3", "SEMGOV_MAX_CANDIDATES")


@pytest.mark.parametrize("engine", ["yaml", "rego"])
def test_recipient_tokens_at_limit_pass_one_over_denies_all(
    engine: str, keys: Keys, default_policy: Policy, rego_policy: RegoPolicy, pii_scanner: PiiScanner
) -> None:
    """A recipient of exactly max_prompt_tokens is decided; one token over denies every candidate."""
    ev = ev_with(
        default_policy if engine == "yaml" else rego_policy, keys, pii_scanner, max_prompt_tokens=370
    )
    assert [r["decision"] for r in records(ev, request(cands(keys, 2)))] == ["allow", "allow"]
    longer = segs(("system", list(range(100, 120))), ("evidence", list(range(1000, 1351))))
    recs = records(ev, request(cands(keys, 2), prompt=longer))
    assert_refused(recs, keys, "recipient prompt has 371 tokens", "max_prompt_tokens = 370")
    assert all(r["recipient_tokens"] == 371 for r in recs)


def test_donor_over_token_limit_denies_that_candidate_only(
    keys: Keys, default_policy: Policy, pii_scanner: PiiScanner
) -> None:
    """A donor prompt over max_prompt_tokens denies its candidate; the others are decided."""
    ev = ev_with(default_policy, keys, pii_scanner, max_prompt_tokens=370)
    big = segs(("system", list(range(100, 120))), ("evidence", list(range(1000, 1351))))
    recs = records(ev, request([candidate(keys, "ok"), candidate(keys, "big", big), candidate(keys, "ok2")]))
    assert [r["decision"] for r in recs] == ["allow", "deny", "allow"]
    assert_refused([recs[1]], keys, "donor 'big' prompt has 371 tokens", "max_prompt_tokens = 370")


def test_text_at_limit_is_scanned_one_over_is_refused(
    keys: Keys, default_policy: Policy, pii_scanner: PiiScanner
) -> None:
    """Donor text of exactly max_text_chars is PII-scanned as usual; one character more denies."""
    ev = ev_with(default_policy, keys, pii_scanner, max_text_chars=40)
    c = candidate(keys)
    c = with_text(keys, c, "x" * 40)
    assert records(ev, request([c]))[0]["decision"] == "allow"
    c = with_text(keys, c, "x" * 41)
    [rec] = records(ev, request([c]))
    assert_refused([rec], keys, "donor 'r-03' prompt text has 41 characters", "max_text_chars = 40")


def test_refusal_happens_before_any_fact_is_computed(
    keys: Keys, default_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a limit, no fact (token hash, signature, spans, PII scan) is computed and no engine runs."""
    import semgov.decide

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("computed facts for a refused request")

    class NoScan:
        def scan(self, *a: object, **k: object) -> frozenset[str]:
            raise AssertionError("scanned a refused donor")

    no_scan: Any = NoScan()
    monkeypatch.setattr(semgov.decide, "compute_facts", boom)
    monkeypatch.setattr(semgov.decide.PreparedPrompt, "of", boom)
    ev = Evaluator(
        default_policy, keys.keyring, keys.decision, pii_scanner=no_scan, limits=Limits(max_candidates=1)
    )
    monkeypatch.setattr(ev.engine, "evaluate", boom)
    assert_refused(records(ev, request(cands(keys, 2))), keys, "max_candidates")
    c = candidate(keys)
    c = with_text(keys, c, "x" * 10)
    small = Limits(max_text_chars=5)
    ev2 = Evaluator(default_policy, keys.keyring, keys.decision, pii_scanner=no_scan, limits=small)
    assert ev2.register_donor(parse(request([c])).candidates[0].prompt) is None


def test_policy_inputs_refuses_with_a_named_error(
    keys: Keys, default_policy: Policy, pii_scanner: PiiScanner
) -> None:
    """Evaluator.policy_inputs raises LimitError (an InputError) for a request over a limit."""
    ev = ev_with(default_policy, keys, pii_scanner, max_candidates=1)
    with pytest.raises(LimitError, match="max_candidates = 1"):
        ev.policy_inputs(parse(request(cands(keys, 2))))


def test_evaluator_default_limits_come_from_the_environment(
    keys: Keys, default_policy: Policy, pii_scanner: PiiScanner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without limits=, the Evaluator (as the engine hook builds it) applies SEMGOV_MAX_* settings."""
    monkeypatch.setenv("SEMGOV_MAX_CANDIDATES", "1")
    ev = Evaluator(default_policy, keys.keyring, keys.decision, pii_scanner=pii_scanner)
    assert ev.limits.max_candidates == 1
    assert_refused(records(ev, request(cands(keys, 2))), keys, "SEMGOV_MAX_CANDIDATES")


# ---- policy size, YAML nesting and aliases, Rego nesting --------------------------------------


def test_yaml_policy_at_size_limit_loads_one_byte_over_fails(tmp_path: Path) -> None:
    """policy.yaml of exactly max_policy_bytes loads; one byte more is a PolicyError naming the file."""
    content = (DEFAULT_POLICY_DIR / "policy.yaml").read_bytes()
    (tmp_path / "policy.yaml").write_bytes(content)
    assert load_policy(tmp_path, limits=Limits(max_policy_bytes=len(content))).name == "default"
    with pytest.raises(PolicyError) as e:
        load_policy_source(tmp_path, limits=Limits(max_policy_bytes=len(content) - 1))
    assert e.value.source == str(tmp_path / "policy.yaml")
    assert f"{len(content)} bytes" in str(e.value) and "SEMGOV_MAX_POLICY_BYTES" in str(e.value)


def test_rego_module_and_total_size_limits(tmp_path: Path) -> None:
    """Each Rego module, and all modules together, are bounded by max_policy_bytes."""
    shutil.copy(REGO_DIR / "policy.rego", tmp_path / "policy.rego")
    size = (tmp_path / "policy.rego").stat().st_size
    assert load_rego_policy(tmp_path, limits=Limits(max_policy_bytes=size)).name == "default"
    with pytest.raises(PolicyError, match="max_policy_bytes") as e:
        load_rego_policy(tmp_path, limits=Limits(max_policy_bytes=size - 1))
    assert e.value.source == str(tmp_path / "policy.rego")
    (tmp_path / "zz_extra.rego").write_text("package semgov.reuse\n\nextra := 1\n")
    with pytest.raises(PolicyError, match="total") as e:
        rego_files(tmp_path, limits=Limits(max_policy_bytes=size + 10))
    assert e.value.source == str(tmp_path / "zz_extra.rego")


def _nested(depth: int) -> str:
    """A mapping holding sequences: ``depth`` nested collections, the deepest on line 2."""
    return "# nested\nx: " + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "\n"


def test_yaml_depth_at_limit_loads_one_over_fails() -> None:
    """Collections nested exactly max_yaml_depth deep load; one level more names file:line and the setting."""
    assert load_yaml_with_lines(_nested(10), "p.yaml", limits=Limits(max_yaml_depth=10))[0] is not None
    with pytest.raises(PolicyError) as e:
        load_yaml_with_lines(_nested(11), "p.yaml", limits=Limits(max_yaml_depth=10))
    assert e.value.diagnostic().startswith("p.yaml:2: YAML nested deeper than 10 levels")
    assert "SEMGOV_MAX_YAML_DEPTH" in str(e.value)


def test_yaml_depth_far_beyond_recursion_limit_is_a_policy_error() -> None:
    """100,000 nested brackets are refused cleanly (no RecursionError, no traceback)."""
    with pytest.raises(PolicyError, match="nested deeper than 64"):
        load_yaml_with_lines("x: " + "[" * 100_000 + "]" * 100_000, "p.yaml", limits=Limits())


def test_yaml_nodes_count_aliases_as_their_expansion() -> None:
    """An alias counts as the nodes it expands to: exactly max_yaml_nodes loads, one more fails."""
    doc = "a: &a [1, 2, 3]\nb: *a\n"  # mapping, 'a', seq+3, 'b', alias = 4 -> 11 nodes
    data, _ = load_yaml_with_lines(doc, "p.yaml", limits=Limits(max_yaml_nodes=11))
    assert data == {"a": [1, 2, 3], "b": [1, 2, 3]}
    with pytest.raises(PolicyError) as e:
        load_yaml_with_lines(doc, "p.yaml", limits=Limits(max_yaml_nodes=10))
    assert (
        e.value.line == 2
        and "max_yaml_nodes = 10" in str(e.value)
        and "SEMGOV_MAX_YAML_NODES" in str(e.value)
    )


def test_billion_laughs_is_refused_without_expanding() -> None:
    """A 10^9-node alias bomb is refused at the alias that crosses the limit, in milliseconds."""
    import time

    doc = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        doc += f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}'] * 10)}]\n"
    t0 = time.perf_counter()
    with pytest.raises(PolicyError, match="alias bomb") as e:
        load_yaml_with_lines(doc, "bomb.yaml", limits=Limits())
    assert time.perf_counter() - t0 < 2.0 and e.value.line == 5


def _rego(depth: int) -> str:
    return (
        'package semgov.reuse\n\n# comment ((((((((((((((((\ns := "[[[[[[[[[[[[[[[[[[["\n'
        f"x := {'[' * depth}1{']' * depth}\n"
    )


def test_rego_depth_at_limit_loads_one_over_fails(tmp_path: Path) -> None:
    """Brackets nested exactly max_rego_depth deep pass (strings and comments ignored); one more fails."""
    (tmp_path / "m.rego").write_text(_rego(6))
    assert lint(tmp_path, limits=Limits(max_rego_depth=6))  # lints (missing rules), no depth error
    (tmp_path / "m.rego").write_text(_rego(7))
    with pytest.raises(PolicyError) as e:
        lint(tmp_path, limits=Limits(max_rego_depth=6))
    assert e.value.diagnostic().startswith(f"{tmp_path / 'm.rego'}:5: brackets nested deeper than 6")
    assert "SEMGOV_MAX_REGO_DEPTH" in str(e.value)


def test_rego_nesting_bomb_is_refused_fast(tmp_path: Path) -> None:
    """A 60-byte module that regorus would take hours to parse is refused before parsing."""
    import time

    (tmp_path / "m.rego").write_text("package semgov.reuse\nx := " + "[{1:" * 30 + "1" + "}]" * 30 + "\n")
    t0 = time.perf_counter()
    with pytest.raises(PolicyError, match="max_rego_depth"):
        load_policy_source(tmp_path, limits=Limits())
    assert time.perf_counter() - t0 < 2.0


# ---- the command line -------------------------------------------------------------------------


def _check_args(captured: Path, *extra: str) -> list[str]:
    return [
        "check", str(captured), "--policy", str(DEFAULT_POLICY_DIR), "--trust", str(EX / "keyring.json"),
        "--signing-key", str(EX / "keys" / "decision-signing-key.pem"), "--format", "jsonl", *extra,
    ]  # fmt: skip


def _first_line(tmp_path: Path, min_candidates: int = 0) -> Path:
    """The first example request with at least ``min_candidates`` candidates, as a one-line file."""
    with gzip.open(EX / "captured.jsonl.gz", "rb") as f:
        line = next(x for x in f if len(json.loads(x)["candidates"]) >= min_candidates)
    p = tmp_path / "one.jsonl"
    p.write_bytes(line)
    return p


def test_check_flags_override_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-candidates wins over SEMGOV_MAX_CANDIDATES; over the limit, every record is a deny naming it."""
    p = _first_line(tmp_path, min_candidates=2)
    n = len(json.loads(p.read_bytes())["candidates"])
    monkeypatch.setenv("SEMGOV_MAX_CANDIDATES", str(n))
    assert main(_check_args(p, "--max-candidates", str(n - 1))) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(recs) == n and all(r["decision"] == "deny" for r in recs)
    assert all("max_candidates = " + str(n - 1) in g["detail"] for r in recs for g in r["gates"])
    monkeypatch.setenv("SEMGOV_MAX_CANDIDATES", str(n - 1))
    assert main(_check_args(p, "--max-candidates", str(n))) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert not any("input limit" in g["detail"] for r in recs for g in r["gates"])


def test_check_line_limit_flag_reports_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line over --max-line-bytes is reported by number, its donors denied, and the exit status is 2."""
    p = _first_line(tmp_path, min_candidates=1)
    assert main(_check_args(p, "--max-line-bytes", "100")) == 2
    out = capsys.readouterr()
    assert f"{p}:1: skipped malformed request: line is" in out.err and "--max-line-bytes" in out.err
    assert all(json.loads(x)["decision"] == "deny" for x in out.out.splitlines())


def test_bad_env_setting_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An invalid SEMGOV_MAX_* value stops semgov check with exit 2 and names the variable."""
    monkeypatch.setenv("SEMGOV_MAX_PROMPT_TOKENS", "lots")
    assert main(_check_args(_first_line(tmp_path))) == 2
    assert "SEMGOV_MAX_PROMPT_TOKENS: must be a positive integer" in capsys.readouterr().err


def test_bad_flag_value_is_refused_by_argparse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-candidates 0 is a usage error (exit 2) saying what is expected."""
    with pytest.raises(SystemExit) as e:
        main(_check_args(_first_line(tmp_path), "--max-candidates", "0"))
    assert e.value.code == 2 and "must be a positive integer" in capsys.readouterr().err


def test_help_shows_each_default_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """semgov check --help lists every limit flag with its default and environment variable."""
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for s in SETTINGS:
        if s.flag is not None:
            assert s.flag in out and f"default {getattr(Limits(), s.field)} {s.unit}" in out and s.env in out


def test_policy_check_takes_the_policy_size_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """semgov policy check --max-policy-bytes reports an oversized policy file."""
    assert main(["policy", "check", str(DEFAULT_POLICY_DIR), "--max-policy-bytes", "100"]) == 2
    assert "max_policy_bytes = 100" in capsys.readouterr().out
