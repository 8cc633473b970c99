"""Who a request belongs to: the semgov request context, and the cache keys derived from it.

The token format, its minting (:func:`make_context_token`, what the gateway writes) and its one
verifier (:func:`parse_context_token`) live in the core package so that ``semgov gateway`` works
from an installed package; the engine adapters import them from here.

SGLang has no authenticated per-request metadata. The hook therefore reads the request's
context (tenant, namespace, task, response contract, optional prompt segments) from a token
that a trusted gateway in front of SGLang writes into the request's ``extra_key`` field, and
that the hook verifies with a shared HMAC key:

    semgov1.<base64url(RFC 8785 JSON of the context)>.<base64url(HMAC-SHA256(key, "semgov1." + payload))>

base64url is unpadded and canonical (the MAC is exactly 43 characters). Besides the context the
payload carries three claims, all required: ``kid`` (:func:`key_id` of the key that MACs it),
``aud`` (the deployment the gateway meant: ``SEMGOV_CONTEXT_AUDIENCE``) and ``exp`` (integer Unix
seconds). A token is refused at or after ``exp``, and when ``exp`` lies further ahead than the
verifier's maximum lifetime. Every component that reads a token verifies it with
:func:`parse_context_token` and one :class:`ContextKeys` (the current key, during a rotation the
previous one, the audience and the lifetime bound): one verifier, one key set, one result. SGLang appends the
request's LoRA id to ``extra_key`` (``extra_key = (extra_key or "") + lora_id`` in
``Req.__init__``); the LoRA id the hook trusts is the server-side ``req.lora_id`` (an adapter
SGLang resolved), never text the client sent. The token is valid only if ``extra_key`` is
exactly the token (no adapter) or the token followed by ``lora_id``: anything else after the
MAC is refused.

The hook then replaces ``req.extra_key`` with a key derived server-side
(:meth:`RequestContext.cache_key`): an HMAC, under the domain tag ``tree``, of an unambiguous
length-prefixed encoding of tenant, namespace, LoRA id and the request's ``cache_salt``. The
candidate scope (:meth:`RequestContext.scope`) is the same under the tag ``scope``. Two
tenants, namespaces, adapters or cache salts therefore never share a node of SGLang's
exact-prefix tree or a candidate scope, whatever the caller sent, and a caller cannot name
another tenant's key without the secret. A request without a valid token is served normally
(exact-prefix reuse among requests that sent the same ``extra_key``, adapter and salt:
:func:`anonymous_cache_key`) but never gets semantic reuse and never becomes a donor.

A token may also carry a ``calibration`` claim (:class:`CalibrationClaim`): the request belongs to
one pair of a ``semgov calibrate`` run against this server, and its namespace must be that run's
(``<namespace>/semgov-calibration/<run>``: :func:`calibration_namespace`); a namespace holding
that mark without the claim is refused. The run's own namespace keeps its donors out of every
production scope, and the engine adapters give each role its treatment (docs/policy.md
"Turning semantic reuse on").

The parser is total: for any Python objects it returns a context or raises
:class:`ContextError`; the key derivations never raise. Everything here is pure (no I/O): the
key is passed in.
"""

# NOTE: long module: one credential, one verifier: the token's format, its claims (the calibration
# claim included), its minting and its parsing change together and are reviewed together.

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from semgov.signing.canonical import canonicalize, canonicalize_record
from semgov.wire.models import ResponseContract, Segment, TaskRef

TOKEN_PREFIX = "semgov1."
_MAC_CHARS = 43  # base64url of 32 bytes, unpadded
MAX_TOKEN_CHARS = 16384
MAX_LORA_ID_CHARS = 256  # SGLang's LoRA ids are 32-character uuid hex strings
KEY_PREFIX = "semgov:"
ANON_KEY_PREFIX = KEY_PREFIX + "anon:"
_KEY_HEX_CHARS = 32
_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_FIELDS = frozenset({"tenant", "namespace", "task", "response_contract", "segments", "calibration"})
_CLAIMS = frozenset({"aud", "exp", "kid"})
_KID_CHARS = 16
MAX_PREVIOUS_KEYS = 2
_LORA_MISMATCH = "trailing characters after the MAC do not match the request's LoRA adapter"


