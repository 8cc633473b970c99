"""The live capture writer: lines that read back equal, rotation, drops, failures, and replay."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator, Keyring, SigningKey, sign_provenance
from semgov.cli.main import main
from semgov.errors import InputError
from semgov.intake.capture import MalformedLine, parse_line, read_captured
from semgov.intake.capture_writer import CaptureStats, CaptureWriter
from semgov.policy.source import load_policy_source
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import load_signing_key, verify_signature
from semgov.wire.models import Candidate, CapturedRequest, Prompt, Provenance
from semgov.wire.timefmt import unix_ns
from tests.conftest import DEFAULT_POLICY_DIR, ROOT, payload_for, request, segs

EXAMPLES = ROOT / "examples"
KEYRING = EXAMPLES / "keyring.json"
DECISION_KEY = EXAMPLES / "keys" / "decision-signing-key.pem"
NAME = re.compile(r"capture-\d{8}T\d{6}Z-\d+-\d{6}\.jsonl")
TEXT = 'Revenue "grew" 12%\tin Q3 \u2028 — naïve café ✓ \\ end'


@pytest.fixture(scope="module")
def k1() -> SigningKey:
    """The examples' trusted provenance key k1 (in examples/keyring.json)."""
    return SigningKey(load_signing_key(EXAMPLES / "keys" / "provenance-k1.pem").private_key, "k1")


def _donor_prompt(text: str | None = None) -> dict[str, Any]:
    p = segs(
        ("system", list(range(100, 120))),
        ("instruction", list(range(200, 230))),
        ("evidence", list(range(1000, 1300))),
        ("question", list(range(500, 520))),
    )
    if text is not None:
        p["text"] = text
    return p


def _cand(key: SigningKey, donor_id: str, *, text: str | None = None, **over: Any) -> dict[str, Any]:
    """A candidate whose provenance ``key`` signed (over its text's hash when it has one)."""
    similarity = over.pop("similarity", 0.9)
    prompt = _donor_prompt(text)
    payload = payload_for(donor_id, prompt, **over)
    return {
        "donor_id": donor_id,
        "similarity": similarity,
        "prompt": prompt,
        "provenance": sign_provenance(payload, key),
    }


def _tricky(key: SigningKey) -> list[CapturedRequest]:
    """Requests a careless serializer changes: nanosecond clocks at an expiry, floats at a threshold,
    texts with escapes and non-ASCII, an `expect` map."""
    expires = "2026-12-05T10:00:00.000000500Z"
    out = [
        request(
            [_cand(key, "d-ns", expires_at=expires)],
            request_id="t-expired-by-200ns",
            received_at="2026-12-05T12:00:00.000000700+02:00",
        ),
        request(
            [_cand(key, "d-ns", expires_at=expires)],
            request_id="t-valid-by-100ns",
            received_at="2026-12-05T10:00:00.000000400Z",
        ),
        request(
            [
                _cand(key, "d-text", text=TEXT),
                _cand(key, "d-low", similarity=0.5999999999999999),
                _cand(key, "d-edge", similarity=0.6000000000000001),
            ],
            prompt=_donor_prompt('the recipient\'s own text: ünïcödé "quoted"\n'),
            request_id="t-text-and-floats",
            received_at="2026-11-29T10:00:00.123456789Z",
            expect={"d-text": "allow", "d-low": "deny"},
        ),
    ]
    return [CapturedRequest.model_validate_json(json.dumps(r)) for r in out]


def _examples(step: int = 12) -> list[CapturedRequest]:
    """Every ``step``-th request of the example workload (all cohorts, real signed provenance)."""
    with gzip.open(EXAMPLES / "captured.jsonl.gz", "rb") as f:
        lines = [x for i, x in enumerate(f) if i % step == 0]
    return [CapturedRequest.model_validate_json(x) for x in lines]


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*.jsonl"), key=lambda p: p.name)


def _read_back(d: Path) -> list[CapturedRequest]:
    items = list(read_captured(d))
    assert not [i for i in items if isinstance(i, MalformedLine)], items
    return [i for i in items if isinstance(i, CapturedRequest)]


def _capture(d: Path, reqs: list[CapturedRequest], **kw: Any) -> CaptureStats:
    w = CaptureWriter(d, **kw)
    try:
        assert all(w.offer(r) for r in reqs)
        assert w.flush()
    finally:
        w.close()
    return w.stats()


def _strip(req: CapturedRequest) -> CapturedRequest:
    """``req`` with every prompt's text removed (what keep_text=False writes)."""

    def bare(p: Prompt) -> Prompt:
        return p.model_copy(update={"text": None})

    cands = [c.model_copy(update={"prompt": bare(c.prompt)}) for c in req.candidates]
    return req.model_copy(update={"prompt": bare(req.prompt), "candidates": cands})


