"""The hostile-input campaign (benchmarks/hostile.py): a small run per target, hand-written hostile
inputs, and checks that the oracles catch what they are there to catch.

The minimal reproducers below are the product bugs the first full campaign found (keyring, decision
record, audit log, proof bundle, YAML and policy-test parsing); all are fixed and stay as regression
tests. A newly found bug gets a reproducer here marked ``xfail(strict=True)`` until it is fixed.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.hostile_mutate import Dup, Raw, dumps
from benchmarks.hostile_oracle import judge_line, read_json
from benchmarks.hostile_run import Runner, Tally, run_struct
from benchmarks.hostile_targets import TARGETS, AuditFixture, Ctx, Target, Verdict, _frame
from tests.conftest import ROOT

SEED = 20261129
SCRIPT = ROOT / "benchmarks" / "hostile.py"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Ctx:
    return Ctx(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def targets(ctx: Ctx) -> dict[str, Target]:
    out = {name: cls(ctx) for name, cls in TARGETS.items()}
    for t in out.values():
        t.warm()
    return out


def _campaign(target: Target, n: int, tmp: Path, seed: int = SEED) -> Tally:
    runner = Runner(target, limit_ms=2000.0, save=None)
    run_struct(runner, n - n // 4, n // 4, seed, tmp)
    return runner.tally


def _findings(t: Tally) -> str:
    return "; ".join(f"{cat}: {what}" for cat in ("crash", "hang", "allow") for what in t.kinds[cat])


# ---- the campaign, per target (random and Hypothesis engines, in process) ----------------------------------


@pytest.mark.parametrize(
    "name",
    list(TARGETS),
)
def test_campaign_finds_nothing(name: str, targets: dict[str, Target], tmp_path: Path) -> None:
    """A small seeded campaign against one target: no crash, no hang, no allow of malformed input."""
    n = {"rego_policy": 60, "audit_log": 80, "captured": 160, "provenance": 160}.get(name, 200)
    t = _campaign(targets[name], n, tmp_path)
    assert t.inputs == n
    assert t.harness == 0, t.kinds["harness"]
    assert (t.crashes, t.hangs, t.allows) == (0, 0, 0), _findings(t)


def test_every_seed_is_valid_and_accepted(targets: dict[str, Target]) -> None:
    """Every seed (a real artifact) runs clean, and is accepted where the target has a notion of accepting."""
    for name, t in targets.items():
        for i, s in enumerate(t.seed_list):
            v = t.run(s)
            assert not (v.crashes or v.allows), (name, i, v)
            if name not in (
                "captured",
                "provenance",
                "policy_input",
                "vllm_body",
            ):  # seeds may rightly be denied
                assert v.accepted, (name, i, v.reasons[:3])


def test_campaign_is_reproducible(targets: dict[str, Target], tmp_path: Path) -> None:
    """Two runs with one seed give the same inputs, hence the same counts and reasons."""
    a = _campaign(targets["checkpoint"], 120, tmp_path / "a")
    b = _campaign(targets["checkpoint"], 120, tmp_path / "b")
    assert (a.inputs, a.accepted, a.reasons) == (b.inputs, b.accepted, b.reasons)
    c = _campaign(targets["checkpoint"], 120, tmp_path / "c", seed=SEED + 1)
    assert c.reasons != a.reasons


# ---- the oracles catch what they must (a campaign that cannot fail is a defect) ----------------------------


class _Allow:
    """A decision that says allow, whatever it is asked."""

    def __init__(self, donor_id: str) -> None:
        self.donor_id = donor_id
        self.decision = "allow"
        self.record = {"gates": [{"gate": "tenant", "result": "pass", "detail": "ok"}]}


class _AllowEverything:
    """A planted bug: an evaluator that allows every candidate of every request."""

    def evaluate(self, req: Any, now: Any = None) -> list[_Allow]:
        return [_Allow(c.donor_id) for c in req.candidates]

    def deny_malformed(self, bad: Any, now: Any) -> list[_Allow]:
        return [_Allow(d) for d in bad.donor_ids]

    def register_donor(self, prompt: Any) -> None:
        return None


def test_oracle_catches_an_evaluator_that_allows_everything(ctx: Ctx, tmp_path: Path) -> None:
    """With a planted allow-everything evaluator, the provenance campaign counts allows of malformed input."""
    target = TARGETS["provenance"](ctx)
    target.seed_list  # noqa: B018
    saved = ctx.__dict__.pop("captured_evaluator", None)
    ctx.__dict__["captured_evaluator"] = _AllowEverything()
    try:
        t = _campaign(target, 80, tmp_path)
    finally:
        del ctx.__dict__["captured_evaluator"]
        if saved is not None:
            ctx.__dict__["captured_evaluator"] = saved
    assert t.allows > 20, _findings(t)
    assert any("malformed candidate" in k or "malformed line" in k for k in t.kinds["allow"])


def test_oracle_catches_a_verifier_that_accepts_everything(
    targets: dict[str, Target], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a planted always-OK bundle verifier and note opener, tampered inputs count as allows."""
    import semgov.audit.note
    import semgov.audit.verify

    monkeypatch.setattr(semgov.audit.verify, "verify_bundle", lambda bundle, key: {})
    monkeypatch.setattr(semgov.audit.note, "open_checkpoint", lambda note, name, key: None)
    assert _campaign(targets["bundle"], 60, tmp_path).allows > 10
    assert _campaign(targets["checkpoint"], 60, tmp_path).allows > 10


