"""The hook's settings: read from ``SEMGOV_*`` environment variables of the SGLang server process.

SGLang's command line has no room for a backend's own flags, so ``--radix-cache-backend semgov``
is configured through the environment (docs/sglang.md lists every variable). Every problem is
refused when the tree cache is built, naming the variable, before the server accepts traffic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from semgov.errors import SemgovError


class HookConfigError(SemgovError):
    """A semgov hook setting is missing or invalid (the message names the variable)."""


@dataclass(frozen=True, slots=True)
class HookSettings:
    """Everything the governed radix cache needs besides SGLang's own objects."""

    policy: Path
    """Policy directory or file (YAML or Rego), as for ``semgov check --policy``."""
    trust: Path
    """Keyring JSON: the keys whose provenance signatures are trusted (must include the hook's own)."""
    signing_key: Path
    """Ed25519 private key (PEM): signs provenance of donors, decision records, engine events, checkpoints."""
    context_key: Path
    """File holding the HMAC key shared with the gateway that writes context tokens (>= 32 bytes)."""
    audit_dir: Path
    """Audit log directory (created if missing; one writer per directory)."""
    engine: str | None = None
    """Policy engine (``yaml``, ``regorus``, ``opa-inprocess``); default: the policy's own."""
    provider: str = "minhash"
    """Donor candidate provider: ``minhash``, ``embedding`` or ``module.path:callable``."""
    min_unmatched_tokens: int = 256
    """Ask for semantic candidates only when the exact-prefix match leaves at least this many tokens."""
    max_candidates: int = 4
    """Donor candidates decided per request (best first by similarity)."""
    donor_ttl_s: int = 3600
    """Provenance lifetime of a donor registered by the hook (``expires_at = created_at + ttl``)."""
    max_donors_per_scope: int = 1024
    """Donors kept per tenant and namespace (oldest dropped first)."""
    detokenizer: str = "auto"
    """Donor text for the PII scan (SGLang keeps no prompt text): ``auto`` (the served model's tokenizer,
    local files only), ``none`` (donors are registered unscanned; the default policy then denies them)
    or ``module.path:callable`` (a factory returning ``f(token_ids) -> str``)."""
    decision_timeout_ms: int = 100
    """How long a request is held back from admission while its decision is made (on the decision
    thread; the policy engine gets the same limit, past which it is a signed deny): past that the
    request is admitted and runs cold. The scheduler never waits for it."""
    audit_wait_ms: int = 50
    """How long a request with an allow decision is held back further until that record is durable
    in the audit log (usually it already is); past that it is admitted and runs cold."""
    strict: bool = False
    """Raise on an invariant violation (tests); production disables reuse and keeps serving cold."""
    async_registration: bool = True
    """Register donors (PII scan, provenance signing) off the scheduler: in the decision process, or
    on a background thread without it (off: the scheduler thread waits for each registration)."""
    async_decisions: bool = True
    """Decide and sign engine events on the decision thread, off the scheduler (off: inline, for
    tests that step the cache by hand)."""
    decision_process: bool = True
    """With async decisions: register donors, search candidates, decide and sign engine events in a
    child process (:mod:`engine_hooks.core.decider`), outside the scheduler's interpreter lock."""
    warmup: bool = True
    """Run the whole decision path once on a synthetic input at start and after each policy reload,
    on the decision thread or process (:mod:`engine_hooks.core.warmup`), so that the first real
    decision does not pay its lazy initialisation (imports, models, caches) past the deadline."""
    max_regions: int = 4
    """Approved runs realized past the front of a prompt (after fresh tokens), per request: each
    ends a prefill chunk where it starts and costs one more prefill round; 0 turns it off."""
    min_region_tokens: int = 64
    """The shortest such run worth its extra prefill round (shorter ones are computed)."""
    shifted_recompute_pct: int = 0
    """At least this percent of every shifted span's leading tokens is recomputed instead of copied,
    on top of what the decision record plans (the policy's ``quality`` section; the default policy
    plans 20%, at least 16 tokens); those spans are then realized as regions."""
    audit_keyring: Path | None = None
    """Audit keyring (docs/formats.md) of other keys whose seals and checkpoints the audit log may end in:
    after rotating ``SEMGOV_SIGNING_KEY``, the previous key (docs/operations.md)."""
    audit_origin: str | None = None
    """The audit log's origin, the name its checkpoints and proofs carry (``SEMGOV_AUDIT_ORIGIN``);
    unset: the log's own, unique per log directory (:mod:`semgov.audit.origin`)."""
    context_key_previous: Path | None = None
    """The gateway's previous HMAC key, accepted for context tokens during a key rotation's grace period
    (scopes and tree keys are always derived from ``SEMGOV_CONTEXT_KEY``)."""
    context_audience: str = ""
    """This deployment's name: a context token is accepted only if its ``aud`` claim is exactly this
    (``SEMGOV_CONTEXT_AUDIENCE``, required: the gateway names the deployment it means)."""
    context_max_lifetime_s: int = 3600
    """A context token whose ``exp`` lies further ahead than this is refused (bounds what a leaked
    token is worth)."""
    tp_pending_donors_per_tenant: int = 256
    """With tensor parallelism: a tenant's finished requests waiting for rank 0 to register them as
    donors; past it a finished request is not a donor (the same on every rank)."""
    canary_rate: float = 0.0
    """Share of finished requests that received shifted KV and were decoded greedily that are replayed
    cold on this server when it is idle and compared (:mod:`engine_hooks.core.canary`); 0: off."""
    canary_tokens: int = 16
    """Output tokens a canary compares (the replay decodes exactly as many of the warm output)."""
    canary_budget: int = 0
    """Canary regressions tolerated per scope (tenant, namespace, LoRA adapter, task and response
    contract); one more turns shifted reuse off there (until another policy revision is deployed)."""
    canary_queue: int = 16
    """Canaries waiting for an idle moment; more are dropped (counted)."""
    canary_tenant_queue: int = 4
    """Of those, the most one tenant's canaries may take: one tenant's burst never crowds out the
    measurement of another's scopes."""
    canary_probation: int = 4
    """Matching canaries a scope needs, under this policy revision, before shifted reuse is trusted
    there for requests no canary can check; until then only replayable requests get shifted KV,
    and each is replayed (0: unmeasured scopes are trusted; a lost state file then re-enables)."""
    canary_idle_ms: int = 200
    """A canary is sent only when no prefill round has seen a waiting request for this long."""
    canary_timeout_s: int = 300
    """How long a canary's replay may take before it counts as failed (neither match nor regression)."""
    shadow_policy: Path | None = None
    """A second policy decided alongside the live one for every candidate: its decisions are signed
    and audited as ``semgov.shadow_decision/v1`` records and never acted on (docs/policy.md)."""
    capture_dir: Path | None = None
    """Where decided requests are captured (``semgov.captured_request/v1`` JSON Lines, rotated by
    size) for ``semgov check`` and ``semgov diff``; None: no capture. A capture is personal data
    (token ids decode back to the prompt text): docs/operations.md "Live capture"."""
    capture_rate: float = 0.0
    """Share of decided requests captured: no default, ``SEMGOV_CAPTURE_RATE`` must be set with
    ``SEMGOV_CAPTURE_DIR`` (a conscious choice of how much personal data to keep)."""
    capture_text: bool = False
    """Capture prompt text too (off: token ids, segments and signed provenance only)."""
    capture_max_mb: int = 64
    """A capture file is rotated once it would grow past this many MiB."""
    capture_max_total_mb: int = 1024
    """The capture directory's files together stay under this many MiB (the oldest are deleted)."""
    capture_max_age_h: int = 168
    """No captured request is kept much longer than this many hours (files are deleted by age)."""
    reload_poll_ms: int = 1000
    """How often the policy files and the keyring are checked for changes (a change reloads them
    between two decisions; so does SIGHUP to the scheduler process); 0: on SIGHUP only."""
    bundle: str | None = None
    """Where signed policy bundles come from (docs/bundles.md): a directory bundles (``*.tar.gz``) are
    dropped in, or an ``http(s)://`` URL polled every ``SEMGOV_RELOAD_POLL_MS``. A verified, newer
    bundle's policy and keyring replace ``SEMGOV_POLICY`` and ``SEMGOV_TRUST``."""
    bundle_trust: Path | None = None
    """The ES256 keys bundles must be signed with (JSON in OPA's ``keys`` shape); required with a bundle."""
    bundle_force: bool = False
    """Install the highest revision the bundle source offers even when it is lower than the one that runs."""
    bundle_work_dir: Path | None = None
    """Where verified bundles are unpacked and the installed revision is kept (default: the audit
    directory's sibling ``<audit dir>.bundles``)."""
    log_format: str | None = None
    """``json``: the hook's log lines (and semgov's, in this process and the decision process) as
    JSON lines with their fields (request id, decision id, tenant where a line has them); ``text``;
    None (unset): leave the process's structlog configuration as it is."""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookSettings:
        """Read the settings (raises :class:`HookConfigError` naming the variable)."""
        e = _Env(os.environ if env is None else env)
        audit = e.text("SEMGOV_AUDIT_DIR")
        if not audit:
            raise HookConfigError("SEMGOV_AUDIT_DIR is not set: every decision and realization is audited")
        ctx = ContextSettings.from_env(env)
        bundle = _bundle_settings(e, Path(audit))
        return cls(
            policy=e.path("SEMGOV_POLICY"),
            trust=e.path("SEMGOV_TRUST"),
            signing_key=e.path("SEMGOV_SIGNING_KEY"),
            context_key=ctx.context_key,
            audit_dir=Path(audit),
            engine=e.text("SEMGOV_ENGINE") or None,
            provider=e.text("SEMGOV_PROVIDER") or "minhash",
            min_unmatched_tokens=e.integer("SEMGOV_MIN_UNMATCHED_TOKENS", 256, 1, 1 << 24),
            max_candidates=e.integer("SEMGOV_MAX_CANDIDATES", 4, 1, 64),
            donor_ttl_s=e.integer("SEMGOV_DONOR_TTL_S", 3600, 1, 366 * 86400),
            max_donors_per_scope=e.integer("SEMGOV_MAX_DONORS_PER_SCOPE", 1024, 1, 1 << 20),
            detokenizer=e.text("SEMGOV_DETOKENIZER") or "auto",
            decision_timeout_ms=e.integer("SEMGOV_DECISION_TIMEOUT_MS", 100, 1, 60_000),
            audit_wait_ms=e.integer("SEMGOV_AUDIT_WAIT_MS", 50, 0, 10_000),
            strict=e.flag("SEMGOV_STRICT", False),
            async_registration=e.flag("SEMGOV_ASYNC_REGISTRATION", True),
            async_decisions=e.flag("SEMGOV_ASYNC_DECISIONS", True),
            decision_process=e.flag("SEMGOV_DECISION_PROCESS", True),
            warmup=e.flag("SEMGOV_WARMUP", True),
            max_regions=e.integer("SEMGOV_MAX_REGIONS", 4, 0, 64),
            min_region_tokens=e.integer("SEMGOV_MIN_REGION_TOKENS", 64, 1, 1 << 24),
            shifted_recompute_pct=e.integer("SEMGOV_SHIFTED_RECOMPUTE_PCT", 0, 0, 100),
            audit_keyring=e.optional_path("SEMGOV_AUDIT_KEYRING"),
            audit_origin=e.text("SEMGOV_AUDIT_ORIGIN") or None,
            context_key_previous=ctx.context_key_previous,
            context_audience=ctx.context_audience,
            context_max_lifetime_s=ctx.context_max_lifetime_s,
            tp_pending_donors_per_tenant=e.integer("SEMGOV_TP_PENDING_DONORS_PER_TENANT", 256, 1, 8192),
            canary_rate=e.share("SEMGOV_CANARY_RATE"),
            canary_tokens=e.integer("SEMGOV_CANARY_TOKENS", 16, 1, 4096),
            canary_budget=e.integer("SEMGOV_CANARY_BUDGET", 0, 0, 1 << 20),
            canary_queue=e.integer("SEMGOV_CANARY_QUEUE", 16, 1, 4096),
            canary_tenant_queue=e.integer("SEMGOV_CANARY_TENANT_QUEUE", 4, 1, 4096),
            canary_probation=e.integer("SEMGOV_CANARY_PROBATION", 4, 0, 1 << 20),
            canary_idle_ms=e.integer("SEMGOV_CANARY_IDLE_MS", 200, 0, 600_000),
            canary_timeout_s=e.integer("SEMGOV_CANARY_TIMEOUT_S", 300, 1, 86_400),
            shadow_policy=e.optional_path("SEMGOV_SHADOW_POLICY"),
            capture_dir=Path(e.text("SEMGOV_CAPTURE_DIR")) if e.text("SEMGOV_CAPTURE_DIR") else None,
            capture_rate=e.capture_rate(),
            capture_text=e.flag("SEMGOV_CAPTURE_TEXT", False),
            capture_max_mb=e.integer("SEMGOV_CAPTURE_MAX_MB", 64, 1, 1 << 20),
            capture_max_total_mb=e.capture_total(),
            capture_max_age_h=e.integer("SEMGOV_CAPTURE_MAX_AGE_H", 168, 1, 366 * 24),
            reload_poll_ms=e.integer("SEMGOV_RELOAD_POLL_MS", 1000, 0, 3_600_000),
            log_format=e.choice("SEMGOV_LOG_FORMAT", ("text", "json")),
            bundle=bundle[0],
            bundle_trust=bundle[1],
            bundle_force=bundle[2],
            bundle_work_dir=bundle[3],
        )


