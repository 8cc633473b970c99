"""Real SGLang 0.5.23 objects on CPU for the hook's tests: pools, allocators, the tree, requests.

Everything here is SGLang's own code path up to the forward pass: ``ReqToTokenPool``,
``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``, ``MHATokenToKVPool`` on CPU, the
tree built through the backend registry (``create_tree_cache`` -> the ``semgov`` entry-point
factory), ``Req.init_next_round_input``, ``ScheduleBatch.init_new(...).prepare_for_extend()``
and ``release_kv_cache``. :class:`Harness` replays what the scheduler does between those calls
(the prefill adder's admission: temporary lock, ``init_load_back`` for host hits, the request
lock) and stands in for the forward pass with a *synthetic* one that writes each position's
K/V as a deterministic function of (token, position), keys rotated by real RoPE, so that a
copied or re-rotated slot can be compared with what a cold prefill would have written.
No SGLang server runs (its CPU backend needs an AMX build of ``sgl_kernel``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.core.files import (
    AUDIENCE,
    CONTRACT,
    TASK,
    HookFiles,
    make_hook_files,
)

ROOT = Path(__file__).resolve().parents[2]
STUBS = Path(__file__).resolve().parent / "stubs"
TINY_MODEL = ROOT / "engine_hooks" / "sglang" / "tiny_model"

# torchvision is imported on SGLang's config path and cannot be installed on a CPU machine (pip
# would replace the CPU torch with a CUDA build): use the import-only stub unless a real one exists.
if importlib.util.find_spec("torchvision") is None and str(STUBS) not in sys.path:
    sys.path.insert(0, str(STUBS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(here):
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def sglang_runtime() -> Any:
    """SGLang's process-wide config published once, for a tiny local Llama config (no weights)."""
    return publish_runtime()


def publish_runtime() -> Any:
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(TINY_MODEL), device="cpu", skip_tokenizer_init=True)
    rc.publish(args, role="scheduler")
    from sglang.srt.configs.model_config import ModelConfig

    from engine_hooks.sglang.plugin import register

    register()
    return SimpleNamespace(server_args=args, model_config=ModelConfig.from_server_args(args), rc=rc)


@pytest.fixture
def hook_files(tmp_path: Path) -> HookFiles:
    return make_hook_files(tmp_path)


class SyntheticModel:
    """Stands in for the forward pass: K/V of a position are a fixed function of (token, position)."""

    def __init__(self, pool: Any, rope: Any, seed: int = 7) -> None:
        import torch

        self.pool = pool
        self.rope = rope
        g = torch.Generator().manual_seed(seed)
        heads, dim = pool.head_num, pool.head_dim
        self.k_table = torch.randn(4096, heads, dim, generator=g)
        self.v_table = torch.randn(4096, heads, dim, generator=g)
        self.layers = list(range(pool.start_layer, pool.start_layer + pool.layer_num))

    def kv(self, tokens: Any, positions: Any, layer: int) -> tuple[Any, Any]:
        import torch

        from engine_hooks.core.rotation import rerotate_keys

        t = torch.as_tensor(tokens, dtype=torch.int64) % 4096
        pos = torch.as_tensor(positions, dtype=torch.int64)
        base = self.k_table[t] * (1.0 + 0.01 * layer)
        k = rerotate_keys(base, pos, self.rope)  # RoPE at `pos` of the raw key
        return k, self.v_table[t] * (1.0 + 0.01 * layer)

    def write(self, slots: Any, tokens: Any, positions: Any) -> None:
        for layer in self.layers:
            k, v = self.kv(tokens, positions, layer)
            kb = self.pool.get_key_buffer(layer)
            vb = self.pool.get_value_buffer(layer)
            kb[slots] = k.to(kb.dtype)
            vb[slots] = v.to(vb.dtype)

    def expected(self, tokens: Any, positions: Any, layer: int) -> tuple[Any, Any]:
        k, v = self.kv(tokens, positions, layer)
        return k.to(self.pool.dtype), v.to(self.pool.dtype)


