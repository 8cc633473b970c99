"""Facts first: typed code computes everything a policy needs, per candidate.

Signature validity, provenance payload checks, verified token spans and PII
findings are computed here, once, and put in the policy input document. Any
exception while computing a fact is recorded under ``facts.errors`` so that the
gates depending on it report ``error`` and the decision fails closed.
"""

from __future__ import annotations

import array as pyarray
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from semgov._internal.bindings import segments_sha256, text_sha256
from semgov._internal.deadline import Deadline
from semgov.facts.config import FactConfig
from semgov.facts.pii import PiiScanner
from semgov.facts.token_ids import TokenIds
from semgov.facts.tokens import (
    U32,
    KgramIndex,
    SegmentTable,
    anchor_k,
    find_spans,
    kgram_index,
    token_hash,
)
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import Keyring, verify_signature
from semgov.wire.models import (
    Candidate,
    CapturedRequest,
    Prompt,
    Provenance,
    ProvenancePayload,
    Segment,
    check_tiling,
)
from semgov.wire.policy_input import (
    CandidateFacts,
    DonorFacts,
    Facts,
    PiiFacts,
    PolicyInput,
    ProvenanceFacts,
    RequestFacts,
    SpanFacts,
    TokenFacts,
)
from semgov.wire.timefmt import rfc3339, unix_ns

K = TypeVar("K")
V = TypeVar("V")

# The reason a token fact error starts with when the donor was deliberately not compared.
NOT_COMPARED = "not compared:"


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A prompt's tokens as an array and its segment table."""

    tokens: U32
    segments: SegmentTable

    @classmethod
    def of(cls, prompt: Prompt) -> PreparedPrompt:
        # NOTE: the prompt's own read-only uint32 array: nothing is converted (a prompt built with
        # model_construct from a plain list, which no semgov path does, is converted here).
        ids = prompt.token_ids
        toks = ids.array if isinstance(ids, TokenIds) else TokenIds.from_list(list(ids)).array
        segs = SegmentTable.from_triples([(s.role, s.start, s.end) for s in prompt.segments])
        return cls(toks, segs)


def prompt_from_tokens(
    tokens: Sequence[int] | npt.NDArray[np.integer[Any]],
    text: str | None,
    segments: Sequence[tuple[str, int, int]],
) -> Prompt:
    """A :class:`Prompt` from an engine's integer token array (SGLang's ``array('q')``, a numpy
    array or a list), validated as a whole instead of id by id: the same prompt
    ``Prompt.model_validate`` builds, or the same refusal (:class:`ValueError`). The ids go into
    the prompt's uint32 array directly, never through a Python list.
    """
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif isinstance(tokens, pyarray.array) and tokens.typecode in "bBhHiIlLqQ":
        arr = np.frombuffer(tokens, dtype=np.dtype(tokens.typecode))
    else:
        arr = np.asarray(list(tokens), dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be a flat integer array, not {arr.dtype} of shape {arr.shape}")
    ids = TokenIds(arr)  # NOTE: refuses ids outside 0..2**32-1, copies the engine's buffer
    if text is not None and not isinstance(text, str):
        raise ValueError("text must be a string or None")
    segs = [Segment.model_validate({"role": r, "start": a, "end": b}) for r, a, b in segments]
    check_tiling(segs, len(ids))  # NOTE: the model's own check, as model_validate runs it
    return Prompt.model_construct(token_ids=ids, text=text, segments=segs)


@dataclass(frozen=True, slots=True)
class DonorDigest:
    """A donor prompt prepared once: its tokens and segment table, the hashes provenance binds, and
    its k-gram index for the span search (built on first use per k: at registration, see
    :meth:`semgov.decide.Evaluator.register_donor`)."""

    prepared: PreparedPrompt
    token_sha256: str
    segments_sha256: str
    text_sha256: str | None
    _indexes: dict[int, KgramIndex] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, prompt: Prompt) -> DonorDigest:
        prepared = PreparedPrompt.of(prompt)
        text = None if prompt.text is None else text_sha256(prompt.text)
        return cls(prepared, token_hash(prepared.tokens), segments_sha256(prompt.segments), text)

    def kgram_index(self, min_span: int) -> KgramIndex:
        """The donor's k-gram index for a span search with ``min_span``.

        NOTE: a pure function of the donor's tokens; two threads building it at once build the same
        one, and a dict store is atomic, so no lock is needed.
        """
        k = anchor_k(min_span)
        found = self._indexes.get(k)
        if found is None:
            found = self._indexes[k] = kgram_index(self.prepared.tokens, k)
        return found


