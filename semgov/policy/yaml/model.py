"""Declarative YAML reuse policies: the model, its loader and its revision.

A policy directory holds ``policy.yaml``. Unknown keys, wrong types and bad
values are rejected at load with ``file:line: field: message``. The revision is
a content hash of the policy file and is recorded in every decision.

A policy ends with the YAML document end marker ``...`` on a line of its own (only blank and
comment lines may follow): most prefixes of a valid policy are valid YAML and many validate,
since omitted keys take their defaults and a cut number is a smaller one, so without the
marker a truncated or half-copied file would load under the same ``name@version``, sometimes
looser than the whole. A file without it is refused wherever a policy is loaded.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from semgov._internal.yamlload import line_for, load_yaml_with_lines
from semgov.errors import PolicyError
from semgov.facts.config import DEFAULT_FORBIDDEN_PII, FactConfig
from semgov.facts.pii import DEFAULT_PHONE_REGIONS
from semgov.intake.limits import Limits, resolve
from semgov.policy.rules import RequestScope, SharingRule, TaskSection
from semgov.policy.rules import StrictSection as _Section
from semgov.wire.models import Role

POLICY_FILE = "policy.yaml"
END_MARKER = "..."
# The document end marker, optionally followed by a comment, at column 0 (YAML 1.1/1.2).
_END_LINE = re.compile(r"\.\.\.(?:[ \t]+#.*)?[ \t]*")
_DURATION = re.compile(r"\s*([0-9]+)\s*([smhdw]?)\s*", re.ASCII)  # fullmatch; ASCII digits only
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

DEFAULT_REUSABLE_ROLES: tuple[Role, ...] = ("system", "evidence")
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]


class TenantSection(_Section):
    allow_public_donors: bool = False
    # Public donors from other tenants for these requests only (when allow_public_donors is false).
    public_donors_for: list[RequestScope] = Field(default_factory=list)


class NamespaceSection(_Section):
    sharing: list[SharingRule] = Field(default_factory=list)


class ExpirySection(_Section):
    # Seconds; YAML may write 3600, "90m", "12h", "30d", "2w".
    max_age_seconds: int | None = Field(default=None, alias="max_age", gt=0)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @field_validator("max_age_seconds", mode="before")
    @classmethod
    def _duration(cls, v: object) -> object:
        if isinstance(v, str):
            m = _DURATION.fullmatch(v)
            if not m:
                raise ValueError(f"bad duration {v!r}: use seconds or a number with s, m, h, d or w")
            return int(m.group(1)) * _UNIT[m.group(2)]
        return v


class PiiSection(_Section):
    forbidden_entities: list[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]*$")]] = Field(
        default_factory=lambda: list(DEFAULT_FORBIDDEN_PII)
    )
    # Scan donor text with Presidio when the candidate carries text.
    scan_donor_text: bool = True
    # Deny when nothing was scanned: provenance says unscanned and no text is present.
    require_scan: bool = True
    min_score: float = Field(default=0.4, ge=0.0, le=1.0)
    # Regions whose national phone formats are recognised (ISO 3166 alpha-2 as
    # Presidio/phonenumbers spell them). "+CC" international numbers are always found.
    phone_regions: list[Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}$")]] = Field(
        default_factory=lambda: list(DEFAULT_PHONE_REGIONS), min_length=1
    )


class SimilaritySection(_Section):
    min: float = Field(default=0.5, ge=0.0, le=1.0)


class TokenVerificationSection(_Section):
    min_span_tokens: int = Field(default=32, ge=1)
    min_approved_tokens: int = Field(default=64, ge=0)
    min_approved_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    allow_shifted: bool = True
    reusable_roles: list[Role] = Field(default_factory=lambda: list(DEFAULT_REUSABLE_ROLES))

    @field_validator("reusable_roles")
    @classmethod
    def _no_unsafe_roles(cls, v: list[Role]) -> list[Role]:
        bad = sorted(set(v) & {"question", "instruction", "other"})
        if bad:
            raise ValueError(
                f"shifted spans may never be reused in {bad}: only 'system' and 'evidence' may be listed"
            )
        return v


class QualityRule(_Section):
    """Realization settings for one scope: requests whose task id and response contract id match
    (an omitted key matches any); unset settings keep the section's defaults."""

    task: Annotated[str, StringConstraints(min_length=1)] | None = None
    response_contract: Annotated[str, StringConstraints(min_length=1)] | None = None
    # false: no shifted span is approved in this scope; true: shifted spans are approved here even
    # when quality.allow_shifted is false (never what token_verification.allow_shifted forbids).
    allow_shifted: bool | None = None
    shifted_recompute_percent: int | None = Field(default=None, ge=0, le=100)
    min_recompute_tokens: int | None = Field(default=None, ge=0)
    shifted_recompute_tail_tokens: int | None = Field(default=None, ge=0)