class Harness:
    """One scheduler's worth of SGLang state with the ``semgov`` backend, driven step by step."""

    def __init__(
        self,
        runtime: Any,
        files: HookFiles,
        *,
        page_size: int = 1,
        size: int = 4096,
        tree_core: str | None = None,
        **env: str,
    ) -> None:
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache

        self.rt = runtime
        self.files = files
        self.page_size = page_size
        self.size = size
        self.req_pool = ReqToTokenPool(size=64, max_context_len=4096, device="cpu", enable_memory_saver=False)
        self.kv = MHATokenToKVPool(
            size=size,
            page_size=page_size,
            dtype=torch.float32,
            head_num=2,
            head_dim=16,
            layer_num=2,
            device="cpu",
            enable_memory_saver=False,
        )
        if page_size == 1:
            self.allocator: Any = TokenToKVPoolAllocator(
                size=size, dtype=torch.float32, device="cpu", kvcache=self.kv, need_sort=False
            )
        else:
            self.allocator = PagedTokenToKVPoolAllocator(
                size=size,
                page_size=page_size,
                dtype=torch.float32,
                device="cpu",
                kvcache=self.kv,
                need_sort=False,
            )
        params = CacheInitParams(
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page_size,
            disable=False,
            tree_core_backend=tree_core,
        )
        self.ctx = TreeCacheBuildContext(
            server_args=runtime.server_args,
            params=params,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hierarchical_cache=False,
            disable_radix_cache=False,
            tp_worker=SimpleNamespace(),
            model_config=runtime.model_config,
            tp_size=1,
            tp_rank=0,
            tp_group=None,
        )
        self.env = files.env(**env)
        mp = pytest.MonkeyPatch()
        try:
            for k, v in self.env.items():
                mp.setenv(k, v)
            from sglang.srt.runtime_context import get_memory

            with get_memory().override(radix_cache_backend="semgov"):
                self.tree = create_tree_cache(self.ctx)
        finally:
            mp.undo()
        self.model = SyntheticModel(self.kv, self.tree.rope)
        self.running: dict[str, Any] = {}
        self.waiting: dict[str, Any] = {}

    # ---- requests ----------------------------------------------------------------------------

    def context(self, tenant: str = "acme", namespace: str = "ns1", segments: Any = None, **over: Any) -> str:
        from semgov.context import make_context_token

        return make_context_token(
            self.files.context_secret,
            audience=AUDIENCE,
            tenant=tenant,
            namespace=namespace,
            task=over.get("task", TASK),
            response_contract=over.get("response_contract", CONTRACT),
            segments=segments,
        )

    def new_req(
        self, rid: str, tokens: list[int], extra_key: str | None, text: str = "", max_new: int = 4
    ) -> Any:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=max_new)
        sp.normalize(None)
        req = Req(rid, text, array("q", tokens), sp, extra_key=extra_key)
        self.waiting[rid] = req
        return req

    def match(self, req: Any) -> None:
        """The scheduler's rounds for ``req`` until admission may take it: the match (the first
        queues its decision), then, while the admission hook holds it, rounds of the round hook,
        then the match again."""
        req.init_next_round_input(self.tree)
        if self.tree.holds(req):
            self.hold(req)
            req.init_next_round_input(self.tree)

    def hold(self, req: Any, timeout: float = 120.0) -> int:
        """Run the prefill-round hook on ``req`` until it is no longer held back; the rounds it took."""
        import time

        rounds, deadline = 1, time.monotonic() + timeout
        while self.tree.hold_back([req]) and time.monotonic() < deadline:
            time.sleep(0.001)
            rounds += 1
        return rounds

    def settle(self, timeout: float = 120.0) -> None:
        """Wait until every decision queued so far is made and every record appended so far is
        durable (the decision thread idle, then the audit log flushed), however slow this machine
        decides or fsyncs: no deadline of the hook's is in play while it waits (a decision done is
        taken whenever it is polled, and an allow's durability deadline starts only then)."""
        self._idle(timeout)
        self.tree.gov.audit.flush()

    def _idle(self, timeout: float) -> None:
        """The decision thread idle, twice. NOTE: a job taken in the same batch as the first wait
        (queued before it, behind a job that kept the thread busy) queues its engine events after
        that wait: a late decision's ``realization_failed``. The second wait comes after them."""
        assert self.tree.gov.wait_idle(timeout)
        assert self.tree.gov.wait_idle(timeout)

    def admit(self, req: Any, chunk: int | None = None) -> None:
        """The prefill adder's admission of one request (its cache-facing steps, in order)."""
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        tmp = self.tree.lock(req.last_node)
        try:
            if req.needs_host_load_back():
                host = self.tree.inc_host_lock_ref(req.best_match_node).to_dec_params()
                try:
                    loaded = self.tree.init_load_back(
                        InitLoadBackParams(
                            best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req
                        )
                    )
                finally:
                    self.tree.dec_host_lock_ref(req.best_match_node, host)
                req.host_loaded_length, req.last_node = loaded
                req.prefix_len += req.host_loaded_length
                if self.tree.load_back_is_cache_owned():
                    req.kv.cache_protected_len = req.prefix_len
            total = len(req.full_untruncated_fill_ids)
            req.extend_end = total if chunk is None else min(total, req.prefix_len + chunk)
            req.lock = self.tree.lock(req.last_node)
        finally:
            self.tree.unlock(tmp)

    def prefill(self, reqs: list[Any]) -> Any:
        """``prepare_for_extend`` (row and slot allocation) plus the synthetic forward pass."""
        import torch
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        batch = ScheduleBatch.init_new(
            reqs,
            self.req_pool,
            self.allocator,
            self.tree,
            self.rt.model_config,
            False,
            SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        offset = 0
        for req in reqs:
            start, end = req.prefix_len, req.extend_end
            n = end - start
            slots = batch.out_cache_loc[offset : offset + n]
            toks = torch.as_tensor(list(req.full_untruncated_fill_ids[start:end]), dtype=torch.int64)
            self.model.write(slots, toks, torch.arange(start, end))
            offset += n
            self.waiting.pop(req.rid, None)
            self.running[req.rid] = req
        return batch

    def run(self, req: Any, chunk: int | None = None) -> Any:
        self.match(req)
        self.admit(req, chunk)
        return self.prefill([req])

    def next_chunk(self, req: Any, chunk: int) -> Any:
        """A chunked request's next round (the scheduler re-enters it without a tree match)."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        checkpoint_kv_cache(req, self.tree)
        req.init_next_round_input()
        total = len(req.full_untruncated_fill_ids)
        req.extend_end = min(total, req.prefix_len + chunk)
        return self.prefill([req])

    def finish(self, req: Any, outputs: int = 1, *, abort: bool = False) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
        from sglang.srt.mem_cache.common import release_kv_cache

        req.finished_reason = FINISH_ABORT() if abort else FINISH_LENGTH(length=outputs)
        release_kv_cache(req, self.tree, checkpoint=True)
        self.running.pop(req.rid, None)

    def abort_waiting(self, req: Any) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

        self.tree.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
        self.waiting.pop(req.rid, None)

    # ---- checks ------------------------------------------------------------------------------

    def row(self, req: Any) -> Any:
        return self.req_pool.req_to_token[req.kv.req_pool_idx, : req.kv.kv_allocated_len].to(
            dtype=self._i64()
        )

    @staticmethod
    def _i64() -> Any:
        import torch

        return torch.int64

    def invariant(self) -> tuple[bool, str]:
        """SGLang's scheduler check, fed the way the scheduler feeds it (owners from the batches)."""
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
        from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver

        obs = SchedulerPoolStatsObserver(
            tree_cache=self.tree,
            token_to_kv_pool_allocator=self.allocator,
            req_to_token_pool=self.req_pool,
            session_controller=SimpleNamespace(sessions={}),
            hisparse_coordinator=None,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hisparse=False,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=self.size,
        )
        batch = SimpleNamespace(reqs=list(self.running.values()))
        chk = SchedulerInvariantChecker(
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            disaggregation_mode=DisaggregationMode.NULL,
            page_size=self.page_size,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=self.size,
            tree_cache=self.tree,
            token_to_kv_pool_allocator=self.allocator,
            req_to_token_pool=self.req_pool,
            pool_stats_observer=obs,
            get_last_batch=lambda: batch,
            get_running_batch=lambda: None,
            scheduler_stage_metrics=None,
        )
        uncached, _ = chk._get_total_uncached_sizes()
        leak, msg = chk._check_full_pool(
            obs.get_pool_stats(), uncached=uncached + self.tree.pending_private()
        )
        return (not leak), str(msg)

    def assert_clean(self) -> None:
        """Idle: every slot is free or evictable, nothing protected, no pins, no hook state."""
        ok, msg = self.invariant()
        assert ok, msg
        assert self.tree.protected_size() == 0, msg
        assert self.tree.pins == 0
        assert not self.tree.live_states()
        assert self.allocator.available_size() + self.tree.evictable_size() == self.size, msg

    def records(self) -> list[dict[str, Any]]:
        """Every record of the audit log (after the decision thread and the writer are idle)."""
        from semgov.audit.reader import iter_records

        self._idle(60)
        self.tree.gov.audit.flush()
        return [json.loads(r) for _, r in iter_records(self.files.audit_dir)]

    def close(self) -> None:
        if not getattr(self, "closed", False):
            self.closed = True
            self.tree.gov.close()


@pytest.fixture
def make_harness(sglang_runtime: Any, hook_files: HookFiles) -> Iterator[Any]:
    made: list[Harness] = []

    def make(**kw: Any) -> Harness:
        h = Harness(sglang_runtime, hook_files, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
