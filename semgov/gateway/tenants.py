"""Who may ask, and what they may claim: the gateway's tenants file.

A tenants file is YAML (or JSON) with one list, ``keys``. Each entry is one API key, held only as
its SHA-256 hash, and everything a request made with it may claim::

    version: 1
    keys:
      - id: acme-app                 # a name for logs and metrics (never the key itself)
        sha256: 9f86d08...           # sha256 hex of the API key (`semgov gateway key new`)
        tenant: acme
        namespaces: ["acme/*"]       # patterns: `*` matches any run of characters
        tasks:
          - {id: qa, version: "1"}   # version "*": any version
        response_contracts:
          - {id: answer-json, schema_sha256: 3a6e...}
        not_after: 2027-06-30T00:00:00Z   # optional: the key is refused from this instant on
        calibrate: true              # optional (default false): may send calibration requests

The tenant is the key's and nothing else: a client cannot name another. Namespace, task and
response contract are *claims* the request makes (``semgov`` in its body); a claim the key does
not allow is refused (:class:`Refusal`, HTTP 403). A claim left out defaults to the key's only
allowed value when it has exactly one literal value, and is refused otherwise. A key may send
calibration requests (``POST /v1/semgov/calibrate``, :mod:`semgov.gateway.calibration`) only if its
entry says ``calibrate: true`` (:func:`may_calibrate`).

API keys are 32 random bytes (:func:`new_api_key`), so one SHA-256 is the right hash: there is
nothing to brute-force, and a lookup costs one hash, never a comparison per key.

Loading is strict and pure (no I/O besides reading the file): every problem names the file and
its line (:class:`~semgov.errors.InputError`), unknown keys included.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from semgov._internal.yamlload import line_for, load_yaml_with_lines
from semgov.errors import InputError, PolicyError

__all__ = [
    "API_KEY_PREFIX",
    "Claims",
    "Grant",
    "KeyEntry",
    "Refusal",
    "Tenants",
    "authorize",
    "hash_api_key",
    "load_tenants",
    "may_calibrate",
    "new_api_key",
]

API_KEY_PREFIX = "sgk_"
MAX_TENANTS_FILE_BYTES = 4 << 20
# What a token's tenant and namespace may be (semgov.context): printable ASCII, no spaces.
_IDENT = re.compile(r"[!-~]{1,128}")
Ident = Annotated[str, StringConstraints(pattern=r"^[!-~]{1,128}$")]
Pattern = Annotated[str, StringConstraints(pattern=r"^[!-~]{1,128}$")]
Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TaskPattern(_Strict):
    id: Name
    version: Name  # "*": any version


class ContractRef(_Strict):
    id: Name
    schema_sha256: Hex64


class KeyEntry(_Strict):
    """One API key of the tenants file (its hash) and what requests made with it may claim."""

    id: Name
    sha256: Hex64
    tenant: Ident
    namespaces: list[Pattern] = Field(min_length=1, max_length=256)
    tasks: list[TaskPattern] = Field(min_length=1, max_length=256)
    response_contracts: list[ContractRef] = Field(min_length=1, max_length=256)
    not_after: AwareDatetime | None = None
    calibrate: bool = False  # may send calibration requests (POST /v1/semgov/calibrate)


class _File(_Strict):
    version: Literal[1]
    keys: list[KeyEntry] = Field(max_length=100_000)


@dataclass(frozen=True, slots=True)
class Tenants:
    """A loaded tenants file: keys by hash. ``source`` names the file and ``digest`` its content."""

    by_hash: dict[str, KeyEntry]
    source: str
    digest: str

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(k.tenant for k in self.by_hash.values())

    def lookup(self, api_key: str) -> KeyEntry | None:
        """The entry of ``api_key``, or None (a dictionary lookup by its hash: no per-key compare)."""
        return self.by_hash.get(hash_api_key(api_key))


def new_api_key() -> str:
    """A fresh API key: ``sgk_`` and 32 random bytes as base64url."""
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(api_key: str) -> str:
    """The ``sha256`` a tenants file holds for ``api_key`` (hex of SHA-256 over its UTF-8 bytes)."""
    return hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()


def _where(e: ValidationError, lines: dict[Any, int], source: str) -> InputError:
    problems = []
    first_line: int | None = None
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        line = line_for(lines, loc)
        first_line = first_line if first_line is not None else line
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        problems.append(f"line {line}: {dotted}: {msg}" if line is not None else f"{dotted}: {msg}")
    more = f" (and {len(problems) - 1} more: " + "; ".join(problems[1:6]) + ")" if len(problems) > 1 else ""
    head = problems[0].split(": ", 1)[1] if problems[0].startswith("line ") else problems[0]
    return InputError(head + more, source=source, line=first_line)


def load_tenants(path: Path) -> Tenants:
    """Read and check a tenants file (raises :class:`InputError` naming the file, line and problem)."""
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the tenants file ({e.strerror or e})", source=source) from e
    if len(raw) > MAX_TENANTS_FILE_BYTES:
        raise InputError(f"tenants file larger than {MAX_TENANTS_FILE_BYTES >> 20} MiB", source=source)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"tenants file is not UTF-8 (byte {e.start})", source=source) from e
    try:
        data, lines = load_yaml_with_lines(text, source)
    except PolicyError as e:
        raise InputError(e.message, source=source, line=e.line) from e
    if not isinstance(data, dict):
        raise InputError("a tenants file is a mapping with `version: 1` and `keys`", source=source, line=1)
    try:
        parsed = _File.model_validate(data)
    except ValidationError as e:
        raise _where(e, lines, source) from e
    by_hash: dict[str, KeyEntry] = {}
    ids: dict[str, int] = {}
    for i, k in enumerate(parsed.keys):
        line = lines.get(("keys", i))
        if k.id in ids:
            raise InputError(
                f"key id {k.id!r} appears twice (first at entry {ids[k.id]})", source=source, line=line
            )
        if k.sha256 in by_hash:
            raise InputError(
                f"key {k.id!r} has the same sha256 as {by_hash[k.sha256].id!r}", source=source, line=line
            )
        ids[k.id] = i
        by_hash[k.sha256] = k
    return Tenants(by_hash=by_hash, source=source, digest=hashlib.sha256(raw).hexdigest())


# ---- claims ------------------------------------------------------------------------------------


class Refusal(Exception):
    """A request refused before it reaches an engine: ``status`` (400, 401, 403), ``reason`` (a
    bounded label for metrics) and a message for the client."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Claims:
    """What a request asks for (None: not sent)."""

    namespace: str | None
    task: dict[str, str] | None
    response_contract: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Grant:
    """What a token will say: the key's tenant and the claims the key allowed."""

    key_id: str
    tenant: str
    namespace: str
    task: dict[str, str]
    response_contract: dict[str, str]