def test_runner_counts_crashes_hangs_and_allows(ctx: Ctx) -> None:
    """Undocumented exceptions are crashes, slow inputs are hangs, accepted malformed inputs are allows."""
    from benchmarks.hostile_targets import call

    class Planted(Target):
        name = "planted"
        share = 0.0

        def seeds(self) -> list[bytes]:
            return [b"ok"]

        def run(self, data: bytes) -> Verdict:
            if data == b"crash":
                call(lambda: {}["missing"])
            if data == b"slow":
                call(time.sleep, 0.08)
            v = Verdict(accepted=True)
            if data == b"allow":
                v.allows.append("planted")
            return v

    r = Runner(Planted(ctx), limit_ms=50.0, save=None)
    for d in (b"ok", b"crash", b"slow", b"allow"):
        r.run_one(d, "random")
    t = r.tally
    assert (t.inputs, t.crashes, t.hangs, t.allows) == (4, 1, 1, 1)
    assert any(k.startswith("KeyError") for k in t.kinds["crash"])


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
        max_leaves=20,
    )
)
def test_dumps_writes_json_that_reads_back(value: Any) -> None:
    """The mutators' serialiser writes plain values as JSON that reads back equal."""
    assert json.loads(dumps(value)) == value
    assert json.loads(dumps(value, ascii_only=True, compact=False)) == value


def test_dumps_writes_what_json_dumps_cannot() -> None:
    """Duplicate keys and raw literals come out verbatim, and the oracle flags them."""
    text = dumps({"a": Dup((("x", 1), ("x", 2))), "b": Raw("NaN"), "c": Raw("[" * 3 + "]" * 3)})
    assert text == '{"a":{"x":1,"x":2},"b":NaN,"c":[[[]]]}'
    problems = read_json(text.encode()).problems
    assert any("duplicate key" in p for p in problems) and any("NaN" in p for p in problems)


def test_oracle_judges_tampering_without_semgov(ctx: Ctx) -> None:
    """The independent line judge flags an edited payload, a wrong key id and a NaN similarity."""
    seed = _line(ctx)
    j = judge_line(json.dumps(seed).encode(), ctx.trust)
    assert not j.malformed and not j.candidates[0][1], j
    edited = json.loads(json.dumps(seed))
    edited["candidates"][0]["provenance"]["payload"]["tenant"] = "globex"
    j = judge_line(json.dumps(edited).encode(), ctx.trust)
    assert "signature does not verify" in j.candidates[0][1]
    nan = re.sub(r'"similarity": [0-9.]+', '"similarity": NaN', json.dumps(seed), count=1).encode()
    assert any("NaN" in p for p in judge_line(nan, ctx.trust).malformed)
    other = json.loads(json.dumps(seed))
    other["candidates"][0]["provenance"]["key_id"] = "k9"
    assert "key id not in the keyring" in judge_line(json.dumps(other).encode(), ctx.trust).candidates[0][1]


