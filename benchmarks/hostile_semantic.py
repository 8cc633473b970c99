"""The hostile campaign's semantic mode: well-formed inputs whose meaning differs from what was signed.

The fuzzing targets (``hostile_targets.py``) break formats; these inputs keep every format valid
and every signature genuine, and change what a field means instead. Each input starts from an
allowed pair (a donor signed by a trusted key, a recipient that reuses its evidence) and applies
one semantic mutation, drawn from a seeded ``random.Random``:

- ``task_split``: the donor's signed task and the request's task are two different
  ``(id, version)`` pairs whose ``id@version`` strings coincide (``qa`` + ``1@2``, ``qa@1`` + ``2``);
- ``segments_relabel``: after signing, a donor segment's role changes, or a boundary between
  two segments moves (the tiling stays valid);
- ``text_swap``: the donor was signed with one text and is offered with another (emptied,
  cleaned of its PII, one character changed);
- ``text_unsigned``: a donor signed without text, declared unscanned, offered with a clean text;
- ``time_edge``: validly signed times exactly at, or 1 ns / 1 us / 1 ms / 1 s past, a validity
  boundary (expiry, not-yet-valid, max age), with nanosecond digits on the clock too;
- ``donor_id_swap``: the candidate's donor id differs from the signed one;
- ``token_swap``: one donor token changed after signing.

Every mutated input must be denied by every engine (YAML and regorus); an allow is counted. A
share of unmutated ``control`` inputs must be allowed: if one is not, the campaign itself is
broken and says so (exit 3). Reproducible from ``--seed``.

Usage: python benchmarks/hostile.py --semantic N [--seed S] (or this file directly).
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from semgov import Evaluator, Keyring, SigningKey, load_policy, provenance_payload, sign_provenance  # noqa: E402
from semgov.policy.rego.engines import RegorusEngine  # noqa: E402
from semgov.policy.rego.loader import load_rego_policy  # noqa: E402
from semgov.signing.keys import TrustedKey  # noqa: E402
from semgov.wire.models import CapturedRequest  # noqa: E402

Json = dict[str, Any]
MUTATIONS = (
    "task_split", "segments_relabel", "text_swap", "text_unsigned", "time_edge", "donor_id_swap",
    "token_swap",
)  # fmt: skip
NOW = datetime(2026, 11, 29, 10, tzinfo=UTC)
MAX_AGE = timedelta(days=30)  # the default policy's expiry.max_age
CONTRACT = {"id": "financials", "schema_sha256": "ab" * 32}
PII_TEXT = "Contact jane.roe@example.com or +1 415 555 0100 about the Q3 filing."
CLEAN_TEXT = "Revenue rose four percent in the third quarter."


def _ts(t: datetime, extra_ns: int = 0) -> str:
    """RFC 3339 with nine fractional digits: ``t`` plus ``extra_ns`` nanoseconds."""
    whole, ns = divmod(t.microsecond * 1000 + extra_ns, 1_000_000_000)
    base = t.replace(microsecond=0) + timedelta(seconds=whole)
    return base.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ns:09d}Z"


class Campaign:
    """Keys, the two engines, and a seeded generator of mutated requests."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.key = SigningKey.from_private(Ed25519PrivateKey.generate(), "k1")
        keyring = Keyring([TrustedKey("k1", self.key.public_key, False)])
        decision = SigningKey.from_private(Ed25519PrivateKey.generate())
        yaml_policy = load_policy(ROOT / "policies" / "default")
        rego_policy = load_rego_policy(ROOT / "policies" / "rego" / "default")
        self.engines = {
            "yaml": Evaluator(yaml_policy, keyring, decision),
            "regorus": Evaluator(rego_policy, keyring, decision, engine=RegorusEngine(rego_policy)),
        }

    # ---- the allowed pair ------------------------------------------------------------------

    def _toks(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 49_000) for _ in range(n)]

    def pair(self) -> tuple[Json, Json, Json]:
        """(donor prompt, recipient prompt, payload keyword arguments) of an allowed pair."""
        system, instr, evidence, q1, q2 = (
            self._toks(n) for n in (24, 40, self.rng.randrange(200, 600), 20, 20)
        )
        donor = _prompt(
            [("system", system), ("instruction", instr), ("evidence", evidence), ("question", q1)]
        )
        recip = _prompt(
            [("system", system), ("instruction", instr), ("evidence", evidence), ("question", q2)]
        )
        task = {"id": "extract_financials", "version": "1"}
        kw: Json = {
            "donor_id": "d-1", "tenant": "acme", "namespace": "research/e1", "task": task,
            "response_contract": CONTRACT, "created_at": NOW - timedelta(days=1),
            "expires_at": NOW + timedelta(days=6), "policy_version": "default@1",
        }  # fmt: skip
        return donor, recip, kw

    def request(self, donor: Json, recip: Json, kw: Json, **over: Any) -> Json:
        payload = provenance_payload(
            token_ids=donor["token_ids"], segments=donor["segments"], text=donor.get("text"), **kw
        )
        payload.update(over.pop("payload", {}))
        cand = {"donor_id": kw["donor_id"], "similarity": 0.9, "prompt": donor,
                "provenance": sign_provenance(payload, self.key)}  # fmt: skip
        req: Json = {
            "schema": "semgov.captured_request/v1", "request_id": "r-1", "received_at": _ts(NOW),
            "tenant": "acme", "namespace": "research/e1", "task": dict(kw["task"]),
            "response_contract": dict(CONTRACT), "prompt": recip, "candidates": [cand],
        }  # fmt: skip
        req.update(over)
        return req

    # ---- mutations -------------------------------------------------------------------------

    def mutate(self, kind: str) -> Json:
        donor, recip, kw = self.pair()
        rng = self.rng
        if kind == "control":
            return self.request(donor, recip, kw)
        if kind == "task_split":
            parts = [rng.choice(["qa", "extract", "x"]) for _ in range(3)]
            kw["task"] = {"id": f"{parts[0]}@{parts[1]}", "version": parts[2]}
            req = self.request(donor, recip, kw)
            req["task"] = {"id": parts[0], "version": f"{parts[1]}@{parts[2]}"}
            return req
        if kind == "segments_relabel":
            req = self.request(donor, recip, kw)
            segs = req["candidates"][0]["prompt"]["segments"]
            i = rng.randrange(len(segs) - 1)
            if rng.random() < 0.5:
                roles = ("system", "instruction", "evidence", "question", "other")
                segs[i]["role"] = rng.choice([r for r in roles if r != segs[i]["role"]])
            else:
                k = rng.choice([-1, 1]) * rng.randrange(1, 4)
                new_end = segs[i]["end"] + k
                if segs[i]["start"] < new_end < segs[i + 1]["end"]:
                    segs[i]["end"] = segs[i + 1]["start"] = new_end
                else:
                    segs[i]["role"] = "evidence" if segs[i]["role"] != "evidence" else "system"
            return req
        if kind == "text_swap":
            signed = rng.choice([PII_TEXT, CLEAN_TEXT])
            donor["text"] = signed
            req = self.request(donor, recip, kw)
            offered = rng.choice(["", " ", CLEAN_TEXT if signed == PII_TEXT else PII_TEXT, signed[:-1] + "!"])
            req["candidates"][0]["prompt"]["text"] = offered
            return req
        if kind == "text_unsigned":
            req = self.request(donor, recip, kw, payload={"pii": {"scanned": False, "entities": []}})
            req["candidates"][0]["prompt"]["text"] = rng.choice(["", CLEAN_TEXT])
            return req
        if kind == "time_edge":
            return self._time_edge(donor, recip, kw)
        if kind == "donor_id_swap":
            req = self.request(donor, recip, kw)
            req["candidates"][0]["donor_id"] = rng.choice(["d-2", "d-1 ", "D-1", "d-1\u200b"])
            return req
        if kind == "token_swap":
            req = self.request(donor, recip, kw)
            toks = req["candidates"][0]["prompt"]["token_ids"]
            i = rng.randrange(len(toks))
            toks[i] = (toks[i] + rng.randrange(1, 1000)) % 49_152
            return req
        raise ValueError(f"unknown mutation {kind!r}")

    def _time_edge(self, donor: Json, recip: Json, kw: Json) -> Json:
        rng = self.rng
        delta = rng.choice([0, 1, 1_000, 1_000_000, 1_000_000_000])  # at, 1 ns, 1 us, 1 ms, 1 s past
        clock_ns = rng.choice([0, 1, 999, 1_000, 999_999_999])
        clock = _ts(NOW, clock_ns)
        edge = rng.choice(["expired", "future", "max_age"])
        times = {"created_at": _ts(NOW - timedelta(days=1)), "expires_at": _ts(NOW + timedelta(days=6))}
        if edge == "expired":  # expires_at at or before the clock
            times["expires_at"] = _ts(NOW, clock_ns - delta)
        elif edge == "future":  # created after the clock (at the clock would be valid: >= 1 ns)
            times["created_at"] = _ts(NOW, clock_ns + max(delta, 1))
        else:  # exactly max_age old, or older
            times["created_at"] = _ts(NOW - MAX_AGE, clock_ns - delta)
        return self.request(donor, recip, kw, received_at=clock, payload=times)

    # ---- judging ---------------------------------------------------------------------------

    def allowed_by(self, req: Json) -> list[str]:
        """Names of the engines that allowed any candidate of ``req``."""
        parsed = CapturedRequest.model_validate(req)
        out = []
        for name, ev in self.engines.items():
            if any(d.decision == "allow" for d in ev.evaluate(parsed)):
                out.append(name)
        return out


