"""Targets of the hostile-input campaign: seeds, mutations, entry points and oracles.

Each :class:`Target` has

- ``seeds()``: VALID inputs taken from the repository's real artifacts (the shipped captured
  workload, ``tests/assets``, ``policies/default``, ``policies/rego/default``, a real audit log
  of real signed records written here with :class:`semgov.audit.store.AuditLog`, real proof
  bundles from :func:`semgov.audit.verify_dir.make_bundle`);
- ``mutate(chooser)``: one hostile input, as bytes (the same code runs under a seeded PRNG and
  under Hypothesis; atheris mutates the seeds' bytes instead);
- ``run(data)``: feeds the input to semgov's real entry point exactly as the command line does,
  and judges the outcome with the independent oracle of ``hostile_oracle``.

A **crash** is an exception semgov does not document for that entry point (the documented ones
are the :class:`semgov.errors.SemgovError` tree, ``NoteError``, ``ProofError`` and, where the
CLI catches them, ``ValueError`` / pydantic ``ValidationError``), an error that does not name
the file, or a deny without a named reason. A **hang** is an input over the time limit. An
**allow of malformed input** is an accept (allow, load, verify) of an input the oracle judges
malformed or tampered. A **lax accept** is an accepted format deviation that changes no signed
or proved content (reported, not counted as an allow).
"""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import random
import re
import shutil
import struct
import time
import traceback
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import ValidationError

from benchmarks.hostile_mutate import (
    Chooser,
    Dup,
    Raw,
    dumps,
    encode,
    mutate_bytes,
    mutate_json,
    mutate_text,
)
from benchmarks.hostile_oracle import (
    EM_DASH,
    Schema,
    Trust,
    b64_signature,
    canonical,
    ed25519_from_pem,
    ed25519_ok,
    judge_context,
    judge_line,
    judge_policy_yaml,
    note_authentic,
    read_json,
)

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
ASSETS = ROOT / "tests" / "assets"
POLICY_YAML_DIR = ROOT / "policies" / "default"
POLICY_REGO_DIR = ROOT / "policies" / "rego" / "default"
GATES = (
    "tenant", "namespace", "provenance", "expiry", "policy_version", "pii", "task",
    "response_contract", "similarity", "token_verification",
)  # fmt: skip


class EntryCrash(Exception):
    """An entry point raised something semgov does not document for it."""


class HangTimeout(BaseException):
    """Raised by the SIGALRM guard (a BaseException, so semgov's ``except Exception`` lets it by)."""


@dataclass
class Verdict:
    """What one input did: accepted or rejected (and why), and what the oracle holds against it."""

    accepted: bool = False
    reasons: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    allows: list[str] = field(default_factory=list)
    lax: list[str] = field(default_factory=list)
    unlocated: list[str] = field(default_factory=list)


def _where(e: BaseException) -> str:
    """``file:line function`` of the first and the last semgov frame (the entry point, where it broke)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "/semgov/" in f.filename] or frames[-1:]
    if not ours:
        return "?"
    ends = [ours[0], ours[-1]] if len(ours) > 1 else ours
    return " > ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in ends)


ENTRY_SECONDS = [0.0]  # time spent inside semgov for the current input (the hang measure)


def call(
    fn: Callable[..., Any],
    *args: Any,
    allowed: tuple[type[BaseException], ...] = (),
    label: str = "",
    **kw: Any,
) -> Any:
    """Run an entry point; documented errors are returned, anything else becomes :class:`EntryCrash`.

    Its time is added to :data:`ENTRY_SECONDS`: a hang is semgov's time, never the oracle's.
    """
    t0 = time.perf_counter()
    try:
        return fn(*args, **kw)
    except allowed as e:
        return e
    except HangTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - this is what the campaign looks for
        msg = str(e).split("\n")[0][:160]
        where = f"{label} > {_where(e)}" if label else _where(e)
        raise EntryCrash(f"{type(e).__name__}: {norm(msg)} [{where}]") from e
    finally:
        ENTRY_SECONDS[0] += time.perf_counter() - t0


_NORM = [
    (re.compile(r"/(?:dev/shm|tmp)/[^\s:'\"]*"), "<path>"),
    (re.compile(r"'[^']{0,400}'|\"[^\"]{0,400}\""), "'…'"),
    (re.compile(r"\b(?:0x)?[0-9a-f]{16,}\b"), "<hex>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b|#x[0-9a-fA-F]+\b"), "0x…"),
    (re.compile(r"\d+"), "N"),
]


def norm(msg: str) -> str:
    """A rejection reason with paths, quoted values and numbers blanked (to count distinct reasons)."""
    msg = msg.split("\n")[0]
    for rx, rep in _NORM:
        msg = rx.sub(rep, msg)
    return msg[:110]


def _stable_uuids(seed: int) -> Callable[[], uuid.UUID]:
    rng = random.Random(seed)
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


@contextmanager
def stable_ids(seed: int) -> Iterator[None]:
    """Deterministic decision and event ids while building fixtures (the run must be reproducible)."""
    saved = uuid.uuid4
    uuid.uuid4 = _stable_uuids(seed)
    try:
        yield
    finally:
        uuid.uuid4 = saved


# ---- shared context ------------------------------------------------------------------------------------


class Ctx:
    """Keys, policies, evaluators and a scratch directory shared by the targets of one process."""

    def __init__(self, work: Path, engine: str = "auto") -> None:
        import logging

        import structlog

        from semgov.signing.keys import Keyring, SigningKey, load_signing_key

        # The campaign feeds thousands of broken inputs: semgov's warnings (audit recovery) would
        # flood the worker logs. Findings are counted from outcomes, not from log lines.
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
        self.work = work
        self.engine_choice = engine
        work.mkdir(parents=True, exist_ok=True)
        self.decision_key = load_signing_key(EX / "keys" / "decision-signing-key.pem")
        self.public_key = self.decision_key.public_key
        self.key_id = self.decision_key.key_id
        prov = {
            n: load_signing_key(EX / "keys" / f"provenance-{n}.pem") for n in ("k1", "k2-revoked", "rogue")
        }
        self.signers = {
            "k1": SigningKey.from_private(prov["k1"].private_key, "k1"),
            "k2": SigningKey.from_private(prov["k2-revoked"].private_key, "k2"),
            "rogue-as-k1": SigningKey.from_private(prov["rogue"].private_key, "k1"),
            "k9": SigningKey.from_private(prov["rogue"].private_key, "k9"),
        }
        self.keyring_path = EX / "keyring.json"
        self.keyring = Keyring.load(self.keyring_path)
        self.trust = Trust.from_keyring_file(self.keyring_path)

    @cached_property
    def pii(self) -> Any:
        from semgov.facts.pii import PiiScanner

        return PiiScanner()

    @cached_property
    def yaml_policy(self) -> Any:
        from semgov.policy.source import load_policy_source

        return load_policy_source(POLICY_YAML_DIR)

    @cached_property
    def rego_policy(self) -> Any:
        from semgov.policy.source import load_policy_source

        return load_policy_source(POLICY_REGO_DIR)

    def evaluator(self, policy: Any, engine: str = "auto") -> Any:
        from semgov.decide import Evaluator
        from semgov.policy.source import make_engine

        return Evaluator(
            policy, self.keyring, self.decision_key, pii_scanner=self.pii, engine=make_engine(policy, engine)
        )

    @cached_property
    def captured_evaluator(self) -> Any:
        """The evaluator ``semgov check`` builds (``--engine`` picks the policy language)."""
        if self.engine_choice in ("regorus", "opa-inprocess"):
            return self.evaluator(self.rego_policy, self.engine_choice)
        return self.evaluator(self.yaml_policy, "yaml" if self.engine_choice == "yaml" else "auto")

    @cached_property
    def example_lines(self) -> list[bytes]:
        with gzip.open(EX / "captured.jsonl.gz") as f:
            return [line.rstrip(b"\n") for line in f]

    @cached_property
    def audit(self) -> AuditFixture:
        return AuditFixture(self)


class Target:
    """One parser or entry point under attack."""

    name: ClassVar[str]
    share: ClassVar[float]  # of the campaign's budget
    max_len: ClassVar[int] = 65536  # atheris -max_len

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def seeds(self) -> list[bytes]:
        raise NotImplementedError

    def mutate(self, ch: Chooser) -> bytes:
        raise NotImplementedError

    def run(self, data: bytes) -> Verdict:
        raise NotImplementedError

    def dictionary(self) -> list[bytes]:
        """Tokens for libFuzzer's dictionary (``-dict``)."""
        return []

    def warm(self) -> None:
        """One-time set-up the first input must not be charged for (before any timing)."""
        self.seed_list  # noqa: B018 - builds the seeds (and fixtures they need)

    @cached_property
    def seed_list(self) -> list[bytes]:
        return self.seeds()

    def file(self, name: str) -> Path:
        d = self.ctx.work / self.name
        d.mkdir(parents=True, exist_ok=True)
        return d / name


def _json_dict_tokens(seeds: list[bytes]) -> list[bytes]:
    keys: set[str] = set()
    for s in seeds[:20]:
        for m in re.finditer(rb'"([A-Za-z_][A-Za-z0-9_]{0,40})":', s):
            keys.add(m.group(1).decode())
    toks = [f'"{k}":'.encode() for k in sorted(keys)]
    return toks + [
        b"NaN",
        b"Infinity",
        b"-1",
        b"1e400",
        b"null",
        b"true",
        b"\\ud800",
        b"[[[[",
        b"{}",
        b'"":""',
    ]


# ---- captured requests and provenance ------------------------------------------------------------------


def _strip_text(line: bytes) -> bytes:
    d = json.loads(line)
    d["prompt"].pop("text", None)
    for c in d["candidates"]:
        c["prompt"].pop("text", None)
    return json.dumps(d, separators=(",", ":")).encode()


_CAND_FOCUS = re.compile(r"^(candidates|received_at|prompt|expect|schema|tenant|namespace)")


class CapturedTarget(Target):
    """Captured-request lines through ``read_captured`` and ``Evaluator.evaluate``/``deny_malformed``.

    Exactly what ``semgov check`` does per line. Oracle: the line and every candidate judged
    independently (schema, strict JSON, tiling, provenance signature with the keyring's raw keys,
    donor id and token hash binding); a malformed line or candidate must only ever get denies,
    and every deny must name a reason.
    """

    name = "captured"
    share = 0.20

    def seeds(self) -> list[bytes]:
        lines = self.ctx.example_lines
        picked = lines[::50]
        out = [ln if i % 8 == 0 else _strip_text(ln) for i, ln in enumerate(picked)]
        out.append(ASSETS.joinpath("captured-small.jsonl").read_bytes().split(b"\n")[0])
        return out

    def dictionary(self) -> list[bytes]:
        return _json_dict_tokens(self.seed_list)

    def warm(self) -> None:
        # Presidio loads its pipeline on the first scan (seconds): not an input's cost.
        from semgov.wire.models import Prompt

        super().warm()
        prompt = Prompt.model_validate(
            {
                "token_ids": [1],
                "text": "warm-up: call 555-0100",
                "segments": [{"role": "system", "start": 0, "end": 1}],
            }
        )
        self.ctx.captured_evaluator.register_donor(prompt)

    def mutate(self, ch: Chooser) -> bytes:
        seed = ch.pick(self.seed_list)
        k = ch.int(0, 19)
        if k < 14:
            tree, _ = mutate_json(
                ch, json.loads(seed), focus=lambda p: bool(p) and bool(_CAND_FOCUS.match(str(p[0])))
            )
            data = encode(dumps(tree, ascii_only=ch.chance(0.3)))
        elif k < 16:
            data = seed
            for _ in range(ch.int(1, 4)):
                data, _ = mutate_bytes(ch, data)
        elif k < 18:
            other = ch.pick(self.seed_list)
            sep = ch.pick((b"\n", b"\r\n", b"\n\n  \n", b"\n\x00\n", b"\n\t\n"))
            data = seed + sep + other + ch.pick((b"", b"\n", b"\n{", b"\n\xff\xfe"))
        else:
            data = gzip.compress(seed, mtime=0)
            if ch.chance(0.5):
                data = data[: ch.int(10, len(data) - 1)]
        return data

    def run(self, data: bytes) -> Verdict:
        from semgov.errors import InputError
        from semgov.intake.capture import MalformedLine, read_captured

        v = Verdict()
        ev = self.ctx.captured_evaluator
        is_gz = data[:2] == b"\x1f\x8b"
        path = self.file("in.jsonl.gz" if is_gz else "in.jsonl")
        path.write_bytes(data)
        out: list[tuple[Any, list[Any]]] = []
        it = call(read_captured, path, allowed=(InputError,))
        if isinstance(it, InputError):
            v.reasons.append(norm(str(it)))
            return v
        while True:
            item = call(next, it, None, allowed=(InputError,))
            if item is None:
                break
            if isinstance(item, InputError):
                v.reasons.append(norm(str(item)))
                break
            if isinstance(item, MalformedLine):
                now = datetime(2026, 11, 29, tzinfo=UTC)
                out.append((item, call(ev.deny_malformed, item, now)))
            else:
                out.append((item, call(ev.evaluate, item)))
        self._judge(data, is_gz, out, v)
        return v

    def _judge(self, data: bytes, is_gz: bool, out: list[tuple[Any, list[Any]]], v: Verdict) -> None:
        from semgov.intake.capture import MalformedLine

        if is_gz:
            try:
                data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
            except zlib.error:
                data = b""
        lines = [ln for ln in data.split(b"\n") if ln.strip()]
        # A gzip stream that breaks yields one extra "cannot read further" item.
        if len(out) not in (len(lines), len(lines) + 1) or (len(out) == len(lines) + 1 and not is_gz):
            v.crashes.append(f"{len(lines)} non-blank lines but {len(out)} items")
        for idx, (item, decisions) in enumerate(out):
            raw = lines[idx] if idx < len(lines) else b""
            if isinstance(item, MalformedLine):
                if not item.reason.strip():
                    v.crashes.append("malformed line without a reason")
                v.reasons.append("line: " + norm(item.reason))
                for d in decisions:
                    self._check_deny(d, v, "malformed line")
                continue
            j = judge_line(raw, self.ctx.trust)
            v.lax += j.lax
            problems = {donor: p for donor, p in j.candidates if donor is not None}
            if len(decisions) != len(item.candidates):
                v.crashes.append(f"{len(item.candidates)} candidates but {len(decisions)} decisions")
            for d in decisions:
                bad = j.malformed or problems.get(d.donor_id, [])
                if d.decision == "allow":
                    v.accepted = True
                    if bad:
                        what = "line" if j.malformed else "candidate"
                        v.allows.append(f"allowed a malformed {what}: {_kind(bad[0])}")
                else:
                    self._check_deny(d, v, "deny")

    @staticmethod
    def _check_deny(d: Any, v: Verdict, what: str) -> None:
        if d.decision != "deny":
            v.allows.append(f"{what} got {d.decision}")
            return
        bad = [g for g in d.record["gates"] if g["result"] != "pass" and str(g["detail"]).strip()]
        if not bad:
            v.crashes.append(f"{what} without a named reason")
            return
        g = bad[0]
        v.reasons.append(f"{g['gate']} {g['result']}: {norm(g['detail'])}")