# ---- hand-written hostile inputs, per target ---------------------------------------------------------------


def _line(ctx: Ctx, i: int = 0) -> dict[str, Any]:
    target = TARGETS["provenance"](ctx)
    return json.loads(target.seed_list[i])


def _clean(v: Verdict) -> bool:
    return not (v.crashes or v.allows)


def test_captured_hand_written(targets: dict[str, Target], ctx: Ctx) -> None:
    """Tampered payload, NaN similarity, duplicate key, out-of-range token: all denied with a reason."""
    t = targets["captured"]
    req = _line(ctx)
    tampered = json.loads(json.dumps(req))
    tampered["candidates"][0]["provenance"]["payload"]["visibility"] = "public"
    big_token = json.loads(json.dumps(req))
    big_token["candidates"][0]["prompt"]["token_ids"][0] = 2**32
    text = json.dumps(req, separators=(",", ":"))
    cases = [
        json.dumps(tampered).encode(),
        json.dumps(big_token).encode(),
        re.sub(r'"similarity":[0-9.]+', '"similarity":NaN', text, count=1).encode(),
        text.replace('"tenant":', '"tenant":"evil","tenant":', 1).encode(),
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe{}",
    ]
    for data in cases:
        v = t.run(data)
        assert _clean(v) and not v.accepted, (data[:80], v)
        assert v.reasons, data[:80]


def test_provenance_hand_written(targets: dict[str, Target], ctx: Ctx) -> None:
    """An allowed candidate re-signed by the revoked key, by a rogue key claiming k1, or by k9: denied."""
    from benchmarks.hostile_oracle import canonical

    t = targets["provenance"]
    seeds = [json.loads(s) for s in t.seed_list]
    ok = next(r for r in seeds if (r.get("expect") or {}).get(r["candidates"][0]["donor_id"]) == "allow")
    assert t.run(json.dumps(ok).encode()).accepted
    for who in ("k2", "rogue-as-k1", "k9"):
        req = json.loads(json.dumps(ok))
        prov = req["candidates"][0]["provenance"]
        key = ctx.signers[who]
        prov.update({"key_id": key.key_id, "signature": key.sign(canonical(prov["payload"]) or b"")})
        v = t.run(json.dumps(req).encode())
        assert _clean(v) and not v.accepted, (who, v)
        assert any(r.startswith("provenance fail") for r in v.reasons), (who, v.reasons)


def test_records_hand_written(targets: dict[str, Target], ctx: Ctx) -> None:
    """An edited decision record and a foreign signature are rejected by every verifier."""
    t = targets["records"]
    rec = json.loads(ctx.audit.records[0])
    rec["decision"] = "allow" if rec["decision"] == "deny" else "deny"
    v = t.run(json.dumps(rec).encode())
    assert _clean(v) and not v.accepted, v
    rec = json.loads(ctx.audit.records[0])
    rec["signature"] = base64.b64encode(bytes(64)).decode()
    v = t.run(json.dumps(rec, separators=(",", ":"), sort_keys=True).encode())
    assert _clean(v) and not v.accepted, v


def test_records_deep_nesting_is_a_bad_record(targets: dict[str, Target]) -> None:
    """`semgov verify-decision` on a line of 100,000 nested arrays reports a bad record, no traceback."""
    assert _clean(targets["records"].run(b"[" * 100_000 + b"]" * 100_000))