class _ByIdentity(Generic[K, V]):
    """Values computed from a frozen model, by the model object, so one used many times is
    computed once.

    NOTE: keyed by identity, confirmed by a weak reference (a recycled ``id`` never hits), and
    sound because the models are frozen and nothing in semgov changes their lists or dicts after
    validation. A model parsed anew (``semgov check``) is simply computed anew. Thread-safe: an
    engine's registration thread fills it while its decision thread reads it.
    """

    def __init__(self, make: Callable[[K], V], size: int = 4096) -> None:
        self._make = make
        self._d: OrderedDict[int, tuple[weakref.ref[K], V]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, obj: K) -> V:
        key = id(obj)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None and hit[0]() is obj:
                self._d.move_to_end(key)
                return hit[1]
        value = self._make(obj)
        with self._lock:
            self._d[key] = (weakref.ref(obj), value)
            self._d.move_to_end(key)
            while len(self._d) > self._size:
                self._d.popitem(last=False)
        return value


def _payload_bytes(prov: Provenance) -> bytes:
    return canonicalize(prov.payload)


class _Lru:
    """A bounded map; oldest entries are dropped first. Thread-safe (an engine's registration
    thread fills the caches its decision thread reads)."""

    def __init__(self, size: int) -> None:
        self._d: OrderedDict[object, object] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: object) -> object | None:
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
            return v

    def put(self, key: object, value: object) -> None:
        with self._lock:
            self._d[key] = value
            if len(self._d) > self._size:
                self._d.popitem(last=False)


@dataclass
class FactContext:
    """What fact computation needs besides the request: trust, PII scanner, caches.

    The signature cache is keyed by everything that was verified (key id, public
    key, signature, canonical payload bytes), so a hit is exactly as good as a
    fresh verification.
    """

    keyring: Keyring
    pii_scanner: PiiScanner | None = None
    _sig_cache: _Lru = field(default_factory=lambda: _Lru(65536))
    _payload_cache: _Lru = field(default_factory=lambda: _Lru(65536))
    donors: _ByIdentity[Prompt, DonorDigest] = field(default_factory=lambda: _ByIdentity(DonorDigest.of))
    # NOTE: the canonical bytes of a provenance payload (what was signed), by envelope object: an
    # engine's registered donor is decided many times with the same envelope.
    messages: _ByIdentity[Provenance, bytes] = field(default_factory=lambda: _ByIdentity(_payload_bytes))


def _signature_ok(prov: Provenance, public_key: Ed25519PublicKey, message: bytes, ctx: FactContext) -> bool:
    """Whether ``prov.signature`` verifies over ``message`` with ``public_key``, cached by all four."""
    ck = (prov.key_id, id(public_key), prov.signature, message)
    cached = ctx._sig_cache.get(ck)
    if cached is None:
        cached = verify_signature(public_key, prov.signature, message)
        ctx._sig_cache.put(ck, cached)
    return bool(cached)


def verify_ahead(prov: Provenance, ctx: FactContext) -> bool:
    """Verify a donor's provenance signature before any decision needs it (an engine registering
    the donor), so that its first decision finds the result cached. Returns the result; False for
    a key the keyring does not hold. Verification is exactly the decision's own (same cache key)."""
    message = ctx.messages.get(prov)
    _parsed_payload(prov, message, ctx)  # NOTE: parsed ahead too, into the cache a decision reads
    trusted = ctx.keyring.get(prov.key_id)
    return trusted is not None and _signature_ok(prov, trusted.public_key, message, ctx)


def _parsed_payload(
    prov: Provenance, message: bytes, ctx: FactContext
) -> tuple[ProvenancePayload, DonorFacts] | str:
    """The payload parsed and what it claims of the donor, or why it does not parse (``loc: msg``);
    cached by the payload's canonical bytes, so a donor decided many times is parsed once."""
    parsed = ctx._payload_cache.get(message)
    if parsed is None:
        try:
            valid = ProvenancePayload.model_validate(prov.payload)
            parsed = (valid, _donor_facts(valid))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            loc = ".".join(str(p) for p in err["loc"]) or "payload"
            parsed = f"{loc}: {err['msg']}"
        ctx._payload_cache.put(message, parsed)
    return parsed  # type: ignore[return-value]


