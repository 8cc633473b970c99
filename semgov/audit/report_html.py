"""The audit report as one self-contained HTML page (``semgov audit report``).

No network: inline CSS, inline SVG charts drawn here, and a few lines of inline script for the
search box (it filters the listed rows by request or decision id; ``#q=<text>`` in the address
searches on load). Every string from the log is HTML-escaped. Each figure carries a ``data-k``
attribute naming what it counts, so a test (or a reviewer's script) can read the page back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

from semgov.audit.summary import MAX_CROSS_ROWS, MAX_EVENT_ROWS, Row, ScopeRow, Summary
from semgov.wire.models import GATES


@dataclass(frozen=True)
class Verdict:
    """The verification verdict the page opens with."""

    status: str  # "verified" | "unverified" | "failed"
    headline: str  # the page's first line
    details: tuple[str, ...]  # keys, checkpoints, anchoring, notes, other problems


CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;
  color:#1d2430;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:0 24px 48px}
.verdict{padding:14px 24px;font-weight:600;font-size:16px;margin:0}
.verified{background:#dff3e4;color:#12512a}.unverified{background:#fff4d6;color:#6b4d00}
.failed{background:#fbe0e0;color:#8a1414}
h1{font-size:22px;margin:20px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d5d9e0}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0}
th,td{border:1px solid #e1e4ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600;white-space:nowrap}td{white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}td.w{white-space:normal;overflow-wrap:anywhere;min-width:16em}
.scroll{overflow-x:auto}
tr.sub td{background:#f3f5f8;font-weight:600}tr.total td{background:#e6eaf0;font-weight:700}
.muted{color:#5b6575}.kpis{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.kpi{background:#fff;border:1px solid #e1e4ea;padding:8px 14px;min-width:120px}
.kpi b{display:block;font-size:20px}code{font-size:12px}
#q{width:420px;padding:6px;font-size:14px}svg{background:#fff;border:1px solid #e1e4ea}
"""

SCRIPT = """
(function(){
  var box=document.getElementById('q');
  function apply(){
    var q=box.value.trim().toLowerCase(), shown=0;
    document.querySelectorAll('tr[data-ids]').forEach(function(tr){
      var hit=!q||tr.getAttribute('data-ids').indexOf(q)>=0;
      tr.hidden=!hit; if(hit&&q)shown++;
    });
    var out=document.getElementById('qn');
    out.textContent=!q?'':shown?(shown+' listed row(s) match; a record not listed here: '
      +'semgov audit show DIR --request ID or --decision-id ID'):('No listed row matches. The tables '
      +'list only the most recent decisions and notable events: for any record use '
      +'semgov audit show DIR --request ID or --decision-id ID');
    out.setAttribute('data-k','search:matches'); out.setAttribute('data-v',String(shown));
  }
  box.addEventListener('input',apply);
  // How many table cells break over more than one line at this window size (a layout check the
  // tests read back; 0 on a 1,400-px window).
  var wrapped=0;
  document.querySelectorAll('td:not(.w),th').forEach(function(c){
    var r=document.createRange(); r.selectNodeContents(c);
    var tops={}, n=0, rects=r.getClientRects();
    for(var i=0;i<rects.length;i++){var t=Math.round(rects[i].top); if(!tops[t]){tops[t]=1;n++;}}
    if(n>1)wrapped++;
  });
  document.body.setAttribute('data-wrapped-cells',String(wrapped));
  var m=location.hash.match(/^#q=(.*)$/); if(m){box.value=decodeURIComponent(m[1]);apply();}
})();
"""


def _n(value: int, key: str) -> str:
    return f'<td class="n" data-k="{escape(key)}">{value:,}</td>'


def _t(text: str) -> str:
    return f"<td>{escape(text)}</td>"


def _table(head: Sequence[str], rows: Iterable[str]) -> str:
    """A table that scrolls sideways when too wide: cells never break inside a word or number."""
    cols = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(rows)
    return f'<div class="scroll"><table><thead><tr>{cols}</tr></thead><tbody>{body}</tbody></table></div>'


def _ids(row: Row) -> str:
    return escape(f"{row.request_id} {row.decision_id}".lower())