def _assert_provenance_verifies(c: Candidate, key: SigningKey) -> None:
    assert verify_signature(key.public_key, c.provenance.signature, canonicalize(c.provenance.payload))


# ---- serialization -------------------------------------------------------------------------------


def test_round_trip_with_text(tmp_path: Path, k1: SigningKey) -> None:
    """keep_text=True: every line reads back equal, to the nanosecond, and each signature verifies."""
    reqs = _tricky(k1)
    stats = _capture(tmp_path / "cap", reqs, keep_text=True)
    assert stats == CaptureStats(offered=3, written=3, dropped=0, failed=0, files=1, bytes=stats.bytes)
    back = _read_back(tmp_path / "cap")
    assert back == reqs
    assert [unix_ns(r.received_at) for r in back] == [unix_ns(r.received_at) for r in reqs]
    assert back[2].candidates[0].prompt.text == TEXT and back[2].prompt.text is not None
    assert [c.similarity for c in back[2].candidates] == [0.9, 0.5999999999999999, 0.6000000000000001]
    for r in back:
        for c in r.candidates:
            _assert_provenance_verifies(c, k1)
    (path,) = _files(tmp_path / "cap")
    raw = path.read_bytes()
    assert stats.bytes == len(raw) and raw.count(b"\n") == 3
    assert all(json.loads(line)["schema"] == "semgov.captured_request/v1" for line in raw.splitlines())


def test_round_trip_without_text(tmp_path: Path, k1: SigningKey) -> None:
    """keep_text=False (default): no prompt has a text key; the rest, signed provenance included, is equal."""
    reqs = _tricky(k1)
    _capture(tmp_path, reqs)
    (path,) = _files(tmp_path)
    for line in path.read_bytes().splitlines():
        doc = json.loads(line)
        assert "text" not in doc["prompt"]
        assert all("text" not in c["prompt"] for c in doc["candidates"])
        got = parse_line(line, 1)
        assert isinstance(got, CapturedRequest)
    back = _read_back(tmp_path)
    assert back == [_strip(r) for r in reqs]
    assert all(p.text is None for r in back for p in [r.prompt, *(c.prompt for c in r.candidates)])
    assert back[2].candidates[0].provenance.payload["text_sha256"] is not None  # still as signed
    for r in back:
        for c in r.candidates:
            _assert_provenance_verifies(c, k1)


def test_files_modes_and_names(tmp_path: Path, k1: SigningKey) -> None:
    """The directory is created 0700, each file 0600, named prefix-UTCstart-pid-seq.jsonl."""
    d = tmp_path / "a" / "cap"
    _capture(d, _tricky(k1)[:1])
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    (path,) = _files(d)
    assert NAME.fullmatch(path.name) and f"-{os.getpid()}-000001." in path.name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    w = CaptureWriter(d, prefix="edge")
    w.close()
    assert [p.name for p in d.iterdir() if p.name.startswith("edge")] == []  # no request: no file


def test_rotation_by_size_and_an_oversized_line(tmp_path: Path, k1: SigningKey) -> None:
    """A line that would overflow the file starts the next; a line over the limit goes alone."""
    base = _tricky(k1)[1]
    small = [base.model_copy(update={"request_id": f"r-{i}"}) for i in range(7)]
    size = len(_one_line(tmp_path / "probe", small[0]))
    big = _tricky(k1)[2]
    big_size = len(_one_line(tmp_path / "probe2", big))
    assert big_size > 2 * size + 10
    order = [*small[:3], big, *small[3:]]
    stats = _capture(tmp_path / "cap", order, max_file_bytes=2 * size + 10, keep_text=True)
    files = _files(tmp_path / "cap")
    ids = [[json.loads(x)["request_id"] for x in p.read_bytes().splitlines()] for p in files]
    assert ids == [["r-0", "r-1"], ["r-2"], ["t-text-and-floats"], ["r-3", "r-4"], ["r-5", "r-6"]]
    assert [p.name[-12:] for p in files] == [f"{i:06d}.jsonl" for i in range(1, 6)]
    assert all(p.stat().st_size <= 2 * size + 10 for p in files if p.stat().st_size != big_size)
    assert stats.files == 5 and stats.written == 8 and stats.bytes == sum(p.stat().st_size for p in files)
    assert [r.request_id for r in _read_back(tmp_path / "cap")] == [r.request_id for r in order]


def _one_line(d: Path, req: CapturedRequest) -> bytes:
    _capture(d, [req], keep_text=True)
    (path,) = _files(d)
    return path.read_bytes()


