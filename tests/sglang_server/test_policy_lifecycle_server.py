"""The policy lifecycle in a real SGLang server (issue 16): capture -> diff -> shadow -> hot reload.

One server runs the rig's policy from a directory the test owns, with a shadow policy directory
(at first the same policy), live capture into a directory, and the file watcher polling every
200 ms. The steps are the rollout procedure of docs/policy.md, done to a running server:

1. traffic is captured, and ``semgov check`` on the capture decides as the server did;
2. ``semgov diff`` of the capture against the changed policy (version 2, which accepts donors of
   version 1 and forbids shifted spans) shows the allow -> deny flip and exits 1;
3. the changed policy is written into the shadow directory: the server reloads it (audited), and
   the next request is still decided and realized by the live policy while the shadow records a
   deny that disagrees;
4. the changed policy is written into the live directory: the next request is denied, its record
   names the new revision, nothing is realized; a policy that does not load is audited and the
   changed policy keeps deciding.

The server runs with ``--enable-metrics``: at the end its ``/metrics`` must show the same story
in ``semgov:*`` series (issue 17).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import (
    RIG_POLICY,
    ROOT,
    AuditSummary,
    Server,
    launch,
    pair_prompts,
    read_audit,
    server_configs,
    settle,
    summarize,
)


def changed_policy() -> str:
    """The rig's policy as version 2: accepts version 1's donors, forbids shifted spans."""
    text = (RIG_POLICY / "policy.yaml").read_text()
    for old, new in (
        ('version: "1"', 'version: "2"'),
        ("accepted_policy_versions: []", 'accepted_policy_versions: ["server-check@1"]'),
        ("allow_shifted: true", "allow_shifted: false"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    return text


def write_atomically(directory: Path, text: str) -> None:
    """Replace ``policy.yaml`` the way docs/policy.md says: a new file renamed over the old one."""
    tmp = directory / ".policy.yaml.new"
    tmp.write_text(text)
    os.replace(tmp, directory / "policy.yaml")


def semgov(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semgov.cli.main", *args],
        capture_output=True, text=True, cwd=str(ROOT), timeout=600,
    )  # fmt: skip


def pair(server: Server, tag: str) -> str:
    """A donor, then its recipient with the same evidence shifted (in a namespace of their own: one
    candidate each); the recipient's request id."""
    gw = server.gateway
    p = pair_prompts(tag, e_len=512)
    donor = server.generate(p.donor, rid=f"{tag}-donor", extra_key=gw.token("acme", tag, p.donor_segs))
    assert donor.ok, donor.error
    settle(server)
    rid = f"{tag}-rcp"
    res = server.generate(p.recipient, rid=rid, extra_key=gw.token("acme", tag, p.recipient_segs))
    assert res.ok, res.error
    settle(server)
    return rid