@pytest.mark.parametrize(
    "old, new",
    [
        ('"request_id":"', '"request_id":"\\ud800'),
        ('"approved_tokens":', '"approved_tokens":1e400,"x":'),
    ],
)
def test_records_uncanonicalizable_leaf_is_a_bad_record(ctx: Ctx, old: str, new: str) -> None:
    """A leaf with a lone surrogate or 1e400 is a bad record for the audit verifier, not a traceback."""
    from semgov.audit.verify import record_problem

    leaf = ctx.audit.records[0].replace(old.encode(), new.encode(), 1)
    assert leaf != ctx.audit.records[0] and json.loads(leaf)
    assert isinstance(record_problem(leaf, ctx.public_key, ctx.key_id), str)


def test_records_duplicate_key_is_refused(targets: dict[str, Target], ctx: Ctx) -> None:
    """A signed record with a second, different ``"decision"`` member before the real one is refused."""
    rec = json.loads(ctx.audit.records[0])
    other = "allow" if rec["decision"] == "deny" else "deny"
    text = ctx.audit.records[0].decode().replace('"decision":', f'"decision":"{other}","decision":', 1)
    v = targets["records"].run(text.encode())
    assert _clean(v) and not v.accepted, v


def test_keyring_hand_written(targets: dict[str, Target]) -> None:
    """A P-256 key, a private key, a truncated PEM and a duplicate key id are refused naming the file."""
    from benchmarks.hostile_targets import _foreign_pems

    t = targets["keyring"]
    base = json.loads((ROOT / "examples" / "keyring.json").read_text())
    for pem in [*_foreign_pems(), base["keys"][0]["public_key"][:60]]:
        doc = json.loads(json.dumps(base))
        doc["keys"][0]["public_key"] = pem
        v = t.run(json.dumps(doc).encode())
        assert _clean(v) and not v.accepted, v
    doc = json.loads(json.dumps(base))
    doc["keys"].append(doc["keys"][0])
    v = t.run(json.dumps(doc).encode())
    assert _clean(v) and not v.accepted and any("duplicate key_id" in r for r in v.reasons), v


def test_keyring_not_utf8_is_an_input_error(targets: dict[str, Target]) -> None:
    """A keyring that is not UTF-8 is an InputError naming the file."""
    assert _clean(targets["keyring"].run(b'{"keys": [{"key_id": "\xff"}]}'))


@pytest.mark.parametrize("text", [b"[" * 100_000 + b"]" * 100_000, b'{"keys": ' + b"1" * 5000 + b"}"])
def test_keyring_deep_or_huge_is_an_input_error(targets: dict[str, Target], text: bytes) -> None:
    """A keyring of 100,000 nested arrays or with a 5,000-digit number is an InputError naming the file."""
    assert _clean(targets["keyring"].run(text))


def test_keyring_unknown_key_algorithm_is_a_key_file_error(targets: dict[str, Target]) -> None:
    """A SubjectPublicKeyInfo with an unknown algorithm OID is a KeyFileError, not a traceback."""
    der = bytes.fromhex("301a300506032a0304031100") + bytes(16)  # OID 1.2.3.4, 16-byte key
    pem = "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PUBLIC KEY-----\n"
    doc = {"keys": [{"key_id": "k1", "public_key": pem, "revoked": False}]}
    assert _clean(targets["keyring"].run(json.dumps(doc).encode()))


def test_keyring_duplicate_json_key_is_refused(targets: dict[str, Target]) -> None:
    """``"revoked": true, "revoked": false`` in one entry is refused, not read as trusted."""
    text = (
        (ROOT / "examples" / "keyring.json")
        .read_text()
        .replace('"revoked": true', '"revoked": true, "revoked": false')
    )
    assert _clean(targets["keyring"].run(text.encode()))


def test_yaml_policy_hand_written(targets: dict[str, Target]) -> None:
    """Alias bombs, deep nesting, duplicate keys, merge keys, huge ints: PolicyError naming the file."""
    from benchmarks.hostile_targets import YAML_SNIPPETS

    t = targets["yaml_policy"]
    base = (ROOT / "policies" / "default" / "policy.yaml").read_text()
    for snippet in (
        YAML_SNIPPETS[0],
        YAML_SNIPPETS[1],
        YAML_SNIPPETS[11],
        "name: again",
        "similarity: {min: 2}",
    ):
        v = t.run((base + "\n" + snippet + "\n").encode())
        assert _clean(v) and not v.accepted, (snippet[:40], v)