def _glob(pattern: str, value: str) -> bool:
    """``*`` matches any run of characters; everything else matches itself."""
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), value, re.DOTALL) is not None


def _namespace(key: KeyEntry, claimed: str | None, where: str) -> str:
    if claimed is None:
        literal = [p for p in key.namespaces if "*" not in p]
        if len(key.namespaces) == 1 and literal:
            return literal[0]
        raise Refusal(400, "claim_missing", f"{where}namespace is required: this key may claim several")
    if not _IDENT.fullmatch(claimed):
        raise Refusal(
            400, "claim_malformed", f"{where}namespace must be 1..128 printable ASCII characters, no spaces"
        )
    if not any(_glob(p, claimed) for p in key.namespaces):
        raise Refusal(403, "namespace", f"this key may not claim namespace {claimed!r}")
    return claimed


def _task(key: KeyEntry, claimed: dict[str, str] | None, where: str) -> dict[str, str]:
    if claimed is None:
        if len(key.tasks) == 1 and key.tasks[0].version != "*":
            return {"id": key.tasks[0].id, "version": key.tasks[0].version}
        raise Refusal(400, "claim_missing", f"{where}task is required: this key may claim several")
    if not any(t.id == claimed["id"] and t.version in ("*", claimed["version"]) for t in key.tasks):
        raise Refusal(
            403, "task", f"this key may not claim task {claimed['id']!r} version {claimed['version']!r}"
        )
    return dict(claimed)


def _contract(key: KeyEntry, claimed: dict[str, str] | None, where: str) -> dict[str, str]:
    if claimed is None:
        if len(key.response_contracts) == 1:
            c = key.response_contracts[0]
            return {"id": c.id, "schema_sha256": c.schema_sha256}
        raise Refusal(
            400, "claim_missing", f"{where}response_contract is required: this key may claim several"
        )
    ok = any(
        c.id == claimed["id"] and c.schema_sha256 == claimed["schema_sha256"] for c in key.response_contracts
    )
    if not ok:
        raise Refusal(403, "response_contract", f"this key may not claim response contract {claimed['id']!r}")
    return dict(claimed)


def _live(key: KeyEntry, now: datetime) -> None:
    """Refuse an expired key (401). NOTE: rounds toward refusal: refused at ``not_after`` itself."""
    if key.not_after is not None and now >= key.not_after:
        raise Refusal(401, "key_expired", "this API key has expired")


def may_calibrate(key: KeyEntry, now: datetime) -> None:
    """Refuse a key that may not send calibration requests: expired (401), or its entry lacks
    ``calibrate: true`` (403, reason ``calibration``)."""
    _live(key, now)
    if not key.calibrate:
        raise Refusal(
            403,
            "calibration",
            "this API key may not send calibration requests: its tenants-file entry needs `calibrate: true`",
        )


def authorize(key: KeyEntry, claims: Claims, now: datetime, *, where: str = "semgov.") -> Grant:
    """The grant of ``claims`` under ``key`` at ``now`` (raises :class:`Refusal`); ``where``: what a
    refusal puts before a claim's name (the member that holds the claims, in the request's body)."""
    _live(key, now)
    return Grant(
        key_id=key.id,
        tenant=key.tenant,
        namespace=_namespace(key, claims.namespace, where),
        task=_task(key, claims.task, where),
        response_contract=_contract(key, claims.response_contract, where),
    )