def audit_until(server: Server, done: Any, what: str, timeout: float = 90.0) -> AuditSummary:
    """The audit log, once ``done(summary)`` holds (fails naming ``what`` after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        s = summarize(read_audit(server.files.audit_dir, wait_s=5))
        if done(s):
            return s
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} in the audit log after {timeout:.0f} s: {s.counts}\n{server.tail(40)}")
        time.sleep(0.5)


def reloads(s: AuditSummary, kind: str, role: str) -> list[dict[str, Any]]:
    return [r for r in s.reloads if r["kind"] == kind and r["detail"].startswith(f"{role} policy")]


def captured_ids(capture: Path) -> set[str]:
    ids = set()
    for f in capture.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.endswith("}"):
                ids.add(json.loads(line)["request_id"])
    return ids


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` on a ``/metrics`` page whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, val = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(val)
    return total


def check_metrics(server: Server) -> None:
    """The server's own /metrics (SGLang's --enable-metrics) carries semgov:* beside sglang:*, and
    they say what the audit log says: two live allows realized, two denies, a disagreeing shadow,
    the reloads, and the capture (counted in the decision process)."""
    status, body = server.get("/metrics")
    assert status == 200
    text = body.decode()
    assert "sglang:" in text
    assert metric(text, "semgov:decisions_total", outcome="allow") == 2, text[-3000:]
    assert metric(text, "semgov:decisions_total", outcome="deny") == 2
    assert metric(text, "semgov:gate_failures_total", gate="token_verification", result="fail") == 2
    assert (
        metric(text, "semgov:realizations_total") == 2
        and metric(text, "semgov:realized_tokens_total") >= 1024
    )
    assert metric(text, "semgov:decision_latency_seconds_count") == 4
    assert metric(text, "semgov:shadow_decisions_total") == 4
    assert metric(text, "semgov:shadow_disagreements_total") == 1
    assert metric(text, "semgov:policy_reloads_total", role="shadow", outcome="loaded") == 1
    assert metric(text, "semgov:policy_reloads_total", role="live", outcome="loaded") == 1
    assert metric(text, "semgov:policy_reloads_total", role="live", outcome="failed") == 1
    assert metric(text, "semgov:captured_total") == 4 and metric(text, "semgov:capture_dropped_total") == 0
    assert metric(text, "semgov:reuse_disabled") == 0


def test_capture_diff_shadow_and_hot_reload_in_a_running_server(tmp_path: Path) -> None:
    """Captured traffic replays as decided; the diff flips it; a shadow records without acting; a
    live reload decides the next request with the new revision; a broken policy is kept out."""
    live, shadow, capture = tmp_path / "live", tmp_path / "shadow", tmp_path / "capture"
    for d in (live, shadow):
        d.mkdir()
        write_atomically(d, (RIG_POLICY / "policy.yaml").read_text())
    config = replace(
        server_configs("cpu")["page1-overlap"],
        kv_dump=False,
        extra_args=("--enable-metrics",),
        hook_env={
            "SEMGOV_POLICY": str(live),
            "SEMGOV_SHADOW_POLICY": str(shadow),
            "SEMGOV_CAPTURE_DIR": str(capture),
            "SEMGOV_CAPTURE_RATE": "1",
            "SEMGOV_RELOAD_POLL_MS": "200",
        },
    )
    changed = tmp_path / "changed"
    changed.mkdir()
    write_atomically(changed, changed_policy())
    with launch(config, tmp_path / "server") as server:
        trust = str(server.files.trust)
        # 1. captured traffic, replayed as decided
        rid1 = pair(server, "lc-1")
        s = audit_until(server, lambda s: s.realized.get(rid1, 0) >= 512, "realization of lc-1")
        first = s.decisions[rid1]
        assert [d["decision"] for d in first] == ["allow"], first
        assert [r["decision"] for r in s.shadows[rid1]] == ["allow"]  # same policy: agrees
        deadline = time.monotonic() + 60
        while rid1 not in captured_ids(capture) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rid1 in captured_ids(capture), sorted(capture.iterdir())
        check = semgov(
            "check", str(capture), "--policy", str(live), "--trust", trust,
            "--signing-key", str(server.files.signing_key), "--format", "jsonl",
        )  # fmt: skip
        assert check.returncode == 0, check.stderr[-2000:]
        replayed = [json.loads(x) for x in check.stdout.splitlines() if x.strip()]
        again = [r for r in replayed if r["request_id"] == rid1]
        assert [(r["decision"], r["approved_tokens"]) for r in again] == [
            (d["decision"], d["approved_tokens"]) for d in first
        ]
        assert again[0]["policy"]["revision"] == first[0]["policy"]["revision"]

        # 2. what the change would do, on that traffic
        diff = semgov(
            "diff", str(capture), "--policy", str(live), "--policy", str(changed), "--trust", trust,
            "--format", "json",
        )  # fmt: skip
        assert diff.returncode == 1, diff.stdout[-2000:] + diff.stderr[-2000:]
        summary = json.loads(diff.stdout)["summary"]
        assert summary["flipped"] >= 1 and summary["allow"]["b"] < summary["allow"]["a"], summary
        new_revision = json.loads(diff.stdout)["policies"]["b"]["revision"]

        # 3. the change as shadow: recorded, never acted on
        write_atomically(shadow, changed_policy())
        audit_until(server, lambda s: reloads(s, "policy_loaded", "shadow"), "shadow reload")
        rid2 = pair(server, "lc-2")
        s = audit_until(
            server, lambda s: s.realized.get(rid2, 0) >= 512 and rid2 in s.shadows, "lc-2 and its shadow"
        )
        assert [d["decision"] for d in s.decisions[rid2]] == ["allow"]
        (sh,) = s.shadows[rid2]
        assert (sh["decision"], sh["live_decision"]) == ("deny", "allow")
        assert sh["live_decision_id"] == s.decisions[rid2][0]["decision_id"]
        assert sh["policy"]["revision"] == new_revision

        # 4. hot reload of the live policy: the next request is decided by it
        write_atomically(live, changed_policy())
        s = audit_until(server, lambda s: reloads(s, "policy_loaded", "live"), "live reload")
        assert new_revision in reloads(s, "policy_loaded", "live")[0]["detail"]
        rid3 = pair(server, "lc-3")
        s = audit_until(server, lambda s: rid3 in s.decisions, "lc-3's decision")
        (d3,) = s.decisions[rid3]
        assert d3["decision"] == "deny" and d3["policy"]["revision"] == new_revision, d3
        assert {g["gate"]: g["result"] for g in d3["gates"]}["token_verification"] == "fail"
        assert s.realized.get(rid3, 0) == 0
        assert first[0]["policy"]["revision"] != new_revision

        # a policy that does not load is audited, and the one in force keeps deciding
        write_atomically(live, "name: server-check\nversion: [\n")
        s = audit_until(server, lambda s: reloads(s, "policy_load_failed", "live"), "failed reload")
        assert new_revision in reloads(s, "policy_load_failed", "live")[0]["detail"]
        rid4 = pair(server, "lc-4")
        s = audit_until(server, lambda s: rid4 in s.decisions, "lc-4's decision")
        assert [d["policy"]["revision"] for d in s.decisions[rid4]] == [new_revision]
        check_metrics(server)
        assert_healthy(server)