def test_yaml_policy_unknown_tag_and_huge_int_are_policy_errors(targets: dict[str, Target]) -> None:
    """``!!python/object`` and a 5,001-digit integer are PolicyErrors with file:line, not tracebacks."""
    base = (ROOT / "policies" / "default" / "policy.yaml").read_text()
    for extra in ("x: !!python/object:os.system ls", "similarity: {min: 1" + "0" * 5000 + "}"):
        v = targets["yaml_policy"].run((base + "\n" + extra + "\n").encode())
        assert (
            _clean(v) and not v.accepted and v.reasons[0].startswith("<path>:N: ")
        )  # file:line, normalised, v


def test_yaml_policy_tag_on_a_mapping_is_refused(targets: dict[str, Target]) -> None:
    """``tenant: !!python/object:os.system`` (a tag on a mapping) is a PolicyError, as on a scalar."""
    base = (ROOT / "policies" / "default" / "policy.yaml").read_text()
    text = base.replace("\ntenant:\n", "\ntenant: !!python/object:os.system\n", 1)
    assert text != base
    v = targets["yaml_policy"].run(text.encode())
    assert _clean(v) and not v.accepted, v


def test_yaml_policy_control_character_names_a_line(targets: dict[str, Target]) -> None:
    """A control character in a policy is a PolicyError with file:line."""
    base = (ROOT / "policies" / "default" / "policy.yaml").read_text()
    v = targets["yaml_policy"].run((base.replace("name: default", "name: de\x01fault", 1)).encode())
    assert _clean(v) and not v.accepted and not v.unlocated, v


def test_rego_policy_hand_written(targets: dict[str, Target]) -> None:
    """Modules that allow everything, break the convention or call time.now_ns() never yield an allow."""
    t = targets["rego_policy"]
    base = (ROOT / "policies" / "rego" / "default" / "policy.rego").read_text()
    for extra in ("default allow := true", "allow := true", "x := time.now_ns()", "approved_spans := 7"):
        v = t.run((base + "\n" + extra + "\n").encode())
        assert _clean(v), (extra, v)


def test_policy_input_hand_written(targets: dict[str, Target], ctx: Ctx) -> None:
    """Unverified provenance, a fact error or no verified span is denied by both engines."""
    t = targets["policy_input"]
    base = ctx.audit.case_docs[0]
    patches = [
        {"facts": {"provenance": {"signature_valid": False}}},
        {"facts": {"errors": {"tokens": "boom"}}},
        {"facts": {"tokens": {"spans": []}}},
    ]
    from benchmarks.hostile_targets import deep_merge

    for p in patches:
        v = t.run(json.dumps(deep_merge(base, p)).encode())
        assert _clean(v) and not v.accepted, (p, v)


def test_policy_input_string_similarity_is_refused(targets: dict[str, Target], ctx: Ctx) -> None:
    """``"similarity": "0.9"`` (a string; the schema says number) is refused, never allowed."""
    from benchmarks.hostile_targets import deep_merge

    doc = deep_merge(ctx.audit.case_docs[0], {"candidate": {"similarity": "0.9"}})
    assert _clean(targets["policy_input"].run(json.dumps(doc).encode()))


def test_policy_input_duplicate_key_is_refused(targets: dict[str, Target], ctx: Ctx) -> None:
    """A policy input document with ``"signature_valid": false, "signature_valid": true`` is refused."""
    text = json.dumps(ctx.audit.case_docs[0]).replace(
        '"signature_valid": true', '"signature_valid": false, "signature_valid": true', 1
    )
    v = targets["policy_input"].run(text.encode())
    assert _clean(v) and not v.accepted and any("duplicate key" in r for r in v.reasons), v


def _log_input(snap: int, file: int, content: bytes) -> bytes:
    return b"SGLOG" + bytes([snap, file]) + content


