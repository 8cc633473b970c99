"""The hook's policy lifecycle (issue 16): shadow policy, live capture and hot reload, on a real governor.

Each test builds the hook's :class:`Governor` from real settings files (no SGLang needed: the
governor has no SGLang import), registers a donor and decides a recipient that shares its system
prompt and evidence, in both places the hook decides: the decision thread of this process, and the
decision process (a child, as in a server). The real server runs the same steps end to end in
``tests/sglang_server/test_policy_lifecycle_server.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.donors import DonorSpec
from engine_hooks.core.governor import Governor
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.audit.reader import iter_records
from semgov.context import RequestContext
from semgov.intake.capture import read_captured
from tests.core.files import CONTRACT, TASK, HookFiles

ENGINE = "sglang 0.5.23"
SEGS = (("system", 0, 200), ("evidence", 200, 600), ("question", 600, 650))
MODES = {"thread": {"SEMGOV_DECISION_PROCESS": "0"}, "process": {"SEMGOV_DECISION_PROCESS": "1"}}


def stricter(policy: Path) -> str:
    """The test policy with a bar the recipient (600 of 650 tokens approved) no longer clears."""
    text = (policy / "policy.yaml").read_text()
    assert "min_approved_fraction: 0.5" in text
    return (
        text.replace("min_approved_fraction: 0.5", "min_approved_fraction: 0.99")
        .replace('version: "1"', 'version: "2"')
        .replace("accepted_policy_versions: []", 'accepted_policy_versions: ["default@1"]')
    )


def write_policy(directory: Path, text: str) -> None:
    """Replace ``policy.yaml`` atomically (a new file renamed over the old one)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".policy.yaml.new"
    tmp.write_text(text)
    os.replace(tmp, directory / "policy.yaml")


def tokens(seed: int, n: int) -> list[int]:
    return [1000 + (seed * 7919 + i * 104729) % 40000 for i in range(n)]


SYSTEM, EVIDENCE = tokens(1, 200), tokens(2, 400)


def governor(files: HookFiles, mode: str, **env: str) -> Governor:
    settings = HookSettings.from_env(
        files.env(SEMGOV_ASYNC_DECISIONS="1", SEMGOV_ASYNC_REGISTRATION="1", **MODES[mode], **env)
    )
    return Governor(settings, engine_name=ENGINE)


def context() -> RequestContext:
    return RequestContext("acme", "ns1", dict(TASK), dict(CONTRACT), SEGS, None)


def donate(gov: Governor, donor_id: str) -> None:
    ctx = context()
    ids = array("q", SYSTEM + EVIDENCE + tokens(3, 50))
    gov.submit_donor(DonorSpec(donor_id, ctx, ctx.cache_key(gov.context_key), None, ids, None))
    assert gov.wait_registrations(60)
    gov.drain_donors()


def decide(gov: Governor, request_id: str) -> Any:
    """Decide one recipient (same system and evidence, another question); the finished job."""
    job = gov.decide_later(request_id, context(), None, array("q", SYSTEM + EVIDENCE + tokens(4, 50)))
    deadline = time.monotonic() + 60
    while not job.done:
        assert time.monotonic() < deadline, "no decision within 60 s"
        time.sleep(0.005)
    assert gov.wait_idle(60)
    return job


def records(files: HookFiles) -> list[dict[str, Any]]:
    return [json.loads(r) for _, r in iter_records(files.audit_dir)]


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    yield str(request.param)


def test_shadow_records_are_audited_and_never_acted_on(
    hook_files: HookFiles, tmp_path: Path, mode: str
) -> None:
    """With a stricter shadow policy the live allow is acted on; the shadow's deny is a separate,
    signed record naming the live decision, and counted as a disagreement."""
    shadow = tmp_path / "shadow"
    write_policy(shadow, stricter(hook_files.policy))
    gov = governor(hook_files, mode, SEMGOV_SHADOW_POLICY=str(shadow))
    try:
        donate(gov, "sglang-donor-1")
        job = decide(gov, "r-1")
        assert [d.decision for d in job.decisions] == ["allow"]
        wait_for(lambda: gov.shadow_records == 1)
        assert gov.shadow_disagreements == 1
    finally:
        gov.close()
    recs = records(hook_files)
    live = [r for r in recs if r["schema"] == "semgov.decision/v3"]
    shadows = [r for r in recs if r["schema"] == "semgov.shadow_decision/v1"]
    assert [r["decision"] for r in live] == ["allow"] and [r["decision"] for r in shadows] == ["deny"]
    assert shadows[0]["live_decision_id"] == live[0]["decision_id"] and shadows[0]["live_decision"] == "allow"
    assert shadows[0]["policy"]["revision"] != live[0]["policy"]["revision"]


