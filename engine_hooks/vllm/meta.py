"""What semgov's vLLM connector passes between its scheduler side and its worker side, each step.

Scheduler -> worker (:class:`StepPlan`, vLLM's connector metadata): donor KV to save from the
paged cache into the connector's store, approved KV to load from the store into a recipient's
blocks, and store entries to drop. Worker -> scheduler (:class:`WorkerReport`, vLLM's worker
metadata): what was loaded or failed, store entries whose every position is now saved (a donor
is registered only then), saves that failed, and, once, why the worker turned reuse off.

NOTE: plain values only (ints, strings, tuples): with a multi-process executor vLLM serializes
both; nothing here refers to a tensor or a vLLM object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass(frozen=True, slots=True)
class SaveOp:
    """Copy prompt positions ``[start, end)`` of a donor-to-be into store entry ``key`` (sized ``total``)."""

    key: str
    block_ids: tuple[int, ...]  # the request's blocks, in position order
    start: int
    end: int
    total: int
    label: str = ""  # the request's label in records (diagnostics only)


@dataclass(frozen=True, slots=True)
class LoadPiece:
    """Recipient positions ``[recipient_start, +length)`` from donor positions ``[donor_start, +length)``."""

    recipient_start: int
    donor_start: int
    length: int

    @property
    def shift(self) -> int:
        return self.recipient_start - self.donor_start


@dataclass(frozen=True, slots=True)
class LoadOp:
    """Load store entry ``key``'s approved positions into request ``req_id``'s blocks before its forward."""

    req_id: str
    key: str
    block_ids: tuple[int, ...]
    pieces: tuple[LoadPiece, ...]

    @property
    def tokens(self) -> int:
        return sum(p.length for p in self.pieces)


@dataclass
class StepPlan(KVConnectorMetadata):  # type: ignore[misc]  # vLLM is untyped here
    """One step's store work (vLLM's ``KVConnectorMetadata``): drops first, then loads, then saves."""

    loads: list[LoadOp] = field(default_factory=list)
    saves: list[SaveOp] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)


@dataclass
class WorkerReport(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """What the worker did with a step's plan: ``loaded`` (req_id -> tokens), ``failed`` (req_id ->
    why; vLLM recomputes those blocks), ``saved`` (store key -> how many workers report every
    position of the entry saved, its copies complete), ``save_failed`` (store key -> why) and
    ``reuse_off`` (set once, after ``register_kv_caches``: why this worker cannot reuse KV at all)."""

    loaded: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    save_failed: dict[str, str] = field(default_factory=dict)
    saved: dict[str, int] = field(default_factory=dict)
    reuse_off: str = ""

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        """Several workers' reports (tensor parallel): a load counts only if no worker failed it;
        ``saved`` counts add up (the scheduler waits for every worker's); any ``reuse_off`` is kept."""
        if not isinstance(other, WorkerReport):
            return self
        failed = {**self.failed, **other.failed}
        loaded = {r: n for r, n in {**self.loaded, **other.loaded}.items() if r not in failed}
        saved = {k: self.saved.get(k, 0) + other.saved.get(k, 0) for k in {**self.saved, **other.saved}}
        save_failed = {**self.save_failed, **other.save_failed}
        return WorkerReport(loaded, failed, save_failed, saved, self.reuse_off or other.reuse_off)

    def empty(self) -> bool:
        return not (self.loaded or self.failed or self.save_failed or self.saved or self.reuse_off)