class ContextError(ValueError):
    """A context token that cannot be trusted (malformed, wrong MAC, bad fields).

    ``kind`` is a bounded label for metrics: ``malformed``, ``mac``, ``key_id``, ``audience``,
    ``expired`` or ``lifetime``."""

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ContextKeys:
    """Everything a verifier of context tokens needs: one set, shared by every component.

    ``current`` MACs new tokens and is the only key scopes and tree keys are derived from;
    ``previous`` (at most :data:`MAX_PREVIOUS_KEYS`) still verifies tokens during a rotation's
    grace period; ``audience`` is this deployment's name; ``max_lifetime_s`` bounds how far ahead
    a token's ``exp`` may lie."""

    current: bytes
    audience: str
    previous: tuple[bytes, ...] = ()
    max_lifetime_s: int = 3600


CALIBRATION_ROLES = ("donor", "cold", "recipient", "release")
# NOTE: the namespace space a calibration run decides in: ``<namespace>/semgov-calibration/<run>``.
# A context carries a calibration claim if and only if its namespace is that of the claim's run, so
# calibration donors and production requests never share a scope, whatever the token's minter sent.
CALIBRATION_MARK = "/semgov-calibration/"
_RUN = re.compile(r"[A-Za-z0-9_-]{1,48}")
_PLAN = re.compile(r"[a-z]{1,16}(?::[0-9+%]{1,24})?")


@dataclass(frozen=True, slots=True)
class CalibrationClaim:
    """What a ``semgov calibrate`` request is (the token's optional ``calibration`` member).

    ``run``: the id of one measured pair's scope (``[A-Za-z0-9_-]``, at most 48); ``role``: the
    ``donor`` (registered as usual, in the run's namespace), the recipient run ``cold`` (no reuse,
    an exact-prefix key of its own, never a donor), the ``recipient`` decided with the live policy
    plus one quality rule turning shifted reuse on with ``plan`` (a realization plan, e.g.
    ``bookend:16+256``; recipients only), and ``release`` (the run's donors are dropped)."""

    run: str
    role: str
    plan: str | None = None


def calibration_namespace(namespace: str, run: str) -> str:
    """The namespace a calibration run's requests claim: ``<namespace>/semgov-calibration/<run>``."""
    return f"{namespace}{CALIBRATION_MARK}{run}"


def _calibration(raw: object, namespace: str) -> CalibrationClaim:
    """The ``calibration`` member, checked against the context's namespace (raises ContextError)."""
    if type(raw) is not dict or not {"run", "role"} <= set(raw) or not set(raw) <= {"run", "role", "plan"}:
        raise ContextError("context calibration must be an object {run, role[, plan]}")
    run, role, plan = raw["run"], raw["role"], raw.get("plan")
    if type(run) is not str or not _RUN.fullmatch(run):
        raise ContextError("context calibration.run must be 1..48 characters of A-Z a-z 0-9 _ -")
    if type(role) is not str or role not in CALIBRATION_ROLES:
        raise ContextError(f"context calibration.role must be one of {', '.join(CALIBRATION_ROLES)}")
    if (role == "recipient") != ("plan" in raw):
        raise ContextError("context calibration.plan is given for the recipient role, and only for it")
    if plan is not None and (type(plan) is not str or not _PLAN.fullmatch(plan)):
        raise ContextError("context calibration.plan is not a realization plan (e.g. bookend:16+256)")
    if not namespace.endswith(CALIBRATION_MARK + run) or namespace == CALIBRATION_MARK + run:
        raise ContextError(
            f"context namespace of a calibration run must be <namespace>{CALIBRATION_MARK}<run>"
        )
    return CalibrationClaim(run, role, plan)