# ---- never blocking, failures --------------------------------------------------------------------


class _Gate:
    """Holds the writer thread inside its write until released (no sleeps)."""

    def __init__(self, w: CaptureWriter) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real = w._write

        def held(line: bytes) -> None:
            self.entered.set()
            assert self.release.wait(10)
            real(line)

        w._write = held  # type: ignore[method-assign]


def test_full_queue_drops_without_waiting(tmp_path: Path, k1: SigningKey) -> None:
    """With the writer held mid-write, queue_size more requests queue, the next is dropped at once."""
    reqs = [_tricky(k1)[0].model_copy(update={"request_id": f"r-{i}"}) for i in range(5)]
    w = CaptureWriter(tmp_path, queue_size=2)
    gate = _Gate(w)
    assert w.offer(reqs[0])
    assert gate.entered.wait(10)  # the thread has taken r-0 and is held writing it
    assert [w.offer(r) for r in reqs[1:]] == [True, True, False, False]
    assert w.stats() == CaptureStats(offered=5, written=0, dropped=2, failed=0, files=0, bytes=0)
    assert not w.flush(timeout=0.05)
    gate.release.set()
    assert w.flush()
    w.close()
    assert w.stats().written == 3
    assert [r.request_id for r in _read_back(tmp_path)] == ["r-0", "r-1", "r-2"]