def _row_tr(row: Row, extra: str = "") -> str:
    return (
        f'<tr id="r{row.index}" data-ids="{_ids(row)}"><td class="n">{row.index}</td>'
        f"{_t(row.at)}{_t(row.kind)}"
        f"{_t(row.tenant)}{_t(row.namespace)}{_t(row.request_id)}<td><code>{escape(row.decision_id)}</code></td>"
        f'{_t(row.donor_id)}{extra}<td class="w">{escape(row.detail)}</td></tr>'
    )


ROW_HEAD = ("#", "at", "kind", "tenant", "namespace", "request", "decision id", "donor")


def _timeline_svg(s: Summary) -> str:
    days = sorted(s.timeline)[-90:]
    if not days:
        return '<p class="muted">No records in range.</p>'
    w, h, pad = 1120, 180, 30
    top = max((s.timeline[d]["allow"] + s.timeline[d]["deny"]) for d in days) or 1
    bw = max(2.0, (w - 2 * pad) / len(days) - 2)
    bars = []
    for i, d in enumerate(days):
        x = pad + i * (w - 2 * pad) / len(days)
        a, dn = s.timeline[d]["allow"], s.timeline[d]["deny"]
        ha, hd = (h - 2 * pad) * a / top, (h - 2 * pad) * dn / top
        bars.append(
            f'<rect x="{x:.1f}" y="{h - pad - ha:.1f}" width="{bw:.1f}" height="{ha:.1f}" fill="#2f9e57">'
            f"<title>{escape(d)}: {a} allow</title></rect>"
            f'<rect x="{x:.1f}" y="{h - pad - ha - hd:.1f}" width="{bw:.1f}" height="{hd:.1f}" '
            'fill="#d9534f">'
            f"<title>{escape(d)}: {dn} deny</title></rect>"
        )
    labels = f'<text x="{pad}" y="{h - 8}" font-size="11">{escape(days[0])}</text>'
    labels += f'<text x="{w - pad}" y="{h - 8}" font-size="11" text-anchor="end">{escape(days[-1])}</text>'
    labels += (
        f'<text x="{pad}" y="14" font-size="11">max {top:,} decisions/day (green allow, red deny)</text>'
    )
    svg = f'<svg width="{w}" height="{h}" role="img" aria-label="decisions per day">'
    return f"{svg}{''.join(bars)}{labels}</svg>"


def _timeline(s: Summary) -> str:
    rows = [
        f"<tr>{_t(d)}{_n(c['allow'], f'day:{d}:allow')}{_n(c['deny'], f'day:{d}:deny')}"
        f"{_n(c['shadow'], f'day:{d}:shadow')}{_n(c['event'], f'day:{d}:event')}</tr>"
        for d, c in sorted(s.timeline.items())
    ]
    table = _table(("day", "allow", "deny", "shadow", "engine events"), rows)
    return f"{_timeline_svg(s)}<details><summary>per day ({len(rows)})</summary>{table}</details>"


def _gates(s: Summary) -> str:
    present = {g for g, _ in s.deny_gates}
    # NOTE: the gates in decision order, as the CLI lists them; a name no gate has (an old log) last
    gates = [g for g in GATES if g in present] + sorted(present - set(GATES))
    top = max(s.deny_gates.values(), default=1)
    rows = []
    for g in gates:
        fail, err = s.deny_gates[(g, "fail")], s.deny_gates[(g, "error")]
        width = 300 * (fail + err) / top
        bar = f'<svg width="300" height="14"><rect width="{width:.1f}" height="14" fill="#d9534f"/></svg>'
        rows.append(f"<tr>{_t(g)}{_n(fail, f'gate:{g}:fail')}{_n(err, f'gate:{g}:error')}<td>{bar}</td></tr>")
    if not rows:
        return '<p class="muted">No denied candidate.</p>'
    return _table(("gate", "fail", "error", ""), rows)


def _scope_cells(r: ScopeRow, key: str) -> str:
    return (
        _n(r.candidates, f"{key}:candidates")
        + _n(r.allows, f"{key}:allows")
        + _n(r.denies, f"{key}:denies")
        + _n(r.approved_tokens, f"{key}:approved_tokens")
        + _n(r.realizations, f"{key}:realizations")
        + _n(r.realized_tokens, f"{key}:realized_tokens")
        + _n(r.cross_boundary, f"{key}:cross_boundary")
    )