class QualitySection(_Section):
    """How approved shifted spans are realized: a shifted span's K/V was computed behind other
    tokens, so the engine computes some of its tokens instead of copying them: its leading
    ``min(length, max(min_recompute_tokens, ceil(percent * length / 100)))`` (the record states
    the count per span as ``recompute``, signed) and its last ``shifted_recompute_tail_tokens``
    (the approved span ends that many tokens early: the positions right before what follows it,
    usually the question). A span left with nothing to copy is not approved. The first rule
    matching the request applies instead of the defaults. ``allow_shifted`` is the default for
    requests no rule turns shifted reuse on or off for (within ``token_verification.allow_shifted``,
    the ceiling)."""

    allow_shifted: bool = True
    shifted_recompute_percent: int = Field(default=20, ge=0, le=100)
    min_recompute_tokens: int = Field(default=16, ge=0)
    shifted_recompute_tail_tokens: int = Field(default=0, ge=0)
    rules: list[QualityRule] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QualityPlan:
    """The quality settings for one request: the matching rule's, else the defaults."""

    allow_shifted: bool
    percent: int
    min_tokens: int
    rule: int | None  # index into ``quality.rules``; None: the defaults
    tail_tokens: int = 0

    def recompute(self, kind: str, length: int) -> int:
        """Leading tokens of an approved span the engine must compute (0 for prefix spans)."""
        if kind != "shifted":
            return 0
        return min(length, max(self.min_tokens, -(-self.percent * length // 100)))

    def tail(self, kind: str, length: int) -> int:
        """Trailing tokens of an approved span the engine must compute (0 for prefix spans)."""
        return min(length, self.tail_tokens) if kind == "shifted" else 0


class Policy(BaseModel):
    """A loaded YAML policy. Build with :func:`load_policy`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Name
    version: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.+-]{1,64}$")]
    description: str = ""
    accepted_policy_versions: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default_factory=list
    )
    tenant: TenantSection = Field(default_factory=TenantSection)
    namespace: NamespaceSection = Field(default_factory=NamespaceSection)
    expiry: ExpirySection = Field(default_factory=ExpirySection)
    pii: PiiSection = Field(default_factory=PiiSection)
    task: TaskSection = Field(default_factory=TaskSection)
    similarity: SimilaritySection = Field(default_factory=SimilaritySection)
    token_verification: TokenVerificationSection = Field(default_factory=TokenVerificationSection)
    quality: QualitySection = Field(default_factory=QualitySection)
    _revision: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _rules_only_tighten(self) -> Policy:
        if self.token_verification.allow_shifted:
            return self
        for i, r in enumerate(self.quality.rules):
            if r.allow_shifted:
                raise ValueError(
                    f"quality.rules.{i}.allow_shifted is true, but token_verification.allow_shifted is "
                    "false: a rule can forbid shifted reuse in its scope, never allow it"
                )
        return self

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, v: object) -> object:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(f'write the version as a string, e.g. version: "{v}"')
        return v

    @property
    def revision(self) -> str:
        """Content hash of the policy file (``sha256:<hex>``), recorded in every decision."""
        return self._revision

    @property
    def ref(self) -> str:
        """``name@version``: what provenance ``policy_version`` names."""
        return f"{self.name}@{self.version}"

    @property
    def engine_name(self) -> str:
        """The native YAML engine decides a YAML policy."""
        return "yaml"

    @cached_property
    def fact_config(self) -> FactConfig:
        return FactConfig(
            min_span_tokens=self.token_verification.min_span_tokens,
            scan_donor_text=self.pii.scan_donor_text,
            pii_min_score=self.pii.min_score,
            phone_regions=tuple(self.pii.phone_regions),
            pii_entities=tuple(sorted(set(self.pii.forbidden_entities))),
        )

    def quality_plan(self, task_id: str, contract_id: str) -> QualityPlan:
        """The quality settings for a request with this task id and response contract id."""
        q, tv = self.quality, self.token_verification
        for i, r in enumerate(q.rules):
            if r.task not in (None, task_id) or r.response_contract not in (None, contract_id):
                continue
            return QualityPlan(
                allow_shifted=tv.allow_shifted
                and (q.allow_shifted if r.allow_shifted is None else r.allow_shifted),
                percent=q.shifted_recompute_percent
                if r.shifted_recompute_percent is None
                else r.shifted_recompute_percent,
                min_tokens=q.min_recompute_tokens
                if r.min_recompute_tokens is None
                else r.min_recompute_tokens,
                rule=i,
                tail_tokens=q.shifted_recompute_tail_tokens
                if r.shifted_recompute_tail_tokens is None
                else r.shifted_recompute_tail_tokens,
            )
        return QualityPlan(
            tv.allow_shifted and q.allow_shifted, q.shifted_recompute_percent, q.min_recompute_tokens, None,
            q.shifted_recompute_tail_tokens,
        )  # fmt: skip

    @cached_property
    def accepted_versions(self) -> frozenset[str]:
        return frozenset([self.ref, *self.accepted_policy_versions])

    @cached_property
    def compatible_tasks(self) -> dict[tuple[str, str], frozenset[tuple[str, str]]]:
        """Each ``(id, version)`` of a compatible group, to every pair it may share KV with."""
        out: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for group in self.task.compatible_groups:
            pairs = [task_pair(t) for t in group]
            for t in pairs:
                out.setdefault(t, set()).update(pairs)
        return {k: frozenset(v) for k, v in out.items()}


def task_pair(ref: str) -> tuple[str, str]:
    """``"id@version"`` (exactly one ``@``, as the policy schema requires) as ``(id, version)``."""
    task_id, version = ref.split("@")
    return task_id, version


def policy_revision(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def policy_too_large(size: int, limits: Limits, source: str, *, what: str = "policy file") -> PolicyError:
    return PolicyError(
        f"{what} is {size} bytes, over the limit ({limits.describe('max_policy_bytes')})", source=source
    )


def parse_policy(content: bytes, source: str, *, limits: Limits | None = None) -> Policy:
    """Parse and validate policy YAML bytes; errors name ``source:line``.

    ``limits`` (default: :meth:`Limits.from_env`) bounds the size, nesting and alias expansion.
    """
    lim = resolve(limits)
    if len(content) > lim.max_policy_bytes:
        raise policy_too_large(len(content), lim, source)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(f"not UTF-8 text (byte {e.start})", source=source) from e
    data, lines = load_yaml_with_lines(text, source, limits=lim)
    if not isinstance(data, dict):
        raise PolicyError(
            "a policy must be a YAML mapping with at least 'name' and 'version'", source=source, line=1
        )
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        found = sorted(
            (_problem(err, source, lines) for err in e.errors(include_url=False)), key=lambda p: p.line or 0
        )
        first = found[0]
        more = len(found) - 1
        if more:
            first.message += f" [and {more} more problem{'s' if more > 1 else ''}]"
        first.others = tuple(found[1:])
        raise first from e
    _require_end(text, source)
    policy._revision = policy_revision(content)
    return policy


def _require_end(text: str, source: str) -> None:
    """Refuse a policy whose last line that is not blank or a comment is not the end marker."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _END_LINE.fullmatch(lines[i]):
            return
        break
    raise PolicyError(
        f"the policy does not end with the YAML document end marker {END_MARKER!r} on a line of its "
        "own: a truncated or partly written file? Every policy.yaml ends with it (docs/policy.md)",
        source=source,
        line=max(len(lines), 1),
    )


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the choice closest to a mistyped key, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the policy schema allows in the mapping at ``loc`` (its parent's fields)."""
    model: Any = Policy
    for part in loc:
        if not isinstance(part, str):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            break
        ann = fields[part].annotation
        inner = [a for a in getattr(ann, "__args__", ()) if hasattr(a, "model_fields")]
        model = ann if hasattr(ann, "model_fields") else (inner[0] if inner else None)
    fields = getattr(model, "model_fields", None) or {}
    return [f.alias or name for name, f in fields.items()]


def _problem(err: Any, source: str, lines: Any) -> PolicyError:
    """One pydantic error as a ``file:line: field: message`` problem (``did you mean`` for a key)."""
    loc = tuple(err["loc"])
    field = ".".join(str(p) for p in loc)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key" + did_you_mean(str(loc[-1]), _known_keys(loc[:-1]))
    elif err["type"] == "missing":
        msg = "required key is missing"
    else:
        got = err.get("input")
        if not isinstance(got, (dict, list)):
            msg = f"{msg} (got {got!r})"
    return PolicyError(msg, source=source, line=line_for(lines, loc) or 1, field=field)


def read_policy_bytes(file: Path, limits: Limits) -> bytes:
    """A policy file's bytes; never reads more than ``max_policy_bytes + 1`` of them."""
    with file.open("rb") as f:
        content = f.read(limits.max_policy_bytes + 1)
        if len(content) > limits.max_policy_bytes:
            raise policy_too_large(max(len(content), os.fstat(f.fileno()).st_size), limits, str(file))
    return content


def load_policy(path: Path, *, limits: Limits | None = None) -> Policy:
    """Load a policy from a directory holding ``policy.yaml``, or from a YAML file."""
    lim = resolve(limits)
    file = path / POLICY_FILE if path.is_dir() else path
    try:
        content = read_policy_bytes(file, lim)
    except FileNotFoundError as e:
        hint = f" (expected {POLICY_FILE} in the policy directory)" if path.is_dir() else ""
        raise PolicyError(f"policy file not found{hint}", source=str(file)) from e
    except OSError as e:
        raise PolicyError(f"cannot read policy: {e.strerror}", source=str(file)) from e
    return parse_policy(content, str(file), limits=lim)