def provenance_facts(
    prov: Provenance, ctx: FactContext, *, donor_id: str, digest: DonorDigest
) -> tuple[ProvenanceFacts, ProvenancePayload | None]:
    """The provenance facts of ``prov`` offered as donor ``donor_id`` with the prompt of ``digest``
    (``DonorDigest.of(prompt)``), and the payload when it parsed.

    NOTE: the one provenance verifier: a decision's provenance gate and ``semgov provenance verify``
    both call it (key status, signature over the RFC 8785 payload, payload schema, bindings)."""
    trusted = ctx.keyring.get(prov.key_id)
    key_status: Literal["trusted", "unknown", "revoked"] = (
        "unknown" if trusted is None else ("revoked" if trusted.revoked else "trusted")
    )
    message = ctx.messages.get(prov)
    sig_ok = trusted is not None and _signature_ok(prov, trusted.public_key, message, ctx)
    parsed = _parsed_payload(prov, message, ctx)
    payload = parsed[0] if isinstance(parsed, tuple) else None
    facts = ProvenanceFacts(
        key_status=key_status,
        signature_valid=sig_ok,
        payload_valid=payload is not None,
        payload_error=None if payload is not None else str(parsed),
        donor_id_matches=payload is not None and payload.donor_id == donor_id,
        token_hash_matches=payload is not None and payload.token_ids_sha256 == digest.token_sha256,
        segments_hash_matches=payload is not None and payload.segments_sha256 == digest.segments_sha256,
        text_hash_matches=payload is not None and _text_bound(digest.text_sha256, payload),
    )
    return facts, payload


def _provenance_facts(
    cand: Candidate, digest: DonorDigest, ctx: FactContext
) -> tuple[ProvenanceFacts, ProvenancePayload | None, DonorFacts | None]:
    """The provenance facts, and the payload and what it claims of the donor when it parsed."""
    facts, payload = provenance_facts(cand.provenance, ctx, donor_id=cand.donor_id, digest=digest)
    if payload is None:
        return facts, None, None
    parsed = _parsed_payload(cand.provenance, ctx.messages.get(cand.provenance), ctx)
    assert isinstance(parsed, tuple)  # NOTE: cached: the same parse provenance_facts just made
    return facts, payload, parsed[1]


def _text_bound(text_digest: str | None, p: ProvenancePayload) -> bool:
    """No text, or exactly the text the producer signed (an unsigned text is not the donor's)."""
    return text_digest is None or (p.text_sha256 is not None and text_digest == p.text_sha256)


def _donor_facts(p: ProvenancePayload) -> DonorFacts:
    return DonorFacts(
        tenant=p.tenant,
        namespace=p.namespace,
        task=p.task,
        response_contract=p.response_contract,
        created_at=rfc3339(p.created_at),
        expires_at=rfc3339(p.expires_at),
        created_at_ns=unix_ns(p.created_at),
        expires_at_ns=unix_ns(p.expires_at),
        policy_version=p.policy_version,
        visibility=p.visibility,
    )


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class CrossTenantNotCompared(Exception):
    """Token facts deliberately not computed for another tenant's private donor."""


def _pii_facts(
    cand: Candidate,
    digest: DonorDigest,
    payload: ProvenancePayload | None,
    config: FactConfig,
    ctx: FactContext,
) -> PiiFacts:
    """What provenance says of the donor's PII, and what scanning its text (when present) finds."""
    text_entities: frozenset[str] = frozenset()
    text_scanned = False
    text = cand.prompt.text
    if config.scan_donor_text and text is not None:
        if ctx.pii_scanner is None:
            raise RuntimeError("donor text present but no PII scanner configured")
        text_entities = ctx.pii_scanner.scan(
            text,
            donor_token_hash=digest.token_sha256,
            min_score=config.pii_min_score,
            phone_regions=config.phone_regions,
            entities=config.pii_entities,
        )
        # NOTE: a scan vouches for the donor only if the text scanned is the signed one and
        # not empty (an unsigned or empty text can add findings, never count as a scan).
        nonempty = text.strip() != "" or digest.prepared.tokens.size == 0
        text_scanned = payload is not None and _text_bound(digest.text_sha256, payload) and nonempty
    return PiiFacts(
        provenance_scanned=payload.pii.scanned if payload else False,
        provenance_entities=sorted(payload.pii.entities) if payload else [],
        text_scanned=text_scanned,
        text_entities=sorted(text_entities),
    )


