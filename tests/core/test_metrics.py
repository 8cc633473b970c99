"""The hook's Prometheus metrics (issue 17): what moves when, how they are exported, and the shipped
dashboard and alert rules, checked against the names the code exports.

The real server's ``/metrics`` (SGLang's ``--enable-metrics``) is read in
``tests/sglang_server/test_policy_lifecycle_server.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_hooks.core.governor import Governor
from engine_hooks.core.metrics import BacklogSampler, HookMetrics, failure_reason, metric_names
from semgov.gateway.metrics import GatewayMetrics
from tests.core.files import HookFiles
from tests.core.test_policy_lifecycle import decide, donate, governor, stricter, write_policy

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "docs" / "monitoring"
NAME = re.compile(r"\b(semgov(?::|_gateway_)[a-z_]+)")


def value(m: HookMetrics, name: str, **labels: str) -> float:
    """The current value of one series of ``m`` (0 when it has not been written)."""
    v = m.registry.get_sample_value(name, labels)
    return float(v) if v is not None else 0.0


def exported(m: HookMetrics) -> set[str]:
    """Every sample name ``m``'s registry exports now."""
    return {s.name for fam in m.registry.collect() for s in fam.samples}


def test_decisions_latency_realizations_and_failures_move(hook_files: HookFiles) -> None:
    """An allow counts as a decision with its approved tokens and latency; realization events count
    tokens, failures by exception type, reuse_disabled sets the gauge."""
    gov: Governor = governor(hook_files, "thread")
    m = gov.metrics
    before = {
        "allow": value(m, "semgov:decisions_total", outcome="allow", engine="yaml"),
        "approved": value(m, "semgov:approved_tokens_total"),
        "latency": value(m, "semgov:decision_latency_seconds_count"),
        "realized": value(m, "semgov:realized_tokens_total"),
        "failed": value(m, "semgov:realization_failures_total", reason="RealizationError"),
    }
    try:
        donate(gov, "sglang-donor-1")
        record = decide(gov, "r-1").decisions[0].record
        gov.event("realization", request_id="r-1", materialized_tokens=600)
        gov.event("realization_failed", request_id="r-2", detail="RealizationError: tokens differ at 3..9")
        gov.event("reuse_disabled", detail="invariant")
    finally:
        gov.close()
    assert record["decision"] == "allow"
    assert value(m, "semgov:decisions_total", outcome="allow", engine="yaml") == before["allow"] + 1
    assert value(m, "semgov:approved_tokens_total") == before["approved"] + record["approved_tokens"]
    assert value(m, "semgov:decision_latency_seconds_count") == before["latency"] + 1
    assert value(m, "semgov:realized_tokens_total") == before["realized"] + 600
    assert value(m, "semgov:realization_failures_total", reason="RealizationError") == before["failed"] + 1
    assert value(m, "semgov:reuse_disabled") == 1


def test_shadow_reload_and_capture_counters_move(hook_files: HookFiles, tmp_path: Path) -> None:
    """A disagreeing shadow, a live reload and a captured request each move their counter."""
    shadow = tmp_path / "shadow"
    write_policy(shadow, stricter(hook_files.policy))
    gov = governor(
        hook_files,
        "thread",
        SEMGOV_SHADOW_POLICY=str(shadow),
        SEMGOV_CAPTURE_DIR=str(tmp_path / "cap"),
        SEMGOV_CAPTURE_RATE="1",
    )
    m = gov.metrics
    before = [
        value(m, "semgov:shadow_decisions_total", outcome="deny"),
        value(m, "semgov:shadow_disagreements_total"),
        value(m, "semgov:policy_reloads_total", role="live", outcome="loaded"),
        value(m, "semgov:captured_total"),
    ]
    try:
        donate(gov, "sglang-donor-1")
        decide(gov, "r-1")
        write_policy(hook_files.policy, stricter(hook_files.policy))
        gov.request_reload("test")
        assert gov.wait_idle(30)
    finally:
        gov.close()
    after = [
        value(m, "semgov:shadow_decisions_total", outcome="deny"),
        value(m, "semgov:shadow_disagreements_total"),
        value(m, "semgov:policy_reloads_total", role="live", outcome="loaded"),
        value(m, "semgov:captured_total"),
    ]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1, 1]


def test_the_backlog_sampler_sets_the_audit_gauges() -> None:
    """The sampler copies the audit log's backlog (pending records, lag) into the gauges."""
    m = HookMetrics()
    sampler = BacklogSampler(m, lambda: (7, 2.5), seconds=0.01)
    try:
        deadline = time.monotonic() + 10
        while value(m, "semgov:audit_pending_records") != 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sampler.close()
    assert (value(m, "semgov:audit_pending_records"), value(m, "semgov:audit_commit_lag_seconds")) == (7, 2.5)


def test_the_audit_backlog_counts_records_not_yet_durable(tmp_path: Path) -> None:
    """AuditLog.backlog: nothing pending after a flush; what it reports is never negative."""
    from semgov.audit.store import AuditLog
    from semgov.signing.keys import generate_keypair, load_signing_key

    priv, _ = generate_keypair(tmp_path / "keys")
    log = AuditLog.open(tmp_path / "audit", signing_key=load_signing_key(priv), origin="test")
    try:
        for i in range(50):
            log.append(json.dumps({"i": i}).encode())
        pending, lag = log.backlog()
        assert 0 <= pending <= 50 and lag >= 0
        log.flush()
        assert log.backlog() == (0, 0.0)
    finally:
        log.close()


