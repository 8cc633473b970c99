"""Independent judges for the hostile-input campaign: is this input malformed or tampered?

Nothing here calls semgov. The judgements come from the published formats
(``schemas/*.schema.json``, ``docs/formats.md``, ``docs/policy.md``, ``audit/README.md``)
re-implemented with other code: a strict JSON reader (duplicate keys, NaN/Infinity, lone
surrogates, non-UTF-8 are problems), a small JSON Schema validator (the keywords the
checked-in schemas use), RFC 3339 with a zone, Ed25519 SPKI PEM parsed by hand, signatures
checked with ``cryptography`` over ``rfc8785.dumps`` (the reference canonicaliser), the token
hash with ``struct``, and C2SP signed notes split by hand.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import struct
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "schemas"


# ---- strict JSON ------------------------------------------------------------------------------------


class _Dup(Exception):
    pass


@dataclass
class JsonRead:
    value: Any = None
    ok: bool = False  # parsed at all
    problems: list[str] = field(default_factory=list)  # why it is not strict, valid I-JSON
    lax: list[str] = field(default_factory=list)  # another encoding of the same content (UTF-16, a BOM)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            _DUPS.append(k)
        out[k] = v
    return out


_DUPS: list[str] = []


def read_json(data: bytes | str) -> JsonRead:
    """Parse like any JSON reader would (last duplicate wins), and list every strictness problem.

    Problems (the document is ambiguous or not JSON): duplicate keys, NaN/Infinity literals,
    numbers that overflow to infinity, lone surrogates, nesting beyond the reader's limits, bytes
    that are no Unicode encoding at all. Lax (the same content, encoded otherwise): UTF-16/32,
    a byte order mark.
    """
    r = JsonRead()
    if isinstance(data, bytes):
        enc = json.detect_encoding(data)  # what json.loads(bytes) does: UTF-8 (BOM or not), UTF-16, UTF-32
        try:
            text = data.decode(enc)
        except UnicodeDecodeError:
            r.problems.append(f"not {enc} text")
            return r
        if enc != "utf-8":
            r.lax.append(f"{enc} encoded")
    else:
        text = data
    constants: list[str] = []

    def constant(c: str) -> float:
        constants.append(c)
        return 0.0

    _DUPS.clear()
    try:
        r.value = json.loads(text, object_pairs_hook=_pairs, parse_constant=constant)
        r.ok = True
    except RecursionError:
        r.problems.append("nesting too deep")
        return r
    except ValueError as e:
        r.problems.append(f"not JSON ({e})")
        return r
    if _DUPS:
        r.problems.append(f"duplicate key {_DUPS[0]!r}")
    if constants:
        r.problems.append(f"{constants[0]} literal")
    bad = _non_finite_or_surrogate(r.value)
    if bad:
        r.problems.append(bad)
    return r


def _non_finite_or_surrogate(v: Any) -> str | None:
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return "number out of range (overflows to infinity)"
        if isinstance(x, str) and any("\ud800" <= c <= "\udfff" for c in x):
            return "lone surrogate in a string"
        if isinstance(x, dict):
            for k, item in x.items():
                if any("\ud800" <= c <= "\udfff" for c in k):
                    return "lone surrogate in a key"
                stack.append(item)
        elif isinstance(x, list):
            stack.extend(x)
    return None


# ---- a small JSON Schema validator ------------------------------------------------------------------

_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def rfc3339_ok(s: object) -> bool:
    """RFC 3339 ``date-time`` with a zone (``Z`` or ``+hh:mm``), a real calendar date, no leap second."""
    if not isinstance(s, str):
        return False
    m = _RFC3339.match(s)
    if not m:
        return False
    y, mo, d, h, mi, sec = (int(m.group(i)) for i in range(1, 7))
    try:
        datetime(y, mo, d, h, mi, sec)
    except ValueError:
        return False
    off = m.group(8)
    return off in ("Z", "z") or (int(off[1:3]) <= 23 and int(off[4:6]) <= 59)


def _is_type(v: Any, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    if t == "number":
        return True
    return isinstance(v, int) or (math.isfinite(v) and float(v).is_integer())  # integer


def _json_eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b) and (isinstance(a, int | float) == isinstance(b, int | float))


class Schema:
    """Validates against one checked-in JSON Schema (the keywords semgov's schemas use)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.defs: dict[str, Any] = doc.get("$defs", {})

    @classmethod
    def load(cls, name: str) -> Schema:
        return cls(json.loads((SCHEMAS / name).read_text()))

    def errors(self, v: Any) -> list[str]:
        out: list[str] = []
        self._check(v, self.doc, "$", out)
        return out

    def _check(self, v: Any, s: dict[str, Any], path: str, out: list[str]) -> None:  # noqa: C901
        if len(out) > 5:
            return
        if "$ref" in s:
            ref = s["$ref"]
            target = self.defs[ref.split("/")[-1]] if ref.startswith("#/$defs/") else self.doc
            self._check(v, target, path, out)
        if "anyOf" in s:
            if not any(not self._sub(v, sub, path) for sub in s["anyOf"]):
                out.append(f"{path}: matches no alternative")
        if "const" in s and not _json_eq(v, s["const"]):
            out.append(f"{path}: must be {s['const']!r}")
        if "enum" in s and not any(_json_eq(v, e) for e in s["enum"]):
            out.append(f"{path}: not one of {s['enum']}")
        t = s.get("type")
        if t is not None:
            types = t if isinstance(t, list) else [t]
            if not any(_is_type(v, x) for x in types):
                out.append(f"{path}: not of type {t}")
                return
        if isinstance(v, str):
            if "minLength" in s and len(v) < s["minLength"]:
                out.append(f"{path}: shorter than {s['minLength']}")
            if "maxLength" in s and len(v) > s["maxLength"]:
                out.append(f"{path}: longer than {s['maxLength']}")
            if "pattern" in s and not re.search(s["pattern"], v):
                out.append(f"{path}: does not match {s['pattern']}")
            if s.get("format") == "date-time" and not rfc3339_ok(v):
                out.append(f"{path}: not an RFC 3339 date-time with a zone")
        if isinstance(v, int | float) and not isinstance(v, bool):
            if "minimum" in s and v < s["minimum"]:
                out.append(f"{path}: below {s['minimum']}")
            if "maximum" in s and v > s["maximum"]:
                out.append(f"{path}: above {s['maximum']}")
            if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
                out.append(f"{path}: not above {s['exclusiveMinimum']}")
        if isinstance(v, list):
            if "minItems" in s and len(v) < s["minItems"]:
                out.append(f"{path}: fewer than {s['minItems']} items")
            if "maxItems" in s and len(v) > s["maxItems"]:
                out.append(f"{path}: more than {s['maxItems']} items")
            prefix = s.get("prefixItems", [])
            for i, item in enumerate(v):
                sub = prefix[i] if i < len(prefix) else s.get("items")
                if isinstance(sub, dict):
                    self._check(item, sub, f"{path}[{i}]", out)
                elif sub is False:
                    out.append(f"{path}[{i}]: no item allowed here")
        if isinstance(v, dict):
            props = s.get("properties", {})
            for r in s.get("required", []):
                if r not in v:
                    out.append(f"{path}: missing {r!r}")
            for k, item in v.items():
                if k in props:
                    self._check(item, props[k], f"{path}.{k}", out)
                elif s.get("additionalProperties") is False:
                    out.append(f"{path}: unknown key {k!r}")
                elif isinstance(s.get("additionalProperties"), dict):
                    self._check(item, s["additionalProperties"], f"{path}.{k}", out)

    def _sub(self, v: Any, s: dict[str, Any], path: str) -> list[str]:
        out: list[str] = []
        self._check(v, s, path, out)
        return out


# ---- keys and signatures -----------------------------------------------------------------------------

ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PEM = re.compile(r"-----BEGIN PUBLIC KEY-----(\s*)([A-Za-z0-9+/=\s]+?)(\s*)-----END PUBLIC KEY-----")


def ed25519_from_pem(text: object) -> tuple[bytes | None, bool]:
    """``(raw 32-byte key, exact)`` from an SPKI PEM, by hand; ``exact``: the canonical PEM, nothing else."""
    if not isinstance(text, str):
        return None, False
    m = _PEM.search(text)
    if m is None:
        return None, False
    body = re.sub(r"\s", "", m.group(2))
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None, False
    if len(der) != 44 or not der.startswith(ED25519_SPKI_PREFIX):
        return None, False
    canonical_pem = (
        f"-----BEGIN PUBLIC KEY-----\n{base64.b64encode(der).decode()}\n-----END PUBLIC KEY-----\n"
    )
    return der[12:], text == canonical_pem


def b64_signature(sig: object) -> tuple[bytes | None, bool]:
    """``(64 signature bytes, canonical)``; ``canonical`` False for valid-but-non-canonical base64."""
    if not isinstance(sig, str):
        return None, False
    try:
        raw = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        return None, False
    if len(raw) != 64:
        return None, False
    return raw, base64.b64encode(raw).decode() == sig


def ed25519_ok(raw_pub: bytes, sig: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(raw_pub).verify(sig, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def canonical(value: Any) -> bytes | None:
    """RFC 8785 bytes by the reference implementation, or None when the value has none."""
    try:
        return rfc8785.dumps(value)
    except Exception:  # noqa: BLE001 - rfc8785 raises its own error types and ValueError
        return None


def token_sha256(ids: list[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


# ---- the captured-request line ------------------------------------------------------------------------


@dataclass
class LineJudgement:
    """What the oracle makes of one captured-request line."""

    malformed: list[str]  # request-level problems: every candidate must be denied
    candidates: list[tuple[str | None, list[str]]]  # (donor id, problems) per candidate, in order
    lax: list[str]  # format deviations that change no signed content


@dataclass
class Trust:
    """The keyring as the oracle sees it: key id -> (raw public key, revoked)."""

    keys: dict[str, tuple[bytes, bool]]

    @classmethod
    def from_keyring_file(cls, path: Path) -> Trust:
        doc = json.loads(path.read_text())
        keys = {}
        for k in doc["keys"]:
            raw, _ = ed25519_from_pem(k["public_key"])
            assert raw is not None
            keys[k["key_id"]] = (raw, bool(k.get("revoked", False)))
        return cls(keys)


_CAPTURED = Schema.load("captured_request.schema.json")
_PROVENANCE = Schema.load("provenance.schema.json")


def judge_line(raw: bytes, trust: Trust) -> LineJudgement:
    """Judge one captured-request line against docs/formats.md and the schemas."""
    j = LineJudgement([], [], [])
    rd = read_json(raw)
    # NOTE: a number too large for a double is valid JSON syntax; inside one candidate it makes that
    # candidate unusable (no RFC 8785 form), not the whole line.
    j.malformed += [p for p in rd.problems if not p.startswith("number out of range")]
    j.lax += rd.lax
    doc = rd.value
    if not rd.ok or not isinstance(doc, dict):
        j.malformed.append("not a JSON object")
        return j
    j.malformed += _CAPTURED.errors(doc)
    prompt = doc.get("prompt")
    j.malformed += [f"prompt: {p}" for p in _tiling(prompt)]
    cands = doc.get("candidates")
    if not isinstance(cands, list):
        return j
    seen: set[str] = set()
    for i, c in enumerate(cands):
        donor = c.get("donor_id") if isinstance(c, dict) else None
        if isinstance(donor, str):
            if donor in seen:
                j.malformed.append(f"donor id {donor!r} appears twice")
            seen.add(donor)
        j.candidates.append((donor if isinstance(donor, str) else None, _candidate(c, trust, j.lax, i)))
    exp = doc.get("expect")
    if isinstance(exp, dict) and set(exp) - seen:
        j.malformed.append("expect names a donor that is not a candidate")
    return j


def _tiling(prompt: Any) -> list[str]:
    if not isinstance(prompt, dict):
        return []
    toks, segs = prompt.get("token_ids"), prompt.get("segments")
    if not isinstance(toks, list) or not isinstance(segs, list):
        return []
    pos = 0
    for i, s in enumerate(segs):
        if not isinstance(s, dict):
            return [f"segment {i} is not an object"]
        st: Any = s.get("start")
        en: Any = s.get("end")
        if not (_is_type(st, "integer") and _is_type(en, "integer")):
            return [f"segment {i} bounds are not integers"]
        if st != pos or en <= st:
            return [f"segments do not tile (segment {i})"]
        pos = int(en)
    return [] if pos == len(toks) else ["segments do not cover the tokens"]


def _candidate(c: Any, trust: Trust, lax: list[str], i: int) -> list[str]:
    if not isinstance(c, dict):
        return ["not an object"]
    probs: list[str] = []
    if (bad := _non_finite_or_surrogate(c)) is not None:
        probs.append(bad)
    sim = c.get("similarity")
    if not isinstance(sim, int | float) or isinstance(sim, bool) or not math.isfinite(float(sim)):
        probs.append("similarity is not a finite number")
    prov = c.get("provenance")
    if not isinstance(prov, dict):
        return [*probs, "no provenance object"]
    payload, kid, sig = prov.get("payload"), prov.get("key_id"), prov.get("signature")
    entry = trust.keys.get(kid) if isinstance(kid, str) else None
    if entry is None:
        probs.append("key id not in the keyring")
    elif entry[1]:
        probs.append("key revoked")
    sig_raw, sig_canonical = b64_signature(sig)
    msg = canonical(payload)
    if sig_raw is None:
        probs.append("signature is not base64 of 64 bytes")
    elif msg is None:
        probs.append("payload has no RFC 8785 form")
    elif entry is not None and not ed25519_ok(entry[0], sig_raw, msg):
        probs.append("signature does not verify")
    elif not sig_canonical:
        lax.append(f"candidate {i}: signature is non-canonical base64")
    if not isinstance(payload, dict):
        return [*probs, "payload is not an object"]
    probs += [f"payload {e}" for e in _PROVENANCE.errors(payload)]
    if payload.get("donor_id") != c.get("donor_id"):
        probs.append("payload donor_id differs")
    p = c.get("prompt")
    toks = p.get("token_ids") if isinstance(p, dict) else None
    if not isinstance(toks, list) or not all(_is_type(t, "integer") and 0 <= t <= 0xFFFFFFFF for t in toks):
        probs.append("donor tokens unusable")
    elif payload.get("token_ids_sha256") != token_sha256([int(t) for t in toks]):
        probs.append("token hash differs")
    probs += [f"donor prompt: {x}" for x in _tiling(p)]
    return probs


# ---- signed notes (C2SP) ----------------------------------------------------------------------------------

EM_DASH = "\u2014 ".encode()


def note_parts(note: bytes) -> tuple[bytes, list[bytes]] | None:
    """``(text, signature lines)`` of a signed note, split at the last blank line, by hand."""
    i = note.rfind(b"\n\n")
    if i < 0 or not note.endswith(b"\n"):
        return None
    return note[: i + 1], note[i + 2 :].split(b"\n")[:-1]


def note_authentic(note: bytes, originals: list[bytes], key_name: str) -> bool:
    """True iff ``note``'s text is one of the ``originals``' texts and keeps that note's own signature line.

    Other keys' signature lines may be added (the spec says verifiers ignore them).
    """
    parts = note_parts(note)
    if parts is None:
        return False
    text, sigs = parts
    for orig in originals:
        op = note_parts(orig)
        if op is None or op[0] != text:
            continue
        ours = [s for s in op[1] if s.startswith(EM_DASH + key_name.encode() + b" ")]
        mine = [s for s in sigs if s.startswith(EM_DASH + key_name.encode() + b" ")]
        if ours and mine and all(s in ours for s in mine):
            return all(s.startswith(EM_DASH) and b" " in s[len(EM_DASH) :] for s in sigs)
    return False


# ---- YAML policies (docs/policy.md) -----------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_VERSION = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_SEG = re.compile(r"^[A-Za-z0-9_.:@-]+$")
_ENTITY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_REGION = re.compile(r"^[A-Z]{2}$")
_TASK = re.compile(r"^[^@\s]+@[^@\s]+$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
ROLES = ("system", "instruction", "evidence", "question", "other")


def _ns_pattern_ok(p: object) -> bool:
    if not isinstance(p, str):
        return False
    body = p[:-2] if p.endswith("/*") else p
    parts = body.split("/")
    return bool(body) and all(s and s not in (".", "..") and _SEG.match(s) for s in parts)


def _num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def judge_policy_yaml(data: Any) -> list[str]:  # noqa: C901
    """Problems of a parsed policy document against docs/policy.md (empty: a valid policy)."""
    if not isinstance(data, dict):
        return ["not a mapping"]
    p: list[str] = []
    top = {
        "name", "version", "description", "accepted_policy_versions", "tenant", "namespace", "expiry",
        "pii", "task", "similarity", "token_verification", "quality",
    }  # fmt: skip
    p += [f"unknown key {k!r}" for k in data if k not in top]
    if not (isinstance(data.get("name"), str) and _NAME.match(data["name"])):
        p.append("name")
    if not (isinstance(data.get("version"), str) and _VERSION.match(data["version"])):
        p.append("version")
    if "description" in data and not isinstance(data["description"], str):
        p.append("description")
    apv = data.get("accepted_policy_versions", [])
    if not (isinstance(apv, list) and all(isinstance(x, str) and x for x in apv)):
        p.append("accepted_policy_versions")

    def section(name: str, keys: dict[str, Any]) -> None:
        if name not in data:
            return
        sec = data[name]
        if not isinstance(sec, dict):
            p.append(f"{name} is not a mapping")
            return
        for k, v in sec.items():
            check = keys.get(k)
            if check is None:
                p.append(f"{name}.{k}: unknown key")
            elif not check(v):
                p.append(f"{name}.{k}: bad value")

    def boolean(v: object) -> bool:
        return isinstance(v, bool)

    def frac(v: object) -> bool:
        return _num(v) and 0.0 <= float(v) <= 1.0  # type: ignore[arg-type]

    def sharing(v: object) -> bool:
        return isinstance(v, list) and all(
            isinstance(r, dict)
            and set(r) <= {"donor", "recipients"}
            and _ns_pattern_ok(r.get("donor"))
            and isinstance(r.get("recipients"), list)
            and len(r["recipients"]) >= 1
            and all(_ns_pattern_ok(x) for x in r["recipients"])
            for r in v
        )

    def duration(v: object) -> bool:
        if v is None:
            return True
        if isinstance(v, bool):
            return False
        if isinstance(v, int):
            return v > 0
        if isinstance(v, str):
            m = _DURATION.match(v)
            return m is not None and int(m.group(1)) > 0
        return False

    def strlist(rx: re.Pattern[str], min_len: int = 0) -> Any:
        return lambda v: (
            isinstance(v, list) and len(v) >= min_len and all(isinstance(x, str) and rx.match(x) for x in v)
        )

    def groups(v: object) -> bool:
        return isinstance(v, list) and all(strlist(_TASK)(g) for g in v)

    def pos_int(lo: int) -> Any:
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def roles(v: object) -> bool:
        return isinstance(v, list) and all(x in ("system", "evidence") for x in v)

    section("tenant", {"allow_public_donors": boolean})
    section("namespace", {"sharing": sharing})
    section("expiry", {"max_age": duration})
    section(
        "pii",
        {
            "forbidden_entities": strlist(_ENTITY),
            "scan_donor_text": boolean,
            "require_scan": boolean,
            "min_score": frac,
            "phone_regions": strlist(_REGION, 1),
        },
    )
    section("task", {"compatible_groups": groups})
    section("similarity", {"min": frac})
    section(
        "token_verification",
        {
            "min_span_tokens": pos_int(1),
            "min_approved_tokens": pos_int(0),
            "min_approved_fraction": frac,
            "allow_shifted": boolean,
            "reusable_roles": roles,
        },
    )

    def percent(v: object) -> bool:
        return pos_int(0)(v) and v <= 100  # type: ignore[operator]

    def rules(v: object) -> bool:
        scope = {"task": lambda x: isinstance(x, str) and x != "", "response_contract": None}
        scope["response_contract"] = scope["task"]
        kinds = {**scope, "allow_shifted": boolean, "shifted_recompute_percent": percent,
                 "min_recompute_tokens": pos_int(0), "shifted_recompute_tail_tokens": pos_int(0)}  # fmt: skip
        return isinstance(v, list) and all(
            isinstance(r, dict) and all(k in kinds and (x is None or kinds[k](x)) for k, x in r.items())
            for r in v
        )

    section(
        "quality",
        {"allow_shifted": boolean, "shifted_recompute_percent": percent, "min_recompute_tokens": pos_int(0),
         "shifted_recompute_tail_tokens": pos_int(0), "rules": rules},
    )  # fmt: skip
    tv, q = data.get("token_verification"), data.get("quality")
    if (
        isinstance(tv, dict)
        and tv.get("allow_shifted") is False
        and isinstance(q, dict)
        and isinstance(q.get("rules"), list)
        and any(isinstance(r, dict) and r.get("allow_shifted") is True for r in q["rules"])
    ):
        p.append("quality.rules: a rule allows shifted spans the policy forbids")
    return p


# ---- gateway context tokens (docs/sglang.md, "The gateway contract") --------------------------------------

CONTEXT_MAX_TOKEN_CHARS = 16384
CONTEXT_MAX_LORA_CHARS = 256
_CONTEXT_TOKEN = re.compile(r"semgov1\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{43})")
_CONTEXT_ID = re.compile(r"[!-~]{1,128}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CONTEXT_FIELDS = {"tenant", "namespace", "task", "response_contract", "segments"}


@dataclass
class ContextJudgement:
    """What the oracle makes of one ``(extra_key, lora_id)``: problems, else the context it holds."""

    problems: list[str]
    context: tuple[Any, ...] | None = None  # (tenant, namespace, task, contract, segments, lora_id)


def _plain_text(v: object) -> str | None:
    """The text of a str (a subclass's too, read without calling any of its methods), else None."""
    return "".join((v,)) if issubclass(type(v), str) else None  # type: ignore[arg-type]


def _task_problems(v: Any) -> list[str]:
    if not isinstance(v, dict) or set(v) != {"id", "version"}:
        return ["task is not an object with exactly id, version"]
    return [f"task.{k}: not a string of 1..512 characters" for k in ("id", "version")
            if not (isinstance(v[k], str) and 1 <= len(v[k]) <= 512)]  # fmt: skip


def judge_context(
    extra_key: object,
    lora_id: object,
    key: bytes,
    *,
    audience: str,
    now: int,
    max_lifetime_s: int,
) -> ContextJudgement:
    """Judge an ``extra_key`` and the request's server-side ``lora_id`` against the gateway contract.

    Valid iff: ``extra_key`` is the token followed by exactly ``lora_id`` (nothing without one); the
    token is ``semgov1.<P>.<M>`` within 16,384 characters, ``M`` the unpadded base64url of
    HMAC-SHA256(key, "semgov1." + P), ``P`` canonical unpadded base64url of UTF-8 bytes that are
    strict JSON and exactly their own RFC 8785 form, of an object with the documented members;
    its claims: ``kid`` the unpadded base64url of the first 12 bytes of SHA-256(b"semgov.context-
    key-id/v1\\0" + key), ``aud`` exactly ``audience``, ``exp`` an integer (not a boolean) with
    ``now < exp <= now + max_lifetime_s``.
    """
    text, lora = _plain_text(extra_key), _plain_text(lora_id)
    if text is None:
        return ContextJudgement(["extra_key is not a string"])
    if lora is None and lora_id is not None:
        return ContextJudgement(["lora_id is not a string"])
    if lora is not None and len(lora) > CONTEXT_MAX_LORA_CHARS:
        return ContextJudgement(["LoRA id too long"])
    token = text
    if lora:
        if not text.endswith(lora):
            return ContextJudgement(["extra_key does not end with the LoRA id"])
        token = text[: len(text) - len(lora)]
    if len(token) > CONTEXT_MAX_TOKEN_CHARS:
        return ContextJudgement(["token too long"])
    m = _CONTEXT_TOKEN.fullmatch(token)
    if m is None:
        return ContextJudgement(["not semgov1.<base64url>.<43 base64url characters> (and nothing after)"])
    payload, mac = m.group(1), m.group(2)
    want = hmac.new(key, ("semgov1." + payload).encode("ascii"), hashlib.sha256).digest()
    if mac != base64.urlsafe_b64encode(want).decode("ascii").rstrip("="):
        return ContextJudgement(["MAC does not verify"])
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except (binascii.Error, ValueError):
        return ContextJudgement(["payload is not base64url"])
    if base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != payload:
        return ContextJudgement(["payload is non-canonical base64url"])
    try:
        doc_text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ContextJudgement(["payload is not UTF-8"])
    rd = read_json(doc_text)
    if rd.problems:
        return ContextJudgement([f"payload: {rd.problems[0]}"])
    doc = rd.value
    if canonical(doc) != raw:
        return ContextJudgement(["payload is not its RFC 8785 form"])
    if not isinstance(doc, dict):
        return ContextJudgement(["payload is not an object"])
    probs: list[str] = []
    kid = base64.urlsafe_b64encode(hashlib.sha256(b"semgov.context-key-id/v1\x00" + key).digest()[:12])
    if doc.get("kid") != kid.decode("ascii").rstrip("="):
        probs.append("kid is not the MAC key's id")
    if doc.get("aud") != audience:
        probs.append("aud is not this deployment")
    exp = doc.get("exp")
    if type(exp) is not int or not now < exp <= now + max_lifetime_s:
        probs.append("exp is not an integer within (now, now + max lifetime]")
    doc = {k: v for k, v in doc.items() if k not in ("aud", "exp", "kid")}
    if set(doc) - _CONTEXT_FIELDS:
        probs.append("unknown member")
    if not {"tenant", "namespace", "task", "response_contract"} <= set(doc):
        probs.append("member missing")
    for name in ("tenant", "namespace"):
        if not (isinstance(doc.get(name), str) and _CONTEXT_ID.fullmatch(doc[name])):
            probs.append(f"{name} is not 1..128 printable ASCII without spaces")
    probs += _task_problems(doc.get("task"))
    rc = doc.get("response_contract")
    if not isinstance(rc, dict) or set(rc) != {"id", "schema_sha256"}:
        probs.append("response_contract is not an object with exactly id, schema_sha256")
    else:
        if not (isinstance(rc["id"], str) and 1 <= len(rc["id"]) <= 512):
            probs.append("response_contract.id: not a string of 1..512 characters")
        if not (isinstance(rc["schema_sha256"], str) and _SHA256_HEX.fullmatch(rc["schema_sha256"])):
            probs.append("response_contract.schema_sha256: not 64 lower-case hex digits")
    segments = None
    if "segments" in doc:
        segs = doc["segments"]
        if not isinstance(segs, list) or not segs:
            probs.append("segments is not a non-empty list")
        else:
            pos, out = 0, []
            for i, s in enumerate(segs):
                if not (isinstance(s, list) and len(s) == 3 and isinstance(s[0], str) and s[0] in ROLES):
                    probs.append(f"segment {i} is not [role, start, end]")
                    break
                st, en = s[1], s[2]
                if type(st) is not int or type(en) is not int:
                    probs.append(f"segment {i} bounds are not integers")
                    break
                if st != pos or en <= st:
                    probs.append(f"segments do not tile (segment {i})")
                    break
                out.append((s[0], st, en))
                pos = en
            segments = tuple(out)
    if probs:
        return ContextJudgement(probs)
    ctx = (doc["tenant"], doc["namespace"], dict(doc["task"]), dict(rc), segments, lora)
    return ContextJudgement([], ctx)