def test_audit_log_hand_written(targets: dict[str, Target], ctx: Ctx) -> None:
    """A flipped byte, a deleted frame, a forged checkpoint: verify fails; the writer hides nothing."""
    t = targets["audit_log"]
    fx = ctx.audit
    log = fx.original[fx.closed]["records.log"]
    frames = AuditFixture._frames(log)
    flipped = bytearray(log)
    flipped[200] ^= 1
    renumbered = b"".join(_frame(i, f[44:]) for i, f in enumerate(frames[:3] + frames[4:]))
    note = fx.original[fx.closed]["checkpoint"]
    size = int(note.split(b"\n")[1])  # NOTE: a C2SP checkpoint: origin, then the tree size
    forged = note.replace(b"\n%d\n" % size, b"\n%d\n" % (size + 1), 1)
    assert forged != note
    for data in (_log_input(0, 0, bytes(flipped)), _log_input(0, 0, renumbered), _log_input(0, 1, forged)):
        v = t.run(data)
        assert _clean(v) and any(r.startswith("verify: ") for r in v.reasons), v


def test_audit_log_frame_index_field_is_checked(targets: dict[str, Target], ctx: Ctx) -> None:
    """A frame whose 8-byte index field was changed (record and hash intact) fails verification."""
    log = bytearray(ctx.audit.original[ctx.audit.closed]["records.log"])
    log[7] ^= 0x01
    assert _clean(targets["audit_log"].run(_log_input(0, 0, bytes(log))))


def test_audit_log_deep_record_is_a_bad_record(targets: dict[str, Target], ctx: Ctx) -> None:
    """A log whose record 0 is 100,000 nested arrays (frame re-hashed) fails verification at record 0."""
    frames = AuditFixture._frames(ctx.audit.original[ctx.audit.closed]["records.log"])
    log = _frame(0, b"[" * 100_000 + b"]" * 100_000) + b"".join(frames[1:])
    v = targets["audit_log"].run(_log_input(0, 0, log))
    assert _clean(v) and any(r.startswith("verify: record N") for r in v.reasons), v


def test_audit_log_deep_state_json_is_rebuilt(targets: dict[str, Target]) -> None:
    """A state.json of 100,000 nested arrays is malformed state (rebuild), not a crash."""
    assert _clean(targets["audit_log"].run(_log_input(1, 2, b"[" * 100_000 + b"]" * 100_000)))


def test_checkpoint_hand_written(targets: dict[str, Target], ctx: Ctx) -> None:
    """An altered size or root is refused; a foreign signature line added is still the real checkpoint."""
    t = targets["checkpoint"]
    note = ctx.audit.notes[0]
    lines = note.decode().split("\n")
    bad = "\n".join([lines[0], str(int(lines[1]) + 1), *lines[2:]]).encode()
    v = t.run(bad)
    assert _clean(v) and not v.accepted, v
    extra = "\u2014 other " + base64.b64encode(bytes(68)).decode()
    ok = "\n".join([*lines[:-1], extra, ""]).encode()
    v = t.run(ok)
    assert _clean(v), v


def test_bundle_hand_written(targets: dict[str, Target]) -> None:
    """An edited record, a wrong index and a foreign proof are refused by verify_bundle."""
    t = targets["bundle"]
    b = json.loads(t.seed_list[0])
    other = json.loads(t.seed_list[1])
    cases = [
        {**b, "record": b["record"].replace('"namespace":"', '"namespace":"x', 1)},
        {**b, "index": b["index"] + 1},
        {**b, "inclusion_proof": other["inclusion_proof"]},
    ]
    for c in cases:
        v = t.run(json.dumps(c).encode())
        assert _clean(v) and not v.accepted, v


def test_bundle_infinite_index_is_a_proof_error(targets: dict[str, Target]) -> None:
    """A bundle whose index is 1e400 is 'proof does NOT verify', not a traceback."""
    text = targets["bundle"].seed_list[0].decode()
    text = re.sub(r'"index": \d+', '"index": 1e400', text, count=1)
    assert _clean(targets["bundle"].run(text.encode()))


