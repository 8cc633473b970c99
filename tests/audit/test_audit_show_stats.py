"""`semgov audit show --format table|csv|json|jsonl` and `semgov audit stats --by tenant|namespace|
policy|gate` over a real signed log (issue 18): the columns a compliance reviewer reads, CSV that
is safe to open in a spreadsheet, and groupings checked against an independent count of the
records `show --format jsonl` lists (live decisions only: shadow decisions and engine events are
never counted as decisions)."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator, load_policy
from semgov.audit.export import CSV_COLUMNS, csv_row, neutralize
from semgov.audit.grouping import group
from semgov.audit.store import AuditLog
from semgov.cli.main import main
from semgov.signing.engine_events import engine_event, sign_engine_event
from semgov.signing.shadow import shadow_record
from tests.audit_fixtures import AT, KEY, realization, record_payloads, write_log
from tests.conftest import DEFAULT_POLICY_DIR, candidate, parse, policy_with, request

T = datetime(2026, 11, 29, 10, tzinfo=UTC)
EVIL_TENANT = "=cmd|' /C calc'!A0"  # a tenant name a client chose: a formula to a spreadsheet
EVIL_NS = "@SUM(1+1)"
# (policy, tenant, namespace, donor tenant, donor namespace, similarity, provenance signer, now)
CASES = [
    ("default", "acme", "research/a", None, None, 0.9, "k1", T),  # allow
    ("default", "acme", "research/a", None, None, 0.2, "k1", T + timedelta(hours=1)),  # deny: similarity
    ("strict", "acme", "research/b", None, None, 0.9, "k1", T + timedelta(hours=2)),  # deny: similarity
    ("strict", "acme", "research/b", None, None, 0.97, "k1", T),  # allow (logged after a later one)
    ("default", "globex", "ops", "acme", None, 0.9, "k1", T),  # deny: tenant fail, token_verification error
    ("default", "globex", "ops", "acme", "research/a", 0.2, "k1", T),  # deny: four gates
    ("review", "globex", "ops", None, None, 0.9, "k1", T + timedelta(milliseconds=500)),  # allow
    ("review", "globex", "eu/ops", None, None, 0.9, "k1", T),  # allow (earlier than the one before)
    ("default", "acme", "research/a", None, None, 0.9, "k9", T),  # deny: provenance (unknown key)
    ("default", "acme", "research/a", None, None, 0.9, "k1", datetime(2026, 12, 6, tzinfo=UTC)),  # expiry
    ("default", EVIL_TENANT, EVIL_NS, None, None, 0.9, "k1", T + timedelta(milliseconds=250)),  # allow
]
SHADOWED = (0, 4)  # cases a strict shadow policy also decides
HEADER = ["index", "kind", "at", "decision", "tenant", "namespace", "request_id", "donor_id",
          "donor_tenant", "donor_namespace", "decision_id", "policy", "policy_revision", "approved_tokens",
          "recipient_tokens", "failed_gates", "cross_boundary", "event_kind", "materialized_tokens",
          "detail"]  # fmt: skip


def _ids(i: int) -> tuple[str, str]:
    """Request and donor id of case ``i``; the last case's start with formula characters."""
    return ("+r-10", "-d-10") if i == 10 else (f"r-{i}", f"d-{i}")


