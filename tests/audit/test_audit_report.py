"""`semgov audit report` (issue 18): every figure on the page equals an independent count over
`semgov audit show --format jsonl`, on a generated log and on the example workload's; a tampered
log's report opens with the first bad record; the page renders in a real browser (headless
Chromium), whose rendered numbers and search box are checked, and a screenshot saved."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator
from semgov.audit.frames import FRAME_HEADER, LOG_FILE
from semgov.cli.main import main
from semgov.signing.engine_events import engine_event, sign_engine_event
from semgov.signing.shadow import shadow_record
from tests.audit_fixtures import AT, KEY, PUB_PEM, realization, reframe, split_frames, write_log
from tests.conftest import candidate, parse, policy_with, request

ROOT = Path(__file__).resolve().parents[2]
SHARING = "namespace: {sharing: [{donor: legal/*, recipients: ['research/*']}]}"
# (tenant, namespace, donor namespace, similarity, realized?)
CASES = [
    ("acme", "research/a", None, 0.9, True),
    ("acme", "research/a", None, 0.9, False),
    ("acme", "research/b", "legal/x", 0.9, True),  # allowed across namespaces by the sharing rule
    ("acme", "research/b", "ops/y", 0.9, False),  # another namespace, no rule: denied
    ("acme", "research/a", None, 0.2, False),  # similarity too low
    ("globex", "research/c", None, 0.9, True),
    ("globex", "research/c", "legal/z", 0.9, False),
    ("globex", "research/c", None, 0.1, False),
]


def _records(keys: Any) -> list[bytes]:
    """Real signed decisions (two policies), realizations, a shadow, and engine events."""
    live = Evaluator(policy_with(SHARING), keys.keyring, KEY)
    strict = Evaluator(policy_with(SHARING + "\nsimilarity: {min: 0.95}"), keys.keyring, KEY)
    out: list[bytes] = []
    for i, (tenant, ns, dns, sim, realized) in enumerate(CASES):
        cand = candidate(keys, f"d-{i}", similarity=sim, tenant=tenant, namespace=dns or ns)
        req = parse(request([cand], request_id=f"r-{i}", tenant=tenant, namespace=ns))
        [d] = live.evaluate(req)
        out.append(d.canonical)
        if realized:
            assert d.decision == "allow"
            out.append(realization(d.canonical, KEY))
        if i == 0:
            [sh] = strict.evaluate(req)
            out.append(shadow_record(sh, d, KEY).canonical)
    events = [
        engine_event("realization_failed", engine="sglang 0.5.23", at=AT, request_id="r-1",
                     decision_id=json.loads(out[2])["decision_id"], detail="RuntimeError: donor evicted"),
        engine_event("invariant_violation", engine="sglang 0.5.23", at=AT, request_id="r-1", detail="pool"),
        engine_event("reuse_disabled", engine="sglang 0.5.23", at=AT, detail="after on_release: pool"),
        engine_event("policy_loaded", engine="sglang 0.5.23", at=AT, detail="live default@1 revision abc"),
    ]  # fmt: skip
    return [*out, *(sign_engine_event(e, KEY).canonical for e in events)]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    d = tmp_path_factory.mktemp("report") / "log"
    write_log(d, _records(keys))
    return d


class _Figures(HTMLParser):
    """``data-k`` -> the element's text (or its ``data-v``), and the rows left visible."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, str] = {}
        self.rows: list[tuple[str, bool]] = []  # (data-ids, hidden)
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-ids") is not None:
            self.rows.append((a["data-ids"] or "", "hidden" in a))
        key = a.get("data-k")
        if key is not None and a.get("data-v") is not None:
            self.figures[key] = a["data-v"] or ""
        elif key is not None:
            self._open.append(key)
            self.figures[key] = ""

    def handle_data(self, data: str) -> None:
        if self._open:
            self.figures[self._open[-1]] += data

    def handle_endtag(self, tag: str) -> None:
        if self._open and tag in ("td", "b", "span"):
            self._open.pop()


def figures(html: str) -> _Figures:
    p = _Figures()
    p.feed(html)
    return p


def _num(f: dict[str, str], key: str) -> int:
    return int(f[key].replace(",", ""))


