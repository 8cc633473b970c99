"""semgov's governed KV connector for vLLM (0.32, the V1 KV connector API; no patch to vLLM).

Run vLLM's OpenAI server with the scope middleware and this connector::

    python -m vllm.entrypoints.openai.api_server --model ... --enable-prefix-caching \\
      --middleware engine_hooks.vllm.scope.ScopeSalt \\
      --kv-transfer-config '{"kv_connector": "SemgovConnector",
        "kv_connector_module_path": "engine_hooks.vllm.connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute"}'

with the hook's ``SEMGOV_*`` settings (docs/sglang.md, the same as SGLang's) in the environment.
vLLM builds one instance in its scheduler (:class:`~engine_hooks.vllm.scheduler_side.SchedulerSide`:
decisions, the load plan, donors, the audit log) and one per worker
(:class:`~engine_hooks.vllm.worker_side.WorkerSide`: the donor store and the copies); this class
only routes vLLM's calls to the side that exists. A bad setting stops the server at start with a
message naming it; at run time, any error costs reuse (the request runs cold), never the engine.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from engine_hooks.core.settings import HookConfigError
from engine_hooks.vllm.meta import StepPlan
from engine_hooks.vllm.scheduler_side import SchedulerSide
from engine_hooks.vllm.worker_side import WorkerSide

__all__ = ["SemgovConnector"]


def _check_config(vllm_config: Any, kv_cache_config: Any) -> None:
    policy = getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", None)
    if policy != "recompute":
        raise HookConfigError(
            f'--kv-transfer-config: semgov needs "kv_load_failure_policy": "recompute" (got {policy!r}): '
            "a load that fails must be recomputed (the request runs cold), not fail the request"
        )
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if groups is not None and len(groups) != 1:
        raise HookConfigError(
            f"semgov's vLLM connector supports models with one KV cache group (this one has {len(groups)})"
        )


class SemgovConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM is untyped here
    """vLLM's ``KVConnectorBase_V1`` for semgov: governed, audited reuse of donor KV."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _check_config(vllm_config, kv_cache_config)
        self.sched = SchedulerSide(vllm_config) if role == KVConnectorRole.SCHEDULER else None
        self.worker = WorkerSide(vllm_config) if role == KVConnectorRole.WORKER else None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # NOTE: a donor save is best effort: a dropped one is a future cold run

    # ---- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.worker is not None
        self.worker.register(kv_caches)

    def _plan(self) -> StepPlan | None:
        meta = self._connector_metadata
        return meta if isinstance(meta, StepPlan) else None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        plan = self._plan()
        if self.worker is not None and plan is not None:
            self.worker.start_load(plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # NOTE: loads are synchronous, done in start_load_kv before the forward

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # NOTE: donors are saved once per step, in wait_for_save, from the registered caches

    def wait_for_save(self) -> None:
        plan = self._plan()
        if self.worker is not None and plan is not None:
            self.worker.save(plan)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.load_errors() if self.worker is not None else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self.worker.take_report() if self.worker is not None else None

    # ---- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.sched is not None
        return self.sched.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self.sched is not None
        self.sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self.sched is not None
        return self.sched.build(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        if self.sched is not None:
            self.sched.output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self.sched is not None
        return self.sched.finished(request)

    def reset_cache(self) -> bool | None:
        return self.sched.reset() if self.sched is not None else None

    def shutdown(self) -> None:
        if self.sched is not None:
            self.sched.close()
