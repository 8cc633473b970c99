"""The worker side of semgov's vLLM connector: the donor store, and the copies in and out of it.

At ``register_kv_caches`` each attention layer's backend is looked up in vLLM's forward context
(``layer.get_attn_backend().get_name()``) and the block layout of its registered cache view is
learned **through the backend's own cache writer** (:mod:`engine_hooks.vllm.device_layout`): the
layer's ``impl.do_kv_cache_update`` on a GPU (FLASH_ATTN, FLASHINFER, TRITON_ATTN), vLLM's CPU
kernel for CPU_ATTN (as before). The copies then go through a
:class:`~engine_hooks.vllm.device_copies.CopyEngine`: side streams and events on a CUDA device
(the host never waits for a copy), in order at once on CPU. A backend or cache the connector
cannot read (another backend, a quantized ``--kv-cache-dtype``, a head-outer layout, a writer
that is not a bijection) turns governed reuse off for this worker: an error line at start naming
the backend and the setting that selects a supported one, and ``WorkerReport.reuse_off``, which
the scheduler side turns into a ``reuse_disabled`` event (gauge ``semgov:reuse_disabled``).

The store holds donors' K/V in canonical ``[tokens, 2, kv_heads, head_dim]`` host rows per layer
(pinned on a GPU), bounded by the scheduler side's :class:`~engine_hooks.vllm.book.StoreBook`
(``SEMGOV_VLLM_STORE_MB``), which decides every entry and drop. Each step, in the order vLLM calls
them:

- ``start_load_kv`` (before the forward, the loads being synchronous): for each planned load,
  the donor rows are written into the recipient's new blocks, keys re-rotated by the shift for
  a shifted piece (:func:`engine_hooks.core.rotation.rerotate_keys`; values unchanged). Any
  failure (the entry not complete, a model whose RoPE cannot be re-rotated exactly for a shifted
  piece, slots outside the cache) is found before anything is enqueued and reports the load's
  blocks to vLLM as failed (``get_block_ids_with_load_errors``): vLLM recomputes them;
- ``wait_for_save`` (after the forward): drops, then the donor positions computed so far are
  gathered from the paged cache into their entries;
- ``build_connector_worker_meta``: outcomes, and the entries whose every position is saved with
  their copies complete (``WorkerReport.saved``): the scheduler registers a donor only then.

NOTE: nothing here waits for anything but its own copies, and on a GPU not even those (except the
``SEMGOV_VLLM_KV_DUMP`` diagnostic, which synchronizes the device).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.vllm.device_copies import CopyEngine, CudaStreams, ImmediateStreams, Streams
from engine_hooks.vllm.device_layout import (
    DeviceLayout,
    LayerWriter,
    LayoutError,
    backend_layer_writer,
    cpu_layer_writer,
    learn_for_layers,
)
from engine_hooks.vllm.meta import LoadOp, SaveOp, StepPlan, WorkerReport
from semgov.log import describe_error, get_logger


def _slots(block_ids: tuple[int, ...], start: int, end: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(start, end, dtype=torch.int64)
    ids = torch.tensor(block_ids, dtype=torch.int64)
    if end > len(block_ids) * block_size:
        raise ValueError(f"positions up to {end} need more than the request's {len(block_ids)} blocks")
    return ids[pos // block_size] * block_size + pos % block_size


def _streams(caches: dict[str, torch.Tensor]) -> Streams:
    """Side streams on a CUDA device; on CPU (one in-order device) everything runs when enqueued."""
    device = next(iter(caches.values())).device
    return CudaStreams(device) if device.type == "cuda" else ImmediateStreams()


def attention_backends(vllm_config: Any, names: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The attention layer behind each registered cache (vLLM's forward context) and its backend's
    name (``AttentionBackend.get_name()``: FLASH_ATTN, FLASHINFER, TRITON_ATTN, CPU_ATTN, ...)."""
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None)
    layers: dict[str, Any] = {}
    backends: dict[str, str] = {}
    for name in names:
        layer = (context or {}).get(name)
        get = getattr(layer, "get_attn_backend", None)
        backend = get() if callable(get) else getattr(layer, "attn_backend", None)
        if backend is None:
            raise LayoutError(f"KV cache {name!r} belongs to no attention layer in vLLM's forward context")
        layers[name], backends[name] = layer, str(backend.get_name())
    return layers, backends