def key_id(key: bytes) -> str:
    """The ``kid`` of a context key: 16 base64url characters of SHA-256 over a domain tag and the key."""
    return _b64e(hashlib.sha256(b"semgov.context-key-id/v1\x00" + bytes(key)).digest()[:12])


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    if not text or not _B64URL.issuperset(text):
        raise ContextError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise ContextError(f"not base64url ({e})") from e


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _exact_str(value: object) -> str | None:
    """An exact ``str`` copy of a str (subclasses included), else None.

    The real type is tested, not ``isinstance``: an object can claim ``__class__ = str``. The copy
    cannot override anything read from it (``__len__``, ``startswith``, ``encode`` ...).
    """
    if not issubclass(type(value), str):
        return None
    return str.__str__(cast(str, value))


# ---- derived keys ----------------------------------------------------------------------------------


def _describe(value: object) -> bytes:
    """Bytes standing for a value that is neither str nor None: its type and repr (never raises)."""
    try:
        t = type(value)
        name = str.encode(f"{t.__module__}.{t.__qualname__}", "utf-8", "surrogatepass")
    except Exception:  # noqa: BLE001 - a hostile metaclass: still a fixed description
        name = b"?"
    try:
        if issubclass(type(value), bytes | bytearray):
            body = b"b" + memoryview(cast(bytes, value)).tobytes()  # the buffer: no __bytes__ override
        else:
            body = b"r" + str.encode(repr(value), "utf-8", "surrogatepass")
    except Exception:  # noqa: BLE001 - a repr that raises or recurses: one fixed description
        body = b"?"
    return len(name).to_bytes(8, "big") + name + body


def _field(value: object) -> bytes:
    """One self-delimiting field: a type tag, an 8-byte length, the bytes (an injective encoding)."""
    text = _exact_str(value)
    if value is None:
        tag, body = b"n", b""
    elif text is not None:
        # surrogatepass keeps every Python str encodable (lone surrogates too), and UTF-8 so
        # extended is still injective.
        tag, body = b"s", text.encode("utf-8", "surrogatepass")
    else:
        tag, body = b"o", _describe(value)
    return tag + len(body).to_bytes(8, "big") + body


def _salt(cache_salt: object) -> object:
    """SGLang's ``cache_salt`` with None and "" both meaning no salt (as ``Req.__init__`` does)."""
    return None if _exact_str(cache_salt) == "" else cache_salt


