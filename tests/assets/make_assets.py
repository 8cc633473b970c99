"""Regenerate the committed test fixtures (real keys, real signatures).

Run from the repository root: ``python tests/assets/make_assets.py``. Only needed
when a wire format changes on purpose; the committed files pin the formats.
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from semgov import Evaluator, Keyring, generate_keypair, load_policy, load_signing_key  # noqa: E402
from semgov.signing.engine_events import engine_event, sign_engine_event  # noqa: E402
from semgov.signing.keys import SigningKey, public_pem  # noqa: E402
from tests.conftest import DEFAULT_POLICY_DIR, candidate, parse, request  # noqa: E402


class _Keys:
    pass


def main() -> None:
    tmp = HERE / "_tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for name in ("decision-signing-key.pem", "decision-signing-key.pub.pem", "provenance-k1.pem"):
        (HERE / name).unlink(missing_ok=True)
    generate_keypair(tmp / "d")
    generate_keypair(tmp / "p")
    shutil.move(tmp / "d" / "signing-key.pem", HERE / "decision-signing-key.pem")
    shutil.move(tmp / "d" / "signing-key.pub.pem", HERE / "decision-signing-key.pub.pem")
    shutil.move(tmp / "p" / "signing-key.pem", HERE / "provenance-k1.pem")
    shutil.rmtree(tmp)
    k1 = SigningKey.from_private(load_signing_key(HERE / "provenance-k1.pem").private_key, "k1")
    (HERE / "keyring.json").write_text(
        json.dumps(
            {"keys": [{"key_id": "k1", "public_key": public_pem(k1.public_key), "revoked": False}]}, indent=2
        )
        + "\n"
    )
    keys = _Keys()
    keys.k1 = k1  # type: ignore[attr-defined]
    reqs = [
        request(
            [candidate(keys, "r-03"), candidate(keys, "r-04", tenant="globex")],  # type: ignore[arg-type]
            expect={"r-03": "allow", "r-04": "deny"},
        ),
        request(
            [candidate(keys, "r-05", similarity=0.2)],
            request_id="r-18",  # type: ignore[arg-type]
            expect={"r-05": "deny"},
        ),
    ]
    lines = [json.dumps(r, separators=(",", ":")) for r in reqs]
    # line 2 is malformed (segments do not tile); its donor still gets a deny
    broken = json.loads(lines[1])
    broken["request_id"] = "r-bad"
    broken["prompt"]["segments"][0]["end"] += 1
    lines.insert(1, json.dumps(broken, separators=(",", ":")))
    (HERE / "captured-small.jsonl").write_text("\n".join(lines) + "\n")
    ev = Evaluator(
        load_policy(DEFAULT_POLICY_DIR),
        Keyring.load(HERE / "keyring.json"),
        load_signing_key(HERE / "decision-signing-key.pem"),
    )
    out = [d.canonical.decode() for d in ev.evaluate(parse(reqs[0]))]
    (HERE / "decisions.jsonl").write_text("\n".join(out) + "\n")
    engine_events()


def engine_events() -> None:
    """``engine-events.jsonl``: a realization of the allowed decision in decisions.jsonl, and a
    reuse_disabled event, signed with the decision signing key."""
    key = load_signing_key(HERE / "decision-signing-key.pem")
    allowed = next(
        r
        for r in map(json.loads, (HERE / "decisions.jsonl").read_text().splitlines())
        if r["decision"] == "allow"
    )
    at = datetime(2026, 11, 29, 10, 0, 0, 250000, tzinfo=UTC)
    events = [
        engine_event(
            "realization",
            engine="sglang 0.5.23",
            request_id=allowed["request_id"],
            decision_id=allowed["decision_id"],
            donor_id=allowed["donor_id"],
            materialized_tokens=allowed["approved_tokens"],
            slots=[*range(4096, 4096 + 300), *range(100, 100 + allowed["approved_tokens"] - 300)],
            spans=[{k: v for k, v in s.items() if k != "recompute"} for s in allowed["approved_spans"]],
            at=at,
        ),
        engine_event("reuse_disabled", engine="sglang 0.5.23", detail="audit log unavailable", at=at),
    ]
    out = [sign_engine_event(e, key).canonical.decode() for e in events]
    (HERE / "engine-events.jsonl").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