class WorkerSide:
    """semgov on a vLLM worker: the donor store and its copies."""

    def __init__(self, vllm_config: Any) -> None:
        mc = vllm_config.model_config
        self.vllm_config = vllm_config
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_cache_dtype = str(vllm_config.cache_config.cache_dtype)
        self.kv_heads = int(mc.get_num_kv_heads(vllm_config.parallel_config))
        self.head_dim = int(mc.get_head_size())
        self.rope = RopeSpec.from_hf_config(mc.hf_config)
        self.caches: dict[str, torch.Tensor] = {}
        self.engine: CopyEngine | None = None
        self.broken: str | None = "no KV caches registered yet"
        self.report = WorkerReport()
        self.invalid: set[int] = set()
        # NOTE: a diagnostic (tests compare realized K/V with a cold prefill's): after each load the
        # recipient's loaded rows, read back from the paged cache, and each complete donor entry.
        dump = os.environ.get("SEMGOV_VLLM_KV_DUMP", "").strip()
        self.dump_dir = Path(dump) if dump else None

    @property
    def layout(self) -> DeviceLayout | None:
        return self.engine.layout if self.engine is not None else None

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's ``register_kv_caches``: the paged caches, their backend's block layout, the copies."""
        self.caches = dict(kv_caches)
        backends: dict[str, str] = {}
        try:
            layers, backends = attention_backends(self.vllm_config, list(self.caches))
            layout = learn_for_layers(
                self.caches,
                backends,
                lambda name: self._writer(layers[name], backends[name], self.caches[name]),
                self.kv_heads,
                self.head_dim,
                self.kv_cache_dtype,
            )
            self.engine = CopyEngine(layout, self.caches, _streams(self.caches), self.rope)
            self.broken = None
        except Exception as e:  # noqa: BLE001 - no layout: reuse off (every load fails, nothing saved)
            self.broken = describe_error(e)
            self.report.reuse_off = self.broken  # NOTE: the scheduler side audits reuse_disabled
            get_logger().error(
                "semgov vLLM connector: KV reuse off (cache layout)",
                backend=",".join(sorted(set(backends.values()))) or "unknown",
                kv_cache_dtype=self.kv_cache_dtype,
                error=self.broken,
            )
        get_logger().info(
            "semgov vLLM connector (worker) ready",
            layers=len(self.caches),
            backend=self.layout.backend if self.layout is not None else None,
            device=str(next(iter(self.caches.values())).device) if self.caches else None,
            rope=self.rope is not None,
            reuse=self.broken is None,
        )

    def _writer(self, layer: Any, backend: str, view: torch.Tensor) -> LayerWriter:
        """The backend's own cache writer for ``layer``: vLLM's CPU kernel for CPU_ATTN, else the
        layer's ``impl.do_kv_cache_update`` (the kernel vLLM runs each forward)."""
        if backend == "CPU_ATTN":
            return cpu_layer_writer(view.dtype, int(view.shape[2]), self.head_dim, self.kv_cache_dtype)
        return backend_layer_writer(layer)

    # ---- loads -----------------------------------------------------------------------------

    def start_load(self, plan: StepPlan) -> None:
        """vLLM's ``start_load_kv``: every planned load, enqueued before this step's forward."""
        for op in plan.loads:
            try:
                self._load(op)
                self.report.loaded[op.req_id] = op.tokens
                if self.dump_dir is not None:
                    self._dump_load(op)
            except Exception as e:  # noqa: BLE001 - the load's blocks are recomputed by vLLM
                self.report.failed[op.req_id] = describe_error(e)
                self.invalid.update(self._blocks_of(op))
                get_logger().warning("semgov vLLM connector: load failed", error=describe_error(e))

    def _blocks_of(self, op: LoadOp) -> set[int]:
        """The recipient blocks a load writes (all of ``op.block_ids`` for a load with no pieces)."""
        if not op.pieces:
            return set(op.block_ids)
        bs, out = self.block_size, set[int]()
        for p in op.pieces:
            out.update(op.block_ids[p.recipient_start // bs : -(-(p.recipient_start + p.length) // bs)])
        return out

    def _load(self, op: LoadOp) -> None:
        if self.engine is None:
            raise RuntimeError(f"KV reuse is off: {self.broken}")
        if not op.pieces:
            raise RuntimeError(f"donor {op.key!r} is not in the store")
        pieces = [
            (
                _slots(op.block_ids, p.recipient_start, p.recipient_start + p.length, self.block_size),
                p.donor_start,
                p.shift,
            )
            for p in op.pieces
        ]
        # NOTE: the engine checks everything before it enqueues: a refused load leaves the cache as it was.
        self.engine.load(op.key, pieces)

    def _sync(self) -> None:
        """Diagnostics only: wait for the device (the store's copies, the loads)."""
        device = next(iter(self.caches.values())).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _dump_load(self, op: LoadOp) -> None:
        assert self.layout is not None and self.dump_dir is not None
        self._sync()
        pieces = [(p.recipient_start, p.donor_start, p.length) for p in op.pieces]
        kv = []
        for cache in self.caches.values():
            rows = [
                self.layout.gather(cache, _slots(op.block_ids, r0, r0 + n, self.block_size))
                for r0, _, n in pieces
            ]
            kv.append(torch.cat(rows).cpu().clone())
        torch.save(
            {"req_id": op.req_id, "key": op.key, "pieces": pieces, "kv": kv},
            self.dump_dir / f"load-{op.req_id}.pt",
        )

    def load_errors(self) -> set[int]:
        out, self.invalid = self.invalid, set()
        return out

    # ---- saves -----------------------------------------------------------------------------

    def save(self, plan: StepPlan) -> None:
        """vLLM's ``wait_for_save``: drop evicted entries, then enqueue copies of the donor
        positions computed so far (never waiting for them)."""
        for key in plan.drops:
            if self.engine is not None:
                self.engine.drop(key)
        for op in plan.saves:
            try:
                self._save(op)
            except Exception as e:  # noqa: BLE001 - the entry is dropped; the request stays served
                if self.engine is not None:
                    self.engine.drop(op.key)
                self.report.save_failed[op.key] = describe_error(e)

    def _save(self, op: SaveOp) -> None:
        if self.engine is None:
            raise RuntimeError(f"KV reuse is off: {self.broken}")
        self.engine.save(op.key, _slots(op.block_ids, op.start, op.end, self.block_size), op.start, op.total)
        if self.dump_dir is not None and op.end == op.total:
            self._sync()
            rows = [r.clone() for r in self.engine.entries[op.key].rows]
            torch.save({"key": op.key, "label": op.label, "kv": rows}, self.dump_dir / f"save-{op.key}.pt")

    def take_report(self) -> WorkerReport | None:
        """vLLM's ``build_connector_worker_meta``: this step's outcomes, and the entries now saved
        whole (their copies complete: polled, never waited for). None when nothing happened."""
        if self.engine is not None:
            for key in self.engine.poll():
                self.report.saved[key] = 1
        rep, self.report = self.report, WorkerReport()
        return None if rep.empty() else rep