def test_hot_reload_decides_the_next_request_with_the_new_revision(hook_files: HookFiles, mode: str) -> None:
    """A policy file replaced while running is reloaded (audited); the next decision uses it and its
    record names its revision; a donor registered afterwards carries the new version."""
    gov = governor(hook_files, mode, SEMGOV_RELOAD_POLL_MS="50")
    gov.watch()
    try:
        donate(gov, "sglang-donor-1")
        before = decide(gov, "r-1").decisions[0].record
        write_policy(hook_files.policy, stricter(hook_files.policy))
        wait_for(lambda: gov.reloads == 1)
        assert gov.revision != before["policy"]["revision"]
        after = decide(gov, "r-2").decisions[0].record
    finally:
        gov.close()
    assert (before["decision"], after["decision"]) == ("allow", "deny")
    assert after["policy"]["revision"] == gov.revision and after["policy"]["version"] == "2"
    (event,) = [r for r in records(hook_files) if r.get("kind") == "policy_loaded"]
    assert gov.revision in event["detail"] and before["policy"]["revision"] in event["detail"]


def test_a_policy_that_fails_to_load_keeps_the_old_one_and_is_audited(hook_files: HookFiles) -> None:
    """A broken policy file is refused (policy_load_failed, naming the error and the kept revision);
    decisions go on under the old revision; fixing the file reloads it."""
    gov = governor(hook_files, "thread")
    try:
        donate(gov, "sglang-donor-1")
        old = gov.revision
        good, fixed = (hook_files.policy / "policy.yaml").read_text(), stricter(hook_files.policy)
        write_policy(
            hook_files.policy, good.replace("min_approved_fraction: 0.5", "min_approved_fraction: 7")
        )
        gov.request_reload("test")
        assert gov.wait_idle(30) and gov.reload_failures == 1 and gov.revision == old
        assert decide(gov, "r-1").decisions[0].record["policy"]["revision"] == old
        gov.request_reload("test")  # the same broken file again: refused again, nothing swapped
        assert gov.wait_idle(30) and gov.reload_failures == 2
        write_policy(hook_files.policy, fixed)
        gov.request_reload("test")
        assert gov.wait_idle(30) and gov.reloads == 1 and gov.revision != old
    finally:
        gov.close()
    kinds = [(r["kind"], r["detail"]) for r in records(hook_files) if r.get("kind", "").startswith("policy_")]
    assert [k for k, _ in kinds] == ["policy_load_failed", "policy_load_failed", "policy_loaded"]
    assert "min_approved_fraction" in kinds[0][1] and old in kinds[0][1]


def test_an_unchanged_file_reloads_nothing(hook_files: HookFiles) -> None:
    """SIGHUP with nothing changed audits nothing and keeps the revision."""
    gov = governor(hook_files, "thread")
    try:
        old = gov.revision
        (hook_files.policy / "policy.yaml").touch()
        gov.request_reload("SIGHUP")
        assert gov.wait_idle(30) and (gov.reloads, gov.reload_failures, gov.revision) == (0, 0, old)
    finally:
        gov.close()
    assert not [r for r in records(hook_files) if r.get("kind", "").startswith("policy_")]


def test_a_keyring_without_the_hooks_own_key_is_refused(hook_files: HookFiles) -> None:
    """A reloaded keyring that no longer holds the hook's key is refused; the old keyring stays."""
    gov = governor(hook_files, "thread")
    try:
        donate(gov, "sglang-donor-1")
        hook_files.trust.write_text(json.dumps({"keys": []}))
        gov.request_reload("test")
        assert gov.wait_idle(30) and gov.reload_failures == 1
        assert decide(gov, "r-1").decisions[0].decision == "allow"
    finally:
        gov.close()
    (failed,) = [r for r in records(hook_files) if r.get("kind") == "policy_load_failed"]
    assert "does not hold the hook's own key" in failed["detail"]


def test_sighup_asks_for_a_reload(hook_files: HookFiles) -> None:
    """SIGHUP to the process (the scheduler's, in a server) reloads a changed policy."""
    previous = signal.getsignal(signal.SIGHUP)
    gov = governor(hook_files, "thread", SEMGOV_RELOAD_POLL_MS="0")
    try:
        gov.watch(sighup=True)
        write_policy(hook_files.policy, stricter(hook_files.policy))
        os.kill(os.getpid(), signal.SIGHUP)
        wait_for(lambda: gov.reloads == 1)
    finally:
        signal.signal(signal.SIGHUP, previous)
        gov.close()
    (event,) = [r for r in records(hook_files) if r.get("kind") == "policy_loaded"]
    assert event["detail"].endswith("[SIGHUP]")