def _token_facts(
    req: CapturedRequest,
    recipient: PreparedPrompt,
    digest: DonorDigest,
    payload: ProvenancePayload | None,
    config: FactConfig,
    deadline: Deadline | None,
) -> TokenFacts:
    """The token-identical spans between recipient and donor (raises CrossTenantNotCompared)."""
    donor = digest.prepared
    # NOTE: side channel: the span search costs more or less depending on how much of the
    # donor matches the recipient, so comparing another tenant's donor would let a caller
    # time its way to that tenant's content. A donor whose provenance names another tenant
    # and is not public is never compared: the tenant gate fails for it regardless, and
    # the token gate then errors with this reason (cross-tenant reuse needs a public donor).
    if payload is not None and payload.tenant != req.tenant and payload.visibility != "public":
        raise CrossTenantNotCompared(
            f"{NOT_COMPARED} the donor's provenance names another tenant and is not public"
        )
    lcp, spans = find_spans(
        recipient.tokens,
        recipient.segments,
        donor.tokens,
        donor.segments,
        min_span=config.min_span_tokens,
        deadline=deadline,
        donor_index=digest.kgram_index(config.min_span_tokens),
    )
    return TokenFacts(
        recipient_length=len(recipient.tokens),
        donor_length=len(donor.tokens),
        common_prefix=lcp,
        spans=[
            SpanFacts(
                recipient_start=s.recipient_start,
                donor_start=s.donor_start,
                length=s.length,
                kind=s.kind,
                recipient_role=s.recipient_role,
                donor_role=s.donor_role,
            )
            for s in spans
        ],
    )


def compute_facts(
    req: CapturedRequest,
    recipient: PreparedPrompt,
    cand: Candidate,
    *,
    config: FactConfig,
    ctx: FactContext,
    now: datetime,
    deadline: Deadline | None = None,
) -> PolicyInput:
    """Build the policy input document for one candidate. Never raises for bad data.

    A ``deadline`` is passed to the span search, which stops (a token error) once it has passed.
    """
    errors: dict[str, str] = {}
    prov_facts = donor_facts = pii_facts = tok_facts = None
    payload: ProvenancePayload | None = None
    digest: DonorDigest | None = None
    try:
        digest = ctx.donors.get(cand.prompt)
    except Exception as e:  # noqa: BLE001 - fail closed on anything
        errors["provenance"] = errors["tokens"] = errors["pii"] = f"donor prompt: {_error(e)}"
    if digest is not None:
        try:
            prov_facts, payload, donor_facts = _provenance_facts(cand, digest, ctx)
        except Exception as e:  # noqa: BLE001
            errors["provenance"] = _error(e)
        try:
            pii_facts = _pii_facts(cand, digest, payload, config, ctx)
        except Exception as e:  # noqa: BLE001
            errors["pii"] = _error(e)
        try:
            tok_facts = _token_facts(req, recipient, digest, payload, config, deadline)
        except CrossTenantNotCompared as e:
            errors["tokens"] = str(e)
        except Exception as e:  # noqa: BLE001
            errors["tokens"] = _error(e)

    return PolicyInput(
        now=rfc3339(now),
        now_ns=unix_ns(now),
        request=RequestFacts(
            request_id=req.request_id,
            tenant=req.tenant,
            namespace=req.namespace,
            task=req.task,
            response_contract=req.response_contract,
            prompt_tokens=len(req.prompt.token_ids),
        ),
        candidate=CandidateFacts(
            donor_id=cand.donor_id,
            similarity=cand.similarity,
            prompt_tokens=len(cand.prompt.token_ids),
            key_id=cand.provenance.key_id,
            has_text=cand.prompt.text is not None,
        ),
        facts=Facts(provenance=prov_facts, donor=donor_facts, pii=pii_facts, tokens=tok_facts, errors=errors),
    )