@dataclass(frozen=True, slots=True)
class ContextSettings:
    """The context-token settings alone (what the vLLM middleware reads; the same variables and
    checks as :class:`HookSettings`)."""

    context_key: Path
    context_key_previous: Path | None
    context_audience: str
    context_max_lifetime_s: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ContextSettings:
        """Read them (raises :class:`HookConfigError` naming the variable)."""
        e = _Env(os.environ if env is None else env)
        return cls(
            context_key=e.path("SEMGOV_CONTEXT_KEY"),
            context_key_previous=e.optional_path("SEMGOV_CONTEXT_KEY_PREVIOUS"),
            context_audience=e.audience("SEMGOV_CONTEXT_AUDIENCE"),
            context_max_lifetime_s=e.integer("SEMGOV_CONTEXT_MAX_LIFETIME_S", 3600, 1, 7 * 86400),
        )


def _bundle_settings(e: _Env, audit: Path) -> tuple[str | None, Path | None, bool, Path | None]:
    """``SEMGOV_BUNDLE``, ``SEMGOV_BUNDLE_TRUST`` (required with it), ``SEMGOV_BUNDLE_FORCE``,
    ``SEMGOV_BUNDLE_WORK_DIR``."""
    source = e.text("SEMGOV_BUNDLE") or None
    if source is None:
        return None, None, False, None
    if not source.startswith(("http://", "https://")) and not Path(source).is_dir():
        raise HookConfigError(f"SEMGOV_BUNDLE={source}: neither a directory nor an http(s):// URL")
    if not e.text("SEMGOV_BUNDLE_TRUST"):
        raise HookConfigError("SEMGOV_BUNDLE is set without SEMGOV_BUNDLE_TRUST: whose bundles are trusted?")
    work = e.text("SEMGOV_BUNDLE_WORK_DIR")
    workdir = Path(work) if work else audit.with_name(audit.name + ".bundles")
    return source, e.path("SEMGOV_BUNDLE_TRUST"), e.flag("SEMGOV_BUNDLE_FORCE", False), workdir