def _scopes(s: Summary) -> str:
    tenants = s.tenants()
    head = ("candidates", "allows", "denies", "approved tokens", "realizations", "prefill tokens saved",
            "cross-boundary allows")  # fmt: skip
    rows = [f"<tr>{_t(t)}{_scope_cells(tenants[t], f'tenant:{t}')}</tr>" for t in sorted(tenants)]
    rows.append(f'<tr class="total">{_t("all tenants")}{_scope_cells(s.totals(), "total")}</tr>')
    detail = [
        f"<tr>{_t(t)}{_t(ns)}{_scope_cells(r, f'ns:{t}/{ns}')}</tr>"
        for (t, ns), r in sorted(s.scopes.items())
    ]
    note = (
        '<p class="muted">Prefill tokens saved: tokens whose K/V an engine copied from an approved donor '
        "instead of computing them (realization events); approved tokens are what the policy allowed. "
        "A log replayed by <code>semgov check</code> has no realizations.</p>"
    )
    per_ns = _table(("tenant", "namespace", *head), detail)
    return (
        _table(("tenant", *head), rows)
        + f"<details><summary>per namespace ({len(detail)})</summary>{per_ns}</details>"
        + note
    )


def _cross(s: Summary) -> str:
    intro = (
        f'<p><b data-k="cross:total">{s.cross_total:,}</b> allowed reuse(s) of a donor from another '
        "tenant or "
        f'namespace; <span data-k="cross:denied">{s.cross_denied:,}</span> such candidate(s) denied. Records '
        "older than <code>semgov.decision/v3</code> do not name the donor's scope and are not counted.</p>"
    )
    rows = [_row_tr(row, _t(dt) + _t(dns) + _t(policy)) for row, dt, dns, policy in s.cross_rows]
    more = (
        f'<p class="muted">First {MAX_CROSS_ROWS:,} listed; all: '
        "<code>semgov audit show DIR --format jsonl</code> "
        "and select cross_boundary.</p>"
        if s.cross_total > len(s.cross_rows)
        else ""
    )
    head = (*ROW_HEAD, "donor tenant", "donor namespace", "policy", "rule that allowed it")
    return intro + (_table(head, rows) if rows else "") + more


def _policies(s: Summary) -> str:
    rows = [
        f"<tr>{_t(p.name)}<td><code>{escape(p.revision)}</code></td>{_t(p.engine)}{_t(p.first)}{_t(p.last)}"
        f"{_n(p.allows, f'policy:{p.name}:{p.revision}:allows')}"
        f"{_n(p.denies, f'policy:{p.name}:{p.revision}:denies')}</tr>"
        for p in sorted(s.policies.values(), key=lambda p: (p.first, p.name))
    ]
    out = _table(
        ("policy", "revision", "engine", "first decision", "last decision", "allows", "denies"), rows
    )
    if s.policy_events:
        out += "<h3>Policy reloads</h3>" + _table(
            (*ROW_HEAD, "detail"), (_row_tr(r) for r in s.policy_events)
        )
    return out


def _linked(text: str, index: int | None) -> str:
    """A cell linking to the listed record ``index`` (its row's anchor), or plain text."""
    if index is None:
        return _t(text)
    return (
        f'<td><a href="#r{index}">{escape(text)}</a> <span class="muted">(first: record {index})</span></td>'
    )


def _events(s: Summary) -> str:
    first: dict[str, int] = {}
    for r in [*s.event_rows, *s.policy_events]:
        first.setdefault(r.kind, r.index)
    kinds = [f"<tr>{_linked(k, first.get(k))}{_n(v, f'event:{k}')}</tr>" for k, v in sorted(s.events.items())]
    out = _table(("engine event", "count"), kinds) if kinds else '<p class="muted">No engine event.</p>'
    if s.not_realized:
        out += "<h3>Allows not realized, by reason</h3>" + _table(
            ("reason", "count"),
            (f"<tr>{_t(k)}{_n(v, f'not_realized:{k}')}</tr>" for k, v in s.not_realized.most_common()),
        )
    if s.failures:
        out += "<h3>Realization failures without a reason code, by detail</h3>" + _table(
            ("reason", "count"),
            (f"<tr>{_t(k)}{_n(v, f'failure:{k}')}</tr>" for k, v in s.failures.most_common()),
        )
    if s.event_rows:
        out += f"<h3>Failures, violations and reuse turned off (first {MAX_EVENT_ROWS:,})</h3>" + _table(
            (*ROW_HEAD, "detail"), (_row_tr(r) for r in s.event_rows)
        )
    return out


