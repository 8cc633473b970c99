"""Capture at the edge: what the gateway forwarded, as ``semgov.captured_request/v1`` lines.

With ``--capture-dir``, a sampled share (``--capture-rate``) of the requests the engine answered
in full (a refused, failed or aborted request is never captured: nothing is half-recorded) is
written for ``semgov check`` and ``semgov diff``, with the hook's capture's caps (files rotated by
size, the directory bounded in size and in age: :class:`~semgov.intake.capture_writer.CaptureWriter`)
and its rule for text: no prompt text unless ``--capture-text`` (token ids still decode back to
the text: a capture is personal data).

Each captured request comes with candidates, as an engine would see donors: the last
``--capture-candidates`` captured requests of *every* tenant (so a replay also exercises the
tenant and namespace gates), each with its Jaccard similarity over token 8-grams and a
provenance the gateway signed when it captured that request (``--capture-provenance-key``;
named by the id the keyring ``--capture-keyring`` gives it). The provenance's PII record is the
scan of the captured text with the default policy's entity list when text is kept, and "not
scanned" otherwise (a policy that requires a scan then denies on replay: say so, never guess).

All of it runs on one daemon thread: the request path only samples and puts on a bounded queue
(:meth:`EdgeCapture.offer` never blocks and never raises; a full queue drops, counted).
"""

from __future__ import annotations

import queue
import random
import threading
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from semgov.intake.capture_writer import CaptureWriter
from semgov.log import describe_error, get_logger
from semgov.signing.keys import Keyring, SigningKey, load_signing_key
from semgov.signing.provenance import provenance_payload, sign_provenance
from semgov.wire.models import CAPTURED_REQUEST_SCHEMA, CapturedRequest, Prompt, Provenance

__all__ = ["CaptureConfig", "EdgeCapture", "Forwarded"]

SHINGLE = 8
# The default policy's forbidden PII entities (policies/default/policy.yaml), scanned when text is kept.
PII_ENTITIES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS")
PII_MIN_SCORE = 0.4


@dataclass(frozen=True)
class CaptureConfig:
    """``semgov gateway serve``'s capture settings."""

    directory: Path
    rate: float
    provenance_key: Path
    policy_version: str
    keyring: Path | None = None
    keep_text: bool = False
    candidates: int = 8
    donor_ttl_s: int = 86400
    max_mb: int = 64
    max_total_mb: int = 1024
    max_age_h: int = 168


@dataclass(frozen=True)
class Forwarded:
    """One request the engine answered in full: what the capture records."""

    request_id: str
    received_at: datetime
    tenant: str
    namespace: str
    task: dict[str, str]
    response_contract: dict[str, str]
    ids: list[int]
    segments: list[tuple[str, int, int]]
    text: str | None


@dataclass(frozen=True)
class _Donor:
    donor_id: str
    prompt: Prompt
    provenance: Provenance
    shingles: frozenset[int]


def shingles(ids: list[int]) -> frozenset[int]:
    """Hashes of the token ``SHINGLE``-grams of ``ids`` (the whole prompt when it is shorter)."""
    if len(ids) < SHINGLE:
        return frozenset({hash(tuple(ids))})
    return frozenset(hash(tuple(ids[i : i + SHINGLE])) for i in range(len(ids) - SHINGLE + 1))


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


class EdgeCapture:
    """The gateway's capture: sampling on the request path, everything else on its own thread."""

    def __init__(self, config: CaptureConfig, *, rng: random.Random | None = None) -> None:
        if not 0.0 < config.rate <= 1.0:
            raise ValueError(f"--capture-rate must be in (0, 1], got {config.rate}")
        keyring = Keyring.load(config.keyring) if config.keyring is not None else None
        self.key: SigningKey = load_signing_key(config.provenance_key, keyring)
        self.config = config
        self.writer = CaptureWriter(
            config.directory, max_file_bytes=config.max_mb << 20, keep_text=config.keep_text,
            max_total_bytes=config.max_total_mb << 20, max_age_s=config.max_age_h * 3600.0, prefix="gateway",
        )  # fmt: skip
        self._rng = rng or random.Random()
        self._queue: queue.Queue[Forwarded | None] = queue.Queue(maxsize=1024)
        self._ring: deque[_Donor] = deque(maxlen=max(0, config.candidates))
        self._scanner: Any = None
        self.offered = self.dropped = self.sampled_out = 0
        self._thread = threading.Thread(target=self._run, name="semgov-gateway-capture", daemon=True)
        self._thread.start()

    def offer(self, item: Forwarded) -> bool:
        """Sample ``item`` and queue it; never blocks, never raises."""
        try:
            self.offered += 1
            if self._rng.random() >= self.config.rate:
                self.sampled_out += 1
                return False
            self._queue.put_nowait(item)
            return True
        except Exception:  # noqa: BLE001 - a full queue (or anything else) drops, counted
            self.dropped += 1
            return False

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self.writer.close(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._capture(item)
            except Exception as e:  # noqa: BLE001 - one bad request must not stop the capture
                get_logger().warning(
                    "gateway capture failed", request_id=item.request_id, error=describe_error(e)
                )

    def _capture(self, item: Forwarded) -> None:
        text = item.text if self.config.keep_text else None
        segs = [{"role": r, "start": s, "end": e} for r, s, e in item.segments]
        prompt = Prompt.model_validate({"token_ids": item.ids, "text": text, "segments": segs})
        mine = shingles(item.ids)
        candidates = [
            {"donor_id": d.donor_id, "similarity": round(jaccard(mine, d.shingles), 6),
             "prompt": d.prompt, "provenance": d.provenance}
            for d in reversed(self._ring)
        ]  # fmt: skip
        request = CapturedRequest.model_validate(
            {
                "schema": CAPTURED_REQUEST_SCHEMA, "request_id": item.request_id,
                "received_at": item.received_at, "tenant": item.tenant, "namespace": item.namespace,
                "task": item.task,
                "response_contract": item.response_contract, "prompt": prompt, "candidates": candidates,
            }
        )  # fmt: skip
        self.writer.offer(request)
        if self._ring.maxlen:
            self._ring.append(_Donor(item.request_id, prompt, self._provenance(item, prompt), mine))

    def _provenance(self, item: Forwarded, prompt: Prompt) -> Provenance:
        found = self._scan(prompt.text, item.request_id)
        now = item.received_at  # NOTE: the donor exists from its request on; a later recipient sees it
        payload = provenance_payload(
            donor_id=item.request_id, tenant=item.tenant, namespace=item.namespace, task=item.task,
            response_contract=item.response_contract, created_at=now,
            expires_at=now + timedelta(seconds=self.config.donor_ttl_s),
            policy_version=self.config.policy_version,
            token_ids=prompt.token_ids, segments=prompt.segments, text=prompt.text,
            pii_entities=sorted(found) if found is not None else (), pii_scanned=found is not None,
        )  # fmt: skip
        return Provenance.model_validate(sign_provenance(payload, self.key))

    def _scan(self, text: str | None, label: str) -> frozenset[str] | None:
        """The default entities found in ``text``; None when there is no text or the scan failed."""
        if text is None:
            return None
        try:
            if self._scanner is None:
                from semgov.facts.pii import PiiScanner

                self._scanner = PiiScanner()
            found: frozenset[str] = self._scanner.scan(
                text, donor_token_hash=label, min_score=PII_MIN_SCORE, entities=PII_ENTITIES
            )
            return found
        except Exception as e:  # noqa: BLE001 - not scanned is recorded as such; a policy decides
            get_logger().warning("gateway capture PII scan failed", error=describe_error(e))
            return None