class _Env:
    """One variable of the environment read as a setting's type (raises :class:`HookConfigError`
    naming it); unset or blank means the default."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, name: str) -> str:
        return self.env.get(name, "").strip()

    def path(self, name: str) -> Path:
        v = self.text(name)
        if not v:
            raise HookConfigError(
                f"{name} is not set: the semgov radix-cache backend needs it (docs/sglang.md)"
            )
        p = Path(v)
        if not p.exists():
            raise HookConfigError(f"{name}={v}: no such file or directory")
        return p

    def audience(self, name: str) -> str:
        v = self.text(name)
        if not v:
            raise HookConfigError(
                f"{name} is not set: name this deployment (context tokens carry it as their aud claim)"
            )
        if not (len(v) <= 128 and all("!" <= c <= "~" for c in v)):
            raise HookConfigError(
                f"{name}={v[:40]!r}: must be 1..128 printable ASCII characters without spaces"
            )
        return v

    def optional_path(self, name: str) -> Path | None:
        return self.path(name) if self.text(name) else None

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        v = self.text(name)
        if not v:
            return default
        try:
            n = int(v)
        except ValueError:
            raise HookConfigError(f"{name}={v!r}: not an integer") from None
        if not lo <= n <= hi:
            raise HookConfigError(f"{name}={n}: must be between {lo} and {hi}")
        return n

    def flag(self, name: str, default: bool) -> bool:
        v = self.text(name).lower()
        if not v:
            return default
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
        raise HookConfigError(f"{name}={v!r}: expected 1/0, true/false, yes/no or on/off")

    def choice(self, name: str, choices: tuple[str, ...]) -> str | None:
        v = self.text(name).lower()
        if not v:
            return None
        if v not in choices:
            raise HookConfigError(f"{name}={v!r}: expected one of {', '.join(choices)}")
        return v

    def capture_rate(self) -> float:
        """``SEMGOV_CAPTURE_RATE``: required with ``SEMGOV_CAPTURE_DIR`` (no default share)."""
        if self.text("SEMGOV_CAPTURE_DIR") and not self.text("SEMGOV_CAPTURE_RATE"):
            raise HookConfigError(
                "SEMGOV_CAPTURE_DIR is set but SEMGOV_CAPTURE_RATE is not: a capture is personal data; "
                "choose the share of requests to keep (e.g. 0.01; 1 keeps every one; docs/operations.md)"
            )
        return self.share("SEMGOV_CAPTURE_RATE")

    def capture_total(self) -> int:
        """``SEMGOV_CAPTURE_MAX_TOTAL_MB``: at least one capture file (``SEMGOV_CAPTURE_MAX_MB``)."""
        file_mb = self.integer("SEMGOV_CAPTURE_MAX_MB", 64, 1, 1 << 20)
        return self.integer("SEMGOV_CAPTURE_MAX_TOTAL_MB", max(1024, file_mb), file_mb, 1 << 24)

    def share(self, name: str, default: float = 0.0) -> float:
        v = self.text(name)
        if not v:
            return default
        try:
            x = float(v)
        except ValueError:
            raise HookConfigError(f"{name}={v!r}: not a number") from None
        if not 0.0 <= x <= 1.0:  # NOTE: also refuses nan
            raise HookConfigError(f"{name}={v}: must be between 0 and 1 (a share of requests)")
        return x


def read_context_key(path: Path, name: str = "SEMGOV_CONTEXT_KEY") -> bytes:
    """The gateway HMAC key (raises :class:`HookConfigError` naming the variable and the file)."""
    try:
        raw = path.read_bytes().strip()
    except OSError as e:
        raise HookConfigError(f"{name}={path}: cannot read ({e.strerror})") from e
    if len(raw) < 32:
        raise HookConfigError(f"{name}={path}: key must be at least 32 bytes, got {len(raw)}")
    return raw
