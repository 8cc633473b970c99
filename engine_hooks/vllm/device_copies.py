"""The worker side's copies on a GPU, without waiting: donor rows held in (pinned) host memory,
saves and loads enqueued on side streams, completion seen by polling events (issue 33; used by
:mod:`engine_hooks.vllm.worker_side`; tested on CPU only, never run on a GPU yet).

- **Saves** (``wait_for_save``, after the forward): the save stream first waits, on the device,
  for everything already queued on the compute stream (the forward that computed the rows), then
  gathers the donor positions (:class:`~engine_hooks.vllm.device_layout.DeviceLayout`) and copies
  them into the entry's host rows (``non_blocking``); an event is recorded, and the compute
  stream waits for it on the device: vLLM may hand a finished donor's blocks to another request
  (zeroing them, writing them) at the next step, and that work must not overtake the save reading
  them. (vLLM 0.32 calls ``start_load_kv`` *after* launching the forward on steps without
  synchronous loads, so a guard placed there would come too late.) The entry is reported complete
  (:meth:`CopyEngine.poll`, from ``build_connector_worker_meta``) only once every save event of
  it has completed, so the scheduler's book marks a donor usable only when its rows are really
  there; nobody waits for it.
- **Loads** (``start_load_kv``, before the forward on a step with synchronous loads): the load
  stream waits on the device for the compute stream (vLLM zeroes newly allocated blocks there,
  just before), then the donor rows are copied to the device, keys of shifted pieces re-rotated
  there, and scattered into the recipient's blocks; the compute stream waits for the load's event
  on the device. Everything that can fail is checked on the host before the first enqueue (a
  device error is not an exception one can recover from).
- **Drops**: an entry with saves in flight is retired, kept alive until its events completed (its
  pinned memory must not be reused under a running copy), and freed at a later poll.

The host thread only enqueues and queries events: it never synchronizes a stream. On CPU
:class:`ImmediateStreams` runs everything in order at once (vLLM's CPU backend has one stream).
Memory: host rows are bounded by the scheduler side's book (``SEMGOV_VLLM_STORE_MB``, unchanged);
device memory used here is transient (one layer's gathered or loaded rows at a time).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.vllm.device_layout import DeviceLayout

__all__ = ["CopyEngine", "CudaStreams", "ImmediateStreams", "Streams"]


class Streams(Protocol):
    """What the copies need from a device: two side streams, events, device-side waits."""

    def on(self, name: str) -> AbstractContextManager[Any]:
        """Enqueue the block's work on side stream ``name`` ("save" or "load")."""
        ...

    def after_compute(self, name: str) -> None:
        """Side stream ``name`` waits (on the device) for the work already on the compute stream."""
        ...

    def record(self, name: str) -> Any:
        """An event marking the work enqueued on ``name`` so far."""
        ...

    def compute_waits(self, event: Any) -> None:
        """The compute stream waits (on the device) for ``event``."""
        ...

    def done(self, event: Any) -> bool:
        """Whether ``event`` completed (a query: never waits)."""
        ...


class ImmediateStreams:
    """One in-order device (CPU): work runs when enqueued, every event is complete."""

    def on(self, name: str) -> AbstractContextManager[Any]:
        return nullcontext()

    def after_compute(self, name: str) -> None:
        return

    def record(self, name: str) -> Any:
        return None

    def compute_waits(self, event: Any) -> None:
        return

    def done(self, event: Any) -> bool:
        return True