@pytest.mark.parametrize(
    "edit", [(r'"index": (\d+)', r'"index": 999, "index": \1'), (r'"tree_size": (\d+)', r'"tree_size": \1.9')]
)
def test_bundle_malformed_numbers_are_refused(targets: dict[str, Target], edit: tuple[str, str]) -> None:
    """``"index": 999, "index": 7`` and ``"tree_size": 44.9`` make a bundle that does not verify."""
    text = re.sub(edit[0], edit[1], targets["bundle"].seed_list[0].decode(), count=1)
    v = targets["bundle"].run(text.encode())
    assert _clean(v) and not v.accepted, v


def test_bundle_deep_nesting_is_an_input_error(targets: dict[str, Target]) -> None:
    """A bundle file of 100,000 nested arrays is 'cannot read proof bundle', not a traceback."""
    assert _clean(targets["bundle"].run(b"[" * 100_000 + b"]" * 100_000))


def _context_seed(t: Target, i: int = 0) -> tuple[Any, Any, Any]:
    from benchmarks.hostile_targets import ctx_decode

    return ctx_decode(t.seed_list[i])


def test_context_hand_written(targets: dict[str, Target]) -> None:
    """Surrogates, LoRA mismatches, a re-MACed extra field and non-str values: refused cleanly."""
    from benchmarks.hostile_targets import CONTEXT_LORA, FakeStr, _context_token, ctx_encode

    t = targets["context"]
    tok, _, _ = _context_seed(t)
    doc = json.loads(base64.urlsafe_b64decode(tok.split(".")[1] + "=="))
    bad = [
        (tok + "\udcff", None, None),
        ("\udcff" + tok, None, None),
        (tok[:30] + "\u00e9" + tok[30:], None, None),
        (tok + "X", None, None),
        (tok, CONTEXT_LORA, None),
        (tok + CONTEXT_LORA, "other", None),
        (_context_token(json.dumps({**doc, "admin": True}, sort_keys=True, separators=(",", ":")).encode()),
         None, None),
        (tok.encode(), None, None),
        (FakeStr(), None, None),
        (tok, 7, None),
    ]  # fmt: skip
    for extra, lora, salt in bad:
        v = t.run(ctx_encode(extra, lora, salt))
        assert _clean(v) and not v.accepted and v.reasons, (extra, lora, v)


def test_context_hostile_str_is_its_text(targets: dict[str, Target]) -> None:
    """A token in a str subclass whose methods raise is accepted like the plain token (no method called)."""
    from benchmarks.hostile_targets import CONTEXT_LORA, HostileStr, ctx_encode

    t = targets["context"]
    tok, _, _ = _context_seed(t)
    v = t.run(ctx_encode(HostileStr(tok + CONTEXT_LORA), HostileStr(CONTEXT_LORA), HostileStr("salt")))
    assert _clean(v) and v.accepted, v


