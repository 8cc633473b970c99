"""Rolling a policy out without surprise: does a new policy accept the donors of the one it replaces?

Every donor's signed provenance names the ``name@version`` of the policy it was produced under,
and the ``policy_version`` gate denies donors of any version the deciding policy does not accept.
Renaming or bumping a policy therefore denies every live donor until it expires, unless the new
policy lists the old ``name@version`` as accepted (YAML ``accepted_policy_versions``, the Rego
convention's constant of the same name).

:func:`accepts_version` asks the policy's own engine, whatever the language: it decides one
synthetic document whose every fact is benign and whose donor names ``ref``, and reads the
``policy_version`` gate. No rule is read by hand, so what it says is what deciding would do.
"""

from __future__ import annotations

from dataclasses import dataclass

from semgov.policy.engine import PolicyEngine, PolicySource
from semgov.wire.models import ResponseContract, TaskRef
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

_NOW_NS = 1_796_083_200 * 10**9  # 2026-12-01T00:00:00Z
_TASK = TaskRef(id="rollout-probe", version="1")
_CONTRACT = ResponseContract(id="rollout-probe", schema_sha256="0" * 64)


def probe(ref: str) -> PolicyInput:
    """A policy input whose donor was produced under ``ref`` and whose other facts all look fine."""
    tokens = 4096
    return PolicyInput(
        now="2026-12-01T00:00:00Z",
        now_ns=_NOW_NS,
        request=RequestFacts("probe-request", "probe", "probe/ns", _TASK, _CONTRACT, tokens),
        candidate=CandidateFacts("probe-donor", 1.0, tokens, "probe-key", False),
        facts=Facts(
            provenance=ProvenanceFacts("trusted", True, True, None, True, True, True, True),
            donor=DonorFacts(
                "probe",
                "probe/ns",
                _TASK,
                _CONTRACT,
                "2026-11-30T23:00:00Z",
                "2026-12-02T00:00:00Z",
                _NOW_NS - 3600 * 10**9,
                _NOW_NS + 86400 * 10**9,
                ref,
                "tenant",
            ),  # fmt: skip
            pii=PiiFacts(True, [], False, []),
            tokens=TokenFacts(
                tokens, tokens, tokens, [SpanFacts(0, 0, tokens, "prefix", "system", "system")]
            ),
        ),
    )


def accepts_version(engine: PolicyEngine, ref: str) -> bool | None:
    """Whether ``engine``'s policy accepts donors produced under ``ref`` (None: it cannot tell,
    the engine failed or reports no ``policy_version`` gate outcome of pass or fail)."""
    try:
        result = engine.evaluate(probe(ref))
    except Exception:  # noqa: BLE001 - an engine that cannot decide the probe cannot answer
        return None
    for g in result.gates:
        if g.gate == "policy_version" and g.result in ("pass", "fail"):
            return g.result == "pass"
    return None


@dataclass(frozen=True, slots=True)
class Replacement:
    """What replacing policy ``old`` by ``new`` does to live donors (see :func:`replacement`)."""

    old_ref: str
    new_ref: str
    accepted: bool | None  # does new accept donors produced under old_ref?

    def warning(self) -> str | None:
        """The warning ``semgov policy check --replaces`` prints, or None when there is none."""
        if self.old_ref == self.new_ref or self.accepted is True:
            return None
        if self.accepted is None:
            return (
                f"cannot tell whether {self.new_ref} accepts donors produced under {self.old_ref} "
                "(its engine gave no pass or fail at the policy_version gate)"
            )
        return (
            f"{self.new_ref} does not accept donors produced under {self.old_ref}, the policy it "
            f"replaces: every live donor is denied at the policy_version gate until it expires; "
            f"list {self.old_ref!r} in accepted_policy_versions for the rollout (docs/policy.md, "
            "'Rolling out a policy')"
        )


def replacement(old: PolicySource, new: PolicySource, new_engine: PolicyEngine) -> Replacement:
    """Whether ``new`` (decided by ``new_engine``) keeps the donors produced under ``old``."""
    old_ref, new_ref = f"{old.name}@{old.version}", f"{new.name}@{new.version}"
    return Replacement(old_ref, new_ref, accepts_version(new_engine, old_ref))
