"""The hook's policies: the live one, an optional shadow one, and their reload between decisions.

- :class:`LoadedPolicy` is one policy (``SEMGOV_POLICY`` or ``SEMGOV_SHADOW_POLICY``) loaded with
  the trust keyring into an :class:`~semgov.decide.Evaluator`.
- :class:`HookPolicies` is what decides, wherever the hook decides (the decision thread of the
  scheduler process, or the decision process): :meth:`HookPolicies.decide_live` makes the signed
  decisions the engine acts on; :meth:`HookPolicies.decide_shadow` decides the same request under
  the shadow policy into ``semgov.shadow_decision/v1`` records, audited and never acted on; the
  request is then offered to the live capture (``SEMGOV_CAPTURE_DIR``), sampled.
- :meth:`HookPolicies.reload` reads the policies and the keyring again (on SIGHUP or a file change,
  :mod:`engine_hooks.core.reload`). Each is built completely before it replaces the one in
  force; one that fails to load leaves the old one deciding. Every outcome that changed something
  or failed is a :class:`ReloadOutcome`, audited as a ``policy_loaded`` / ``policy_load_failed``
  engine event.

NOTE: invariants:
- ``decide_*`` and ``reload`` run on one thread (the decision thread, or the decision process's
  main loop), so a reload lands between two decisions, never inside one: every decision is made,
  and its record names (``policy.revision``), exactly one revision.
- Other threads (a registration thread) read ``live`` once per use and keep that object: swapping
  the attribute is the whole reload.
- The shadow policy never changes what the engine does: its records are a separate schema, and
  :meth:`decide_shadow` runs after the live decisions are handed over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from engine_hooks.core.bundles import InstalledBundle, read_state
from engine_hooks.core.donors import DonorEntry, prompt_of
from engine_hooks.core.metrics import HookMetrics
from engine_hooks.core.reload import fingerprint
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.context import RequestContext, bounded_repr
from semgov.decide import Evaluator
from semgov.errors import SemgovError
from semgov.facts.pii import PiiScanner
from semgov.intake.capture_writer import CaptureWriter
from semgov.log import describe_error, get_logger
from semgov.policy.calibration import trial_source
from semgov.policy.engine import PolicySource
from semgov.policy.source import load_policy_source, make_engine
from semgov.signing.keys import Keyring, SigningKey
from semgov.signing.shadow import shadow_record
from semgov.typing import SignedDecision
from semgov.wire.models import CAPTURED_REQUEST_SCHEMA, Candidate, CapturedRequest

Role = Literal["live", "shadow"]
MAX_TRIALS = 8  # calibration trial policies kept (one per plan a run tries; the newest kept)


def read_trust(settings: HookSettings) -> tuple[bytes, str]:
    """The keyring file's bytes and their digest, read once (the digest an outcome audits is that
    of the bytes the keyring in force was parsed from, never of a later or earlier read)."""
    raw = _read_bytes(settings.trust)
    return raw, "sha256:" + hashlib.sha256(raw).hexdigest()


def load_own_key(settings: HookSettings) -> SigningKey:
    """The hook's signing key (``SEMGOV_SIGNING_KEY``), named as the trust keyring names it.

    NOTE: the hook signs donor provenance and decision records with this key and verifies them
    with ``SEMGOV_TRUST``: a keyring that calls the key ``k1`` must get signatures by ``k1``
    (``load_signing_key`` with the keyring), or every donor would be refused."""
    from semgov.errors import SemgovError
    from semgov.signing.keys import load_signing_key

    try:
        keyring = Keyring.parse(_read_bytes(settings.trust), str(settings.trust))
        return load_signing_key(settings.signing_key, keyring)
    except SemgovError as e:
        raise HookConfigError(
            f"SEMGOV_SIGNING_KEY={settings.signing_key} with SEMGOV_TRUST={settings.trust}: {e}"
        ) from e


def load_trust(settings: HookSettings, own: SigningKey, raw: bytes | None = None) -> Keyring:
    """The keyring decisions are verified with (parsed from ``raw``, or read): it must hold the
    hook's own key."""
    raw = _read_bytes(settings.trust) if raw is None else raw
    keyring = Keyring.parse(raw, str(settings.trust))
    if keyring.get(own.key_id) is None:
        raise HookConfigError(
            f"SEMGOV_TRUST={settings.trust} does not hold the hook's own key {own.key_id} "
            f"(SEMGOV_SIGNING_KEY): donors the hook registers could never be verified"
        )
    return keyring


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise HookConfigError(f"{path}: cannot read ({e.strerror})") from e


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """One policy loaded for deciding: its source and the evaluator that decides with it."""

    role: Role
    path: Path
    source: PolicySource
    evaluator: Evaluator
    keyring_digest: str  # digest of the keyring file bytes its evaluator's keyring was parsed from

    @property
    def version(self) -> str:
        """``name@version``: what a donor's provenance names, and the version gate compares."""
        return f"{self.source.name}@{self.source.version}"

    @property
    def revision(self) -> str:
        return self.source.revision


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """What one reload did to one policy (audited as an engine event; ``detail`` says it all)."""

    role: Role
    ok: bool
    version: str  # in force after the reload
    revision: str  # in force after the reload
    previous_version: str
    previous_revision: str
    keyring: str  # digest of the trust keyring in force after the reload
    error: str | None = None
    bundle: str | None = None  # the bundle revision this outcome installed (or failed to)
    bundle_detail: str = ""  # which bundle: source, signing key, digest

    @property
    def kind(self) -> str:
        return "policy_loaded" if self.ok else "policy_load_failed"

    @property
    def detail(self) -> str:
        if not self.ok:
            return (
                f"{self.role} policy not reloaded: {self.error}; still deciding with "
                f"{self.version} revision {self.revision}"
            )[:2000]
        return (
            f"{self.role} policy {self.version} revision {self.revision} (keyring {self.keyring}); "
            f"replaced {self.previous_version} revision {self.previous_revision}"
            + (f"; from {self.bundle_detail}" if self.bundle_detail else "")
        )