class CudaStreams:
    """A CUDA device's side streams for saves and loads (used on GPU workers only)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = {n: torch.cuda.Stream(device=device) for n in ("save", "load")}  # type: ignore[no-untyped-call]

    @contextmanager
    def on(self, name: str) -> Iterator[None]:
        with torch.cuda.stream(self.side[name]):
            yield

    def after_compute(self, name: str) -> None:
        self.side[name].wait_stream(torch.cuda.current_stream(self.device))

    def record(self, name: str) -> Any:
        return self.side[name].record_event()

    def compute_waits(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def done(self, event: Any) -> bool:
        return bool(event.query())


@dataclass
class _Entry:
    rows: list[torch.Tensor]  # per layer [tokens, 2, kv_heads, head_dim], host memory
    pending: list[tuple[Any, list[torch.Tensor]]] = field(default_factory=list)  # (event, kept alive)
    saved: int = 0  # positions [0, saved) enqueued


class CopyEngine:
    """Donor entries and the copies between them and the paged caches, enqueued on ``streams``."""

    def __init__(
        self,
        layout: DeviceLayout,
        caches: dict[str, torch.Tensor],
        streams: Streams,
        rope: RopeSpec | None = None,
    ) -> None:
        self.layout, self.caches, self.streams, self.rope = layout, dict(caches), streams, rope
        # NOTE: device <-> host copies are asynchronous only to and from pinned host memory
        self.pin = any(c.device.type == "cuda" for c in self.caches.values())
        self._blocks = next(iter(self.caches.values())).shape[0] if self.caches else 0
        self.entries: dict[str, _Entry] = {}
        self.retiring: list[_Entry] = []
        self._reported: set[str] = set()

    def _new(self, total: int) -> _Entry:
        shape = (total, 2, self.layout.kv_heads, self.layout.head_dim)
        return _Entry([torch.empty(shape, dtype=c.dtype, pin_memory=self.pin) for c in self.caches.values()])

    # ---- saves ---------------------------------------------------------------------------------

    def save(self, key: str, slots: torch.Tensor, start: int, total: int) -> None:
        """Enqueue the copy of positions ``[start, start + len(slots))`` (at ``slots`` in the paged
        caches) into entry ``key`` of ``total`` positions; returns at once."""
        entry = self.entries.get(key)
        if entry is None:
            if start != 0:
                raise RuntimeError(f"entry {key!r} was dropped before its first positions were saved")
            entry = self.entries[key] = self._new(total)
        end = start + int(slots.numel())
        if start != entry.saved or end > total:
            raise RuntimeError(f"entry {key!r}: positions [{start}, {end}) after {entry.saved} of {total}")
        self.streams.after_compute("save")
        keep: list[torch.Tensor] = []
        with self.streams.on("save"):
            for layer, cache in enumerate(self.caches.values()):
                rows = self.layout.gather(cache, slots)
                entry.rows[layer][start:end].copy_(rows, non_blocking=True)
                keep.append(rows)
        event = self.streams.record("save")
        self.streams.compute_waits(event)  # NOTE: later writes to these blocks wait for the save
        entry.pending.append((event, keep))
        entry.saved = end

    def poll(self) -> list[str]:
        """Entries newly complete (every position saved and every save event done); frees retired
        entries whose copies finished. Never waits."""
        out = []
        for key, entry in self.entries.items():
            entry.pending = [(e, k) for e, k in entry.pending if not self.streams.done(e)]
            if not entry.pending and entry.saved == entry.rows[0].shape[0] and key not in self._reported:
                self._reported.add(key)
                out.append(key)
        self.retiring = [r for r in self.retiring if any(not self.streams.done(e) for e, _ in r.pending)]
        return out

    def drop(self, key: str) -> None:
        """Forget ``key``; with copies in flight its memory is kept until they complete."""
        entry = self.entries.pop(key, None)
        self._reported.discard(key)
        if entry is not None and entry.pending:
            self.retiring.append(entry)

    # ---- loads ---------------------------------------------------------------------------------

    def load(self, key: str, pieces: list[tuple[torch.Tensor, int, int]]) -> None:
        """Enqueue loads of entry ``key``: for each ``(recipient slots, donor start, shift)``, the
        donor rows ``[donor start, + len(slots))`` into ``slots``, keys re-rotated by ``shift``.
        Everything is checked before the first enqueue; the compute stream waits for the load."""
        entry = self.entries.get(key)
        if entry is None or key not in self._reported:
            raise RuntimeError(f"donor {key!r} is not complete in the store")
        limit = self._blocks * self.layout.block_size
        for slots, d0, shift in pieces:
            if d0 < 0 or d0 + slots.numel() > entry.rows[0].shape[0]:
                raise RuntimeError(f"donor {key!r} holds {entry.rows[0].shape[0]} positions")
            if shift and self.rope is None:
                raise RuntimeError("a shifted piece, and this model's RoPE cannot be re-rotated exactly")
            if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= limit):
                raise RuntimeError("recipient slots outside the cache")
        self.streams.after_compute("load")  # NOTE: after vLLM zeroed the recipient's new blocks
        with self.streams.on("load"):
            for layer, cache in enumerate(self.caches.values()):
                for slots, d0, shift in pieces:
                    rows = entry.rows[layer][d0 : d0 + slots.numel()]
                    kv = rows.to(cache.device, non_blocking=True, copy=True)  # NOTE: never the stored rows
                    if shift:
                        assert self.rope is not None
                        delta = torch.full((slots.numel(),), shift, dtype=torch.int64, device=cache.device)
                        kv[:, 0] = rerotate_keys(kv[:, 0], delta, self.rope)
                    self.layout.scatter(cache, slots, kv)
        self.streams.compute_waits(self.streams.record("load"))