def _records(keys: Any) -> list[bytes]:
    policies = {
        "default": load_policy(DEFAULT_POLICY_DIR),
        "strict": policy_with("similarity: {min: 0.95}"),
        "review": policy_with('name: review\nversion: "2"\naccepted_policy_versions: ["default@1"]'),
    }
    ev = {k: Evaluator(p, keys.keyring, KEY) for k, p in policies.items()}
    out: list[bytes] = []
    for i, (pol, tenant, ns, dt, dns, sim, signer, now) in enumerate(CASES):
        rid, did = _ids(i)
        cand = candidate(keys, did, similarity=sim, signer=signer, tenant=dt or tenant, namespace=dns or ns)
        req = parse(request([cand], request_id=rid, tenant=tenant, namespace=ns))
        [d] = ev[pol].evaluate(req, now=now)
        out.append(d.canonical)
        if d.decision == "allow":
            out.append(realization(d.canonical, KEY))
        if i in SHADOWED:
            [sh] = ev["strict"].evaluate(req, now=now)
            out.append(shadow_record(sh, d, KEY).canonical)
    unsigned = engine_event("reuse_disabled", engine="sglang 0.5.23", at=AT, detail="invariant tripped")
    return [*out, sign_engine_event(unsigned, KEY).canonical]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    d = tmp_path_factory.mktemp("review") / "log"
    write_log(d, _records(keys))
    return d


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _jsonl(capsys: pytest.CaptureFixture[str], log: Path, *args: str) -> list[dict[str, Any]]:
    """The records `show --format jsonl` lists: what every count below is checked against."""
    out = _run(capsys, "audit", "show", str(log), "--format", "jsonl", *args)
    return [json.loads(line) for line in out.splitlines()]


def _kind(rec: dict[str, Any]) -> str:
    schema = rec["schema"]
    return "event" if "engine_event" in schema else "shadow" if "shadow" in schema else "decision"


def _live(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if _kind(r) == "decision"]


def _failing(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in rec.get("gates", []) if g["result"] != "pass"]


def _parse_time(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def _outcomes(recs: list[dict[str, Any]]) -> list[int]:
    """Candidates, allows, denies and approved tokens of live decisions, counted here."""
    allow, deny = (sum(r["decision"] == d for r in recs) for d in ("allow", "deny"))
    return [len(recs), allow, deny, sum(r["approved_tokens"] for r in recs)]


def _policy_key(rec: dict[str, Any]) -> tuple[str, str]:
    p = rec["policy"]
    return f"{p['name']}@{p['version']} ({p['engine']})", p["revision"]


def _table_rows(out: str, header: str) -> tuple[list[str], str]:
    """The rows of the table whose header line starts with ``header``, and its total row."""
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(header))
    rule = next(i for i in range(start, len(lines)) if set(lines[i]) == {"-"})
    return lines[start + 1 : rule], lines[rule + 1]


