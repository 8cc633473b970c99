"""Prometheus metrics of the SGLang hook: ``semgov:*`` series beside SGLang's ``sglang:*`` on ``/metrics``.

Exported the way SGLang exports its own: with ``--enable-metrics`` SGLang's launcher sets
``PROMETHEUS_MULTIPROC_DIR`` before it starts the scheduler and serves ``/metrics`` from every
process's files there (``prometheus_client`` multiprocess mode). The hook's metrics are plain
``prometheus_client`` metrics created in the scheduler process and in the decision process, so
they land in that directory and appear on the server's ``/metrics`` with no port of their own.
Without ``--enable-metrics`` they are kept in memory (:attr:`HookMetrics.registry`), read by tests
and ``stats``; nothing is exported.

What is counted where (all off the scheduler thread except the two event counters, one
``inc`` each): decisions, gate failures and approved tokens when a live decision is audited
(:meth:`HookMetrics.decision`); decision latency when the scheduler may act on it; realized
tokens, realization failures (by exception type, or reason code) and allows not realized (by
reason code, :mod:`engine_hooks.core.unrealized`) and ``reuse_disabled`` as their engine events
are queued; warm-ups of the decision path, by outcome; shadow records and disagreements;
policy reloads; capture drops (in the process that captures); the audit log's backlog (records
accepted but not yet durable, and how long the writer has had work without committing) sampled
every second by a ``semgov-metrics`` thread (:class:`BacklogSampler`).

NOTE: label values are bounded by construction: outcomes, gates and results are enums, the
engine is the policy engine's name, a failure reason is an exception type name (at most 64
characters); no tenant, request or donor id is ever a label (unbounded, and they are what the
audit log is for).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal

from semgov.log import describe_error, get_logger
from semgov.wire.names import not_realized_reason

PREFIX = "semgov:"
# Decision latency on the decision thread, queued -> decided (seconds).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_REASON = re.compile(r"[^A-Za-z0-9_.]")


def metric_names() -> frozenset[str]:
    """Every series name the hook exports (as Prometheus shows them, suffixes included)."""
    counters = (
        "decisions", "gate_failures", "approved_tokens", "realized_tokens", "realization_failures",
        "realizations", "shadow_decisions", "shadow_disagreements", "policy_reloads", "capture_dropped",
        "captured", "context_tokens_refused", "unscoped_requests", "allows_not_realized", "warmups",
    )  # fmt: skip
    gauges = ("audit_pending_records", "audit_commit_lag_seconds", "reuse_disabled", "policy_bundle_revision")
    hist = ("decision_latency_seconds",)
    return frozenset(
        [f"{PREFIX}{c}_total" for c in counters]
        + [f"{PREFIX}{g}" for g in gauges]
        + [f"{PREFIX}{h}_{s}" for h in hist for s in ("bucket", "count", "sum")]
    )


def failure_reason(detail: str) -> str:
    """A bounded label from an event's detail (``"RealizationError: ..."`` -> ``RealizationError``)."""
    head = detail.split(":", 1)[0].strip()
    return _REASON.sub("_", head)[:64] or "unknown"


def _bundle_gauge(gauge: Callable[..., Any]) -> Any:
    """``semgov:policy_bundle_revision``: -1 until a bundle decides (``SEMGOV_BUNDLE``)."""
    g = gauge(
        "policy_bundle_revision", "Number of the policy bundle revision deciding (-1: none).", "livemax"
    )
    g.set(-1)
    return g