def test_concurrent_offers_are_all_accounted_for(tmp_path: Path, k1: SigningKey) -> None:
    """Offers from several threads at once: each is written or dropped, and every written one reads back."""
    base = _tricky(k1)[0]
    w = CaptureWriter(tmp_path, queue_size=64, max_file_bytes=64 << 10)

    def offer_many(t: int) -> None:
        for i in range(100):
            w.offer(base.model_copy(update={"request_id": f"t{t}-{i}"}))

    threads = [threading.Thread(target=offer_many, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert w.flush()
    w.close()
    s = w.stats()
    assert s.offered == 400 and s.written + s.dropped == 400 and s.failed == 0 and s.written >= 64
    back = [r.request_id for r in _read_back(tmp_path)]
    assert len(back) == len(set(back)) == s.written
    for n in range(4):  # NOTE: one thread's requests stay in its order
        mine = [int(x.split("-")[1]) for x in back if x.startswith(f"t{n}-")]
        assert mine == sorted(mine)


def test_write_error_is_counted_logged_once_and_the_next_write_opens_a_new_file(
    tmp_path: Path, k1: SigningKey, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError from the write fails that request (one warning per outage); the next goes to a new file."""
    reqs = [_tricky(k1)[0].model_copy(update={"request_id": f"r-{i}"}) for i in range(4)]
    w = CaptureWriter(tmp_path)
    real = w._write

    def flaky(line: bytes) -> None:
        if b'"r-1"' in line or b'"r-2"' in line:
            raise OSError(28, "No space left on device")
        real(line)

    w._write = flaky  # type: ignore[method-assign]
    assert all(w.offer(r) for r in reqs)
    assert w.flush()
    w.close()
    assert w.stats() == CaptureStats(
        offered=4, written=2, dropped=0, failed=2, files=2, bytes=w.stats().bytes
    )
    err = capsys.readouterr().err
    assert err.count("cannot write to") == 1 and "No space left on device" in err and str(tmp_path) in err
    assert [[json.loads(x)["request_id"] for x in p.read_bytes().splitlines()] for p in _files(tmp_path)] == [
        ["r-0"],
        ["r-3"],
    ]


def test_directory_gone_is_counted_and_writing_resumes(
    tmp_path: Path, k1: SigningKey, capsys: pytest.CaptureFixture[str]
) -> None:
    """A capture directory replaced by a file fails the opens (even as root); once back, writing resumes."""
    d = tmp_path / "cap"
    reqs = [_tricky(k1)[0].model_copy(update={"request_id": f"r-{i}"}) for i in range(4)]
    w = CaptureWriter(d, max_file_bytes=1)  # NOTE: every line opens its own file
    assert w.offer(reqs[0]) and w.flush()
    d.rename(tmp_path / "moved")
    d.write_text("not a directory")
    assert w.offer(reqs[1]) and w.offer(reqs[2]) and w.flush()
    assert w.stats().failed == 2 and w.stats().written == 1
    d.unlink()
    (tmp_path / "moved").rename(d)
    assert w.offer(reqs[3]) and w.flush()
    w.close()
    s = w.stats()
    assert (s.written, s.failed, s.files) == (2, 2, 2)
    assert capsys.readouterr().err.count("cannot write to") == 1
    assert [r.request_id for r in _read_back(d)] == ["r-0", "r-3"]


def test_unserializable_request_is_counted(
    tmp_path: Path, k1: SigningKey, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request pydantic cannot serialize (an object in a provenance payload) fails; the rest are written."""
    good = _tricky(k1)[0]
    bad_prov = Provenance(payload={"x": object()}, key_id="k1", signature="c2ln")
    bad_cand = good.candidates[0].model_copy(update={"provenance": bad_prov})
    bad = good.model_copy(update={"request_id": "r-bad", "candidates": [bad_cand]})
    w = CaptureWriter(tmp_path)
    assert w.offer(bad) and w.offer(good) and w.offer(bad)
    assert w.flush()
    w.close()
    assert (w.stats().written, w.stats().failed) == (1, 2)
    assert capsys.readouterr().err.count("cannot serialize") == 1
    assert [r.request_id for r in _read_back(tmp_path)] == [good.request_id]


def test_close_writes_what_is_queued_then_drops(tmp_path: Path, k1: SigningKey) -> None:
    """close() writes everything queued before it; every later offer returns False and counts as dropped."""
    reqs = [_tricky(k1)[0].model_copy(update={"request_id": f"r-{i}"}) for i in range(20)]
    w = CaptureWriter(tmp_path)
    assert all(w.offer(r) for r in reqs)
    w.close()
    assert w.offer(reqs[0]) is False
    w.close()  # again: nothing more
    assert w.flush(timeout=0.1)
    assert w.stats() == CaptureStats(
        offered=21, written=20, dropped=1, failed=0, files=1, bytes=w.stats().bytes
    )
    assert len(_read_back(tmp_path)) == 20


def test_offer_never_raises(tmp_path: Path) -> None:
    """Whatever is offered, offer returns a bool; a non-request fails on the writer thread."""
    w = CaptureWriter(tmp_path)
    assert w.offer("not a request") is True  # type: ignore[arg-type]
    assert w.flush()
    w.close()
    assert w.stats().failed == 1


def test_constructor_errors_name_the_directory(tmp_path: Path) -> None:
    """A directory that cannot be created (under a file) or is a file is an InputError naming it."""
    f = tmp_path / "file"
    f.write_text("x")
    for d in (f / "cap", f):
        with pytest.raises(InputError) as e:
            CaptureWriter(d)
        assert str(d) in str(e.value)
    with pytest.raises(ValueError, match="positive"):
        CaptureWriter(tmp_path, max_file_bytes=0)
    with pytest.raises(ValueError, match="prefix"):
        CaptureWriter(tmp_path, prefix="a/b")


# ---- replay: semgov check on the capture decides as the originals ---------------------------------


def _outcomes(records: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (r["request_id"], r["donor_id"], r["decision"], r["approved_tokens"], r["approved_spans"], r["gates"])
        for r in records
    ]


def _decide(reqs: list[CapturedRequest]) -> list[tuple[Any, ...]]:
    policy = load_policy_source(DEFAULT_POLICY_DIR)
    ev = Evaluator(policy, Keyring.load(KEYRING), load_signing_key(DECISION_KEY))
    return _outcomes([d.record for r in reqs for d in ev.evaluate(r)])


def _check(d: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[Any, ...]]:
    args = ["--policy", str(DEFAULT_POLICY_DIR), "--trust", str(KEYRING), "--signing-key", str(DECISION_KEY)]
    capsys.readouterr()
    assert main(["check", str(d), *args, "--format", "jsonl"]) == 0
    return _outcomes([json.loads(x) for x in capsys.readouterr().out.splitlines()])


@pytest.mark.parametrize("keep_text", [True, False])
def test_replay_decides_as_the_originals(
    tmp_path: Path, k1: SigningKey, capsys: pytest.CaptureFixture[str], keep_text: bool
) -> None:
    """`semgov check DIR` on a capture gives each original request's decisions, approved tokens and gates."""
    reqs = [*_tricky(k1), *_examples()]
    stats = _capture(tmp_path, reqs, keep_text=keep_text, max_file_bytes=256 << 10)
    assert stats.files > 1 and stats.written == len(reqs)
    want = _decide(reqs if keep_text else [_strip(r) for r in reqs])
    assert _check(tmp_path, capsys) == want
    decided = {(o[0], o[1]): o[2] for o in want}
    assert decided[("t-expired-by-200ns", "d-ns")] == "deny"
    assert decided[("t-valid-by-100ns", "d-ns")] == "allow"
    assert decided[("t-text-and-floats", "d-low")] == "deny"
    assert decided[("t-text-and-floats", "d-edge")] == "allow"
    assert {"allow", "deny"} == set(decided.values()) and len(decided) > 100