def _kind(problem: str) -> str:
    """A problem's kind (for counting): values and positions removed."""
    return norm(re.sub(r"\$[\w.\[\]]*", "$…", problem))


class ProvenanceTarget(CapturedTarget):
    """Candidates' signed provenance: payload, signature and key id, tampered or re-signed.

    Same entry point and oracle as ``captured``; the mutations go for the provenance: payload
    fields changed without re-signing, re-signed by the revoked key, by a rogue key claiming
    ``k1``, by an unknown key, invalid payloads validly signed by ``k1`` (wrong types, non-RFC 3339
    times, duplicate keys, donor id or token hash mismatches), signatures flipped, truncated,
    replayed from another candidate or re-encoded, NaN / huge similarities, tokens changed.
    """

    name = "provenance"
    share = 0.14

    def seeds(self) -> list[bytes]:
        return [s for s in super().seeds() if json.loads(s)["candidates"]]

    def _resign(self, ch: Chooser, payload_node: Any) -> dict[str, Any] | None:
        """Sign what a reader makes of ``payload_node`` (last duplicate wins) with a chosen key."""
        try:
            parsed = json.loads(dumps(payload_node))
        except (ValueError, RecursionError):
            return None
        msg = canonical(parsed)
        if msg is None:
            return None
        who = ch.pick(("k1", "k1", "k1", "k2", "rogue-as-k1", "k9"))
        key = self.ctx.signers[who]
        return {"key_id": key.key_id, "signature": key.sign(msg)}

    def mutate(self, ch: Chooser) -> bytes:
        req = json.loads(ch.pick(self.seed_list))
        i = ch.int(0, len(req["candidates"]) - 1)
        c = req["candidates"][i]
        prov = c["provenance"]
        k = ch.int(0, 11)
        if k <= 3:  # payload changed; re-signed (k >= 2) or not
            node, _ = mutate_json(ch, prov["payload"])
            prov["payload"] = node
            if k >= 2:
                sig = self._resign(ch, node)
                if sig is not None:
                    prov.update(sig)
        elif k == 4:  # a valid-looking payload with non-RFC 3339 times or a lax type, validly signed
            p = dict(prov["payload"])
            f = ch.pick(("created_at", "expires_at"))
            p[f] = ch.pick((
                1795946400, 1795946400.5, "1795946400", "2026-11-29 10:00:00Z", "2026-11-29T10:00Z",
                "2026-11-29T10:00:00+0000", "2026-11-29", "2026-12-31T10:00:00", "2026-W48-7T10:00:00Z",
            ))  # fmt: skip
            prov["payload"] = p
            sig = self._resign(ch, p)
            if sig is not None:
                prov.update(sig)
        elif k == 5:  # duplicate key in the payload, signed over the last-wins reading
            p = prov["payload"]
            f = ch.pick(sorted(p))
            pairs = list(p.items())
            at = ch.int(0, len(pairs))
            pairs.insert(at, (f, ch.pick((ch.hostile_value(), "globex", "public", p[f]))))
            node = Dup(tuple(pairs))
            prov["payload"] = node
            if ch.chance(0.7):
                sig = self._resign(ch, node)
                if sig is not None:
                    prov.update(sig)
        elif k == 6:  # the signature string
            s = prov["signature"]
            prov["signature"] = ch.pick((
                s[:-4] + ("A" if s[-4] != "A" else "B") + s[-3:],
                _noncanonical_b64(s),
                s[:-2],
                s + "=",
                " " + s,
                s.replace("+", "-").replace("/", "_"),
                s + "\n",
                "",
                s * 12,
                base64.b64encode(base64.b64decode(s)[:63]).decode(),
                base64.b64encode(b"\x00" * 64).decode(),
            ))  # fmt: skip
        elif k == 7:  # a signature replayed from another candidate / request
            other = json.loads(ch.pick(self.seed_list))
            if other["candidates"]:
                oc = ch.pick(other["candidates"])
                prov["signature"] = oc["provenance"]["signature"]
                if ch.chance(0.5):
                    prov["key_id"] = oc["provenance"]["key_id"]
        elif k == 8:  # key id
            prov["key_id"] = ch.pick(
                ("k2", "k9", "K1", "k1 ", " k1", "\u043a1", "k1\u0000", "k1\u200b", "k" * 513)
            )
        elif k == 9:  # donor tokens / donor id, maybe re-signed to match
            toks = c["prompt"]["token_ids"]
            if toks and ch.chance(0.6):
                j = ch.int(0, len(toks) - 1)
                toks[j] = ch.pick((toks[j] + 1, 0, 2**32 - 1, 2**32, -1, toks[j] + 2**32))
            else:
                c["donor_id"] = ch.pick((c["donor_id"] + "x", c["donor_id"].upper(), "", c["donor_id"] + " "))
            if ch.chance(0.3):
                p = dict(prov["payload"])
                if isinstance(toks, list) and all(isinstance(t, int) and 0 <= t < 2**32 for t in toks):
                    p["token_ids_sha256"] = hashlib.sha256(struct.pack(f"<{len(toks)}I", *toks)).hexdigest()
                prov["payload"] = p
                sig = self._resign(ch, p)
                if sig is not None:
                    prov.update(sig)
        elif k == 10:  # similarity
            c["similarity"] = ch.pick((Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), "0.9",
                                       True,
                                       None, 2**64, -0.0, 1.5, Raw("0.9e0"), [0.9]))  # fmt: skip
        else:  # the whole candidate mutated structurally
            node, _ = mutate_json(ch, c)
            req["candidates"][i] = node
        return encode(dumps(req))


