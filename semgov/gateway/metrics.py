"""The gateway's Prometheus metrics, on a registry of its own (served at ``/metrics``).

Every label value is bounded: ``tenant`` comes from the tenants file (``-`` before a key
verified), ``route`` is ``chat``, ``completions``, ``calibrate`` or ``models``, ``outcome`` and
``reason`` are fixed labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics"]

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    refusals: Counter
    upstream_seconds: Histogram
    prepare_seconds: Histogram
    reloads: Counter
    tenants: Gauge
    captured: Counter
    in_flight: Gauge

    @classmethod
    def create(cls) -> GatewayMetrics:
        r = CollectorRegistry()
        return cls(
            registry=r,
            requests=Counter(
                "semgov_gateway_requests", "Requests by tenant, route and outcome",
                ["tenant", "route", "outcome"], registry=r,
            ),
            refusals=Counter(
                "semgov_gateway_refusals", "Requests refused before any engine, by reason", ["reason"],
                registry=r,
            ),
            upstream_seconds=Histogram(
                "semgov_gateway_upstream_seconds",
                "From sending to the engine to its full answer (streams: to the last byte)",
                ["route"], buckets=_BUCKETS, registry=r,
            ),
            prepare_seconds=Histogram(
                "semgov_gateway_prepare_seconds",
                "The gateway's own work per request before the engine: parse, template, tokenize, mint",
                ["route"], buckets=_BUCKETS, registry=r,
            ),
            reloads=Counter(
                "semgov_gateway_reloads", "Reloads of the tenants file and context key, by outcome",
                ["outcome"], registry=r,
            ),
            captured=Counter(
                "semgov_gateway_captured", "Answered requests offered to the capture: queued or skipped "
                "(sampled out, or the queue full)", ["outcome"], registry=r,
            ),
            tenants=Gauge("semgov_gateway_keys", "API keys in the loaded tenants file", registry=r),
            in_flight=Gauge("semgov_gateway_in_flight", "Requests being forwarded now", registry=r),
        )  # fmt: skip