def _jsonl(log: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The independent source: every record as `semgov audit show --format jsonl` lists it."""
    assert main(["audit", "show", str(log), "--format", "jsonl"]) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def expected(recs: list[dict[str, Any]]) -> dict[str, int]:
    """The page's figures, counted straight from the records."""
    out: Counter[str] = Counter()
    live = [r for r in recs if str(r["schema"]).startswith("semgov.decision/")]
    scope_of = {r["decision_id"]: (r["tenant"], r["namespace"]) for r in live}
    for r in live:
        t, ns, allow = r["tenant"], r["namespace"], r["decision"] == "allow"
        for key in (f"ns:{t}/{ns}", f"tenant:{t}", "total"):
            out[f"{key}:candidates"] += 1
            out[f"{key}:allows"] += allow
            out[f"{key}:denies"] += not allow
            out[f"{key}:approved_tokens"] += r["approved_tokens"]
            out[f"{key}:cross_boundary"] += allow and bool(r.get("cross_boundary"))
        out[f"day:{r['evaluated_at'][:10]}:{r['decision']}"] += 1
        for g in r["gates"]:
            if g["result"] != "pass":
                out[f"gate:{g['gate']}:{g['result']}"] += 1
        p = r["policy"]
        out[f"policy:{p['name']}@{p['version']}:{p['revision']}:{'allows' if allow else 'denies'}"] += 1
    for r in recs:
        if str(r["schema"]).startswith("semgov.engine_event/"):
            out[f"event:{r['kind']}"] += 1
            out[f"day:{r['at'][:10]}:event"] += 1
            if r["kind"] == "realization":
                t, ns = scope_of[r["decision_id"]]
                for key in (f"ns:{t}/{ns}", f"tenant:{t}", "total"):
                    out[f"{key}:realizations"] += 1
                    out[f"{key}:realized_tokens"] += r["materialized_tokens"]
        elif str(r["schema"]).startswith("semgov.shadow_decision/"):
            out[f"day:{r['evaluated_at'][:10]}:shadow"] += 1
    out["kpi:records"] = len(recs)
    out["kpi:decisions"] = len(live)
    out["kpi:allows"] = sum(r["decision"] == "allow" for r in live)
    out["kpi:denies"] = len(live) - out["kpi:allows"]
    out["kpi:saved"] = out["total:realized_tokens"]
    out["cross:total"] = out["kpi:cross"] = out["total:cross_boundary"]
    out["kpi:shadow"] = sum(str(r["schema"]).startswith("semgov.shadow_decision/") for r in recs)
    return dict(out)


def _report(log: Path, out: Path, *extra: str) -> int:
    return main(["audit", "report", str(log), "--out", str(out), "--pubkey", PUB_PEM, *extra])


def _check_figures(got: dict[str, str], want: dict[str, int]) -> None:
    """Every figure counted from the records is on the page with that value, and every figure the
    page shows that the count knows of agrees (a zero the count never saw is a zero)."""
    for key, value in want.items():
        assert key in got, f"{key} missing from the page"
        assert _num(got, key) == value, f"{key}: page {got[key]}, log {value}"
    for key in got:
        if key.split(":")[0] in ("ns", "tenant", "total", "day", "gate", "event", "kpi"):
            assert _num(got, key) == want.get(key, 0), key


def test_every_figure_equals_an_independent_count(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report of a log with allows across a namespace boundary, realizations, failures, a
    violation, reuse turned off, a policy reload and a shadow: each figure equals the count over
    `audit show --format jsonl`; the cross-boundary reuse is listed with its rule."""
    recs = _jsonl(log, capsys)
    out = tmp_path / "report.html"
    assert _report(log, out) == 0
    assert capsys.readouterr().out.startswith("VERIFIED: every record")
    html = out.read_text()
    page = figures(html)
    want = expected(recs)
    assert want["total:cross_boundary"] == 2 and want["total:realizations"] == 3
    _check_figures(page.figures, want)
    assert page.figures["verdict"] == "verified"
    assert "namespace: shared by namespace.sharing[0]" in html and "legal/x" in html
    assert _num(page.figures, "failure:RuntimeError") == 1 and _num(page.figures, "cross:denied") == 1
    assert "<script src" not in html and "http://" not in html and "https://" not in html
    links = re.findall(r'href="#(r\d+)"', html)
    assert len(links) >= 4 and all(f'id="{a}"' in html for a in links)  # engine events link to their rows
    violation = next(r["index"] for r in recs if r.get("kind") == "invariant_violation")
    assert f'<a href="#r{violation}">invariant_violation</a>' in html


def test_a_tenant_report_counts_that_tenant_only(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--tenant keeps that tenant's decisions and the realizations of its allows."""
    recs = _jsonl(log, capsys)
    mine = [r for r in recs if r.get("tenant") == "globex"]
    ids = {r["decision_id"] for r in mine}
    mine += [r for r in recs if r.get("kind") == "realization" and r["decision_id"] in ids]
    out = tmp_path / "globex.html"
    assert _report(log, out, "--tenant", "globex") == 0
    page = figures(out.read_text()).figures
    want = expected(mine)
    for key in ("total:candidates", "total:allows", "total:realized_tokens", "tenant:globex:denies"):
        assert _num(page, key) == want[key], key
    assert "tenant:acme:candidates" not in page


def test_a_tampered_log_opens_with_the_first_bad_record(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Record 3 altered and re-framed (its frame hash made to match, as anyone with write access
    can): the report is written, exits 1, and its first line (the command's and the page's) says it
    does not verify and names record 3."""
    bad = tmp_path / "bad"
    shutil.copytree(log, bad)
    frames = split_frames((bad / LOG_FILE).read_bytes())
    pos = next(n for n, (index, _) in enumerate(frames) if index == 3)
    record = frames[pos][1][FRAME_HEADER.size :]
    assert b'"tenant":"acme"' in record
    frames[pos] = (3, reframe(3, record.replace(b'"tenant":"acme"', b'"tenant":"acmf"')))
    (bad / LOG_FILE).write_bytes(b"".join(f for _, f in frames))
    out = tmp_path / "bad.html"
    assert _report(bad, out) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("DOES NOT VERIFY: record 3:"), first
    html = out.read_text()
    body = html[html.index("<body>") + len("<body>") :]
    assert (
        body.startswith('<p id="verdict" class="verdict failed"')
        and "DOES NOT VERIFY: record 3:" in body[:400]
    )


def test_without_a_key_the_report_is_marked_unverified(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --pubkey or --keyring: the page says UNVERIFIED and the exit status is 3 (as audit verify)."""
    out = tmp_path / "r.html"
    assert main(["audit", "report", str(log), "--out", str(out)]) == 3
    assert capsys.readouterr().out.startswith("UNVERIFIED")
    assert figures(out.read_text()).figures["verdict"] == "unverified"


def test_the_example_workloads_report_equals_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the example workload's audit log (`semgov check` of examples/captured.jsonl.gz), every
    figure of the report equals the count over `audit show --format jsonl`."""
    audit = tmp_path / "example-log"
    ex = ROOT / "examples"
    assert main(["check", str(ex / "captured.jsonl.gz"), "--policy", str(ROOT / "policies" / "default"),
                 "--trust", str(ex / "keyring.json"), "--signing-key",
                 str(ex / "keys" / "decision-signing-key.pem"), "--audit", str(audit)]) == 0  # fmt: skip
    capsys.readouterr()
    recs = _jsonl(audit, capsys)
    out = tmp_path / "example.html"
    pub = str(ex / "keys" / "decision-signing-key.pub.pem")
    assert main(["audit", "report", str(audit), "--out", str(out), "--pubkey", pub]) == 0
    want = expected(recs)
    assert want["kpi:decisions"] == 3646
    _check_figures(figures(out.read_text()).figures, want)


# ---- a real browser --------------------------------------------------------------------


def _chromium() -> str:
    """The headless browser; CI installs Debian's chromium (.ci/run), so there it must be present."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium package)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", "--hide-scrollbars", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def test_a_real_browser_renders_the_figures_and_the_search(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Headless Chromium loads the report (no network): the rendered page's figures equal the
    counts over the log; searching a decision id (``#q=``) leaves exactly its rows visible; a
    screenshot is saved."""
    recs = _jsonl(log, capsys)
    out = tmp_path / "report.html"
    assert _report(log, out) == 0
    url = out.resolve().as_uri()
    rendered = figures(_browser("--dump-dom", url).stdout)
    _check_figures(rendered.figures, expected(recs))
    target = next(r for r in recs if r.get("decision") == "allow" and r.get("cross_boundary"))["decision_id"]
    searched = figures(_browser("--dump-dom", f"{url}#q={target}").stdout)
    visible = [ids for ids, hidden in searched.rows if not hidden]
    assert visible and all(target in ids for ids in visible)
    assert sum(target in ids for ids, _ in searched.rows) == len(visible)
    assert int(searched.figures["search:matches"]) == len(visible)
    shot = tmp_path / "report.png"
    _browser("--window-size=1280,1800", f"--screenshot={shot}", url)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_no_table_cell_wraps_in_a_1400_px_window(log: Path, tmp_path: Path) -> None:
    """At 1,400 px no cell breaks inside a word or number (wide tables scroll); gates in decision order."""
    out = tmp_path / "report.html"
    assert _report(log, out) == 0
    dom = _browser("--window-size=1400,1800", "--dump-dom", out.resolve().as_uri()).stdout
    wrapped = re.search(r'data-wrapped-cells="(\d+)"', dom)
    assert wrapped is not None and wrapped.group(1) == "0", wrapped
    from semgov.wire.models import GATES

    shown = re.findall(r'data-k="gate:([a-z_]+):fail"', out.read_text())
    assert shown and shown == [g for g in GATES if g in shown]
    assert "<dt><b>seal</b></dt>" in out.read_text() and "<dt><b>anchored</b></dt>" in out.read_text()


def test_client_strings_are_escaped(keys: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tenant, namespace and request id that are HTML (clients choose them) appear as text, never
    as markup: the page holds no element or attribute they could inject."""
    evil = '<img src=x onerror="alert(1)">'
    ev = Evaluator(policy_with(SHARING), keys.keyring, KEY)
    cand = candidate(keys, "d-x", tenant=evil, namespace="research/<b>x</b>")
    [d] = ev.evaluate(
        parse(request([cand], request_id=f"r-{evil}", tenant=evil, namespace="research/<b>x</b>"))
    )
    log = tmp_path / "log"
    write_log(log, [d.canonical])
    out = tmp_path / "r.html"
    assert _report(log, out) == 0
    html = out.read_text()
    assert (
        evil not in html
        and "<b>x</b>" not in html
        and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    )
    page = figures(html)
    assert _num(page.figures, f"tenant:{evil}:candidates") == 1