def test_fixture_mixes_tenants_policies_gates_shadows_and_events(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log holds 11 live decisions of 3 tenants and 3 policy revisions, 2 shadows and 6 events."""
    recs = _jsonl(capsys, log)
    assert Counter(_kind(r) for r in recs) == {"decision": 11, "event": 6, "shadow": 2}
    live = _live(recs)
    assert {r["tenant"] for r in live} == {"acme", "globex", EVIL_TENANT}
    assert len({r["policy"]["revision"] for r in live}) == 3
    assert any(g["result"] == "error" for r in live for g in r["gates"])
    assert any(len(_failing(r)) > 1 for r in live) and any(len(_failing(r)) == 1 for r in live)


def test_table_has_namespace_policy_and_failed_gates_columns(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each decision row shows tenant, namespace, policy name@version and the gates that did not
    pass; events show "-" there; the closing line counts each kind."""
    recs = _jsonl(capsys, log)
    out = _run(capsys, "audit", "show", str(log)).splitlines()
    assert out[0].split() == ["index", "evaluated_at", "decision", "tenant", "namespace", "policy", "request",
                              "donor", "tokens", "failed", "gates", "|", "event"]  # fmt: skip
    assert len(out) == len(recs) + 2
    for rec, line in zip(recs, out[1:-1], strict=True):
        row = line.split()
        assert row[0] == str(rec["index"])
        if _kind(rec) == "event":
            assert row[2:6] == ["event", "-", "-", "-"] and rec["kind"] in line
        elif rec["tenant"] != EVIL_TENANT:
            policy = f"{rec['policy']['name']}@{rec['policy']['version']}"
            assert row[3:6] == [rec["tenant"], rec["namespace"], policy]
            failed = ",".join(g["gate"] for g in _failing(rec))
            assert line.endswith(f"  {failed}" if _kind(rec) == "decision" else f"failed {failed}")
        else:
            assert f"  {EVIL_TENANT[:12]}  {EVIL_NS}  " in line
    assert out[-1] == "11 decision(s), 6 engine event(s), 2 shadow decision(s)"
    shadow = next(line for rec, line in zip(recs, out[1:], strict=False) if _kind(rec) == "shadow")
    assert shadow.split()[2] == "shadow" and " live " in shadow


def test_table_escapes_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tenant name with a newline or a terminal escape neither adds a row nor reaches the terminal."""
    rec = {"schema": "semgov.decision/v2", "tenant": "evil\nrow\x1b[31m", "decision": "deny", "gates": []}
    d = tmp_path / "log"
    with AuditLog.open(d, signing_key=KEY, origin="semgov/test") as w:
        w.append(json.dumps(rec).encode())
    out = _run(capsys, "audit", "show", str(d)).splitlines()
    assert len(out) == 3 and "\x1b" not in "".join(out)
    assert "evil\\nrow\\x" in out[1]


def _unprefixed(cell: str) -> str:
    """A CSV cell as logged: without the ``'`` put before a leading formula character."""
    return cell[1:] if cell[:1] == "'" and cell[1:2] in ("=", "+", "-", "@", "\t", "\r") else cell


def _expected_csv(rec: dict[str, Any]) -> dict[str, str]:
    """What each CSV cell of ``rec`` should hold, worked out from the JSON record."""
    kind = _kind(rec)
    out = dict.fromkeys(HEADER, "")
    out.update(index=str(rec["index"]), kind=kind, request_id=rec.get("request_id") or "",
               donor_id=rec.get("donor_id") or "", decision_id=rec.get("decision_id") or "")  # fmt: skip
    if kind == "event":
        out.update(at=rec["at"], event_kind=rec["kind"], materialized_tokens=str(rec["materialized_tokens"]),
                   detail=rec["detail"])  # fmt: skip
        return out
    policy = rec["policy"]
    crossed = [f"{c['boundary']}:{c['rule']}" for c in rec.get("cross_boundary", [])]
    for k in ("decision", "tenant", "namespace", "donor_tenant", "donor_namespace"):
        out[k] = rec.get(k) or ""
    out.update(at=rec["evaluated_at"], policy=f"{policy['name']}@{policy['version']}",
               policy_revision=policy["revision"], approved_tokens=str(rec["approved_tokens"]),
               recipient_tokens=str(rec["recipient_tokens"]), cross_boundary=";".join(crossed),
               failed_gates=";".join(g["gate"] for g in _failing(rec)))  # fmt: skip
    if kind == "shadow":
        live = rec["live_decision"]
        out["detail"] = f"live {live} {rec['live_decision_id']}" + (" DISAGREE" * (live != rec["decision"]))
    return out


def test_csv_rows_equal_the_records(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format csv: the header row, then one row per record whose cells are the record's fields."""
    recs = _jsonl(capsys, log)
    rows = list(csv.reader(io.StringIO(_run(capsys, "audit", "show", str(log), "--format", "csv"))))
    assert rows[0] == HEADER == list(CSV_COLUMNS)
    assert len(rows) == len(recs) + 1
    for rec, row in zip(recs, rows[1:], strict=True):
        assert {k: _unprefixed(v) for k, v in zip(HEADER, row, strict=True)} == _expected_csv(rec)


def test_csv_neutralizes_formula_cells(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cells starting with =, +, - or @ (a client's tenant, namespace, ids) get a leading ', nothing else."""
    rows = list(csv.DictReader(io.StringIO(_run(capsys, "audit", "show", str(log), "--format", "csv"))))
    evil = [r for r in rows if r["tenant"].startswith("'")]
    assert len(evil) == 1
    assert (evil[0]["tenant"], evil[0]["namespace"]) == ("'" + EVIL_TENANT, "'" + EVIL_NS)
    assert (evil[0]["request_id"], evil[0]["donor_id"]) == ("'+r-10", "'-d-10")
    realized = next(r for r in rows if r["event_kind"] == "realization" and r["donor_id"].endswith("d-10"))
    assert realized["donor_id"] == "'-d-10" and realized["request_id"] == "'+r-10"
    others = [c for r in rows if r is not evil[0] and r is not realized for c in r.values()]
    assert not any(c.startswith(("'", "=", "+", "-", "@")) for c in others)


@pytest.mark.parametrize(
    ("cell", "expected"),
    [("=1+1", "'=1+1"), ("+1", "'+1"), ("-1", "'-1"), ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "'\t=1"),
     ("\r=1", "'\r=1"), ("a=b", "a=b"), ("", ""), ("acme", "acme"), ("'=x", "'=x")],
)  # fmt: skip
def test_neutralize(cell: str, expected: str) -> None:
    """neutralize prefixes a cell with ' exactly when its first character starts a spreadsheet formula."""
    assert neutralize(cell) == expected


def test_help_documents_the_formula_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    """`audit show --help` lists the formats and CSV columns and says which cells get a leading '."""
    with pytest.raises(SystemExit) as e:
        main(["audit", "show", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "{table,csv,json,jsonl}" in text and "donor_tenant, donor_namespace" in text
    assert "starts with =, +, -, @" in text and "gets a leading '" in text and "formula" in text


def test_json_is_one_array_of_the_jsonl_objects(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format json: one array of the objects jsonl writes, one a line; `[]` when nothing matches."""
    jsonl = _run(capsys, "audit", "show", str(log), "--format", "jsonl").splitlines()
    out = _run(capsys, "audit", "show", str(log), "--format", "json")
    assert out == "[" + ",\n".join(jsonl) + "]\n"
    assert json.loads(out) == [json.loads(x) for x in jsonl]
    empty = _run(capsys, "audit", "show", str(log), "--format", "json", "--tenant", "nobody")
    assert empty == "[]\n" and json.loads(empty) == []


def test_jsonl_is_the_record_with_its_index_first(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format jsonl is unchanged: each record's JSON, compact, with its index as the first key."""
    lines = _run(capsys, "audit", "show", str(log), "--format", "jsonl").splitlines()
    expected = [json.dumps({"index": i, **json.loads(b)}, separators=(",", ":")) for i, b in
                enumerate(record_payloads(log))]  # fmt: skip
    assert lines == expected


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl", "table"])
def test_limit_applies_to_every_format(log: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    """--limit 3 lists the first three matches in every format."""
    out = _run(capsys, "audit", "show", str(log), "--format", fmt, "--limit", "3")
    n = {"csv": len(out.splitlines()) - 1, "json": len(json.loads(out) if fmt == "json" else []),
         "jsonl": len(out.splitlines()), "table": len(out.splitlines()) - 2}[fmt]  # fmt: skip
    assert n == 3


def _numbers(line: str, at: int) -> list[int]:
    return [int(x) for x in line[at:].split()]


def test_stats_by_tenant(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--by tenant: per tenant its live decisions, allows, denies and approved tokens; the total adds up."""
    live = _live(_jsonl(capsys, log))
    by_tenant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in live:
        by_tenant[r["tenant"]].append(r)
    expected = {t: _outcomes(recs) for t, recs in by_tenant.items()}
    out = _run(capsys, "audit", "stats", str(log), "--by", "tenant")
    rows, total = _table_rows(out, "tenant ")
    assert {x[:32].rstrip(): _numbers(x, 32) for x in rows} == expected
    assert total[:32].rstrip() == "total (3 tenants)"
    assert _numbers(total, 32) == [sum(c) for c in zip(*expected.values(), strict=True)]
    assert _numbers(total, 32)[0] == len(live) == 11
    assert out.splitlines()[-1] == "live decisions only: 2 shadow decisions and 6 engine events not counted"


def test_stats_by_namespace(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--by namespace: rows per namespace under each tenant, each tenant's subtotal the sum of its rows,
    and a grand total that is the sum of the subtotals; all equal to an independent count."""
    live = _live(_jsonl(capsys, log))
    out = _run(capsys, "audit", "stats", str(log), "--by", "namespace")
    rows, total = _table_rows(out, "tenant ")
    seen: dict[tuple[str, str], list[int]] = {}
    subtotals: dict[str, list[int]] = {}
    for x in rows:
        tenant, ns, nums = x[:24].rstrip(), x[24:56].rstrip(), _numbers(x, 56)
        if ns.startswith("(subtotal: "):
            mine = [v for (t, _), v in seen.items() if t == tenant]
            assert nums == [sum(c) for c in zip(*mine, strict=True)] and tenant not in subtotals
            subtotals[tenant] = nums
        else:
            assert tenant not in subtotals  # a tenant's namespaces all come before its subtotal
            seen[(tenant, ns)] = nums
    for (tenant, ns), nums in seen.items():
        assert nums == _outcomes([r for r in live if (r["tenant"], r["namespace"]) == (tenant, ns)])
    assert set(seen) == {(r["tenant"], r["namespace"]) for r in live}
    assert total[24:56].rstrip() == "(3 tenants, 5 namespaces)"
    assert _numbers(total, 56) == [sum(c) for c in zip(*subtotals.values(), strict=True)]
    assert _numbers(total, 56)[:3] == [11, 5, 6]


def test_stats_by_policy(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--by policy: per name@version (engine) and revision, allows, denies, and the first and last
    evaluated_at compared as times (not as strings); the total adds up."""
    live = _live(_jsonl(capsys, log))
    out = _run(capsys, "audit", "stats", str(log), "--by", "policy")
    rows, total = _table_rows(out, "policy ")
    got = {(x[:32].rstrip(), x[32:53].rstrip()): x[53:].split() for x in rows}
    expected = {}
    for key in {_policy_key(r) for r in live}:
        mine = [r for r in live if _policy_key(r) == key]
        times = sorted((r["evaluated_at"] for r in mine), key=_parse_time)
        _, allow, deny, _ = _outcomes(mine)
        expected[(key[0], key[1][:19])] = [str(allow), str(deny), times[0], times[-1]]
    assert got == expected
    review = next(v for k, v in got.items() if k[0] == "review@2 (yaml)")
    assert review[2:] == ["2026-11-29T10:00:00Z", "2026-11-29T10:00:00.500000Z"]  # logged the other way round
    assert total.startswith("total (2 policies, 3 revisions)")
    assert total[53:].split() == ["5", "6", "2026-11-29T10:00:00Z", "2026-12-06T00:00:00Z"]


def test_stats_by_gate(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--by gate: per gate its fails, errors and the denies it alone caused; totals and denies add up."""
    live = _live(_jsonl(capsys, log))
    fail, error, alone = Counter[str](), Counter[str](), Counter[str]()
    for r in live:
        for g in _failing(r):
            (fail if g["result"] == "fail" else error)[g["gate"]] += 1
        if r["decision"] == "deny" and len(_failing(r)) == 1:
            alone[_failing(r)[0]["gate"]] += 1
    out = _run(capsys, "audit", "stats", str(log), "--by", "gate")
    rows, total = _table_rows(out, "gate ")
    got = {x[:24].rstrip(): _numbers(x, 24) for x in rows}
    assert got == {g: [fail[g], error[g], alone[g]] for g in got}
    assert set(fail) | set(error) <= set(got)
    assert alone == {"similarity": 2, "provenance": 1, "expiry": 1} and error["token_verification"] == 2
    assert _numbers(total, 24) == [fail.total(), error.total(), alone.total()]
    denies, n = _outcomes(live)[2], alone.total()
    assert f"{denies} live denies: {n} by one gate alone, {denies - n} by several" in out


def test_stats_groupings_never_count_shadows_or_events(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With only shadow decisions and events selected, every grouping's total is zero."""
    for by, at in (("tenant", 32), ("namespace", 56), ("gate", 24)):
        out = _run(capsys, "audit", "stats", str(log), "--by", by, "--shadow", "only")
        assert set(_numbers(_table_rows(out, f"{by if by != 'namespace' else 'tenant'} ")[1], at)) == {0}
        assert out.splitlines()[-1] == "live decisions only: 2 shadow decisions not counted"


def test_stats_by_day_is_unchanged_by_the_groupings(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--by day (the default) prints the gate, token and time tables; a grouping prints its table instead."""
    day = _run(capsys, "audit", "stats", str(log))
    assert day == _run(capsys, "audit", "stats", str(log), "--by", "day")
    tenant = _run(capsys, "audit", "stats", str(log), "--by", "tenant")
    head = day.split("\n\n")[0]
    assert tenant.startswith(head + "\n\n") and "approved tokens" in day.split("\n\n")[2]
    assert [x.split() for x in day.splitlines()[-3:]] == [
        ["day", "allow", "deny", "events", "shadow"],
        ["2026-11-29", "5", "5", "6", "2"],
        ["2026-12-06", "0", "1", "0", "0"],
    ]


V3 = {
    "schema": "semgov.decision/v3",
    "decision": "allow",
    "decision_id": "x1",
    "evaluated_at": "2026-11-29T10:00:00Z",
    "tenant": "acme",
    "namespace": "research/a",
    "request_id": "r-1",
    "donor_id": "d-1",
    "donor_tenant": "globex",
    "donor_namespace": "@shared",
    "cross_boundary": [
        {"boundary": "tenant", "rule": "globex-shares"},
        {"boundary": "namespace", "rule": "s/*"},
    ],
    "policy": {"name": "default", "version": "1", "revision": "sha256:ab", "engine": "yaml"},
    "approved_tokens": 7,
    "recipient_tokens": 9,
    "gates": [{"gate": "tenant", "result": "pass"}, {"gate": "namespace", "result": "pass"}],
}


def test_csv_row_of_a_v3_record_names_the_donor_scope() -> None:
    """A v3 decision's donor tenant, donor namespace and cross-boundary rules fill their CSV cells."""
    row = dict(zip(CSV_COLUMNS, csv_row(4, V3), strict=True))
    assert [row[k] for k in ("index", "kind", "decision")] == ["4", "decision", "allow"]
    assert (row["policy"], row["policy_revision"]) == ("default@1", "sha256:ab")
    assert (row["donor_tenant"], row["donor_namespace"]) == ("globex", "'@shared")
    assert row["cross_boundary"] == "tenant:globex-shares;namespace:s/*"
    assert (row["approved_tokens"], row["recipient_tokens"], row["failed_gates"]) == ("7", "9", "")


def test_csv_row_of_older_records_leaves_v3_cells_empty() -> None:
    """A v2 decision and a shadow decision have no donor scope: those cells are empty."""
    v2 = {k: v for k, v in V3.items() if k not in ("donor_tenant", "donor_namespace", "cross_boundary")}
    for rec in ({**v2, "schema": "semgov.decision/v2"}, {**v2, "schema": "semgov.shadow_decision/v1"}):
        row = dict(zip(CSV_COLUMNS, csv_row(0, rec), strict=True))
        assert (row["donor_tenant"], row["donor_namespace"], row["cross_boundary"]) == ("", "", "")


def test_csv_row_survives_wrong_types() -> None:
    """Fields of the wrong type (an unverified log) give empty or JSON-text cells, never an error."""
    odd = {"schema": "semgov.decision/v3", "donor_tenant": 5, "cross_boundary": [5, {"boundary": 1}],
           "gates": 5, "approved_tokens": float("inf"), "recipient_tokens": True, "policy": [],
           "tenant": ["=x"]}  # fmt: skip
    row = dict(zip(CSV_COLUMNS, csv_row(0, odd), strict=True))
    assert (row["donor_tenant"], row["cross_boundary"], row["failed_gates"]) == ("5", "1:", "")
    assert (row["approved_tokens"], row["recipient_tokens"], row["policy"]) == ("", "", "")
    assert row["tenant"] == '["=x"]'
    row = dict(zip(CSV_COLUMNS, csv_row(0, {**odd, "cross_boundary": "x"}), strict=True))
    assert row["cross_boundary"] == ""


def test_show_csv_of_a_v3_record_in_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`show --format csv` reads a v3 decision from a log and prints its donor scope and rules."""
    d = tmp_path / "log"
    with AuditLog.open(d, signing_key=KEY, origin="semgov/test") as w:
        w.append(json.dumps(V3).encode())
    [row] = list(csv.DictReader(io.StringIO(_run(capsys, "audit", "show", str(d), "--format", "csv"))))
    assert (row["donor_tenant"], row["donor_namespace"]) == ("globex", "'@shared")
    assert row["cross_boundary"] == "tenant:globex-shares;namespace:s/*"


def test_hostile_records_in_every_format_and_grouping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Odd-typed records print in every show format and every stats grouping without an error."""
    d = tmp_path / "log"
    odd = b'{"approved_tokens":1e400,"decision":"deny","gates":[5,{"gate":7}],"policy":[],'
    odd += b'"schema":"semgov.decision/v1"}'
    event = b'{"kind":"realization","materialized_tokens":"8","schema":"semgov.engine_event/v1"}'
    with AuditLog.open(d, signing_key=KEY, origin="semgov/test") as w:
        w.append(odd)
        w.append(event)
    for fmt in ("table", "csv", "json"):
        assert main(["audit", "show", str(d), "--format", fmt]) == 0
    for by in ("tenant", "namespace", "policy", "gate"):
        assert main(["audit", "stats", str(d), "--by", by]) == 0
    out = capsys.readouterr().out
    assert "1 live deny: 1 by one gate alone, 0 by several" in out  # the gate named 7, as "7"


def test_groups_count_errors_and_denies_without_a_failing_gate() -> None:
    """group() counts gate errors, a deny no gate explains apart, and skips shadows and events."""
    deny = {"schema": "semgov.decision/v2", "decision": "deny", "tenant": "a", "namespace": "n",
            "gates": [{"gate": "pii", "result": "error"}, {"gate": "pii", "result": "fail"}]}  # fmt: skip
    bare = {**deny, "gates": []}
    shadow = {**deny, "schema": "semgov.shadow_decision/v1"}
    event = {"schema": "semgov.engine_event/v2", "kind": "canary"}
    g = group([deny, bare, shadow, event])
    assert (g.gates["pii"].fail, g.gates["pii"].error, g.gates["pii"].sole_deny) == (1, 1, 1)
    assert (g.denies, g.denies_without_gate, g.skipped) == (2, 1, {"shadow": 1, "event": 1})
    assert (g.total().candidates, g.total().deny, g.policy_total().deny) == (2, 2, 2)


def test_stats_json_equals_the_records(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`stats --format json` counts what `show` lists: decisions, per-tenant outcomes, gate failures."""
    recs = _jsonl(capsys, log)
    live = _live(recs)
    doc = json.loads(_run(capsys, "audit", "stats", str(log), "--format", "json"))
    assert doc["records"] == len(recs)
    assert sum(doc["decisions"].values()) == len(live)
    fails = sum(1 for r in live for g in r["gates"] if g["result"] == "fail")
    assert sum(g["fail"] for g in doc["gates"].values()) == fails
    assert sum(doc["over_time"][p].get("allow", 0) for p in doc["over_time"]) == doc["decisions"].get(
        "allow", 0
    )
    by_tenant = json.loads(_run(capsys, "audit", "stats", str(log), "--by", "tenant", "--format", "json"))
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in live:
        per[r["tenant"]].append(r)
    got = {
        g["tenant"]: [g["candidates"], g["allow"], g["deny"], g["approved_tokens"]]
        for g in by_tenant["groups"]
    }
    assert got == {t: _outcomes(rs) for t, rs in per.items()}


def test_a_bad_flag_shows_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown flag of `audit stats` is reported with `audit stats`' usage, exit 2."""
    with pytest.raises(SystemExit) as e:
        main(["audit", "stats", "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: semgov audit stats") and "unrecognized arguments: --bogus" in err