def _prompt(parts: list[tuple[str, list[int]]]) -> Json:
    toks: list[int] = []
    segs = []
    for role, t in parts:
        segs.append({"role": role, "start": len(toks), "end": len(toks) + len(t)})
        toks.extend(t)
    return {"token_ids": toks, "segments": segs}


def run(n: int, seed: int, *, out: Any = sys.stdout) -> int:
    """``n`` inputs (one in eight a control); prints a table; 0 when no mutated input was allowed."""
    c = Campaign(seed)
    inputs: Counter[str] = Counter()
    allows: Counter[str] = Counter()
    examples: dict[str, Json] = {}
    t0 = time.perf_counter()
    for i in range(n):
        kind = "control" if i % 8 == 0 else MUTATIONS[c.rng.randrange(len(MUTATIONS))]
        req = c.mutate(kind)
        got = c.allowed_by(req)
        inputs[kind] += 1
        want_allow = kind == "control"
        if bool(got) != want_allow or (want_allow and len(got) != len(c.engines)):
            allows[kind] += 1
            examples.setdefault(kind, copy.deepcopy(req))
    secs = time.perf_counter() - t0
    w = out.write
    w(f"\n{'semantic mutation':<20}{'inputs':>8}{'allowed':>9}\n")
    for kind in (*MUTATIONS, "control"):
        label = "not allowed" if kind == "control" else ""
        w(f"{kind:<20}{inputs[kind]:>8}{allows[kind]:>9}  {label}\n")
    bad = sum(v for k, v in allows.items() if k != "control")
    w(f"\nsemantic: {n} inputs in {secs:.1f} s, {bad} allows of inputs whose meaning differs from "
      f"what was signed; {allows['control']} of {inputs['control']} controls not allowed by every "
      "engine\n")  # fmt: skip
    for kind, req in examples.items():
        w(f"  e.g. {kind}: {str(req)[:400]}\n")
    if allows["control"]:
        return 3
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4000, help="inputs (default 4000)")
    p.add_argument("--seed", type=int, default=20261129, help="seed (default 20261129)")
    args = p.parse_args(argv)
    return run(args.n, args.seed)


if __name__ == "__main__":
    sys.exit(main())