def _kpis(s: Summary, title_scope: str) -> str:
    t = s.totals()
    items = [
        ("records", s.records, "records"),
        ("live decisions", s.decisions, "decisions"),
        ("allows", t.allows, "allows"),
        ("denies", t.denies, "denies"),
        ("prefill tokens saved", t.realized_tokens, "saved"),
        ("cross-boundary allows", s.cross_total, "cross"),
        ("shadow decisions", s.shadow["allow"] + s.shadow["deny"], "shadow"),
    ]
    cells = "".join(
        f'<div class="kpi"><b data-k="kpi:{k}">{v:,}</b>{escape(label)}</div>' for label, v, k in items
    )
    period = f"{escape(s.first_at)} to {escape(s.last_at)}" if s.first_at else "no records"
    return f'<p class="muted">{escape(title_scope)}; {period}</p><div class="kpis">{cells}</div>'


GLOSSARY = (
    ("record", "one line of the log: a signed decision record, shadow decision record or engine event"),
    ("seal", "the writer's signature over the Merkle tree root after a batch of records, written "
     "into the log with the batch; only a holder of the writer's key can make one, so records "
     "after the last valid seal were never acknowledged"),
    ("checkpoint", "a signed note (C2SP signed-note format) naming the log's origin, its size and "
     "its tree root; the latest is the file checkpoint, older ones are kept in checkpoints/"),
    ("anchored", "covered by a seal or checkpoint signed by a trusted key: removing or changing an "
     "anchored record breaks a signature; records past the last anchor are not yet protected"),
    ("consistency proof", "the hashes that show an earlier checkpoint's tree is a prefix of the "
     "latest one (nothing was rewritten in between); an N-hash proof has N such hashes, and a "
     "checkpoint of the same size needs none"),
    ("cross-boundary allow", "an allowed reuse whose donor belonged to another tenant or namespace "
     "(a sharing rule of the policy, or a defect)"),
    ("shadow decision", "the decision a candidate policy would have made, recorded beside the live "
     "one and never acted on"),
    ("prefill tokens saved", "tokens whose K/V was copied from a donor instead of computed"),
)  # fmt: skip


def _glossary() -> str:
    return "<dl>" + "".join(f"<dt><b>{escape(t)}</b></dt><dd>{escape(d)}</dd>" for t, d in GLOSSARY) + "</dl>"


def render(s: Summary, verdict: Verdict, *, title_scope: str, generated_at: str) -> str:
    """The whole page."""
    notes = [*verdict.details]
    if s.untyped:
        notes.append(f"{s.untyped:,} record(s) of no known schema were not counted (an unverified log?)")
    details = "".join(f"<li>{escape(d)}</li>" for d in notes)
    recent = _table((*ROW_HEAD, "failed gates"), (_row_tr(r) for r in reversed(s.recent)))
    sections = [
        ("Verification", f"<ul>{details}</ul>"),
        ("Decisions over time", _timeline(s)),
        ("Deny reasons by gate", _gates(s)),
        ("Per tenant (and namespace)", _scopes(s)),
        ("Reuse across a tenant or namespace boundary", _cross(s)),
        ("Policy revisions in force", _policies(s)),
        ("Engine events", _events(s)),
        (f"Most recent decisions ({len(s.recent)})", recent),
        ("Terms", _glossary()),
    ]
    body = "".join(f"<h2>{escape(h)}</h2>{html}" for h, html in sections)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(verdict.headline)}</title><style>{CSS}</style></head><body>"
        f'<p id="verdict" class="verdict {verdict.status}" data-k="verdict" data-v="{verdict.status}">'
        f"{escape(verdict.headline)}</p><main><h1>semgov audit report</h1>{_kpis(s, title_scope)}"
        '<p><input id="q" type="search" placeholder="search request or decision id" aria-label="search">'
        ' <span id="qn" class="muted"></span></p>'
        f'{body}<p class="muted">Generated {escape(generated_at)} by semgov audit report.</p></main>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )
