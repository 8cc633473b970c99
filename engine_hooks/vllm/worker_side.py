"""The worker side of semgov's vLLM connector: the donor store, and the copies in and out of it.

The store holds donors' K/V in a canonical ``[tokens, 2, kv_heads, head_dim]`` tensor per layer
(CPU memory, bounded by the scheduler side's :class:`~engine_hooks.vllm.book.StoreBook`, which
decides every entry and drop). Each step, in the order vLLM calls them:

- ``start_load_kv`` (before the forward, the loads being synchronous): for each planned load,
  the donor rows are written into the recipient's new blocks, keys re-rotated by the shift for
  a shifted piece (:func:`engine_hooks.core.rotation.rerotate_keys`; values unchanged). Any
  failure, or a model whose RoPE cannot be re-rotated exactly for a shifted piece, reports the
  load's blocks to vLLM as failed (``get_block_ids_with_load_errors``), and vLLM recomputes them:
  the request runs cold from there;
- ``wait_for_save`` (after the forward): drops, then the donor positions computed so far are
  gathered from the paged cache into their entries.

Where a token's K/V sit inside a block is learned from the attention kernel itself at
``register_kv_caches`` (:mod:`engine_hooks.vllm.layout`); if it cannot be, every load fails
(cold) and nothing is saved.

NOTE: nothing here waits for anything but its own copies; the worker reports outcomes in
:class:`~engine_hooks.vllm.meta.WorkerReport` for the scheduler side to audit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.vllm.layout import BlockLayout, LayoutError, cpu_cache_writer, learn_layout
from engine_hooks.vllm.meta import LoadOp, SaveOp, StepPlan, WorkerReport
from semgov.log import describe_error, get_logger


def _slots(block_ids: tuple[int, ...], start: int, end: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(start, end, dtype=torch.int64)
    ids = torch.tensor(block_ids, dtype=torch.int64)
    if end > len(block_ids) * block_size:
        raise ValueError(f"positions up to {end} need more than the request's {len(block_ids)} blocks")
    return ids[pos // block_size] * block_size + pos % block_size


class WorkerSide:
    """semgov on a vLLM worker: the donor store and its copies."""

    def __init__(self, vllm_config: Any) -> None:
        mc = vllm_config.model_config
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_cache_dtype = str(vllm_config.cache_config.cache_dtype)
        self.kv_heads = int(mc.get_num_kv_heads(vllm_config.parallel_config))
        self.head_dim = int(mc.get_head_size())
        self.rope = RopeSpec.from_hf_config(mc.hf_config)
        self.caches: dict[str, torch.Tensor] = {}
        self.layout: BlockLayout | None = None
        self.broken: str | None = "no KV caches registered yet"
        self.store: dict[str, list[torch.Tensor]] = {}
        self.report = WorkerReport()
        self.invalid: set[int] = set()
        # NOTE: a diagnostic (tests compare realized K/V with a cold prefill's): after each load the
        # recipient's loaded rows, read back from the paged cache, and each complete donor entry.
        dump = os.environ.get("SEMGOV_VLLM_KV_DUMP", "").strip()
        self.dump_dir = Path(dump) if dump else None

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's ``register_kv_caches``: the paged caches, and the kernel's block layout."""
        self.caches = dict(kv_caches)
        try:
            self.layout = self._learn()
            self.broken = None
        except Exception as e:  # noqa: BLE001 - no layout: every load fails (cold), nothing saved
            self.broken = describe_error(e)
            get_logger().error("semgov vLLM connector: KV reuse off (cache layout)", error=self.broken)
        get_logger().info(
            "semgov vLLM connector (worker) ready",
            layers=len(self.caches),
            rope=self.rope is not None,
            reuse=self.broken is None,
        )

    def _learn(self) -> BlockLayout:
        if not self.caches:
            raise LayoutError("no KV cache layers")
        shapes = {tuple(t.shape[1:]) for t in self.caches.values()}
        dtypes = {t.dtype for t in self.caches.values()}
        want = (self.kv_heads, self.block_size, 2 * self.head_dim)
        if shapes != {want} or len(dtypes) != 1:
            raise LayoutError(f"KV cache layers {sorted(shapes)} {sorted(map(str, dtypes))}, expected {want}")
        if self.kv_cache_dtype != "auto":
            raise LayoutError(f"--kv-cache-dtype {self.kv_cache_dtype}: quantized caches are refused")
        if any(not t.is_contiguous() or t.device.type != "cpu" for t in self.caches.values()):
            raise LayoutError("only contiguous CPU KV caches (vLLM's CPU attention backend) are supported")
        dtype = dtypes.pop()
        write = cpu_cache_writer(dtype, self.block_size, self.head_dim, self.kv_cache_dtype)
        return learn_layout(write, dtype, self.block_size, self.kv_heads, self.head_dim)

    # ---- loads -----------------------------------------------------------------------------

    def start_load(self, plan: StepPlan) -> None:
        """vLLM's ``start_load_kv``: every planned load, done before this step's forward."""
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
        if self.layout is None:
            raise RuntimeError(f"KV reuse is off: {self.broken}")
        rows = self.store.get(op.key)
        if rows is None or not op.pieces:
            raise RuntimeError(f"donor {op.key!r} is not in the store")
        layout = self.layout
        work: list[tuple[torch.Tensor, torch.Tensor, int, int, int]] = []
        for p in op.pieces:
            if p.donor_start + p.length > rows[0].shape[0]:
                raise RuntimeError(f"donor {op.key!r} holds {rows[0].shape[0]} tokens")
            if p.shift and self.rope is None:
                raise RuntimeError("a shifted piece, and this model's RoPE cannot be re-rotated exactly")
            slots = _slots(op.block_ids, p.recipient_start, p.recipient_start + p.length, self.block_size)
            work.append(
                (slots, torch.full((p.length,), p.shift, dtype=torch.int64), p.donor_start, p.length, p.shift)
            )
        # NOTE: everything is checked before the first write: a refused load leaves the cache as it was.
        for layer, cache in enumerate(self.caches.values()):
            for slots, delta, d0, n, shift in work:
                kv = rows[layer][d0 : d0 + n]
                if shift:
                    assert self.rope is not None
                    kv = kv.clone()
                    kv[:, 0] = rerotate_keys(kv[:, 0], delta, self.rope)
                layout.scatter(cache, slots, kv)

    def _dump_load(self, op: LoadOp) -> None:
        assert self.layout is not None and self.dump_dir is not None
        pieces = [(p.recipient_start, p.donor_start, p.length) for p in op.pieces]
        kv = []
        for cache in self.caches.values():
            rows = [
                self.layout.gather(cache, _slots(op.block_ids, r0, r0 + n, self.block_size))
                for r0, _, n in pieces
            ]
            kv.append(torch.cat(rows).clone())
        torch.save(
            {"req_id": op.req_id, "key": op.key, "pieces": pieces, "kv": kv},
            self.dump_dir / f"load-{op.req_id}.pt",
        )

    def load_errors(self) -> set[int]:
        out, self.invalid = self.invalid, set()
        return out

    # ---- saves -----------------------------------------------------------------------------

    def save(self, plan: StepPlan) -> None:
        """vLLM's ``wait_for_save``: drop evicted entries, then copy donor positions computed so far."""
        for key in plan.drops:
            self.store.pop(key, None)
        for op in plan.saves:
            try:
                self._save(op)
            except Exception as e:  # noqa: BLE001 - the entry is dropped; the request stays served
                self.store.pop(op.key, None)
                self.report.save_failed[op.key] = describe_error(e)

    def _save(self, op: SaveOp) -> None:
        if self.layout is None:
            raise RuntimeError(f"KV reuse is off: {self.broken}")
        rows = self.store.get(op.key)
        if rows is None:
            if op.start != 0:
                raise RuntimeError(f"entry {op.key!r} was dropped before its first positions were saved")
            shape = (op.total, 2, self.kv_heads, self.head_dim)
            rows = [torch.empty(shape, dtype=c.dtype) for c in self.caches.values()]
            self.store[op.key] = rows
        slots = _slots(op.block_ids, op.start, op.end, self.block_size)
        for layer, cache in enumerate(self.caches.values()):
            rows[layer][op.start : op.end] = self.layout.gather(cache, slots)
        if self.dump_dir is not None and op.end == op.total:
            torch.save(
                {"key": op.key, "label": op.label, "kv": [r.clone() for r in rows]},
                self.dump_dir / f"save-{op.key}.pt",
            )

    def take_report(self) -> WorkerReport | None:
        """vLLM's ``build_connector_worker_meta``: this step's outcomes (None when nothing happened)."""
        rep, self.report = self.report, WorkerReport()
        return None if rep.empty() else rep