def _derive(key: bytes, domain: str, *fields: object) -> str:
    msg = b"semgov.derived-key/v2" + b"".join(_field(f) for f in (domain, *fields))
    return _mac(key, msg).hex()[:_KEY_HEX_CHARS]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The verified context of one request (what semgov decides over besides the prompt)."""

    tenant: str
    namespace: str
    task: dict[str, str]
    response_contract: dict[str, str]
    segments: tuple[tuple[str, int, int], ...] | None
    lora_id: str | None  # the request's LoRA adapter (server-side ``req.lora_id``), None without one
    calibration: CalibrationClaim | None = None  # a ``semgov calibrate`` request (its namespace is the run's)

    def scope(self, key: bytes, cache_salt: str | None = None) -> str:
        """Isolation scope of semantic candidates: tenant, namespace, LoRA id and cache salt, keyed.

        KV computed under one adapter or cache salt is never a candidate for a request served
        under another. Never raises.
        """
        return KEY_PREFIX + _derive(
            key, "scope", self.tenant, self.namespace, self.lora_id, _salt(cache_salt)
        )

    def cache_key(self, key: bytes, cache_salt: str | None = None) -> str:
        """The ``extra_key`` of the request's exact-prefix tree: tenant, namespace, LoRA id, salt, keyed.

        Never raises.
        """
        return KEY_PREFIX + _derive(key, "tree", self.tenant, self.namespace, self.lora_id, _salt(cache_salt))


def anonymous_cache_key(
    key: bytes, extra_key: object, lora_id: object = None, cache_salt: object = None
) -> str:
    """The derived ``extra_key`` of a request without a valid context (isolated by what it sent).

    Distinct ``(extra_key, lora_id, cache_salt)`` give distinct keys (None and "" are distinct
    for ``extra_key`` and ``lora_id``; for ``cache_salt`` both mean no salt). Any str, lone
    surrogates included, and any other object are accepted: never raises.
    """
    return ANON_KEY_PREFIX + _derive(key, "anon", extra_key, lora_id, _salt(cache_salt))


def has_token_prefix(value: object) -> bool:
    """Whether ``value`` is a str that starts like a context token (never raises)."""
    text = _exact_str(value)
    return text is not None and text.startswith(TOKEN_PREFIX)


def bounded_repr(value: object, limit: int = 64) -> str:
    """A short, ASCII description of a client-sent value for a log line (never raises)."""
    try:
        text = _exact_str(value)
        if text is not None:
            shown = ascii(text[:limit])  # escapes can make it up to 10x longer: cut again
            if len(text) <= limit and len(shown) <= limit + 2:
                return shown
            return f"{shown[: limit + 1]}... ({len(text)} characters)"
        if value is None:
            return "None"
        return f"<{str(type(value).__name__)[:limit]}>"
    except Exception:  # noqa: BLE001 - a log line must never fail
        return "<unrepresentable>"


# ---- tokens ----------------------------------------------------------------------------------------


def make_context_token(
    key: bytes,
    *,
    audience: str,
    tenant: str,
    namespace: str,
    task: dict[str, str],
    response_contract: dict[str, str],
    segments: list[tuple[str, int, int]] | None = None,
    expires_at: int | None = None,
    lifetime_s: int = 300,
    now: float | None = None,
    calibration: CalibrationClaim | None = None,
) -> str:
    """What a gateway writes into ``extra_key`` (raises :class:`ContextError` on bad fields).

    The token expires at ``expires_at`` (integer Unix seconds), by default ``lifetime_s`` after
    ``now`` (the clock when None). With ``calibration``, ``namespace`` must be the run's
    (:func:`calibration_namespace`)."""
    doc: dict[str, Any] = {
        "tenant": tenant,
        "namespace": namespace,
        "task": dict(task),
        "response_contract": dict(response_contract),
    }
    if segments is not None:
        doc["segments"] = [list(s) for s in segments]
    if calibration is not None:
        doc["calibration"] = {"run": calibration.run, "role": calibration.role}
        if calibration.plan is not None:
            doc["calibration"]["plan"] = calibration.plan
    _validate(doc, None)
    exp = expires_at if expires_at is not None else int(time.time() if now is None else now) + lifetime_s
    doc.update({"aud": audience, "kid": key_id(key), "exp": exp})
    _check_claim_types(doc)
    try:
        payload = _b64e(canonicalize(doc))
    except (ValueError, TypeError, RecursionError) as e:
        raise ContextError(f"context has no RFC 8785 form ({type(e).__name__})") from e
    token = TOKEN_PREFIX + payload + "." + _b64e(_mac(key, (TOKEN_PREFIX + payload).encode("ascii")))
    if len(token) > MAX_TOKEN_CHARS:
        raise ContextError(f"context token longer than {MAX_TOKEN_CHARS} characters")
    return token


def _check_claim_types(doc: dict[str, Any]) -> None:
    """``aud``, ``kid`` and ``exp`` are present and well-typed (raises :class:`ContextError`)."""
    missing = sorted(_CLAIMS - set(doc))
    if missing:
        raise ContextError(f"context token lacks the claim(s) {', '.join(missing)} (tokens must expire, "
                           "name their audience and their key id)")  # fmt: skip
    if not _ident(doc["aud"]):
        raise ContextError("context aud must be 1..128 printable ASCII characters without spaces")
    kid = doc["kid"]
    if type(kid) is not str or len(kid) != _KID_CHARS or not _B64URL.issuperset(kid):
        raise ContextError(f"context kid must be {_KID_CHARS} base64url characters")
    exp = doc["exp"]
    if type(exp) is not int or not 0 < exp <= _MAX_SAFE_INT:
        raise ContextError("context exp must be a positive integer (Unix seconds)")


def _plain_claims(doc: Any) -> bool:
    """Whether ``doc`` is an object whose claims are present and well-typed (never raises)."""
    if type(doc) is not dict:
        return False
    try:
        _check_claim_types(doc)
    except ContextError:
        return False
    return True


def _check_claims(doc: dict[str, Any], keys: ContextKeys, used: bytes, now: float) -> None:
    """The claims against this verifier: the signing key's id, this audience, not expired, a lifetime
    within the bound. Time is rounded toward refusal: a token is dead at ``exp`` itself."""
    _check_claim_types(doc)
    if not hmac.compare_digest(doc["kid"].encode("ascii"), key_id(used).encode("ascii")):
        raise ContextError("context kid does not name the key that MACed the token", "key_id")
    if doc["aud"] != keys.audience:
        raise ContextError(
            f"context token is for audience {bounded_repr(doc['aud'], 40)}, not this deployment's", "audience"
        )
    if now >= doc["exp"]:
        raise ContextError(f"context token expired {int(now - doc['exp'])} s ago", "expired")
    if doc["exp"] - now > keys.max_lifetime_s:
        raise ContextError(
            f"context token expires {int(doc['exp'] - now)} s from now, beyond this verifier's "
            f"{keys.max_lifetime_s} s (SEMGOV_CONTEXT_MAX_LIFETIME_S)",
            "lifetime",
        )


_M = TypeVar("_M", bound=BaseModel)


def _model(cls: type[_M], value: Any, where: str) -> _M:
    try:
        return cls.model_validate(value)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join([where, *map(str, err["loc"])])[:80]
        raise ContextError(f"context {loc}: {str(err['msg'])[:160]}") from e


_ROLES = frozenset({"system", "instruction", "evidence", "question", "other"})
_MAX_SAFE_INT = 2**53 - 1
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _ident(v: object) -> bool:
    """A tenant or namespace: 1..128 printable ASCII characters without spaces."""
    return isinstance(v, str) and 1 <= len(v) <= 128 and all("!" <= c <= "~" for c in v)


def _id(v: object) -> bool:
    """The wire types' ``Id`` (1..512 characters), ASCII only here: anything else (a lone surrogate,
    which the model refuses, included) is left to the models."""
    return type(v) is str and 1 <= len(v) <= 512 and v.isascii()


def _valid_fast(doc: Any, lora_id: str | None) -> RequestContext | None:
    """The context of a plainly valid document (JSON types, as ``json.loads`` gives them; integers
    below 2**53, ASCII text), else None.

    NOTE: sound, not complete: it accepts only documents :func:`_validate_models` accepts, and
    returns exactly what it returns (each check below is the model's own rule, in strict mode);
    anything else (every invalid document, and valid ones it does not recognise, such as non-ASCII
    ids) goes to the models, which say why. A property test holds the two to the same answers.
    It runs on the scheduler thread at each request's first match, where the models cost more.
    """
    if type(doc) is not dict or not _FIELDS.issuperset(doc):
        return None
    task, contract = doc.get("task"), doc.get("response_contract")
    if not (_ident(doc.get("tenant")) and _ident(doc.get("namespace"))):
        return None
    if type(task) is not dict or len(task) != 2 or not (_id(task.get("id")) and _id(task.get("version"))):
        return None
    if type(contract) is not dict or len(contract) != 2 or not _id(contract.get("id")):
        return None
    digest = contract.get("schema_sha256")
    if type(digest) is not str or not _HEX64.fullmatch(digest):
        return None
    segments: tuple[tuple[str, int, int], ...] | None = None
    if "segments" in doc:
        raw = doc["segments"]
        if type(raw) is not list or not raw:
            return None
        parsed: list[tuple[str, int, int]] = []
        end = 0
        for s in raw:
            if type(s) is not list or len(s) != 3:
                return None
            role, a, b = s
            if type(role) is not str or role not in _ROLES or type(a) is not int or type(b) is not int:
                return None
            if b > _MAX_SAFE_INT:  # NOTE: (a < b) beyond it the payload has no RFC 8785 form anyway
                return None
            if a != end or b <= a:
                return None
            parsed.append((role, a, b))
            end = b
        segments = tuple(parsed)
    calibration: CalibrationClaim | None = None
    if "calibration" in doc:
        try:
            calibration = _calibration(doc["calibration"], doc["namespace"])
        except ContextError:
            return None
    elif CALIBRATION_MARK in doc["namespace"]:
        return None
    return RequestContext(
        tenant=doc["tenant"],
        namespace=doc["namespace"],
        task={"id": task["id"], "version": task["version"]},
        response_contract={"id": contract["id"], "schema_sha256": digest},
        segments=segments,
        lora_id=lora_id,
        calibration=calibration,
    )


def _validate(doc: Any, lora_id: str | None) -> RequestContext:
    fast = _valid_fast(doc, lora_id)
    return fast if fast is not None else _validate_models(doc, lora_id)


def _validate_models(doc: Any, lora_id: str | None) -> RequestContext:
    """The document validated field by field with the wire models (every refusal says why)."""
    if not isinstance(doc, dict):
        raise ContextError("context is not a JSON object")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        names = ", ".join(bounded_repr(k, 40) for k in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise ContextError(f"unknown context field(s): {names}{more}")
    for name in ("tenant", "namespace"):
        v = doc.get(name)
        # Same id rules as the wire types: printable ASCII without spaces, 1..128 characters.
        if not isinstance(v, str) or not (1 <= len(v) <= 128) or not all("!" <= c <= "~" for c in v):
            raise ContextError(f"context {name} must be 1..128 printable ASCII characters without spaces")
    task = _model(TaskRef, doc.get("task"), "task")
    contract = _model(ResponseContract, doc.get("response_contract"), "response_contract")
    segments: tuple[tuple[str, int, int], ...] | None = None
    if "segments" in doc:  # absent means no segments; null or [] is not another spelling of that
        segs_raw = doc["segments"]
        if not isinstance(segs_raw, list) or not segs_raw:
            raise ContextError("context segments must be a non-empty list of [role, start, end]")
        parsed: list[tuple[str, int, int]] = []
        for i, s in enumerate(segs_raw):
            if not isinstance(s, list) or len(s) != 3:
                raise ContextError(f"context segments[{i}] is not [role, start, end]")
            seg = _model(Segment, {"role": s[0], "start": s[1], "end": s[2]}, f"segments[{i}]")
            expected = parsed[-1][2] if parsed else 0
            if seg.start != expected or seg.end <= seg.start:
                raise ContextError(
                    f"context segments[{i}] is [{seg.start}, {seg.end}), expected to start at {expected} "
                    "and be non-empty: segments must tile the prompt in order"
                )
            parsed.append((seg.role, seg.start, seg.end))
        segments = tuple(parsed)
    calibration: CalibrationClaim | None = None
    if "calibration" in doc:
        calibration = _calibration(doc["calibration"], doc["namespace"])
    elif CALIBRATION_MARK in doc["namespace"]:
        raise ContextError(
            f"context namespace holds {CALIBRATION_MARK!r}, reserved for calibration runs, without a "
            "calibration claim"
        )
    return RequestContext(
        tenant=doc["tenant"],
        namespace=doc["namespace"],
        task=task.model_dump(),
        response_contract=contract.model_dump(),
        segments=segments,
        lora_id=lora_id,
        calibration=calibration,
    )


def _verifying_key(keys: ContextKeys, signed: bytes, mac_text: str) -> bytes:
    """The key of ``keys`` whose MAC over ``signed`` is ``mac_text`` (raises :class:`ContextError`).

    NOTE: bounded: at most 1 + MAX_PREVIOUS_KEYS HMACs; each compared in constant time, and before
    anything the caller controls is parsed. The MAC's text is compared, so a non-canonical
    spelling of the same 32 bytes does not verify."""
    for key in (keys.current, *keys.previous[:MAX_PREVIOUS_KEYS]):
        if not issubclass(type(key), bytes | bytearray):
            raise ContextError("the context key is not bytes")
        expected = _b64e(_mac(key, signed))
        if hmac.compare_digest(mac_text.encode("ascii"), expected.encode("ascii")):
            return bytes(key)
    raise ContextError("context token MAC does not verify", "mac")


def parse_context_token(
    keys: ContextKeys, extra_key: object, *, lora_id: object = None, now: float | None = None
) -> RequestContext:
    """Verify and parse the context token in ``extra_key``, bound to the request's LoRA adapter.

    ``lora_id`` is the server-side ``req.lora_id`` (None without an adapter); ``extra_key`` must
    be exactly the token, or the token followed by ``lora_id``. ``now`` is the clock (Unix
    seconds; None: ``time.time()``). Raises :class:`ContextError` saying why the token is not
    trusted, and nothing else, whatever objects are passed.
    """
    if not isinstance(keys, ContextKeys):
        raise ContextError("the context keys are not a ContextKeys")
    text = _exact_str(extra_key)
    lora = _exact_str(lora_id)
    if text is None:
        if extra_key is None:
            raise ContextError("no semgov context token in extra_key")
        raise ContextError(f"extra_key is not a string ({bounded_repr(extra_key)})")
    if lora is None and lora_id is not None:
        raise ContextError(f"lora_id is not a string ({bounded_repr(lora_id)})")
    # Bound all work first: nothing below reads more than MAX_TOKEN_CHARS + MAX_LORA_ID_CHARS.
    if lora is not None and len(lora) > MAX_LORA_ID_CHARS:
        raise ContextError(f"LoRA id longer than {MAX_LORA_ID_CHARS} characters")
    if len(text) - len(lora or "") > MAX_TOKEN_CHARS:
        raise ContextError(f"context token longer than {MAX_TOKEN_CHARS} characters")
    if not text.startswith(TOKEN_PREFIX):
        raise ContextError("no semgov context token in extra_key")
    if lora:  # SGLang appended it: extra_key must be exactly token + lora_id
        if not text.endswith(lora):
            raise ContextError(_LORA_MISMATCH)
        text = text[: len(text) - len(lora)]
    body = text[len(TOKEN_PREFIX) :]
    dot = body.find(".")
    if dot < 0:
        raise ContextError("context token has no MAC")
    if dot == 0:
        raise ContextError("context token has an empty payload")
    payload, mac_text = body[:dot], body[dot + 1 :]
    if len(mac_text) < _MAC_CHARS:
        raise ContextError("context token MAC is truncated")
    if len(mac_text) > _MAC_CHARS:
        raise ContextError(_LORA_MISMATCH)
    if not _B64URL.issuperset(payload) or not _B64URL.issuperset(mac_text):
        raise ContextError("context token is not base64url")  # also every non-ASCII character
    used = _verifying_key(keys, (TOKEN_PREFIX + payload).encode("ascii"), mac_text)
    raw = _b64d(payload)
    if _b64e(raw) != payload:
        raise ContextError("context payload is not canonical base64url")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ContextError(f"context payload is not UTF-8 JSON ({type(e).__name__})") from e
    context = {k: v for k, v in doc.items() if k not in _CLAIMS} if type(doc) is dict else doc
    fast = _valid_fast(context, lora) if _plain_claims(doc) else None
    try:
        # NOTE: a document the fast path accepted, with plain claims, has ASCII keys and strings, no
        # floats and integers below 2**53: canonicalize_record's precondition, under which its bytes
        # are RFC 8785's.
        canonical = canonicalize_record(doc) if fast is not None else canonicalize(doc)
    except (ValueError, TypeError, RecursionError) as e:
        raise ContextError(f"context payload has no RFC 8785 form ({type(e).__name__})") from e
    if canonical != raw:
        raise ContextError("context payload is not RFC 8785 canonical JSON")
    if type(doc) is not dict:
        raise ContextError("context is not a JSON object")
    _check_claims(doc, keys, used, time.time() if now is None else float(now))
    return fast if fast is not None else _validate_models(context, lora)
