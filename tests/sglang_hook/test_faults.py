"""Faults in a serving engine: the hook keeps serving cold, says so loudly, loses nothing acknowledged."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.settings import HookConfigError
from semgov.audit.errors import AuditWriteError
from semgov.audit.verify_dir import verify_log
from semgov.policy.engine import EngineResult, GateOutcome
from semgov.signing.keys import load_signing_key
from semgov.wire.models import GATES
from tests.sglang_hook.scenario import E_LEN, S_LEN, blocks


def _donor(h: Any, b: Any, rid: str = "donor") -> Any:
    lay = b.donor()
    req = h.new_req(rid, lay.tokens, h.context(segments=lay.segments))
    h.run(req)
    h.finish(req)
    return req


def _recipient(h: Any, b: Any, rid: str = "rcp") -> Any:
    lay = b.recipient()
    return h.new_req(rid, lay.tokens, h.context(segments=lay.segments))


def _fail_fd(real: Any, fd_of: Any, err: int) -> Any:
    def fake(fd: int, *args: Any) -> Any:
        if fd == fd_of():
            raise OSError(err, os.strerror(err))
        return real(fd, *args)

    return fake


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
@pytest.mark.parametrize("call", ["write", "fsync"])
def test_audit_write_failure_turns_reuse_off_and_keeps_acknowledged_records(
    make_harness: Any, hook_files: Any, monkeypatch: pytest.MonkeyPatch, capfd: Any, err: int, call: str
) -> None:
    """Disk full or a read-only audit dir: recipients run cold, the error is loud, durable records survive."""
    h = make_harness(SEMGOV_AUDIT_WAIT_MS="2000")
    b = blocks()
    _donor(h, b)
    log = h.tree.gov.audit
    durable = log.flush()
    real = getattr(os, call)
    monkeypatch.setattr(os, call, _fail_fd(real, lambda: log._log_fd, err))
    rcp = _recipient(h, b)
    h.run(rcp)  # the allow decision is queued, but its write fails: no realization
    assert rcp.prefix_len == S_LEN and not rcp.skip_radix_cache_insert
    assert h.tree.gov.audit_broken is not None and os.strerror(err) in h.tree.gov.audit_broken
    h.finish(rcp)
    second = _recipient(h, blocks(seed=2), rid="rcp2")
    h.run(second)  # the audit log is broken: nothing is decided at all, serving goes on cold
    assert h.tree.stats["decided_requests"] == 1 and second.prefix_len == 0
    h.finish(second)
    h.assert_clean()
    assert "semgov audit log failed" in capfd.readouterr().err
    with pytest.raises(AuditWriteError, match=f"{durable} records are durable"):
        h.close()
    monkeypatch.undo()
    report = verify_log(hook_files.audit_dir, public_key=load_signing_key(hook_files.signing_key).public_key)
    assert report.ok, [str(p) for p in report.problems]
    assert report.records >= durable and report.signatures_checked == report.records


def test_unwritable_audit_dir_is_refused_at_build(
    make_harness: Any, hook_files: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An audit directory that cannot be opened for writing stops the server at build, naming it."""
    real_open = os.open
    target = str(hook_files.audit_dir)

    def ro(path: Any, *args: Any, **kw: Any) -> int:
        if str(path).startswith(target):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return int(real_open(path, *args, **kw))

    monkeypatch.setattr(os, "open", ro)
    with pytest.raises(HookConfigError, match="SEMGOV_AUDIT_DIR=.*cannot open the audit log"):
        make_harness()


@pytest.mark.parametrize("broken", ["directory", "garbage", "public-key"])
def test_unreadable_signing_key_is_refused_at_build(make_harness: Any, hook_files: Any, broken: str) -> None:
    """A signing key that cannot be read or parsed stops the build with an error naming the file."""
    from semgov.errors import SemgovError

    bad = hook_files.dir / "bad-key"
    if broken == "directory":
        bad.mkdir()
    elif broken == "garbage":
        bad.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n")
    else:
        bad.write_text(Path(hook_files.signing_key).with_name("signing-key.pub.pem").read_text())
    hook_files.signing_key = bad
    with pytest.raises(SemgovError) as e:
        make_harness()
    assert str(bad) in str(e.value) or "bad-key" in str(e.value)