@dataclass(frozen=True, slots=True)
class LiveDecided:
    """The live decisions of one request, and the request they were made on (for the shadow)."""

    request: CapturedRequest
    decisions: list[SignedDecision]
    now: datetime
    calibration: bool = False  # decided for a calibration run (no shadow, no capture)


def build_request(
    now: datetime,
    request_id: str,
    ctx: RequestContext,
    token_ids: Sequence[int],
    text: str | None,
    candidates: Sequence[tuple[DonorEntry, float]],
) -> CapturedRequest:
    """The ``semgov.captured_request/v1`` document one recipient is decided on (and captured as)."""
    return CapturedRequest.model_validate(
        {
            "schema": CAPTURED_REQUEST_SCHEMA,
            "request_id": request_id,
            "received_at": now,
            "tenant": ctx.tenant,
            "namespace": ctx.namespace,
            "task": ctx.task,
            "response_contract": ctx.response_contract,
            "prompt": prompt_of(token_ids, text, ctx),
            "candidates": [
                Candidate.model_validate(
                    {
                        "donor_id": d.donor_id,
                        "similarity": sim,
                        "prompt": d.prompt,
                        "provenance": d.provenance,
                    }
                )
                for d, sim in candidates
            ],
        }
    )


class HookPolicies:
    """The live policy, the optional shadow policy, the keyring they verify with, and the capture."""

    def __init__(
        self,
        settings: HookSettings,
        key: SigningKey,
        *,
        capture: CaptureWriter | None = None,
        rng: random.Random | None = None,
        metrics: HookMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.key = key
        self.capture = capture
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.bundle: InstalledBundle | None = None  # the bundle the live policy came from
        self._bundle_failed: str | None = None  # digest of the last bundle that did not install
        settings = self._resume_bundle(settings)
        raw, digest = read_trust(settings)
        keyring = load_trust(settings, key, raw)
        self.live = self._load("live", settings.policy, (keyring, digest), None)
        self._trials: dict[tuple[str, str], Evaluator | None] = {}  # (live revision, plan) -> trial
        self.shadow: LoadedPolicy | None = None
        if settings.shadow_policy is not None:
            try:
                self.shadow = self._load(
                    "shadow", settings.shadow_policy, (keyring, digest), self.live.evaluator.ctx.pii_scanner
                )
            except SemgovError as e:
                raise HookConfigError(f"SEMGOV_SHADOW_POLICY={settings.shadow_policy}: {e}") from e

    def _resume_bundle(self, settings: HookSettings) -> HookSettings:
        """With ``SEMGOV_BUNDLE``: the settings pointed at the installed bundle (``current.json``),
        when there is one and it loads; else the baseline ``SEMGOV_POLICY`` and ``SEMGOV_TRUST``."""
        state = read_state(settings.bundle_work_dir) if settings.bundle_work_dir is not None else None
        if settings.bundle is None or state is None:
            return settings
        resumed = dataclasses.replace(settings, policy=state.policy, trust=state.keyring)
        try:
            load_trust(resumed, self.key)
            load_policy_source(resumed.policy)
        except (OSError, SemgovError, ValueError) as e:
            get_logger().error(
                "semgov installed bundle does not load: starting from SEMGOV_POLICY",
                bundle=state.describe(),
                error=describe_error(e),
            )
            return settings
        self.settings, self.bundle = resumed, state
        return resumed

    @property
    def keyring_digest(self) -> str:
        """Digest of the keyring the live policy decides with."""
        return self.live.keyring_digest

    def _load(
        self,
        role: Role,
        path: Path,
        trust: tuple[Keyring, str],
        scanner: PiiScanner | None,
        source: PolicySource | None = None,
    ) -> LoadedPolicy:
        """Load one policy (unless ``source`` is it, loaded) and build its evaluator with the keyring
        ``trust`` (and its digest); raises what loading raises."""
        source = load_policy_source(path) if source is None else source
        keyring, digest = trust
        engine = self.settings.engine if role == "live" else None
        evaluator = Evaluator(
            source,
            keyring,
            self.key,
            engine=make_engine(source, engine or "auto"),
            engine_timeout=self.settings.decision_timeout_ms / 1000,
            pii_scanner=scanner,
        )
        return LoadedPolicy(role, path, source, evaluator, digest)

    # ---- deciding ----------------------------------------------------------------------------

    def decide_live(
        self,
        now: datetime,
        request_id: str,
        ctx: RequestContext,
        token_ids: Sequence[int],
        text: str | None,
        candidates: Sequence[tuple[DonorEntry, float]],
    ) -> LiveDecided:
        """One signed live decision per candidate (the evaluator denies on any candidate's error).

        Raises only when the request itself cannot be built (the caller then decides nothing).
        """
        req = build_request(now, request_id, ctx, token_ids, text, candidates)
        calibration = ctx.calibration
        if calibration is not None:
            # NOTE: a calibration recipient: the live policy plus the run's plan (its own revision);
            # no shadow record and no capture (its traffic is the calibration run's, not production's).
            evaluator = self.trial_evaluator(calibration.plan) if calibration.role == "recipient" else None
            if evaluator is None:
                raise ValueError(f"a calibration {calibration.role} is not decided")
            return LiveDecided(req, evaluator.evaluate(req, now=now), now, calibration=True)
        return LiveDecided(req, self.live.evaluator.evaluate(req, now=now), now)

    def trial_evaluator(self, plan: str | None) -> Evaluator | None:
        """The evaluator of the live policy's calibration trial for ``plan``
        (:func:`semgov.policy.calibration.trial_source`), built once per live revision and plan
        (the newest :data:`MAX_TRIALS` kept); None when there is none (the request is not decided).
        """
        live = self.live
        key = (live.revision, plan or "")
        found = self._trials.get(key)
        if found is not None or key in self._trials:
            return found
        evaluator: Evaluator | None = None
        try:
            source = trial_source(live.source, plan or "")
            evaluator = self._load("live", live.path, (live.evaluator.ctx.keyring, live.keyring_digest),
                                   live.evaluator.ctx.pii_scanner, source).evaluator  # fmt: skip
        except (SemgovError, ValueError) as e:
            get_logger().warning(
                "semgov calibration plan refused: its recipients are not decided",
                plan=bounded_repr(plan), revision=live.revision, error=describe_error(e),
            )  # fmt: skip
        while len(self._trials) >= MAX_TRIALS:
            self._trials.pop(next(iter(self._trials)))
        self._trials[key] = evaluator
        return evaluator

    def decide_shadow(self, live: LiveDecided) -> list[SignedDecision]:
        """The shadow policy's records for the same request (none without one), then the capture.

        Never raises: a shadow that fails records nothing (logged); the live path is already done.
        """
        out: list[SignedDecision] = []
        if live.calibration:
            return out
        shadow = self.shadow
        if shadow is not None:
            try:
                by_donor = {d.donor_id: d for d in live.decisions}
                for d in shadow.evaluator.evaluate(live.request, now=live.now):
                    out.append(shadow_record(d, by_donor.get(d.donor_id), self.key))
            except Exception as e:  # noqa: BLE001 - the shadow never affects serving
                out = []
                get_logger().warning(
                    "semgov shadow decision failed",
                    request_id=live.request.request_id,
                    error=describe_error(e),
                )
        self.offer_capture(live.request)
        return out

    def offer_capture(self, req: CapturedRequest) -> None:
        """Hand one decided request to the capture, sampled at ``SEMGOV_CAPTURE_RATE`` (never blocks)."""
        if self.capture is None:
            return
        rate = self.settings.capture_rate
        if rate >= 1.0 or self.rng.random() < rate:
            kept = self.capture.offer(req)
            if self.metrics is not None:
                self.metrics.capture(kept)

    # ---- reloading ---------------------------------------------------------------------------

    def reload(self) -> list[ReloadOutcome]:
        """Install a newly verified bundle (``SEMGOV_BUNDLE``, :mod:`engine_hooks.core.bundles`),
        or else read the policy files and the keyring again (:meth:`reload_files`)."""
        state = self._new_bundle()
        if state is None:
            return self.reload_files()
        before = self.settings
        self.settings = dataclasses.replace(before, policy=state.policy, trust=state.keyring)
        outcomes = self.reload_files()
        if any(not o.ok for o in outcomes):
            self.settings, self._bundle_failed = before, state.digest
            return [
                dataclasses.replace(
                    o,
                    bundle=state.revision,
                    bundle_detail=state.describe(),
                    error=f"{state.describe()}: {o.error}",
                )
                if not o.ok
                else o
                for o in outcomes
            ]
        self.bundle = state
        if not any(o.role == "live" for o in outcomes):  # NOTE: same policy and keyring, new bundle
            live = self.live
            outcomes.insert(
                0,
                ReloadOutcome(
                    "live",
                    True,
                    live.version,
                    live.revision,
                    live.version,
                    live.revision,
                    live.keyring_digest,
                ),
            )
        return [
            dataclasses.replace(o, bundle=state.revision, bundle_detail=state.describe())
            if o.role == "live"
            else o
            for o in outcomes
        ]

    def _new_bundle(self) -> InstalledBundle | None:
        """The installed bundle ``current.json`` names, when it is not the one deciding (nor one
        that already failed to load)."""
        work = self.settings.bundle_work_dir
        if self.settings.bundle is None or work is None:
            return None
        state = read_state(work)
        if state is None or state.digest in (
            self._bundle_failed,
            self.bundle.digest if self.bundle else None,
        ):
            return None
        return state

    def reload_files(self) -> list[ReloadOutcome]:
        """Read the keyring and the policies again; replace each that loads and changed.

        Returns an outcome for each policy that changed (new revision, or a new keyring) or failed
        to load; nothing when the files say what is already in force. The keyring is read once and
        its digest taken of those bytes; each policy keeps the digest of the keyring its evaluator
        holds, so an outcome never names a keyring that is not in force (a policy that fails to
        load keeps its old keyring and digest, and takes the new keyring at the next reload).
        """
        try:
            raw, digest = read_trust(self.settings)
            stale = [p for p in (self.live, self.shadow) if p is not None and p.keyring_digest != digest]
            keyring = load_trust(self.settings, self.key, raw) if stale else None
        except (OSError, SemgovError, ValueError) as e:
            why = f"keyring {self.settings.trust}: {e}"
            return [self._failed(p, why) for p in (self.live, self.shadow) if p is not None]
        out = []
        for current in (self.live, self.shadow):
            if current is None:
                continue
            fresh = (keyring, digest) if keyring is not None and current.keyring_digest != digest else None
            outcome = self._reload_one(current, fresh)
            if outcome is not None:
                out.append(outcome)
        return out

    def _reload_one(self, current: LoadedPolicy, fresh: tuple[Keyring, str] | None) -> ReloadOutcome | None:
        """Reload one policy (with the new keyring and its digest, if there is one); None when
        nothing changed. Files that change while they are read are not installed (the watcher
        asks again once they settle)."""
        path = self.settings.policy if current.role == "live" else current.path
        before = fingerprint([path])
        try:
            source = load_policy_source(path)
        except (OSError, SemgovError, ValueError) as e:
            return self._failed(current, f"{path}: {e}")
        if source.revision == current.revision and fresh is None:
            return None  # NOTE: the same bytes: nothing to do, nothing to audit
        scanner = self.live.evaluator.ctx.pii_scanner
        trust = fresh or (current.evaluator.ctx.keyring, current.keyring_digest)
        try:
            new = self._load(current.role, path, trust, scanner, source)
        except Exception as e:  # noqa: BLE001 - a policy that cannot be built keeps the old one
            return self._failed(current, f"{path}: {type(e).__name__}: {e}")
        if fingerprint([path]) != before:
            return self._failed(current, f"{path}: changed while it was read (not installed)")
        if current.role == "live":
            self.live = new
        else:
            self.shadow = new
        return ReloadOutcome(
            current.role,
            True,
            new.version,
            new.revision,
            current.version,
            current.revision,
            new.keyring_digest,
        )

    def _failed(self, current: LoadedPolicy, why: str) -> ReloadOutcome:
        get_logger().error(
            "semgov policy reload failed: keeping the policy in force",
            role=current.role,
            error=why[:500],
            revision=current.revision,
        )
        return ReloadOutcome(
            current.role,
            False,
            current.version,
            current.revision,
            current.version,
            current.revision,
            current.keyring_digest,
            why,
        )


def open_capture(settings: HookSettings) -> CaptureWriter | None:
    """The live capture (``SEMGOV_CAPTURE_DIR``), or None (raises :class:`HookConfigError` naming it)."""
    if settings.capture_dir is None:
        return None
    try:
        return CaptureWriter(
            settings.capture_dir,
            max_file_bytes=settings.capture_max_mb << 20,
            keep_text=settings.capture_text,
            max_total_bytes=settings.capture_max_total_mb << 20,
            max_age_s=settings.capture_max_age_h * 3600.0,
        )
    except (OSError, SemgovError, ValueError) as e:
        raise HookConfigError(f"SEMGOV_CAPTURE_DIR={settings.capture_dir}: {e}") from e
