"""semgov's connector as vLLM loads it, timing semgov's work on vLLM's scheduler thread (test-only).

The server check (``tests/vllm/check.py``) loads it through ``kv_connector_module_path``. It is the
product's :class:`~engine_hooks.vllm.connector.SemgovConnector` unchanged, with each scheduler-side
method timed: the per-request calls (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
``request_finished``) are charged to their request; the per-step calls (``build_connector_meta``,
``update_connector_output``) are shared equally by the requests scheduled in that step. At
``request_finished`` it appends the request's nanoseconds to ``SEMGOV_RIG_SCHED_LOG`` (one line per
request, as the SGLang rig's plugin writes ``ReqState.sched_ns``). Nothing in engine_hooks imports it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from engine_hooks.vllm.connector import SemgovConnector as _Product

__all__ = ["SemgovConnector"]


class SemgovConnector(_Product):
    """The product's connector, its scheduler-side time per request logged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ns: dict[str, int] = {}
        self._step: list[str] = []
        self._log = os.environ.get("SEMGOV_RIG_SCHED_LOG", "").strip()

    def _charge(self, rid: str, t0: int) -> None:
        self._ns[rid] = self._ns.get(rid, 0) + time.perf_counter_ns() - t0

    def _share(self, t0: int) -> None:
        cost = time.perf_counter_ns() - t0
        for rid in self._step:
            self._ns[rid] = self._ns.get(rid, 0) + cost // len(self._step)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        t0 = time.perf_counter_ns()
        try:
            return super().get_num_new_matched_tokens(request, num_computed_tokens)
        finally:
            self._charge(request.request_id, t0)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        t0 = time.perf_counter_ns()
        try:
            super().update_state_after_alloc(request, blocks, num_external_tokens)
        finally:
            self._charge(request.request_id, t0)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return super().build_connector_meta(scheduler_output)
        finally:
            self._step = list(getattr(scheduler_output, "num_scheduled_tokens", {}) or ())
            self._share(t0)

    def update_connector_output(self, connector_output: Any) -> None:
        t0 = time.perf_counter_ns()
        try:
            super().update_connector_output(connector_output)
        finally:
            self._share(t0)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        t0 = time.perf_counter_ns()
        try:
            return super().request_finished(request, block_ids)
        finally:
            self._charge(request.request_id, t0)
            ns = self._ns.pop(request.request_id, 0)
            if self._log:
                with open(self._log, "a", encoding="utf-8") as f:
                    f.write(f"{ns}\n")