def test_oracle_catches_a_context_parser_that_ignores_the_lora_binding(
    targets: dict[str, Target], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the old parser planted (text after the MAC kept, lora_id ignored), the campaign counts allows."""
    import semgov.context as context

    real = context.parse_context_token

    def lax(keys: Any, extra_key: object, *, lora_id: object = None, now: float | None = None) -> Any:
        if isinstance(extra_key, str) and extra_key.count(".") >= 2:
            head, payload, rest = extra_key.split(".", 2)
            extra_key = f"{head}.{payload}.{rest[:43]}"
        return real(keys, extra_key, now=now)

    monkeypatch.setattr(context, "parse_context_token", lax)
    t = _campaign(targets["context"], 200, tmp_path)
    assert t.allows > 5, _findings(t)
    assert any("LoRA id" in k for k in t.kinds["allow"]), t.kinds["allow"]


def test_oracle_catches_a_context_parser_that_raises_other_errors(
    targets: dict[str, Target], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a planted parser that ASCII-encodes extra_key first (the original bug), crashes are counted."""
    import semgov.context as context

    real = context.parse_context_token

    def ascii_first(keys: Any, extra_key: Any, *, lora_id: object = None, now: float | None = None) -> Any:
        extra_key.encode("ascii")
        return real(keys, extra_key, lora_id=lora_id, now=now)

    monkeypatch.setattr(context, "parse_context_token", ascii_first)
    t = _campaign(targets["context"], 200, tmp_path)
    assert any(k.startswith("UnicodeEncodeError") for k in t.kinds["crash"]), t.kinds["crash"]
    assert any(k.startswith("AttributeError") for k in t.kinds["crash"]), t.kinds["crash"]


def test_oracle_catches_a_context_parser_that_lets_tokens_outlive_their_claims(
    targets: dict[str, Target], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a planted parser whose tokens never expire (a clock stuck at the epoch, no lifetime bound:
    what every token was before issue 31), the campaign counts allows."""
    import dataclasses

    import semgov.context as context

    real = context.parse_context_token

    def timeless(keys: Any, extra_key: Any, *, lora_id: object = None, now: float | None = None) -> Any:
        lax = dataclasses.replace(keys, max_lifetime_s=2**62)
        return real(lax, extra_key, lora_id=lora_id, now=0)  # a clock at the epoch: nothing expires

    monkeypatch.setattr(context, "parse_context_token", timeless)
    t = _campaign(targets["context"], 600, tmp_path)
    assert any("exp" in k for k in t.kinds["allow"]), t.kinds["allow"]


def test_oracle_catches_a_middleware_that_passes_salts_it_cannot_scope(
    targets: dict[str, Target], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a planted scope_body that passes bodies it cannot parse unchecked (the class of the
    route-list bug: a client salt reaching vLLM unscoped), the campaign counts allows."""
    import engine_hooks.vllm.scope as scope

    real = scope.scope_body

    def unchecked(keys: Any, body: bytes) -> Any:
        try:
            json.loads(body)
        except (ValueError, RecursionError):
            return body, None
        return real(keys, body)

    monkeypatch.setattr(scope, "scope_body", unchecked)
    t = _campaign(targets["vllm_body"], 300, tmp_path)
    assert any("cannot parse" in k for k in t.kinds["allow"]), t.kinds["allow"]


# ---- the command -------------------------------------------------------------------------------------------


def test_command_prints_the_table_and_the_last_line(tmp_path: Path) -> None:
    """`benchmarks/hostile.py --smoke` (400 inputs, two targets) runs every engine, ends with the summary."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--save", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "hostile: 400 inputs, 0 crashes, 0 hangs, 0 allows of malformed input", (
        out.stdout + out.stderr
    )
    assert out.returncode == 0
    table = "\n".join(lines)
    assert re.search(r"^checkpoint\s+\d+", table, re.M) and re.search(r"^rego_policy\s+\d+", table, re.M)
    engines = re.search(r"engines: random (\d+) .*hypothesis (\d+) .*atheris (\d+)", table)
    assert engines is not None and int(engines.group(1)) > 0 and int(engines.group(2)) > 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        return
    assert int(engines.group(3)) > 0


# ---- the semantic mode -------------------------------------------------------------------


def test_semantic_mode_denies_every_mutation_and_allows_controls() -> None:
    """80 semantic inputs (each mutation class, and controls): no mutated input allowed, controls allowed."""
    import io

    from benchmarks.hostile_semantic import MUTATIONS, run

    out = io.StringIO()
    assert run(80, SEED, out=out) == 0, out.getvalue()
    for kind in MUTATIONS:
        assert re.search(rf"^{kind}\s+[1-9]\d*\s+0\s*$", out.getvalue(), re.M), out.getvalue()


def test_semantic_mode_catches_an_unbound_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the text binding switched off, the semantic mode reports allows of swapped texts (exit 1)."""
    import io

    from benchmarks.hostile_semantic import run
    from semgov.facts import compute as facts

    monkeypatch.setattr(facts, "_text_bound", lambda text, p: True)
    out = io.StringIO()
    assert run(160, SEED, out=out) == 1
    assert re.search(r"^text_swap\s+\d+\s+[1-9]", out.getvalue(), re.M), out.getvalue()