def test_every_exported_name_is_listed_and_every_listed_name_exported() -> None:
    """metric_names() is exactly what a registry with every series written exports."""
    m = HookMetrics()
    m.decision({"decision": "allow", "policy": {"engine": "yaml"}, "gates": [], "approved_tokens": 3})
    m.decision(
        {"decision": "deny", "policy": {"engine": "yaml"}, "gates": [{"gate": "pii", "result": "fail"}]}
    )
    m.event("realization", 5, "")
    m.event("realization_failed", 0, "X: y")
    m.event("realization_failed", 0, "late: decided in 900 ms")
    m.warmup(True)
    m.shadow([{"decision": "deny"}], 1)
    m.reload("live", False)
    m.capture(True)
    m.capture(False)
    m.latency.observe(0.001)
    m.context_refused.labels("expired").inc()
    m.unscoped.labels("no_salt").inc()
    names = {n for n in exported(m) if not n.endswith("_created")}
    assert names == set(metric_names())


@pytest.mark.parametrize(
    ("detail", "reason"),
    [
        ("RealizationError: tokens differ at 3..9", "RealizationError"),
        ("", "unknown"),
        ('weird label {tenant="x"}', "weird_label__tenant__x__"),
        ("A" * 500 + ": x", "A" * 64),
    ],
)
def test_failure_reasons_are_bounded_labels(detail: str, reason: str) -> None:
    """A failure reason label is the detail's head, only [A-Za-z0-9_.], at most 64 characters."""
    assert failure_reason(detail) == reason


def test_metrics_are_exported_through_the_multiprocess_directory(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR set (as SGLang's --enable-metrics does) a process's metrics
    reach a MultiProcessCollector reading that directory, as SGLang's /metrics does."""
    mp = tmp_path / "prom"
    mp.mkdir()
    code = (
        "from engine_hooks.core.metrics import hook_metrics\n"
        "m = hook_metrics(); assert m.exported\n"
        "m.decision({'decision': 'allow', 'policy': {'engine': 'yaml'}, 'gates': [],\n"
        "            'approved_tokens': 640})\n"
        "m.event('realization', 512, '')\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(ROOT), timeout=120)
    reader = (
        "from prometheus_client import CollectorRegistry, generate_latest, multiprocess\n"
        "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)\n"
        "print(generate_latest(r).decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", reader], check=True, env=env, capture_output=True, text=True, timeout=120
    ).stdout
    assert 'semgov:decisions_total{engine="yaml",outcome="allow"} 1.0' in out
    assert "semgov:realized_tokens_total 512.0" in out and "semgov:approved_tokens_total 640.0" in out


def _names_in(text: str) -> set[str]:
    return set(NAME.findall(text))


def gateway_names() -> frozenset[str]:
    """Every sample name the gateway's registry exports once each of its series has a value."""
    m = GatewayMetrics.create()
    m.requests.labels("acme", "chat", "ok").inc()
    m.refusals.labels("bad_key").inc()
    m.upstream_seconds.labels("chat").observe(0.1)
    m.prepare_seconds.labels("chat").observe(0.001)
    m.reloads.labels("ok").inc()
    m.captured.labels("queued").inc()
    return frozenset(s.name for fam in m.registry.collect() for s in fam.samples)


def exported_names() -> frozenset[str]:
    """What the shipped dashboard and rules may name: the hook's series and the gateway's."""
    return metric_names() | gateway_names()


def test_the_dashboard_names_only_exported_metrics() -> None:
    """The Grafana dashboard is valid JSON, every panel but a row has a query, and every semgov
    series it names is one the hook or the gateway exports (histogram buckets included)."""
    dash: dict[str, Any] = json.loads((MONITORING / "grafana-semgov.json").read_text())
    assert all(p["targets"] for p in dash["panels"] if p["type"] != "row")
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert dash["panels"] and all(exprs)
    named = _names_in("\n".join(exprs))
    assert named and named <= exported_names(), named - exported_names()
    for wanted in ("semgov:decisions_total", "semgov:reuse_disabled", "semgov:audit_commit_lag_seconds"):
        assert wanted in named
    gateway = {n for n in named if n.startswith("semgov_gateway_")}
    assert {"semgov_gateway_requests_total", "semgov_gateway_refusals_total"} <= gateway
    assert {"semgov_gateway_prepare_seconds_bucket", "semgov_gateway_upstream_seconds_bucket"} <= gateway


def test_the_alert_rules_name_only_exported_metrics() -> None:
    """The alert rules load as Prometheus rule groups; every rule has an expression, a severity and
    a summary, and names only exported series; reuse disabled and audit lag page."""
    doc = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules
    for r in rules:
        assert r["expr"] and r["labels"]["severity"] and r["annotations"]["summary"], r
        named = _names_in(str(r["expr"]))
        assert named and named <= exported_names(), (r["alert"], named - exported_names())
    paging = {r["alert"] for r in rules if r["labels"]["severity"] == "page"}
    assert {"SemgovReuseDisabled", "SemgovAuditLag", "SemgovGatewayEngineErrors"} <= paging


def test_the_gateway_rules_match_only_documented_label_values() -> None:
    """Every outcome and refusal reason a gateway rule matches is one docs/gateway.md lists, so a
    rule cannot silently watch a value the gateway never writes."""
    doc = (ROOT / "docs" / "gateway.md").read_text()
    documented = set(re.findall(r"`([a-z_]+)`", doc))
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"][0]["rules"]
    matched = [
        v
        for r in rules
        if "semgov_gateway_" in r["expr"]
        for alt in re.findall(r'(?:outcome|reason)=~?"([^"]+)"', r["expr"])
        for v in alt.split("|")
    ]
    assert {"unreachable", "timeout", "bad_key", "refused"} <= set(matched)
    assert set(matched) <= documented, set(matched) - documented