@pytest.mark.parametrize("text", [False, True], ids=["no-text", "text"])
def test_capture_replays_as_the_hook_decided(
    hook_files: HookFiles, tmp_path: Path, mode: str, text: bool
) -> None:
    """Decided requests are captured with their candidates and signed provenance (text only with
    SEMGOV_CAPTURE_TEXT); replaying the capture decides as the hook did: without text the PII gate
    rests on the scan the donor's signed provenance declares, with text it scans again."""
    from semgov.decide import Evaluator
    from semgov.policy.source import load_policy_source
    from semgov.signing.keys import Keyring, load_signing_key

    capture = tmp_path / "capture"
    env = {
        "SEMGOV_CAPTURE_DIR": str(capture),
        "SEMGOV_CAPTURE_RATE": "1",
        "SEMGOV_CAPTURE_TEXT": "1" if text else "0",
    }
    gov = governor(hook_files, mode, **env)
    try:
        donate(gov, "sglang-donor-1")
        live = decide(gov, "r-1").decisions[0].record
    finally:
        gov.close()
    (req,) = [r for r in read_captured(capture) if getattr(r, "request_id", None) == "r-1"]
    assert req.candidates[0].donor_id == "sglang-donor-1"
    assert (req.candidates[0].prompt.text is not None) == text
    ev = Evaluator(
        load_policy_source(hook_files.policy),
        Keyring.load(hook_files.trust),
        load_signing_key(hook_files.signing_key),
    )
    (again,) = ev.evaluate(req)
    keys = ("decision", "approved_tokens", "approved_spans")
    assert {k: again.record[k] for k in keys} == {k: live[k] for k in keys}
    pii = {g["gate"]: g for g in again.record["gates"]}["pii"]
    if text:
        assert again.record["gates"] == live["gates"]
    else:
        assert pii["result"] == "pass" and pii["detail"].endswith("(scanned: provenance)"), pii
        strip = [(g["gate"], g["result"]) for g in live["gates"]]
        assert [(g["gate"], g["result"]) for g in again.record["gates"]] == strip


def test_capture_rate_zero_captures_nothing(hook_files: HookFiles, tmp_path: Path) -> None:
    """SEMGOV_CAPTURE_RATE=0 decides as usual and writes no request."""
    capture = tmp_path / "capture"
    gov = governor(hook_files, "thread", SEMGOV_CAPTURE_DIR=str(capture), SEMGOV_CAPTURE_RATE="0")
    try:
        donate(gov, "sglang-donor-1")
        assert decide(gov, "r-1").decisions
    finally:
        gov.close()
    assert all(f.stat().st_size == 0 for f in capture.glob("*.jsonl"))


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SEMGOV_SHADOW_POLICY": "/nonexistent/policy"}, "SEMGOV_SHADOW_POLICY"),
        ({"SEMGOV_CAPTURE_RATE": "1.5"}, "SEMGOV_CAPTURE_RATE"),
        ({"SEMGOV_CAPTURE_MAX_MB": "0"}, "SEMGOV_CAPTURE_MAX_MB"),
        ({"SEMGOV_RELOAD_POLL_MS": "-1"}, "SEMGOV_RELOAD_POLL_MS"),
        ({"SEMGOV_CAPTURE_TEXT": "maybe"}, "SEMGOV_CAPTURE_TEXT"),
    ],
)
def test_bad_lifecycle_settings_are_refused_naming_the_variable(
    hook_files: HookFiles, env: dict[str, str], match: str
) -> None:
    """Each lifecycle setting is checked at start, and the error names its variable."""
    with pytest.raises(HookConfigError, match=match):
        HookSettings.from_env(hook_files.env(**env))


def test_a_shadow_policy_that_does_not_load_refuses_the_server(hook_files: HookFiles, tmp_path: Path) -> None:
    """A broken shadow policy stops the hook at start, before any traffic."""
    shadow = tmp_path / "shadow"
    write_policy(shadow, "name: x\nversion: [\n")
    with pytest.raises(HookConfigError, match="SEMGOV_SHADOW_POLICY"):
        governor(hook_files, "thread", SEMGOV_SHADOW_POLICY=str(shadow)).close()


def test_json_logs_carry_their_fields(hook_files: HookFiles) -> None:
    """SEMGOV_LOG_FORMAT=json: the hook's log lines are JSON objects with the event and its fields
    (in a fresh process: it configures structlog for the whole process)."""
    import subprocess
    import sys

    env = {**os.environ, **hook_files.env(SEMGOV_LOG_FORMAT="json", SEMGOV_DETOKENIZER="none")}
    code = (
        "from engine_hooks.core.governor import Governor\n"
        "from engine_hooks.core.settings import HookSettings\n"
        "Governor(HookSettings.from_env(), engine_name='test').close()\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=str(root), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stderr.splitlines() if x.startswith("{")]
    (no_text,) = [x for x in lines if x["event"].startswith("semgov hook has no donor text")]
    assert no_text["detokenizer"] == "none" and no_text["level"] == "warning" and "timestamp" in no_text


def test_an_unknown_log_format_is_refused(hook_files: HookFiles) -> None:
    """SEMGOV_LOG_FORMAT takes text or json, and says so."""
    with pytest.raises(HookConfigError, match="SEMGOV_LOG_FORMAT"):
        HookSettings.from_env(hook_files.env(SEMGOV_LOG_FORMAT="xml"))