class HookMetrics:
    """The hook's Prometheus metrics, in ``registry`` (the default one when SGLang exports metrics)."""

    def __init__(self, registry: Any | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")) and registry is None
        if registry is None:
            if multiprocess:
                from prometheus_client import REGISTRY

                registry = REGISTRY
            else:
                registry = CollectorRegistry()
        self.registry = registry
        self.exported = multiprocess
        r = registry

        def counter(name: str, doc: str, labels: Iterable[str] = ()) -> Any:
            return Counter(PREFIX + name, doc, list(labels), registry=r)

        def gauge(name: str, doc: str, mode: Literal["livemax"]) -> Any:
            return Gauge(PREFIX + name, doc, registry=r, multiprocess_mode=mode)

        self.decisions = counter(
            "decisions", "Live decisions audited, by outcome and policy engine.", ("outcome", "engine")
        )
        self.gate_failures = counter(
            "gate_failures", "Gates not passed in live decisions, by gate and result.", ("gate", "result")
        )
        self.approved_tokens = counter("approved_tokens", "Tokens approved by live allow decisions.")
        self.realizations = counter("realizations", "KV realizations made (allowed reuse copied).")
        self.realized_tokens = counter("realized_tokens", "Tokens of KV copied by realizations.")
        self.realization_failures = counter(
            "realization_failures", "Allowed realizations that did not happen, by reason.", ("reason",)
        )
        self.allows_not_realized = counter(
            "allows_not_realized",
            "Allow decisions the engine did not act on, by reason code (docs/formats.md).",
            ("reason",),
        )
        self.warmups = counter(
            "warmups", "Warm-ups of the decision path (start, reload), by outcome.", ("outcome",)
        )
        self.latency = Histogram(
            PREFIX + "decision_latency_seconds",
            "Queued -> decided, per recipient with candidates (the scheduler never waits for it).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.shadow_decisions = counter(
            "shadow_decisions", "Shadow policy records audited (never acted on), by outcome.", ("outcome",)
        )
        self.shadow_disagreements = counter(
            "shadow_disagreements", "Shadow records whose outcome differs from the live decision's."
        )
        self.policy_reloads = counter(
            "policy_reloads", "Policy reloads while running, by policy and outcome.", ("role", "outcome")
        )
        self.captured = counter("captured", "Decided requests handed to the live capture.")
        self.context_refused = counter(
            "context_tokens_refused",
            "Context tokens sent and not trusted (the request got an isolated scope), by kind.",
            ("reason",),
        )
        self.unscoped = counter(
            "unscoped_requests",
            "vLLM requests that reached the engine with a cache salt the scope middleware did not issue.",
            ("reason",),
        )
        self.capture_dropped = counter("capture_dropped", "Decided requests the capture dropped.")
        self.audit_pending = gauge(
            "audit_pending_records", "Audit records accepted and not yet durable.", "livemax"
        )
        self.audit_lag = gauge(
            "audit_commit_lag_seconds",
            "How long the audit writer has had records pending without committing (0 when none).",
            "livemax",
        )
        self.reuse_disabled = gauge(
            "reuse_disabled", "1 once the engine turned semantic reuse off.", "livemax"
        )
        self.bundle_revision = _bundle_gauge(gauge)

    # ---- events ------------------------------------------------------------------------------

    def decision(self, record: dict[str, Any]) -> None:
        """One live decision record, as audited."""
        outcome = str(record.get("decision"))
        self.decisions.labels(outcome, str(record.get("policy", {}).get("engine", ""))).inc()
        for g in record.get("gates", ()):
            if g.get("result") != "pass":
                self.gate_failures.labels(str(g.get("gate")), str(g.get("result"))).inc()
        if outcome == "allow":
            self.approved_tokens.inc(int(record.get("approved_tokens", 0)))

    def event(self, kind: str, materialized_tokens: int, detail: str) -> None:
        """One engine event, as it is queued for the audit log."""
        if kind == "realization":
            self.realizations.inc()
            self.realized_tokens.inc(materialized_tokens)
        elif kind == "realization_failed":
            self.realization_failures.labels(failure_reason(detail)).inc()
            code = not_realized_reason(detail)
            if code is not None:
                self.allows_not_realized.labels(code).inc()
        elif kind == "reuse_disabled":
            self.reuse_disabled.set(1)

    def shadow(self, records: Iterable[dict[str, Any]], disagreements: int) -> None:
        for r in records:
            self.shadow_decisions.labels(str(r.get("decision"))).inc()
        self.shadow_disagreements.inc(disagreements)

    def warmup(self, ok: bool) -> None:
        self.warmups.labels("ok" if ok else "failed").inc()

    def reload(self, role: str, ok: bool) -> None:
        self.policy_reloads.labels(role, "loaded" if ok else "failed").inc()

    def bundle(self, revision: str) -> None:
        """The bundle revision now deciding (its number: the leading digits)."""
        digits = revision[: len(revision) - len(revision.lstrip("0123456789"))]
        self.bundle_revision.set(int(digits) if digits else -1)

    def capture(self, kept: bool) -> None:
        (self.captured if kept else self.capture_dropped).inc()


class BacklogSampler:
    """The ``semgov-metrics`` thread: samples the audit log's backlog into the gauges every ``seconds``."""

    def __init__(
        self, metrics: HookMetrics, backlog: Callable[[], tuple[int, float]], seconds: float = 1.0
    ) -> None:
        self.metrics = metrics
        self.backlog = backlog
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(seconds,), name="semgov-metrics", daemon=True
        )
        self._thread.start()

    def sample(self) -> None:
        pending, lag = self.backlog()
        self.metrics.audit_pending.set(pending)
        self.metrics.audit_lag.set(lag)

    def _loop(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - metrics never take the hook down
                get_logger().warning("semgov metrics sample failed", error=describe_error(e))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_shared: HookMetrics | None = None
_shared_lock = threading.Lock()


def hook_metrics() -> HookMetrics:
    """This process's metrics (one set per process: Prometheus refuses a name registered twice)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = HookMetrics()
        return _shared