def _noncanonical_b64(s: str) -> str:
    """The same bytes, written with non-zero padding bits (valid base64, not canonical)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body = s.rstrip("=")
    pad = len(s) - len(body)
    if pad == 0 or not body:
        return s + " "
    last = alphabet.index(body[-1])
    spare = (1 << (2 * pad)) - 1  # bits the decoder drops
    return body[:-1] + alphabet[last | spare] + "=" * pad if last & spare != spare else s[:-1]


# ---- decision records and engine events --------------------------------------------------------------


class RecordsTarget(Target):
    """Signed decision records and engine events: ``semgov verify-decision``'s per-line check
    (``verify_record_json``) and the audit verifier's per-leaf ``record_problem`` (both schemas).

    Oracle: a record is authentic iff strict JSON, schema-valid, signed by the decision key
    (checked with ``cryptography`` over the reference RFC 8785 bytes); the audit leaf check also
    needs the exact canonical bytes. Anything else accepted is an allow.
    """

    name = "records"
    share = 0.08

    def seeds(self) -> list[bytes]:
        return self.ctx.audit.leaves[:12] + self.ctx.audit.leaves[-4:]

    def dictionary(self) -> list[bytes]:
        return _json_dict_tokens(self.seed_list)

    @cached_property
    def _schemas(self) -> dict[str, Schema]:
        return {
            "semgov.decision/v1": Schema.load("decision.schema.json"),
            "semgov.decision/v2": Schema.load("decision.schema.json"),
            "semgov.decision/v3": Schema.load("decision.schema.json"),
            "semgov.engine_event/v1": Schema.load("engine_event.schema.json"),
            "semgov.engine_event/v2": Schema.load("engine_event.schema.json"),
        }

    def mutate(self, ch: Chooser) -> bytes:
        seed = ch.pick(self.seed_list)
        k = ch.int(0, 9)
        if k <= 5:
            tree, _ = mutate_json(ch, json.loads(seed))
            if k == 5 and isinstance(tree, dict):  # re-signed by the decision key: authentic if well-formed
                from semgov.signing.records import sign_record

                try:
                    tree = sign_record(json.loads(dumps(tree)), self.ctx.decision_key)
                except Exception:  # noqa: BLE001 - unsignable values: keep the unsigned mutation
                    pass
            return encode(dumps(tree, compact=ch.chance(0.8)))
        if k == 6:
            rec = json.loads(seed)
            rec["signature"] = _noncanonical_b64(rec["signature"])
            return json.dumps(rec, separators=(",", ":"), sort_keys=True).encode()
        if k == 7:  # same content, other spelling (key order, spaces): fine for verify-decision
            rec = json.loads(seed)
            return json.dumps(dict(reversed(list(rec.items()))), indent=ch.pick((None, 1))).encode()
        data = seed
        for _ in range(ch.int(1, 3)):
            data, _ = mutate_bytes(ch, data)
        return data

    def run(self, data: bytes) -> Verdict:
        from semgov.audit.verify import record_problem
        from semgov.errors import InputError, SignatureError
        from semgov.signing.records import verify_record_json

        v = Verdict()
        pk, kid = self.ctx.public_key, self.ctx.key_id
        authentic, why, exact = self._authentic(data)
        # 1. `semgov verify-decision`, one line, exactly as the CLI reads it (strict JSON, object,
        #    verify_record). Engine events have no CLI of their own: the audit verifier's per-leaf
        #    check below is their entry point.
        r = call(verify_record_json, data, pk, allowed=(SignatureError, InputError, ValueError))
        if isinstance(r, Exception):
            v.reasons.append("decision: " + norm(str(r)))
            if not str(r).strip():
                v.crashes.append("verify_decision raised without a message")
        else:
            v.accepted = True
            rec = json.loads(data)
            if not authentic or rec.get("schema") not in (
                "semgov.decision/v1",
                "semgov.decision/v2",
                "semgov.decision/v3",
            ):
                v.allows.append(f"verify_decision accepted: {why or 'wrong schema'}")
        # 2. The audit verifier's per-leaf check (the leaf is the exact bytes).
        problem = call(record_problem, data, pk, kid)
        if problem is None:
            v.accepted = True
            if not authentic:
                v.allows.append(f"record_problem accepted: {why}")
            elif not exact:
                v.allows.append("record_problem accepted non-canonical leaf bytes")
        else:
            v.reasons.append("leaf: " + norm(problem))
        if authentic and why:
            v.lax.append(why)
        return v

    def _authentic(self, data: bytes) -> tuple[bool, str, bool]:
        """``(authentic, why not / lax note, exact canonical bytes)``, judged independently."""
        rd = read_json(data)
        if rd.problems or not isinstance(rd.value, dict):
            return False, _kind(rd.problems[0]) if rd.problems else "not an object", False
        lax_note = rd.lax[0] if rd.lax else ""
        rec = rd.value
        name = rec.get("schema")
        schema = self._schemas.get(name) if isinstance(name, str) else None
        if schema is None:
            return False, "unknown schema", False
        errs = schema.errors(rec)
        if errs:
            return False, _kind(errs[0]), False
        plan = _plan_problem(rec)
        if plan:
            return False, plan, False
        if rec.get("key_id") != self.ctx.key_id:
            return False, "other key id", False
        sig, canonical_b64 = b64_signature(rec.get("signature"))
        body = canonical({k: x for k, x in rec.items() if k != "signature"})
        if sig is None or body is None:
            return False, "signature not base64", False
        raw = self.ctx.public_key.public_bytes_raw()
        if not ed25519_ok(raw, sig, body):
            return False, "signature does not verify", False
        exact = canonical(rec) == data
        return True, lax_note or ("" if canonical_b64 else "non-canonical base64 signature"), exact


def _plan_problem(rec: dict[str, Any]) -> str:
    """What the schema file cannot say about a decision's plan: a v2 or v3 span states ``recompute``
    (at most its length), a v1 span does not."""
    name = rec.get("schema")
    if name not in ("semgov.decision/v1", "semgov.decision/v2", "semgov.decision/v3"):
        return ""
    for s in rec.get("approved_spans", []):
        if (name != "semgov.decision/v1") != ("recompute" in s):
            return "plan does not fit the schema version"
        if "recompute" in s and s["recompute"] > s["length"]:
            return "recompute beyond its span"
    return ""


# ---- keyrings -------------------------------------------------------------------------------------------


def _foreign_pems() -> list[str]:
    """Public keys of the wrong kind (deterministic): P-256, X25519, Ed448, and a private key."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, x25519

    spki = (s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
    out = [
        ec.derive_private_key(123456789, ec.SECP256R1()).public_key().public_bytes(*spki).decode(),
        x25519.X25519PrivateKey.from_private_bytes(b"\x07" * 32).public_key().public_bytes(*spki).decode(),
        ed448.Ed448PrivateKey.from_private_bytes(b"\x09" * 57).public_key().public_bytes(*spki).decode(),
        (EX / "keys" / "provenance-rogue.pem").read_text(),
    ]
    return out


class KeyringTarget(Target):
    """Keyring files through ``Keyring.load`` (what ``--trust`` reads).

    Oracle: strict JSON, exactly ``{"keys": [{key_id, public_key, revoked?}]}``, unique ids, every
    key an Ed25519 SubjectPublicKeyInfo PEM (parsed by hand). A load of anything else is an allow;
    a load whose keys differ from the oracle's reading is an allow too.
    """

    name = "keyring"
    share = 0.07

    def seeds(self) -> list[bytes]:
        rogue = (EX / "keys" / "provenance-rogue.pem").read_bytes()
        from cryptography.hazmat.primitives import serialization as s

        rogue_pub = (
            s.load_pem_private_key(rogue, None)
            .public_key()
            .public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
        )
        three = json.loads((EX / "keyring.json").read_text())
        three["keys"].append({"key_id": "k3", "public_key": rogue_pub.decode(), "revoked": False})
        return [
            (EX / "keyring.json").read_bytes(),
            (ASSETS / "keyring.json").read_bytes(),
            json.dumps(three).encode(),
            b'{"keys": []}',
        ]

    def dictionary(self) -> list[bytes]:
        return [
            *_json_dict_tokens(self.seed_list),
            b"-----BEGIN PUBLIC KEY-----",
            b"-----END PUBLIC KEY-----",
            b"\\n",
        ]

    @cached_property
    def _foreign(self) -> list[str]:
        return _foreign_pems()

    def mutate(self, ch: Chooser) -> bytes:
        seed = ch.pick(self.seed_list)
        doc = json.loads(seed)
        k = ch.int(0, 9)
        if k <= 4 or not doc["keys"]:
            tree, _ = mutate_json(ch, doc)
            return encode(dumps(tree, compact=ch.chance(0.5)))
        entry = doc["keys"][ch.int(0, len(doc["keys"]) - 1)]
        pem = entry["public_key"]
        if k == 5:
            lines = pem.split("\n")
            body = lines[1]
            j = ch.int(0, len(body) - 1)
            lines[1] = body[:j] + ch.pick("AZaz09+/=!") + body[j + 1 :]
            entry["public_key"] = "\n".join(lines)
        elif k == 6:
            entry["public_key"] = ch.pick(self._foreign)
        elif k == 7:
            entry["public_key"] = ch.pick((
                pem.replace("\n", "\r\n"), pem.rstrip("\n"), "junk\n" + pem, pem + "trailer\n", pem + pem,
                pem.replace("PUBLIC", "PRIVATE"), pem.replace("\n", "", 1), pem[: len(pem) // 2],
                pem.replace("MCowBQYDK2VwAyEA", "MCowBQYDK2VwAyEA "), pem.lower(),
            ))  # fmt: skip
        elif k == 8:
            doc["keys"].append(dict(entry))  # duplicate key id
        else:
            data = seed
            for _ in range(ch.int(1, 3)):
                data, _ = mutate_bytes(ch, data)
            return data
        return json.dumps(doc).encode()

    def run(self, data: bytes) -> Verdict:
        from semgov.errors import InputError, KeyFileError
        from semgov.signing.keys import Keyring

        v = Verdict()
        path = self.file("keyring.json")
        path.write_bytes(data)
        got = call(Keyring.load, path, allowed=(InputError, KeyFileError))
        want, problems, lax = self._judge(data)
        if isinstance(got, Exception):
            v.reasons.append(norm(str(got)))
            if not (got.source and str(path) in got.source):  # type: ignore[attr-defined]
                v.crashes.append(f"keyring error does not name the file: {norm(str(got))}")
            return v
        v.accepted = True
        if problems:
            v.allows.append(f"loaded a malformed keyring: {_kind(problems[0])}")
            return v
        v.lax += lax
        mine = {kid: (k.public_key.public_bytes_raw(), k.revoked) for kid, k in got._keys.items()}
        if mine != want:
            v.allows.append("loaded keys differ from the file's")
        return v

    def _judge(self, data: bytes) -> tuple[dict[str, tuple[bytes, bool]], list[str], list[str]]:
        rd = read_json(data)
        if rd.problems:
            return {}, rd.problems, []
        want, problems, lax = self._judge_doc(rd.value)
        # Keyring's documented rule: revocation follows the key material, whatever the id.
        revoked = {raw for raw, r in want.values() if r}
        return {k: (raw, r or raw in revoked) for k, (raw, r) in want.items()}, problems, rd.lax + lax

    def _judge_doc(self, doc: Any) -> tuple[dict[str, tuple[bytes, bool]], list[str], list[str]]:
        if not isinstance(doc, dict) or set(doc) != {"keys"} or not isinstance(doc["keys"], list):
            return {}, ["not {keys: [...]}"], []
        want: dict[str, tuple[bytes, bool]] = {}
        lax: list[str] = []
        for i, e in enumerate(doc["keys"]):
            if not isinstance(e, dict) or not {"key_id", "public_key"} <= set(e) <= {
                "key_id",
                "public_key",
                "revoked",
            }:
                return {}, [f"keys.{i}: wrong members"], []
            if not isinstance(e["key_id"], str) or not isinstance(e["public_key"], str):
                return {}, [f"keys.{i}: not strings"], []
            if not isinstance(e.get("revoked", False), bool):
                return {}, [f"keys.{i}.revoked: not a boolean"], []
            if e["key_id"] in want:
                return {}, ["duplicate key id"], []
            raw, exact = ed25519_from_pem(e["public_key"])
            if raw is None:
                return {}, [f"keys.{i}: not an Ed25519 SPKI PEM"], []
            if not exact:
                lax.append("text around the PEM block")
            want[e["key_id"]] = (raw, bool(e.get("revoked", False)))
        return want, [], lax


# ---- YAML policies ----------------------------------------------------------------------------------------


class _OracleYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, plus: duplicate keys, merge keys and non-string keys are problems."""

    problems: list[str]

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for k, _ in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                self.problems.append("merge key")
            key = self.construct_object(k, deep=True)
            if not isinstance(key, str):
                self.problems.append("non-string key")
            elif key in seen:
                self.problems.append(f"duplicate key {key!r}")
            seen.add(key if isinstance(key, str) else repr(key))
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: Any, memo: dict[int, int], depth: int = 0) -> int:
    if depth > 400:
        return 10**9
    if id(node) in memo:
        return memo[id(node)]
    n = 1
    if isinstance(node, yaml.MappingNode):
        n += sum(
            _expanded_size(k, memo, depth + 1) + _expanded_size(x, memo, depth + 1) for k, x in node.value
        )
    elif isinstance(node, yaml.SequenceNode):
        n += sum(_expanded_size(x, memo, depth + 1) for x in node.value)
    memo[id(node)] = n
    return n


def judge_yaml_text(data: bytes) -> tuple[Any, list[str]]:
    """The oracle's reading of a policy file: its data and every problem against docs/policy.md."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, ["not UTF-8"]
    try:
        depth = 0
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):  # lazily: stops at the first deep level
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
                if depth > 200:
                    return None, ["nesting too deep"]
            elif isinstance(ev, yaml.CollectionEndEvent):
                depth -= 1
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None and _expanded_size(root, {}) > 100_000:
            return None, ["alias expansion too large"]
        loader = _OracleYamlLoader(text)
        loader.problems = []
        try:
            value = loader.get_single_data()
        finally:
            loader.dispose()
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        return None, [f"not YAML ({type(e).__name__})"]
    lines = [x for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
    unended = [] if lines and re.fullmatch(r"\.\.\.([ \t]+#.*)?[ \t]*", lines[-1]) else ["no end marker"]
    return value, loader.problems + judge_policy_yaml(value) + unended


YAML_SNIPPETS = (
    "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e]",
    "base: &base {min: 0.1}\nsimilarity:\n  <<: *base",
    "x: !!python/object:os.system ls",
    "x: !!python/name:os.system",
    "name: !!binary aGVsbG8=",
    "accepted_policy_versions: !!set {a, b}",
    "? [complex, key]\n: 1",
    "~: null",
    "1: one",
    "---\nname: second",
    "%YAML 1.1\n---",
    "description: " + "[" * 3000 + "]" * 3000,
    "description: " + "{a: " * 1000 + "1" + "}" * 1000,
    "similarity: {min: 1" + "0" * 5000 + "}",
    "similarity: {min: .nan}",
    "similarity: {min: .inf}",
    "similarity: {min: '0.7'}",
    "similarity: {min: 0x1}",
    "token_verification: {min_span_tokens: 1_000, reusable_roles: [question]}",
    "token_verification: {min_approved_tokens: -1}",
    "tenant: {allow_public_donors: yes}",
    "tenant: {allow_public_donors: 'true'}",
    "expiry: {max_age: 0}",
    "expiry: {max_age: 30y}",
    "expiry: {max_age: 99999999999999999999999d}",
    "namespace: {sharing: [{donor: '*', recipients: ['*']}]}",
    "namespace: {sharing: [{donor: research/../x, recipients: [research/*]}]}",
    "version: 2026-01-01",
    "version: 1.0",
    "name: 'bad name with spaces'",
    'name: "\\u202e"',
    "pii: {phone_regions: []}",
    "pii: {forbidden_entities: [email]}",
    "task: {compatible_groups: [[a@1, b]]}",
    "unknown_section: {}",
    "\t- tab",
    "x: " + "y" * 200_000,
)
YAML_TOKENS = (
    "name", "version", "tenant", "namespace", "sharing", "expiry", "max_age", "pii", "forbidden_entities",
    "scan_donor_text", "require_scan", "min_score", "phone_regions", "task", "compatible_groups",
    "similarity", "min", "token_verification", "min_span_tokens", "min_approved_tokens",
    "min_approved_fraction", "allow_shifted", "reusable_roles", "true", "false", "yes", "no", "null",
    "~", ".nan", ".inf", "&a", "*a", "<<:", "!!str", "!!int", "!!binary", "- ", ": ", "'", '"', "[", "{",
    "0.6", "-1", "1e400", "system", "evidence", "question", "30d", "US", "EMAIL_ADDRESS",
)  # fmt: skip


class YamlPolicyTarget(Target):
    """YAML policy files through ``load_policy_source`` (and one decision by the loaded policy).

    Oracle: the file read by PyYAML's safe loader with duplicate, merge and non-string keys
    flagged, alias expansion bounded, and every key, type and range of docs/policy.md checked
    by hand. Errors must be ``PolicyError`` naming the file (and a line: counted as unlocated
    when missing).
    """

    name = "yaml_policy"
    share = 0.12

    def seeds(self) -> list[bytes]:
        base = (POLICY_YAML_DIR / "policy.yaml").read_bytes()
        gpu = (ROOT / "tests" / "sglang_server" / "policy" / "policy.yaml").read_bytes()
        extra = base + (
            b"\naccepted_policy_versions: [default@0]\nnamespace:\n  sharing:\n"
            b"    - donor: research/common\n      recipients: [research/*]\n"
            b"task:\n  compatible_groups: [[extract_financials@1, extract_financials@2]]\n"
        )
        # `namespace` and `task` appear twice in `extra` if base has them: keep only valid seeds.
        out = [base, gpu, b"name: minimal\nversion: '1'\n...\n"]
        if not judge_yaml_text(extra)[1]:
            out.append(extra)
        return out

    def dictionary(self) -> list[bytes]:
        return [t.encode() for t in YAML_TOKENS]

    def mutate(self, ch: Chooser) -> bytes:
        seed = ch.pick(self.seed_list)
        k = ch.int(0, 9)
        if k <= 3:
            tree, _ = mutate_json(ch, yaml.safe_load(seed))
            try:
                if ch.chance(0.5):
                    dumped = yaml.safe_dump(tree, allow_unicode=ch.chance(0.5), explicit_end=True)
                    return dumped.encode("utf-8", "surrogatepass")
            except yaml.YAMLError:
                pass
            return encode(
                dumps(tree, compact=False) + "\n...\n"
            )  # JSON is (nearly) YAML: Raw and Dup nodes too
        if k <= 7:
            text = seed.decode()
            for _ in range(ch.int(1, 2)):
                text, _ = mutate_text(ch, text, YAML_SNIPPETS, YAML_TOKENS)
            return encode(text)
        data = seed
        for _ in range(ch.int(1, 4)):
            data, _ = mutate_bytes(ch, data)
        return data

    def run(self, data: bytes) -> Verdict:
        from semgov.errors import PolicyError
        from semgov.policy.source import load_policy_source

        v = Verdict()
        d = self.file("policy")
        d.mkdir(exist_ok=True)
        (d / "policy.yaml").write_bytes(data)
        pol = call(load_policy_source, d, allowed=(PolicyError,))
        _, problems = judge_yaml_text(data)
        if isinstance(pol, PolicyError):
            v.reasons.append(norm(pol.diagnostic()))
            if not (pol.source and str(d) in pol.source):
                v.crashes.append(f"policy error does not name the file: {norm(str(pol))}")
            elif pol.line is None and "byte" not in pol.message:
                v.unlocated.append(norm(pol.message))
            return v
        v.accepted = True
        if problems:
            v.allows.append(f"loaded a malformed policy: {_kind(problems[0])}")
        # One decision by the loaded policy over a real document: no crash, engine + checks.
        ev = call(self.ctx.evaluator, pol)
        call(ev.decide, self.ctx.audit.allow_doc)
        return v


# ---- Rego policies -----------------------------------------------------------------------------------------

REGO_SNIPPETS = (
    "allow := true",
    "default allow := true",
    "allow if true",
    "deny := set()",
    "deny := []",
    'deny contains {"gate": "nope", "detail": "x"} if true',
    'deny contains {"gate": "tenant", "detail": 1} if true',
    'deny contains {"gate": "tenant"} if true',
    'approved_spans := [{"recipient_start": 0, "donor_start": 0, "length": 100000, "kind": "prefix"}]',
    'approved_spans := [{"recipient_start": 0, "donor_start": 5, "length": 10, "kind": "shifted"}]',
    'approved_spans := [{"recipient_start": true, "donor_start": 0, "length": 1, "kind": "prefix"}]',
    "approved_spans := input.facts.tokens.spans",
    "approved_spans := 7",
    'metadata := {"name": 1, "version": "1"}',
    'metadata := {"name": "x y", "version": "1"}',
    'metadata := {"name": "default", "version": "1", "extra": true}',
    "metadata := input.x",
    'facts_config := {"min_span_tokens": 0}',
    'facts_config := {"pii_min_score": 2}',
    "facts_config := 5",
    "now := time.now_ns()",
    'r := http.send({"method": "get", "url": "http://127.0.0.1:1"})',
    'x := rand.intn("k", 10)',
    "package other",
    "package semgov.reuse",
    "import rego.v1",
    "import data.nothing",
    "allow := count(deny) == 0",
    "allow := input.facts.provenance.signature_valid",
    "x := count([i | some i in numbers.range(1, 20000)])",
    "deny contains d if { some d in input.facts.errors }",
    "f(x) := f(x)",
    "x := [" * 300 + "]" * 300,
    "x := " + "(" * 400 + "1" + ")" * 400,
    "x := 1e400",
    'x := "\\ud800"',
    "}",
    "{",
    "if {",
    "# " + "c" * 10_000,
)
REGO_TOKENS = (
    "allow", "deny", "approved_spans", "metadata", "facts_config", "if", "contains", "some", "in", "every",
    "not", "default", "true", "false", "null", ":=", "==", "!=", "<", ">=", "{", "}", "[", "]", "input",
    "input.facts", "count", "sum", "data", "with", "else", "package", "import", "rego.v1", '"tenant"',
    '"prefix"', '"shifted"', "0", "1", "-1", "0.6", "k1",
)  # fmt: skip


class RegoPolicyTarget(Target):
    """Rego modules through ``load_policy_source``, then decisions by regorus via the evaluator.

    Oracle: a broken module must raise ``PolicyError`` naming its file, or decide only fail-closed:
    every document whose facts could not be computed, or whose token verification found nothing,
    must be denied whatever the module says; and on the allow document, an allow must follow the
    package convention (``allow`` a boolean equal to "``deny`` is empty", ``deny`` entries
    ``{gate, detail}``, spans well formed and inside verified spans), checked by asking regorus
    for the raw rules directly.
    """

    name = "rego_policy"
    share = 0.03
    max_len = 32768

    def seeds(self) -> list[bytes]:
        return [(POLICY_REGO_DIR / "policy.rego").read_bytes()]

    def dictionary(self) -> list[bytes]:
        return [t.encode() for t in REGO_TOKENS]

    def mutate(self, ch: Chooser) -> bytes:
        text = ch.pick(self.seed_list).decode()
        if ch.chance(0.85):
            for _ in range(ch.int(1, 3)):
                text, _ = mutate_text(ch, text, REGO_SNIPPETS, REGO_TOKENS)
            return encode(text)
        data = text.encode()
        for _ in range(ch.int(1, 4)):
            data, _ = mutate_bytes(ch, data)
        return data

    def run(self, data: bytes) -> Verdict:
        from semgov.errors import PolicyError
        from semgov.policy.rego.engines import RegorusEngine
        from semgov.policy.source import load_policy_source

        v = Verdict()
        d = self.file("rego")
        d.mkdir(exist_ok=True)
        (d / "policy.rego").write_bytes(data)
        pol = call(load_policy_source, d, allowed=(PolicyError,))
        if isinstance(pol, PolicyError):
            v.reasons.append(norm(pol.diagnostic()))
            if not (pol.source and str(d) in pol.source):
                v.crashes.append(f"policy error does not name the file: {norm(str(pol))}")
            return v
        v.accepted = True
        engine = call(RegorusEngine, pol)
        from semgov.decide import Evaluator

        ev = Evaluator(pol, self.ctx.keyring, self.ctx.decision_key, pii_scanner=self.ctx.pii, engine=engine)
        fx = self.ctx.audit
        for label, doc in fx.must_deny_docs:
            r = call(ev.decide, doc)
            if all(g.result == "pass" for g in r.gates) and r.approved_spans:
                v.allows.append(f"broken module allowed a must-deny document ({label})")
        r = call(ev.decide, fx.allow_doc)
        allowed = all(g.result == "pass" for g in r.gates) and bool(r.approved_spans)
        if allowed:
            bad = self._convention(engine, fx)
            if bad:
                v.allows.append(f"allowed although the module breaks the convention: {bad}")
        else:
            bad_gates = [g for g in r.gates if g.result != "pass"]
            if not bad_gates or not all(str(g.detail).strip() for g in bad_gates):
                v.crashes.append("deny without a named reason")
            else:
                v.reasons.append(f"{bad_gates[0].gate} {bad_gates[0].result}: {norm(bad_gates[0].detail)}")
        return v

    @staticmethod
    def _convention(engine: Any, fx: AuditFixture) -> str:
        """Ask regorus for the raw rules and check the package convention by hand."""
        eng = engine._engine()  # NOTE: this thread's own regorus engine (never another thread's)
        eng.set_input_json(json.dumps(fx.allow_doc_json))
        try:
            allow = eng.eval_rule("data.semgov.reuse.allow")
            deny = eng.eval_rule("data.semgov.reuse.deny")
            spans = eng.eval_rule("data.semgov.reuse.approved_spans")
        except Exception as e:  # noqa: BLE001 - the rules do not evaluate: not a conforming module
            return f"rules do not evaluate ({type(e).__name__})"
        if not isinstance(allow, bool):
            return "allow is not a boolean"
        if not isinstance(deny, list | set | tuple):
            return "deny is not a set"
        for d in deny:
            if not (isinstance(d, dict) and set(d) == {"gate", "detail"} and d["gate"] in GATES
                    and isinstance(d["detail"], str)):  # fmt: skip
                return "malformed deny entry"
        if allow != (len(deny) == 0):
            return "allow disagrees with deny"
        if not isinstance(spans, list):
            return "approved_spans is not an array"
        verified = fx.allow_doc_json["facts"]["tokens"]["spans"]
        for s in spans:
            keys = {"recipient_start", "donor_start", "length", "kind"}
            if not (isinstance(s, dict) and keys <= set(s) <= keys | {"recompute"}
                    and all(type(s[k]) is int for k in ("recipient_start", "donor_start", "length"))
                    and type(s.get("recompute", 0)) is int and 0 <= s.get("recompute", 0) <= s["length"]
                    and s["kind"] in ("prefix", "shifted")):  # fmt: skip
                return "malformed span"
            if not any(
                w["recipient_start"] <= s["recipient_start"]
                and s["recipient_start"] + s["length"] <= w["recipient_start"] + w["length"]
                and s["donor_start"] - s["recipient_start"] == w["donor_start"] - w["recipient_start"]
                and s["kind"] == w["kind"]
                for w in verified
            ):
                return "span not verified"
        return ""


# ---- policy input documents ------------------------------------------------------------------------------

_PI_SCHEMA = Schema.load("policy_input.schema.json")


def deep_merge(base: Any, patch: Any) -> Any:
    """The case files' merge (:func:`semgov.policy.testing.deep_merge`), imported when first used
    like every semgov module here."""
    from semgov.policy.testing import deep_merge as merge

    return merge(base, patch)


def must_deny_input(doc: Any) -> str:
    """Why the default policies must deny this (schema-valid) document whatever else it says; '' if none."""
    facts = doc.get("facts") if isinstance(doc, dict) else None
    if not isinstance(facts, dict):
        return "no facts"
    errors = facts.get("errors")
    # NOTE: semgov computes three facts; an error filed under any other name concerns no gate.
    if isinstance(errors, dict) and set(errors) & {"provenance", "pii", "tokens"}:
        return "a fact could not be computed"
    prov = facts.get("provenance")
    if not isinstance(prov, dict):
        return "no provenance facts"
    good = {
        "signature_valid": True,
        "payload_valid": True,
        "donor_id_matches": True,
        "token_hash_matches": True,
        "segments_hash_matches": True,
        "text_hash_matches": True,
    }
    if prov.get("key_status") != "trusted" or any(prov.get(k) is not x for k, x in good.items()):
        return "unverified provenance"
    if facts.get("donor") is None:
        return "no donor claims"
    tokens = facts.get("tokens")
    if not isinstance(tokens, dict) or not tokens.get("spans"):
        return "nothing verified by token verification"
    return ""


class PolicyInputTarget(Target):
    """Policy input documents: semgov's document validation (as ``semgov policy test`` case files
    use it), then the YAML engine and regorus, each through ``Evaluator.decide`` (engine, then
    ``checked_result``).

    Oracle: strict JSON and ``schemas/policy_input.schema.json`` (a malformed document must
    never be allowed), and the default policies' must-deny facts (unverified provenance, a fact
    that could not be computed, nothing verified by token verification).
    """

    name = "policy_input"
    share = 0.12

    def seeds(self) -> list[bytes]:
        return [json.dumps(d, separators=(",", ":")).encode() for d in self.ctx.audit.case_docs]

    def dictionary(self) -> list[bytes]:
        return _json_dict_tokens(self.seed_list)

    @cached_property
    def _evaluators(self) -> list[tuple[str, Any]]:
        return [
            ("yaml", self.ctx.evaluator(self.ctx.yaml_policy)),
            ("regorus", self.ctx.evaluator(self.ctx.rego_policy)),
        ]

    def mutate(self, ch: Chooser) -> bytes:
        seed = json.loads(ch.pick(self.seed_list))
        if ch.chance(0.85):
            tree, _ = mutate_json(
                ch, seed, focus=lambda p: bool(p) and p[0] in ("facts", "candidate", "now_ns")
            )
            return encode(dumps(tree))
        data = json.dumps(seed).encode()
        for _ in range(ch.int(1, 3)):
            data, _ = mutate_bytes(ch, data)
        return data

    def run(self, data: bytes) -> Verdict:
        from semgov._internal.yamlload import load_yaml_with_lines
        from semgov.errors import PolicyError
        from semgov.policy.testing import input_adapter

        v = Verdict()
        # What `semgov policy test` does with a case's document: read it with semgov's YAML
        # reader (JSON is YAML), then validate it as a policy input document.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            v.reasons.append("not UTF-8")
            return v
        raw = call(load_yaml_with_lines, text, "<case>", allowed=(PolicyError,))
        if isinstance(raw, PolicyError):
            v.reasons.append(norm(raw.message))
            return v
        doc = call(input_adapter().validate_python, raw[0], allowed=(ValidationError,))
        if isinstance(doc, ValidationError):
            err = doc.errors(include_url=False)[0]
            v.reasons.append(norm(f"invalid input: {'.'.join(map(str, err['loc']))}: {err['msg']}"))
            return v
        value, problems = self._judge(data, text)
        deny_why = must_deny_input(value)
        for name, ev in self._evaluators:
            r = call(ev.decide, doc)
            if all(g.result == "pass" for g in r.gates) and r.approved_spans:
                v.accepted = True
                if problems:
                    v.allows.append(f"{name} allowed a malformed document: {_kind(problems[0])}")
                elif deny_why:
                    v.allows.append(f"{name} allowed a must-deny document: {deny_why}")
            else:
                bad = [g for g in r.gates if g.result != "pass"]
                if not bad or not all(str(g.detail).strip() for g in bad):
                    v.crashes.append(f"{name}: deny without a named reason")
                else:
                    v.reasons.append(f"{name} {bad[0].gate} {bad[0].result}: {norm(bad[0].detail)}")
        return v

    @staticmethod
    def _judge(data: bytes, text: str) -> tuple[Any, list[str]]:
        """The oracle's reading: strict JSON if it is JSON, else YAML (duplicate keys flagged); the schema."""
        rd = read_json(data)
        # NOTE: a case file is YAML: a bare NaN / Infinity / -Infinity there is the *string* of
        # that name (YAML spells non-finite floats .nan / .inf), so the YAML reading judges it.
        literal = any("literal" in str(p) for p in rd.problems)
        if rd.ok and not literal:
            value, problems = rd.value, list(rd.problems)
        else:
            try:
                loader = _OracleYamlLoader(text)
                loader.problems = []
                try:
                    value = loader.get_single_data()
                finally:
                    loader.dispose()
                problems = list(loader.problems)
            except (yaml.YAMLError, RecursionError, ValueError) as e:
                return None, [f"not YAML ({type(e).__name__})"]
        return value, problems + _PI_SCHEMA.errors(value)


# ---- the audit log: records, checkpoints, state, proof bundles ---------------------------------------------


class AuditFixture:
    """A real audit log of real signed records (two snapshots), its notes and real proof bundles.

    ``closed``: a log closed normally (its last checkpoint covers every record).
    ``crashed``: a copy taken while the writer was still running, after a flush: records beyond
    the last checkpoint, as a writer killed before its next checkpoint leaves them.
    """

    ORIGIN = "semgov/hostile-campaign"

    def __init__(self, ctx: Ctx) -> None:
        from semgov.audit.store import AuditLog
        from semgov.signing.engine_events import engine_event, sign_engine_event

        self.ctx = ctx
        base = ctx.work / "audit-fixture"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        ev = ctx.evaluator(ctx.yaml_policy)
        records: list[bytes] = []
        with stable_ids(1234):
            for line in ctx.example_lines[1:400:12]:
                from semgov.intake.capture import parse_line

                req = parse_line(_strip_text(line), 1)
                records += [d.canonical for d in ev.evaluate(req)]
                if len(records) >= 40:
                    break
            for i, kind in enumerate(
                ("realization", "realization_failed", "invariant_violation", "reuse_disabled")
            ):
                rec = json.loads(records[i])
                e = engine_event(
                    kind,
                    engine="sglang 0.5.23",
                    at=datetime(2026, 11, 29, 10, tzinfo=UTC) + timedelta(seconds=i),
                    request_id=rec["request_id"],
                    decision_id=rec["decision_id"] if kind != "reuse_disabled" else None,
                    donor_id=rec["donor_id"],
                    materialized_tokens=8 if kind == "realization" else 0,
                    slots=list(range(100, 108)) if kind == "realization" else [],
                    detail=f"hostile campaign {kind}",
                )
                records.append(sign_engine_event(e, ctx.decision_key).canonical)
            # What the writer under test appends: a genuine record not in the log (a second copy
            # of a logged one would be a duplicate event id, which verify rightly reports).
            appended = engine_event(
                "reuse_disabled", engine="sglang 0.5.23", at=datetime(2026, 11, 29, 11, tzinfo=UTC),
                detail="hostile campaign: appended by the writer under test",
            )  # fmt: skip
            self.extra = sign_engine_event(appended, ctx.decision_key).canonical
        self.records = records  # 44 leaves: decisions, then four engine events
        self.closed = base / "closed"
        self.crashed = base / "crashed"
        log = AuditLog.open(
            self.closed, signing_key=ctx.decision_key, origin=self.ORIGIN, checkpoint_every=10,
            checkpoint_interval=3600.0,
        )  # fmt: skip
        try:
            # Batches of ten, each waited for until its checkpoint and state are on disk, so that
            # checkpoints/10, 20, 30, 40.note exist; the last four records stay past the checkpoint.
            for start in range(0, len(records), 10):
                for r in records[start : start + 10]:
                    log.append(r)
                log.flush()
                _wait_state(self.closed, min(start + 10, len(records)))
            shutil.copytree(self.closed, self.crashed, ignore=shutil.ignore_patterns("LOCK"))
        finally:
            log.close()
        self.notes = sorted(
            {
                p.read_bytes()
                for d in (self.closed, self.crashed)
                for p in [d / "checkpoint", *(d / "checkpoints").glob("*.note")]
            }
        )
        from semgov.audit.keyring import key_name_for

        self.key_name = key_name_for(ctx.key_id)
        self.kept = (self.closed / "checkpoints" / "20.note").read_bytes()
        self.original = {d: self._files(d) for d in (self.closed, self.crashed)}
        self.frames = self._frames((self.closed / "records.log").read_bytes())

    @staticmethod
    def _files(d: Path) -> dict[str, bytes]:
        return {
            p.relative_to(d).as_posix(): p.read_bytes()
            for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != "LOCK"
        }

    @staticmethod
    def _frames(log: bytes) -> list[bytes]:
        """The log's frames (records and seals), split by hand: index u64 | length u32 | sha256 | payload."""
        out, off = [], 0
        while off + 44 <= len(log):
            (length,) = struct.unpack(">I", log[off + 8 : off + 12])
            end = off + 44 + length
            if end > len(log):
                break
            out.append(log[off:end])
            off = end
        return out

    @cached_property
    def leaves(self) -> list[bytes]:
        return list(self.records)

    @cached_property
    def bundles(self) -> list[bytes]:
        from semgov.audit.verify_dir import make_bundle

        out = []
        for leaf in self.records[:40:7]:
            rec = json.loads(leaf)
            out.append((json.dumps(make_bundle(self.closed, rec["decision_id"]), indent=2) + "\n").encode())
        return out

    @cached_property
    def case_docs(self) -> list[dict[str, Any]]:
        cases = yaml.safe_load((POLICY_YAML_DIR / "policy_test.yaml").read_text())
        base = cases["base"]
        docs = [base]
        for c in cases["cases"]:
            docs.append(c["input"] if "input" in c else deep_merge(base, c.get("patch", {})))
        return docs

    @cached_property
    def allow_doc_json(self) -> dict[str, Any]:
        return copy.deepcopy(self.case_docs[0])

    @cached_property
    def allow_doc(self) -> Any:
        from semgov.policy.testing import input_adapter

        return input_adapter().validate_python(self.allow_doc_json)

    @cached_property
    def must_deny_docs(self) -> list[tuple[str, Any]]:
        from semgov.policy.testing import input_adapter

        base = self.allow_doc_json
        patches = [
            ("provenance fact error", {"facts": {"errors": {"provenance": "KeyError: boom"}}}),
            ("tokens fact error", {"facts": {"errors": {"tokens": "ValueError: boom"}}}),
            ("no verified spans", {"facts": {"tokens": {"spans": []}}}),
        ]
        return [(label, input_adapter().validate_python(deep_merge(base, p))) for label, p in patches]


def _wait_state(d: Path, size: int) -> None:
    """Until the writer has recorded ``size`` records in state.json (it does so after the checkpoint)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if json.loads((d / "state.json").read_bytes())["size"] == size:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.002)
    raise RuntimeError(f"audit fixture: state.json never reached size {size}")


_LOG_MAGIC = b"SGLOG"
_LOG_FILES = ("records.log", "checkpoint", "state.json", "checkpoints/20.note", "KEPT", "DELETE")


class AuditLogTarget(Target):
    """Audit log directories through ``verify_log`` (``semgov audit verify``) and ``AuditLog.open``.

    An input is ``SGLOG | snapshot | file | content``: one file of a real log replaced (the frames,
    the checkpoint, ``state.json``, an older checkpoint, the reviewer's kept checkpoint) or deleted.
    Oracle, by hand: the log is tampered when a record frame covered by an authentic checkpoint
    changed, or a checkpoint note is not authentic; a tampered log must never verify OK. After
    ``AuditLog.open`` accepts a directory, appending and closing must leave a log that still
    verifies if it did before, and that still fails if it was tampered (the writer never launders
    tampering nor breaks an intact log, e.g. from a malformed ``state.json``).
    """

    name = "audit_log"
    share = 0.06
    max_len = 32768

    def seeds(self) -> list[bytes]:
        fx = self.ctx.audit
        out = []
        for snap, d in enumerate((fx.closed, fx.crashed)):
            files = fx.original[d]
            for sel, fname in enumerate(_LOG_FILES[:4]):
                out.append(_LOG_MAGIC + bytes([snap, sel]) + files[fname])
        out.append(_LOG_MAGIC + bytes([0, 4]) + fx.kept)
        return out

    def dictionary(self) -> list[bytes]:
        return [b'"frontier"', b'"size"', b'"log_bytes"', b'"checkpoint_size"', EM_DASH, b"\n\n", b"\x00" * 8]

    def mutate(self, ch: Chooser) -> bytes:
        fx = self.ctx.audit
        snap = ch.int(0, 1)
        d = (fx.closed, fx.crashed)[snap]
        files = fx.original[d]
        sel = ch.pick((0, 0, 0, 1, 2, 2, 3, 4, 5))
        if sel == 5:
            return (
                _LOG_MAGIC
                + bytes([snap, 5])
                + ch.pick(("checkpoint", "state.json", "checkpoints/20.note", "records.log")).encode()
            )
        if sel == 0:
            content = self._mutate_frames(ch, files["records.log"])
        elif sel == 2:
            state = json.loads(files["state.json"])
            if ch.chance(0.6):
                tree, _ = mutate_json(ch, state, focus=lambda p: bool(p) and p[0] == "frontier")
            else:
                tree, _ = mutate_json(ch, state)
            content = encode(dumps(tree))
        else:
            note = fx.kept if sel == 4 else files[_LOG_FILES[sel]]
            content = _mutate_note(ch, note, self.ctx)
        return _LOG_MAGIC + bytes([snap, sel]) + content

    def _mutate_frames(self, ch: Chooser, log: bytes) -> bytes:
        frames = AuditFixture._frames(log)
        k = ch.int(0, 8)
        i = ch.int(0, len(frames) - 1)
        if k in (4, 5):  # a record's content is edited: pick a record frame, not a seal
            i = ch.pick([n for n, f in enumerate(frames) if not _is_seal(f)])
        if k == 0:  # byte-level damage anywhere
            data = log
            for _ in range(ch.int(1, 3)):
                data, _ = mutate_bytes(ch, data)
            return data
        if k == 1:
            del frames[i]
        elif k == 2:
            j = ch.int(0, len(frames) - 1)
            frames[i], frames[j] = frames[j], frames[i]
        elif k == 3:
            frames.insert(i, frames[i])
        elif k == 4:  # a record edited and its frame re-hashed (the frame itself checks out)
            rec = json.loads(frames[i][44:])
            tree, _ = mutate_json(ch, rec, rounds=1)
            frames[i] = _frame(struct.unpack(">Q", frames[i][:8])[0], encode(dumps(tree)))
        elif (
            k == 5
        ):  # a record edited, re-signed with the real key, frame re-hashed: only checkpoints catch it
            from semgov.signing.records import sign_record

            rec = json.loads(frames[i][44:])
            field = "tenant" if "tenant" in rec else "detail"
            rec[field] = ch.pick(("globex", "acme", str(rec[field]) + "x"))
            try:
                signed = sign_record(rec, self.ctx.decision_key)
                frames[i] = _frame(struct.unpack(">Q", frames[i][:8])[0], canonical(signed) or b"{}")
            except Exception:  # noqa: BLE001
                pass
        elif k == 6:  # record frames re-numbered after a deletion (index and hash rewritten; seals kept)
            del frames[i]
            renumbered, n = [], 0
            for f in frames:
                renumbered.append(f if _is_seal(f) else _frame(n, f[44:]))
                n += not _is_seal(f)
            frames = renumbered
        elif k == 7:  # truncated inside or at a frame
            data = b"".join(frames)
            return data[: ch.int(0, len(data))]
        else:  # garbage or a copied frame appended
            tail = ch.pick(
                (b"\x00" * ch.int(1, 100), frames[i], _frame(len(frames), frames[i][44:]), b"\xff" * 44)
            )
            frames.append(tail)
        return b"".join(frames)

    def run(self, data: bytes) -> Verdict:
        from semgov.audit.errors import AuditLogError
        from semgov.audit.store import AuditLog
        from semgov.audit.verify_dir import verify_log

        v = Verdict()
        fx = self.ctx.audit
        if data.startswith(_LOG_MAGIC) and len(data) >= 7:
            snap, sel, content = data[5] % 2, data[6] % len(_LOG_FILES), data[7:]
        else:
            snap, sel, content = 0, 0, data
        src = (fx.closed, fx.crashed)[snap]
        d = self.ctx.work / self.name / "log"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("LOCK"))
        kept = fx.kept
        fname = _LOG_FILES[sel]
        if fname == "KEPT":
            kept = content
        elif fname == "DELETE":
            name = content.decode("utf-8", "replace").replace("\x00", "").strip("/\\.")
            target = d / name
            if name and target.resolve().is_relative_to(d.resolve()) and target.is_file():
                target.unlink()
        else:
            (d / fname).write_bytes(content)
        tampered, acked_changed = self._tampered(d, src, kept)
        rep = call(
            verify_log,
            d,
            public_key=self.ctx.public_key,
            kept_checkpoint=kept,
            workers=1,
            allowed=(AuditLogError,),
        )
        if isinstance(rep, AuditLogError):
            v.reasons.append("verify: " + norm(str(rep)))
            self._located(rep, d, v)
            before_ok = False
        else:
            before_ok = rep.ok
            if rep.ok:
                v.accepted = True
                if tampered:
                    v.allows.append(f"tampered log verified OK ({tampered})")
            else:
                first = rep.first()
                v.reasons.append("verify: " + norm(str(first)))
                if not str(first).strip():
                    v.crashes.append("verify problem without a message")
        # The writer: open (recovering), append one record, close; then verify again.
        log = call(
            AuditLog.open, d, signing_key=self.ctx.decision_key, origin=fx.ORIGIN, checkpoint_every=10,
            checkpoint_interval=3600.0, allowed=(AuditLogError,),
        )  # fmt: skip
        if isinstance(log, AuditLogError):
            v.reasons.append("open: " + norm(str(log)))
            self._located(log, d, v)
            return v
        try:
            call(log.append, fx.extra)
        finally:
            call(log.close, allowed=(AuditLogError,))
        after = call(
            verify_log,
            d,
            public_key=self.ctx.public_key,
            kept_checkpoint=fx.kept,
            workers=1,
            allowed=(AuditLogError,),
        )
        after_ok = not isinstance(after, AuditLogError) and after.ok
        if before_ok and not tampered and not after_ok:
            v.allows.append(f"writer broke an intact log after accepting a malformed {fname}")
        if acked_changed and after_ok:
            v.allows.append(f"writer laundered a tampered log ({tampered})")
        return v

    @staticmethod
    def _located(e: Exception, d: Path, v: Verdict) -> None:
        src = getattr(e, "source", None)
        if not src or str(d) not in src:
            v.crashes.append(f"audit error does not name the log: {norm(str(e))}")

    def _tampered(self, d: Path, src: Path, kept: bytes) -> tuple[str, bool]:
        """By hand: why ``verify`` must not pass ('' when it may), and whether an acknowledged
        record (one of the snapshot's frames) was changed in place into something not genuine.

        Bytes or frames after the acknowledged ones, and records past the last checkpoint replaced
        by genuine records, are what a crash or the key's holder can leave: the writer may cut a
        torn tail, and nothing can tell a genuine record from another.
        """
        fx = self.ctx.audit
        notes = [kept]
        for p in [d / "checkpoint", *sorted((d / "checkpoints").glob("*.note"))]:
            if p.is_file():
                notes.append(p.read_bytes())
        floor = 0
        for n in notes:
            if not note_authentic(n, fx.notes, fx.key_name):
                return "a checkpoint note is not authentic", False
            floor = max(floor, int(n.split(b"\n")[1]))
        path = d / "records.log"
        log = path.read_bytes() if path.is_file() else b""
        all_frames = AuditFixture._frames(log)
        frames, seals = _records_and_seals(all_frames)
        orig, orig_seals = _records_and_seals(AuditFixture._frames(fx.original[src]["records.log"]))
        pairs = list(zip(frames, orig, strict=False))  # the acknowledged record frames still there
        acked_changed = any(f != o and not self._genuine(i, f) for i, (f, o) in enumerate(pairs))
        for f, o in pairs:
            if f != o and f[8:] == o[8:]:
                return "a frame's index field altered (record bytes intact)", acked_changed
        if frames[:floor] != orig[:floor] or len(frames) < floor:
            return "a checkpointed record changed or is missing", acked_changed
        if b"".join(all_frames) != log:
            return "bytes after the last whole frame", acked_changed
        for i, f in enumerate(frames):
            if (i >= len(orig) or f != orig[i]) and not self._genuine(i, f):
                return "a frame past the checkpoints is not a genuine record", acked_changed
        # NOTE: a seal is the writer's signed tree head after a batch. Removing one loses nothing
        # (later seals and checkpoints sign the whole prefix; removing the last leaves its records
        # unanchored, which verify reports); a seal that is not one of the log's own, stands
        # elsewhere, or repeats, is tampering.
        if not set(seals) <= set(orig_seals) or len({n for n, _ in seals}) != len(seals):
            return "a seal frame that is not the log's own where it stood, or repeated", acked_changed
        return "", acked_changed

    def _genuine(self, i: int, f: bytes) -> bool:
        """Frame ``i`` checks (index, hash) and holds a canonical record signed by the decision key."""
        idx, rec = struct.unpack(">Q", f[:8])[0], f[44:]
        if idx != i or hashlib.sha256(f[:8] + rec).digest() != f[12:44]:
            return False
        r = read_json(rec)
        if r.problems or not isinstance(r.value, dict):
            return False
        sig = b64_signature(r.value.get("signature"))[0]
        body = canonical({k: x for k, x in r.value.items() if k != "signature"})
        return (
            sig is not None
            and body is not None
            and canonical(r.value) == rec
            and ed25519_ok(self.ctx.public_key.public_bytes_raw(), sig, body)
        )


def _is_seal(frame: bytes) -> bool:
    """A seal frame: the top bit of its index field is set (docs/formats.md)."""
    return bool(frame[0] & 0x80)


def _records_and_seals(frames: list[bytes]) -> tuple[list[bytes], list[tuple[int, bytes]]]:
    """Record frames in order, and each seal frame with the number of record frames before it."""
    records: list[bytes] = []
    seals: list[tuple[int, bytes]] = []
    for f in frames:
        if _is_seal(f):
            seals.append((len(records), f))
        else:
            records.append(f)
    return records, seals


def _frame(index: int, rec: bytes) -> bytes:
    ib = struct.pack(">Q", index)
    return ib + struct.pack(">I", len(rec)) + hashlib.sha256(ib + rec).digest() + rec


def _mutate_note(ch: Chooser, note: bytes, ctx: Ctx) -> bytes:
    text = note.decode("utf-8")
    lines = text.split("\n")
    k = ch.int(0, 11)
    if k == 0:  # size
        lines[1] = ch.pick(
            ("0", "020", "+20", "20 ", "\u0662\u0660", "18446744073709551616", "-1", "999", "2" + lines[1])
        )
    elif k == 1:  # root
        r = lines[2]
        lines[2] = ch.pick(
            (r[:-2] + ("AA" if r[-2:] != "AA" else "BB"), _noncanonical_b64(r), r + "=", r[:-1], "")
        )
    elif k == 2:  # origin
        lines[0] = ch.pick(("", lines[0] + " ", lines[0].upper(), "semgov/other", lines[0] + "\u200b"))
    elif k == 3:  # signature line
        i = len(lines) - 2
        s = lines[i]
        lines[i] = ch.pick((s[:-3] + ("A" if s[-3] != "A" else "B") + s[-2:], s.replace("\u2014", "\u2013"),
                            s.replace(" ", "  ", 1), _noncanonical_b64_line(s), s + "=", ""))  # fmt: skip
    elif k == 4:  # a foreign signature added (verifiers ignore it) or ours duplicated
        sig_line = "\u2014 other " + base64.b64encode(b"\x01\x02\x03\x04" + b"\x05" * 64).decode()
        lines.insert(len(lines) - 1, ch.pick((sig_line, lines[-2])))
    elif k == 5:  # an extension line in the signed text (changes the text)
        lines.insert(3, ch.pick(("extension", "", " ", "\u2014 x")))
    elif k == 6:
        return text.replace("\n", "\r\n").encode()
    elif k == 7:  # another key's genuine-looking signature under our name
        from semgov.audit.note import sign_checkpoint

        try:
            from semgov.audit.note import Checkpoint

            split = note.rfind(b"\n\n")
            cp = Checkpoint.from_body(note[: split + 1])
            from semgov.audit.keyring import key_name_for

            return sign_checkpoint(cp, key_name_for(ctx.key_id), ctx.signers["k9"].private_key)
        except Exception:  # noqa: BLE001
            return note[:-1]
    elif k == 8:
        return text.encode() + ch.pick((b"\n", b"\x00", b"\n\n", b"extra"))
    elif k == 9:
        lines = [ln for ln in lines if ln.strip()] if ch.chance(0.5) else lines * 2
    else:
        data = note
        for _ in range(ch.int(1, 3)):
            data, _ = mutate_bytes(ch, data)
        return data
    return "\n".join(lines).encode("utf-8", "surrogatepass")


def _noncanonical_b64_line(line: str) -> str:
    head, _, b64 = line.rpartition(" ")
    return f"{head} {_noncanonical_b64(b64)}"


class CheckpointTarget(Target):
    """Signed checkpoint notes through ``open_checkpoint`` (what verify and the writer use).

    Oracle: a note verifies only if its text is one of the real notes' texts and it keeps that
    note's own signature line (foreign signature lines may be added: the spec ignores them).
    """

    name = "checkpoint"
    share = 0.07

    def seeds(self) -> list[bytes]:
        return list(self.ctx.audit.notes)

    def dictionary(self) -> list[bytes]:
        return [EM_DASH, b"\n\n", self.ctx.key_id.encode(), AuditFixture.ORIGIN.encode(), b"="]

    def mutate(self, ch: Chooser) -> bytes:
        return _mutate_note(ch, ch.pick(self.seed_list), self.ctx)

    def run(self, data: bytes) -> Verdict:
        from semgov.audit.keyring import key_name_for
        from semgov.audit.note import NoteError, open_checkpoint

        v = Verdict()
        fx = self.ctx.audit
        cp = call(
            open_checkpoint, data, key_name_for(self.ctx.key_id), self.ctx.public_key, allowed=(NoteError,)
        )
        if isinstance(cp, NoteError):
            v.reasons.append(norm(str(cp)))
            if not str(cp).strip():
                v.crashes.append("NoteError without a message")
            return v
        v.accepted = True
        if not note_authentic(data, fx.notes, fx.key_name):
            v.allows.append("a forged or altered checkpoint verified")
        return v


_BUNDLE_KEYS = {"schema", "record", "index", "tree_size", "inclusion_proof", "checkpoint"}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class BundleTarget(Target):
    """Offline proof bundles through ``semgov audit verify-proof`` (``read_bundle``, ``verify_bundle``).

    Oracle: a bundle is tampered when what it proves (record bytes, index, tree size, proof
    hashes) differs from every real bundle, or its checkpoint is not authentic; a tampered bundle
    must never verify. Same content written differently (extra keys, ``1.0`` for ``1``, upper-case
    hex, duplicate keys whose last value is the real one) is a lax accept.
    """

    name = "bundle"
    share = 0.07

    def seeds(self) -> list[bytes]:
        return self.ctx.audit.bundles

    def dictionary(self) -> list[bytes]:
        return _json_dict_tokens(self.seed_list)

    @cached_property
    def _real(self) -> list[tuple[bytes, int, int, list[bytes]]]:
        out = []
        for b in self.seed_list:
            d = json.loads(b)
            out.append(
                (
                    d["record"].encode(),
                    d["index"],
                    d["tree_size"],
                    [bytes.fromhex(h) for h in d["inclusion_proof"]],
                )
            )
        return out

    def mutate(self, ch: Chooser) -> bytes:
        seed = json.loads(ch.pick(self.seed_list))
        k = ch.int(0, 9)
        if k <= 4:
            tree, _ = mutate_json(ch, seed)
            return encode(dumps(tree, compact=ch.chance(0.5)))
        if k == 5:
            seed["checkpoint"] = _mutate_note(ch, seed["checkpoint"].encode(), self.ctx).decode(
                "utf-8", "replace"
            )
        elif k == 6:  # another bundle's proof or record
            other = json.loads(ch.pick(self.seed_list))
            f = ch.pick(("record", "index", "inclusion_proof", "tree_size"))
            seed[f] = other[f]
        elif k == 7:  # same content, other spelling
            f = ch.pick(("index", "tree_size", "inclusion_proof"))
            if f == "inclusion_proof":
                seed[f] = [h.upper() for h in seed[f]]
            else:
                seed[f] = ch.pick((float(seed[f]), str(seed[f]), Raw(f"{seed[f]}.0"), Raw(f"{seed[f]}e0")))
        elif k == 8:  # the record, re-encoded (same JSON, other bytes) or edited
            rec = json.loads(seed["record"])
            seed["record"] = ch.pick((json.dumps(rec), json.dumps(rec, separators=(",", ":")) + " ",
                                      seed["record"].replace("deny", "allow")))  # fmt: skip
        else:
            data = json.dumps(seed).encode()
            for _ in range(ch.int(1, 3)):
                data, _ = mutate_bytes(ch, data)
            return data
        return encode(dumps(seed, compact=False))

    def run(self, data: bytes) -> Verdict:
        from semgov.audit.merkle import ProofError
        from semgov.audit.verify import read_bundle, verify_bundle

        v = Verdict()
        # `semgov audit verify-proof`: the file's bytes through read_bundle (strict JSON); a
        # ValueError there is the CLI's "cannot read proof bundle".
        bundle = call(
            read_bundle, data, allowed=(ValueError,), label="cli/audit.py run_verify_proof: read_bundle"
        )
        if isinstance(bundle, ValueError):
            v.reasons.append("cannot read proof bundle: " + norm(str(bundle)))
            return v
        rec = call(verify_bundle, bundle, self.ctx.public_key, allowed=(ProofError,))
        if isinstance(rec, ProofError):
            v.reasons.append(norm(str(rec)))
            if not str(rec).strip():
                v.crashes.append("ProofError without a message")
            return v
        v.accepted = True
        why, lax = self._judge(data)
        if why:
            v.allows.append(f"verified a malformed or tampered bundle: {why}")
        v.lax += lax
        return v

    def _judge(self, data: bytes) -> tuple[str, list[str]]:
        rd = read_json(data)
        b = rd.value
        lax: list[str] = list(rd.lax)
        if rd.problems:  # duplicate keys (ambiguous), NaN, lone surrogates: not JSON a reader can trust
            return _kind(rd.problems[0]), lax
        if not isinstance(b, dict):
            return "not an object", lax
        if set(b) != _BUNDLE_KEYS:
            lax.append("other members")
        try:
            rec = b["record"].encode("utf-8") if isinstance(b["record"], str) else None
            idx, size = b["index"], b["tree_size"]
            proof = b["inclusion_proof"]
        except KeyError:
            return "members missing", lax
        for name, x in (("index", idx), ("tree_size", size)):
            if type(x) is not int:
                lax.append(f"{name} is not a JSON integer")
        if not isinstance(proof, list) or not all(isinstance(h, str) and _HEX64.match(h) for h in proof):
            lax.append("proof hashes are not lower-case hex")
        try:
            hashes = [bytes.fromhex(h) for h in proof]
        except (TypeError, ValueError):
            return "proof unreadable", lax
        content_ok = any(
            rec == r and _same_int(idx, i) and _same_int(size, s) and hashes == p for r, i, s, p in self._real
        )
        if not content_ok:
            return "record, index, size or proof differ from every real bundle", lax
        cp = b.get("checkpoint")
        fx = self.ctx.audit
        if not isinstance(cp, str) or not note_authentic(
            cp.encode("utf-8", "surrogatepass"), fx.notes, fx.key_name
        ):
            return "checkpoint not authentic", lax
        return "", lax


def _same_int(x: Any, want: int) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int | float):
        return x == want
    if isinstance(x, str):
        return x.strip() == str(want)
    return False


# ---- gateway context tokens (the SGLang hook's extra_key) ----------------------------------------------

CONTEXT_KEY = b"semgov-hostile-campaign-context-key-01"
CONTEXT_WRONG_KEY = b"semgov-hostile-campaign-context-key-02"
CONTEXT_LORA = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # what SGLang's lora_id looks like (uuid hex)
CONTEXT_AUDIENCE = "hostile-campaign"
CONTEXT_NOW = 1_800_000_000  # the verifier's clock (Unix seconds): tokens expire relative to it
CONTEXT_LIFETIME_S = 3600
_SEP = b"\x1f"
_B64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_CONTEXT_CHARS = ("\udcff", "\ud800", "\udfff", "\ud83d", "\u00e9", "\u202e", "\x00", "\U0001f600", "\ufeff",
                  " ", "\n", "\u0430", ".", "=", "+", "/", "\x1f")  # fmt: skip


class HostileStr(str):
    """A str subclass whose methods all raise: the parser must read it as plain text."""

    def __len__(self) -> int:
        raise RuntimeError("HostileStr.__len__ called")

    def __getitem__(self, i: Any) -> str:
        raise RuntimeError("HostileStr.__getitem__ called")

    def startswith(self, *a: Any) -> bool:  # type: ignore[override]
        raise RuntimeError("HostileStr.startswith called")

    def endswith(self, *a: Any) -> bool:  # type: ignore[override]
        raise RuntimeError("HostileStr.endswith called")

    def encode(self, *a: Any, **k: Any) -> bytes:  # type: ignore[override]
        raise RuntimeError("HostileStr.encode called")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("HostileStr.__eq__ called")

    def __str__(self) -> str:
        raise RuntimeError("HostileStr.__str__ called")

    __hash__ = str.__hash__


class FakeStr:
    """Not a str, but claims to be one (``__class__``), and its repr raises."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: N802
        return str

    def __repr__(self) -> str:
        raise RuntimeError("FakeStr.__repr__ called")


def _odd_object(spec: Any) -> Any:
    name, arg = (spec[0], spec[1]) if isinstance(spec, list) and len(spec) == 2 else ("object", "")
    arg = arg if isinstance(arg, str) else ""
    if name == "hostile_str":
        return HostileStr(arg)
    if name == "fake_str":
        return FakeStr()
    if name == "bytearray":
        return bytearray(encode(arg))
    if name == "deep":
        deep: list[Any] = []
        for _ in range(50_000):
            deep = [deep]
        return deep
    return object()


def ctx_decode(data: bytes) -> tuple[Any, Any, Any]:
    """``(extra_key, lora_id, cache_salt)`` of an input ``extra_key \\x1f lora_id \\x1f cache_salt``.

    Total over bytes. A field is text (UTF-8, lone surrogates in their 3-byte forms; undecodable
    bytes become lone surrogates by ``surrogateescape``) unless its first byte is a tag: ``\\x00``
    None, ``\\x02`` + hex bytes, ``\\x03`` + a JSON value (numbers, lists, escaped surrogates),
    ``\\x04`` + JSON ``[name, text]`` an odd object (a :class:`HostileStr`, a :class:`FakeStr`, a
    bytearray, deep nesting, ``object()``). A missing LoRA id or salt field is None.
    """
    parts = data.split(_SEP, 2)
    out: list[Any] = []
    for f in parts:
        tag, rest = f[:1], f[1:]
        if tag == b"\x00":
            out.append(None)
        elif tag == b"\x02":
            try:
                out.append(bytes.fromhex(rest.decode("ascii")))
            except ValueError:
                out.append(bytes(rest))
        elif tag in (b"\x03", b"\x04"):
            try:
                v = json.loads(rest.decode("utf-8", "surrogatepass"))
            except (ValueError, RecursionError):
                v = _text(rest)
            out.append(_odd_object(v) if tag == b"\x04" else v)
        else:
            out.append(_text(f))
    while len(out) < 3:
        out.append(None)
    return out[0], out[1], out[2]


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape")


def ctx_encode(extra_key: Any, lora_id: Any, cache_salt: Any) -> bytes:
    """The input that :func:`ctx_decode` reads back as these three values."""

    def field(v: Any) -> bytes:
        if v is None:
            return b"\x00"
        if isinstance(v, HostileStr):
            return b"\x04" + json.dumps(["hostile_str", "".join((v,))]).encode()
        if isinstance(v, FakeStr):
            return b'\x04["fake_str", ""]'
        if type(v) is bytearray:
            return b"\x04" + json.dumps(["bytearray", v.decode("utf-8", "surrogateescape")]).encode()
        if type(v) is str:
            if (v and v[0] in "\x00\x02\x03\x04") or "\x1f" in v:
                return b"\x03" + json.dumps(v).encode()
            return encode(v)
        if type(v) is bytes:
            return b"\x02" + v.hex().encode()
        try:
            return b"\x03" + json.dumps(v).encode()
        except (TypeError, ValueError, RecursionError):
            return b'\x04["object", ""]'

    return field(extra_key) + _SEP + field(lora_id) + _SEP + field(cache_salt)


def _b64u(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _context_mac(payload: str, key: bytes = CONTEXT_KEY) -> str:
    import hmac

    return _b64u(hmac.new(key, ("semgov1." + payload).encode("ascii", "replace"), hashlib.sha256).digest())


def _context_token(raw: bytes, key: bytes = CONTEXT_KEY) -> str:
    """A token over any payload bytes, MACed with ``key`` (what a buggy or hostile gateway could send)."""
    payload = _b64u(raw)
    return "semgov1." + payload + "." + _context_mac(payload, key)


def _key_shape(k: Any, prefix: str) -> bool:
    return (
        type(k) is str
        and k.startswith(prefix)
        and re.fullmatch(r"[0-9a-f]{32}", k[len(prefix) :]) is not None
    )


class ContextTarget(Target):
    """Gateway context tokens through ``parse_context_token`` (the SGLang hook's ``extra_key``), then
    ``scope`` / ``cache_key`` of an accepted context and ``anonymous_cache_key`` of every input.

    An input is ``extra_key \\x1f lora_id \\x1f cache_salt`` (:func:`ctx_decode`: text, or a tagged
    None, bytes, JSON value or odd object), so that any value the hook could be handed comes from
    bytes. The documented failure is ``ContextError`` (with a message) and nothing else; the key
    helpers never raise and return ``semgov:`` / ``semgov:anon:`` + 32 hex, scope and tree key
    apart, another cache salt giving another tree key. Oracle (``judge_context``): the MAC
    recomputed with ``hmac``, canonical base64url, strict JSON that is exactly its RFC 8785 form,
    the documented members checked by hand, the text after the MAC equal to the LoRA id. An accept
    of anything else, or a context other than the oracle's reading, is an allow; a refusal of a
    token the oracle finds valid counts as a crash (a wrong answer is not a documented error).
    """

    name = "context"
    share = 0.04
    max_len = 40000

    def seeds(self) -> list[bytes]:
        from semgov.context import key_id, make_context_token

        task, contract = {"id": "qa", "version": "1"}, {"id": "answer-json", "schema_sha256": "a" * 64}

        def tok(**over: Any) -> str:
            args: dict[str, Any] = {"tenant": "acme", "namespace": "ns1", "task": task,
                                    "response_contract": contract, "audience": CONTEXT_AUDIENCE,
                                    "expires_at": CONTEXT_NOW + 300}  # fmt: skip
            args.update(over)
            return make_context_token(CONTEXT_KEY, **args)

        a = tok(segments=[("system", 0, 10), ("evidence", 10, 30)])
        b = tok(namespace="acme/q3-report")
        c = tok(tenant="globex", namespace="research:common",
                segments=[("system", 0, 256), ("evidence", 256, 3256), ("question", 3256, 3288)])  # fmt: skip
        d = tok(tenant="t" * 128, namespace="!~" * 64, task={"id": "x" * 512, "version": "\u00e9\x00"},
                segments=[("other", 0, 1)])  # fmt: skip

        # The largest valid token: one-token segments up to the length limit (measured by hand, since
        # make_context_token refuses a longer one).
        def length(n: int) -> int:
            doc = {"namespace": "ns1", "response_contract": contract, "task": task, "tenant": "acme",
                   "segments": [["other", i, i + 1] for i in range(n)], "aud": CONTEXT_AUDIENCE,
                   "exp": CONTEXT_NOW + 300, "kid": key_id(CONTEXT_KEY)}  # fmt: skip
            return len(_context_token(canonical(doc) or b""))

        lo, hi = 1, 4096
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if length(mid) <= 16384 else (lo, mid)
        big = tok(segments=[("other", i, i + 1) for i in range(lo)])
        return [
            ctx_encode(a, None, None),
            ctx_encode(a + CONTEXT_LORA, CONTEXT_LORA, None),
            ctx_encode(b, None, "salt-1"),
            ctx_encode(b + "adapter-v2", "adapter-v2", ""),
            ctx_encode(c, None, None),
            ctx_encode(c + CONTEXT_LORA, CONTEXT_LORA, "tenant-salt"),
            ctx_encode(d, None, None),
            ctx_encode(a, "", None),
            ctx_encode(big, None, None),
        ]

    def dictionary(self) -> list[bytes]:
        return [b"semgov1.", b".", _SEP, b"\x00", b"\x02", b"\x03", b"\x04", b"\xed\xa0\x80",
                b"\xed\xbf\xbf", b"\xc3\xa9", b"\xff", b"=", b"-", b"_", b"+", b"/", CONTEXT_LORA.encode(),
                b'["hostile_str", "', b'["fake_str", ""]', b"eyJ", b"fQ", b"A" * 43]  # fmt: skip

    def mutate(self, ch: Chooser) -> bytes:  # noqa: C901 - one mutation family per branch
        extra, lora, salt = ctx_decode(ch.pick(self.seed_list))
        suffix = lora or ""
        token = extra[: len(extra) - len(suffix)] if suffix else extra
        _, payload, mac = token.split(".")
        doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        k = ch.int(0, 18)
        if k == 18:  # the claims: expired, too long-lived, another audience or key, ill-typed
            claim = ch.pick(("exp", "aud", "kid"))
            doc[claim] = ch.pick({
                "exp": (CONTEXT_NOW, CONTEXT_NOW - 1, CONTEXT_NOW + 1, CONTEXT_NOW + CONTEXT_LIFETIME_S,
                        CONTEXT_NOW + CONTEXT_LIFETIME_S + 1, 0, -1, 2**53, 1.5, str(CONTEXT_NOW + 60), True),
                "aud": ("", "hostile-campaign ", "Hostile-campaign", "other", 7, None, ["hostile-campaign"]),
                "kid": ("", "A" * 16, str(doc.get("kid", ""))[:-1], 0, None),
            }[claim])  # fmt: skip
            if ch.chance(0.2):
                del doc[claim]
            raw = canonical(doc)
            return ctx_encode(
                _context_token(raw if raw is not None else json.dumps(doc).encode()) + suffix, lora, salt
            )
        if k <= 1:  # the campaign's generic text surgery, on extra_key as sent
            extra, _ = mutate_text(
                ch, extra, _CONTEXT_CHARS, ("semgov1.", ".", "=", "-", "_", CONTEXT_LORA, mac)
            )
        elif k == 2:
            data = ctx_encode(extra, lora, salt)
            for _ in range(ch.int(1, 4)):
                data, _ = mutate_bytes(ch, data)
            return data
        elif k <= 5:  # the payload mutated structurally, then MACed with the right key (mostly)
            tree, _ = mutate_json(ch, doc)
            text = dumps(tree, ascii_only=ch.chance(0.3), compact=ch.chance(0.8))
            raw = encode(text)
            if ch.chance(0.4):  # well-formed: the canonical form of what a reader makes of it
                try:
                    raw = canonical(json.loads(text)) or raw
                except (ValueError, RecursionError):
                    pass
            key = CONTEXT_KEY if ch.chance(0.9) else CONTEXT_WRONG_KEY
            extra = _context_token(raw, key) + suffix
        elif k <= 8:  # adversarial but well-formed edits, MACed with the right key
            extra = self._adversarial(ch, doc) + suffix
        elif k == 9:  # MAC surgery
            extra = self._bad_mac(ch, token, payload, mac) + suffix
        elif k == 10:  # non-ASCII characters and lone surrogates anywhere
            c = ch.pick(_CONTEXT_CHARS) if ch.chance(0.7) else ch.hostile_text()[:8]
            where = ch.int(0, 3)
            if where == 0:
                i = ch.int(0, len(extra))
                extra = extra[:i] + c + extra[i:]
            elif where == 1:  # in the adapter id, consistently: still a valid token
                lora = (lora or "") + c
                extra = token + lora
            elif where == 2:  # in the adapter id only
                lora = (lora or "") + c
            else:
                extra = extra + c
        elif k == 11:  # the suffix against the request's adapter
            extra, lora = ch.pick((
                (token + CONTEXT_LORA, None), (token, CONTEXT_LORA), (token + "X", None),
                (token + CONTEXT_LORA, "other-adapter"), (token + CONTEXT_LORA * 2, CONTEXT_LORA),
                (token, token[-3:]), (token, ""), (token + "x", ""), (token + token, token),
                (CONTEXT_LORA + token, CONTEXT_LORA), (token + "L" * 257, "L" * 257),
                (token + "L" * 256, "L" * 256), (token + "." + mac, "." + mac), (token, mac),
                (token + "\udcff", "\udcff"), (token + "\udcff", None),
            ))  # fmt: skip
        elif k == 12:  # values that are not str
            odd = ch.pick((None, 7, 1.5, True, token.encode(), bytearray(token.encode()), [token],
                           {"t": token}, FakeStr(), object(), HostileStr(token)))  # fmt: skip
            which = ch.int(0, 2)
            if which == 0:
                extra = odd
            elif which == 1:
                lora = odd
            else:
                salt = odd
        elif k == 13:  # the token's structure
            extra = ch.pick((
                "SEMGOV1." + token[8:], "semgov2." + token[8:], " " + token, token + "\n", token + token,
                "semgov1." + payload, "semgov1." + payload + ".", "semgov1.." + mac,
                token.replace(".", "..", 1),
                "semgov1." + payload + "." + mac + "." + mac, "semgov1.", "semgov1", "",
                self._repad(payload), self._noncanonical_payload(payload),
                _context_token(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)) + b"\n"),
                "semgov1." + payload.replace("-", "+").replace("_", "/") + "." + mac,
            )) + suffix  # fmt: skip
        elif k == 14:  # sizes
            extra, lora = ch.pick((
                (token + "x" * 16384, None), ("semgov1." + "A" * 100_000, None),
                (token + suffix, "L" * 10**5),
                (token + "\udcff" * 20000, None), ("\udcff" * 20000, None),
                (_context_token(json.dumps({**doc, "tenant": "x" * 12000}).encode()), None),
            ))  # fmt: skip
        elif k == 15:  # the cache salt
            salt = ch.pick(("", None, "\udcff", "s\x00", "x" * 100_000, ch.hostile_text(), 0, [], b"salt"))
        elif k == 16:  # str subclasses whose methods raise
            extra = HostileStr(extra)
            if lora is not None and ch.chance(0.5):
                lora = HostileStr(lora)
            if ch.chance(0.5):
                salt = HostileStr(salt or "s")
        else:  # another seed's MAC or payload
            other, _, _ = ctx_decode(ch.pick(self.seed_list))
            o = other.split(".")
            extra = ch.pick(("semgov1." + payload + "." + o[2][:43], "semgov1." + o[1] + "." + mac)) + suffix
        return ctx_encode(extra, lora, salt)

    def _adversarial(self, ch: Chooser, doc: dict[str, Any]) -> str:
        d = copy.deepcopy(doc)
        k = ch.int(0, 9)
        if k == 0:
            d[ch.pick(("admin", "lora_id", "cache_salt", "Tenant", "tenant ", ""))] = ch.pick(
                (True, "x", None)
            )
        elif k == 1:
            d[ch.pick(("tenant", "namespace"))] = ch.pick((
                "acme\x00ns1", "acme.ns1", "acme:ns1", "acme/ns1", "acme ns1", "acme\u200b", "ACME",
                "\u0430cme",
                "a" * 129, "a" * 128, "", 5, None, ["acme"], "acme\n", "\x7f", "~!",
            ))  # fmt: skip
        elif k == 2:
            d["task"] = ch.pick((
                {"id": "qa"}, {"id": "qa", "version": "1", "x": 1}, {"id": "", "version": "1"},
                {"id": "x" * 513, "version": "1"}, {"id": "x" * 512, "version": "1"},
                {"id": "q\x00a", "version": "1"},
                {"id": 1, "version": "1"}, "qa@1", None, {"id": "\U0001f600", "version": "\u00e9"},
            ))  # fmt: skip
        elif k == 3:
            d["response_contract"] = {"id": "c", "schema_sha256": ch.pick((
                "A" * 64, "a" * 63, "a" * 65, "a" * 64 + "\n", "g" * 64, "a" * 64 + " ", "\u0430" * 64, 64,
            ))}  # fmt: skip
        elif k == 4:
            d["segments"] = ch.pick((
                None, [], [["system", 0, 10], ["evidence", 11, 30]], [["system", 0, 10], ["evidence", 9, 30]],
                [["system", 0, 0]], [["boss", 0, 1]], [["system", -1, 1]], [["system", 0, 1.5]],
                [["system", 0, True]], [["system", "0", "1"]], [["system", 0, 1, 2]], [["system", 1, 2]],
                [{"role": "system", "start": 0, "end": 1}], [["system", 0, 2**53 - 1]],
                [["system", 0, 2**53 + 1]],
                [["System", 0, 1]], [[None, 0, 1]], [["system", 0, 10], ["system", 10, 5]], "system",
            ))  # fmt: skip
        elif k == 5:  # huge values (mostly over the token length limit)
            d[ch.pick(("tenant", "namespace"))] = "x" * ch.pick((129, 12000))
            if ch.chance(0.5):
                d["segments"] = [["other", i, i + 1] for i in range(ch.pick((100, 3000)))]
        elif k == 6:  # non-canonical JSON of a valid context
            text = ch.pick((
                json.dumps(d), json.dumps(d, sort_keys=True), json.dumps(d, sort_keys=True, indent=1),
                json.dumps(d, separators=(",", ":")),
                json.dumps(d, sort_keys=True, separators=(",", ":")).replace('"acme"', '"\\u0061cme"'),
                json.dumps(d, sort_keys=True, separators=(",", ":")).replace(",0,", ",0.0,"),
                json.dumps(d, sort_keys=True, separators=(",", ":")).replace(",10]", ",1e1]"),
                json.dumps(d, sort_keys=True, separators=(",", ":")) + " ",
                "\ufeff" + json.dumps(d, sort_keys=True, separators=(",", ":")),
                json.dumps(d, sort_keys=True, separators=(",", ":"))[:-1] + ',"tenant":"globex"}',
            ))  # fmt: skip
            return _context_token(encode(text))
        elif k == 7:  # another valid context
            d.update(
                tenant=ch.pick(("globex", "t", "a" * 128)), namespace=ch.pick(("ns2", "x/y/z", "*", ".."))
            )
        elif k == 8:  # the payload in another encoding
            text = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            return _context_token(
                text.encode(ch.pick(("utf-16", "utf-16-le", "utf-32", "latin-1")), "replace")
            )
        else:
            d.pop(ch.pick(sorted(d)))
        raw = canonical(d)
        if raw is None or ch.chance(0.1):
            raw = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        return _context_token(raw)

    @staticmethod
    def _bad_mac(ch: Chooser, token: str, payload: str, mac: str) -> str:
        last = _B64URL_ALPHABET.index(mac[-1])
        return "semgov1." + payload + "." + ch.pick((
            mac[:-1], mac + "A", mac[:-1] + _B64URL_ALPHABET[(last + 4) % 64], _B64URL_ALPHABET[0] + mac[1:],
            mac[:-1] + _B64URL_ALPHABET[last ^ 0b11],  # the same bytes, spare bits set
            mac + "=", mac.lower(), mac.upper(), mac.replace("-", "+").replace("_", "/"), "",
            _context_mac(payload, CONTEXT_WRONG_KEY), _context_mac(payload + "A"), "A" * 43, mac[::-1],
            base64.urlsafe_b64encode(base64.urlsafe_b64decode(mac + "=")).decode(),
        ))  # fmt: skip

    @staticmethod
    def _repad(payload: str) -> str:
        padded = payload + "=" * (-len(payload) % 4)
        return "semgov1." + padded + "." + _context_mac(padded)

    @staticmethod
    def _noncanonical_payload(payload: str) -> str:
        spare = {2: 0b1111, 3: 0b11}.get(len(payload) % 4, 0)
        last = _B64URL_ALPHABET.index(payload[-1])
        other = payload[:-1] + _B64URL_ALPHABET[last | spare] if spare else payload + "A"
        return "semgov1." + other + "." + _context_mac(other)

    def run(self, data: bytes) -> Verdict:
        from semgov.context import (
            ContextError,
            ContextKeys,
            anonymous_cache_key,
            parse_context_token,
        )

        v = Verdict()
        extra, lora, salt = ctx_decode(data)
        anon = call(anonymous_cache_key, CONTEXT_KEY, extra, lora, salt, label="anonymous_cache_key")
        if not _key_shape(anon, "semgov:anon:"):
            v.crashes.append("anonymous key is not semgov:anon: + 32 hex")
        keys = ContextKeys(CONTEXT_KEY, CONTEXT_AUDIENCE, (), CONTEXT_LIFETIME_S)
        got = call(
            parse_context_token, keys, extra, lora_id=lora, now=CONTEXT_NOW, allowed=(ContextError,),
            label="parse_context_token",
        )  # fmt: skip
        j = judge_context(
            extra,
            lora,
            CONTEXT_KEY,
            audience=CONTEXT_AUDIENCE,
            now=CONTEXT_NOW,
            max_lifetime_s=CONTEXT_LIFETIME_S,
        )
        if isinstance(got, ContextError):
            msg = str(got)
            v.reasons.append(norm(msg))
            if not msg.strip():
                v.crashes.append("ContextError without a message")
            if not j.problems:
                v.crashes.append(f"refused a valid token: {norm(msg)}")
            return v
        v.accepted = True
        if j.problems:
            v.allows.append(f"accepted an invalid context token: {_kind(j.problems[0])}")
            return v
        mine = (got.tenant, got.namespace, got.task, got.response_contract, got.segments, got.lora_id)
        if mine != j.context:
            v.allows.append("parsed context differs from the token's")
        scope = call(got.scope, CONTEXT_KEY, salt, label="RequestContext.scope")
        tree = call(got.cache_key, CONTEXT_KEY, salt, label="RequestContext.cache_key")
        if not (_key_shape(scope, "semgov:") and _key_shape(tree, "semgov:")):
            v.crashes.append("scope or tree key is not semgov: + 32 hex")
        if len({scope, tree, anon}) != 3:
            v.crashes.append("scope, tree key and anonymous key are not distinct")
        plain_salt = salt if type(salt) is str else None
        if salt is None or plain_salt is not None:
            other = (plain_salt + "\x00") if plain_salt else "another-salt"
            if call(got.cache_key, CONTEXT_KEY, other, label="RequestContext.cache_key") == tree:
                v.crashes.append("another cache salt gives the same tree key")
        return v


TARGETS: dict[str, type[Target]] = {
    t.name: t
    for t in (
        CapturedTarget,
        ProvenanceTarget,
        RecordsTarget,
        KeyringTarget,
        YamlPolicyTarget,
        RegoPolicyTarget,
        PolicyInputTarget,
        AuditLogTarget,
        CheckpointTarget,
        BundleTarget,
        ContextTarget,
    )
}


def _late_targets() -> None:
    """Targets kept in their own modules (they import this one)."""
    from benchmarks.hostile_vllm import VllmBodyTarget

    TARGETS[VllmBodyTarget.name] = VllmBodyTarget


_late_targets()