class _Raising:
    name = "raising"

    def evaluate(self, doc: Any) -> EngineResult:
        raise RuntimeError("policy engine crashed")


class _Junk:
    name = "junk"

    def evaluate(self, doc: Any) -> EngineResult:
        return EngineResult([GateOutcome(gate=g, result="pass", detail="") for g in GATES[:3]], [])


@pytest.mark.parametrize("engine", [_Raising(), _Junk()], ids=["raises", "junk"])
def test_policy_engine_failure_denies_and_runs_cold(make_harness: Any, engine: Any) -> None:
    """A policy engine that raises or answers junk yields signed denies (gate errors) and a cold run."""
    h = make_harness()
    b = blocks()
    _donor(h, b)
    h.tree.gov.evaluator.engine = engine
    rcp = _recipient(h, b)
    h.run(rcp)
    assert rcp.prefix_len == S_LEN and not rcp.skip_radix_cache_insert
    (decision,) = [r for r in h.records() if r["schema"] == "semgov.decision/v3"]
    assert decision["decision"] == "deny"
    assert {g["result"] for g in decision["gates"]} == {"error"}
    h.finish(rcp)
    h.assert_clean()


def test_clock_jumping_backwards_denies_and_never_crashes(make_harness: Any) -> None:
    """A clock that jumps back before the donor's creation makes its provenance not yet valid: deny."""
    from datetime import UTC, datetime, timedelta

    h = make_harness()
    now = {"t": datetime.now(UTC)}
    h.tree.gov.clock = lambda: now["t"]
    b = blocks()
    _donor(h, b)
    now["t"] -= timedelta(hours=2)
    rcp = _recipient(h, b)
    h.run(rcp)
    assert rcp.prefix_len == S_LEN and not rcp.skip_radix_cache_insert
    (decision,) = [r for r in h.records() if r["schema"] == "semgov.decision/v3"]
    assert decision["decision"] == "deny"
    h.finish(rcp)
    now["t"] += timedelta(hours=2, seconds=1)  # and forward again: the donor is fine again
    import dataclasses

    b2 = dataclasses.replace(b, q2=blocks(seed=9).q2)  # another question: no exact hit on rcp's KV
    again = _recipient(h, b2, rid="rcp2")
    h.run(again)
    assert again.prefix_len == S_LEN + E_LEN
    h.finish(again)
    h.assert_clean()


class _Stuck:
    name = "stuck"

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def evaluate(self, doc: Any) -> EngineResult:
        self.release.wait(30)
        raise RuntimeError("released")


def test_stuck_policy_engine_times_out_to_deny_and_never_stalls(make_harness: Any) -> None:
    """An engine that never answers is cut off at the timeout: signed deny, cold; later calls deny at once."""
    import time

    h = make_harness(SEMGOV_DECISION_TIMEOUT_MS="50")
    b = blocks()
    _donor(h, b)
    stuck = _Stuck()
    h.tree.gov.evaluator.engine = stuck
    try:
        rcp = _recipient(h, b)
        t0 = time.perf_counter()
        h.match(rcp)
        first = time.perf_counter() - t0
        second = _recipient(h, b, rid="rcp2")
        t0 = time.perf_counter()
        h.match(second)
        again = time.perf_counter() - t0
        decisions = [r for r in h.records() if r["schema"] == "semgov.decision/v3"]
        assert [d["decision"] for d in decisions] == ["deny", "deny"]
        details = [d["gates"][0]["detail"] for d in decisions]
        assert "no answer within 0.05 s" in details[0], details
        assert "still busy" in details[1], details
        assert rcp.host_hit_length == 0 and second.host_hit_length == 0
        assert first < 20 and again < 20  # not a speed check: the engine would block for 30 s
    finally:
        stuck.release.set()
    for r in (rcp, second):
        h.abort_waiting(r)
    h.assert_clean()
